/*
 * kernels/cuda/cuda_norm.cu - RMSNorm and GroupNorm, one block per row or group.
 *
 * Sums are taken in double as on the CPU (kernels/cpu/cpu_norm.c says why); the scale and
 * the per-element formulas are the shared ones of kernels/common/vs_math.h. Only the
 * order of the double summation differs from the CPU.
 */
#include "kernels/common/vs_math.h"
#include "kernels/cuda/cuda_dev.h"

#define VS_NORM_THREADS VS_CUDA_NORM_THREADS

/* Sum of v over the block; every thread gets the result. */
__device__ static double vs_block_sum(double v) {
  __shared__ double part[VS_NORM_THREADS / 32];
  __shared__ double total;
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) s += part[i];
    total = s;
  }
  __syncthreads();
  double r = total;
  __syncthreads(); /* `part` and `total` may be reused by the next call */
  return r;
}

/* Row blockIdx.x of y from row idx[blockIdx.x] of x (idx NULL: the same row); Out is float,
 * or uint16_t for bf16 activations (rmsnorm feeding a tensor-core product, cuda_fused.cu). */
__device__ static inline void vs_store(float *y, float v) { *y = v; }
__device__ static inline void vs_store(uint16_t *y, float v) { *y = vs_f32_to_bf16(v); }

template <typename Out>
__global__ void vs_k_rmsnorm(const float *x, const int32_t *idx, const float *w, int dim,
                             float eps, Out *y) {
  VS_PDL_ENTER();
  size_t src = idx ? (size_t)idx[blockIdx.x] : blockIdx.x;
  const float *xr = x + src * dim;
  Out *yr = y + (size_t)blockIdx.x * dim;
  double ss = 0.0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)xr[i] * (double)xr[i];
  ss = vs_block_sum(ss);
  float inv = vs_rms_inv(ss, dim, eps);
  /* y may equal x: every thread has read its elements before the reduction's barrier. */
  for (int i = threadIdx.x; i < dim; i += blockDim.x)
    vs_store(yr + i, vs_rms_apply(xr[i], inv, w[i]));
}

int vs__cuda_rmsnorm_launch(vs_cuda_dev *d, const float *x, const int32_t *idx, int rows,
                            int dim, const float *w, float eps, float *y, uint16_t *yb) {
  if (y)
    return vs_cuda_launch(d, "rmsnorm", vs_k_rmsnorm<float>, rows, VS_NORM_THREADS, 0, x, idx,
                          w, dim, eps, y);
  return vs_cuda_launch(d, "rmsnorm", vs_k_rmsnorm<uint16_t>, rows, VS_NORM_THREADS, 0, x, idx,
                        w, dim, eps, yb);
}

void vs_cuda_rmsnorm(vspec_dev *dev, const float *x, const float *w, int rows, int dim, float eps,
                     float *y) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (rows <= 0 || dim <= 0 || d->failed || !vs_cuda_enter(d)) return;
  vs__cuda_rmsnorm_launch(d, x, NULL, rows, dim, w, eps, y, NULL);
}

/* LayerNorm: one block per row; mean and biased variance in double, two passes (as the
 * CPU). */
__global__ void vs_k_layernorm(const float *x, const float *w, const float *b, int dim,
                               float eps, float *y) {
  const float *xr = x + (size_t)blockIdx.x * dim;
  float *yr = y + (size_t)blockIdx.x * dim;
  double s = 0.0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) s += xr[i];
  double mean = vs_block_sum(s) / dim;
  double sq = 0.0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    double dv = (double)xr[i] - mean;
    sq += dv * dv;
  }
  float rstd = vs_ln_rstd(vs_block_sum(sq) / dim, eps), m = (float)mean;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = vs_ln_apply(xr[i], m, rstd, w, b, i);
}

void vs_cuda_layernorm(vspec_dev *dev, const float *x, const float *w, const float *b, int rows,
                       int dim, float eps, float *y) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (rows <= 0 || dim <= 0 || d->failed || !vs_cuda_enter(d)) return;
  vs_k_layernorm<<<rows, VS_NORM_THREADS, 0, d->stream>>>(x, w, b, dim, eps, y);
  VS_CUDA_LAUNCHED(d, "layernorm");
}

/* One block per group of cpg consecutive channels of hw values each. */
__global__ void vs_k_groupnorm(const float *x, int cpg, int hw, float eps, const float *gamma,
                               const float *beta, float *y) {
  size_t count = (size_t)cpg * hw;
  const float *xg = x + (size_t)blockIdx.x * count;
  float *yg = y + (size_t)blockIdx.x * count;
  double s = 0.0;
  for (size_t i = threadIdx.x; i < count; i += blockDim.x) s += xg[i];
  double mean = vs_block_sum(s) / (double)count;
  double sq = 0.0;
  for (size_t i = threadIdx.x; i < count; i += blockDim.x) {
    double dv = (double)xg[i] - mean;
    sq += dv * dv;
  }
  double rstd = 1.0 / sqrt(vs_block_sum(sq) / (double)count + (double)eps);
  for (size_t i = threadIdx.x; i < count; i += blockDim.x) {
    int ch = blockIdx.x * cpg + (int)(i / (size_t)hw);
    double scale = rstd * (gamma ? gamma[ch] : 1.0f);
    double shift = beta ? beta[ch] : 0.0f;
    yg[i] = (float)(((double)xg[i] - mean) * scale + shift);
  }
}

void vs_cuda_groupnorm(vspec_dev *dev, const float *x, int channels, int hw, int groups,
                       float eps, const float *gamma, const float *beta, float *y) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (groups <= 0 || channels <= 0 || hw <= 0 || d->failed || !vs_cuda_enter(d)) return;
  vs_k_groupnorm<<<groups, VS_NORM_THREADS, 0, d->stream>>>(x, channels / groups, hw, eps, gamma,
                                                           beta, y);
  VS_CUDA_LAUNCHED(d, "groupnorm");
}
