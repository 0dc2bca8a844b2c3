/*
 * core/round_loop.h - the state of one job's round loop, shared by the files that make up
 * a round (internal to core/).
 *
 * One round (DESIGN.md "Data flow of one job"):
 *   scheduler.plan -> the drafter builds a token tree below the root (the last emitted
 *   token; core/draft_tree.c) -> the scheduler may accept a path unverified (VVS,
 *   core/verify_skip.c) -> one target forward over root + tree -> the walk accepts a path
 *   with the acceptance-rule plugin and samples one more token (core/verify_walk.c) -> the
 *   path is committed (KV compaction) -> the accepted tokens and the new token are emitted
 *   (core/round_loop.c).
 * Vanilla AR is the same loop with no draft: no rule, no scheduler, no drafter, a one-node
 * tree whose walk samples the next token from the target.
 */
#ifndef VS_ROUND_LOOP_H
#define VS_ROUND_LOOP_H

#include "core/drafter.h"
#include "core/forward_gate.h"
#include "core/engine.h"
#include "core/method.h"
#include "core/tree.h"

/* Largest tree one target forward verifies, root included. */
#define VS_SD_MAX_NODES 128
/* Largest candidate pool of a dynamic tree (1 + top_k + depth * top_k^2). */
#define VS_SD_MAX_POOL 1024

/* What a static tree's round draws on the device, as one upload (core/draft_device.c): row
 * r's counts[r] children go to drafts first[r] ..; row r is the distribution of draft node[r]
 * (-1: the root); the draws take u[cursor ..]; drawn[k] comes back 0 for an absent draft k
 * (vspec_children_spec). */
typedef struct vs_draw_children {
  int32_t counts[VS_SD_MAX_NODES], first[VS_SD_MAX_NODES], node[VS_SD_MAX_NODES];
  int32_t cursor, pad;
  double u[VS_SD_MAX_NODES];
  uint8_t drawn[VS_SD_MAX_NODES];
} vs_draw_children;

typedef struct vs_rounds {
  vs_models *models;
  const vs_backend_model *t;
  vspec_dev *dev;
  const vs_job *job;
  const vs_sampling *s;
  int V, N, rows, greedy;
  /* plugins (NULL for ar) */
  vs_plugin *rule_plugin, *sched_plugin;
  const vspec_accept_vtable *rule_vt;
  const vspec_sched_vtable *sched_vt;
  vspec_rule *rule;
  vspec_sched *sched;
  /* the model's codebook neighbour table, for a rule with VSPEC_PLUGIN_USES_NEIGHBOURS */
  const int32_t *neighbours;
  int neighbours_k;
  /* target */
  vspec_session *sess;
  float *logits;     /* host [cap, rows, V] */
  float *feats;      /* host [cap, rows, d] (feature drafters) */
  float *path_feats; /* host [VS_MAX_DEPTH + 2, rows, d]: features at the accepted path */
  int fdim;
  size_t logits_off; /* tree node 0's index in the last target batch (after prepended tokens) */
  /* verification skipping (VVS) */
  int32_t *unv;      /* tokens accepted unverified, to feed before the next tree */
  int n_unv;
  float *fcache;     /* [N + 1, rows, d]: slot j holds the target feature preceding token j */
  int n_fcache;      /* slots 0 .. n_fcache-1 are filled (verified positions) */
  int32_t *view_tokens, *view_depth; /* tree view scratch */
  float *view_score;
  vspec_rng rng_sched;
  /* drafting (drafter NULL for ar) */
  vs_drafter *drafter;
  vs_tree tree, pool;
  int32_t *parents, *order;
  int32_t *feat_node; /* [cap] drafter node (pool index for dynamic trees) of each tree node */
  float *pool_cu;
  /* walk buffers [V] */
  float *q, *q_res, *q_tmp, *p_work;
  vs_sampler sampler;
  vspec_rng rng_target, rng_draft, rng_accept;
  vs_metrics *mt;
  vs_forward_gate *gate; /* job->gate once entered (left when the job ends), else NULL */
  /* the walk on the target's device (core/verify_device.c) */
  int walk_dev;                  /* asked for in every verified round that qualifies */
  int32_t *walk_ints;            /* host [3, cap]: the spec's parents, tokens, dist */
  uint8_t *walk_guided;          /* host [cap] */
  const int32_t *walk_table;     /* the neighbour table as device memory, or NULL */
  int32_t *walk_table_copy;      /* the device copy (devices of another memory space) */
  vspec_walk_spec walk_spec;
  vspec_walk_result walk_res;
  /* drafts drawn on the device (core/draft_device.c) */
  int draft_dev;             /* a chain or sampled static round may draw its drafts there */
  int round_dev;             /* this round's drafts are there: tree node j + 1 is draft j,
                                its token -1 - j until the walk's result */
  int32_t *draft_tok_dev;    /* device [VS_SD_MAX_NODES]: the drafts */
  float *draft_probs_dev;    /* device [draw_rows_cap, V]: the distributions drawn from */
  int draw_rows_cap;
  int32_t *walk_tokens;      /* host [cap]: the tree's tokens, with the walk's result */
  float *tfeat_dev;          /* device [cap, rows, fdim]: the target's features, which a
                                feature head then reads there (NULL: they come down) */
  int feats_on_dev;          /* this round's target features went to tfeat_dev */
  int32_t feat_rows[VS_MAX_DEPTH + 2]; /* the accepted path's rows in tfeat_dev */
  /* A round's draws by row: a drafter forward draws the distributions of its last nodes into
   * rows (chains: forward k, row k, draft k), a static tree's rows their children. */
  double draw_u[VS_SD_MAX_NODES];       /* chains: row k's uniform; trees: draft k's */
  uint8_t draw_guided[VS_SD_MAX_NODES]; /* per row: its node's position is CFG-guided */
  /* static trees: forward k draws rows draw_fwd[k] .. draw_fwd[k + 1] - 1 */
  int32_t draw_fwd[VS_SD_MAX_NODES + 1], n_draw_fwd;
  int32_t draw_node[VS_SD_MAX_NODES];   /* the tree node of each row */
  vs_draw_children draw_children; /* the one upload of a static round's draws */
  int draw_rows, draw_slots;      /* its rows and drafts */
  vspec_rng rng_draft_at;         /* the draft stream before the round's draws */
  void *children_dev;        /* device copy of draw_children */
  int32_t *row_tok_dev;      /* device [VS_SD_MAX_NODES]: draw_probs' own tokens (unused) */
  vspec_children_spec children_spec;
} vs_rounds;

/* Runs one job's rounds (ar or sd) into tokens[N]; mt accumulates the metrics. */
int vs_round_loop_run(vs_models *models, vspec_dev *dev, const vs_job *job, const vs_method *m,
                      int32_t *tokens, vs_metrics *mt, char *err, size_t errlen);

/* core/draft_tree.c: build this round's tree below the root (c->tree, reset to the root). */
int vs_draft_chain(vs_rounds *c, int depth, int32_t root_index, char *err, size_t errlen);
int vs_draft_static(vs_rounds *c, const vspec_round_plan *plan, int depth_limit,
                    int32_t root_index, char *err, size_t errlen);
int vs_draft_dynamic(vs_rounds *c, const vspec_round_plan *plan, int depth_limit,
                     int32_t root_index, char *err, size_t errlen);

/* core/verify_walk.c: walks the verified tree; fills path (tree nodes, root first) and the
 * next token. */
int vs_verify_walk(vs_rounds *c, int32_t root_index, int32_t *path, int *n_path, int32_t *next,
                   char *err, size_t errlen);

/* core/verify_device.c: the walk on the target's device. init decides whether a job's
 * rounds ask for it (after the rule and the drafter are open; drafter_plugin: the drafter
 * reads the target's logits at the round's end); ask sets out's request for a round (nothing
 * when the round does not qualify); take returns 1 with path, n_path and next (the engine's
 * streams and metrics advanced as the host walk would have), 0 when the backend did not
 * walk (the logits are there: walk on the host), or a negative status. */
/* core/verify_device.c: a VSPEC_WALK-like switch `var` (device, host, or auto/unset: the device
 * unless it is the CPU) into *on; VSPEC_EINVAL with a message naming it and `what` it decides
 * for any other value. */
int vs__device_or_host(vspec_dev *dev, const char *var, const char *what, int *on, char *err,
                       size_t errlen);

/* core/draft_device.c: drafts drawn on the device. init decides for the job (after the walk's
 * init); round sets up a round of `plan` (a chain of `depth` drafts, a static tree to
 * `depth`) to draw there (c->round_dev) before the drafter's first forward, or resets
 * round_dev when it cannot; done ends its drawing. */
int vs_draft_device_init(vs_rounds *c, uint32_t drafter_kind, char *err, size_t errlen);
void vs_draft_device_free(vs_rounds *c);
void vs_draft_device_round(vs_rounds *c, const vspec_round_plan *plan, int depth,
                           int32_t root_index);
/* After the device walk's result filled in a static round's tokens (vs_walk_device_take): the
 * draft stream moves on by the uniforms the device's draws took (as the host drafter's would
 * have). Returns how many of the round's drafts were absent (0 for any other round), and in
 * *absent_tried how many of them a one-hot tree's walk judged (those below `last`, the
 * accepted path's last node). */
int vs_draft_device_settle(vs_rounds *c, int32_t last, int *absent_tried);
void vs_draft_device_done(vs_rounds *c);

int vs_walk_device_init(vs_rounds *c, int drafter_plugin, char *err, size_t errlen);
void vs_walk_device_free(vs_rounds *c);
void vs_walk_device_ask(vs_rounds *c, int32_t root_index, vspec_forward_out *out);
int vs_walk_device_take(vs_rounds *c, vspec_forward_out *out, int32_t *path, int *n_path,
                        int32_t *next, char *err, size_t errlen);

/* core/verify_skip.c (VVS): asks the scheduler whether to verify this round's tree and
 * checks its answer; on a skip, accepts the chosen path without calling the target. */
int vs_skip_decide(vs_rounds *c, const vspec_round_state *st, int remaining,
                   vspec_skip_decision *dec, char *err, size_t errlen);
int vs_skip_accept(vs_rounds *c, const vspec_skip_decision *dec, int32_t root_index,
                   int32_t *tokens, int *emitted, int *gamma_out, char *err, size_t errlen);
/* The feature-cache slot (0 = oldest of n_fcache) reused by the j-th of gamma unverified
 * inputs, `staleness` positions older than the most recent ones. */
int vs_skip_stale_slot(int n_fcache, int staleness, int gamma, int j);

#endif /* VS_ROUND_LOOP_H */
