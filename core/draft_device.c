/*
 * core/draft_device.c - a round's drafts drawn on the device (issue 29 item 5: a round with
 * one wait). Each forward of the draft model draws the token after its last node where the
 * logits are (the ops' draw_probs: the distribution the host drafter would compute, and its
 * token at the same uniform), the next forward is fed that token from device memory
 * (vspec_forward_batch.token_dev), the target verifies the chain the same way and the walk
 * reads the distributions there (vspec_forward_out.walk_probs); the walk's result brings the
 * chain's tokens to the host (walk_tokens) in its one download. A chain of L drafts then
 * waits once, not L + 1 times.
 *
 * A static tree (EAGLE-1's) goes the same way a level a forward: the forward
 * writes its nodes' distributions (draw_probs) and draw_children (ABI 1.10) draws each node's
 * children from them without replacement, at uniforms uploaded once per round with the
 * shape (counts, where each row's children go, which draft each row belongs to). Its shape is
 * the plan's, whole: where a distribution runs out of tokens before its node's children do
 * (the host stops adding children there, and adds none below them), the rest are absent: no
 * uniform, the token of their row's first child, which the walk skips (that token's draft
 * mass is spent once the first child was rejected). The host learns which drafts were absent
 * from those repeats in the walk's tokens (vs_draft_device_settle) and moves the draft stream
 * on by the uniforms the draws took. In a greedy tree (each child the first maximum of what is
 * left, no uniforms) the walk judges an absent child as it judged the first one, with the same
 * outcome; the host takes those judgements out of siblings_tried. The walk reads the rows in
 * a greedy tree too, for one case: a node whose draft distribution has no mass at all (no
 * finite logit) gets absent children of token 0, which it must skip, not judge.
 *
 * The host tree holds token -1 - j for draft j (tree node j + 1) until the walk's result
 * fills it in, and no draft probability (p_cond 1, logp 0: VVS, which ranks paths by them,
 * never runs so). Bits: the uniforms come from the draft stream in the host drafter's order
 * (a chain's one per draft, a tree's one per child, level by level, node by node) before the
 * round's first forward, and draw_probs and draw_children compute what the host drafter does,
 * so the tokens and the metrics of the walk are the host path's (tests/test_draft_device.c).
 * What differs: absent drafts are verified and expanded all the same (tree_nodes,
 * draft_forwards and draft_nodes count that work; draft_tokens counts the drafts drawn), and a
 * node whose draft distribution has no mass at all (no finite logit) keeps its children,
 * absent, where the host makes it a leaf: the walk skips them, but its tokens [0, 0, ..] read as
 * a first child of token 0 drawn, so the stream moves on one uniform further than the host's
 * from then on (the output's distribution is the same; the bits are not) and that round's
 * draft_tokens and siblings_tried are off by the children it has.
 *
 * When: VSPEC_DRAFT_DRAW=device|host|auto (auto, the default: where the walk is on the
 * device and the device is not the CPU); and the walk on the device, a device with the fused
 * ops and draw_probs, a draft model whose backend and the target's draw on the device (model
 * info device_tokens), a scheduler that never skips verification, chain rounds, and static
 * rounds on a device with draw_children. With cross-job
 * batching the draft forwards go alone (core/draft_model.c) and the verifies are batched
 * where the backend's batch takes tokens and features on the device (llamagen's fused
 * batch; else the gate runs each alone).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/draft_model.h"
#include "core/round_loop.h"
#include "core/status.h"
#include "kernels/common/vs_philox.h"
#include "kernels/vs_kernels.h"

int vs_draft_device_init(vs_rounds *c, uint32_t drafter_kind, char *err, size_t errlen) {
  int mode, rc = vs__device_or_host(c->dev, "VSPEC_DRAFT_DRAW", "where drafts are drawn", &mode,
                                    err, errlen);
  if (rc) return rc;
  c->draft_dev = 0;
  const vspec_model_info *ti = &c->t->info;
  const vspec_ops *ops = vs_dev_ops(c->dev);
  /* the backends keep tokens and features on the device on the fused ops alone */
  if (!mode || !c->walk_dev || !c->drafter || c->sched_vt->decide ||
      !vspec_has_fused_ops(ops) || !VSPEC_HAS_FIELD(ops, vspec_ops, draw_probs) ||
      !ops->draw_probs ||
      (drafter_kind != VSPEC_DRAFTER_MODEL && drafter_kind != VSPEC_DRAFTER_HEAD) ||
      !vs_drafter_draws(c->drafter) ||
      !(VSPEC_HAS_FIELD(ti, vspec_model_info, device_tokens) && ti->device_tokens))
    return VSPEC_OK;
  c->draw_rows_cap = VS_MAX_DEPTH + 1;
  c->draft_tok_dev = ops->alloc(c->dev, VS_SD_MAX_NODES * sizeof(int32_t));
  c->draft_probs_dev = ops->alloc(c->dev, (size_t)c->draw_rows_cap * c->V * sizeof(float));
  c->walk_tokens = malloc((size_t)c->tree.cap * sizeof(int32_t));
  /* A static tree's children: where the device can draw them */
  int trees = VSPEC_HAS_FIELD(ops, vspec_ops, draw_children) && ops->draw_children;
  if (trees) {
    c->children_dev = ops->alloc(c->dev, sizeof c->draw_children);
    c->row_tok_dev = ops->alloc(c->dev, VS_SD_MAX_NODES * sizeof(int32_t));
  }
  /* A feature head reads the target's features where the target left them. */
  if (vs_drafter_uses_features(c->drafter))
    c->tfeat_dev = ops->alloc(c->dev, (size_t)c->tree.cap * c->rows * c->fdim * sizeof(float));
  if (!c->draft_tok_dev || !c->draft_probs_dev || !c->walk_tokens ||
      (trees && (!c->children_dev || !c->row_tok_dev)) ||
      (vs_drafter_uses_features(c->drafter) && !c->tfeat_dev))
    return vs_fail(err, errlen, VSPEC_ENOMEM, "cannot hold drafts on the device%s%s",
                   *vs_dev_alloc_error(c->dev) ? ": " : "", vs_dev_alloc_error(c->dev));
  c->draft_dev = 1;
  return VSPEC_OK;
}

void vs_draft_device_free(vs_rounds *c) {
  const vspec_ops *ops = vs_dev_ops(c->dev);
  void *dev_bufs[] = {c->draft_tok_dev, c->draft_probs_dev, c->tfeat_dev, c->children_dev,
                      c->row_tok_dev};
  for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++)
    if (dev_bufs[i]) ops->free(c->dev, dev_bufs[i]);
  c->draft_tok_dev = NULL;
  c->draft_probs_dev = NULL;
  c->tfeat_dev = NULL;
  c->children_dev = NULL;
  c->row_tok_dev = NULL;
  free(c->walk_tokens);
  c->walk_tokens = NULL;
}

/* The draw's sampling: a draft distribution is the target's processing; greedy drafting
 * takes the first maximum of it at temperature 1 (core/draft_model.c, dm_distribution). */
static vs_draft_draw dd_draw(const vs_rounds *c, int forwards) {
  return (vs_draft_draw){.spec = {.rows = c->rows, .vocab = c->V, .top_k = c->s->top_k,
                                  .cfg_scale = c->s->cfg_scale,
                                  .temperature = c->greedy ? 1.0f : c->s->temperature,
                                  .top_p = c->s->top_p},
                         .guided = c->draw_guided, .tokens = c->draft_tok_dev,
                         .probs = c->draft_probs_dev, .forwards = forwards};
}

static void dd_chain_round(vs_rounds *c, int depth, int32_t root_index) {
  /* Forward k draws draft k + 1 below the node at depth k, which predicts image token
   * root_index + k + 1; the host chain draws its uniform there, in this order. */
  for (int k = 0; k < depth; k++) {
    c->draw_u[k] = c->greedy ? 0.0 : vs_rng_uniform(&c->rng_draft);
    c->draw_guided[k] = (uint8_t)vs_cfg_guided(c->s, root_index + k + 1);
  }
  vs_draft_draw d = dd_draw(c, depth);
  d.u = c->greedy ? NULL : c->draw_u;
  vs_drafter_set_draw(c->drafter, &d);
  c->round_dev = 1;
}

/* A static tree's rows, level by level (the host drafter's order, core/draft_tree.c): row 0
 * the root, then the nodes of depth d that have children, in the plan's order; each row's
 * children take the next slots, so that slot j is tree node j + 1. The rows, or 0 when the
 * plan does not fit (the host path then reports it). */
static int dd_static_rows(vs_rounds *c, const vspec_round_plan *plan, int depth_limit,
                          int32_t root_index) {
  int n = plan->n_static, rows = 1, slots;
  int32_t sdepth[VS_SD_MAX_NODES], row_of[VS_SD_MAX_NODES], taken[VS_SD_MAX_NODES];
  int32_t *counts = c->draw_children.counts, *first = c->draw_children.first;
  if (n >= VS_SD_MAX_NODES) return 0;
  counts[0] = 0;
  for (int i = 0; i < n; i++) {
    int p = plan->static_parents[i];
    if (p < -1 || p >= i) return 0;
    sdepth[i] = p < 0 ? 1 : sdepth[p] + 1;
    row_of[i] = -1;
    if (sdepth[i] <= depth_limit && p < 0) counts[0]++;
  }
  first[0] = taken[0] = 0;
  slots = counts[0];
  c->draw_node[0] = 0;
  c->draw_children.node[0] = -1;
  c->draw_guided[0] = (uint8_t)vs_cfg_guided(c->s, root_index + 1);
  c->n_draw_fwd = 0;
  c->draw_fwd[c->n_draw_fwd++] = 0;
  for (int d = 1; d < depth_limit; d++) {
    int level0 = rows;
    for (int i = 0; i < n; i++) {
      if (sdepth[i] != d) continue;
      int p = plan->static_parents[i], pr = p < 0 ? 0 : row_of[p];
      if (pr < 0) return 0; /* cannot happen: a parent with children has a row */
      int32_t node = first[pr] + taken[pr]++ + 1; /* its slot + 1: its tree index */
      int kids = 0;
      for (int j = i + 1; j < n; j++) kids += plan->static_parents[j] == i;
      if (kids == 0) continue;
      row_of[i] = rows;
      c->draw_node[rows] = node;
      c->draw_children.node[rows] = node - 1;
      /* a node at depth d predicts image token root_index + d + 1 */
      c->draw_guided[rows] = (uint8_t)vs_cfg_guided(c->s, root_index + d + 1);
      counts[rows] = kids;
      first[rows] = slots;
      taken[rows] = 0;
      slots += kids;
      rows++;
    }
    if (rows == level0) break;
    c->draw_fwd[c->n_draw_fwd++] = level0;
  }
  c->draw_fwd[c->n_draw_fwd] = rows;
  for (int r = 0; r < rows; r++)
    if (counts[r] > VSPEC_CHILDREN_MAX) return 0;
  return slots + 1 <= c->tree.cap && slots + 1 <= VSPEC_WALK_MAX_PATH ? rows : 0;
}

/* The distributions' room for `rows` rows. */
static int dd_reserve_rows(vs_rounds *c, int rows) {
  if (rows <= c->draw_rows_cap) return 1;
  const vspec_ops *ops = vs_dev_ops(c->dev);
  float *p = ops->alloc(c->dev, (size_t)rows * c->V * sizeof(float));
  if (!p) return 0;
  ops->free(c->dev, c->draft_probs_dev);
  c->draft_probs_dev = p;
  c->draw_rows_cap = rows;
  return 1;
}

static void dd_static_round(vs_rounds *c, const vspec_round_plan *plan, int depth_limit,
                            int32_t root_index) {
  if (!c->children_dev || depth_limit < 1) return;
  vs_draw_children *dc = &c->draw_children;
  int rows = dd_static_rows(c, plan, depth_limit, root_index);
  if (rows < 1 || !dd_reserve_rows(c, rows)) return;
  int slots = dc->first[rows - 1] + dc->counts[rows - 1];
  /* as many uniforms as the tree has drafts (greedy: none); the stream moves on by those the
   * draws take, once the walk's result says which (vs_draft_device_settle) */
  c->rng_draft_at = c->rng_draft;
  vspec_rng r = c->rng_draft;
  for (int k = 0; k < slots && !c->greedy; k++) dc->u[k] = vs_rng_uniform(&r);
  dc->cursor = 0;
  memset(dc->drawn, 0, sizeof dc->drawn);
  const vspec_ops *ops = vs_dev_ops(c->dev);
  if (ops->upload(c->dev, c->children_dev, dc, sizeof *dc)) return; /* the host draws them */
  int max_count = 0;
  for (int i = 0; i < rows; i++)
    if (dc->counts[i] > max_count) max_count = dc->counts[i];
  unsigned char *base = c->children_dev;
#define DD_AT(type, field) ((type *)(void *)(base + offsetof(vs_draw_children, field)))
  c->children_spec = (vspec_children_spec){
      .n = rows, .vocab = c->V, .max_count = max_count, .counts = DD_AT(const int32_t, counts),
      .first = DD_AT(const int32_t, first), .node = DD_AT(const int32_t, node),
      .u = c->greedy ? NULL : DD_AT(const double, u), .cursor = DD_AT(int32_t, cursor),
      .drawn = DD_AT(uint8_t, drawn)};
#undef DD_AT
  vs_draft_draw d = dd_draw(c, c->n_draw_fwd);
  d.fwd = c->draw_fwd;
  d.children = &c->children_spec;
  d.row_tokens = c->row_tok_dev;
  vs_drafter_set_draw(c->drafter, &d);
  c->draw_rows = rows;
  c->draw_slots = slots;
  c->round_dev = 1;
}

int vs_draft_device_settle(vs_rounds *c, int32_t last, int *absent_tried) {
  *absent_tried = 0;
  if (!c->round_dev || c->draw_rows == 0) return 0;
  /* The drafts the tree's tokens show were drawn: in each row, those before the first repeat
   * of its first child (an absent draft repeats it), none below an absent one. */
  vs_draw_children *dc = &c->draw_children;
  int taken = 0;
  for (int r = 0; r < c->draw_rows; r++) {
    int live = dc->node[r] < 0 || dc->drawn[dc->node[r]];
    const int32_t *tok = c->walk_tokens + 1 + dc->first[r];
    int absent = 0;
    for (int j = 0; j < dc->counts[r]; j++) {
      live = live && (j == 0 || tok[j] != tok[0]);
      dc->drawn[dc->first[r] + j] = (uint8_t)live;
      taken += live;
      absent += !live;
    }
    /* A one-hot tree's walk judges an absent draft again, as it judged the first child; that
     * happens below the path's last node, whose children were all rejected. */
    if (c->greedy && c->draw_node[r] == last) *absent_tried = absent;
  }
  c->rng_draft = c->rng_draft_at;
  for (int k = 0; k < taken && !c->greedy; k++) vs_rng_uniform(&c->rng_draft);
  c->draw_rows = 0;
  return c->draw_slots - taken;
}

void vs_draft_device_round(vs_rounds *c, const vspec_round_plan *plan, int depth,
                           int32_t root_index) {
  c->round_dev = 0;
  c->draw_rows = 0;
  if (!c->draft_dev || depth < 1) return;
  if (plan->shape == VSPEC_DRAFT_CHAIN) dd_chain_round(c, depth, root_index);
  else if (plan->shape == VSPEC_DRAFT_STATIC) dd_static_round(c, plan, depth, root_index);
}

void vs_draft_device_done(vs_rounds *c) {
  if (c->round_dev) vs_drafter_set_draw(c->drafter, NULL);
}
