/*
 * kernels/cuda/cuda_fused.cu - the ABI 1.4 fused ops (include/vspec/ops.h): a transformer
 * layer's decode step in a handful of launches instead of ~18 (each launch is microseconds
 * of fixed cost that a step at the memory-bandwidth bound cannot afford).
 *
 * Launches per op (fp32 / bf16 up to VS_CUDA_SKINNY_ROWS rows / bf16 above):
 *   gather_rows    1
 *   rmsnorm_rows   1 (the rmsnorm kernel reading row idx[i])
 *   linear_add     1 (cuBLAS, beta = 1) / 1 (few-row kernel, accumulate) / 2 (to bf16, GEMM)
 *   norm_swiglu    4 (norm, w1, w3, swiglu) / 1 (both weights + SwiGLU in one kernel that
 *                  normalises its rows itself; 2 with the norm apart for rows too long for
 *                  its shared memory) / 4 (norm written as bf16, w1, w3, swiglu)
 *   norm_qkv_rope  3 (norm, qkv, one kernel for RoPE and the cache stores); 2 on the few-row
 *                  path (the product normalises its rows)
 *   norm_qkv_rope_batch  as norm_qkv_rope over all the batch's rows (ABI 1.9)
 *   tree_attention 1 (cuda_tree_attention.cu)
 * Nothing here uploads, downloads or waits: idx, pos, parents and prefix are device arrays,
 * and temporaries come from the context's scratch (vs_cuda_scratch: it grows, with a wait,
 * only when too small, which reserve_scratch at load avoids). Each op enqueues on the
 * context's stream and records failures as the plain ops do.
 */
#include <math.h>

#include "kernels/common/vs_math.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_rope_store.h"

#define VS_GRID_STRIDE(i, n)                                                   \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
       i += (size_t)gridDim.x * blockDim.x)

static inline size_t cf_align16(size_t b) { return (b + 15) & ~(size_t)15; }

/* ---- gather_rows, rmsnorm_rows ------------------------------------------------------------ */

__global__ void vs_k_gather_rows(const float *src, const int32_t *idx, int n, int dim,
                                 float *dst) {
  VS_PDL_ENTER();
  size_t total = (size_t)n * dim;
  VS_GRID_STRIDE(e, total) {
    size_t i = e / (size_t)dim, c = e % (size_t)dim;
    dst[e] = src[(size_t)idx[i] * dim + c];
  }
}

void vs_cuda_gather_rows(vspec_dev *dev, const float *src, const int32_t *idx, int n, int dim,
                         float *dst) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (n <= 0 || dim <= 0 || d->failed || !vs_cuda_enter(d)) return;
  size_t total = (size_t)n * dim;
  vs_cuda_launch(d, "gather_rows", vs_k_gather_rows, vs_cuda_grid(total, 256), 256, 0, src, idx,
                 n, dim, dst);
}

void vs_cuda_rmsnorm_rows(vspec_dev *dev, const float *x, const int32_t *idx, int n, int dim,
                          const float *w, float eps, float *y) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (n <= 0 || dim <= 0 || d->failed || !vs_cuda_enter(d)) return;
  vs__cuda_rmsnorm_launch(d, x, idx, n, dim, w, eps, y, NULL);
}

/* ---- products -------------------------------------------------------------------------------
 * The path a product takes is vs_cuda_linear's: fp32 cuBLAS, the few-row bf16 kernel, or bf16
 * activations on tensor cores. A fused op picks it once per weight so that its norm can
 * write the activations in the form the product reads (bf16 for the tensor cores: the
 * conversion launch disappears into the norm). */
enum { VS_PATH_FP32, VS_PATH_SKINNY, VS_PATH_TC };

static int cf_path(int m, const uint16_t *wb) {
  return !wb ? VS_PATH_FP32 : m <= VS_CUDA_SKINNY_ROWS ? VS_PATH_SKINNY : VS_PATH_TC;
}

/* Normalised activations: fp32 rows h, or bf16 rows hb on the tensor-core path; or, on the
 * few-row path, h the rows before their norm and norm_w the norm the kernel applies itself
 * (NULL: h is what it multiplies). */
typedef struct cf_acts {
  float *h;
  uint16_t *hb;
  const float *norm_w;
  float eps;
} cf_acts;

/* Bytes of the normalised activations of m rows of dim on `path`, 16-byte aligned. */
static size_t cf_acts_bytes(int path, int m, int dim) {
  return cf_align16((size_t)m * dim * (path == VS_PATH_TC ? sizeof(uint16_t) : sizeof(float)));
}

/* rmsnorm(x) * norm_w into the activations at `at` (scratch); 1 when launched. Without
 * norm_w (EAGLE's first layer) the activations are x itself: nothing runs at fp32 or on the
 * few-row kernel, the tensor cores get x converted to bf16. On the few-row path the product's
 * kernel normalises its rows itself where they fit its shared memory (a launch less, the
 * same bits: vs__cuda_skinny_bf16). */
static int cf_norm_into(vs_cuda_dev *d, int path, const float *x, int m, int dim,
                        const float *norm_w, float eps, void *at, cf_acts *a) {
  a->h = path == VS_PATH_TC ? NULL : (float *)at;
  a->hb = path == VS_PATH_TC ? (uint16_t *)at : NULL;
  a->norm_w = NULL;
  a->eps = eps;
  if (norm_w && path == VS_PATH_SKINNY && vs__cuda_skinny_norms(m, dim)) {
    a->h = (float *)x;
    a->norm_w = norm_w;
    return 1;
  }
  if (!norm_w) {
    if (path != VS_PATH_TC) {
      a->h = (float *)x;
      return 1;
    }
    return vs__cuda_to_bf16(d, a->hb, x, (size_t)m * dim);
  }
  return vs__cuda_rmsnorm_launch(d, x, NULL, m, dim, norm_w, eps, a->h, a->hb);
}

/* y = a W^T, or y += a W^T when accumulate; 1 when launched. */
static int cf_product(vs_cuda_dev *d, int path, const cf_acts *a, int m, int n_in,
                      const float *w, const uint16_t *wb, int n_out, int accumulate, float *y) {
  if (path == VS_PATH_SKINNY)
    return vs__cuda_skinny_bf16(d, a->h, a->norm_w, a->eps, m, n_in, wb, NULL, n_out, NULL,
                                accumulate ? VS_SKINNY_ADD : VS_SKINNY_STORE, y);
  if (path == VS_PATH_TC)
    return vs__cuda_gemm_bf16(d, a->hb, m, n_in, wb, n_out, accumulate ? 1.0f : 0.0f, y);
  vs_cuda_gemm((vspec_dev *)(void *)d, 0, 1, m, n_out, n_in, 1.0f, a->h, n_in, w, n_in,
               accumulate ? 1.0f : 0.0f, y, n_out);
  return !d->failed;
}

void vs_cuda_linear_add(vspec_dev *dev, const float *x, int m, int n_in, const float *w,
                        int n_out, float *y) {
  vs_cuda_dev *d = vs_cuda(dev);
  /* n_in = 0: the product is zero and y stays as it is */
  if (m <= 0 || n_out <= 0 || n_in <= 0 || d->failed || !vs_cuda_enter(d)) return;
  const uint16_t *wb = vs__cuda_bf16_weight(d, w, n_out, n_in);
  int path = cf_path(m, wb);
  cf_acts a = {(float *)x, NULL, NULL, 0.0f};
  if (path == VS_PATH_TC) {
    size_t nx = (size_t)m * n_in;
    if (!(a.hb = (uint16_t *)vs__cuda_op_scratch(d, nx * sizeof(uint16_t), "linear_add")) ||
        !vs__cuda_to_bf16(d, a.hb, x, nx))
      return;
  }
  cf_product(d, path, &a, m, n_in, w, wb, n_out, 1, y);
}

__global__ void vs_k_swiglu_pair(float *gate_y, const float *up, size_t n) {
  VS_GRID_STRIDE(i, n) gate_y[i] = vs_swiglu(gate_y[i], up[i]);
}

void vs_cuda_norm_swiglu(vspec_dev *dev, const float *x, int m, int dim, const float *norm_w,
                         float eps, const float *w1, const float *w3, int hidden, float *y) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (m <= 0 || hidden <= 0 || d->failed || !vs_cuda_enter(d)) return;
  size_t ny = (size_t)m * hidden;
  if (dim <= 0) { /* empty rows: both products are zero, and silu(0) * 0 = 0 */
    vs_cuda_check_rt(d, cudaMemsetAsync(y, 0, ny * sizeof(float), d->stream), "norm_swiglu");
    return;
  }
  const uint16_t *wb1 = vs__cuda_bf16_weight(d, w1, hidden, dim);
  const uint16_t *wb3 = wb1 ? vs__cuda_bf16_weight(d, w3, hidden, dim) : NULL;
  if (!wb3) wb1 = NULL; /* both weights take one path */
  int path = cf_path(m, wb1);
  size_t hbytes = cf_acts_bytes(path, m, dim);
  /* the up projection needs its own rows unless the few-row kernel fuses SwiGLU */
  size_t upbytes = path == VS_PATH_SKINNY ? 0 : ny * sizeof(float);
  char *s = (char *)vs__cuda_op_scratch(d, hbytes + upbytes, "norm_swiglu");
  cf_acts a;
  if (!s || !cf_norm_into(d, path, x, m, dim, norm_w, eps, s, &a)) return;
  if (path == VS_PATH_SKINNY) {
    vs__cuda_skinny_bf16(d, a.h, a.norm_w, a.eps, m, dim, wb1, wb3, hidden, NULL,
                         VS_SKINNY_SWIGLU, y);
    return;
  }
  float *up = (float *)(s + hbytes);
  if (!cf_product(d, path, &a, m, dim, w1, wb1, hidden, 0, y) ||
      !cf_product(d, path, &a, m, dim, w3, wb3, hidden, 0, up))
    return;
  vs_k_swiglu_pair<<<vs_cuda_grid(ny, 256), 256, 0, d->stream>>>(y, up, ny);
  VS_CUDA_LAUNCHED(d, "norm_swiglu (swiglu)");
}

/* ---- norm_qkv_rope ----------------------------------------------------------------------- */

/* One thread per (row, head of q|k|v, pair of channels): vs_rope_store_vals
 * (cuda_rope_store.h) on the pair the product stored, in place. */
__device__ static inline void cf_rope_store_pair(float *row, int hh, int j, int H, int Hkv,
                                                 int hd, const float *t,
                                                 const vspec_kv_cache &kv, int r, int slot) {
  float *xh = row + (size_t)hh * hd;
  int c = 2 * j;
  vs_rope_store_vals(xh, xh[c], c + 1 < hd ? xh[c + 1] : 0.0f, hh, j, H, Hkv, hd, t, kv, r,
                     slot);
}

__global__ void vs_k_rope_store(float *qkv, int m, int n, int H, int Hkv, int hd,
                                const int32_t *pos, const float *table, vspec_kv_cache kv,
                                const int32_t *slots) {
  VS_PDL_ENTER();
  int half = hd / 2, pairs = (hd + 1) / 2, heads = H + 2 * Hkv;
  size_t total = (size_t)m * heads * pairs, qkv_w = (size_t)heads * hd;
  VS_GRID_STRIDE(e, total) {
    int j = (int)(e % (size_t)pairs);
    size_t rh = e / (size_t)pairs;
    int hh = (int)(rh % (size_t)heads), row = (int)(rh / (size_t)heads);
    int slot = hh >= H ? slots[row % n] : -1;
    cf_rope_store_pair(qkv + (size_t)row * qkv_w, hh, j, H, Hkv, hd,
                       table + (size_t)pos[row] * half * 2, kv, row / n, slot);
  }
}

/* The batch's rows (ABI 1.9): each row's session found among the entries (in row order,
 * their first rows staged in shared memory), then as vs_k_rope_store for that session. */
#define VS_CUDA_BATCH_MAX 64
__global__ void vs_k_rope_store_batch(float *qkv, int m, int H, int Hkv, int hd,
                                      const int32_t *pos, const float *table,
                                      const vspec_kv_batch_entry *es, int count) {
  VS_PDL_ENTER();
  __shared__ int row0[VS_CUDA_BATCH_MAX];
  for (int k = threadIdx.x; k < count; k += blockDim.x) row0[k] = es[k].row0;
  __syncthreads();
  int half = hd / 2, pairs = (hd + 1) / 2, heads = H + 2 * Hkv;
  size_t total = (size_t)m * heads * pairs, qkv_w = (size_t)heads * hd;
  VS_GRID_STRIDE(e, total) {
    int j = (int)(e % (size_t)pairs);
    size_t rh = e / (size_t)pairs;
    int hh = (int)(rh % (size_t)heads), row = (int)(rh / (size_t)heads), k = 0;
    while (k + 1 < count && row0[k + 1] <= row) k++;
    const vspec_kv_batch_entry *se = &es[k];
    int n = se->tree.n, ri = row - row0[k];
    int slot = hh >= H ? se->slots[ri % n] : -1;
    cf_rope_store_pair(qkv + (size_t)row * qkv_w, hh, j, H, Hkv, hd,
                       table + (size_t)pos[row] * half * 2, se->kv, ri / n, slot);
  }
}

/* qkv[m, qkv_w] = rmsnorm(x[m, dim]) * norm_w times wqkv^T (norm_w NULL: x itself), on the
 * precision's path. On the few-row bf16 path (an even head_dim) the product's epilogue also
 * rotates q and k and stores k and v (vs__cuda_skinny_qkv_rope): the op in one launch, where
 * the third profile (docs/BENCHMARKS.md, "On a GPU") had the separate store kernel at 2.9 us a
 * layer, 8 % of a step. CF_QKV_DONE then, CF_QKV_PRODUCT when the caller launches
 * vs_k_rope_store(_batch) after the product, CF_QKV_FAILED with the failure recorded. */
enum { CF_QKV_FAILED, CF_QKV_PRODUCT, CF_QKV_DONE };
static int cf_norm_qkv(vs_cuda_dev *d, const float *x, int m, int dim, const float *norm_w,
                       float eps, const float *wqkv, const vs_skinny_rope *rope, float *qkv) {
  int qkv_w = (rope->H + 2 * rope->Hkv) * rope->hd;
  const uint16_t *wb = vs__cuda_bf16_weight(d, wqkv, qkv_w, dim);
  int path = cf_path(m, wb);
  void *s = vs__cuda_op_scratch(d, cf_acts_bytes(path, m, dim), "norm_qkv_rope");
  cf_acts a;
  if (!s || !cf_norm_into(d, path, x, m, dim, norm_w, eps, s, &a)) return CF_QKV_FAILED;
  if (path == VS_PATH_SKINNY && d->rope_epilogue && rope->hd % 2 == 0)
    return vs__cuda_skinny_qkv_rope(d, a.h, a.norm_w, a.eps, m, dim, wb, rope, qkv)
               ? CF_QKV_DONE
               : CF_QKV_FAILED;
  return cf_product(d, path, &a, m, dim, wqkv, wb, qkv_w, 0, qkv) ? CF_QKV_PRODUCT
                                                                  : CF_QKV_FAILED;
}

int vs__cuda_kv_ok(vs_cuda_dev *d, const vspec_kv_cache *kv, const char *op) {
  if (kv && kv->k && kv->v && kv->rows > 0 && kv->n_heads > 0 && kv->kv_heads > 0 &&
      kv->head_dim > 0 && kv->slots > 0 && kv->n_heads % kv->kv_heads == 0)
    return 1;
  vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: %s: bad KV cache shape", d->head.index, op);
  return 0;
}

void vs_cuda_norm_qkv_rope(vspec_dev *dev, const float *x, int n, int dim, const float *norm_w,
                           float eps, const float *wqkv, const int32_t *pos,
                           const float *rope_table, const vspec_kv_cache *kv,
                           const int32_t *slots, float *qkv) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (n <= 0 || d->failed || !vs_cuda_enter(d) || !vs__cuda_kv_ok(d, kv, "norm_qkv_rope")) return;
  /* the slots are device memory: a bad one is skipped by the kernel, not checked here */
  if (n > kv->slots || dim <= 0 || !slots) {
    vs_cuda_fail(d, VSPEC_ERANGE, "cuda:%d: norm_qkv_rope: %d nodes for a cache of %d slots "
                 "(dim %d)", d->head.index, n, kv->slots, dim);
    return;
  }
  int m = kv->rows * n, H = kv->n_heads, Hkv = kv->kv_heads, hd = kv->head_dim;
  vs_skinny_rope rope = {pos, rope_table, H, Hkv, hd, *kv, slots, n, NULL, 0};
  if (cf_norm_qkv(d, x, m, dim, norm_w, eps, wqkv, &rope, qkv) != CF_QKV_PRODUCT) return;
  size_t total = (size_t)m * (H + 2 * Hkv) * ((hd + 1) / 2);
  vs_cuda_launch(d, "norm_qkv_rope (rope and cache stores)", vs_k_rope_store,
                 vs_cuda_grid(total, 256), 256, 0, qkv, m, n, H, Hkv, hd, pos, rope_table, *kv,
                 slots);
}


/* Every session's norm, QKV and RoPE with its stores (ABI 1.9): the norm and the product over
 * the batch's m rows at once, so the weights are read once for all its jobs, then one kernel
 * for RoPE and every session's stores. */
void vs_cuda_norm_qkv_rope_batch(vspec_dev *dev, const float *x, int dim, const float *norm_w,
                                 float eps, const float *wqkv, const int32_t *pos,
                                 const float *rope_table, const vspec_kv_batch *b, float *qkv) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (!b || b->count <= 0 || d->failed || !vs_cuda_enter(d)) return;
  if (b->count > VS_CUDA_BATCH_MAX || !b->entries || !b->entries_dev || dim <= 0) {
    vs_cuda_fail(d, VSPEC_ERANGE, "cuda:%d: norm_qkv_rope_batch: %d sessions (at most %d)",
                 d->head.index, b->count, VS_CUDA_BATCH_MAX);
    return;
  }
  const vspec_kv_cache *k0 = &b->entries[0].kv;
  int rows = 0;
  for (int i = 0; i < b->count; i++) { /* the host copy: shapes alike, rows in order */
    const vspec_kv_batch_entry *e = &b->entries[i];
    if (!vs__cuda_kv_ok(d, &e->kv, "norm_qkv_rope_batch")) return;
    if (e->kv.n_heads != k0->n_heads || e->kv.kv_heads != k0->kv_heads ||
        e->kv.head_dim != k0->head_dim || e->row0 != rows || e->tree.n <= 0 ||
        e->tree.n > e->kv.slots || !e->slots) {
      vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: norm_qkv_rope_batch: session %d does not fit "
                   "the batch (shape, rows from %d, %d nodes)", d->head.index, i, e->row0,
                   e->tree.n);
      return;
    }
    rows += e->kv.rows * e->tree.n;
  }
  if (rows != b->m) {
    vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: norm_qkv_rope_batch: %d rows, the sessions have %d",
                 d->head.index, b->m, rows);
    return;
  }
  int m = b->m, H = k0->n_heads, Hkv = k0->kv_heads, hd = k0->head_dim;
  vs_skinny_rope rope = {pos, rope_table, H, Hkv, hd, *k0, NULL, 0, b->entries_dev, b->count};
  if (cf_norm_qkv(d, x, m, dim, norm_w, eps, wqkv, &rope, qkv) != CF_QKV_PRODUCT) return;
  size_t total = (size_t)m * (H + 2 * Hkv) * ((hd + 1) / 2);
  vs_cuda_launch(d, "norm_qkv_rope_batch (rope and cache stores)", vs_k_rope_store_batch,
                 vs_cuda_grid(total, 256), 256, 0, qkv, m, H, Hkv, hd, pos, rope_table,
                 b->entries_dev, b->count);
}
