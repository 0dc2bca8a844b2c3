/*
 * core/verify_device.c - the verification walk on the target's device (ABI 1.6, the ops'
 * verify_walk; issue 29 item 4): a round asks the backend to walk the verified tree where its
 * logits are, for a rule that describes itself as a built-in kind (walk_rule), and downloads
 * the walk's result (the path, the next token, the draws) instead of n x rows x vocab logits.
 *
 * The device walk is core/verify_walk.c's walk (kernels/cpu/cpu_walk.c is it step for step,
 * tests/test_device_walk.c holds them together), from the same Philox streams at the same
 * positions: the engine hands the streams' states over and advances its own by the draws the
 * walk reports, so the rounds after it draw what they would have drawn. A cross-job batch
 * (the forward gate's forward_multi) walks each job that asked over its own logits, with its
 * own spec, so a batched round takes the walk as a lone one does (tests/test_walk_batch.c).
 * Where the backend cannot walk (no verify_walk on its device), it writes the logits and the
 * engine walks on the host, as when the walk is off.
 *
 * When it is on: VSPEC_WALK=device or host forces it (auto, the default: on where the
 * target's device is not the CPU, whose host walk stays the reference every golden test runs;
 * another value fails the job); device on the CPU runs the CPU op over the head's logits, and
 * tests/test_walk_jobs.c checks that whole jobs give the same tokens and metrics either way.
 * A round qualifies when the rule has a walk_rule and the drafter is not a plugin (its round
 * end reads the target's logits); an AR step draws with sample_tokens instead. Tokens accepted
 * without verification (VVS) come first in the batch: the walk covers the batch's last nodes,
 * the tree.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/round_loop.h"
#include "core/status.h"
#include "kernels/common/vs_philox.h"
#include "kernels/vs_kernels.h"

int vs__device_or_host(vspec_dev *dev, const char *var, const char *what, int *on, char *err,
                       size_t errlen) {
  const char *e = getenv(var);
  vs_device_info info;
  if (!e || !*e || strcmp(e, "auto") == 0)
    *on = vs_dev_info(dev, &info) == VSPEC_OK && info.kind != VSPEC_DEVICE_CPU;
  else if (strcmp(e, "device") == 0 || strcmp(e, "host") == 0)
    *on = strcmp(e, "device") == 0;
  else
    return vs_fail(err, errlen, VSPEC_EINVAL, "%s=%s: expected device, host or auto (%s)", var,
                   e, what);
  return VSPEC_OK;
}

int vs_walk_device_init(vs_rounds *c, int drafter_plugin, char *err, size_t errlen) {
  const vspec_ops *ops = vs_dev_ops(c->dev);
  int mode, rc = vs__device_or_host(c->dev, "VSPEC_WALK", "where verification walks", &mode,
                                    err, errlen);
  if (rc) return rc;
  c->walk_dev = 0;
  if (!mode || drafter_plugin || !c->rule_vt || !VSPEC_HAS_FIELD(ops, vspec_ops, verify_walk) ||
      !ops->verify_walk ||
      !VSPEC_HAS_FIELD(c->rule_vt, vspec_accept_vtable, walk_rule) || !c->rule_vt->walk_rule)
    return VSPEC_OK;
  vspec_walk_rule probe;
  if (c->rule_vt->walk_rule(c->rule, 1, &probe) != VSPEC_OK) return VSPEC_OK;
  int cap = c->tree.cap;
  c->walk_ints = malloc((size_t)3 * cap * sizeof(int32_t));
  c->walk_guided = malloc((size_t)cap);
  if (!c->walk_ints || !c->walk_guided) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  /* The neighbour table as device memory: the host's own on the CPU (one memory space),
   * else a copy made once per job. */
  c->walk_table = c->neighbours;
  if (c->neighbours && vs_dev_space(c->dev) != 0) {
    size_t bytes = (size_t)c->V * c->neighbours_k * sizeof(int32_t);
    c->walk_table_copy = ops->alloc(c->dev, bytes);
    if (!c->walk_table_copy || ops->upload(c->dev, c->walk_table_copy, c->neighbours, bytes)) {
      snprintf(err, errlen, "cannot copy the neighbour table to the device%s%s",
               *vs_dev_alloc_error(c->dev) ? ": " : "", vs_dev_alloc_error(c->dev));
      return VSPEC_ENOMEM;
    }
    c->walk_table = c->walk_table_copy;
  }
  c->walk_dev = 1;
  return VSPEC_OK;
}

void vs_walk_device_free(vs_rounds *c) {
  if (c->walk_table_copy) vs_dev_ops(c->dev)->free(c->dev, c->walk_table_copy);
  free(c->walk_ints);
  free(c->walk_guided);
  c->walk_table_copy = NULL;
  c->walk_ints = NULL;
  c->walk_guided = NULL;
}

void vs_walk_device_ask(vs_rounds *c, int32_t root_index, vspec_forward_out *out) {
  out->walk = NULL;
  out->walk_result = NULL;
  out->walked = 0;
  out->walk_probs = NULL;
  out->walk_tokens = NULL;
  const vs_tree *t = &c->tree;
  if (!c->walk_dev || t->n > VSPEC_WALK_MAX_PATH) return;
  vspec_walk_spec *sp = &c->walk_spec;
  memset(sp, 0, sizeof *sp);
  if (c->rule_vt->walk_rule(c->rule, vs_tree_max_depth(t), &sp->rule) != VSPEC_OK) return;
  int32_t *parents = c->walk_ints, *toks = parents + t->n, *dist = toks + t->n;
  vs_tree_parents(t, parents);
  for (int i = 0; i < t->n; i++) {
    toks[i] = t->nodes[i].token;
    dist[i] = t->nodes[i].dist;
    c->walk_guided[i] = (uint8_t)vs_cfg_guided(c->s, root_index + t->nodes[i].depth + 1);
  }
  sp->sample = (vspec_sample_spec){.n = t->n, .rows = c->rows, .vocab = c->V,
                                   .top_k = c->s->top_k, .cfg_scale = c->s->cfg_scale,
                                   .temperature = c->s->temperature, .top_p = c->s->top_p,
                                   .guided = c->walk_guided};
  sp->parents = parents;
  sp->tokens = toks;
  /* A deterministic tree's drafts are one-hot: no distribution travels. */
  sp->dists = t->deterministic || t->n_dists == 0 ? NULL : t->dists;
  sp->dist = sp->dists ? dist : NULL;
  sp->neighbours = c->walk_table;
  sp->table_k = c->walk_table ? c->neighbours_k : 0;
  sp->accept = c->rng_accept;
  sp->target = c->rng_target;
  out->walk = sp;
  out->walk_dists = sp->dists ? t->n_dists : 0;
  out->walk_result = &c->walk_res;
  if (c->round_dev) { /* drafts drawn on the device: their distributions are there */
    /* A static tree's, one-hot ones too: an absent draft of a node whose distribution has no
     * mass has none there either, and the walk skips it (core/draft_device.c); a one-hot
     * walk reads a draft's probability for nothing else. */
    out->walk_probs = t->deterministic && !c->draw_rows ? NULL : c->draft_probs_dev;
    sp->dist = out->walk_probs ? dist : NULL;
    sp->dists = NULL;
    out->walk_dists = 0;
    out->walk_tokens = c->walk_tokens;
  }
}

int vs_walk_device_take(vs_rounds *c, vspec_forward_out *out, int32_t *path, int *n_path,
                        int32_t *next, char *err, size_t errlen) {
  int walked = out->walk && out->walked;
  out->walk = NULL;
  out->walk_result = NULL;
  out->walked = 0;
  out->walk_probs = NULL;
  out->walk_tokens = NULL;
  if (!walked && c->round_dev)
    return vs_fail(err, errlen, VSPEC_EDEVICE, "the drafts are on the device, but the target's "
                   "backend did not walk there");
  if (!walked) return 0;
  if (c->round_dev) /* the drafts the host has not seen, with the result */
    for (int i = 0; i < c->tree.n; i++) c->tree.nodes[i].token = c->walk_tokens[i];
  const vspec_walk_result *r = &c->walk_res;
  if (r->status != VSPEC_OK || r->n_path < 1 || r->n_path > VS_MAX_DEPTH + 2) {
    if (r->status == VSPEC_OK || r->next >= 0)
      return vs_fail(err, errlen, VSPEC_EINVAL, "the device walk returned a path of %d nodes",
                     r->n_path);
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "the target distribution is empty (all probabilities zero)");
  }
  /* The streams continue where the walk left them. */
  for (int i = 0; i < r->accept_draws; i++) vs_rng_uniform(&c->rng_accept);
  for (int i = 0; i < r->target_draws; i++) vs_rng_uniform(&c->rng_target);
  /* The host walk's metrics: every path node with children examined its depth + 1. */
  vs_metrics *mt = c->mt;
  for (int j = 0; j < r->n_path; j++) {
    const vs_tree_node *tn = &c->tree.nodes[r->path[j]];
    path[j] = r->path[j];
    if (tn->first_child < 0) continue;
    int depth = tn->depth + 1;
    if (depth <= VS_MAX_DEPTH) mt->reached[depth]++;
    mt->drafted++;
    if (j + 1 < r->n_path) {
      if (depth <= VS_MAX_DEPTH) mt->accepted_at[depth]++;
      mt->accepted++;
    }
  }
  mt->siblings_tried += r->tried;
  mt->residual_fallbacks += r->fallbacks;
  *n_path = r->n_path;
  *next = r->next;
  return 1;
}
