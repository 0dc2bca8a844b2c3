/*
 * The LlamaGen GPT's forward: prefill, tree forwards and commits; the layers, the head and the
 * walk on the device that cross-job batches (gpt_multi.c) share.
 *
 * Two paths compute the same numbers (LlamaGen autoregressive/models/gpt.py, Transformer
 * and TransformerBlock):
 *  - the fused path (ABI 1.4, vspec_has_fused_ops): five ops per layer plus three per
 *    forward, the integer inputs (tokens, positions, head rows, tree parents) uploaded in one
 *    transfer, the attention mask made on the device from the tree's parents. On the CPU the
 *    fused ops are the unfused sequences below, so the outputs are bit-identical; on a GPU
 *    each op is a kernel launch or a few, and launches are what a decode step there costs.
 *  - the unfused path, for devices without the fused ops and for cross-job batches on the
 *    CPU (multi=auto), whose linear layers run once over the rows of several sessions with
 *    different caches. A batch on a GPU takes the fused ops too (gpt_multi.c):
 *    each session's QKV and attention on its own cache, the other layers over every row.
 *
 * Work buffers hold rows * nodes vectors ordered (row, node): each CFG row's nodes are
 * contiguous, so one attention call per row covers all of its queries.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "lg_internal.h"

/* ---- the unfused path ------------------------------------------------------------------ */

/* Runs all layers over the segments' nodes: embeddings in w->x, positions in w->pos, each
 * session's attention mask in its s->mask ([n, first_slot + n]). The linear layers run once
 * over the rows of every segment (one pass over the weights), attention per session and row
 * against that session's cache. */
void lg_run_layers(const lg_gpt *g, const vspec_ops *ops, vspec_dev *dev, lg_work *w,
                   const lg_seg *seg, int count, int M) {
  int d = g->dim, hd = g->head_dim, H = g->n_head, Hkv = g->n_kv_head;
  int qkv_w = (H + 2 * Hkv) * hd;
  for (int l = 0; l < g->n_layer; l++) {
    const lg_layer *W = &g->layers[l];
    ops->rmsnorm(dev, w->x, W->attention_norm, M, d, g->norm_eps, w->h);
    ops->linear(dev, w->h, M, d, W->wqkv, qkv_w, NULL, w->qkv);
    /* q and k rotate; condition positions have cos = sin = 0 and become zero. */
    ops->rope_apply(dev, w->qkv, M, qkv_w, H, hd, w->pos, g->rope_table);
    ops->rope_apply(dev, w->qkv + (size_t)H * hd, M, qkv_w, Hkv, hd, w->pos, g->rope_table);
    for (int i = 0; i < count; i++) {
      vspec_session *s = seg[i].s;
      int n = seg[i].n, L = seg[i].first_slot;
      const float *qkv = w->qkv + (size_t)seg[i].row0 * qkv_w;
      /* on the batch's device, after the qkv it copies (not the cache's: another stream) */
      vs_kv_store_on(&s->kv, ops, dev, l, n, L, qkv, qkv_w, H * hd, (H + Hkv) * hd);
      for (int r = 0; r < s->rows; r++)
        ops->attention(dev, qkv + (size_t)r * n * qkv_w, n, qkv_w, H, Hkv, hd,
                       vs_kv_at(&s->kv, s->kv.k, l, r, 0), vs_kv_at(&s->kv, s->kv.v, l, r, 0),
                       s->kv.slots, L + n, s->mask,
                       w->att + (size_t)(seg[i].row0 + r * n) * H * hd);
    }
    ops->linear(dev, w->att, M, H * hd, W->wo, d, NULL, w->h);
    ops->add(dev, w->x, w->h, (size_t)M * d);
    ops->rmsnorm(dev, w->x, W->ffn_norm, M, d, g->norm_eps, w->h);
    ops->linear(dev, w->h, M, d, W->w1, g->ffn_hidden, NULL, w->ff1);
    ops->linear(dev, w->h, M, d, W->w3, g->ffn_hidden, NULL, w->ff3);
    ops->swiglu(dev, w->ff1, w->ff3, (size_t)M * g->ffn_hidden, w->ff1);
    ops->linear(dev, w->ff1, M, g->ffn_hidden, W->w2, d, NULL, w->h);
    ops->add(dev, w->x, w->h, (size_t)M * d);
  }
}

/* Each segment's head nodes, normed, into w->h in the ABI's (node, row) order; returns how
 * many rows that is. */
int lg_head_rows(const lg_gpt *g, const vspec_ops *ops, vspec_dev *dev, lg_work *w,
                 const lg_seg *seg, int count) {
  int d = g->dim, rows = 0;
  for (int i = 0; i < count; i++) {
    int R = seg[i].s->rows, n = seg[i].n;
    for (int j = 0; j < seg[i].head_count; j++)
      for (int r = 0; r < R; r++, rows++)
        ops->copy(dev, w->h + (size_t)rows * d,
                  w->x + (size_t)(seg[i].row0 + r * n + seg[i].head_first + j) * d,
                  (size_t)d * sizeof(float));
  }
  ops->rmsnorm(dev, w->h, g->norm, rows, d, g->norm_eps, w->h);
  return rows;
}

/* The session's attention mask and the embeddings of a staged segment's nodes. */
void lg_unfused_inputs(const lg_seg *seg, lg_work *w, const vspec_ops *ops, vspec_dev *dev) {
  vspec_session *s = seg->s;
  const lg_gpt *g = &s->m->gpt;
  int n = seg->n, d = g->dim, base = seg->first_slot - s->kv.committed;
  /* Caption slots are visible only where the caption is valid (generate.py, emb_masks). */
  vs_kv_tree_mask(&s->kv, base, n, s->cond_valid, g->n_cond, s->mask);
  for (int i = 0; i < s->rows * n; i++)
    ops->copy(dev, w->x + (size_t)(seg->row0 + i) * d,
              g->tok_embeddings + (size_t)w->tok[seg->row0 + i] * d, (size_t)d * sizeof(float));
}

/* ---- the fused path ---------------------------------------------------------------------- */

/* Device copies of a fused forward's inputs, from one upload: the integers, and for a draw
 * on the device its spec (device arrays) and where its tokens land. */
typedef struct lg_idx {
  const int32_t *tok, *pos, *head, *parents, *slots, *lens;
  vspec_sample_spec spec;
  int32_t *tokens; /* NULL: no draw on the device */
} lg_idx;

/* What a fused forward's head computes: features only, logits, tokens drawn on the device
 * (vspec_forward_out.sample), or a draft drawn there (vspec_forward_out.draw: distributions
 * and tokens that stay on the device). A graph is recorded per kind: each issues other ops. */
enum { LG_HEAD_FEATURES = 0, LG_HEAD_LOGITS = 1, LG_HEAD_DRAW = 2, LG_HEAD_DRAFT = 3 };

/* Whether this forward draws its tokens on the device (vspec_forward_out.sample). */
static int lg__draws(const vspec_ops *ops, const vspec_forward_out *out, int n) {
  return out && VSPEC_HAS_FIELD(out, vspec_forward_out, sampled) && out->sample &&
         out->tokens && out->sample->n == n && VSPEC_HAS_FIELD(ops, vspec_ops, sample_tokens) &&
         ops->sample_tokens;
}

static int lg__head_kind(const vspec_ops *ops, const vspec_forward_out *out, int n) {
  return vs_bk_drafts(ops, out, n, LG_DRAFT_MAX)   ? LG_HEAD_DRAFT
         : lg__draws(ops, out, n) ? LG_HEAD_DRAW
         : out && out->logits     ? LG_HEAD_LOGITS
                                  : LG_HEAD_FEATURES;
}

/* Uploads w->tok and w->pos of M rows, the head rows of `seg` (in the order of
 * lg_head_rows), the segment's cache slots, the tree's lengths (committed, base), with
 * `draw` its uniforms and guidance flags, then n_parents tree parents followed by n_pad
 * padding parents (-1): one transfer (w->idx_* hold LG_IDX_INTS(w->rows)). Everything that
 * changes from step to step is in it. The parents come last, the only part whose length
 * changes with the step (base): every device pointer of lg_idx depends on the shape alone
 * (M, the head rows, seg->n and whether it draws), so a graph recorded with them serves
 * every step of that shape. */
static lg_idx lg__idx_upload(const vspec_ops *ops, vspec_dev *dev, lg_work *w, int M,
                             const lg_seg *seg, const int32_t *parents, int n_parents,
                             int n_pad, const vspec_sample_spec *draw) {
  int32_t *h = w->idx_host;
  int R = seg->s->rows, n = seg->n, k = seg->head_count * R;
  size_t at_s = (size_t)(2 * M + k), end = at_s + (size_t)n + 2, at_u = 0, at_g = 0, at_t = 0;
  if (draw) { /* doubles 8-byte aligned, then a byte per node, then the tokens' room */
    at_u = (end + 1) & ~(size_t)1, at_g = at_u + 2 * (size_t)n, at_t = at_g + (size_t)(n + 3) / 4;
    end = at_t + (size_t)n;
  }
  /* First, memmove: the prefill stages its chain of parents in this array (lg_prefill) */
  memmove(h + end, parents, (size_t)n_parents * sizeof *h);
  for (int j = 0; j < n_pad; j++) h[end + (size_t)n_parents + j] = -1;
  memcpy(h, w->tok, (size_t)M * sizeof *h);
  memcpy(h + M, w->pos, (size_t)M * sizeof *h);
  int32_t *head = h + 2 * M;
  for (int j = 0, i = 0; j < seg->head_count; j++)
    for (int r = 0; r < R; r++) head[i++] = seg->row0 + r * n + seg->head_first + j;
  for (int j = 0; j < n; j++) h[at_s + j] = seg->first_slot + j;
  h[at_s + n] = seg->s->kv.committed;
  h[at_s + n + 1] = seg->first_slot - seg->s->kv.committed; /* base */
  lg_idx idx = {.tok = w->idx_dev, .pos = w->idx_dev + M, .head = w->idx_dev + 2 * M,
                .slots = w->idx_dev + at_s, .lens = w->idx_dev + at_s + n,
                .parents = w->idx_dev + end};
  if (draw) { /* a padded draw's extra nodes get u = 0, guided: drawn, then ignored */
    size_t real = (size_t)draw->n;
    memset(h + at_u, 0, 2 * (size_t)n * sizeof *h);
    memcpy(h + at_u, draw->u, real * sizeof(double));
    memset(h + at_g, 1, (size_t)(n + 3) / 4 * sizeof *h);
    if (draw->guided) memcpy(h + at_g, draw->guided, real);
    idx.spec = *draw;
    idx.spec.n = n;
    idx.spec.u = (const double *)(const void *)(w->idx_dev + at_u);
    idx.spec.guided = (const uint8_t *)(const void *)(w->idx_dev + at_g);
    idx.tokens = w->idx_dev + at_t;
  }
  ops->upload(dev, w->idx_dev, h, (end + (size_t)n_parents + (size_t)n_pad) * sizeof *h);
  return idx;
}

/* All layers over one session's segment, embeddings in w->x: five ops per layer. */
static void lg__run_layers_fused(const lg_gpt *g, const vspec_ops *ops, vspec_dev *dev,
                                 lg_work *w, const lg_seg *seg, const lg_idx *idx,
                                 const vspec_kv_tree_view *tree) {
  vspec_session *s = seg->s;
  int d = g->dim, M = s->rows * seg->n, att_w = g->n_head * g->head_dim;
  for (int l = 0; l < g->n_layer; l++) {
    const lg_layer *W = &g->layers[l];
    vspec_kv_cache kv = {.k = vs_kv_at(&s->kv, s->kv.k, l, 0, 0),
                         .v = vs_kv_at(&s->kv, s->kv.v, l, 0, 0),
                         .rows = s->rows, .n_heads = g->n_head, .kv_heads = g->n_kv_head,
                         .head_dim = g->head_dim, .slots = s->kv.slots};
    ops->norm_qkv_rope(dev, w->x, seg->n, d, W->attention_norm, g->norm_eps, W->wqkv, idx->pos,
                       g->rope_table, &kv, idx->slots, w->qkv);
    ops->tree_attention(dev, w->qkv, &kv, tree, w->att);
    ops->linear_add(dev, w->att, M, att_w, W->wo, d, w->x);
    ops->norm_swiglu(dev, w->x, M, d, W->ffn_norm, g->norm_eps, W->w1, W->w3, g->ffn_hidden,
                     w->ff1);
    ops->linear_add(dev, w->ff1, M, g->ffn_hidden, W->w2, d, w->x);
  }
}

/* ---- the output head ------------------------------------------------------------------- */

/* Each segment's rows of src [rows, width] to its out's features (logits 0) or logits, but
 * for the segments that walked (walked: NULL, none did): a download per segment, or with a
 * host stage (a batch of several sessions) one download per run of consecutive segments that
 * did not walk (one in all where none walked), copied out from there: on a GPU each download
 * is a wait, and a walker's logits are what its walk saved. */
static void lg__out_rows(const vspec_ops *ops, vspec_dev *dev, const float *src, int width,
                         const lg_seg *seg, int count, float *stage, int logits,
                         const int *walked) {
  size_t row = (size_t)width * sizeof(float);
  for (int i = 0, at = 0, run = 0; stage && i <= count; i++) {
    if (i == count || (walked && walked[i])) {
      if (at > run)
        ops->download(dev, stage + (size_t)run * width, src + (size_t)run * width,
                      (size_t)(at - run) * row);
      if (i == count) break;
      run = at + seg[i].head_count * seg[i].s->rows;
    }
    at += seg[i].head_count * seg[i].s->rows;
  }
  for (int i = 0, at = 0; i < count; i++) {
    int k = seg[i].head_count * seg[i].s->rows;
    vspec_forward_out *out = seg[i].out;
    float *dst = !out || (walked && walked[i]) ? NULL : logits ? out->logits : out->features;
    if (dst && stage) memcpy(dst, stage + (size_t)at * width, (size_t)k * row);
    else if (dst) ops->download(dev, dst, src + (size_t)at * width, (size_t)k * row);
    at += k;
  }
}

/* Features and logits of the normed head rows in w->h (the segments' in order) to each
 * segment's `out`: one GEMM over all of them; the walks the segments ask for run where the
 * logits are (lg_walk_segs: their staging is the first segment's session's, a batch's lead)
 * and their logits stay there. stage: NULL, or host room for rows x max(vocab, dim) floats
 * (lg__out_rows). */
void lg_head_out(const lg_gpt *g, const vspec_ops *ops, vspec_dev *dev, lg_work *w,
                 const lg_seg *seg, int count, int rows, float *stage) {
  int logits = 0, feats = 0, walked[LG_MULTI_MAX], kept[LG_MULTI_MAX];
  size_t frow = (size_t)g->dim * sizeof(float);
  for (int i = 0, at = 0; i < count; i++) {
    int k = seg[i].head_count * seg[i].s->rows;
    float *fdev = vs_bk_features_dev(seg[i].out);
    logits |= seg[i].out && seg[i].out->logits;
    feats |= seg[i].out && seg[i].out->features && !fdev;
    /* ABI 1.8: features kept on the device are copied there, not downloaded */
    if ((kept[i] = fdev != NULL)) ops->copy(dev, fdev, w->h + (size_t)at * g->dim, k * frow);
    at += k;
  }
  if (feats) lg__out_rows(ops, dev, w->h, g->dim, seg, count, stage, 0, kept);
  if (!logits) return;
  ops->linear(dev, w->h, rows, g->dim, g->output, g->vocab, NULL, w->logits);
  lg_walk_segs(ops, dev, seg[0].s, w->logits, seg, count, walked);
  lg__out_rows(ops, dev, w->logits, g->vocab, seg, count, stage, 1, walked);
}

/* The ops of a fused forward between its upload and its downloads: embeddings (unless the
 * caller placed them: with_tokens 0), layers and the head of kind `head`. No transfer and
 * nothing by value that changes from step to step: what a graph records. */
static void lg__fused_ops(vspec_session *s, const lg_seg *seg, const lg_idx *idx,
                          int with_tokens, int head) {
  const lg_gpt *g = &s->m->gpt;
  const vspec_ops *ops = s->ops;
  lg_work *w = &s->w;
  int M = s->rows * seg->n, rows = seg->head_count * s->rows;
  if (with_tokens) ops->gather_rows(s->dev, g->tok_embeddings, idx->tok, M, g->dim, w->x);
  /* Caption slots are visible only where the caption is valid (generate.py, emb_masks). */
  vspec_kv_tree_view tree = {.n = seg->n, .n_prefix = s->prefix_dev ? g->n_cond : 0,
                             .lens = idx->lens, .parents = idx->parents,
                             .prefix = s->prefix_dev};
  lg__run_layers_fused(g, ops, s->dev, w, seg, idx, &tree);
  ops->rmsnorm_rows(s->dev, w->x, idx->head, rows, g->dim, g->norm, g->norm_eps, w->h);
  if (head == LG_HEAD_FEATURES) return;
  ops->linear(s->dev, w->h, rows, g->dim, g->output, g->vocab, NULL, w->logits);
  /* the draw on the device: n tokens come back instead of the logits */
  if (head == LG_HEAD_DRAW) ops->sample_tokens(s->dev, w->logits, &idx->spec, idx->tokens);
  /* a draft's: its distributions and tokens stay (lg__fused_results copies the drawn rows) */
  if (head == LG_HEAD_DRAFT)
    ops->draw_probs(s->dev, w->logits, &idx->spec, s->draft_probs, idx->tokens);
}

/* The downloads of a fused forward: what `out` asks of its first `nodes` head nodes (a
 * padded forward's others are ignored). A draft's draw downloads nothing: its drawn rows are
 * copied where the caller keeps them on the device. */
static void lg__fused_results(vspec_session *s, const lg_idx *idx, const lg_seg *seg, int head,
                              int nodes) {
  const lg_gpt *g = &s->m->gpt;
  vspec_forward_out *out = seg->out;
  size_t rows = (size_t)nodes * s->rows;
  float *fdev = vs_bk_features_dev(out);
  if (fdev) s->ops->copy(s->dev, fdev, s->w.h, rows * g->dim * sizeof(float));
  else if (out && out->features)
    s->ops->download(s->dev, out->features, s->w.h, rows * g->dim * sizeof(float));
  /* a walk on the device downloads its result instead of the logits (ABI 1.6) */
  lg_seg one = {.s = s, .n = nodes, .head_count = nodes, .out = out, .token_dev = seg->token_dev};
  int walked = 0;
  if (head == LG_HEAD_LOGITS && !lg_walk_segs(s->ops, s->dev, s, s->w.logits, &one, 1, &walked))
    s->ops->download(s->dev, out->logits, s->w.logits, rows * g->vocab * sizeof(float));
  if (head == LG_HEAD_DRAW) {
    s->ops->download(s->dev, out->tokens, idx->tokens, (size_t)nodes * sizeof(int32_t));
    out->sampled = 1;
  }
  if (head == LG_HEAD_DRAFT) {
    int k = out->draw->n, first = nodes - k;
    s->ops->copy(s->dev, out->draw_tokens, idx->tokens + first, (size_t)k * sizeof(int32_t));
    s->ops->copy(s->dev, out->draw_probs, s->draft_probs + (size_t)first * g->vocab,
                 (size_t)k * g->vocab * sizeof(float));
    out->drawn = 1;
  }
}

/* lg__idx_upload for a forward of head kind `head` whose first n_real nodes are real (the
 * segment may be padded), then the tokens drawn on the device copied into its tokens. */
static lg_idx lg__upload(vspec_session *s, const lg_seg *seg, const int32_t *parents,
                         int n_parents, int n_pad, int head, int n_real) {
  const vspec_forward_out *out = seg->out;
  double u[LG_DRAFT_MAX];
  uint8_t guided[LG_DRAFT_MAX];
  vspec_sample_spec draft;
  const vspec_sample_spec *draw = head == LG_HEAD_DRAW ? out->sample : NULL;
  if (head == LG_HEAD_DRAFT) {
    draft = vs_bk_draft_spec(out->draw, n_real, u, guided);
    draw = &draft;
  }
  lg_idx idx = lg__idx_upload(s->ops, s->dev, &s->w, s->rows * seg->n, seg, parents, n_parents,
                              n_pad, draw);
  if (head == LG_HEAD_DRAFT && !out->draw->u) idx.spec.u = NULL; /* each row's first maximum */
  vs_bk_patch_tokens(s->ops, s->dev, s->w.tok, seg->token_dev, s->rows, seg->n, seg->n,
                  (int32_t *)(uintptr_t)idx.tok);
  return idx;
}

/* One session's segment through the fused path, eagerly: upload, ops, downloads. */
static void lg__forward_fused(vspec_session *s, const lg_seg *seg, const int32_t *parents,
                              int with_tokens) {
  int n_parents = seg->first_slot - s->kv.committed + seg->n;
  int head = lg__head_kind(s->ops, seg->out, seg->head_count);
  lg_idx idx = lg__upload(s, seg, parents, n_parents, 0, head, seg->n);
  lg__fused_ops(s, seg, &idx, with_tokens, head);
  lg__fused_results(s, &idx, seg, head, seg->head_count);
}

/* ---- graphs (ABI 1.5) ---------------------------------------------------------------------- */

/* The bucket of a forward of n nodes: index k, the smallest with 2^k >= n, and its node count
 * 2^k, at most the session's work rows (s->max_nodes). -1 when n is past the last bucket. */
static int lg__bucket(const vspec_session *s, int n, int *nodes) {
  int k = 0;
  while ((1 << k) < n) k++;
  if (k >= LG_GRAPH_BUCKETS) return -1;
  *nodes = (1 << k) < s->max_nodes ? 1 << k : s->max_nodes;
  return k;
}

int lg_graph_pad_room(int max_nodes, int work_nodes) {
  vspec_session probe = {.max_nodes = work_nodes};
  int room = 0, b;
  for (int n = 1; n <= max_nodes && lg__bucket(&probe, n, &b) >= 0; n++)
    if (b - n > room) room = b - n;
  return room;
}

/* w->tok and w->pos of a staged segment of n nodes per row (row-major, (row, node)) spread to
 * nodes per row, the extra nodes padding: token 0 at position 0 (both valid, so a padding
 * row computes finite numbers nobody reads). From the last row down, so that nothing is
 * overwritten before it moved. */
static void lg__pad_rows(lg_work *w, int rows, int n, int nodes) {
  for (int r = rows - 1; r >= 0; r--) {
    for (int i = n - 1; i >= 0; i--) {
      w->tok[r * nodes + i] = w->tok[r * n + i];
      w->pos[r * nodes + i] = w->pos[r * n + i];
    }
    for (int i = n; i < nodes; i++) w->tok[r * nodes + i] = 0, w->pos[r * nodes + i] = 0;
  }
}

/* Whether a graph drawing with `a` draws as `b` would: the spec's scalars are recorded. */
static int lg__same_draw(const vspec_sample_spec *a, const vspec_sample_spec *b) {
  return a->rows == b->rows && a->vocab == b->vocab && a->top_k == b->top_k &&
         a->cfg_scale == b->cfg_scale && a->temperature == b->temperature &&
         a->top_p == b->top_p && !a->u == !b->u;
}

/* The graph of (bucket k, head kind) for this forward, recorded now if there is none (or its
 * draw differs); NULL when recording failed: the caller then runs the ops eagerly. A device
 * that could not record an op (VSPEC_ENOTSUP and the like) turns the session's graphs off at
 * its second failure; VSPEC_EBUSY (the recording met a scratch growth or a weight conversion,
 * which the eager run then does) is tried again, up to once per graph and a few. */
static vspec_graph *lg__graph_get(vspec_session *s, int k, int head, const lg_seg *seg,
                                  const lg_idx *idx) {
  lg_graph *gr = &s->graph[k][head];
  if (gr->graph && (head == LG_HEAD_DRAW || head == LG_HEAD_DRAFT) &&
      !lg__same_draw(&gr->draw, &idx->spec)) {
    s->ops->graph_free(s->dev, gr->graph);
    gr->graph = NULL;
  }
  if (gr->graph) return gr->graph;
  int rc = s->ops->graph_begin(s->dev);
  if (rc == VSPEC_OK) {
    lg__fused_ops(s, seg, idx, 1, head); /* recorded, not run */
    rc = s->ops->graph_end(s->dev, &gr->graph);
  }
  if (rc != VSPEC_OK) {
    gr->graph = NULL;
    if (rc == VSPEC_EBUSY ? ++s->graph_busy > LG_GRAPH_BUCKETS * LG_GRAPH_HEADS + 4
                          : ++s->graph_failures >= 2)
      s->graphs = LG_GRAPHS_OFF;
    return NULL;
  }
  gr->draw = idx->spec;
  return gr->graph;
}

/* A tree forward padded to its bucket, through the session's graph for that shape: one
 * upload, one graph launch, the downloads. VSPEC_ENOTSUP when it does not fit a bucket (the
 * caller runs it unpadded). With LG_GRAPHS_PAD the padded ops run eagerly instead: the
 * reference a test compares replay with, bit for bit. */
static int lg__forward_graph(vspec_session *s, const lg_seg *real) {
  int n = real->n, nodes, k = lg__bucket(s, n, &nodes);
  if (k < 0 || nodes < n || real->first_slot + nodes > s->kv.slots) return VSPEC_ENOTSUP;
  int head = lg__head_kind(s->ops, real->out, n), base = real->first_slot - s->kv.committed;
  lg__pad_rows(&s->w, s->rows, n, nodes);
  lg_seg seg = *real;
  seg.n = seg.head_count = nodes;
  lg_idx idx = lg__upload(s, &seg, s->kv.parents, base + n, nodes - n, head, n);
  vspec_graph *graph = s->graphs == LG_GRAPHS_ON ? lg__graph_get(s, k, head, &seg, &idx) : NULL;
  int rc = graph ? s->ops->graph_launch(s->dev, graph) : VSPEC_ENOENT;
  if (graph && rc == VSPEC_ENOENT) { /* stale (ops.h): recorded again next time */
    s->ops->graph_free(s->dev, graph);
    s->graph[k][head].graph = NULL;
  }
  if (rc != VSPEC_OK) lg__fused_ops(s, &seg, &idx, 1, head);
  lg__fused_results(s, &idx, real, head, n);
  return VSPEC_OK;
}

void lg_graphs_free(vspec_session *s) {
  for (int k = 0; k < LG_GRAPH_BUCKETS; k++)
    for (int h = 0; h < LG_GRAPH_HEADS; h++)
      if (s->graph[k][h].graph) {
        s->ops->graph_free(s->dev, s->graph[k][h].graph);
        s->graph[k][h].graph = NULL;
      }
}

/* ---- the backend entry points ------------------------------------------------------------ */

int lg_prefill(vspec_session *s, vspec_forward_out *out, char *err, size_t errlen) {
  const lg_gpt *g = &s->m->gpt;
  if (s->prefilled) {
    snprintf(err, errlen, "prefill called twice on one session");
    return VSPEC_EINVAL;
  }
  int T = g->n_cond, R = s->rows, d = g->dim;
  /* cond_embed is [rows, T, dim], the (row, node) order of the work buffers */
  s->ops->copy(s->dev, s->w.x, s->cond_embed, (size_t)R * T * d * sizeof(float));
  for (int r = 0; r < R; r++)
    for (int i = 0; i < T; i++) s->w.pos[r * T + i] = i;
  s->kv.committed = 0;
  s->kv.n_pending = 0;
  /* Logits at the last condition position predict image token 0 (generate.py, prefill). */
  lg_seg seg = {.s = s, .n = T, .first_slot = 0, .row0 = 0, .head_first = T - 1,
                .head_count = 1, .out = out};
  if (s->fused) {
    /* Causal over the condition positions: the chain 0 <- 1 <- ... <- T-1, with the caption
     * rule of vspec_kv_tree_view (generate.py: mask * (1 - I) + I). */
    /* past the integers lg__idx_upload writes before it moves the parents to their place */
    int32_t *chain = s->w.idx_host + 3 * s->w.rows;
    for (int i = 0; i < T; i++) chain[i] = i - 1;
    memset(s->w.tok, 0, (size_t)R * T * sizeof(int32_t));
    lg__forward_fused(s, &seg, chain, 0);
  } else {
    for (int i = 0; i < T; i++)
      for (int j = 0; j < T; j++)
        s->mask[(size_t)i * T + j] = (uint8_t)(j <= i && (s->cond_valid[j] || j == i));
    lg_run_layers(g, s->ops, s->dev, &s->w, &seg, 1, R * T);
    lg_head_out(g, s->ops, s->dev, &s->w, &seg, 1,
                lg_head_rows(g, s->ops, s->dev, &s->w, &seg, 1), NULL);
  }
  s->kv.committed = T;
  s->prefilled = 1;
  return VSPEC_OK;
}

/* Adds a batch's nodes to the session's pending tree and writes their tokens (w->tok) and
 * positions (w->pos) from row `row0` on; fills the segment. */
int lg_stage_seg(vspec_session *s, const vspec_forward_batch *b, vspec_forward_out *out,
                 lg_work *w, int row0, lg_seg *seg, char *err, size_t errlen) {
  const lg_gpt *g = &s->m->gpt;
  int n = b->n_nodes, R = s->rows;
  if (!s->prefilled) {
    snprintf(err, errlen, "forward before prefill");
    return VSPEC_EINVAL;
  }
  /* Position T+N-1 (the last image token) is the last one the RoPE table covers; the
   * reference never feeds it, but a caller that does gets a valid answer. */
  int base, rc = vs_kv_tree_add(&s->kv, b, g->vocab, g->n_cond + g->n_image - 1, &base, err,
                                errlen);
  if (rc) return rc;
  int L = s->kv.committed;
  for (int r = 0; r < R; r++)
    for (int i = 0; i < n; i++) {
      w->tok[row0 + r * n + i] = b->tokens[i];
      w->pos[row0 + r * n + i] = L + s->kv.depth[base + i];
    }
  *seg = (lg_seg){.s = s, .n = n, .first_slot = L + base, .row0 = row0, .head_first = 0,
                  .head_count = n, .out = out, .token_dev = vs_bk_token_dev(b)};
  return VSPEC_OK;
}

int lg_forward(vspec_session *s, const vspec_forward_batch *b, vspec_forward_out *out, char *err,
               size_t errlen) {
  int drafts = vs_bk_drafts(s->ops, out, b->n_nodes, LG_DRAFT_MAX);
  if ((vs_bk_token_dev(b) || drafts || vs_bk_features_dev(out)) && !s->fused) {
    snprintf(err, errlen, "tokens or features kept on the device need the fused ops, which "
             "device '%s' lacks", s->ops->name);
    return VSPEC_ENOTSUP;
  }
  if (drafts && !lg_draft_room(s)) {
    snprintf(err, errlen, "out of device memory for a draft's distributions");
    return VSPEC_ENOMEM;
  }
  lg_seg seg;
  int rc = lg_stage_seg(s, b, out, &s->w, 0, &seg, err, errlen);
  if (rc) return rc;
  if (s->fused) {
    if (s->graphs == LG_GRAPHS_OFF || lg__forward_graph(s, &seg) != VSPEC_OK)
      lg__forward_fused(s, &seg, s->kv.parents, 1);
    return VSPEC_OK;
  }
  const lg_gpt *g = &s->m->gpt;
  lg_unfused_inputs(&seg, &s->w, s->ops, s->dev);
  lg_run_layers(g, s->ops, s->dev, &s->w, &seg, 1, s->rows * seg.n);
  lg_head_out(g, s->ops, s->dev, &s->w, &seg, 1,
              lg_head_rows(g, s->ops, s->dev, &s->w, &seg, 1), NULL);
  return VSPEC_OK;
}

int lg_commit(vspec_session *s, const int32_t *path, int32_t n, char *err, size_t errlen) {
  const lg_gpt *g = &s->m->gpt;
  return vs_kv_tree_commit(&s->kv, path, n, g->n_cond + g->n_image, err, errlen);
}
