/*
 * core/job.h - one image to generate: what the caller asks for and what it hears back
 * after every round.
 */
#ifndef VS_JOB_H
#define VS_JOB_H

#include <stdatomic.h>

#include "core/method.h"
#include "core/metrics.h"
#include "core/models.h"

/* RNG stream ids (one purpose each, so methods never share draws by accident). */
enum {
  VS_STREAM_TARGET_SAMPLE = 1, /* tokens drawn from the target distribution */
  VS_STREAM_DRAFT_SAMPLE = 2,  /* tokens drawn from the draft distribution */
  VS_STREAM_ACCEPT = 3,        /* acceptance tests */
  VS_STREAM_SCHED = 4,         /* scheduler decisions */
  VS_STREAM_ORDER = 5,         /* MAR's generation order */
  VS_STREAM_RESIDUAL = 6,      /* continuous tokens: residual sampling */
  /* drafter plugins draw from VSPEC_STREAM_DRAFTER (include/vspec/plugin.h) onward */
  VS_STREAM_NOISE = 64         /* MAR's diffusion noises: stream 64 + position, so that draft
                                  and target draw a position's noises alike */
};

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
  /* Continuous-token (MAR) models reveal positions in a random order: n_tokens counts the
   * verified positions, tokens are zeros, status is per grid position (VS_TOKEN_NONE: not
   * yet), and latents [grid, token_dim] holds the verified values (zeros elsewhere). NULL
   * for discrete models. */
  const float *latents;
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
  /* What decodes (core/method.h), parsed and checked where the job was asked for and with
   * size=auto resolved (core/autotune.h); NULL: plain AR. Not copied: it must outlive the
   * job. */
  const vs_method *method;
  int32_t class_label;         /* class-conditional models */
  const float *caption;        /* text models: [caption_len, caption_dim] */
  const uint8_t *caption_mask; /* text models: [caption_len] */
  uint64_t seed;
  vs_sampling sampling;
  uint8_t *status;             /* optional out: [grid] VS_TOKEN_* per emitted token */
  float *latents;              /* continuous-token models: out [grid, token_dim] (required;
                                  the int32 token grid of vs_generate is not written) */
  /* continuous-token models, for golden tests against a reference: a given generation order
   * [grid] and noises [grid, sampling_steps + 1, token_dim] (slot 0 the initial state, slot k
   * the noise of step k, the last the final step's) instead of the seed's draws */
  const int32_t *mar_order;
  const float *mar_noise;
  vs_round_fn on_round;        /* optional: called after every round */
  void *user;
  /* optional: the target's verify forwards go through this gate, batched with other jobs'
   * on the same model (core/forward_gate.h); NULL runs them alone */
  struct vs_forward_gate *gate;
  atomic_int *cancel;          /* optional: set nonzero (from any thread) to stop the job at
                                  the next round boundary; vs_generate then returns
                                  VSPEC_ECANCELED */
} vs_job;

#endif /* VS_JOB_H */
