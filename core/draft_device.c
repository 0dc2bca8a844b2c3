/*
 * core/draft_device.c - a chain's drafts drawn on the device (issue 29 item 5: a round with
 * one wait). Each forward of the draft model draws the token after its last node where the
 * logits are (the ops' draw_probs: the distribution the host drafter would compute, and its
 * token at the same uniform), the next forward is fed that token from device memory
 * (vspec_forward_batch.token_dev), the target verifies the chain the same way and the walk
 * reads the distributions there (vspec_forward_out.walk_probs); the walk's result brings the
 * chain's tokens to the host (walk_tokens) in its one download. A chain of L drafts then
 * waits once, not L + 1 times.
 *
 * The host tree holds token -1 - j for draft j until the walk's result fills it in, and no
 * draft probability (p_cond 1, logp 0: VVS, which ranks paths by them, never runs so). Bits:
 * the uniforms come from the draft stream in the host chain's order, one per draft, before
 * the round's first forward, and draw_probs computes what the host drafter does, so the
 * tokens and metrics are the host path's (tests/test_draft_device.c).
 *
 * When: VSPEC_DRAFT_DRAW=device|host|auto (auto, the default: where the walk is on the
 * device and the device is not the CPU); and the walk on the device, a device with the fused
 * ops and draw_probs, a draft model whose backend and the target's draw on the device (model
 * info device_tokens), a scheduler that never skips verification, chain rounds. With cross-job
 * batching the draft forwards go alone (core/draft_model.c) and the verifies are batched
 * where the backend's batch takes tokens and features on the device (llamagen's fused
 * batch; else the gate runs each alone).
 */
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
  c->chain_tok_dev = ops->alloc(c->dev, (VS_MAX_DEPTH + 1) * sizeof(int32_t));
  c->chain_probs_dev = ops->alloc(c->dev, (size_t)(VS_MAX_DEPTH + 1) * c->V * sizeof(float));
  c->walk_tokens = malloc((size_t)c->tree.cap * sizeof(int32_t));
  /* A feature head reads the target's features where the target left them. */
  if (vs_drafter_uses_features(c->drafter))
    c->tfeat_dev = ops->alloc(c->dev, (size_t)c->tree.cap * c->rows * c->fdim * sizeof(float));
  if (!c->chain_tok_dev || !c->chain_probs_dev || !c->walk_tokens ||
      (vs_drafter_uses_features(c->drafter) && !c->tfeat_dev))
    return vs_fail(err, errlen, VSPEC_ENOMEM, "cannot hold drafts on the device%s%s",
                   *vs_dev_alloc_error(c->dev) ? ": " : "", vs_dev_alloc_error(c->dev));
  c->draft_dev = 1;
  return VSPEC_OK;
}

void vs_draft_device_free(vs_rounds *c) {
  const vspec_ops *ops = vs_dev_ops(c->dev);
  if (c->chain_tok_dev) ops->free(c->dev, c->chain_tok_dev);
  if (c->chain_probs_dev) ops->free(c->dev, c->chain_probs_dev);
  if (c->tfeat_dev) ops->free(c->dev, c->tfeat_dev);
  c->tfeat_dev = NULL;
  free(c->walk_tokens);
  c->chain_tok_dev = NULL;
  c->chain_probs_dev = NULL;
  c->walk_tokens = NULL;
}

void vs_draft_device_round(vs_rounds *c, int depth, int32_t root_index) {
  c->round_dev = c->draft_dev && depth >= 1;
  if (!c->round_dev) return;
  /* Forward k draws draft k + 1 below the node at depth k, which predicts image token
   * root_index + k + 1; the host chain draws its uniform there, in this order. */
  for (int k = 0; k < depth; k++) {
    c->chain_u[k] = c->greedy ? 0.0 : vs_rng_uniform(&c->rng_draft);
    c->chain_guided[k] = (uint8_t)vs_cfg_guided(c->s, root_index + k + 1);
  }
  /* A draft distribution is the target's processing; greedy drafting takes the first
   * maximum of it at temperature 1 (core/draft_model.c, dm_distribution). */
  vs_draft_draw d = {.spec = {.rows = c->rows, .vocab = c->V, .top_k = c->s->top_k,
                              .cfg_scale = c->s->cfg_scale,
                              .temperature = c->greedy ? 1.0f : c->s->temperature,
                              .top_p = c->s->top_p},
                     .u = c->greedy ? NULL : c->chain_u, .guided = c->chain_guided,
                     .tokens = c->chain_tok_dev, .probs = c->chain_probs_dev,
                     .forwards = depth};
  vs_drafter_set_draw(c->drafter, &d);
}

void vs_draft_device_done(vs_rounds *c) {
  if (c->round_dev) vs_drafter_set_draw(c->drafter, NULL);
}
