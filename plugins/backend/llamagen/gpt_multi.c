/*
 * The LlamaGen GPT's cross-job batches (ABI 1.2 forward_multi): the forwards of several
 * sessions of one model as one, so that the weights are read once for the rows of all of
 * them. Every op runs on the batch's device, the KV stores into the sessions' caches too (the
 * caller orders the sessions' queues around the call: core/forward_gate.c).
 *
 * Two paths, as for a lone forward (gpt_forward.c): the unfused one (the CPU's default,
 * multi=auto) runs the linear layers once over every row and the attention per session and
 * row; on the fused ops (a GPU's default) each session's QKV and attention run on its own
 * cache and tree, the other layers over every row. Either way the head is one GEMM over every
 * session's head rows, and what comes back comes in few transfers: one download of every
 * session's features, one of the logits of the sessions that did not walk, and for those that
 * asked for the walk on the device (vspec_forward_out.walk) one upload of their trees and one
 * download of their results (gpt_forward.c, lg_head_out).
 */
#include <stdio.h>
#include <string.h>

#include "lg_internal.h"

/* ---- on the fused ops ------------------------------------------------------------------- */

/* One segment's device integers in a batch's upload. */
typedef struct lg_mseg {
  const int32_t *slots, *lens, *parents;
} lg_mseg;

/* The batch ops' entries (ABI 1.9), every layer's sessions, in the batch's upload after its
 * integers: [n_layer][count], host and device copies; NULL where the batch runs without the
 * ops (lg__batch_ops). */
typedef struct lg_mbatch {
  const vspec_kv_batch_entry *host, *dev;
  int max_slots;
} lg_mbatch;

/* Whether a fused batch of this model runs the sessions' QKV and attention as the batch ops:
 * where the device has them, unless multi=sessions asks for an op per session. */
static int lg__batch_ops(const vspec_model *m, const vspec_ops *ops) {
  return m->multi != LG_MULTI_SESSIONS && vspec_has_batch_ops(ops);
}

/* The upload's room for the batch ops' entries, in int32 words (an 8-byte alignment
 * included): lg_forward_multi sizes the workspace with it. */
static size_t lg__batch_ints(const vspec_model *m, const vspec_ops *ops, int count) {
  if (!lg__batch_ops(m, ops)) return 0;
  return 2 + (size_t)m->gpt.n_layer * count * sizeof(vspec_kv_batch_entry) / sizeof(int32_t);
}

/* Fills the entries at h + at (at rounded up to 8 bytes); returns the words used. */
static size_t lg__batch_entries(const lg_work *w, const lg_seg *seg, int count,
                                const lg_mseg *ms, int32_t *h, size_t at, lg_mbatch *mb) {
  const lg_gpt *g = &seg[0].s->m->gpt;
  size_t start = (at + 1) & ~(size_t)1;
  vspec_kv_batch_entry *e = (vspec_kv_batch_entry *)(void *)(h + start);
  mb->host = e;
  mb->dev = (const vspec_kv_batch_entry *)(const void *)(w->idx_dev + start);
  mb->max_slots = 0;
  for (int l = 0; l < g->n_layer; l++)
    for (int i = 0; i < count; i++, e++) {
      vspec_session *s = seg[i].s;
      *e = (vspec_kv_batch_entry){
          .kv = {.k = vs_kv_at(&s->kv, s->kv.k, l, 0, 0), .v = vs_kv_at(&s->kv, s->kv.v, l, 0, 0),
                 .rows = s->rows, .n_heads = g->n_head, .kv_heads = g->n_kv_head,
                 .head_dim = g->head_dim, .slots = s->kv.slots},
          .tree = {.n = seg[i].n, .n_prefix = s->prefix_dev ? g->n_cond : 0,
                   .lens = ms[i].lens, .parents = ms[i].parents, .prefix = s->prefix_dev},
          .slots = ms[i].slots,
          .row0 = seg[i].row0};
      if (s->kv.slots > mb->max_slots) mb->max_slots = s->kv.slots;
    }
  return start - at + (size_t)g->n_layer * count * sizeof *e / sizeof *h;
}

/* Stages and uploads a batch's integers in one transfer: tokens and positions [M] each, head
 * rows [K], then per segment its cache slots [n], lengths [2] (committed, base) and tree
 * parents [base + n], then the batch ops' entries where the device has them (mb->host NULL
 * where not; lg_forward_multi sizes the workspace for all of it); returns K. */
static int lg__multi_upload(const vspec_ops *ops, vspec_dev *dev, lg_work *w, const lg_seg *seg,
                            int count, int M, lg_mseg *ms, lg_mbatch *mb) {
  int32_t *h = w->idx_host;
  memcpy(h, w->tok, (size_t)M * sizeof *h);
  memcpy(h + M, w->pos, (size_t)M * sizeof *h);
  int K = 0;
  for (int i = 0; i < count; i++) /* (node, row) order, as lg_head_out takes them */
    for (int j = 0; j < seg[i].head_count; j++)
      for (int r = 0; r < seg[i].s->rows; r++)
        h[2 * M + K++] = seg[i].row0 + r * seg[i].n + seg[i].head_first + j;
  size_t at = 2 * (size_t)M + (size_t)K;
  for (int i = 0; i < count; i++) {
    const vs_kv_tree *kv = &seg[i].s->kv;
    int n = seg[i].n, base = seg[i].first_slot - kv->committed;
    for (int j = 0; j < n; j++) h[at + j] = seg[i].first_slot + j;
    h[at + n] = kv->committed;
    h[at + n + 1] = base;
    memcpy(h + at + n + 2, kv->parents, (size_t)(base + n) * sizeof *h);
    ms[i] = (lg_mseg){.slots = w->idx_dev + at, .lens = w->idx_dev + at + n,
                      .parents = w->idx_dev + at + n + 2};
    at += 2 * (size_t)n + 2 + (size_t)base;
  }
  *mb = (lg_mbatch){0};
  if (lg__batch_ops(seg[0].s->m, ops)) at += lg__batch_entries(w, seg, count, ms, h, at, mb);
  ops->upload(dev, w->idx_dev, h, at * sizeof *h);
  return K;
}

/* A batch on the fused ops: one upload, the embeddings gathered, per layer every session's
 * norm + QKV + RoPE + KV store and tree attention (each its own cache and tree) and three ops
 * over every row, then the head rows normed and the head. With the batch ops of ABI 1.9 the
 * sessions' attention parts are one op each, 5 ops per layer whatever the sessions (on a GPU
 * the QKV weights read once for all of them); without, 3 + 2 x sessions, where the unfused
 * path takes 12 + 3 x rows. */
static void lg__forward_multi_fused(const vspec_ops *ops, vspec_dev *dev, lg_work *w,
                                    const lg_seg *seg, int count, int M, float *stage) {
  const lg_gpt *g = &seg[0].s->m->gpt;
  int d = g->dim, att_w = g->n_head * g->head_dim;
  int qkv_w = (g->n_head + 2 * g->n_kv_head) * g->head_dim;
  lg_mseg ms[LG_MULTI_MAX];
  lg_mbatch mb;
  int K = lg__multi_upload(ops, dev, w, seg, count, M, ms, &mb);
  for (int i = 0; i < count; i++) /* tokens drawn on the device (ABI 1.8) */
    vs_bk_patch_tokens(ops, dev, w->tok + seg[i].row0, seg[i].token_dev, seg[i].s->rows,
                       seg[i].n, seg[i].n, w->idx_dev + seg[i].row0);
  ops->gather_rows(dev, g->tok_embeddings, w->idx_dev, M, d, w->x);
  for (int l = 0; l < g->n_layer; l++) {
    const lg_layer *W = &g->layers[l];
    if (mb.host) {
      vspec_kv_batch kb = {.count = count, .m = M, .max_slots = mb.max_slots,
                           .entries = mb.host + (size_t)l * count,
                           .entries_dev = mb.dev + (size_t)l * count};
      ops->norm_qkv_rope_batch(dev, w->x, d, W->attention_norm, g->norm_eps, W->wqkv,
                               w->idx_dev + M, g->rope_table, &kb, w->qkv);
      ops->tree_attention_batch(dev, w->qkv, &kb, w->att);
    }
    for (int i = 0; i < count && !mb.host; i++) {
      vspec_session *s = seg[i].s;
      size_t r0 = (size_t)seg[i].row0;
      vspec_kv_cache kv = {.k = vs_kv_at(&s->kv, s->kv.k, l, 0, 0),
                           .v = vs_kv_at(&s->kv, s->kv.v, l, 0, 0),
                           .rows = s->rows, .n_heads = g->n_head, .kv_heads = g->n_kv_head,
                           .head_dim = g->head_dim, .slots = s->kv.slots};
      vspec_kv_tree_view tree = {.n = seg[i].n, .n_prefix = s->prefix_dev ? g->n_cond : 0,
                                 .lens = ms[i].lens, .parents = ms[i].parents,
                                 .prefix = s->prefix_dev};
      ops->norm_qkv_rope(dev, w->x + r0 * d, seg[i].n, d, W->attention_norm, g->norm_eps,
                         W->wqkv, w->idx_dev + M + r0, g->rope_table, &kv, ms[i].slots,
                         w->qkv + r0 * qkv_w);
      ops->tree_attention(dev, w->qkv + r0 * qkv_w, &kv, &tree, w->att + r0 * att_w);
    }
    ops->linear_add(dev, w->att, M, att_w, W->wo, d, w->x);
    ops->norm_swiglu(dev, w->x, M, d, W->ffn_norm, g->norm_eps, W->w1, W->w3, g->ffn_hidden,
                     w->ff1);
    ops->linear_add(dev, w->ff1, M, g->ffn_hidden, W->w2, d, w->x);
  }
  ops->rmsnorm_rows(dev, w->x, w->idx_dev + 2 * M, K, d, g->norm, g->norm_eps, w->h);
  lg_head_out(g, ops, dev, w, seg, count, K, stage);
}

/* The lead session's batch workspace for `rows` rows and `ints` words of integers, and its
 * host stage for `rows` rows of outputs (lg__out_rows), grown as needed; both belong to the
 * lead (freed with it, by its own device). Returns the stage, or NULL when out of memory. */
static float *lg__multi_room(vspec_session *lead, size_t rows, size_t ints) {
  const vspec_host *H = lead->host;
  const lg_gpt *g = &lead->m->gpt;
  if (rows > lead->multi.rows || ints > lead->multi.idx_ints) {
    size_t want = rows > lead->multi.rows ? rows : lead->multi.rows;
    size_t want_ints = ints > lead->multi.idx_ints ? ints : lead->multi.idx_ints;
    lg_work_free(H, lead->ops, lead->dev, &lead->multi);
    if (lg_work_alloc(H, lead->ops, lead->dev, g, want, 0, want_ints, &lead->multi)) {
      lg_work_free(H, lead->ops, lead->dev, &lead->multi);
      return NULL;
    }
  }
  size_t floats = rows * (size_t)(g->vocab > g->dim ? g->vocab : g->dim);
  if (floats == 0) floats = 1;
  if (floats > lead->multi_out_cap) {
    H->free(lead->multi_out);
    lead->multi_out_cap = 0;
    if (!(lead->multi_out = H->alloc(floats * sizeof(float)))) return NULL;
    lead->multi_out_cap = floats;
  }
  return lead->multi_out;
}

int lg_forward_multi(vspec_dev *dev, vspec_session *const *ss, const vspec_forward_batch *const *bs,
                     vspec_forward_out *const *outs, int32_t count, char *err, size_t errlen) {
  if (count < 1 || count > LG_MULTI_MAX) {
    snprintf(err, errlen, "forward_multi of %d sessions: give 1..%d", count, LG_MULTI_MAX);
    return VSPEC_EINVAL;
  }
  vspec_session *lead = ss[0];
  const vspec_host *H = lead->host;
  size_t rows = 0, ints = 0;
  for (int i = 0; i < count; i++) {
    const vspec_session *s = ss[i];
    if (s->m != lead->m) {
      snprintf(err, errlen, "forward_multi: session %d belongs to another model", i);
      return VSPEC_EINVAL;
    }
    /* Sessions of other contexts of the batch's GPU are fine: the caller orders their
     * streams around the call (plugin.h, forward_multi). */
    if (H->dev_space(s->dev) != H->dev_space(dev)) {
      snprintf(err, errlen, "forward_multi: session %d lives in another memory space than the "
               "batch's device", i);
      return VSPEC_EINVAL;
    }
    for (int j = 0; j < i; j++)
      if (ss[j] == s) {
        snprintf(err, errlen, "forward_multi: session %d appears twice", i);
        return VSPEC_EINVAL;
      }
    int n = bs[i]->n_nodes > 0 ? bs[i]->n_nodes : 0;
    rows += (size_t)s->rows * n;
    ints += 2 * (size_t)n + 2 + (size_t)(bs[i]->append ? s->kv.n_pending : 0);
  }
  const lg_gpt *g = &lead->m->gpt;
  const vspec_ops *ops = H->dev_ops(dev);
  int fused = vspec_has_fused_ops(ops) &&
              (lead->m->multi == LG_MULTI_FUSED || lead->m->multi == LG_MULTI_SESSIONS ||
               (lead->m->multi == LG_MULTI_AUTO && ops->device != VSPEC_DEVICE_CPU));
  /* A draft drawn on the device goes alone (lg_forward); tokens drawn there and features
   * kept there are taken on the fused path only: the caller then runs each alone. */
  for (int i = 0; i < count; i++)
    if (vs_bk_drafts(ops, outs[i], bs[i]->n_nodes, LG_DRAFT_MAX) ||
        (!fused && (vs_bk_token_dev(bs[i]) || vs_bk_features_dev(outs[i])))) {
      snprintf(err, errlen, "forward_multi: session %d %s", i,
               fused ? "draws a draft on the device" : "keeps tokens or features on the device, "
                                                       "which the unfused batch does not");
      return VSPEC_ENOTSUP;
    }
  /* room for the fused path's integers too (lg__multi_upload: at most this many words) */
  ints += 3 * rows + (fused ? lg__batch_ints(lead->m, ops, count) : 0);
  float *stage = lg__multi_room(lead, rows, ints);
  if (!stage) {
    snprintf(err, errlen, "out of memory for a batch of %zu rows", rows);
    return VSPEC_ENOMEM;
  }
  lg_seg seg[LG_MULTI_MAX];
  int row0 = 0, pending[LG_MULTI_MAX];
  for (int i = 0; i < count; i++) {
    char inner[256];
    pending[i] = bs[i]->append ? ss[i]->kv.n_pending : 0;
    int rc = lg_stage_seg(ss[i], bs[i], outs[i], &lead->multi, row0, &seg[i], inner,
                          sizeof inner);
    if (rc) {
      /* Sessions staged before this one would keep new pending nodes without keys and
       * values: take them back (an appending batch keeps what was pending before it). */
      for (int j = 0; j < i; j++) ss[j]->kv.n_pending = pending[j];
      snprintf(err, errlen, "forward_multi: session %d: %s", i, inner);
      return rc;
    }
    if (!fused) lg_unfused_inputs(&seg[i], &lead->multi, ops, dev);
    row0 += ss[i]->rows * seg[i].n;
  }
  /* a batch of one downloads straight into its out, as a forward does */
  if (count == 1) stage = NULL;
  if (fused) {
    lg__forward_multi_fused(ops, dev, &lead->multi, seg, count, row0, stage);
    return VSPEC_OK;
  }
  lg_run_layers(g, ops, dev, &lead->multi, seg, count, row0);
  lg_head_out(g, ops, dev, &lead->multi, seg, count,
              lg_head_rows(g, ops, dev, &lead->multi, seg, count), stage);
  return VSPEC_OK;
}

