/*
 * core/metrics.h - what a job measured: tokens, forwards, rounds, acceptance, time split.
 *
 * The definitions are those of docs/DESIGN.md "Metrics", shared by the bench, the daemon's
 * stats and the CLI.
 */
#ifndef VS_METRICS_H
#define VS_METRICS_H

#include <stdint.h>

#define VS_MAX_DEPTH 32 /* deepest draft the engine walks */

typedef struct vs_metrics {
  int64_t tokens;          /* image tokens emitted */
  int64_t target_forwards; /* target passes, prefill included */
  int64_t rounds;          /* verification rounds, prefill included (AR: one per token) */
  int64_t draft_tokens;    /* draft tokens the target scored: every node of each verified
                              tree but its root (a chain of depth L counts L), whatever the
                              walk then examined; skipped (VVS) rounds are not scored */
  int64_t drafted;         /* depths the walk examined: one drafted token per depth on the
                              walked path, whatever the number of siblings tried there */
  int64_t accepted;        /* draft tokens accepted by verification (bonus tokens and
                              unverified VVS tokens not included) */
  int64_t siblings_tried;  /* candidates tested, all siblings counted */
  int64_t draft_forwards;  /* drafter passes */
  int64_t draft_nodes;     /* nodes those passes fed (catch-up, roots and expanded nodes) */
  int64_t tree_nodes;      /* nodes verified by the target, roots included */
  int64_t residual_fallbacks; /* rejections whose residual had no mass (docs/SPECULATIVE.md) */
  int64_t reached[VS_MAX_DEPTH + 1];  /* walks that examined depth d (1-based) */
  int64_t accepted_at[VS_MAX_DEPTH + 1];
  double wall_s;           /* wall-clock time of the job */
  double draft_s, verify_s; /* time in drafting and in target forwards */
  double accept_s;          /* time in the verification walk (rules, residuals, sampling) */
  int64_t skipped_rounds;   /* rounds that accepted a path without verification (VVS) */
  int64_t unverified_tokens; /* tokens those rounds emitted */
  int64_t residual_rounds;   /* continuous tokens: proposals the residual samplers drew */
} vs_metrics;

/* Acceptance rate as vLLM defines its draft acceptance rate: accepted / draft_tokens, the
 * share of all scored draft tokens that were accepted (DESIGN.md "Metrics"). */
double vs_metrics_accept_rate(const vs_metrics *m);
/* Walk acceptance rate = accepted / drafted: the share of the depths the walk examined at
 * which it accepted a draft (the figure this project called accept_rate before); per depth d,
 * accepted at d / walks that reached d. */
double vs_metrics_walk_accept_rate(const vs_metrics *m);
double vs_metrics_accept_at(const vs_metrics *m, int depth);
/* Adds b's counters to a (for totals over many images). */
void vs_metrics_add(vs_metrics *a, const vs_metrics *b);

/* TPF and MAL as defined in DESIGN.md "Metrics". */
double vs_metrics_tpf(const vs_metrics *m);
double vs_metrics_mal(const vs_metrics *m);

/* Monotonic seconds, for the time split. */
double vs_now(void);

#endif /* VS_METRICS_H */
