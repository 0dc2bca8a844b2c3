/*
 * plugins/backend/llamagen/gpt_device.c - what a forward leaves on its device instead of
 * downloading: the verification walk (ABI 1.6, vspec_forward_out.walk: the result instead of
 * the logits) and a draft drawn there (ABI 1.8, vspec_forward_out.draw: its distributions
 * stay in the session's draft_probs; ../device_tokens.h has what both backends share).
 * gpt_forward.c calls these around its fused forwards.
 */
#include <stdint.h>
#include <string.h>

#include "../device_tokens.h"
#include "lg_internal.h"

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
static int lgd_walks(const vspec_ops *ops, const vspec_forward_out *out, int n) {
  return out && VSPEC_HAS_FIELD(out, vspec_forward_out, walked) && out->walk &&
         out->walk_result && out->walk->sample.n >= 1 && out->walk->sample.n <= n &&
         out->walk->sample.rows >= 1 && out->walk_dists >= 0 &&
         out->walk_dists <= out->walk->sample.n &&
         VSPEC_HAS_FIELD(ops, vspec_ops, verify_walk) && ops->verify_walk;
}

/* ABI 1.8's walk fields of `out`, or NULL: the drafts' distributions on the device, and the
 * host room for the tree's tokens. */
static const float *lgd_walk_probs(const vspec_forward_out *out) {
  return VSPEC_HAS_FIELD(out, vspec_forward_out, walk_tokens) ? out->walk_probs : NULL;
}
static int32_t *lgd_walk_tokens(const vspec_forward_out *out) {
  return VSPEC_HAS_FIELD(out, vspec_forward_out, walk_tokens) ? out->walk_tokens : NULL;
}

#define LG_ALIGN(x) (((x) + 63) & ~(size_t)63)

/* One walk's inputs: its tokens at `tok` (in the batch's token area, right after the results,
 * so that one download brings the results and the tokens: walk_tokens), then from `at` on
 * (64-aligned pieces) the other integers (parents, dist), the guidance bytes, the draft
 * distributions (none where they are on the device already: walk_probs). Copies them to host
 * + offset when host is set and points *ds, the spec with device arrays, at their copies at
 * dev + offset when dev is; returns where they end. The same offsets every way, so a batch
 * sizes its staging, packs every walk, uploads once, then places each again to run it. */
static size_t lgd_walk_pack(const vspec_forward_out *out, int V, unsigned char *host,
                            unsigned char *dev, size_t tok, size_t at, vspec_walk_spec *ds) {
  const vspec_walk_spec *sp = out->walk;
  const float *probs = lgd_walk_probs(out);
  int n = sp->sample.n;
  size_t at_g = at + LG_ALIGN(2 * (size_t)n * sizeof(int32_t)), at_d = at_g + LG_ALIGN((size_t)n);
  size_t dist_bytes = sp->dists && !probs ? (size_t)out->walk_dists * V * sizeof(float) : 0;
  size_t end = dist_bytes ? at_d + dist_bytes : at_g + (size_t)n;
  if (host) {
    int32_t *ints = (int32_t *)(void *)(host + at);
    memcpy(host + tok, sp->tokens, (size_t)n * sizeof(int32_t));
    memcpy(ints, sp->parents, (size_t)n * sizeof(int32_t));
    if (sp->dist) memcpy(ints + n, sp->dist, (size_t)n * sizeof(int32_t));
    memset(host + at_g, 1, (size_t)n);
    if (sp->sample.guided) memcpy(host + at_g, sp->sample.guided, (size_t)n);
    if (dist_bytes) memcpy(host + at_d, sp->dists, dist_bytes);
  }
  if (!dev) return end;
  const int32_t *dints = (const int32_t *)(const void *)(dev + at);
  *ds = *sp;
  ds->tokens = (const int32_t *)(const void *)(dev + tok);
  ds->parents = dints;
  ds->dist = sp->dist ? dints + n : NULL;
  ds->sample.guided = dev + at_g;
  ds->dists = probs ? probs : dist_bytes ? (const float *)(const void *)(dev + at_d) : NULL;
  return end;
}

/* The walk staging of `owner` (a session, or a batch's lead), host and device alike, for at
 * least `need` bytes: the first for the session's largest tree (a lone forward then never
 * grows it), more where a batch needs it. 0 when it cannot be allocated. */
static int lgd_walk_room(vspec_session *owner, size_t need) {
  if (owner->walk_dev && need <= owner->walk_bytes) return 1;
  if (owner->walk_dev) owner->ops->free(owner->dev, owner->walk_dev);
  owner->host->free(owner->walk_host);
  owner->walk_dev = owner->walk_host = NULL;
  owner->walk_bytes = 0;
  const lg_gpt *g = &owner->m->gpt;
  int n = owner->max_nodes;
  size_t one = LG_ALIGN(sizeof(vspec_walk_result)) + 2 * LG_ALIGN((size_t)n * sizeof(int32_t)) +
               LG_ALIGN(2 * (size_t)n * sizeof(int32_t)) + LG_ALIGN((size_t)n) +
               (size_t)n * g->vocab * sizeof(float);
  size_t want = need > one ? need : one;
  owner->walk_host = owner->host->calloc(want, 1);
  owner->walk_dev = owner->ops->alloc(owner->dev, want);
  if (!owner->walk_host || !owner->walk_dev) {
    if (owner->walk_dev) owner->ops->free(owner->dev, owner->walk_dev);
    owner->host->free(owner->walk_host);
    owner->walk_dev = owner->walk_host = NULL;
    return 0;
  }
  owner->walk_bytes = want;
  return 1;
}

/* The staging's layout for the walkers of seg: the results [W] from 0, the token area from
 * *tok0 (each walker's n tokens in turn), the packs from the token area's end on; returns
 * where the last pack ends. */
static size_t lgd_walk_layout(const lg_seg *seg, int count, const int *walked, int W, int V,
                              size_t *tok0, size_t *tok_end) {
  vspec_walk_spec ds;
  size_t tok = LG_ALIGN((size_t)W * sizeof(vspec_walk_result)), end;
  *tok0 = tok;
  for (int i = 0; i < count; i++)
    if (walked[i]) tok += (size_t)seg[i].out->walk->sample.n * sizeof(int32_t);
  *tok_end = tok;
  end = tok;
  for (int i = 0; i < count; i++)
    if (walked[i]) end = lgd_walk_pack(seg[i].out, V, NULL, NULL, 0, LG_ALIGN(end), &ds);
  return end;
}

/* The results and, where walk_tokens asks, the trees' tokens to each walker: one download of
 * the results (and of the token area when any walker wants its tokens). */
static void lgd_walk_results(const vspec_ops *ops, vspec_dev *dev, vspec_session *owner,
                             const lg_seg *seg, int count, const int *walked, int W,
                             size_t tok0, size_t tok_end) {
  unsigned char *host = owner->walk_host, *dmem = owner->walk_dev;
  int want_tokens = 0;
  for (int i = 0; i < count; i++) want_tokens |= walked[i] && lgd_walk_tokens(seg[i].out);
  size_t res_bytes = (size_t)W * sizeof(vspec_walk_result);
  /* the token area was packed on the host too: download over it */
  ops->download(dev, host, dmem, want_tokens ? tok_end : res_bytes);
  size_t tok = tok0;
  for (int i = 0, k = 0; i < count; i++) {
    if (!walked[i]) continue;
    vspec_forward_out *out = seg[i].out;
    int n = out->walk->sample.n;
    memcpy(out->walk_result, host + (size_t)k++ * sizeof(vspec_walk_result),
           sizeof(vspec_walk_result));
    if (lgd_walk_tokens(out)) memcpy(lgd_walk_tokens(out), host + tok, (size_t)n * sizeof(int32_t));
    tok += (size_t)n * sizeof(int32_t);
    out->walked = 1;
  }
}

int lg_walk_segs(const vspec_ops *ops, vspec_dev *dev, vspec_session *owner, const float *logits,
                 const lg_seg *seg, int count, int *walked) {
  int V = owner->m->gpt.vocab, W = 0;
  for (int i = 0; i < count; i++) W += walked[i] = lgd_walks(ops, seg[i].out, seg[i].head_count);
  if (!W) return 0;
  size_t tok0, tok_end, end = lgd_walk_layout(seg, count, walked, W, V, &tok0, &tok_end);
  if (!lgd_walk_room(owner, end)) {
    memset(walked, 0, (size_t)count * sizeof *walked);
    return 0;
  }
  unsigned char *host = owner->walk_host, *dmem = owner->walk_dev;
  vspec_walk_spec ds;
  size_t tok = tok0, at = tok_end;
  for (int i = 0; i < count; i++)
    if (walked[i]) {
      at = lgd_walk_pack(seg[i].out, V, host, dmem, tok, LG_ALIGN(at), &ds);
      tok += (size_t)seg[i].out->walk->sample.n * sizeof(int32_t);
    }
  ops->upload(dev, dmem + tok0, host + tok0, at - tok0);
  vspec_walk_result *res = (vspec_walk_result *)(void *)dmem;
  tok = tok0;
  at = tok_end;
  for (int i = 0, rows = 0, k = 0; i < count; i++) {
    int R = seg[i].s->rows;
    if (walked[i]) {
      at = lgd_walk_pack(seg[i].out, V, NULL, dmem, tok, LG_ALIGN(at), &ds);
      int n = ds.sample.n;
      /* tokens drawn on the device (ABI 1.8) into the uploaded ones */
      vs_bk_patch_tokens(ops, dev, (const int32_t *)(const void *)(host + tok), seg[i].token_dev, 1,
                      n, n, (int32_t *)(void *)(dmem + tok));
      size_t first = (size_t)rows + (size_t)(seg[i].head_count - n) * R;
      ops->verify_walk(dev, logits + first * V, &ds, res + k++);
      tok += (size_t)n * sizeof(int32_t);
    }
    rows += seg[i].head_count * R;
  }
  lgd_walk_results(ops, dev, owner, seg, count, walked, W, tok0, tok_end);
  return W;
}
