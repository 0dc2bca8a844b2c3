/*
 * kernels/cpu/cpu_graph.c - ABI 1.5 graphs on the CPU (include/vspec/ops.h, graph_begin):
 * recording and replay, with CUDA's semantics.
 *
 * The CPU gains nothing from a graph (an op costs nanoseconds to issue); graphs are here to
 * check the code that records them. Between graph_begin and graph_end each recordable op
 * appends its arguments to a list, copies of the structs it takes by pointer included, and
 * runs nothing, as cudaStreamBeginCapture records kernels without launching them; a launch
 * runs the list. A backend that baked a per-step value into an op's arguments (a count, a
 * host array, a field of a struct) would replay a stale value here exactly as a CUDA graph
 * would, and a test comparing replay with eager execution sees different bits. Recordable
 * are the ops a fused forward issues (the ABI 1.4 fused ops and `linear`, the head) and a
 * fused cross-job batch's (the ABI 1.9 batch ops); every
 * other op refuses while recording (VS_CPU_UNRECORDED, cpu_dev.h), which fails the recording
 * with VSPEC_ENOTSUP so that the caller runs its ops eagerly, as a failed capture would.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_dev.h"

enum {
  REC_LINEAR,
  REC_GATHER_ROWS,
  REC_RMSNORM_ROWS,
  REC_LINEAR_ADD,
  REC_NORM_SWIGLU,
  REC_NORM_QKV_ROPE,
  REC_TREE_ATTENTION,
  REC_SAMPLE_TOKENS,
  REC_DRAW_PROBS,
  REC_NORM_QKV_ROPE_BATCH,
  REC_TREE_ATTENTION_BATCH
};

/* One recorded call: the pointers and scalars it was called with, by position in its
 * signature (rec_run says which is which), and the structs it took by pointer, copied. */
typedef struct vs_rec {
  int kind;
  const void *p[7];
  void *out;
  int i[4];
  float eps;
  vspec_kv_cache kv;
  vspec_kv_tree_view tree;
  vspec_sample_spec spec;
  vspec_kv_batch batch; /* count, m and max_slots as called; the entries read at replay
                         * from entries_dev (the host copy is the call's alone) */
} vs_rec;

typedef struct vs_cpu_graph {
  vs_rec *ops;
  int n, cap;
  unsigned scratch_gen; /* the device's at the recording: CUDA's graphs hold the scratch's
                         * address, so a graph outlives a reallocation on no device */
} vs_cpu_graph;

/* ---- recording ------------------------------------------------------------------------- */

int vs_cpu_graph_begin(vspec_dev *dev) {
  if (!dev) return VSPEC_EINVAL;
  if (dev->rec) return VSPEC_EBUSY;
  vs_cpu_graph *g = calloc(1, sizeof *g);
  if (!g) return VSPEC_ENOMEM;
  g->scratch_gen = dev->scratch_gen;
  dev->rec = g;
  dev->rec_status = VSPEC_OK;
  return VSPEC_OK;
}

/* A new entry of the recording open on dev, or NULL (the recording then fails: ENOMEM). */
static vs_rec *rec_add(vspec_dev *dev, int kind) {
  vs_cpu_graph *g = dev->rec;
  if (g->n == g->cap) {
    int cap = g->cap ? 2 * g->cap : 64;
    vs_rec *ops = realloc(g->ops, (size_t)cap * sizeof *ops);
    if (!ops) {
      if (dev->rec_status == VSPEC_OK) dev->rec_status = VSPEC_ENOMEM;
      return NULL;
    }
    g->ops = ops;
    g->cap = cap;
  }
  vs_rec *r = &g->ops[g->n++];
  memset(r, 0, sizeof *r);
  r->kind = kind;
  return r;
}

void vs_cpu_graph_free(vspec_dev *dev, vspec_graph *graph) {
  (void)dev;
  vs_cpu_graph *g = (vs_cpu_graph *)(void *)graph;
  if (!g) return;
  free(g->ops);
  free(g);
}

int vs_cpu_graph_end(vspec_dev *dev, vspec_graph **graph) {
  if (graph) *graph = NULL;
  if (!dev || !graph) return VSPEC_EINVAL;
  vs_cpu_graph *g = dev->rec;
  if (!g) return VSPEC_EINVAL;
  int rc = dev->rec_status;
  dev->rec = NULL;
  dev->rec_status = VSPEC_OK;
  if (rc != VSPEC_OK) {
    vs_cpu_graph_free(dev, (vspec_graph *)(void *)g);
    return rc;
  }
  *graph = (vspec_graph *)(void *)g;
  return VSPEC_OK;
}

/* ---- the recordable ops: the table's entries ------------------------------------------- */

void vs_cpu_rec_linear(vspec_dev *dev, const float *x, int m, int n_in, const float *w,
                       int n_out, const float *bias, float *y) {
  if (!vs_cpu_recording(dev)) {
    vs_cpu_linear(dev, x, m, n_in, w, n_out, bias, y);
    return;
  }
  vs_rec *r = rec_add(dev, REC_LINEAR);
  if (!r) return;
  *r = (vs_rec){.kind = REC_LINEAR, .p = {x, w, bias}, .out = y, .i = {m, n_in, n_out}};
}

void vs_cpu_rec_gather_rows(vspec_dev *dev, const float *src, const int32_t *idx, int n,
                            int dim, float *dst) {
  if (!vs_cpu_recording(dev)) {
    vs_cpu_gather_rows(dev, src, idx, n, dim, dst);
    return;
  }
  vs_rec *r = rec_add(dev, REC_GATHER_ROWS);
  if (!r) return;
  *r = (vs_rec){.kind = REC_GATHER_ROWS, .p = {src, idx}, .out = dst, .i = {n, dim}};
}

void vs_cpu_rec_rmsnorm_rows(vspec_dev *dev, const float *x, const int32_t *idx, int n, int dim,
                             const float *w, float eps, float *y) {
  if (!vs_cpu_recording(dev)) {
    vs_cpu_rmsnorm_rows(dev, x, idx, n, dim, w, eps, y);
    return;
  }
  vs_rec *r = rec_add(dev, REC_RMSNORM_ROWS);
  if (!r) return;
  *r = (vs_rec){.kind = REC_RMSNORM_ROWS, .p = {x, idx, w}, .out = y, .i = {n, dim}, .eps = eps};
}

void vs_cpu_rec_linear_add(vspec_dev *dev, const float *x, int m, int n_in, const float *w,
                           int n_out, float *y) {
  if (!vs_cpu_recording(dev)) {
    vs_cpu_linear_add(dev, x, m, n_in, w, n_out, y);
    return;
  }
  vs_rec *r = rec_add(dev, REC_LINEAR_ADD);
  if (!r) return;
  *r = (vs_rec){.kind = REC_LINEAR_ADD, .p = {x, w}, .out = y, .i = {m, n_in, n_out}};
}

void vs_cpu_rec_norm_swiglu(vspec_dev *dev, const float *x, int m, int dim, const float *norm_w,
                            float eps, const float *w1, const float *w3, int hidden, float *y) {
  if (!vs_cpu_recording(dev)) {
    vs_cpu_norm_swiglu(dev, x, m, dim, norm_w, eps, w1, w3, hidden, y);
    return;
  }
  vs_rec *r = rec_add(dev, REC_NORM_SWIGLU);
  if (!r) return;
  *r = (vs_rec){.kind = REC_NORM_SWIGLU, .p = {x, norm_w, w1, w3}, .out = y,
                .i = {m, dim, hidden}, .eps = eps};
}

void vs_cpu_rec_norm_qkv_rope(vspec_dev *dev, const float *x, int n, int dim,
                              const float *norm_w, float eps, const float *wqkv,
                              const int32_t *pos, const float *rope_table,
                              const vspec_kv_cache *kv, const int32_t *slots, float *qkv) {
  if (!vs_cpu_recording(dev)) {
    vs_cpu_norm_qkv_rope(dev, x, n, dim, norm_w, eps, wqkv, pos, rope_table, kv, slots, qkv);
    return;
  }
  vs_rec *r = rec_add(dev, REC_NORM_QKV_ROPE);
  if (!r) return;
  *r = (vs_rec){.kind = REC_NORM_QKV_ROPE, .p = {x, norm_w, wqkv, pos, rope_table, slots},
                .out = qkv, .i = {n, dim}, .eps = eps, .kv = *kv};
}

void vs_cpu_rec_tree_attention(vspec_dev *dev, const float *qkv, const vspec_kv_cache *kv,
                               const vspec_kv_tree_view *tree, float *out) {
  if (!vs_cpu_recording(dev)) {
    vs_cpu_tree_attention(dev, qkv, kv, tree, out);
    return;
  }
  vs_rec *r = rec_add(dev, REC_TREE_ATTENTION);
  if (!r) return;
  *r = (vs_rec){.kind = REC_TREE_ATTENTION, .p = {qkv}, .out = out, .kv = *kv, .tree = *tree};
}

void vs_cpu_rec_sample_tokens(vspec_dev *dev, const float *logits, const vspec_sample_spec *spec,
                              int32_t *tokens) {
  if (!vs_cpu_recording(dev)) {
    vs_cpu_sample_tokens(dev, logits, spec, tokens);
    return;
  }
  vs_rec *r = rec_add(dev, REC_SAMPLE_TOKENS);
  if (!r) return;
  *r = (vs_rec){.kind = REC_SAMPLE_TOKENS, .p = {logits}, .out = tokens, .spec = *spec};
}

void vs_cpu_rec_draw_probs(vspec_dev *dev, const float *logits, const vspec_sample_spec *spec,
                           float *probs, int32_t *tokens) {
  if (!vs_cpu_recording(dev)) {
    vs_cpu_draw_probs(dev, logits, spec, probs, tokens);
    return;
  }
  vs_rec *r = rec_add(dev, REC_DRAW_PROBS);
  if (!r) return;
  *r = (vs_rec){.kind = REC_DRAW_PROBS, .p = {logits, probs}, .out = tokens, .spec = *spec};
}

void vs_cpu_rec_norm_qkv_rope_batch(vspec_dev *dev, const float *x, int dim,
                                    const float *norm_w, float eps, const float *wqkv,
                                    const int32_t *pos, const float *rope_table,
                                    const vspec_kv_batch *b, float *qkv) {
  if (!vs_cpu_recording(dev)) {
    vs_cpu_norm_qkv_rope_batch(dev, x, dim, norm_w, eps, wqkv, pos, rope_table, b, qkv);
    return;
  }
  vs_rec *r = rec_add(dev, REC_NORM_QKV_ROPE_BATCH);
  if (!r) return;
  *r = (vs_rec){.kind = REC_NORM_QKV_ROPE_BATCH, .p = {x, norm_w, wqkv, pos, rope_table},
                .out = qkv, .i = {dim}, .eps = eps, .batch = *b};
  r->batch.entries = NULL;
}

void vs_cpu_rec_tree_attention_batch(vspec_dev *dev, const float *qkv, const vspec_kv_batch *b,
                                     float *out) {
  if (!vs_cpu_recording(dev)) {
    vs_cpu_tree_attention_batch(dev, qkv, b, out);
    return;
  }
  vs_rec *r = rec_add(dev, REC_TREE_ATTENTION_BATCH);
  if (!r) return;
  *r = (vs_rec){.kind = REC_TREE_ATTENTION_BATCH, .p = {qkv}, .out = out, .batch = *b};
  r->batch.entries = NULL;
}

/* ---- replay ------------------------------------------------------------------------------ */

static void rec_run(vspec_dev *dev, const vs_rec *r) {
  const void *const *p = r->p;
  const int *i = r->i;
  switch (r->kind) {
  case REC_LINEAR:
    vs_cpu_linear(dev, p[0], i[0], i[1], p[1], i[2], p[2], r->out);
    break;
  case REC_GATHER_ROWS:
    vs_cpu_gather_rows(dev, p[0], p[1], i[0], i[1], r->out);
    break;
  case REC_RMSNORM_ROWS:
    vs_cpu_rmsnorm_rows(dev, p[0], p[1], i[0], i[1], p[2], r->eps, r->out);
    break;
  case REC_LINEAR_ADD:
    vs_cpu_linear_add(dev, p[0], i[0], i[1], p[1], i[2], r->out);
    break;
  case REC_NORM_SWIGLU:
    vs_cpu_norm_swiglu(dev, p[0], i[0], i[1], p[1], r->eps, p[2], p[3], i[2], r->out);
    break;
  case REC_NORM_QKV_ROPE:
    vs_cpu_norm_qkv_rope(dev, p[0], i[0], i[1], p[1], r->eps, p[2], p[3], p[4], &r->kv, p[5],
                         r->out);
    break;
  case REC_TREE_ATTENTION:
    vs_cpu_tree_attention(dev, p[0], &r->kv, &r->tree, r->out);
    break;
  case REC_SAMPLE_TOKENS:
    vs_cpu_sample_tokens(dev, p[0], &r->spec, r->out);
    break;
  case REC_DRAW_PROBS:
    vs_cpu_draw_probs(dev, p[0], &r->spec, (float *)(uintptr_t)p[1], r->out);
    break;
  case REC_NORM_QKV_ROPE_BATCH:
    vs_cpu_norm_qkv_rope_batch(dev, p[0], i[0], p[1], r->eps, p[2], p[3], p[4], &r->batch,
                               r->out);
    break;
  case REC_TREE_ATTENTION_BATCH:
    vs_cpu_tree_attention_batch(dev, p[0], &r->batch, r->out);
    break;
  }
}

int vs_cpu_graph_launch(vspec_dev *dev, vspec_graph *graph) {
  if (!dev) return VSPEC_EINVAL;
  if (!graph) return VSPEC_ENOENT;
  if (dev->rec) return VSPEC_EBUSY; /* no graphs inside graphs */
  const vs_cpu_graph *g = (const vs_cpu_graph *)(const void *)graph;
  if (g->scratch_gen != dev->scratch_gen) return VSPEC_ENOENT; /* stale: record again */
  for (int k = 0; k < g->n; k++) rec_run(dev, &g->ops[k]);
  return VSPEC_OK;
}
