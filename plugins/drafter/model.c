/*
 * plugins/drafter/model.c - `model`: the drafter that runs a trained draft model, a separate
 * small draft GPT (drafter=model) or an EAGLE-style head over the target's features
 * (drafter=head). The engine loads the model from the model directory and serves it
 * (vspec_drafter_job.model); the engine grows the round's tree (a chain, EAGLE's static tree,
 * EAGLE-2's dynamic tree) and this drafter gives the distribution below each node, one forward
 * per level (begin, expand).
 *
 * It keeps the draft model's session in step with the target:
 *   - each round starts at the root (the last emitted token) and first feeds the tokens
 *     emitted last round that it has not consumed yet (the catch-up chain), each with the
 *     target feature that precedes it, in the same forward as the root;
 *   - tree nodes are then fed level by level (appending forwards); a node's mark is the
 *     pending index it was fed at;
 *   - at the end of the round a feature head commits only the catch-up chain and the root:
 *     accepted draft tokens are fed again next round with the target's own features, as
 *     EAGLE does (update_inference_inputs in SafeAILab/EAGLE eagle/model/utils.py). A plain
 *     draft GPT also keeps the accepted nodes it fed while drafting (their KV entries depend
 *     on the tokens alone), so next round it feeds only the root and, when the whole path
 *     was accepted, the leaf it never fed.
 * A feature head whose backend keeps its output features on the device (model info
 * keeps_features, ABI 1.7) in a job whose scheduler never skips verification feeds each tree
 * node its parent's output by reference (vspec_forward_batch.feature_src): the head's
 * features never cross to the host, a download (on a GPU a wait) less per head forward.
 * Draft distributions are the draft model's logits processed as the target's (LANTERN's
 * convention: Model.topK_genrate in jadohu/LANTERN models/drafters/cnets_llamagen.py), which
 * the engine's vspec_draft_model.distribution does.
 */
#include <stdio.h>
#include <string.h>

#include "vspec/plugin.h"

#define MODEL_NAME "model"

typedef struct vspec_drafter {
  const vspec_host *host;
  const vspec_draft_model *m;
  vspec_session *sess;
  int rows, vocab, max_nodes, fdim_in, fdim_out, uses_features;
  int keep; /* tree nodes' features stay on the device (feature_src); node_feats unused */
  int64_t forwards, nodes;
  /* tokens to feed before the next root, with the target feature preceding each */
  int32_t *chain_tokens;
  float *chain_feats; /* [max_nodes, rows, fdim_in] */
  int n_chain;
  int32_t root_token;
  float *root_feat;   /* [rows, fdim_in] */
  /* ABI 1.8: where the target's features stayed on the device (vspec_round_result
   * feature_table), the rows of the catch-up chain's and the root's in it; -1: the host
   * copies above */
  const float *table;
  int32_t *chain_rows, root_row, *rows_fed; /* rows_fed: a forward's feature_row */
  int n_pending;      /* nodes fed since the round began (catch-up chain, root, expanded) */
  /* per-forward buffers */
  int32_t *tokens, *parents, *src;
  float *in_feats;    /* [max_nodes, rows, fdim_in] */
  float *logits;      /* [max_nodes, rows, vocab] */
  float *out_feats;   /* [max_nodes, rows, fdim_out] */
  float *node_feats;  /* per tree node: the model's output feature [node_cap, rows, fdim_out] */
  int node_cap;
} md_drafter;

static void md_destroy(vspec_drafter *d) {
  if (!d) return;
  const vspec_host *h = d->host;
  if (d->sess) d->m->close(d->m->ctx, d->sess);
  h->free(d->chain_tokens);
  h->free(d->chain_feats);
  h->free(d->root_feat);
  h->free(d->chain_rows);
  h->free(d->rows_fed);
  h->free(d->tokens);
  h->free(d->parents);
  h->free(d->src);
  h->free(d->in_feats);
  h->free(d->logits);
  h->free(d->out_feats);
  h->free(d->node_feats);
  h->free(d);
}

/* Feature widths: a node's input feature is its parent's output (EAGLE), and the root's is
 * the target's. */
static int md_check_widths(const md_drafter *d, int target_dim, char *err, size_t errlen) {
  if (!d->uses_features) return VSPEC_OK;
  if (d->fdim_out != d->fdim_in) {
    snprintf(err, errlen, "draft head outputs %d-wide features but takes %d: a tree node's "
             "input is its parent's output, so the widths must match", d->fdim_out, d->fdim_in);
    return VSPEC_ESHAPE;
  }
  if (d->fdim_in != target_dim) {
    snprintf(err, errlen, "draft head takes %d-wide features, the target gives %d", d->fdim_in,
             target_dim);
    return VSPEC_ESHAPE;
  }
  return VSPEC_OK;
}

static int md_alloc(md_drafter *d, const vspec_drafter_job *job) {
  const vspec_host *h = d->host;
  size_t M = (size_t)d->max_nodes, R = (size_t)d->rows;
  size_t fin = (size_t)(d->fdim_in ? d->fdim_in : 1), fout = (size_t)(d->fdim_out ? d->fdim_out : 1);
  d->node_cap = job->max_tree_nodes;
  d->chain_tokens = h->alloc(M * sizeof(int32_t));
  d->chain_feats = h->alloc(M * R * fin * sizeof(float));
  d->root_feat = h->calloc(R * fin, sizeof(float));
  d->chain_rows = h->alloc(M * sizeof(int32_t));
  d->rows_fed = h->alloc(M * sizeof(int32_t));
  d->root_row = -1;
  d->tokens = h->alloc(M * sizeof(int32_t));
  d->parents = h->alloc(M * sizeof(int32_t));
  d->src = h->alloc(M * sizeof(int32_t));
  d->in_feats = h->alloc(M * R * fin * sizeof(float));
  d->logits = h->alloc(M * R * (size_t)d->vocab * sizeof(float));
  d->out_feats = h->alloc(M * R * fout * sizeof(float));
  d->node_feats = h->alloc((size_t)d->node_cap * R * fout * sizeof(float));
  return d->chain_tokens && d->chain_feats && d->root_feat && d->chain_rows && d->rows_fed &&
                 d->tokens && d->parents && d->src &&
                 d->in_feats && d->logits && d->out_feats && d->node_feats
             ? VSPEC_OK
             : VSPEC_ENOMEM;
}

static int md_create(const vspec_host *host, const vspec_params *params,
                     const vspec_drafter_job *job, vspec_drafter **out, char *err,
                     size_t errlen) {
  static const char *const known[] = {NULL};
  int rc = host->param_check_known(params, known, err, errlen);
  if (rc) return rc;
  if (!VSPEC_HAS_FIELD(job, vspec_drafter_job, model) || !job->model) {
    snprintf(err, errlen, "no draft model: the model directory has none for this drafter");
    return VSPEC_EINVAL;
  }
  md_drafter *d = host->calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  const vspec_model_info *info = job->model->info;
  d->host = host;
  d->m = job->model;
  d->rows = job->rows;
  d->vocab = info->vocab;
  d->max_nodes = job->max_nodes;
  d->fdim_in = info->feature_in_dim;
  d->fdim_out = info->feature_dim;
  d->uses_features = d->fdim_in > 0;
  /* node_feature (asked only where the scheduler may skip) reads host copies */
  d->keep = d->uses_features && VSPEC_HAS_FIELD(info, vspec_model_info, keeps_features) &&
            info->keeps_features && VSPEC_HAS_FIELD(job, vspec_drafter_job, may_skip) &&
            !job->may_skip;
  if ((rc = md_check_widths(d, job->target_feature_dim, err, errlen))) {
    md_destroy(d);
    return rc;
  }
  if (md_alloc(d, job)) {
    md_destroy(d);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  if ((rc = d->m->open(d->m->ctx, &d->sess, err, errlen))) {
    md_destroy(d);
    return rc;
  }
  *out = d;
  return VSPEC_OK;
}

static int md_uses_features(const vspec_drafter *d) { return d->uses_features; }

static void md_counts(const vspec_drafter *d, int64_t *forwards, int64_t *nodes) {
  *forwards = d->forwards;
  *nodes = d->nodes;
}

static int md_start_feature(vspec_drafter *d, int32_t root_token, const float *root_feature,
                            char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  d->n_chain = 0;
  d->root_token = root_token;
  d->root_row = -1;
  if (d->uses_features && root_feature) /* start (without) is for drafters without features */
    memcpy(d->root_feat, root_feature, (size_t)d->rows * d->fdim_in * sizeof(float));
  return VSPEC_OK;
}

static int md_start(vspec_drafter *d, int32_t root_token, char *err, size_t errlen) {
  return md_start_feature(d, root_token, NULL, err, errlen);
}

/* Forward output row-block i as tree node `node`: its draft distribution and feature. */
static int md_fill(md_drafter *d, const vspec_draft_builder *b, int32_t node, int i,
                   int32_t root_index) {
  int32_t token, parent, depth;
  float *p = b->dist(b->ctx, node);
  if (!p || b->node(b->ctx, node, &token, &parent, &depth) || node >= d->node_cap)
    return VSPEC_ERANGE;
  /* A node at depth k predicts image token root_index + k + 1. */
  d->m->distribution(d->m->ctx, d->logits + (size_t)i * d->rows * d->vocab,
                     root_index + depth + 1, p);
  if (d->uses_features && !d->keep)
    memcpy(d->node_feats + (size_t)node * d->rows * d->fdim_out,
           d->out_feats + (size_t)i * d->rows * d->fdim_out,
           (size_t)d->rows * d->fdim_out * sizeof(float));
  return VSPEC_OK;
}

/* by_ref: the nodes' input features are their parents' outputs where the head left them
 * (d->src, pending indices), not host rows. */
static int md_forward(md_drafter *d, int n, int append, int by_ref, char *err, size_t errlen) {
  int table = 0; /* some node's feature is a row of the target's table (rows_fed) */
  for (int i = 0; !by_ref && d->uses_features && i < n; i++) table |= d->rows_fed[i] >= 0;
  vspec_forward_batch fb = {.struct_size = sizeof fb, .n_nodes = n, .tokens = d->tokens,
                            .parents = d->parents,
                            .features = d->uses_features && !by_ref ? d->in_feats : NULL,
                            .append = append, .feature_src = by_ref ? d->src : NULL,
                            .feature_table = table ? d->table : NULL,
                            .feature_row = table ? d->rows_fed : NULL};
  vspec_forward_out o = {.struct_size = sizeof o, .logits = d->logits,
                         .features = d->uses_features && !d->keep ? d->out_feats : NULL};
  d->forwards++;
  d->nodes += n;
  return d->m->forward(d->m->ctx, d->sess, &fb, &o, err, errlen);
}

/* The catch-up chain into the forward buffers (pending indices 0 .. n_chain-1). */
static void md_stage_chain(md_drafter *d) {
  size_t fsz = (size_t)d->rows * d->fdim_in;
  for (int i = 0; i < d->n_chain; i++) {
    d->tokens[i] = d->chain_tokens[i];
    d->parents[i] = i - 1;
    d->rows_fed[i] = d->chain_rows[i];
    if (d->uses_features && d->chain_rows[i] < 0)
      memcpy(d->in_feats + i * fsz, d->chain_feats + i * fsz, fsz * sizeof(float));
  }
}

static int md_begin(vspec_drafter *d, int32_t root_index, const vspec_draft_builder *b,
                    char *err, size_t errlen) {
  int n = d->n_chain + 1;
  if (n > d->max_nodes) {
    snprintf(err, errlen, "catch-up chain of %d exceeds %d nodes", n, d->max_nodes);
    return VSPEC_ERANGE;
  }
  size_t fsz = (size_t)d->rows * d->fdim_in;
  md_stage_chain(d);
  d->tokens[n - 1] = d->root_token;
  d->parents[n - 1] = n - 2;
  d->rows_fed[n - 1] = d->root_row;
  if (d->uses_features && d->root_row < 0)
    memcpy(d->in_feats + (n - 1) * fsz, d->root_feat, fsz * sizeof(float));
  int rc = md_forward(d, n, 0, 0, err, errlen);
  if (rc) return rc;
  d->n_pending = n;
  *b->mark(b->ctx, 0) = n - 1;
  if (md_fill(d, b, 0, n - 1, root_index)) {
    snprintf(err, errlen, "the tree has no room for the root's distribution");
    return VSPEC_ERANGE;
  }
  return VSPEC_OK;
}

static int md_expand(vspec_drafter *d, int32_t root_index, const int32_t *nodes, int32_t n,
                     const vspec_draft_builder *b, char *err, size_t errlen) {
  if (n <= 0) return VSPEC_OK;
  size_t fin = (size_t)d->rows * d->fdim_in, fout = (size_t)d->rows * d->fdim_out;
  int base = d->n_pending;
  if (base + n > d->max_nodes) {
    snprintf(err, errlen, "%d pending nodes exceed %d", base + n, d->max_nodes);
    return VSPEC_ERANGE;
  }
  for (int i = 0; i < n; i++) {
    int32_t token, parent, depth;
    int32_t *pm = NULL;
    if (!b->node(b->ctx, nodes[i], &token, &parent, &depth) && parent >= 0)
      pm = b->mark(b->ctx, parent);
    if (!pm || *pm < 0 || nodes[i] >= d->node_cap || parent >= d->node_cap) {
      snprintf(err, errlen, "node %d cannot be expanded before its parent", nodes[i]);
      return VSPEC_EINVAL;
    }
    d->tokens[i] = token;
    d->parents[i] = *pm;
    d->src[i] = *pm;
    /* A tree node's input feature is the model's own output at its parent (EAGLE). */
    if (d->uses_features && !d->keep)
      memcpy(d->in_feats + i * fin, d->node_feats + (size_t)parent * fout, fin * sizeof(float));
  }
  int rc = md_forward(d, n, 1, d->keep, err, errlen);
  if (rc) return rc;
  for (int i = 0; i < n; i++) {
    *b->mark(b->ctx, nodes[i]) = base + i;
    if (md_fill(d, b, nodes[i], i, root_index)) {
      snprintf(err, errlen, "more expanded nodes than the tree can hold");
      return VSPEC_ERANGE;
    }
  }
  d->n_pending = base + n;
  return VSPEC_OK;
}

/* How many of the n accepted tokens a plain draft model fed itself this round, in order
 * along the accepted path: their KV entries depend on the tokens alone, so they are kept
 * rather than fed again. A feature head's entries depend on its input features, which the
 * target's features replace once verified (EAGLE), so a head keeps none. */
static int md_reusable(const md_drafter *d, const vspec_round_result *r) {
  if (d->uses_features) return 0;
  int k = 0;
  while (k < r->n_accepted && r->marks[r->path[k + 1]] >= 0) k++;
  return k;
}

static int md_end(vspec_drafter *d, const vspec_round_result *r, char *err, size_t errlen) {
  int n = r->n_accepted;
  if (n + 1 > d->max_nodes) {
    snprintf(err, errlen, "%d accepted tokens exceed its capacity", n);
    return VSPEC_ERANGE;
  }
  /* Commit what was fed with exact inputs this round: the catch-up chain, the root and,
   * for a plain draft model, the accepted nodes it fed. Their pending indices form a chain
   * (each expanded node's parent index is its tree parent's), as commit requires. */
  int head = d->n_chain + 1, kept = md_reusable(d, r);
  int32_t *commit = d->parents; /* free until the next forward; head + kept <= pending */
  for (int i = 0; i < head; i++) commit[i] = i;
  for (int j = 0; j < kept; j++) commit[head + j] = r->marks[r->path[j + 1]];
  int rc = d->m->commit(d->m->ctx, d->sess, commit, head + kept, err, errlen);
  if (rc) return rc;
  size_t fsz = (size_t)d->rows * d->fdim_in;
  /* ABI 1.8: the target's features still on the device, read by row there */
  const int32_t *rows = VSPEC_HAS_FIELD(r, vspec_round_result, feature_rows) && !r->features
                            ? r->feature_rows
                            : NULL;
  if (d->uses_features && !r->features && !rows) {
    snprintf(err, errlen, "the round ended without the target's features");
    return VSPEC_EINVAL;
  }
  if (rows) d->table = r->feature_table;
  /* Accepted token j is fed after the target feature of the node before it. */
  for (int j = kept; j < n; j++) {
    d->chain_tokens[j - kept] = r->tokens[r->path[j + 1]];
    d->chain_rows[j - kept] = rows ? rows[j] : -1;
    if (d->uses_features && !rows)
      memcpy(d->chain_feats + (j - kept) * fsz, r->features + j * fsz, fsz * sizeof(float));
  }
  d->n_chain = n - kept;
  d->root_token = r->next_root;
  d->root_row = rows ? rows[n] : -1;
  if (d->uses_features && !rows)
    memcpy(d->root_feat, r->features + (size_t)n * fsz, fsz * sizeof(float));
  d->n_pending = 0;
  return VSPEC_OK;
}

static int md_skip_feature(vspec_drafter *d, int32_t next_root, const float *root_feature,
                           char *err, size_t errlen) {
  size_t fsz = (size_t)d->rows * d->fdim_in;
  if (d->n_chain + 2 > d->max_nodes) {
    /* A long run of rounds without drafting: feed and commit the chain now rather than
     * letting it outgrow one forward. */
    md_stage_chain(d);
    int rc = md_forward(d, d->n_chain, 0, 0, err, errlen);
    if (rc) return rc;
    for (int i = 0; i < d->n_chain; i++) d->parents[i] = i;
    if ((rc = d->m->commit(d->m->ctx, d->sess, d->parents, d->n_chain, err, errlen))) return rc;
    d->n_chain = 0;
  }
  d->chain_tokens[d->n_chain] = d->root_token;
  d->chain_rows[d->n_chain] = d->root_row;
  if (d->uses_features && root_feature) {
    if (d->root_row < 0)
      memcpy(d->chain_feats + d->n_chain * fsz, d->root_feat, fsz * sizeof(float));
    memcpy(d->root_feat, root_feature, fsz * sizeof(float));
    d->root_row = -1;
  }
  d->n_chain++;
  d->root_token = next_root;
  return VSPEC_OK;
}

static int md_skip(vspec_drafter *d, int32_t next_root, char *err, size_t errlen) {
  return md_skip_feature(d, next_root, NULL, err, errlen);
}

static const float *md_node_feature(const vspec_drafter *d, int32_t node) {
  if (!d->uses_features || d->keep || node < 0 || node >= d->node_cap) return NULL;
  return d->node_feats + (size_t)node * d->rows * d->fdim_out;
}

static const vspec_drafter_vtable md_vtable = {
    .struct_size = sizeof(vspec_drafter_vtable),
    .create = md_create,
    .destroy = md_destroy,
    .start = md_start,
    .end = md_end,
    .skip = md_skip,
    .begin = md_begin,
    .expand = md_expand,
    .uses_features = md_uses_features,
    .start_feature = md_start_feature,
    .skip_feature = md_skip_feature,
    .node_feature = md_node_feature,
    .counts = md_counts,
};

static const vspec_plugin_desc md_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_DRAFTER, MODEL_NAME, "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD),
    .description = "a trained draft model from the model directory: the draft GPT "
                   "(drafter=model) or the EAGLE head over the target's features "
                   "(drafter=head), one forward per tree level",
    .vtable = &md_vtable,
};

VSPEC_PLUGIN_DEFINE(md_desc)
