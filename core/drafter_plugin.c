/*
 * core/drafter_plugin.c - a drafter plugin (include/vspec/plugin.h, "drafter plugins") behind
 * the engine's drafter interface: the plugin builds the tree through a builder over the
 * engine's vs_tree, and reads the target's distributions at the verified nodes on demand.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/drafter_class.h"
#include "core/params.h"
#include "core/registry.h"

typedef struct vs_pdrafter {
  vs_plugin *plugin;
  const vspec_drafter_vtable *vt;
  vspec_drafter *d;
  const vs_job *job;
  int V, rows;
  vs_sampler sampler;
  /* the round in progress: the builder's tree, the walk's result */
  vs_tree *tree;
  const vs_round_outcome *o;
  int32_t *parents, *depth, *tokens; /* [cap] */
  int cap;
} vs_pdrafter;

static void pd_close(void *self) {
  vs_pdrafter *p = self;
  if (!p) return;
  if (p->d) p->vt->destroy(p->d);
  vs_plugin_release(p->plugin);
  vs_sampler_free(&p->sampler);
  free(p->parents);
  free(p->depth);
  free(p->tokens);
  free(p);
}

static int pd_open(const vs_drafter_config *cfg, void **out, char *err, size_t errlen) {
  vs_pdrafter *p = calloc(1, sizeof *p);
  if (!p) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  int rc = vs_registry_acquire(cfg->reg, VSPEC_PLUGIN_DRAFTER, cfg->name, &p->plugin, err,
                               errlen);
  if (rc) {
    pd_close(p);
    return rc;
  }
  p->vt = vs_plugin_vtable(p->plugin);
  p->job = cfg->job;
  p->V = cfg->vocab;
  p->rows = cfg->rows;
  p->cap = cfg->max_tree_nodes;
  p->parents = malloc((size_t)p->cap * sizeof(int32_t));
  p->depth = malloc((size_t)p->cap * sizeof(int32_t));
  p->tokens = malloc((size_t)p->cap * sizeof(int32_t));
  if (!p->parents || !p->depth || !p->tokens || vs_sampler_init(&p->sampler, p->V)) {
    pd_close(p);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  vspec_params *params = NULL;
  char inner[VSPEC_ERRLEN] = "";
  vspec_drafter_job job = {.struct_size = sizeof job, .vocab = p->V, .n_image = cfg->n_image,
                           .max_depth = cfg->max_depth > 0 ? cfg->max_depth : VS_MAX_DEPTH,
                           .greedy = !(cfg->job->sampling.temperature > 0.0f),
                           .seed = cfg->job->seed};
  rc = vs_params_parse(cfg->params ? cfg->params : "", &params, inner, sizeof inner);
  if (!rc) rc = p->vt->create(cfg->host, params, &job, &p->d, inner, sizeof inner);
  vs_params_free(params);
  if (rc) {
    snprintf(err, errlen, "drafter '%s': %s", cfg->name, inner);
    pd_close(p);
    return rc;
  }
  *out = p;
  return VSPEC_OK;
}

static int pd_uses_features(const void *self) {
  (void)self;
  return 0;
}

static void pd_counts(const void *self, int64_t *forwards, int64_t *nodes) {
  (void)self;
  *forwards = 0; /* a plugin drafter runs no forward of the engine's */
  *nodes = 0;
}

static int pd_start(void *self, int32_t root_token, const float *root_feature, char *err,
                    size_t errlen) {
  (void)root_feature;
  vs_pdrafter *p = self;
  char inner[VSPEC_ERRLEN] = "";
  int rc = p->vt->start(p->d, root_token, inner, sizeof inner);
  if (rc) snprintf(err, errlen, "drafter: %s", inner);
  return rc;
}

/* ---- the builder over the engine's tree ---- */

static int32_t pd_add(void *ctx, int32_t parent, int32_t token, float p_cond) {
  vs_pdrafter *p = ctx;
  vs_tree *t = p->tree;
  if (parent < 0 || parent >= t->n || token < 0 || token >= p->V || !(p_cond >= 0.0f))
    return -1;
  /* the cumulative draft log-probability of the path (VVS and the tree view rank by it) */
  const float *d = vs_tree_dist(t, parent);
  float px = d ? d[token] : 1.0f;
  float lp = t->nodes[parent].logp + (px > 0.0f ? logf(px) : -INFINITY);
  return vs_tree_add(t, parent, token, p_cond, lp);
}

static float *pd_dist(void *ctx, int32_t node) {
  vs_pdrafter *p = ctx;
  if (node < 0 || node >= p->tree->n) return NULL;
  return p->tree->nodes[node].dist >= 0 ? (float *)vs_tree_dist(p->tree, node)
                                        : vs_tree_new_dist(p->tree, node);
}

static int pd_propose(void *self, vs_tree *tree, int depth, int32_t root_index, char *err,
                      size_t errlen) {
  vs_pdrafter *p = self;
  p->tree = tree;
  tree->deterministic = !(p->job->sampling.temperature > 0.0f);
  vspec_draft_builder b = {.struct_size = sizeof b, .ctx = p, .add = pd_add, .dist = pd_dist};
  char inner[VSPEC_ERRLEN] = "";
  int rc = p->vt->propose(p->d, root_index, depth, &b, inner, sizeof inner);
  p->tree = NULL;
  if (rc) snprintf(err, errlen, "drafter: %s", inner);
  return rc;
}

/* ---- how the round ended ---- */

static int pd_target_dist(void *ctx, int32_t node, float *probs) {
  vs_pdrafter *p = ctx;
  const vs_round_outcome *o = p->o;
  if (!o || !o->logits || node < 0 || node >= o->tree->n) return VSPEC_EINVAL;
  vs_node_distribution(&p->sampler, o->logits + (size_t)node * p->rows * p->V, p->rows,
                       o->root_index + o->tree->nodes[node].depth + 1, &p->job->sampling,
                       probs);
  return VSPEC_OK;
}

static int pd_end(void *self, const vs_round_outcome *o, char *err, size_t errlen) {
  vs_pdrafter *p = self;
  const vs_tree *t = o->tree;
  if (!o->logits) {
    snprintf(err, errlen, "drafter: a round ended without the target's scores (a drafter "
             "plugin's rounds are always verified)");
    return VSPEC_EINVAL;
  }
  if (t->n > p->cap) {
    snprintf(err, errlen, "drafter: a tree of %d nodes exceeds %d", t->n, p->cap);
    return VSPEC_ERANGE;
  }
  vs_tree_parents(t, p->parents);
  for (int i = 0; i < t->n; i++) {
    p->depth[i] = t->nodes[i].depth;
    p->tokens[i] = t->nodes[i].token;
  }
  vspec_round_result r = {.struct_size = sizeof r, .root_index = o->root_index,
                          .n_accepted = o->n, .path = o->path, .next_root = o->next_root,
                          .n_nodes = t->n, .tokens = p->tokens, .parents = p->parents,
                          .depth = p->depth, .ctx = p, .target_dist = pd_target_dist};
  p->o = o;
  char inner[VSPEC_ERRLEN] = "";
  int rc = p->vt->end(p->d, &r, inner, sizeof inner);
  p->o = NULL;
  if (rc) snprintf(err, errlen, "drafter: %s", inner);
  return rc;
}

static int pd_skip(void *self, const float *root_feature, int32_t next_root, char *err,
                   size_t errlen) {
  (void)root_feature;
  vs_pdrafter *p = self;
  char inner[VSPEC_ERRLEN] = "";
  int rc = p->vt->skip(p->d, next_root, inner, sizeof inner);
  if (rc) snprintf(err, errlen, "drafter: %s", inner);
  return rc;
}

const vs_drafter_class vs__drafter_plugin = {
    .name = "plugin",
    .open = pd_open,
    .close = pd_close,
    .uses_features = pd_uses_features,
    .start = pd_start,
    .propose = pd_propose,
    .end = pd_end,
    .skip = pd_skip,
    .counts = pd_counts,
};
