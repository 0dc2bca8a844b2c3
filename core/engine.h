/*
 * core/engine.h - the decode engine: one job from condition to token grid.
 *
 * The engine owns the round loop and everything methods share: sampling with LlamaGen's
 * logit processing, CFG combination, the per-job RNG streams and the metrics. Methods:
 *   "ar"   vanilla autoregressive decoding, LlamaGen's generate() (models.md §1.10)
 *   "sd:"  speculative decoding: a drafter proposes a token tree, one target forward
 *          verifies it, an acceptance-rule plugin decides (core/speculative.c,
 *          docs/SPECULATIVE.md)
 */
#ifndef VS_ENGINE_H
#define VS_ENGINE_H

#include <stdatomic.h>

#include "core/models.h"

/* RNG stream ids (one purpose each, so methods never share draws by accident). */
enum {
  VS_STREAM_TARGET_SAMPLE = 1, /* tokens drawn from the target distribution */
  VS_STREAM_DRAFT_SAMPLE = 2,  /* tokens drawn from the draft distribution */
  VS_STREAM_ACCEPT = 3,        /* acceptance tests */
  VS_STREAM_SCHED = 4          /* scheduler decisions */
};

#define VS_MAX_DEPTH 32 /* deepest draft the engine walks */

typedef struct vs_metrics {
  int64_t tokens;          /* image tokens emitted */
  int64_t target_forwards; /* target passes, prefill included */
  int64_t rounds;          /* verification rounds, prefill included (AR: one per token) */
  int64_t drafted;         /* depths the walk examined: one drafted token per depth on the
                              walked path, whatever the number of siblings tried there */
  int64_t accepted;        /* of which accepted */
  int64_t siblings_tried;  /* candidates tested, all siblings counted */
  int64_t draft_forwards;  /* drafter passes */
  int64_t tree_nodes;      /* nodes verified by the target, roots included */
  int64_t residual_fallbacks; /* rejections whose residual had no mass (docs/SPECULATIVE.md) */
  int64_t reached[VS_MAX_DEPTH + 1];  /* walks that examined depth d (1-based) */
  int64_t accepted_at[VS_MAX_DEPTH + 1];
  double wall_s;           /* wall-clock time of the job */
  double draft_s, verify_s; /* time in drafting and in target forwards */
  double accept_s;          /* time in the verification walk (rules, residuals, sampling) */
  int64_t skipped_rounds;   /* rounds that accepted a path without verification (VVS) */
  int64_t unverified_tokens; /* tokens those rounds emitted */
} vs_metrics;

/* Acceptance rate = accepted / drafted, overall and at depth d (DESIGN.md "Metrics"). */
double vs_metrics_accept_rate(const vs_metrics *m);
double vs_metrics_accept_at(const vs_metrics *m, int depth);
/* Adds b's counters to a (for totals over many images). */
void vs_metrics_add(vs_metrics *a, const vs_metrics *b);

/* TPF and MAL as defined in DESIGN.md "Metrics". */
double vs_metrics_tpf(const vs_metrics *m);
double vs_metrics_mal(const vs_metrics *m);

/* What each emitted token went through (the token map of DESIGN.md). */
enum {
  VS_TOKEN_NONE = 0,       /* not generated yet */
  VS_TOKEN_TARGET = 1,     /* sampled from the target's distribution (AR, bonus, residual) */
  VS_TOKEN_ACCEPTED = 2,   /* drafted and accepted by the acceptance rule */
  VS_TOKEN_UNVERIFIED = 3  /* drafted and accepted without verification (VVS); it went
                              through the target later (post-verification) but was never
                              judged by an acceptance test */
};

struct vs_tree;

/* Passed to a job's round callback after every round. */
typedef struct vs_round_info {
  int64_t round;           /* 0-based, skipped rounds included; 0 is the prefill */
  int skipped;             /* 1: this round accepted a path without calling the target */
  int n_tokens;            /* tokens emitted so far */
  const int32_t *tokens;   /* [n_tokens] */
  const uint8_t *status;   /* [n_tokens] VS_TOKEN_*, or NULL when the job has no map */
  int prepended;           /* unverified tokens fed before the tree (post-verification) */
  int accepted_len;        /* drafted tokens accepted this round (verified or not) */
  const struct vs_tree *tree;             /* the drafted tree (root = node 0), or NULL */
  const vs_backend_model *target;         /* introspection, e.g. for tests */
  vspec_session *session;                 /* the target's session, between rounds */
  const vs_metrics *metrics;              /* the job's metrics so far */
  /* The acceptance rule and scheduler generations this job runs with (speculative methods;
   * NULL for ar): held by the engine for the whole job, so what a caller reports is what
   * ran, whatever reloads happen meanwhile. */
  const vs_plugin *rule_plugin, *sched_plugin;
} vs_round_info;

typedef void (*vs_round_fn)(void *user, const vs_round_info *info);

typedef struct vs_job {
  const char *method;          /* "ar" or "sd:RULE[:PARAMS][@SCHED[:PARAMS]]" (core/method.h) */
  int32_t class_label;         /* class-conditional models */
  const float *caption;        /* text models: [caption_len, caption_dim] */
  const uint8_t *caption_mask; /* text models: [caption_len] */
  uint64_t seed;
  vs_sampling sampling;
  uint8_t *status;             /* optional out: [grid] VS_TOKEN_* per emitted token */
  vs_round_fn on_round;        /* optional: called after every round */
  void *user;
  atomic_int *cancel;          /* optional: set nonzero (from any thread) to stop the job at
                                  the next round boundary; vs_generate then returns
                                  VSPEC_ECANCELED */
} vs_job;

/* Generates one image's tokens (raster order) into tokens[grid_h * grid_w]. */
int vs_generate(vs_models *models, vspec_dev *dev, const vs_job *job, int32_t *tokens,
                vs_metrics *metrics, char *err, size_t errlen);

/* The processed distribution of one node's logits ([rows, vocab]) when predicting image
 * token `predicted_index`: CFG per LlamaGen's schedule (rows == 2; guided unless
 * cfg_interval > -1 and predicted_index - 1 > cfg_interval, the prediction of token 0 always
 * guided), then temperature / top-k / top-p (models.md §1.10). The target and every
 * drafter use it, so both follow the same rules (algorithms.md §1.1). */
void vs_node_distribution(const vspec_ops *ops, vspec_dev *dev, const float *logits, int rows,
                          int vocab, int predicted_index, const vs_sampling *s, float *scratch,
                          float *probs);

/* Checks sampling parameters; the message names the offending one and its range. */
int vs_sampling_validate(const vs_sampling *s, int vocab, char *err, size_t errlen);

/* "method=ar seed=1 class=3 cfg=4 ..." for PNG text chunks and logs. */
size_t vs_job_describe(const vs_job *job, const char *model_name, char *buf, size_t buflen);

#endif /* VS_ENGINE_H */
