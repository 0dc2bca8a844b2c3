/*
 * core/drafter_model.c - the drafters that own a model: a separate draft GPT or an EAGLE-style
 * feature head (core/drafter.h describes how either keeps its session in step with the
 * target). The engine's tree builders (core/draft_tree.c) drive it through begin / expand.
 */
#include "core/drafter_class.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/forward_gate.h"

typedef struct vs_mdrafter {
  const vs_backend_model *bm;
  vspec_dev *dev;
  const vs_job *job;
  vspec_session *sess;
  vs_forward_gate *gate; /* batched with other jobs' drafts, or NULL */
  int rows, vocab, max_nodes, fdim_in, fdim_out;
  int uses_features;
  int64_t forwards, nodes;
  /* tokens to feed before the next root, with the target feature preceding each */
  int32_t *chain_tokens;
  float *chain_feats;   /* [max_nodes, rows, fdim_in] */
  int n_chain;
  int32_t root_token;
  float *root_feat;     /* [rows, fdim_in] */
  int n_head_slots;     /* pending nodes of the current round's first forward (chain + root) */
  /* per-forward buffers */
  int32_t *tokens, *parents;
  float *in_feats;      /* [max_nodes, rows, fdim_in] */
  float *logits;        /* [max_nodes, rows, vocab] */
  float *out_feats;     /* [max_nodes, rows, fdim_out] */
  float *node_feats;    /* per tree node: the drafter's output feature [cap, rows, fdim_out] */
  int node_feats_cap;
  vs_sampler sampler;
} vs_mdrafter;

static int md_uses_features(const void *self) { return ((const vs_mdrafter *)self)->uses_features; }
static void md_counts(const void *self, int64_t *forwards, int64_t *nodes) {
  const vs_mdrafter *d = self;
  *forwards = d->forwards;
  *nodes = d->nodes;
}

static void md_set_gate(void *self, struct vs_forward_gate *gate) {
  ((vs_mdrafter *)self)->gate = gate;
}

static void md_close(void *self) {
  vs_mdrafter *d = self;
  if (!d) return;
  if (d->sess) d->bm->vt->session_close(d->sess);
  free(d->chain_tokens);
  free(d->chain_feats);
  free(d->root_feat);
  free(d->tokens);
  free(d->parents);
  free(d->in_feats);
  free(d->logits);
  free(d->out_feats);
  free(d->node_feats);
  vs_sampler_free(&d->sampler);
  free(d);
}

static int md_open(const vs_drafter_config *cfg, void **out, char *err, size_t errlen) {
  const vs_backend_model *bm = cfg->model;
  vs_mdrafter *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  d->bm = bm;
  d->dev = cfg->dev;
  d->job = cfg->job;
  d->rows = cfg->rows;
  d->vocab = bm->info.vocab;
  d->max_nodes = cfg->max_nodes;
  d->fdim_in = bm->info.feature_in_dim;
  d->fdim_out = bm->info.feature_dim;
  d->uses_features = d->fdim_in > 0;
  if (d->uses_features && d->fdim_out != d->fdim_in) {
    snprintf(err, errlen, "draft head outputs %d-wide features but takes %d: a tree node's "
             "input is its parent's output, so the widths must match", d->fdim_out, d->fdim_in);
    md_close(d);
    return VSPEC_ESHAPE;
  }
  if (d->uses_features && d->fdim_in != cfg->target_feature_dim) {
    snprintf(err, errlen, "draft head takes %d-wide features, the target gives %d",
             d->fdim_in, cfg->target_feature_dim);
    md_close(d);
    return VSPEC_ESHAPE;
  }
  size_t M = (size_t)d->max_nodes, R = (size_t)d->rows, fin = (size_t)(d->fdim_in ? d->fdim_in : 1);
  d->chain_tokens = malloc(M * sizeof(int32_t));
  d->chain_feats = malloc(M * R * fin * sizeof(float));
  d->root_feat = calloc(R * fin, sizeof(float));
  d->tokens = malloc(M * sizeof(int32_t));
  d->parents = malloc(M * sizeof(int32_t));
  d->in_feats = malloc(M * R * fin * sizeof(float));
  d->logits = malloc(M * R * d->vocab * sizeof(float));
  d->out_feats = malloc(M * R * (size_t)d->fdim_out * sizeof(float));
  d->node_feats_cap = cfg->max_tree_nodes;
  d->node_feats = malloc((size_t)cfg->max_tree_nodes * R * (size_t)d->fdim_out * sizeof(float));
  int sampler_rc = vs_sampler_init(&d->sampler, d->vocab);
  if (!d->chain_tokens || !d->chain_feats || !d->root_feat || !d->tokens || !d->parents ||
      !d->in_feats || !d->logits || !d->out_feats || !d->node_feats || sampler_rc) {
    md_close(d);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  vspec_session_config sc = {.struct_size = sizeof sc,
                             .class_label = cfg->job->class_label,
                             .caption = cfg->job->caption,
                             .caption_mask = cfg->job->caption_mask,
                             .rows = cfg->rows,
                             .max_nodes = cfg->max_nodes};
  char inner[VSPEC_ERRLEN] = "";
  int rc = bm->vt->session_open(bm->model, cfg->dev, &sc, &d->sess, inner, sizeof inner);
  if (!rc) {
    /* Condition positions (a plain draft GPT); a feature head may have none. */
    vspec_forward_out o = {.struct_size = sizeof o, .logits = d->logits};
    rc = bm->vt->prefill(d->sess, &o, inner, sizeof inner);
  }
  if (rc) {
    snprintf(err, errlen, "drafter: %s", inner);
    md_close(d);
    return rc;
  }
  *out = d;
  return VSPEC_OK;
}

static int md_start(void *self, int32_t root_token, const float *root_feature, char *err,
                     size_t errlen) {
  vs_mdrafter *d = self;
  (void)err;
  (void)errlen;
  d->n_chain = 0;
  d->root_token = root_token;
  if (d->uses_features)
    memcpy(d->root_feat, root_feature, (size_t)d->rows * d->fdim_in * sizeof(float));
  return VSPEC_OK;
}

/* Processed distribution of forward output row-block i into the tree node's slot. */
static int vs__fill_dist(vs_mdrafter *d, vs_tree *tree, int32_t node, int i, int32_t root_index) {
  float *p = vs_tree_new_dist(tree, node);
  if (!p) return VSPEC_ERANGE;
  /* Node at depth k predicts image token root_index + k + 1. */
  /* At temperature 0 the tree is ranked by the drafter's softmax (EAGLE's top-k), not its
   * one-hot argmax, which would leave one child per node. */
  vs_sampling s = d->job->sampling;
  if (!(s.temperature > 0.0f)) s.temperature = 1.0f;
  vs_node_distribution(&d->sampler, d->logits + (size_t)i * d->rows * d->vocab, d->rows,
                       root_index + tree->nodes[node].depth + 1, &s, p);
  if (d->uses_features)
    memcpy(d->node_feats + (size_t)node * d->rows * d->fdim_out,
           d->out_feats + (size_t)i * d->rows * d->fdim_out,
           (size_t)d->rows * d->fdim_out * sizeof(float));
  return VSPEC_OK;
}

static int vs__forward(vs_mdrafter *d, int n, int append, char *err, size_t errlen) {
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = n, .tokens = d->tokens,
                           .parents = d->parents,
                           .features = d->uses_features ? d->in_feats : NULL, .append = append};
  vspec_forward_out o = {.struct_size = sizeof o, .logits = d->logits,
                         .features = d->uses_features ? d->out_feats : NULL};
  char inner[VSPEC_ERRLEN] = "";
  int rc = vs_forward_gate_forward(d->gate, d->bm, d->sess, &b, &o, inner, sizeof inner);
  if (rc) snprintf(err, errlen, "drafter forward: %s", inner);
  d->forwards++;
  d->nodes += n;
  return rc;
}

static int md_begin(void *self, vs_tree *tree, int32_t root_index, char *err,
                     size_t errlen) {
  vs_mdrafter *d = self;
  int n = d->n_chain + 1;
  if (n > d->max_nodes) {
    snprintf(err, errlen, "drafter catch-up chain of %d exceeds %d nodes", n, d->max_nodes);
    return VSPEC_ERANGE;
  }
  size_t fsz = (size_t)d->rows * d->fdim_in;
  for (int i = 0; i < d->n_chain; i++) {
    d->tokens[i] = d->chain_tokens[i];
    d->parents[i] = i - 1;
    if (d->uses_features) memcpy(d->in_feats + i * fsz, d->chain_feats + i * fsz, fsz * sizeof(float));
  }
  d->tokens[n - 1] = d->root_token;
  d->parents[n - 1] = n - 2;
  if (d->uses_features) memcpy(d->in_feats + (n - 1) * fsz, d->root_feat, fsz * sizeof(float));
  int rc = vs__forward(d, n, 0, err, errlen);
  if (rc) return rc;
  d->n_head_slots = n;
  tree->nodes[0].draft_slot = n - 1;
  if (vs__fill_dist(d, tree, 0, n - 1, root_index)) {
    snprintf(err, errlen, "drafter: the tree has no room for the root's distribution");
    return VSPEC_ERANGE;
  }
  return VSPEC_OK;
}

static int md_expand(void *self, vs_tree *tree, const int32_t *nodes, int n,
                      int32_t root_index, char *err, size_t errlen) {
  vs_mdrafter *d = self;
  if (n <= 0) return VSPEC_OK;
  size_t fin = (size_t)d->rows * d->fdim_in, fout = (size_t)d->rows * d->fdim_out;
  int base = d->n_head_slots;
  if (base + n > d->max_nodes) {
    snprintf(err, errlen, "drafter: %d pending nodes exceed %d", base + n, d->max_nodes);
    return VSPEC_ERANGE;
  }
  for (int i = 0; i < n; i++) {
    const vs_tree_node *t = &tree->nodes[nodes[i]];
    if (t->parent < 0 || tree->nodes[t->parent].draft_slot < 0 || nodes[i] >= d->node_feats_cap) {
      snprintf(err, errlen, "drafter: node %d cannot be expanded before its parent", nodes[i]);
      return VSPEC_EINVAL;
    }
    d->tokens[i] = t->token;
    d->parents[i] = tree->nodes[t->parent].draft_slot;
    /* A tree node's input feature is the drafter's own output at its parent (EAGLE). */
    if (d->uses_features)
      memcpy(d->in_feats + i * fin, d->node_feats + (size_t)t->parent * fout, fin * sizeof(float));
  }
  int rc = vs__forward(d, n, 1, err, errlen);
  if (rc) return rc;
  for (int i = 0; i < n; i++) {
    tree->nodes[nodes[i]].draft_slot = base + i;
    if (vs__fill_dist(d, tree, nodes[i], i, root_index)) {
      snprintf(err, errlen, "drafter: more expanded nodes than the tree can hold");
      return VSPEC_ERANGE;
    }
  }
  d->n_head_slots = base + n;
  return VSPEC_OK;
}

/* How many of the n accepted tokens a plain draft model fed itself this round, in order
 * along the accepted path: their KV entries depend on the tokens alone, so they are kept
 * rather than fed again. A feature head's entries depend on its input features, which the
 * target's features replace once verified (EAGLE), so a head keeps none. */
static int vs__reusable(const vs_mdrafter *d, const vs_tree *tree, const int32_t *path, int n) {
  if (d->uses_features || !tree || !path) return 0;
  int k = 0;
  while (k < n && tree->nodes[path[k + 1]].draft_slot >= 0) k++;
  return k;
}

static int md_end(void *self, const vs_round_outcome *o, char *err, size_t errlen) {
  vs_mdrafter *d = self;
  const vs_tree *tree = o->tree;
  const int32_t *path = o->path, *accepted = o->accepted;
  const float *features = o->features;
  int n = o->n;
  if (n + 1 > d->max_nodes) {
    snprintf(err, errlen, "drafter: %d accepted tokens exceed its capacity", n);
    return VSPEC_ERANGE;
  }
  /* Commit what was fed with exact inputs this round: the catch-up chain, the root and,
   * for a plain draft model, the accepted nodes it fed. Their pending slots form a chain
   * (each expanded node's parent slot is its tree parent's), as commit requires. */
  int head = d->n_chain + 1, kept = vs__reusable(d, tree, path, n);
  int32_t *commit = d->parents; /* free until the next forward; head + kept <= pending */
  for (int i = 0; i < head; i++) commit[i] = i;
  for (int j = 0; j < kept; j++) commit[head + j] = tree->nodes[path[j + 1]].draft_slot;
  char inner[VSPEC_ERRLEN] = "";
  int rc = d->bm->vt->commit(d->sess, commit, head + kept, inner, sizeof inner);
  if (rc) {
    snprintf(err, errlen, "drafter commit: %s", inner);
    return rc;
  }
  size_t fsz = (size_t)d->rows * d->fdim_in;
  /* Accepted token j is fed after the target feature of the node before it. */
  for (int j = kept; j < n; j++) {
    d->chain_tokens[j - kept] = accepted[j];
    if (d->uses_features)
      memcpy(d->chain_feats + (j - kept) * fsz, features + j * fsz, fsz * sizeof(float));
  }
  d->n_chain = n - kept;
  d->root_token = o->next_root;
  if (d->uses_features) memcpy(d->root_feat, features + (size_t)n * fsz, fsz * sizeof(float));
  d->n_head_slots = 0;
  return VSPEC_OK;
}

static int md_skip(void *self, const float *root_feature, int32_t next_root, char *err,
                    size_t errlen) {
  vs_mdrafter *d = self;
  size_t fsz = (size_t)d->rows * d->fdim_in;
  if (d->n_chain + 2 > d->max_nodes) {
    /* A long run of rounds without drafting: feed and commit the chain now rather than
     * letting it outgrow one forward. */
    for (int i = 0; i < d->n_chain; i++) {
      d->tokens[i] = d->chain_tokens[i];
      d->parents[i] = i - 1;
      if (d->uses_features) memcpy(d->in_feats + i * fsz, d->chain_feats + i * fsz, fsz * sizeof(float));
    }
    int rc = vs__forward(d, d->n_chain, 0, err, errlen);
    if (rc) return rc;
    for (int i = 0; i < d->n_chain; i++) d->parents[i] = i;
    char inner[VSPEC_ERRLEN] = "";
    if ((rc = d->bm->vt->commit(d->sess, d->parents, d->n_chain, inner, sizeof inner))) {
      snprintf(err, errlen, "drafter commit: %s", inner);
      return rc;
    }
    d->n_chain = 0;
  }
  d->chain_tokens[d->n_chain] = d->root_token;
  if (d->uses_features) {
    memcpy(d->chain_feats + d->n_chain * fsz, d->root_feat, fsz * sizeof(float));
    memcpy(d->root_feat, root_feature, fsz * sizeof(float));
  }
  d->n_chain++;
  d->root_token = next_root;
  return VSPEC_OK;
}

static const float *md_node_feature(const void *self, int32_t node) {
  const vs_mdrafter *d = self;
  return d->node_feats + (size_t)node * d->rows * d->fdim_out;
}

const vs_drafter_class vs__drafter_model = {
    .name = "model",
    .open = md_open,
    .close = md_close,
    .uses_features = md_uses_features,
    .start = md_start,
    .begin = md_begin,
    .expand = md_expand,
    .end = md_end,
    .skip = md_skip,
    .set_gate = md_set_gate,
    .node_feature = md_node_feature,
    .counts = md_counts,
};
