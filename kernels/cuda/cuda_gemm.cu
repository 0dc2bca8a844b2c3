/*
 * kernels/cuda/cuda_gemm.cu - matrix products: cuBLAS for gemm and for linear layers, and
 * a few-row bf16 kernel for decoding.
 *
 * Row-major operands are the transposes of cuBLAS's column-major ones, so C = op(A) op(B)
 * is computed as C^T = op(B)^T op(A)^T with the operands swapped (the usual trick; no data
 * moves).
 *
 * Precision (vs_device_options.precision):
 *  - fp32 (parity): cublasSgemm with CUBLAS_PEDANTIC_MATH, so no TF32 or reduced-precision
 *    reductions: results differ from the CPU only by summation order.
 *  - bf16 (fast, the GPU default) applies to linear layers only: the weight's bf16 copy
 *    (cuda_memory.cu) is read instead of the fp32 matrix. Up to VS_CUDA_SKINNY_ROWS rows
 *    (decode steps, small trees) a kernel streams the bf16 weights once against fp32
 *    activations with fp32 accumulation (fused multiply-adds) - batch-1 decode is bound by
 *    weight bytes, which bf16 halves. The kernel also accumulates into y and fuses SwiGLU
 *    for the ABI 1.4 ops (cuda_fused.cu). Above that the activations are rounded to bf16 as well and cuBLAS runs
 *    the product on tensor cores with fp32 accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F).
 */
#include "kernels/common/vs_math.h"
#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_rope_store.h"

void vs_cuda_gemm(vspec_dev *dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
                  const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (m <= 0 || n <= 0 || d->failed || !vs_cuda_enter(d)) return;
  if (k <= 0) { /* C = beta C; cuBLAS accepts k = 0 and does exactly that */
    k = 0;
    /* ...but still checks the leading dimensions against max(1, rows) of the operands it
     * does not read (linear with n_in = 0 passes lda = ldb = 0); BLIS does not. */
    if (!trans_a && lda < 1) lda = 1;
    if (trans_a && lda < m) lda = m;
    if (!trans_b && ldb < n) ldb = n;
    if (trans_b && ldb < 1) ldb = 1;
  }
  vs_cuda_check_blas(d,
                     cublasSgemm(d->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, a,
                                 lda, &beta, c, ldc),
                     "cublasSgemm");
}

/* y[i, :] = bias, for seeding an accumulating product. */
__global__ void vs_k_bias_rows(float *y, const float *bias, int m, int n) {
  size_t total = (size_t)m * n;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x)
    y[i] = bias[i % (size_t)n];
}

__global__ void vs_k_f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = vs_f32_to_bf16(src[i]);
}

/* ---- the few-row bf16 kernel ------------------------------------------------------------
 * y[i, j] for i < R rows (R = 1..8, a template parameter so the accumulators live in
 * registers) and output column j. Decoding is bound by weight bytes, so the kernel is built
 * around streaming the bf16 weights:
 *  - each warp owns one column j (or a ksplit-th of its n_in terms, see below); its lanes read
 *    16 bytes (8 weights) at a time, two such loads in flight before the arithmetic, and the
 *    matching fp32 activations as float4 (rows re-read by every warp stay in L1/L2);
 *  - few outputs (n_out times ksplit warps below a full GPU's resident warps) split each
 *    column's terms over ksplit warps of one block, summed in shared memory in a fixed order:
 *    no atomics, the same bits on every run;
 *  - explicit fmaf (one rounding per term; --fmad=false leaves x*w+acc as two), which tests
 *    compare against a double sum with a tolerance.
 * Without 16-byte alignment (n_in % 8 != 0 or an offset activation pointer) a lane reads one
 * weight at a time instead. The epilogue (mode) stores, accumulates into y (linear_add), or
 * takes a second weight w3 and writes silu(x W^T) * (x W3^T) (norm_swiglu). */
#define VS_SKINNY_THREADS 256
#define VS_SKINNY_WARPS (VS_SKINNY_THREADS / 32)
/* the norm prologue's sums split over the threads as vs_k_rmsnorm's do: the same bits */
static_assert(VS_SKINNY_THREADS == VS_CUDA_NORM_THREADS, "vs_skinny_norm_rows mirrors rmsnorm");

/* Asks for the 128-byte line holding p in L2, without waiting for it. */
__device__ static inline void vs_prefetch_l2(const void *p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* The 8 bf16 weights of a 16-byte load as floats (bf16 is the top half of a float). */
__device__ static inline void vs_bf16x8(uint4 u, float *f) {
  uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int q = 0; q < 4; q++) {
    f[2 * q] = __uint_as_float(w[q] << 16);
    f[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u);
  }
}

/* acc[i] += x[i, k..k+7] . wf for each row (x rows 16-byte aligned). */
template <int R>
__device__ static inline void vs_dot8(const float *x, size_t n_in, size_t k, const float *wf,
                                      float *acc) {
#pragma unroll
  for (int i = 0; i < R; i++) {
    const float4 *xp = (const float4 *)(x + (size_t)i * n_in + k);
    float4 a = xp[0], b = xp[1];
    float s = acc[i];
    s = fmaf(a.x, wf[0], s);
    s = fmaf(a.y, wf[1], s);
    s = fmaf(a.z, wf[2], s);
    s = fmaf(a.w, wf[3], s);
    s = fmaf(b.x, wf[4], s);
    s = fmaf(b.y, wf[5], s);
    s = fmaf(b.z, wf[6], s);
    s = fmaf(b.w, wf[7], s);
    acc[i] = s;
  }
}

/* One warp's share of column j: terms k of chunks c = first, first + stride, ... (8 terms a
 * chunk when vec, else single terms). NW = 2 with a second weight row (swiglu). */
template <int R, int NW>
__device__ static void vs_skinny_terms(const float *x, int n_in, const uint16_t *const *wr,
                                       bool vec, int first, int stride, float (*acc)[R]) {
  if (vec) {
    int chunks = n_in / 8, c = first;
    for (; c + stride < chunks; c += 2 * stride) { /* two 16-byte loads per row in flight */
      uint4 u0[NW], u1[NW];
#pragma unroll
      for (int t = 0; t < NW; t++) {
        u0[t] = __ldg((const uint4 *)(wr[t] + (size_t)c * 8));
        u1[t] = __ldg((const uint4 *)(wr[t] + (size_t)(c + stride) * 8));
      }
#pragma unroll
      for (int t = 0; t < NW; t++) {
        float f[8];
        vs_bf16x8(u0[t], f);
        vs_dot8<R>(x, (size_t)n_in, (size_t)c * 8, f, acc[t]);
        vs_bf16x8(u1[t], f);
        vs_dot8<R>(x, (size_t)n_in, (size_t)(c + stride) * 8, f, acc[t]);
      }
    }
    if (c < chunks) {
#pragma unroll
      for (int t = 0; t < NW; t++) {
        float f[8];
        vs_bf16x8(__ldg((const uint4 *)(wr[t] + (size_t)c * 8)), f);
        vs_dot8<R>(x, (size_t)n_in, (size_t)c * 8, f, acc[t]);
      }
    }
    return;
  }
  for (int k = first; k < n_in; k += stride)
#pragma unroll
    for (int t = 0; t < NW; t++) {
      float wv = vs_bf16_to_f32(wr[t][k]);
#pragma unroll
      for (int i = 0; i < R; i++) acc[t][i] = fmaf(x[(size_t)i * n_in + k], wv, acc[t][i]);
    }
}

/* The R rows of x normalised into xs (shared, R x n_in), bit for bit as vs_k_rmsnorm
 * (cuda_norm.cu) normalises each: every thread sums its elements k = tid, tid + 256, ... in
 * double in that order, the warps reduce by the same shuffle tree and thread i adds the
 * warps' partials of row i from 0 in warp order. Laid out for latency, since the rows are
 * the previous kernel's output and every block waits for them: all R rows' loads of a
 * thread are issued together (VS_SKINNY_NORM_UNROLL elements each before any is used), the
 * R reductions share one barrier, and norm_w, which no kernel writes, was asked into L2
 * before the programmatic wait. The first profile of the fused kernel had a row-by-row
 * prologue (three dependent trips to memory and six barriers for two rows) costing about
 * as much as a separate norm launch (docs/BENCHMARKS.md, "On a GPU"). Ends with a barrier. */
#define VS_SKINNY_NORM_UNROLL 4
template <int R>
__device__ static const float *vs_skinny_norm_rows(const float *x, const float *norm_w,
                                                   float eps, int n_in, float *xs) {
  __shared__ double red[R][VS_SKINNY_WARPS];
  __shared__ float inv[R];
  double ss[R];
#pragma unroll
  for (int i = 0; i < R; i++) ss[i] = 0.0;
  int step = blockDim.x;
  for (int k0 = threadIdx.x; k0 < n_in; k0 += VS_SKINNY_NORM_UNROLL * step) {
    float v[VS_SKINNY_NORM_UNROLL][R];
#pragma unroll
    for (int u = 0; u < VS_SKINNY_NORM_UNROLL; u++) {
      int k = k0 + u * step;
#pragma unroll
      for (int i = 0; i < R; i++) v[u][i] = k < n_in ? x[(size_t)i * n_in + k] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < VS_SKINNY_NORM_UNROLL; u++) {
      int k = k0 + u * step;
      if (k >= n_in) break;
#pragma unroll
      for (int i = 0; i < R; i++) {
        xs[(size_t)i * n_in + k] = v[u][i];
        ss[i] += (double)v[u][i] * (double)v[u][i];
      }
    }
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int i = 0; i < R; i++) {
    double s = ss[i];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) red[i][warp] = s;
  }
  __syncthreads();
  if (threadIdx.x < R) {
    double s = 0.0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += red[threadIdx.x][w];
    inv[threadIdx.x] = vs_rms_inv(s, n_in, eps);
  }
  __syncthreads();
  for (int k = threadIdx.x; k < n_in; k += step) { /* the thread's own elements */
    float wk = norm_w[k];
#pragma unroll
    for (int i = 0; i < R; i++)
      xs[(size_t)i * n_in + k] = vs_rms_apply(xs[(size_t)i * n_in + k], inv[i], wk);
  }
  __syncthreads();
  return xs;
}

/* The RoPE epilogue (VS_SKINNY_ROPE): columns 2j and 2j + 1 of the q|k|v rows, summed as the
 * store mode sums them (plus a zero bias, as that mode adds), go through vs_rope_store_vals
 * (cuda_rope_store.h) as vs_k_rope_store would take them from memory: q and k rotated, k and v
 * also into the row's session's cache. Row i's session is the one-session op's, or the last
 * entry of a batch whose first row is at most i. */
template <int R>
__device__ static void vs_skinny_rope_rows(const vs_skinny_rope &rp, int j, const float *s0,
                                           const float *s1, float *qkv) {
  int hd = rp.hd, qkv_w = (rp.H + 2 * rp.Hkv) * hd;
  int c = 2 * j, hh = c / hd, pj = (c % hd) / 2;
#pragma unroll
  for (int i = 0; i < R; i++) {
    int k = 0;
    if (rp.es)
      while (k + 1 < rp.count && rp.es[k + 1].row0 <= i) k++;
    vspec_kv_cache kv = rp.es ? rp.es[k].kv : rp.kv;
    const int32_t *slots = rp.es ? rp.es[k].slots : rp.slots;
    int n = rp.es ? rp.es[k].tree.n : rp.n, ri = rp.es ? i - rp.es[k].row0 : i;
    int slot = hh >= rp.H ? slots[ri % n] : -1;
    vs_rope_store_vals(qkv + (size_t)i * qkv_w + (size_t)hh * hd, s0[i] + 0.0f, s1[i] + 0.0f,
                       hh, pj, rp.H, rp.Hkv, hd, rp.table + (size_t)rp.pos[i] * (hd / 2) * 2, kv,
                       ri / n, slot);
  }
}

template <int R, int MODE>
__global__ void __launch_bounds__(VS_SKINNY_THREADS)
    vs_k_skinny_bf16(const float *x, const float *norm_w, float eps, int n_in, const uint16_t *w,
                     const uint16_t *w3, int n_out, const float *bias, int ksplit, int vec,
                     vs_skinny_rope rope, float *y) {
  /* two weight rows a warp: w and w3 (SwiGLU), or rows 2j and 2j + 1 of w (RoPE's pair) */
  constexpr int NW = MODE == VS_SKINNY_SWIGLU || MODE == VS_SKINNY_ROPE ? 2 : 1;
  __shared__ float part[VS_SKINNY_WARPS][NW][R];
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int piece = warp % ksplit, j = blockIdx.x * (VS_SKINNY_WARPS / ksplit) + warp / ksplit;
  const uint16_t *wr[NW]; /* formed for every j, read only where j < n_out */
  wr[0] = w + (MODE == VS_SKINNY_ROPE ? 2 * (size_t)j : (size_t)j) * n_in;
  if (NW == 2) wr[NW - 1] = MODE == VS_SKINNY_ROPE ? wr[0] + n_in : w3 + (size_t)j * n_in;
  /* The weights do not depend on the kernel before this one: under programmatic dependent
   * launch they are fetched into L2 while it finishes (a prefetch changes no result). */
  if (j < n_out) /* one request per 128-byte line (64 weights) of the column's row */
    for (int t = 0; t < NW; t++)
      for (int c = piece * 32 + lane; c < (n_in + 63) / 64; c += 32 * ksplit)
        vs_prefetch_l2(wr[t] + (size_t)c * 64);
  if (norm_w) /* a weight too: its 128-byte lines (32 floats), for the norm below */
    for (int c = threadIdx.x; c < (n_in + 31) / 32; c += blockDim.x)
      vs_prefetch_l2(norm_w + (size_t)c * 32);
  VS_PDL_ENTER();
  if (norm_w) { /* the block's copy of the rows, normalised as vs_k_rmsnorm does */
    extern __shared__ float4 xs4[];
    x = vs_skinny_norm_rows<R>(x, norm_w, eps, n_in, (float *)xs4);
  }
  /* j is the same for a whole warp, so shuffles below see full warps; no thread returns
   * before the barrier */
  float acc[NW][R];
#pragma unroll
  for (int t = 0; t < NW; t++)
#pragma unroll
    for (int i = 0; i < R; i++) acc[t][i] = 0.0f;
  if (j < n_out)
    vs_skinny_terms<R, NW>(x, n_in, wr, vec != 0, piece * 32 + lane, 32 * ksplit, acc);
#pragma unroll
  for (int t = 0; t < NW; t++)
#pragma unroll
    for (int i = 0; i < R; i++) {
      float s = acc[t][i];
      for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
      acc[t][i] = s; /* lane 0 holds the warp's sum */
    }
  if (ksplit > 1) {
    if (lane == 0)
#pragma unroll
      for (int t = 0; t < NW; t++)
#pragma unroll
        for (int i = 0; i < R; i++) part[warp][t][i] = acc[t][i];
    __syncthreads();
    if (lane == 0 && piece == 0)
#pragma unroll
      for (int t = 0; t < NW; t++)
#pragma unroll
        for (int i = 0; i < R; i++) {
          float s = part[warp][t][i];
          for (int p = 1; p < ksplit; p++) s += part[warp + p][t][i];
          acc[t][i] = s;
        }
  }
  if (lane != 0 || piece != 0 || j >= n_out) return;
  if (MODE == VS_SKINNY_ROPE) {
    vs_skinny_rope_rows<R>(rope, j, acc[0], acc[NW - 1], y);
  } else {
#pragma unroll
    for (int i = 0; i < R; i++) {
      float *yo = y + (size_t)i * n_out + j;
      if (MODE == VS_SKINNY_STORE) *yo = acc[0][i] + (bias ? bias[j] : 0.0f);
      else if (MODE == VS_SKINNY_ADD) *yo += acc[0][i];
      else *yo = vs_swiglu(acc[0][i], acc[NW - 1][i]);
    }
  }
}

/* Warps per column: 1 while n_out columns fill a large GPU's resident warps (an H100 holds
 * about 8k), else more, up to the block's 8 warps, keeping at least 256 terms per warp. */
static int cg_skinny_split(int n_in, int n_out) {
  int k = 1;
  while (k < VS_SKINNY_WARPS && (long)n_out * k < 8192 && n_in / (2 * k) >= 256) k *= 2;
  return k;
}

/* One few-row product's arguments, carried from the entry points to the launch. In RoPE mode
 * n_out counts pairs of columns (qkv_w / 2) and w3 is unused. */
typedef struct cg_skinny_args {
  const float *x, *norm_w, *bias;
  float eps;
  int m, n_in, n_out, mode;
  const uint16_t *w, *w3;
  vs_skinny_rope rope;
  float *y;
} cg_skinny_args;

template <int R>
static int cg_skinny_launch(vs_cuda_dev *d, const cg_skinny_args *a) {
  int mode = a->mode, rope = mode == VS_SKINNY_ROPE;
  /* the split of the plain product of all the columns: each column's terms in the same order,
   * so the RoPE mode's sums are the store mode's bit for bit */
  int ksplit = cg_skinny_split(a->n_in, rope ? 2 * a->n_out : a->n_out);
  /* with norm_w the kernel reads its shared copy of the rows, always aligned */
  int vec = a->n_in % 8 == 0 && (a->norm_w || (uintptr_t)a->x % 16 == 0) &&
            (uintptr_t)a->w % 16 == 0 && (uintptr_t)a->w3 % 16 == 0;
  int cols = VS_SKINNY_WARPS / ksplit;
  unsigned blocks = (unsigned)((a->n_out + cols - 1) / cols);
  return vs_cuda_launch(d, rope ? "norm_qkv_rope (bf16, few rows)" : "linear (bf16, few rows)",
                        mode == VS_SKINNY_ADD      ? vs_k_skinny_bf16<R, VS_SKINNY_ADD>
                        : mode == VS_SKINNY_SWIGLU ? vs_k_skinny_bf16<R, VS_SKINNY_SWIGLU>
                        : rope                     ? vs_k_skinny_bf16<R, VS_SKINNY_ROPE>
                                                   : vs_k_skinny_bf16<R, VS_SKINNY_STORE>,
                        blocks, VS_SKINNY_THREADS,
                        a->norm_w ? (size_t)R * a->n_in * sizeof(float) : 0, a->x, a->norm_w,
                        a->eps, a->n_in, a->w, a->w3, a->n_out, a->bias, ksplit, vec, a->rope,
                        a->y);
}

/* Rows the few-row kernel normalises itself: m x n_in floats in its shared memory, within
 * the default 48 KiB with room for its own arrays. */
#define VS_SKINNY_NORM_BYTES (40 * 1024)
int vs__cuda_skinny_norms(int m, int n_in) {
  return m >= 1 && m <= VS_CUDA_SKINNY_ROWS && n_in > 0 &&
         (size_t)m * n_in * sizeof(float) <= VS_SKINNY_NORM_BYTES;
}

static int cg_skinny(vs_cuda_dev *d, const cg_skinny_args *a) {
  if (a->m < 1 || a->m > VS_CUDA_SKINNY_ROWS || a->n_out <= 0 ||
      (a->mode == VS_SKINNY_SWIGLU && !a->w3) ||
      (a->norm_w && !vs__cuda_skinny_norms(a->m, a->n_in))) {
    vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: few-row bf16 product of %d rows", d->head.index,
                 a->m);
    return 0;
  }
  switch (a->m) {
    case 1: return cg_skinny_launch<1>(d, a);
    case 2: return cg_skinny_launch<2>(d, a);
    case 3: return cg_skinny_launch<3>(d, a);
    case 4: return cg_skinny_launch<4>(d, a);
    case 5: return cg_skinny_launch<5>(d, a);
    case 6: return cg_skinny_launch<6>(d, a);
    case 7: return cg_skinny_launch<7>(d, a);
    default: return cg_skinny_launch<8>(d, a);
  }
}

int vs__cuda_skinny_bf16(vs_cuda_dev *d, const float *x, const float *norm_w, float eps, int m,
                         int n_in, const uint16_t *w, const uint16_t *w3, int n_out,
                         const float *bias, int mode, float *y) {
  if (mode != VS_SKINNY_STORE && mode != VS_SKINNY_ADD && mode != VS_SKINNY_SWIGLU) {
    vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: few-row bf16 product: mode %d", d->head.index, mode);
    return 0; /* RoPE has its own entry, below */
  }
  cg_skinny_args a = {x, norm_w, bias, eps, m, n_in, n_out, mode, w, w3, {}, y};
  return cg_skinny(d, &a);
}

int vs__cuda_skinny_qkv_rope(vs_cuda_dev *d, const float *x, const float *norm_w, float eps,
                             int m, int n_in, const uint16_t *w, const vs_skinny_rope *rope,
                             float *qkv) {
  int qkv_w = (rope->H + 2 * rope->Hkv) * rope->hd;
  if (rope->hd % 2) {
    vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: few-row norm_qkv_rope: odd head_dim %d",
                 d->head.index, rope->hd);
    return 0;
  }
  cg_skinny_args a = {x, norm_w, NULL, eps, m, n_in, qkv_w / 2, VS_SKINNY_ROPE, w, w + n_in,
                      *rope, qkv};
  return cg_skinny(d, &a);
}

/* ---- bf16 on tensor cores ------------------------------------------------------------------ */

int vs__cuda_to_bf16(vs_cuda_dev *d, uint16_t *dst, const float *src, size_t n) {
  vs_k_f32_to_bf16<<<vs_cuda_grid(n, 256), 256, 0, d->stream>>>(dst, src, n);
  return VS_CUDA_LAUNCHED(d, "linear (bf16 activations)");
}

int vs__cuda_gemm_bf16(vs_cuda_dev *d, const uint16_t *xb, int m, int n_in, const uint16_t *wb,
                       int n_out, float beta, float *y) {
  float alpha = 1.0f;
  /* The handle is in CUBLAS_PEDANTIC_MATH for fp32 parity, which turns CUBLAS_COMPUTE_32F
   * into CUBLAS_COMPUTE_32F_PEDANTIC and may keep bf16 inputs off the tensor cores. Lift it
   * for this call (fp32 accumulation either way: C and the compute type are fp32); the math
   * mode is host-side handle state read at enqueue time, so restoring it right after is
   * safe. */
  if (!vs_cuda_check_blas(d, cublasSetMathMode(d->blas, CUBLAS_DEFAULT_MATH),
                          "cublasSetMathMode (bf16)"))
    return 0;
  int ok = vs_cuda_check_blas(d,
                              cublasGemmEx(d->blas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, m, n_in,
                                           &alpha, wb, CUDA_R_16BF, n_in, xb, CUDA_R_16BF, n_in,
                                           &beta, y, CUDA_R_32F, n_out, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT),
                              "cublasGemmEx (bf16)");
  ok &= vs_cuda_check_blas(d, cublasSetMathMode(d->blas, CUBLAS_PEDANTIC_MATH),
                           "cublasSetMathMode (restore pedantic)");
  return ok;
}

const uint16_t *vs__cuda_bf16_weight(vs_cuda_dev *d, const float *w, int n_out, int n_in) {
  if (d->precision != VS_PRECISION_BF16 || n_in <= 0 || n_out <= 0) return nullptr;
  return vs_cuda_weight_bf16(d, w, (size_t)n_out * n_in);
}

static int cg_linear_bf16(vs_cuda_dev *d, const float *x, int m, int n_in, const float *w,
                          int n_out, const float *bias, float *y) {
  /* n_in = 0 (y = bias) takes the fp32 path: cublasGemmEx rejects lda = 0 */
  const uint16_t *wb = vs__cuda_bf16_weight(d, w, n_out, n_in);
  if (!wb) return 0; /* not a weight allocation (or no memory for the copy): fp32 */
  if (m <= VS_CUDA_SKINNY_ROWS) {
    vs__cuda_skinny_bf16(d, x, nullptr, 0.0f, m, n_in, wb, nullptr, n_out, bias, VS_SKINNY_STORE,
                         y);
    return 1;
  }
  size_t nx = (size_t)m * n_in;
  uint16_t *xb = (uint16_t *)vs__cuda_op_scratch(d, nx * sizeof(uint16_t), "linear (bf16)");
  if (!xb || !vs__cuda_to_bf16(d, xb, x, nx)) return 1; /* the failure is recorded */
  float beta = 0.0f;
  if (bias) {
    vs_k_bias_rows<<<vs_cuda_grid((size_t)m * n_out, 256), 256, 0, d->stream>>>(y, bias, m,
                                                                                n_out);
    if (!VS_CUDA_LAUNCHED(d, "linear (bias)")) return 1;
    beta = 1.0f;
  }
  vs__cuda_gemm_bf16(d, xb, m, n_in, wb, n_out, beta, y);
  return 1;
}

void vs_cuda_linear(vspec_dev *dev, const float *x, int m, int n_in, const float *w, int n_out,
                    const float *bias, float *y) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (m <= 0 || n_out <= 0 || d->failed || !vs_cuda_enter(d)) return;
  if (d->precision == VS_PRECISION_BF16 && cg_linear_bf16(d, x, m, n_in, w, n_out, bias, y))
    return;
  float beta = 0.0f;
  if (bias) {
    vs_k_bias_rows<<<vs_cuda_grid((size_t)m * n_out, 256), 256, 0, d->stream>>>(y, bias, m,
                                                                                n_out);
    if (!VS_CUDA_LAUNCHED(d, "linear (bias)")) return;
    beta = 1.0f;
  }
  vs_cuda_gemm(dev, 0, 1, m, n_out, n_in, 1.0f, x, n_in, w, n_in, beta, y, n_out);
}
