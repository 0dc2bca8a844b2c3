/*
 * core/autotune.h - size=auto: the drafter, draft shape and draft size that give the most
 * expected tokens per second on this machine, or plain AR when none pays; tuned once per
 * model, method and machine, then read back from the cache.
 *
 * A speculative method written with size=auto among its scheduler parameters (parsed into
 * vs_method.size, core/method.h) is resolved before it runs, into the method that runs.
 * What it tunes is what the method leaves open (core/autotune_space.c):
 *   - the drafter (`drafter`: the model's draft GPT, its EAGLE head) unless named;
 *   - the shape (`shape`: chain, dynamic EAGLE-2 tree, static EAGLE-1 tree) unless named;
 *   - the size of each (chain depth 1..8; total_tokens 2..58; named static trees).
 * How (core/autotune.c):
 *   - a candidate's score is tokens per round over the (trimmed) mean round time as its jobs
 *     ran (drafting, target forwards, the walk and what they do to each other's caches),
 *     AR's the same on the same images;
 *   - every (drafter, shape) family is screened size by size, smallest first, on one
 *     calibration image; a family stops after two sizes worse than its best, and skips a
 *     size whose bound (every draft accepted, drafting free, the target at the latency of
 *     its cost curve: median forward time against tree nodes, measured once per model and
 *     machine and cached) is below 90 % of the best so far;
 *   - the three best are measured on four more images (scored on those alone, so that the
 *     image that picked them does not flatter them) and the best of those wins; for an exact
 *     rule, a winner close to AR and AR run four images more;
 *   - when it is not expected to beat AR by VS_AUTOTUNE_AR_MARGIN, an exact rule (one that
 *     samples the target's distribution, VSPEC_PLUGIN_EXACT) runs as AR: the same images'
 *     distribution, faster; a relaxed rule keeps its best combination (its output differs
 *     from AR's) and the note says it is slower.
 * Timings differ from run to run, so a fresh tuning may choose differently and the same seed
 * would give other images. The choice is therefore stored (core/autotune_cache.c) under the
 * model's files, the method without its size and the machine (CPU model, kernel ISA, threads;
 * the GPU's name), and every later resolve reads it back without timing anything: the same
 * seed gives the same bytes until `vspec-bench tune` tunes again on purpose.
 *
 * Default: a discrete-token model's speculative method on the `standard` scheduler that names
 * no size (none of size, depth, total_tokens, tree) gets size=auto (vs_autotune_default);
 * vspec-bench generate / eval and vspecd apply it to what users write.
 */
#ifndef VS_AUTOTUNE_H
#define VS_AUTOTUNE_H

#include <stdint.h>
#include <stdio.h>

#include "core/method.h"
#include "core/models.h"

#define VS_AUTOTUNE_VERSION 4 /* the cache purpose and file format; bump to re-tune all (3: the
                                * CPU kernels of issue 33 item 4 changed every cost curve; 4:
                                * the wide static trees and static trees drawn on a GPU) */
#define VS_AUTOTUNE_MAX_CAND 48
#define VS_AUTOTUNE_PARAM_LEN 64
/* A speculative choice must be expected to beat AR by this factor for an exact rule to use
 * it: the estimate's own error (timings, a few calibration images) must not make the default
 * slower than AR. */
#define VS_AUTOTUNE_AR_MARGIN 1.10
#define VS_AUTOTUNE_REFRESH 0x1u /* tune even when a choice (or the cost curve) is cached */

typedef struct vs_autotune_cand {
  char param[VS_AUTOTUNE_PARAM_LEN]; /* what it sets: "drafter=model,shape=chain,depth=3" */
  double tokens_per_round;  /* steady state (prefill rounds left out) */
  double target_ms;         /* target forwards, per round */
  double draft_ms;          /* drafting and the verification walk, per round */
  double rate;              /* tokens per second as measured (the score) */
  int images;               /* calibration images it was scored on (0: skipped by its bound,
                               1: screened only) */
} vs_autotune_cand;

/* The choice that runs the method as plain AR (exact rules only). */
#define VS_AUTOTUNE_AR "ar"

typedef struct vs_autotune_result {
  vs_method method;         /* the method as it runs: size=auto replaced by the choice (its
                               scheduler parameters, its drafter), or plain AR */
  char base[1100];          /* the method without its size (part of the cache key) */
  char choice[VS_AUTOTUNE_PARAM_LEN]; /* the chosen parameters or "ar"; "" when none asked */
  int n_cand, best;         /* candidates (cand[best]: the best speculative one; -1: none) */
  vs_autotune_cand cand[VS_AUTOTUNE_MAX_CAND];
  char machine[256];        /* where it was tuned: "cpu (avx2, 2 threads) fp32 / <cpu model>" */
  int64_t tuned_at;         /* when (Unix seconds) */
  int from_cache;           /* 1: read back from the cache, nothing was timed */
  int timed;                /* forwards timed and images generated by this call (0 if cached) */
  int stored;               /* 1: the choice is in the cache now (written or read) */
  double ar_ms;             /* AR's time per token on the same calibration images, ms */
  double tune_s;            /* seconds this call spent tuning (0 if cached) */
} vs_autotune_result;

/* Told how a tuning advances: `done` in [0, 1], a sentence for people. */
typedef void (*vs_autotune_progress_fn)(void *user, double done, const char *message);

typedef struct vs_autotune_opts {
  unsigned flags;                   /* VS_AUTOTUNE_REFRESH */
  int images;                       /* calibration images of the final candidates; 0: 4 */
  vs_autotune_progress_fn progress; /* may be NULL; called only while tuning */
  void *user;
} vs_autotune_opts;

/* 1 when the result runs as AR because no speculative choice pays (an exact rule). */
int vs_autotune_is_ar(const vs_autotune_result *res);

/* 1 when the chosen speculative combination is expected to make fewer tokens per second
 * than AR (one target forward per token) on the machine it was tuned on. */
int vs_autotune_slower_than_ar(const vs_autotune_result *res);

/* Whether m asks for size=auto (1) or not (0). vs_method_parse took it out of the scheduler's
 * parameters (which are what the scheduler plugin must accept) into m->size, and refused any
 * other size value. */
int vs_autotune_wanted(const vs_method *m);

/* The default above: sets m->size to size=auto (and adds it to m->text) when m is
 * speculative, runs on `standard`, names no size and `continuous` is 0. Returns 1 when it
 * did, 0 when not. */
int vs_autotune_default(vs_method *m, int continuous);

/* Resolves m on `dev` for `models` into res->method: m itself when m has no size=auto; else m
 * with the cached choice, or (no valid cache entry, or VS_AUTOTUNE_REFRESH) with the choice of
 * a tuning, then stored. `opts` may be NULL. Tunings are serialised process-wide, so jobs that
 * ask together tune once. Errors: a continuous-token model (VSPEC_ENOTSUP), a model without a
 * drafter, a failed generation. */
int vs_autotune_resolve(vs_models *models, vspec_dev *dev, const vs_method *m,
                        const vs_autotune_opts *opts, vs_autotune_result *res, char *err,
                        size_t errlen);

/* "size=auto: chose drafter=model,shape=chain,depth=3 (cached, tuned 2026-11-23 on ...): ...",
 * or why the method runs as AR. */
void vs_autotune_describe(const vs_autotune_result *res, char *buf, size_t len);
/* The candidate table, one line each, the choice marked (empty for a cached result). */
void vs_autotune_print_table(const vs_autotune_result *res, FILE *f);

/* ---- internal (core/autotune*.c) ---------------------------------------------------------- */

#define VS_AT_MAX_FAMILIES 6
#define VS_AT_MAX_SIZES 10

/* One family of candidates: a drafter and a shape, and the sizes that shape tunes. */
typedef struct vs_at_family {
  const char *drafter;      /* "model" / "head"; NULL when the method names it */
  const char *shape;        /* "chain" / "dynamic" / "static"; NULL when named (the method's) */
  int shape_id;             /* 0 chain, 1 static, 2 dynamic (plugins/sched/shape.h) */
  const char *size_key;     /* "depth", "total_tokens", "tree" */
  int n_sizes;
  const char *sizes[VS_AT_MAX_SIZES];
  int nodes[VS_AT_MAX_SIZES];      /* tree nodes verified, root included */
  int max_tokens[VS_AT_MAX_SIZES]; /* tokens a round emits at most */
} vs_at_family;

/* What a method leaves to tune. */
typedef struct vs_at_space {
  char rest[512];           /* the scheduler parameters that stay (no size, no tuned keys) */
  int exact;                /* the rule samples the target's distribution: AR may replace it */
  int n_fam;
  vs_at_family fam[VS_AT_MAX_FAMILIES];
} vs_at_space;

/* The space of m on `models` (core/autotune_space.c). Errors: no drafter to tune. */
int vs__autotune_space(vs_models *models, const vs_method *m, vs_at_space *sp, char *err,
                       size_t errlen);
/* "drafter=model,shape=chain,depth=3": the family's free keys and the size. */
void vs__autotune_param(const vs_at_space *sp, int fam, int size, char *out, size_t cap);
/* 1 when `choice` is one of the space's candidates, or "ar" for an exact rule. */
int vs__autotune_valid(const vs_at_space *sp, const char *choice);
/* The method m with `choice` in place of size=auto (plain AR for "ar"): the scheduler's
 * parameters and the drafter set as vs_method_parse would set them from that spelling, the
 * text written for logs. Errors: the parameters do not fit. */
int vs__autotune_method(const vs_method *m, const vs_at_space *sp, const char *choice,
                        vs_method *out, char *err, size_t errlen);

/* The node counts of the target's cost curve (core/autotune_cache.c: cached per model and
 * machine; measured when absent or refresh is set). */
#define VS_AT_CURVE_N 7
extern const int vs__at_curve_nodes[VS_AT_CURVE_N];
/* 1 when a method should run as AR: its rule is exact and the best speculative rate (tokens
 * per second, 0: none) is not VS_AUTOTUNE_AR_MARGIN times AR's. */
int vs__autotune_prefer_ar(int exact, double sd_rate, double ar_rate);
/* Measures the space's candidates and picks (no choice cache; vs_autotune_resolve calls it
 * with the process-wide lock held). */
int vs__autotune_measure(vs_models *models, vspec_dev *dev, const vs_method *m,
                         const vs_at_space *sp, const double *curve,
                         const vs_autotune_opts *opts, vs_autotune_result *res, char *err,
                         size_t errlen);

#endif /* VS_AUTOTUNE_H */
