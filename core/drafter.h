/*
 * core/drafter.h - the draft side of speculative decoding, as the engine drives it.
 *
 * Every drafter is a plugin (include/vspec/plugin.h, "drafter plugins"; core/drafter.c adapts
 * it) of one of two sorts:
 *   - driven level by level: the engine's tree builders (core/draft_tree.c: a chain, EAGLE's
 *     static tree, EAGLE-2's dynamic tree) call begin for the root and expand for each level,
 *     and the drafter fills the distributions below those nodes. The draft GPT and the EAGLE
 *     head are plugins/drafter/model.c, which runs the model directory's draft model served
 *     by core/draft_model.c (drafter=model, drafter=head, or auto: the head where there is
 *     one);
 *   - proposing: the drafter builds the whole tree below the root itself and reads the
 *     target's distributions at the verified nodes (Speculative Jacobi Decoding,
 *     plugins/drafter/jacobi.c).
 * A drafter that reads the target's features (the EAGLE head) has the target return them and
 * gets them with start, end and skip.
 */
#ifndef VS_DRAFTER_H
#define VS_DRAFTER_H

#include "core/job.h"
#include "core/sampling.h"
#include "core/tree.h"

typedef struct vs_drafter vs_drafter;

typedef struct vs_drafter_config {
  uint32_t kind;     /* vspec_drafter_kind, resolved (model, head or plugin; not auto) */
  const char *name;  /* a drafter plugin's name */
  const vspec_params *params; /* the drafter's own parameters (vs_method.drafter_set) */
  struct vs_registry *reg;   /* where drafter plugins come from */
  const vspec_host *host;    /* what they are given */
  const vs_backend_model *model; /* the draft model served to the drafter, or NULL */
  vspec_dev *dev;
  const vs_job *job;
  int rows;          /* CFG rows, as the target */
  int max_nodes;     /* catch-up + root + expanded nodes per round */
  int max_tree_nodes; /* largest tree (or dynamic-tree candidate pool) the engine drafts */
  int max_depth;     /* deepest draft a round of this job asks for (the first plan's bound) */
  int n_image;       /* tokens in the grid */
  int target_feature_dim;
  int vocab;         /* the target's */
  int may_skip;      /* the scheduler may skip verification (it has decide): node_feature */
} vs_drafter_config;

int vs_drafter_open(const vs_drafter_config *cfg, vs_drafter **out, char *err, size_t errlen);
void vs_drafter_close(vs_drafter *d);
int vs_drafter_uses_features(const vs_drafter *d);
/* After the target's prefill: the first root (image token 0) and the target feature at the
 * last condition position ([rows, dim]). */
int vs_drafter_start(vs_drafter *d, int32_t root_token, const float *root_feature, char *err,
                     size_t errlen);
/* Feeds the catch-up chain and the root (image index root_index); fills the root's draft
 * distribution in `tree`. */
int vs_drafter_begin(vs_drafter *d, vs_tree *tree, int32_t root_index, char *err, size_t errlen);
/* Forwards tree nodes (all of one level, parents already forwarded) and fills their draft
 * distributions. */
int vs_drafter_expand(vs_drafter *d, vs_tree *tree, const int32_t *nodes, int n,
                      int32_t root_index, char *err, size_t errlen);
/* Drafters that build the whole tree below the root themselves (plugins): up to `depth`
 * tokens, each with the distribution it was drawn from as its parent's expansion
 * distribution. 0 when the kind is driven by begin / expand instead. */
int vs_drafter_proposes(const vs_drafter *d);
int vs_drafter_propose(vs_drafter *d, vs_tree *tree, int depth, int32_t root_index, char *err,
                       size_t errlen);

/* How a round ended, as a drafter sees it. */
typedef struct vs_round_outcome {
  const vs_tree *tree;
  const int32_t *path;     /* [n + 1] tree nodes, path[0] the root; NULL: keep none of the
                              drafter's entries */
  const int32_t *accepted; /* [n] the drafted tokens accepted after the root */
  int n;
  const float *features;   /* target features at the root and each accepted node ([n + 1,
                              rows, dim]); NULL for drafters without features */
  int32_t next_root;       /* the token sampled after them */
  int32_t root_index;      /* image index of the tree's root */
  const float *logits;     /* the target's logits at every tree node ([tree->n, rows,
                              vocab]); NULL for a path accepted without verification */
  /* Where the target's features stayed on the device (features NULL): the table [*, rows,
   * dim] (device) and the rows [n + 1] of the root's and each accepted node's feature. */
  const float *feature_table;
  const int32_t *feature_rows;
} vs_round_outcome;
int vs_drafter_end(vs_drafter *d, const vs_round_outcome *o, char *err, size_t errlen);
/* Ends a round the drafter sat out (an AR step): the root joins the catch-up chain;
 * `root_feature` is the target feature at the root ([rows, dim]; NULL for a plain model). */
int vs_drafter_skip(vs_drafter *d, const float *root_feature, int32_t next_root, char *err,
                    size_t errlen);
int64_t vs_drafter_forwards(const vs_drafter *d);
/* Nodes fed by those forwards. */
int64_t vs_drafter_nodes(const vs_drafter *d);
/* From now on the drafter's forwards go through `gate` (cross-job batching; the job has
 * entered it), or alone again with NULL. */
struct vs_forward_gate;
void vs_drafter_set_gate(vs_drafter *d, struct vs_forward_gate *gate);
/* Whether its draft model can draw drafts on the device (core/draft_model.h), and from the
 * next forward on draws them so (NULL: on the host again). */
struct vs_draft_draw;
int vs_drafter_draws(const vs_drafter *d);
void vs_drafter_set_draw(vs_drafter *d, const struct vs_draft_draw *draw);
/* The drafter's output feature at an expanded tree node ([rows, dim]); feature heads only. */
const float *vs_drafter_node_feature(const vs_drafter *d, int32_t node);

#endif /* VS_DRAFTER_H */
