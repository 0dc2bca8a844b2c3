/*
 * The EAGLE head's forward on the fused ops of ABI 1.4, eager or through ABI 1.5 graphs.
 *
 * One upload carries everything that changes from step to step (the host features, tokens,
 * positions, cache slots, the tree's lengths and parents, and the row indices of every
 * gather), then 3 ops plus 5 per layer and 1-3 for the keep and the head, then a download
 * each of the features and logits asked for. The rows run in (row, node) order, as attention
 * wants them; a last gather puts them in the ABI's (node, row) order.
 *
 * With graphs (the load parameter graphs=, eagle.c) a forward of n nodes is padded to its
 * bucket of 2^k nodes, as llamagen pads its tree forwards (gpt_forward.c): padding nodes
 * take token 0 at position 0, parent -1 (no real node has them as ancestors, so none sees
 * them), their own embedding as their feature, cache slots after the real ones, and their
 * outputs are never downloaded nor kept. Every device pointer the ops take then depends on
 * the shape alone (bucket, CFG rows, head kind), so the first forward of a shape records the
 * ops between the upload and the downloads and every later one replays them: one upload, one
 * graph launch, the downloads.
 *
 * The one op of the eager path whose argument depends on the step is the copy of the outputs
 * into `keep` at the batch's first pending index (a pointer offset by base). A padded forward
 * writes keep instead with two gathers by uploaded indices: keep to block 1, then every row
 * of keep back from there or, for the batch's real nodes, from x (block 2, right after block
 * 1, so that one gather's source holds both). That moves all of keep twice a step (rows x
 * max_nodes x dim floats) where the eager copy moves the new rows once: the price of a step
 * that replays, small beside the layers' weights.
 */
#include <string.h>

#include "eg_internal.h"

/* Device copies of a fused forward's integers, from one upload. */
typedef struct eg_idx {
  const int32_t *tok, *pos, *outr, *slots, *lens, *fidx, *ident, *kidx, *parents;
  vspec_sample_spec draw; /* EG_HEAD_DRAFT: the draw over every node (eg_draw_upload) */
} eg_idx;

/* ABI 1.8: the input features of the nodes whose feature_row names a row of the batch's
 * feature_table (another session's features on the device: the target's) into their rows of
 * block 3, where eg_stage's gather takes them: a copy3d per run of consecutive rows. */
static void eg_table_rows(vspec_session *s, const vspec_forward_batch *b, const int32_t *src,
                          int nodes) {
  int R = s->rows;
  size_t row = (size_t)s->m->dim * sizeof(float);
  const int32_t *frow = b->feature_row;
  char *dst = (char *)(void *)eg_block(s, 3);
  const char *table = (const char *)(const void *)b->feature_table;
  for (int i = 0; i < b->n_nodes;) {
    int len = 1;
    if ((src && src[i] >= 0) || frow[i] < 0) {
      i++;
      continue;
    }
    while (i + len < b->n_nodes && !(src && src[i + len] >= 0) && frow[i + len] == frow[i] + len)
      len++;
    /* row r of node i + t sits at block 3's row r nodes + i + t; the table is [*, rows, dim] */
    s->ops->copy3d(s->dev, dst + (size_t)i * row, (size_t)nodes * row, row,
                   table + (size_t)frow[i] * R * row, row, (size_t)R * row, row, R, len);
    i += len;
  }
}

/* Stages and uploads a forward of the batch's n nodes padded to `nodes` (n: none), its nodes
 * pending from base on, in one transfer: the host features [rows * nodes, dim] (block 3; left
 * out when every input comes from keep), then the integers: tokens, positions and output rows
 * [rows * nodes] each, cache slots [nodes], lengths (committed, base), the input gather's
 * rows [2 rows nodes] (a node's embedding, then its feature: a row of keep, of the uploaded
 * features, or, for padding, its embedding again), with `padded` the keep rewrite's rows
 * (identity [F], then each row of keep's source [F]), and last the tree's parents [base +
 * nodes], the one part whose length changes with the step: no pointer depends on base. */
static eg_idx eg_stage(vspec_session *s, const vspec_forward_batch *b, const int32_t *src,
                       int base, int nodes, int padded) {
  const vspec_model *m = s->m;
  int n = b->n_nodes, R = s->rows, d = m->dim, L = s->kv.committed, M = R * nodes;
  int mx = s->max_nodes, F = R * mx, host = 0;
  const int32_t *frow = vs_bk_feature_row(b);
  size_t row = (size_t)d * sizeof(float), fb = (size_t)M * row;
  float *feat = (float *)(void *)s->stage_host;
  int32_t *h = (int32_t *)(void *)(s->stage_host + fb);
  size_t at_pos = (size_t)M, at_out = 2 * (size_t)M, at_slot = 3 * (size_t)M;
  size_t at_len = at_slot + (size_t)nodes, at_f = at_len + 2, at_id = at_f + 2 * (size_t)M;
  size_t at_k = at_id + (padded ? (size_t)F : 0), at_par = at_k + (padded ? (size_t)F : 0);
  for (int r = 0; r < R; r++)
    for (int i = 0; i < nodes; i++) {
      int j = r * nodes + i, real = i < n, own = real && (!src || src[i] < 0);
      int tab = own && frow && frow[i] >= 0, feed = own && !tab; /* tab: eg_table_rows */
      if (feed) memcpy(feat + (size_t)j * d, b->features + ((size_t)i * R + r) * d, row);
      host |= feed;
      h[j] = real ? b->tokens[i] : 0;
      h[at_pos + j] = real ? m->n_cond + L + s->kv.depth[base + i] : 0;
      h[at_out + (size_t)i * R + r] = j;
      h[at_f + 2 * (size_t)j] = F + j; /* block 1: its embedding */
      h[at_f + 2 * (size_t)j + 1] = !real ? F + j : own ? 3 * F + j : r * mx + src[i];
    }
  for (int i = 0; i < nodes; i++) h[at_slot + i] = L + base + i;
  h[at_len] = L;
  h[at_len + 1] = base;
  for (int j = 0; padded && j < F; j++) h[at_id + j] = j;
  for (int r = 0; padded && r < R; r++) /* relative to block 1; x is block 2 */
    for (int p = 0; p < mx; p++)
      h[at_k + (size_t)r * mx + p] = p >= base && p < base + n ? F + r * nodes + p - base
                                                               : r * mx + p;
  memcpy(h + at_par, s->kv.parents, (size_t)(base + n) * sizeof *h);
  for (int i = n; i < nodes; i++) h[at_par + base + i] = -1;
  char *up = (char *)(void *)eg_block(s, 3);
  size_t ints = (at_par + (size_t)base + (size_t)nodes) * sizeof *h;
  if (host) s->ops->upload(s->dev, up, s->stage_host, fb + ints);
  else s->ops->upload(s->dev, up + fb, h, ints);
  const int32_t *dh = (const int32_t *)(const void *)(up + fb);
  /* ABI 1.8: tokens drawn on the device, and the target's features from its table */
  vs_bk_patch_tokens(s->ops, s->dev, h, vs_bk_token_dev(b), R, n, nodes, (int32_t *)(void *)(up + fb));
  if (frow) eg_table_rows(s, b, src, nodes);
  return (eg_idx){.tok = dh, .pos = dh + at_pos, .outr = dh + at_out, .slots = dh + at_slot,
                  .lens = dh + at_len, .fidx = dh + at_f, .ident = dh + at_id,
                  .kidx = dh + at_k, .parents = dh + at_par};
}

/* The ops of a fused forward of `nodes` nodes per CFG row between its upload and its
 * downloads. keep_at: the pending index of the first node, where the eager path copies the
 * outputs into keep; -1 for a padded forward, which rewrites keep by the uploaded indices
 * instead. With keep_at -1 nothing by value changes from step to step: what a graph records
 * (concat(E[x], f) is one gather over the area's blocks into cat viewed as [2M, dim]). */
static void eg_fused_ops(vspec_session *s, const eg_idx *idx, int nodes, int keep_at,
                         int head) {
  const vspec_model *m = s->m;
  const vspec_ops *ops = s->ops;
  vspec_dev *dev = s->dev;
  int R = s->rows, d = m->dim, M = R * nodes, F = R * s->max_nodes;
  size_t row = (size_t)d * sizeof(float);
  ops->gather_rows(dev, m->embed, idx->tok, M, d, eg_block(s, 1));
  ops->gather_rows(dev, eg_block(s, 0), idx->fidx, 2 * M, d, s->cat);
  ops->linear(dev, s->cat, M, 2 * d, m->fc_w, d, m->fc_b, s->x);
  vspec_kv_tree_view tree = {.n = nodes, .lens = idx->lens, .parents = idx->parents};
  for (int l = 0; l < m->n_layer; l++) {
    const eg_layer *W = &m->layers[l];
    vspec_kv_cache kv = {.k = vs_kv_at(&s->kv, s->kv.k, l, 0, 0),
                         .v = vs_kv_at(&s->kv, s->kv.v, l, 0, 0), .rows = R,
                         .n_heads = m->n_head, .kv_heads = m->n_head, .head_dim = m->head_dim,
                         .slots = s->kv.slots};
    /* layer 0 has no input norm (NULL) */
    ops->norm_qkv_rope(dev, s->x, nodes, d, W->input_norm, m->norm_eps, W->wqkv, idx->pos,
                       m->rope, &kv, idx->slots, s->qkv);
    ops->tree_attention(dev, s->qkv, &kv, &tree, s->att);
    ops->linear_add(dev, s->att, M, d, W->wo, d, s->x);
    ops->norm_swiglu(dev, s->x, M, d, W->post_norm, m->norm_eps, W->gate, W->up, m->ffn, s->ff1);
    ops->linear_add(dev, s->ff1, M, m->ffn, W->down, d, s->x);
  }
  /* what later forwards' feature_src may name (nothing crosses to the host) */
  if (keep_at >= 0) {
    ops->copy3d(dev, s->keep + (size_t)keep_at * d, row, (size_t)s->max_nodes * row, s->x, row,
                (size_t)nodes * row, row, nodes, R);
  } else {
    ops->gather_rows(dev, s->keep, idx->ident, F, d, eg_block(s, 1));
    ops->gather_rows(dev, eg_block(s, 1), idx->kidx, F, d, s->keep);
  }
  const float *f = s->x;
  if (R > 1 && head != EG_HEAD_NONE) {
    ops->gather_rows(dev, s->x, idx->outr, M, d, s->h);
    f = s->h;
  }
  if (head == EG_HEAD_LOGITS || head == EG_HEAD_DRAFT)
    ops->linear(dev, f, M, d, m->output, m->vocab, NULL, s->logits);
  /* a draft's draw: distributions and tokens stay (eg_results copies the drawn rows) */
  if (head == EG_HEAD_DRAFT)
    ops->draw_probs(dev, s->logits, &idx->draw, s->draft_probs, s->draft_tok);
}

int eg_draft_room(vspec_session *s) {
  if (s->draft_probs) return 1;
  size_t mx = (size_t)s->max_nodes;
  s->draft_probs = s->ops->alloc(s->dev, mx * s->m->vocab * sizeof(float));
  s->draft_tok = s->ops->alloc(s->dev, mx * sizeof(int32_t));
  s->draw_dev = s->ops->alloc(s->dev, EG_DRAW_BYTES(mx));
  s->draw_host = s->host->calloc(EG_DRAW_BYTES(mx), 1);
  return s->draft_probs && s->draft_tok && s->draw_dev && s->draw_host;
}

/* A draft's draw (vspec_forward_out.draw, over the last draw->n of the n real nodes) as a
 * draw over all `nodes`: its uniforms and guidance bytes in one upload to draw_dev, at
 * places that depend on the session alone (what a graph records). */
static vspec_sample_spec eg_draw_upload(vspec_session *s, const vspec_sample_spec *draw, int n,
                                        int nodes) {
  size_t mx = (size_t)s->max_nodes;
  double *u = (double *)(void *)s->draw_host;
  uint8_t *g = (uint8_t *)s->draw_host + mx * sizeof(double);
  vspec_sample_spec sp = vs_bk_draft_spec(draw, n, u, g);
  memset(u + n, 0, (size_t)(nodes - n) * sizeof *u);
  memset(g + n, 1, (size_t)(nodes - n));
  s->ops->upload(s->dev, s->draw_dev, s->draw_host, EG_DRAW_BYTES(mx));
  sp.n = nodes;
  sp.u = draw->u ? (const double *)(const void *)s->draw_dev : NULL; /* NULL: first maximum */
  sp.guided = (const uint8_t *)s->draw_dev + mx * sizeof(double);
  return sp;
}

/* The downloads of a fused forward: what `out` asks of its first n nodes (a padded
 * forward's others are ignored). */
static void eg_results(vspec_session *s, vspec_forward_out *out, int n, int head) {
  size_t rows = (size_t)n * s->rows, V = (size_t)s->m->vocab;
  const float *f = s->rows > 1 ? s->h : s->x;
  float *fdev = vs_bk_features_dev(out);
  if (head != EG_HEAD_NONE && fdev)
    s->ops->copy(s->dev, fdev, f, rows * s->m->dim * sizeof(float));
  else if (head != EG_HEAD_NONE && out->features)
    s->ops->download(s->dev, out->features, f, rows * s->m->dim * sizeof(float));
  if (head == EG_HEAD_LOGITS)
    s->ops->download(s->dev, out->logits, s->logits, rows * V * sizeof(float));
  if (head == EG_HEAD_DRAFT) { /* nothing comes to the host */
    int k = out->draw->n, first = n - k;
    s->ops->copy(s->dev, out->draw_tokens, s->draft_tok + first, (size_t)k * sizeof(int32_t));
    s->ops->copy(s->dev, out->draw_probs, s->draft_probs + (size_t)first * V,
                 (size_t)k * V * sizeof(float));
    out->drawn = 1;
  }
}

/* ---- graphs (ABI 1.5) ---------------------------------------------------------------------- */

/* The bucket of a forward of n nodes: index k, the smallest with 2^k >= n, and its node count
 * 2^k, at most the session's max_nodes (its work rows). -1 when n is past the last bucket. */
static int eg_bucket(int max_nodes, int n, int *nodes) {
  int k = 0;
  while ((1 << k) < n) k++;
  if (k >= EG_GRAPH_BUCKETS) return -1;
  *nodes = (1 << k) < max_nodes ? 1 << k : max_nodes;
  return k;
}

int eg_graph_pad_room(int max_nodes) {
  int room = 0, b;
  for (int n = 1; n <= max_nodes && eg_bucket(max_nodes, n, &b) >= 0; n++)
    if (b - n > room) room = b - n;
  return room;
}

/* The graph of (bucket k, head kind) for this forward, recorded now if there is none; NULL
 * when recording failed: the caller then runs the ops eagerly. A device that could not
 * record an op (VSPEC_ENOTSUP and the like) turns the session's graphs off at its second
 * failure; VSPEC_EBUSY (the recording met a scratch growth or a weight conversion, which the
 * eager run then does) is tried again, up to once per graph and a few. */
static vspec_graph *eg_graph_get(vspec_session *s, int k, int head, const eg_idx *idx,
                                 int nodes) {
  vspec_graph **g = &s->graph[k][head];
  if (*g) return *g;
  int rc = s->ops->graph_begin(s->dev);
  if (rc == VSPEC_OK) {
    eg_fused_ops(s, idx, nodes, -1, head); /* recorded, not run */
    rc = s->ops->graph_end(s->dev, g);
  }
  if (rc != VSPEC_OK) {
    *g = NULL;
    if (rc == VSPEC_EBUSY ? ++s->graph_busy > EG_GRAPH_BUCKETS * EG_GRAPH_HEADS + 4
                          : ++s->graph_failures >= 2)
      s->graphs = EG_GRAPHS_OFF;
    return NULL;
  }
  return *g;
}

/* A forward padded to its bucket, through the session's graph for that shape: one upload,
 * one graph launch, the downloads. VSPEC_ENOTSUP when it does not fit a bucket (the caller
 * runs it unpadded). With EG_GRAPHS_PAD the padded ops run eagerly instead: the reference a
 * test compares replay with, bit for bit. */
static int eg_forward_graph(vspec_session *s, const vspec_forward_batch *b, const int32_t *src,
                            int base, vspec_forward_out *out, int head) {
  int n = b->n_nodes, nodes, k = eg_bucket(s->max_nodes, n, &nodes);
  if (k < 0 || nodes < n || s->kv.committed + base + nodes > s->kv.slots) return VSPEC_ENOTSUP;
  eg_idx idx = eg_stage(s, b, src, base, nodes, 1);
  if (head == EG_HEAD_DRAFT) idx.draw = eg_draw_upload(s, out->draw, n, nodes);
  vspec_graph *graph = s->graphs == EG_GRAPHS_ON ? eg_graph_get(s, k, head, &idx, nodes) : NULL;
  int rc = graph ? s->ops->graph_launch(s->dev, graph) : VSPEC_ENOENT;
  if (graph && rc == VSPEC_ENOENT) { /* stale (ops.h): recorded again next time */
    s->ops->graph_free(s->dev, graph);
    s->graph[k][head] = NULL;
  }
  if (rc != VSPEC_OK) eg_fused_ops(s, &idx, nodes, -1, head);
  eg_results(s, out, n, head);
  return VSPEC_OK;
}

void eg_graphs_free(vspec_session *s) {
  for (int k = 0; k < EG_GRAPH_BUCKETS; k++)
    for (int h = 0; h < EG_GRAPH_HEADS; h++)
      if (s->graph[k][h]) {
        s->ops->graph_free(s->dev, s->graph[k][h]);
        s->graph[k][h] = NULL;
      }
}

void eg_forward_fused(vspec_session *s, const vspec_forward_batch *b, const int32_t *src,
                      int base, vspec_forward_out *out) {
  int head = !out ? EG_HEAD_NONE
             : vs_bk_drafts(s->ops, out, b->n_nodes, s->max_nodes) ? EG_HEAD_DRAFT
             : out->logits ? EG_HEAD_LOGITS
             : out->features || vs_bk_features_dev(out) ? EG_HEAD_FEATURES
                                                        : EG_HEAD_NONE;
  if (s->graphs != EG_GRAPHS_OFF && eg_forward_graph(s, b, src, base, out, head) == VSPEC_OK)
    return;
  eg_idx idx = eg_stage(s, b, src, base, b->n_nodes, 0);
  if (head == EG_HEAD_DRAFT) idx.draw = eg_draw_upload(s, out->draw, b->n_nodes, b->n_nodes);
  eg_fused_ops(s, &idx, b->n_nodes, base, head);
  eg_results(s, out, b->n_nodes, head);
}
