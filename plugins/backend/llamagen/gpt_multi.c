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
#include <stdatomic.h>
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

/* Words of the batch ops' entries of `count` sessions (every layer's). */
static size_t lg__entry_words(const lg_gpt *g, int count) {
  return (size_t)g->n_layer * count * sizeof(vspec_kv_batch_entry) / sizeof(int32_t);
}

/* The upload's room for the batch ops' entries, in int32 words: lg_forward_multi sizes the
 * workspace with it. */
static size_t lg__batch_ints(const vspec_model *m, const vspec_ops *ops, int count) {
  return lg__batch_ops(m, ops) ? lg__entry_words(&m->gpt, count) : 0;
}

/* Fills the entries at h + at (at 8-byte aligned), from the segments' integers ms. */
static void lg__batch_entries(const lg_work *w, const lg_seg *seg, int count, const lg_mseg *ms,
                              int32_t *h, size_t at, lg_mbatch *mb) {
  const lg_gpt *g = &seg[0].s->m->gpt;
  vspec_kv_batch_entry *e = (vspec_kv_batch_entry *)(void *)(h + at);
  mb->host = e;
  mb->dev = (const vspec_kv_batch_entry *)(const void *)(w->idx_dev + at);
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
}

/* Stages and uploads a batch's integers in one transfer: tokens and positions [M] each, head
 * rows [K], then the batch ops' entries where the device has them (8-byte aligned; mb->host
 * NULL where not), then per segment its cache slots [n], lengths [2] (committed, base) and
 * tree parents [base + n]; lg_forward_multi sizes the workspace for all of it. Everything a
 * batch's ops are called with thus sits at offsets that depend on M, K and the session count
 * alone (the parents' lengths vary from step to step, and come last): a graph recorded for
 * one batch serves every batch of that shape (lg__multi_graph). Returns K. */
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
  size_t at_e = (2 * (size_t)M + (size_t)K + 1) & ~(size_t)1;
  int batch_ops = lg__batch_ops(seg[0].s->m, ops);
  size_t at = at_e + (batch_ops ? lg__entry_words(&seg[0].s->m->gpt, count) : 0);
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
  if (batch_ops) lg__batch_entries(w, seg, count, ms, h, at_e, mb);
  ops->upload(dev, w->idx_dev, h, at * sizeof *h);
  return K;
}

/* A fused batch's trunk, after its upload: the embeddings gathered, per layer every
 * session's norm + QKV + RoPE + KV store and tree attention (each its own cache and tree) and
 * three ops over every row, then the head rows normed. With the batch ops of ABI 1.9 the
 * sessions' attention parts are one op each, 5 ops per layer whatever the sessions (on a GPU
 * the QKV weights read once for all of them); without, 3 + 2 x sessions, where the unfused
 * path takes 12 + 3 x rows. */
static void lg__multi_trunk(const vspec_ops *ops, vspec_dev *dev, lg_work *w, const lg_seg *seg,
                            int count, int M, int K, const lg_mseg *ms, const lg_mbatch *mb) {
  const lg_gpt *g = &seg[0].s->m->gpt;
  int d = g->dim, att_w = g->n_head * g->head_dim;
  int qkv_w = (g->n_head + 2 * g->n_kv_head) * g->head_dim;
  ops->gather_rows(dev, g->tok_embeddings, w->idx_dev, M, d, w->x);
  for (int l = 0; l < g->n_layer; l++) {
    const lg_layer *W = &g->layers[l];
    if (mb->host) {
      vspec_kv_batch kb = {.count = count, .m = M, .max_slots = mb->max_slots,
                           .entries = mb->host + (size_t)l * count,
                           .entries_dev = mb->dev + (size_t)l * count};
      ops->norm_qkv_rope_batch(dev, w->x, d, W->attention_norm, g->norm_eps, W->wqkv,
                               w->idx_dev + M, g->rope_table, &kb, w->qkv);
      ops->tree_attention_batch(dev, w->qkv, &kb, w->att);
    }
    for (int i = 0; i < count && !mb->host; i++) {
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
}

/* ---- lanes: a batch device's workspace and graphs ---------------------------------------- */

/* What a model keeps for the batches one device runs (a server's lane): the batch
 * workspace, grown as needed, the host stage the batch's outputs come down into (one
 * download for the whole batch), and the graphs of its batch shapes. Owned by the model, freed
 * at its unload (lg_lanes_free) by the lane's own device: a session closing on a job's thread
 * never touches a lane that may be recording a batch on another thread. One batch at a time
 * per device (ops.h: a device's ops run in order on one thread). */
typedef struct lg_lane {
  vspec_dev *dev;
  lg_work w;
  float *out;
  size_t out_cap;
  lg_mgraph graph[LG_MULTI_GRAPHS];
  unsigned clock;
  int failures, busy; /* recordings refused, and those that met an allocation or a wait */
} lg_lane;

static void lg__lane_graphs_free(const vspec_host *H, lg_lane *l) {
  for (int i = 0; i < LG_MULTI_GRAPHS; i++) {
    if (l->graph[i].graph) H->dev_ops(l->dev)->graph_free(l->dev, l->graph[i].graph);
    l->graph[i] = (lg_mgraph){0};
  }
}

void lg_lanes_free(vspec_model *m) {
  const vspec_host *H = m->host;
  for (int i = 0; i < LG_LANES; i++) {
    lg_lane *l = atomic_exchange(&m->lanes[i], NULL);
    if (!l) continue;
    lg__lane_graphs_free(H, l);
    lg_work_free(H, H->dev_ops(l->dev), l->dev, &l->w);
    H->free(l->out);
    H->free(l);
  }
}

/* m's lane for dev, made at its first batch; NULL when LG_LANES devices have one already (or
 * out of memory). Lanes of other devices may be made at once on other threads: a slot is
 * taken by compare-and-swap. */
static lg_lane *lg__lane(vspec_model *m, vspec_dev *dev) {
  for (int i = 0; i < LG_LANES; i++) {
    lg_lane *l = atomic_load(&m->lanes[i]);
    if (l && l->dev == dev) return l;
  }
  lg_lane *mine = m->host->calloc(1, sizeof *mine);
  if (!mine) return NULL;
  mine->dev = dev;
  for (int i = 0; i < LG_LANES; i++) {
    lg_lane *expected = NULL;
    if (atomic_compare_exchange_strong(&m->lanes[i], &expected, mine)) return mine;
  }
  m->host->free(mine);
  return NULL;
}

/* The lane's workspace for `rows` rows and `ints` words of integers, and its host stage for
 * `rows` rows of outputs (lg__out_rows), grown as needed (the graphs, which hold the old
 * workspace's pointers, go with it). Returns the stage, or NULL when out of memory. */
static float *lg__lane_room(const vspec_host *H, const lg_gpt *g, lg_lane *l, size_t rows,
                            size_t ints) {
  const vspec_ops *ops = H->dev_ops(l->dev);
  if (rows > l->w.rows || ints > l->w.idx_ints) {
    size_t want = rows > l->w.rows ? rows : l->w.rows;
    size_t want_ints = ints > l->w.idx_ints ? ints : l->w.idx_ints;
    lg__lane_graphs_free(H, l);
    lg_work_free(H, ops, l->dev, &l->w);
    /* and the fused ops' temporaries for that many rows, as a session reserves its own
     * (gpt.c): grown here, not inside a batch (a wait, and every graph made stale) */
    if (lg_work_alloc(H, ops, l->dev, g, want, 0, want_ints, &l->w) ||
        ops->reserve_scratch(l->dev, lg_scratch_bytes(g, want))) {
      lg_work_free(H, ops, l->dev, &l->w);
      return NULL;
    }
  }
  size_t floats = rows * (size_t)(g->vocab > g->dim ? g->vocab : g->dim);
  if (floats == 0) floats = 1;
  if (floats > l->out_cap) {
    H->free(l->out);
    l->out_cap = 0;
    if (!(l->out = H->alloc(floats * sizeof(float)))) return NULL;
    l->out_cap = floats;
  }
  return l->out;
}

/* ---- graphs of batches (ABI 1.5) --------------------------------------------------------- */

/* The lane's entry for this shape, or a new one in the least recently used slot (its graph
 * freed); *fresh says which. */
static lg_mgraph *lg__mgraph_entry(const vspec_host *H, lg_lane *l, int count, int M, int K,
                                   int max_slots, int *fresh) {
  lg_mgraph *victim = &l->graph[0];
  *fresh = 0;
  for (int i = 0; i < LG_MULTI_GRAPHS; i++) {
    lg_mgraph *e = &l->graph[i];
    if (e->count == count && e->M == M && e->K == K && e->max_slots == max_slots) {
      e->last = ++l->clock;
      return e;
    }
    if (!e->count || (victim->count && e->last < victim->last)) victim = e;
  }
  if (victim->graph) H->dev_ops(l->dev)->graph_free(l->dev, victim->graph);
  *victim = (lg_mgraph){.count = count, .M = M, .K = K, .max_slots = max_slots,
                        .last = ++l->clock};
  *fresh = 1;
  return victim;
}

/* The trunk through the lane's graph for this batch's shape: recorded the second time the
 * shape comes (a shape seen once, as a server's batches change while jobs come and go, is not
 * worth a recording), launched from then on. 1 when the trunk ran so, 0 when the caller runs
 * it eagerly: graphs off (the lead session's graphs=, VSPEC_GRAPHS; multi_graphs=off), a
 * batch without the batch ops (their per-session arguments would be baked in), a first
 * sighting, or a failed recording. A device that could not record an op turns the lane's
 * graphs off at its second failure; VSPEC_EBUSY (a scratch growth or a weight conversion met
 * while recording, which the eager run then does) is tried again, a few times. */
static int lg__multi_graph(const vspec_ops *ops, lg_lane *l, const lg_seg *seg, int count, int M,
                           int K, const lg_mseg *ms, const lg_mbatch *mb) {
  const vspec_session *lead = seg[0].s;
  if (lead->graphs != LG_GRAPHS_ON || !lead->m->multi_graphs || !mb->host ||
      !vspec_has_graphs(ops) || l->failures >= 2 || l->busy > 2 * LG_MULTI_GRAPHS)
    return 0;
  int fresh;
  lg_mgraph *e = lg__mgraph_entry(lead->host, l, count, M, K, mb->max_slots, &fresh);
  if (fresh) return 0;
  if (!e->graph) {
    int rc = ops->graph_begin(l->dev);
    if (rc == VSPEC_OK) {
      lg__multi_trunk(ops, l->dev, &l->w, seg, count, M, K, ms, mb); /* recorded, not run */
      rc = ops->graph_end(l->dev, &e->graph);
    }
    if (rc != VSPEC_OK) {
      e->graph = NULL;
      if (rc == VSPEC_EBUSY) l->busy++;
      else l->failures++;
      return 0;
    }
  }
  int rc = ops->graph_launch(l->dev, e->graph);
  if (rc == VSPEC_ENOENT) { /* stale (ops.h): the scratch it holds was freed; again next time */
    ops->graph_free(l->dev, e->graph);
    e->graph = NULL;
  }
  return rc == VSPEC_OK;
}

/* A batch on the fused ops: one upload, the tokens drawn on the device patched in, the trunk
 * (through a graph where lg__multi_graph can), then the head. */
static void lg__forward_multi_fused(const vspec_ops *ops, lg_lane *l, const lg_seg *seg,
                                    int count, int M, float *stage) {
  const lg_gpt *g = &seg[0].s->m->gpt;
  vspec_dev *dev = l->dev;
  lg_work *w = &l->w;
  lg_mseg ms[LG_MULTI_MAX];
  lg_mbatch mb;
  int K = lg__multi_upload(ops, dev, w, seg, count, M, ms, &mb);
  for (int i = 0; i < count; i++) /* tokens drawn on the device (ABI 1.8) */
    vs_bk_patch_tokens(ops, dev, w->tok + seg[i].row0, seg[i].token_dev, seg[i].s->rows,
                       seg[i].n, seg[i].n, w->idx_dev + seg[i].row0);
  if (!lg__multi_graph(ops, l, seg, count, M, K, ms, &mb))
    lg__multi_trunk(ops, dev, w, seg, count, M, K, ms, &mb);
  lg_head_out(g, ops, dev, w, seg, count, K, stage);
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
  /* tokens, positions and head rows, the word that aligns the entries, the entries */
  ints += 3 * rows + 1 + (fused ? lg__batch_ints(lead->m, ops, count) : 0);
  lg_lane *lane = lg__lane(lead->m, dev);
  if (!lane) { /* the caller runs the sessions one by one (plugin.h, forward_multi) */
    snprintf(err, errlen, "forward_multi: batches of this model already run on %d devices",
             LG_LANES);
    return VSPEC_EINVAL;
  }
  float *stage = lg__lane_room(H, g, lane, rows, ints);
  if (!stage) {
    snprintf(err, errlen, "out of memory for a batch of %zu rows", rows);
    return VSPEC_ENOMEM;
  }
  lg_seg seg[LG_MULTI_MAX];
  int row0 = 0, pending[LG_MULTI_MAX];
  for (int i = 0; i < count; i++) {
    char inner[256];
    pending[i] = bs[i]->append ? ss[i]->kv.n_pending : 0;
    int rc = lg_stage_seg(ss[i], bs[i], outs[i], &lane->w, row0, &seg[i], inner,
                          sizeof inner);
    if (rc) {
      /* Sessions staged before this one would keep new pending nodes without keys and
       * values: take them back (an appending batch keeps what was pending before it). */
      for (int j = 0; j < i; j++) ss[j]->kv.n_pending = pending[j];
      snprintf(err, errlen, "forward_multi: session %d: %s", i, inner);
      return rc;
    }
    if (!fused) lg_unfused_inputs(&seg[i], &lane->w, ops, dev);
    row0 += ss[i]->rows * seg[i].n;
  }
  /* a batch of one downloads straight into its out, as a forward does */
  if (count == 1) stage = NULL;
  if (fused) {
    lg__forward_multi_fused(ops, lane, seg, count, row0, stage);
    return VSPEC_OK;
  }
  lg_run_layers(g, ops, dev, &lane->w, seg, count, row0);
  lg_head_out(g, ops, dev, &lane->w, seg, count,
              lg_head_rows(g, ops, dev, &lane->w, seg, count), stage);
  return VSPEC_OK;
}

