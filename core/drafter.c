/*
 * core/drafter.c - a drafter plugin (include/vspec/plugin.h, "drafter plugins") behind the
 * engine's drafter interface (core/drafter.h). Every drafter is a plugin: the draft GPT and
 * the EAGLE head are plugins/drafter/model.c, run on a draft model the engine serves
 * (core/draft_model.c); Speculative Jacobi Decoding is plugins/drafter/jacobi.c. A builder
 * over the engine's vs_tree lets the plugin fill distributions (and, for proposers, add
 * nodes); the target's distributions at the verified nodes are computed on demand.
 */
#include "core/drafter.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/draft_model.h"
#include "core/registry.h"

struct vs_drafter {
  vs_plugin *plugin;
  const vspec_drafter_vtable *vt;
  vspec_drafter *d;
  char name[64];
  const vs_job *job;
  int V, rows;
  int proposes, uses_features;
  vs_draft_model *model; /* the draft model served to the plugin, or NULL */
  vs_sampler sampler;
  /* the round in progress: the builder's tree, the walk's result */
  vs_tree *tree;
  const vs_round_outcome *o;
  int32_t *parents, *depth, *tokens, *marks; /* [cap] */
  int cap;
};

/* The plugin that implements a drafter kind. */
static const char *kind_plugin(const vs_drafter_config *cfg) {
  return cfg->kind == VSPEC_DRAFTER_PLUGIN ? cfg->name : "model";
}

void vs_drafter_close(vs_drafter *p) {
  if (!p) return;
  if (p->d) p->vt->destroy(p->d);
  vs_plugin_release(p->plugin);
  vs_draft_model_free(&p->model);
  vs_sampler_free(&p->sampler);
  free(p->parents);
  free(p->depth);
  free(p->tokens);
  free(p->marks);
  free(p);
}

/* A drafter either proposes whole trees or is driven level by level (begin + expand). */
static int check_vtable(vs_drafter *p, char *err, size_t errlen) {
  const vspec_drafter_vtable *vt = p->vt;
  int leveled = VSPEC_HAS_FIELD(vt, vspec_drafter_vtable, counts) && vt->begin && vt->expand;
  p->proposes = vt->propose != NULL;
  if (p->proposes == leveled) {
    snprintf(err, errlen, "drafter '%s' must set either propose or begin and expand", p->name);
    return VSPEC_EABI;
  }
  return VSPEC_OK;
}

/* The job as the plugin sees it, and the plugin's own drafter for it. */
static int create_plugin_drafter(vs_drafter *p, const vs_drafter_config *cfg, char *err, size_t errlen) {
  int rc;
  if (cfg->model && (rc = vs_draft_model_new(cfg->model, cfg->dev, cfg->job, cfg->rows,
                                             cfg->max_nodes, &p->model, err, errlen)))
    return rc;
  vspec_drafter_job job = {.struct_size = sizeof job, .vocab = p->V, .n_image = cfg->n_image,
                           .max_depth = cfg->max_depth > 0 ? cfg->max_depth : VS_MAX_DEPTH,
                           .greedy = !(cfg->job->sampling.temperature > 0.0f),
                           .seed = cfg->job->seed, .rows = cfg->rows,
                           .max_nodes = cfg->max_nodes, .max_tree_nodes = cfg->max_tree_nodes,
                           .target_feature_dim = cfg->target_feature_dim,
                           .model = p->model ? vs_draft_model_abi(p->model) : NULL,
                           .may_skip = cfg->may_skip};
  char inner[VSPEC_ERRLEN] = "";
  rc = p->vt->create(cfg->host, cfg->params, &job, &p->d, inner, sizeof inner);
  if (rc) {
    p->d = NULL;
    snprintf(err, errlen, "drafter '%s': %s", p->name, inner);
    return rc;
  }
  p->uses_features = !p->proposes && p->vt->uses_features && p->vt->uses_features(p->d);
  return VSPEC_OK;
}

int vs_drafter_open(const vs_drafter_config *cfg, vs_drafter **out, char *err, size_t errlen) {
  if (cfg->kind < VSPEC_DRAFTER_MODEL || cfg->kind > VSPEC_DRAFTER_PLUGIN) {
    snprintf(err, errlen, "unknown drafter kind %u", cfg->kind);
    return VSPEC_EINVAL;
  }
  vs_drafter *p = calloc(1, sizeof *p);
  if (!p) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  snprintf(p->name, sizeof p->name, "%s", kind_plugin(cfg));
  int rc = vs_registry_acquire(cfg->reg, VSPEC_PLUGIN_DRAFTER, p->name, &p->plugin, err, errlen);
  if (rc) {
    vs_drafter_close(p);
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
  p->marks = malloc((size_t)p->cap * sizeof(int32_t));
  if (!p->parents || !p->depth || !p->tokens || !p->marks || vs_sampler_init(&p->sampler, p->V)) {
    vs_drafter_close(p);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  if ((rc = check_vtable(p, err, errlen)) || (rc = create_plugin_drafter(p, cfg, err, errlen))) {
    vs_drafter_close(p);
    return rc;
  }
  *out = p;
  return VSPEC_OK;
}

int vs_drafter_uses_features(const vs_drafter *p) { return p->uses_features; }
int vs_drafter_proposes(const vs_drafter *p) { return p->proposes; }

static int wrapped(int rc, const char *inner, char *err, size_t errlen) {
  if (rc) snprintf(err, errlen, "drafter: %s", inner);
  return rc;
}

int vs_drafter_start(vs_drafter *p, int32_t root_token, const float *root_feature, char *err,
                     size_t errlen) {
  char inner[VSPEC_ERRLEN] = "";
  int rc = p->uses_features
               ? p->vt->start_feature(p->d, root_token, root_feature, inner, sizeof inner)
               : p->vt->start(p->d, root_token, inner, sizeof inner);
  return wrapped(rc, inner, err, errlen);
}

/* ---- the builder over the engine's tree ---- */

static int32_t builder_add(void *ctx, int32_t parent, int32_t token, float p_cond) {
  vs_drafter *p = ctx;
  vs_tree *t = p->tree;
  if (parent < 0 || parent >= t->n || token < 0 || token >= p->V || !(p_cond >= 0.0f))
    return -1;
  /* the cumulative draft log-probability of the path (VVS and the tree view rank by it) */
  const float *d = vs_tree_dist(t, parent);
  float px = d ? d[token] : 1.0f;
  float lp = t->nodes[parent].logp + (px > 0.0f ? logf(px) : -INFINITY);
  return vs_tree_add(t, parent, token, p_cond, lp);
}

static float *builder_dist(void *ctx, int32_t node) {
  vs_drafter *p = ctx;
  if (node < 0 || node >= p->tree->n) return NULL;
  return p->tree->nodes[node].dist >= 0 ? (float *)vs_tree_dist(p->tree, node)
                                        : vs_tree_new_dist(p->tree, node);
}

static int builder_node(void *ctx, int32_t node, int32_t *token, int32_t *parent, int32_t *depth) {
  vs_drafter *p = ctx;
  if (node < 0 || node >= p->tree->n) return VSPEC_EINVAL;
  const vs_tree_node *t = &p->tree->nodes[node];
  *token = t->token;
  *parent = t->parent;
  *depth = t->depth;
  return VSPEC_OK;
}

static int32_t *builder_mark(void *ctx, int32_t node) {
  vs_drafter *p = ctx;
  return node >= 0 && node < p->tree->n ? &p->tree->nodes[node].draft_slot : NULL;
}

static vspec_draft_builder builder_over(vs_drafter *p, vs_tree *tree, int may_add) {
  p->tree = tree;
  return (vspec_draft_builder){.struct_size = sizeof(vspec_draft_builder), .ctx = p,
                               .add = may_add ? builder_add : NULL, .dist = builder_dist,
                               .node = builder_node, .mark = builder_mark};
}

int vs_drafter_begin(vs_drafter *p, vs_tree *tree, int32_t root_index, char *err,
                     size_t errlen) {
  if (p->proposes) {
    snprintf(err, errlen, "drafter '%s' proposes its drafts itself", p->name);
    return VSPEC_EINVAL;
  }
  vspec_draft_builder b = builder_over(p, tree, 0);
  char inner[VSPEC_ERRLEN] = "";
  int rc = p->vt->begin(p->d, root_index, &b, inner, sizeof inner);
  p->tree = NULL;
  return wrapped(rc, inner, err, errlen);
}

int vs_drafter_expand(vs_drafter *p, vs_tree *tree, const int32_t *nodes, int n,
                      int32_t root_index, char *err, size_t errlen) {
  if (p->proposes) {
    snprintf(err, errlen, "drafter '%s' proposes its drafts itself", p->name);
    return VSPEC_EINVAL;
  }
  vspec_draft_builder b = builder_over(p, tree, 0);
  char inner[VSPEC_ERRLEN] = "";
  int rc = p->vt->expand(p->d, root_index, nodes, n, &b, inner, sizeof inner);
  p->tree = NULL;
  return wrapped(rc, inner, err, errlen);
}

int vs_drafter_propose(vs_drafter *p, vs_tree *tree, int depth, int32_t root_index, char *err,
                       size_t errlen) {
  tree->deterministic = !(p->job->sampling.temperature > 0.0f);
  vspec_draft_builder b = builder_over(p, tree, 1);
  char inner[VSPEC_ERRLEN] = "";
  int rc = p->vt->propose(p->d, root_index, depth, &b, inner, sizeof inner);
  p->tree = NULL;
  return wrapped(rc, inner, err, errlen);
}

/* ---- how the round ended ---- */

static int result_target_dist(void *ctx, int32_t node, float *probs) {
  vs_drafter *p = ctx;
  const vs_round_outcome *o = p->o;
  if (!o || !o->logits || node < 0 || node >= o->tree->n) return VSPEC_EINVAL;
  vs_node_distribution(&p->sampler, o->logits + (size_t)node * p->rows * p->V, p->rows,
                       o->root_index + o->tree->nodes[node].depth + 1, &p->job->sampling,
                       probs);
  return VSPEC_OK;
}

int vs_drafter_end(vs_drafter *p, const vs_round_outcome *o, char *err, size_t errlen) {
  const vs_tree *t = o->tree;
  if (p->proposes && !o->logits) {
    snprintf(err, errlen, "drafter: a round ended without the target's scores (a proposing "
             "drafter's rounds are always verified)");
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
    p->marks[i] = t->nodes[i].draft_slot;
  }
  vspec_round_result r = {.struct_size = sizeof r, .root_index = o->root_index,
                          .n_accepted = o->n, .path = o->path, .next_root = o->next_root,
                          .n_nodes = t->n, .tokens = p->tokens, .parents = p->parents,
                          .depth = p->depth, .ctx = p, .target_dist = result_target_dist,
                          .marks = p->marks, .features = o->features,
                          .verified = o->logits != NULL, .feature_table = o->feature_table,
                          .feature_rows = o->feature_rows};
  p->o = o;
  char inner[VSPEC_ERRLEN] = "";
  int rc = p->vt->end(p->d, &r, inner, sizeof inner);
  p->o = NULL;
  return wrapped(rc, inner, err, errlen);
}

int vs_drafter_skip(vs_drafter *p, const float *root_feature, int32_t next_root, char *err,
                    size_t errlen) {
  char inner[VSPEC_ERRLEN] = "";
  int rc = p->uses_features
               ? p->vt->skip_feature(p->d, next_root, root_feature, inner, sizeof inner)
               : p->vt->skip(p->d, next_root, inner, sizeof inner);
  return wrapped(rc, inner, err, errlen);
}

static void drafter_counts(const vs_drafter *p, int64_t *forwards, int64_t *nodes) {
  *forwards = 0;
  *nodes = 0;
  if (!p->proposes && p->vt->counts) p->vt->counts(p->d, forwards, nodes);
}

int64_t vs_drafter_forwards(const vs_drafter *p) {
  int64_t f, n;
  drafter_counts(p, &f, &n);
  return f;
}

int64_t vs_drafter_nodes(const vs_drafter *p) {
  int64_t f, n;
  drafter_counts(p, &f, &n);
  return n;
}

void vs_drafter_set_gate(vs_drafter *p, struct vs_forward_gate *gate) {
  if (p->model) vs_draft_model_set_gate(p->model, gate);
}

int vs_drafter_draws(const vs_drafter *p) {
  return p->model && !p->proposes && vs_draft_model_draws(p->model);
}

void vs_drafter_set_draw(vs_drafter *p, const vs_draft_draw *draw) {
  if (p->model) vs_draft_model_set_draw(p->model, draw);
}

const float *vs_drafter_node_feature(const vs_drafter *p, int32_t node) {
  return p->uses_features && p->vt->node_feature ? p->vt->node_feature(p->d, node) : NULL;
}
