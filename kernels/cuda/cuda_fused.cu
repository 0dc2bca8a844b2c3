/*
 * kernels/cuda/cuda_fused.cu - the ABI 1.4 fused ops (include/vspec/ops.h): a transformer
 * layer's decode step in a handful of launches instead of ~18 (each launch is microseconds
 * of fixed cost that a step at the memory-bandwidth bound cannot afford).
 *
 * Launches per op (fp32 / bf16 up to VS_CUDA_SKINNY_ROWS rows / bf16 above):
 *   gather_rows    1
 *   rmsnorm_rows   1 (the rmsnorm kernel reading row idx[i])
 *   linear_add     1 (cuBLAS, beta = 1) / 1 (few-row kernel, accumulate) / 2 (to bf16, GEMM)
 *   norm_swiglu    4 (norm, w1, w3, swiglu) / 2 (norm, both weights + SwiGLU in one kernel) /
 *                  4 (norm written as bf16, w1, w3, swiglu)
 *   norm_qkv_rope  3 (norm, qkv, one kernel for RoPE and the cache stores) in every path
 *   tree_attention 1 (every CFG row, query and head; visibility from parents and prefix; a
 *                  kernel per head_dim of 32, 64, 128, a generic one for the rest)
 * Nothing here uploads, downloads or waits: idx, pos, parents and prefix are device arrays,
 * and temporaries come from the context's scratch (vs_cuda_scratch: it grows, with a wait,
 * only when too small, which reserve_scratch at load avoids). Each op enqueues on the
 * context's stream and records failures as the plain ops do.
 */
#include <math.h>

#include "kernels/common/vs_math.h"
#include "kernels/common/vs_tree_visible.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_reduce.h"

#define VS_GRID_STRIDE(i, n)                                                   \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
       i += (size_t)gridDim.x * blockDim.x)

static inline size_t cf_align16(size_t b) { return (b + 15) & ~(size_t)15; }

/* ---- gather_rows, rmsnorm_rows ------------------------------------------------------------ */

__global__ void vs_k_gather_rows(const float *src, const int32_t *idx, int n, int dim,
                                 float *dst) {
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
  vs_k_gather_rows<<<vs_cuda_grid(total, 256), 256, 0, d->stream>>>(src, idx, n, dim, dst);
  VS_CUDA_LAUNCHED(d, "gather_rows");
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

/* Normalised activations: fp32 rows h, or bf16 rows hb on the tensor-core path. */
typedef struct cf_acts {
  float *h;
  uint16_t *hb;
} cf_acts;

/* Bytes of the normalised activations of m rows of dim on `path`, 16-byte aligned. */
static size_t cf_acts_bytes(int path, int m, int dim) {
  return cf_align16((size_t)m * dim * (path == VS_PATH_TC ? sizeof(uint16_t) : sizeof(float)));
}

/* rmsnorm(x) * norm_w into the activations at `at` (scratch); 1 when launched. Without
 * norm_w (EAGLE's first layer) the activations are x itself: nothing runs at fp32 or on the
 * few-row kernel, the tensor cores get x converted to bf16. */
static int cf_norm_into(vs_cuda_dev *d, int path, const float *x, int m, int dim,
                        const float *norm_w, float eps, void *at, cf_acts *a) {
  a->h = path == VS_PATH_TC ? NULL : (float *)at;
  a->hb = path == VS_PATH_TC ? (uint16_t *)at : NULL;
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
    return vs__cuda_skinny_bf16(d, a->h, m, n_in, wb, NULL, n_out, NULL,
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
  cf_acts a = {(float *)x, NULL};
  if (path == VS_PATH_TC) {
    size_t nx = (size_t)m * n_in;
    if (!(a.hb = (uint16_t *)vs_cuda_scratch(d, nx * sizeof(uint16_t))) ||
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
  char *s = (char *)vs_cuda_scratch(d, hbytes + upbytes);
  cf_acts a;
  if (!s || !cf_norm_into(d, path, x, m, dim, norm_w, eps, s, &a)) return;
  if (path == VS_PATH_SKINNY) {
    vs__cuda_skinny_bf16(d, a.h, m, dim, wb1, wb3, hidden, NULL, VS_SKINNY_SWIGLU, y);
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

/* One thread per (row, head of q|k|v, pair of channels): q and k pairs rotate as vs_k_rope
 * does (table row pos[row], pair j uses entries 2j and 2j+1), k and v pairs of row
 * (CFG row r, node j) go to cache slot slots[j] as well (a slot outside the cache is not
 * written). An odd head_dim leaves its last channel unrotated, as rope_apply does. */
__global__ void vs_k_rope_store(float *qkv, int m, int n, int H, int Hkv, int hd,
                                const int32_t *pos, const float *table, vspec_kv_cache kv,
                                const int32_t *slots) {
  int half = hd / 2, pairs = (hd + 1) / 2, heads = H + 2 * Hkv;
  size_t total = (size_t)m * heads * pairs, qkv_w = (size_t)heads * hd;
  VS_GRID_STRIDE(e, total) {
    int j = (int)(e % (size_t)pairs);
    size_t rh = e / (size_t)pairs;
    int hh = (int)(rh % (size_t)heads), row = (int)(rh / (size_t)heads);
    float *xh = qkv + (size_t)row * qkv_w + (size_t)hh * hd;
    int c = 2 * j, pair = c + 1 < hd;
    float y0 = xh[c], y1 = pair ? xh[c + 1] : 0.0f;
    if (hh < H + Hkv && j < half) { /* q or k: rotate */
      const float *t = table + (size_t)pos[row] * half * 2;
      float x0 = y0, x1 = y1;
      vs_rope_rotate(x0, x1, t[2 * j], t[2 * j + 1], &y0, &y1);
      xh[c] = y0;
      xh[c + 1] = y1;
    }
    if (hh >= H) { /* k or v: store into the cache */
      int is_v = hh >= H + Hkv, g = hh - H - (is_v ? Hkv : 0);
      int r = row / n, slot = slots[row % n];
      if (slot < 0 || slot >= kv.slots) continue;
      float *dst = (is_v ? kv.v : kv.k) + (((size_t)r * Hkv + g) * kv.slots + (size_t)slot) * hd + c;
      dst[0] = y0;
      if (pair) dst[1] = y1;
    }
  }
}

/* The cache's shape as the fused kernels index it; 0 (failure recorded) when it is not. */
static int cf_kv_ok(vs_cuda_dev *d, const vspec_kv_cache *kv, const char *op) {
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
  if (n <= 0 || d->failed || !vs_cuda_enter(d) || !cf_kv_ok(d, kv, "norm_qkv_rope")) return;
  /* the slots are device memory: a bad one is skipped by the kernel, not checked here */
  if (n > kv->slots || dim <= 0 || !slots) {
    vs_cuda_fail(d, VSPEC_ERANGE, "cuda:%d: norm_qkv_rope: %d nodes for a cache of %d slots "
                 "(dim %d)", d->head.index, n, kv->slots, dim);
    return;
  }
  int m = kv->rows * n, H = kv->n_heads, Hkv = kv->kv_heads, hd = kv->head_dim;
  int qkv_w = (H + 2 * Hkv) * hd;
  const uint16_t *wb = vs__cuda_bf16_weight(d, wqkv, qkv_w, dim);
  int path = cf_path(m, wb);
  void *s = vs_cuda_scratch(d, cf_acts_bytes(path, m, dim));
  cf_acts a;
  if (!s || !cf_norm_into(d, path, x, m, dim, norm_w, eps, s, &a) ||
      !cf_product(d, path, &a, m, dim, wqkv, wb, qkv_w, 0, qkv))
    return;
  size_t total = (size_t)m * (H + 2 * Hkv) * ((hd + 1) / 2);
  vs_k_rope_store<<<vs_cuda_grid(total, 256), 256, 0, d->stream>>>(qkv, m, n, H, Hkv, hd, pos,
                                                                  rope_table, *kv, slots);
  VS_CUDA_LAUNCHED(d, "norm_qkv_rope (rope and cache stores)");
}

/* ---- tree_attention -------------------------------------------------------------------------
 * One block per (CFG row r, query i, head h), the math of vs_k_attention (cuda_attention.cu):
 * scores in shared memory, a stable softmax summed in double, one thread per output channel.
 * Visibility is vs_tree_mask_row's rule evaluated per slot instead of a byte row: thread 0
 * marks the query's ancestors (itself included) in a shared bitmap of the pending slots, and
 * slot s is visible iff (s < committed or its pending node is marked) and (s >= n_prefix or
 * prefix[s] or s is the query's own slot) - the same rule, with the slots spread over the
 * block's threads. An invisible slot's weight is exactly 0 and the value pass skips zero
 * weights, so a slot never written (inf or NaN) contributes nothing; a visible slot whose
 * weight underflows to 0 is skipped too, which changes nothing for the finite values a
 * written slot holds. */
#define VS_TATT_THREADS 128
/* the block reductions (cuda_reduce.h) keep their result in red[31]: warp 31 must not exist */
static_assert(VS_TATT_THREADS <= 31 * 32, "vs_block_max / vs_block_dsum use red[31]");
/* Dynamic shared memory: the default 48 KiB per block less the kernel's static 384 bytes
 * (no opt-in attribute needed on any architecture): about 12k slots at head_dim 64. */
#define VS_TATT_SHARED (48 * 1024 - 512)

/* Marks base + i and its ancestors in anc (bits over pending nodes); the block's threads
 * must have zeroed it. Parents precede children (vs_kv_tree_add checks it); a parent that
 * does not is treated as the root so that a bad array cannot loop forever. */
__device__ static void vs_tatt_ancestors(const vspec_kv_tree_view *t, int base, int i,
                                         uint32_t *anc) {
  if (threadIdx.x == 0)
    for (int a = base + i; a >= 0;) {
      anc[a >> 5] |= 1u << (a & 31);
      int p = t->parents[a];
      a = p < a ? p : -1;
    }
  __syncthreads();
}

__device__ static inline int vs_tatt_visible(const vspec_kv_tree_view *t, const uint32_t *anc,
                                             int L, int s, int self) {
  if (s >= L && !((anc[(s - L) >> 5] >> ((s - L) & 31)) & 1u)) return 0;
  return s >= t->n_prefix || t->prefix[s] || s == self;
}

__global__ void vs_k_tree_attention(const float *qkv, vspec_kv_cache kv, vspec_kv_tree_view t,
                                    float scale, float *out) {
  /* q [hd], scores [kv.slots], ancestor bits [(kv.slots + 31) / 32]: sized for the cache,
   * since the lengths are read here, on the device (a graph replays with new ones) */
  extern __shared__ float sh[];
  __shared__ float fred[32];
  __shared__ double dred[32];
  int H = kv.n_heads, hd = kv.head_dim, n = t.n;
  int L = t.lens[0], base = t.lens[1];
  /* in 64 bits: bad lengths must not wrap into a valid-looking one */
  long long len64 = (long long)L + base + n;
  int kv_len = (int)len64;
  if (L < 0 || base < 0 || len64 > kv.slots) { /* uniform over the block: zeros out */
    kv_len = 0;
    L = base = 0;
  }
  int h = blockIdx.x % H, ri = blockIdx.x / H, i = ri % n, r = ri / n;
  int g = h / (H / kv.kv_heads), words = kv_len ? (base + n + 31) / 32 : 0;
  int self = L + base + i;
  float *q = sh, *sc = sh + hd;
  uint32_t *anc = (uint32_t *)(sc + kv.slots);
  const float *qh = qkv + (size_t)ri * (H + 2 * kv.kv_heads) * hd + (size_t)h * hd;
  size_t head = ((size_t)r * kv.kv_heads + g) * kv.slots * hd;
  const float *kh = kv.k + head, *vh = kv.v + head;
  float *oh = out + (size_t)ri * H * hd + (size_t)h * hd;

  for (int c = threadIdx.x; c < hd; c += blockDim.x) q[c] = qh[c];
  for (int w = threadIdx.x; w < words; w += blockDim.x) anc[w] = 0u;
  __syncthreads();
  if (kv_len) vs_tatt_ancestors(&t, base, i, anc); /* ends with a barrier */
  __syncthreads();
  float local_max = -INFINITY;
  for (int s = threadIdx.x; s < kv_len; s += blockDim.x) {
    if (!vs_tatt_visible(&t, anc, L, s, self)) {
      sc[s] = -INFINITY;
      continue;
    }
    const float *ks = kh + (size_t)s * hd;
    float dot = 0.0f;
    for (int c = 0; c < hd; c++) dot += q[c] * ks[c];
    sc[s] = scale * dot;
    local_max = fmaxf(local_max, sc[s]);
  }
  float mx = vs_block_max(local_max, fred);
  if (mx == -INFINITY) { /* nothing visible (uniform over the block: no barrier skipped) */
    for (int c = threadIdx.x; c < hd; c += blockDim.x) oh[c] = 0.0f;
    return;
  }
  double local_sum = 0.0;
  for (int s = threadIdx.x; s < kv_len; s += blockDim.x) {
    /* vs_exp_poly: the CPU attention's exp (cpu_attention_softmax.c), one formula */
    float e = sc[s] == -INFINITY ? 0.0f : vs_exp_poly(sc[s] - mx);
    sc[s] = e;
    local_sum += e;
  }
  float fsum = (float)vs_block_dsum(local_sum, dred); /* >= 1: the maximum gives exp(0) */
  for (int s = threadIdx.x; s < kv_len; s += blockDim.x) sc[s] /= fsum;
  __syncthreads();
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < kv_len; s++)
      if (sc[s] != 0.0f) acc += sc[s] * vh[(size_t)s * hd + c];
    oh[c] = acc;
  }
}

/* The same op for a head_dim of 32, 64 or 128 (every LlamaGen and EAGLE shape), laid out for
 * memory latency: the first GPU profile (docs/BENCHMARKS.md, "On a GPU", second run) had the
 * kernel above at 27.6 us a layer over a 128-slot cache, 7.2 us over 1 slot, with its loads
 * used as soon as issued (a loop over channels or slots of run-time length cannot be
 * software-pipelined). Here every trip count is a constant: a warp loads VS_TATTF_KEYS whole
 * keys (lanes across the channels, coalesced) before it uses any, so a block waits on memory
 * about kv_len / (warps x keys) times per pass instead of once per slot. The ancestor walk
 * reads the parents from shared memory, staged there by the whole block (a 64-node chain
 * walked in global memory is 64 dependent loads). Same rule, same skip of zero weights (a
 * value is loaded but never multiplied by a zero weight, so NaN in an unseen slot stays out),
 * the softmax as above; the sums run in another order, so the bits differ from the kernel
 * above, within the tests' tolerance against the CPU. */
#define VS_TATTF_WARPS 8
#define VS_TATTF_KEYS 8
static_assert(VS_TATTF_WARPS * 32 <= 31 * 32, "vs_block_max / vs_block_dsum use red[31]");

template <int HD>
__global__ void __launch_bounds__(VS_TATTF_WARPS * 32)
    vs_k_tree_attention_hd(const float *qkv, vspec_kv_cache kv, vspec_kv_tree_view t,
                           float scale, float *out) {
  constexpr int CH = HD / 32; /* channels a lane holds: lane + 32 j */
  /* scores [kv.slots] (first the staged parents), ancestor bits [(kv.slots + 31) / 32], the
   * warps' partial outputs [VS_TATTF_WARPS][HD] */
  extern __shared__ float sh[];
  __shared__ float fred[32];
  __shared__ double dred[32];
  int H = kv.n_heads, n = t.n;
  int L = t.lens[0], base = t.lens[1];
  long long len64 = (long long)L + base + n; /* in 64 bits, as above */
  int kv_len = (int)len64;
  if (L < 0 || base < 0 || len64 > kv.slots) {
    kv_len = 0;
    L = base = 0;
  }
  int h = blockIdx.x % H, ri = blockIdx.x / H, i = ri % n, r = ri / n;
  int g = h / (H / kv.kv_heads), words = kv_len ? (base + n + 31) / 32 : 0;
  int self = L + base + i, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float *sc = sh;
  uint32_t *anc = (uint32_t *)(sc + kv.slots);
  float *part = (float *)(anc + (kv.slots + 31) / 32);
  const float *qh = qkv + (size_t)ri * (H + 2 * kv.kv_heads) * HD + (size_t)h * HD;
  size_t head = ((size_t)r * kv.kv_heads + g) * kv.slots * HD;
  const float *kh = kv.k + head, *vh = kv.v + head;
  float *oh = out + (size_t)ri * H * HD + (size_t)h * HD;

  float qr[CH];
#pragma unroll
  for (int j = 0; j < CH; j++) qr[j] = qh[lane + 32 * j];
  for (int w = threadIdx.x; w < words; w += blockDim.x) anc[w] = 0u;
  if (kv_len) { /* uniform over the block */
    int *par = (int *)sc; /* the scores' room is free until the scores */
    for (int a = threadIdx.x; a < base + n; a += blockDim.x) par[a] = t.parents[a];
    __syncthreads();
    if (threadIdx.x == 0) /* as vs_tatt_ancestors: a parent that is not earlier ends it */
      for (int a = base + i; a >= 0;) {
        anc[a >> 5] |= 1u << (a & 31);
        int p = par[a];
        a = p < a ? p : -1;
      }
  }
  __syncthreads();

  /* scores: a past-the-end key is read at slot kv_len - 1 (memory of the cache) and dropped */
  float local_max = -INFINITY;
  for (int s0 = warp * VS_TATTF_KEYS; s0 < kv_len; s0 += VS_TATTF_WARPS * VS_TATTF_KEYS) {
    float kr[VS_TATTF_KEYS][CH], dot[VS_TATTF_KEYS];
#pragma unroll
    for (int u = 0; u < VS_TATTF_KEYS; u++) {
      const float *ks = kh + (size_t)min(s0 + u, kv_len - 1) * HD;
#pragma unroll
      for (int j = 0; j < CH; j++) kr[u][j] = ks[lane + 32 * j];
    }
#pragma unroll
    for (int u = 0; u < VS_TATTF_KEYS; u++) {
      dot[u] = 0.0f;
#pragma unroll
      for (int j = 0; j < CH; j++) dot[u] += qr[j] * kr[u][j];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) dot[u] += __shfl_xor_sync(0xffffffffu, dot[u], off);
    }
#pragma unroll
    for (int u = 0; u < VS_TATTF_KEYS; u++) {
      int s = s0 + u;
      if (s >= kv_len) break;
      float v = vs_tatt_visible(&t, anc, L, s, self) ? scale * dot[u] : -INFINITY;
      if (lane == 0) sc[s] = v;
      local_max = fmaxf(local_max, v);
    }
  }
  float mx = vs_block_max(local_max, fred); /* its barriers publish sc[] too */
  if (mx == -INFINITY) { /* nothing visible (uniform over the block) */
    for (int c = threadIdx.x; c < HD; c += blockDim.x) oh[c] = 0.0f;
    return;
  }
  double local_sum = 0.0;
  for (int s = threadIdx.x; s < kv_len; s += blockDim.x) {
    float e = sc[s] == -INFINITY ? 0.0f : vs_exp_poly(sc[s] - mx);
    sc[s] = e;
    local_sum += e;
  }
  float fsum = (float)vs_block_dsum(local_sum, dred);
  for (int s = threadIdx.x; s < kv_len; s += blockDim.x) sc[s] /= fsum;
  __syncthreads();

  /* values: the same chunks of keys, loaded before they are weighed */
  float acc[CH];
#pragma unroll
  for (int j = 0; j < CH; j++) acc[j] = 0.0f;
  for (int s0 = warp * VS_TATTF_KEYS; s0 < kv_len; s0 += VS_TATTF_WARPS * VS_TATTF_KEYS) {
    float vr[VS_TATTF_KEYS][CH], p[VS_TATTF_KEYS];
#pragma unroll
    for (int u = 0; u < VS_TATTF_KEYS; u++) {
      int s = min(s0 + u, kv_len - 1);
      p[u] = s0 + u < kv_len ? sc[s] : 0.0f;
      const float *vs = vh + (size_t)s * HD;
#pragma unroll
      for (int j = 0; j < CH; j++) vr[u][j] = vs[lane + 32 * j];
    }
#pragma unroll
    for (int u = 0; u < VS_TATTF_KEYS; u++)
      if (p[u] != 0.0f)
#pragma unroll
        for (int j = 0; j < CH; j++) acc[j] += p[u] * vr[u][j];
  }
#pragma unroll
  for (int j = 0; j < CH; j++) part[warp * HD + lane + 32 * j] = acc[j];
  __syncthreads();
  for (int c = threadIdx.x; c < HD; c += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < VS_TATTF_WARPS; w++) o += part[w * HD + c];
    oh[c] = o;
  }
}

/* Checks the view against the cache; 0 (failure recorded) when it does not fit. */
static int cf_tree_ok(vs_cuda_dev *d, const vspec_kv_cache *kv, const vspec_kv_tree_view *t,
                      size_t *shared) {
  int ok = t && t->n > 0 && t->lens && t->parents && t->n_prefix >= 0 &&
           (t->n_prefix == 0 || t->prefix);
  if (!ok) {
    vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: tree_attention: bad tree view", d->head.index);
    return 0;
  }
  /* committed and base are device values: the kernel reads them and refuses (zeros out) a
   * length past the cache; here the shared memory is sized for the whole cache */
  *shared = ((size_t)kv->head_dim + (size_t)kv->slots + (size_t)(kv->slots + 31) / 32) * 4;
  if (t->n > kv->slots || *shared > VS_TATT_SHARED) {
    vs_cuda_fail(d, VSPEC_ERANGE,
                 "cuda:%d: tree_attention: %d queries, a cache of %d slots (shared memory for "
                 "about %d)", d->head.index, t->n, kv->slots,
                 (int)(VS_TATT_SHARED / 4 - kv->head_dim) * 32 / 33);
    return 0;
  }
  return 1;
}

void vs_cuda_tree_attention(vspec_dev *dev, const float *qkv, const vspec_kv_cache *kv,
                            const vspec_kv_tree_view *tree, float *out) {
  vs_cuda_dev *d = vs_cuda(dev);
  size_t shared = 0;
  if (d->failed || !vs_cuda_enter(d) || !cf_kv_ok(d, kv, "tree_attention") ||
      !cf_tree_ok(d, kv, tree, &shared))
    return;
  float scale = (float)(1.0 / sqrt((double)kv->head_dim));
  unsigned blocks = (unsigned)kv->rows * tree->n * kv->n_heads;
  int hd = kv->head_dim;
  size_t fast = ((size_t)kv->slots + (size_t)(kv->slots + 31) / 32 +
                 (size_t)VS_TATTF_WARPS * hd) * 4;
  dim3 grid(blocks), block(VS_TATTF_WARPS * 32);
  if (fast > VS_TATT_SHARED || (hd != 32 && hd != 64 && hd != 128))
    vs_k_tree_attention<<<blocks, VS_TATT_THREADS, shared, d->stream>>>(qkv, *kv, *tree, scale,
                                                                        out);
  else if (hd == 64)
    vs_k_tree_attention_hd<64><<<grid, block, fast, d->stream>>>(qkv, *kv, *tree, scale, out);
  else if (hd == 128)
    vs_k_tree_attention_hd<128><<<grid, block, fast, d->stream>>>(qkv, *kv, *tree, scale, out);
  else
    vs_k_tree_attention_hd<32><<<grid, block, fast, d->stream>>>(qkv, *kv, *tree, scale, out);
  VS_CUDA_LAUNCHED(d, "tree_attention");
}
