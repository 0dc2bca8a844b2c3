/*
 * plugins/backend/llamagen/gpt_device.c - what a forward leaves on its device instead of
 * downloading: the verification walk (ABI 1.6, vspec_forward_out.walk: the result instead of
 * the logits) and a draft drawn there (ABI 1.8, vspec_forward_out.draw: distributions and
 * tokens that never reach the host; vspec_forward_batch.token_dev feeds such tokens back).
 * gpt_forward.c calls these around its fused forwards.
 */
#include <stdint.h>
#include <string.h>

#include "lg_internal.h"

/* Whether this forward draws a draft on the device (ABI 1.8, vspec_forward_out.draw) over the
 * last draw->n of its n head nodes. */
int lg_drafts(const vspec_ops *ops, const vspec_forward_out *out, int n) {
  return n <= LG_DRAFT_MAX && out && VSPEC_HAS_FIELD(out, vspec_forward_out, walk_tokens) && out->draw &&
         out->draw_probs && out->draw_tokens && out->draw->n >= 1 && out->draw->n <= n &&
         out->draw->temperature > 0.0f && VSPEC_HAS_FIELD(ops, vspec_ops, draw_probs) &&
         ops->draw_probs;
}


/* A draft's draw as a draw over all n nodes of the forward, the drawn ones last (the others
 * draw at u = 0, unguided rows aside, into rows nobody reads): the shape lg__idx_upload
 * stages. u and guided: host room for n entries. */
vspec_sample_spec lg_draft_spec(const vspec_sample_spec *draw, int n, double *u,
                                        uint8_t *guided) {
  vspec_sample_spec sp = *draw;
  int first = n - draw->n;
  memset(u, 0, (size_t)n * sizeof *u);
  memset(guided, 1, (size_t)n);
  if (draw->u) memcpy(u + first, draw->u, (size_t)draw->n * sizeof *u);
  if (draw->guided) memcpy(guided + first, draw->guided, (size_t)draw->n);
  sp.n = n;
  sp.u = u;
  sp.guided = guided;
  return sp;
}

/* Tokens drawn on the device into an uploaded token array dst [rows, stride] (device): host
 * entry host[r stride + i] = -1 - j is token_dev[j]; a copy per run of consecutive j per row
 * (a chain's drafts are one run). */
void lg_patch_tokens(vspec_session *s, const int32_t *host, const int32_t *token_dev,
                             int rows, int n, int stride, int32_t *dst) {
  if (!token_dev) return;
  for (int r = 0; r < rows; r++)
    for (int i = 0; i < n;) {
      int32_t t = host[r * stride + i];
      int len = 1;
      if (t >= 0) {
        i++;
        continue;
      }
      while (i + len < n && host[r * stride + i + len] == t - len) len++;
      s->ops->copy(s->dev, dst + r * stride + i, token_dev + (-1 - t),
                   (size_t)len * sizeof(int32_t));
      i += len;
    }
}


/* The batch's tokens drawn on the device (ABI 1.8), or NULL. */
const int32_t *lg_token_dev(const vspec_forward_batch *b) {
  return VSPEC_HAS_FIELD(b, vspec_forward_batch, token_dev) ? b->token_dev : NULL;
}


/* The session's draft_probs, allocated at its first draft drawn on the device (not in a
 * forward's ops: a graph's recording may not allocate). */
int lg_draft_room(vspec_session *s) {
  if (s->draft_probs) return 1;
  s->draft_probs = s->ops->alloc(s->dev, (size_t)s->max_nodes * s->m->gpt.vocab * sizeof(float));
  return s->draft_probs != NULL;
}


/* ---- the walk on the device (ABI 1.6) -------------------------------------------------------- */

/* Whether this forward walks its tree, its last walk->sample.n head nodes, on the device
 * (vspec_forward_out.walk) after computing the logits of its n head nodes. */
int lg_walks(const vspec_ops *ops, const vspec_forward_out *out, int n) {
  return out && VSPEC_HAS_FIELD(out, vspec_forward_out, walked) && out->walk &&
         out->walk_result && out->walk->sample.n >= 1 && out->walk->sample.n <= n &&
         out->walk->sample.rows >= 1 && out->walk_dists >= 0 &&
         out->walk_dists <= out->walk->sample.n &&
         VSPEC_HAS_FIELD(ops, vspec_ops, verify_walk) && ops->verify_walk;
}

/* Bytes of the walk's staging for the session's largest tree: the result, the integers
 * (tokens, parents, dist: the tokens first, so that one download brings the result and the
 * tokens, ABI 1.8's walk_tokens), the guidance bytes and the draft distributions, each
 * 64-aligned. */
#define LG_ALIGN(x) (((x) + 63) & ~(size_t)63)
static size_t lgd_walk_layout(int n, int vocab, size_t *at_ints, size_t *at_guided,
                              size_t *at_dists) {
  *at_ints = LG_ALIGN(sizeof(vspec_walk_result));
  *at_guided = *at_ints + LG_ALIGN(3 * (size_t)n * sizeof(int32_t));
  *at_dists = *at_guided + LG_ALIGN((size_t)n);
  return *at_dists + (size_t)n * vocab * sizeof(float);
}

/* The draft distributions of the walk: walk_probs on the device (ABI 1.8), or NULL. */
static const float *lgd_walk_probs(const vspec_forward_out *out) {
  return VSPEC_HAS_FIELD(out, vspec_forward_out, walk_tokens) ? out->walk_probs : NULL;
}

/* The walk over the last of w->logits' `nodes` head nodes: one upload (the tree, its guidance
 * and draft distributions), the op, one download of the result (a few hundred bytes instead of
 * nodes x rows x vocab floats; with the tree's tokens where walk_tokens asks). Tokens drawn on
 * the device (negative, token_dev) are copied into the uploaded ones. 0 when the staging
 * cannot be allocated: the caller downloads the logits instead and the engine walks on the
 * host. */
int lg_walk(vspec_session *s, vspec_forward_out *out, int nodes,
                    const int32_t *token_dev) {
  const vspec_walk_spec *sp = out->walk;
  int V = s->m->gpt.vocab, n = sp->sample.n;
  size_t at_i, at_g, at_d, want = lgd_walk_layout(s->max_nodes, V, &at_i, &at_g, &at_d);
  if (!s->walk_dev) {
    s->walk_host = s->host->calloc(want, 1);
    s->walk_dev = s->ops->alloc(s->dev, want);
    if (!s->walk_host || !s->walk_dev) {
      if (s->walk_dev) s->ops->free(s->dev, s->walk_dev);
      s->host->free(s->walk_host);
      s->walk_dev = s->walk_host = NULL;
      return 0;
    }
    s->walk_bytes = want;
  }
  const float *probs = lgd_walk_probs(out);
  int32_t *ints = (int32_t *)(void *)(s->walk_host + at_i);
  memcpy(ints, sp->tokens, (size_t)n * sizeof(int32_t));
  memcpy(ints + n, sp->parents, (size_t)n * sizeof(int32_t));
  if (sp->dist) memcpy(ints + 2 * n, sp->dist, (size_t)n * sizeof(int32_t));
  memset(s->walk_host + at_g, 1, (size_t)n);
  if (sp->sample.guided) memcpy(s->walk_host + at_g, sp->sample.guided, (size_t)n);
  size_t dist_bytes = sp->dists && !probs ? (size_t)out->walk_dists * V * sizeof(float) : 0;
  if (dist_bytes) memcpy(s->walk_host + at_d, sp->dists, dist_bytes);
  size_t up = dist_bytes ? at_d + dist_bytes : at_g + (size_t)n;
  s->ops->upload(s->dev, s->walk_dev + at_i, s->walk_host + at_i, up - at_i);
  int32_t *dints = (int32_t *)(void *)(s->walk_dev + at_i);
  lg_patch_tokens(s, ints, token_dev, 1, n, n, dints);
  vspec_walk_spec ds = *sp;
  ds.tokens = dints;
  ds.parents = dints + n;
  ds.dist = sp->dist ? dints + 2 * n : NULL;
  ds.sample.guided = s->walk_dev + at_g;
  ds.dists = probs ? probs : dist_bytes ? (const float *)(const void *)(s->walk_dev + at_d) : NULL;
  vspec_walk_result *res = (vspec_walk_result *)(void *)s->walk_dev;
  s->ops->verify_walk(s->dev, s->w.logits + (size_t)(nodes - n) * s->rows * V, &ds, res);
  int32_t *tokens_out = VSPEC_HAS_FIELD(out, vspec_forward_out, walk_tokens) ? out->walk_tokens
                                                                            : NULL;
  if (tokens_out) { /* one download: the result, then the tokens */
    s->ops->download(s->dev, s->walk_host, s->walk_dev, at_i + (size_t)n * sizeof(int32_t));
    memcpy(out->walk_result, s->walk_host, sizeof *out->walk_result);
    memcpy(tokens_out, ints, (size_t)n * sizeof(int32_t));
  } else {
    s->ops->download(s->dev, out->walk_result, res, sizeof *res);
  }
  out->walked = 1;
  return 1;
}

