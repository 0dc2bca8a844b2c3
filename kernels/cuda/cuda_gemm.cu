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
 *    activations with fp32 accumulation - batch-1 decode is bound by weight bytes, which
 *    bf16 halves. Above that the activations are rounded to bf16 as well and cuBLAS runs
 *    the product on tensor cores with fp32 accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F).
 */
#include "kernels/common/vs_math.h"
#include "kernels/cuda/cuda_dev.h"

#define VS_CUDA_SKINNY_ROWS 8

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

/* One warp per output column j: streams weight row j (bf16) once and dots it with every
 * activation row (fp32), accumulating in fp32; lanes then reduce with shuffles. */
__global__ void vs_k_linear_skinny_bf16(const float *x, int m, int n_in, const uint16_t *w,
                                        int n_out, const float *bias, float *y) {
  int lane = threadIdx.x & 31;
  int j = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
  if (j >= n_out) return;
  float acc[VS_CUDA_SKINNY_ROWS];
  for (int i = 0; i < VS_CUDA_SKINNY_ROWS; i++) acc[i] = 0.0f;
  const uint16_t *wr = w + (size_t)j * n_in;
  for (int kk = lane; kk < n_in; kk += 32) {
    float wv = vs_bf16_to_f32(wr[kk]);
    for (int i = 0; i < m; i++) acc[i] += x[(size_t)i * n_in + kk] * wv;
  }
  for (int i = 0; i < m; i++) {
    float s = acc[i];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) y[(size_t)i * n_out + j] = s + (bias ? bias[j] : 0.0f);
  }
}

static int vs__linear_bf16(vs_cuda_dev *d, const float *x, int m, int n_in, const float *w,
                           int n_out, const float *bias, float *y) {
  if (n_in <= 0) return 0; /* y = bias: the fp32 path (cublasGemmEx rejects lda = 0) */
  const uint16_t *wb = vs_cuda_weight_bf16(d, w, (size_t)n_out * n_in);
  if (!wb) return 0; /* not a weight allocation (or no memory for the copy): fp32 */
  if (m <= VS_CUDA_SKINNY_ROWS) {
    unsigned threads = 256, warps_per_block = threads / 32;
    unsigned blocks = (unsigned)((n_out + warps_per_block - 1) / warps_per_block);
    vs_k_linear_skinny_bf16<<<blocks, threads, 0, d->stream>>>(x, m, n_in, wb, n_out, bias, y);
    VS_CUDA_LAUNCHED(d, "linear (bf16, few rows)");
    return 1;
  }
  size_t nx = (size_t)m * n_in;
  uint16_t *xb = (uint16_t *)vs_cuda_scratch(d, nx * sizeof(uint16_t));
  if (!xb) return 1; /* the failure is recorded */
  vs_k_f32_to_bf16<<<vs_cuda_grid(nx, 256), 256, 0, d->stream>>>(xb, x, nx);
  if (!VS_CUDA_LAUNCHED(d, "linear (bf16 activations)")) return 1;
  float alpha = 1.0f, beta = 0.0f;
  if (bias) {
    vs_k_bias_rows<<<vs_cuda_grid((size_t)m * n_out, 256), 256, 0, d->stream>>>(y, bias, m,
                                                                                n_out);
    if (!VS_CUDA_LAUNCHED(d, "linear (bias)")) return 1;
    beta = 1.0f;
  }
  /* The handle is in CUBLAS_PEDANTIC_MATH for fp32 parity, which turns CUBLAS_COMPUTE_32F
   * into CUBLAS_COMPUTE_32F_PEDANTIC and may keep bf16 inputs off the tensor cores. Lift it
   * for this call (fp32 accumulation either way: C and the compute type are fp32); the math
   * mode is host-side handle state read at enqueue time, so restoring it right after is
   * safe. */
  if (!vs_cuda_check_blas(d, cublasSetMathMode(d->blas, CUBLAS_DEFAULT_MATH),
                          "cublasSetMathMode (bf16)"))
    return 1;
  vs_cuda_check_blas(d,
                     cublasGemmEx(d->blas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, m, n_in, &alpha, wb,
                                  CUDA_R_16BF, n_in, xb, CUDA_R_16BF, n_in, &beta, y, CUDA_R_32F,
                                  n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx (bf16)");
  vs_cuda_check_blas(d, cublasSetMathMode(d->blas, CUBLAS_PEDANTIC_MATH),
                     "cublasSetMathMode (restore pedantic)");
  return 1;
}

void vs_cuda_linear(vspec_dev *dev, const float *x, int m, int n_in, const float *w, int n_out,
                    const float *bias, float *y) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (m <= 0 || n_out <= 0 || d->failed || !vs_cuda_enter(d)) return;
  if (d->precision == VS_PRECISION_BF16 && vs__linear_bf16(d, x, m, n_in, w, n_out, bias, y))
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
