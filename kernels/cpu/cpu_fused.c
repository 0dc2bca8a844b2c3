/*
 * kernels/cpu/cpu_fused.c - the ABI 1.4 fused ops (include/vspec/ops.h) on the CPU, and the
 * ABI 1.9 batch ops made of them.
 *
 * A fused op exists for its op count: on a GPU each op is at least one kernel launch, and a
 * decode step at the memory-bandwidth bound cannot afford dozens of them per layer. The CPU
 * pays nanoseconds per op, so here each fused op is the very sequence of CPU ops it replaces,
 * as the transformer backends issue them unfused (llamagen's lg__run_layers and lg__head, the
 * KV stores of plugins/backend/kv_tree.h): the same functions on the same shapes give the
 * same bits, so a backend may switch to the fused ops without moving a golden test, and a
 * GPU's fused kernels have one reference to match. Temporaries live in the device's second
 * arena (vs_fused_scratch): the inner ops clobber the ordinary scratch.
 */
#include <string.h>

#include "kernels/common/vs_tree_visible.h"
#include "kernels/cpu/cpu_dev.h"

void vs_cpu_gather_rows(vspec_dev *dev, const float *src, const int32_t *idx, int n, int dim,
                        float *dst) {
  (void)dev;
  size_t row = (size_t)dim * sizeof(float);
  for (int i = 0; i < n; i++) memcpy(dst + (size_t)i * dim, src + (size_t)idx[i] * dim, row);
}

/* lg__head's sequence: the rows gathered, then normalised in place. RMSNorm computes each
 * row from that row alone, so gathering straight into y (which may not overlap x) gives the
 * bits a separate temporary would, without one. */
void vs_cpu_rmsnorm_rows(vspec_dev *dev, const float *x, const int32_t *idx, int n, int dim,
                         const float *w, float eps, float *y) {
  if (n <= 0) return;
  vs_cpu_gather_rows(dev, x, idx, n, dim, y);
  vs_cpu_rmsnorm(dev, y, w, n, dim, eps, y);
}

void vs_cpu_linear_add(vspec_dev *dev, const float *x, int m, int n_in, const float *w,
                       int n_out, float *y) {
  if (m <= 0 || n_out <= 0) return;
  size_t elems = (size_t)m * n_out;
  float *t = vs_fused_scratch(dev, elems * sizeof(float));
  vs_cpu_linear(dev, x, m, n_in, w, n_out, NULL, t);
  vs_cpu_add(dev, y, t, elems);
}

void vs_cpu_norm_swiglu(vspec_dev *dev, const float *x, int m, int dim, const float *norm_w,
                        float eps, const float *w1, const float *w3, int hidden, float *y) {
  if (m <= 0 || hidden <= 0) return;
  /* two temporaries: the normalised rows and the up projection (w3) */
  size_t norm_bytes = vs_align_up((size_t)m * dim * sizeof(float));
  char *base = vs_fused_scratch(dev, norm_bytes + (size_t)m * hidden * sizeof(float));
  float *h = (float *)(void *)base, *up = (float *)(void *)(base + norm_bytes);
  vs_cpu_rmsnorm(dev, x, norm_w, m, dim, eps, h);
  vs_cpu_linear(dev, h, m, dim, w1, hidden, NULL, y);
  vs_cpu_linear(dev, h, m, dim, w3, hidden, NULL, up);
  vs_cpu_swiglu(dev, y, up, (size_t)m * hidden, y);
}

/* vs_kv_store's copies: per CFG row one strided copy of the keys and one of the values, the
 * outer index the kv head and the inner one the node, node j to slot slots[j]. Slots that
 * follow one another (every forward of the backends) take one copy for all nodes, as
 * vs_kv_store does; others one per node. */
static void store_kv(vspec_dev *dev, const vspec_kv_cache *kv, int n, const int32_t *slots,
                     const float *qkv, int qkv_w) {
  size_t hd = (size_t)kv->head_dim, f = sizeof(float);
  size_t k_off = (size_t)kv->n_heads * hd, v_off = (size_t)(kv->n_heads + kv->kv_heads) * hd;
  size_t row_elems = (size_t)kv->kv_heads * kv->slots * hd; /* one CFG row's cache */
  int run = 1; /* nodes per copy */
  while (run < n && slots[run] == slots[0] + run) run++;
  if (run < n) run = 1;
  for (int r = 0; r < kv->rows; r++)
    for (int j = 0; j < n; j += run) {
      const float *src = qkv + ((size_t)r * n + j) * qkv_w;
      size_t at = (size_t)r * row_elems + (size_t)slots[j] * hd;
      vs_cpu_copy3d(dev, kv->k + at, kv->slots * hd * f, hd * f, src + k_off, hd * f,
                    (size_t)qkv_w * f, hd * f, kv->kv_heads, run);
      vs_cpu_copy3d(dev, kv->v + at, kv->slots * hd * f, hd * f, src + v_off, hd * f,
                    (size_t)qkv_w * f, hd * f, kv->kv_heads, run);
    }
}

void vs_cpu_norm_qkv_rope(vspec_dev *dev, const float *x, int n, int dim, const float *norm_w,
                          float eps, const float *wqkv, const int32_t *pos,
                          const float *rope_table, const vspec_kv_cache *kv,
                          const int32_t *slots, float *qkv) {
  int m = kv->rows * n, H = kv->n_heads, Hkv = kv->kv_heads, hd = kv->head_dim;
  int qkv_w = (H + 2 * Hkv) * hd;
  if (m <= 0) return;
  const float *h = x; /* no norm_w: EAGLE's first layer multiplies x itself */
  if (norm_w) {
    float *t = vs_fused_scratch(dev, (size_t)m * dim * sizeof(float));
    vs_cpu_rmsnorm(dev, x, norm_w, m, dim, eps, t);
    h = t;
  }
  vs_cpu_linear(dev, h, m, dim, wqkv, qkv_w, NULL, qkv);
  /* q, then k; v does not rotate */
  vs_cpu_rope_apply(dev, qkv, m, qkv_w, H, hd, pos, rope_table);
  vs_cpu_rope_apply(dev, qkv + (size_t)H * hd, m, qkv_w, Hkv, hd, pos, rope_table);
  store_kv(dev, kv, n, slots, qkv, qkv_w);
}

void vs_cpu_tree_attention(vspec_dev *dev, const float *qkv, const vspec_kv_cache *kv,
                           const vspec_kv_tree_view *tree, float *out) {
  int n = tree->n, kv_len = vs_tree_kv_len(tree);
  int H = kv->n_heads, Hkv = kv->kv_heads, hd = kv->head_dim, qkv_w = (H + 2 * Hkv) * hd;
  if (n <= 0) return;
  /* The CFG rows share the tree, hence the mask: built once, the byte mask of the
   * unfused path (vs_kv_tree_mask) by the rule a GPU kernel evaluates in place. */
  uint8_t *mask = vs_fused_scratch(dev, (size_t)n * kv_len);
  for (int i = 0; i < n; i++) vs_tree_mask_row(tree, i, mask + (size_t)i * kv_len);
  size_t row_elems = (size_t)Hkv * kv->slots * hd;
  for (int r = 0; r < kv->rows; r++)
    vs_cpu_attention(dev, qkv + (size_t)r * n * qkv_w, n, qkv_w, H, Hkv, hd,
                     kv->k + (size_t)r * row_elems, kv->v + (size_t)r * row_elems, kv->slots,
                     kv_len, mask, out + (size_t)r * n * H * hd);
}

/* ---- ABI 1.9: a cross-job batch's sessions in one op ------------------------------------ */

/* The CPU runs each session's op in turn, exactly as the batch made them before these ops
 * existed: the same numbers as each session alone, one counted op. The sessions are read
 * from entries_dev, as a GPU's kernels read them when they run (the CPU's device memory is
 * the host's): a recorded batch (cpu_graph.c) then replays with the entries uploaded for
 * the step it serves, not those of the step it was recorded at. */
void vs_cpu_norm_qkv_rope_batch(vspec_dev *dev, const float *x, int dim, const float *norm_w,
                                float eps, const float *wqkv, const int32_t *pos,
                                const float *rope_table, const vspec_kv_batch *b, float *qkv) {
  if (!b || !b->entries_dev) return; /* no sessions to read: nothing runs (CUDA refuses it) */
  for (int i = 0; i < b->count; i++) {
    const vspec_kv_batch_entry *e = &b->entries_dev[i];
    size_t r0 = (size_t)e->row0;
    int qkv_w = (e->kv.n_heads + 2 * e->kv.kv_heads) * e->kv.head_dim;
    vs_cpu_norm_qkv_rope(dev, x + r0 * dim, e->tree.n, dim, norm_w, eps, wqkv, pos + r0,
                         rope_table, &e->kv, e->slots, qkv + r0 * qkv_w);
  }
}

void vs_cpu_tree_attention_batch(vspec_dev *dev, const float *qkv, const vspec_kv_batch *b,
                                 float *out) {
  if (!b || !b->entries_dev) return;
  for (int i = 0; i < b->count; i++) {
    const vspec_kv_batch_entry *e = &b->entries_dev[i];
    size_t r0 = (size_t)e->row0;
    int H = e->kv.n_heads, hd = e->kv.head_dim, qkv_w = (H + 2 * e->kv.kv_heads) * hd;
    vs_cpu_tree_attention(dev, qkv + r0 * qkv_w, &e->kv, &e->tree, out + r0 * H * hd);
  }
}
