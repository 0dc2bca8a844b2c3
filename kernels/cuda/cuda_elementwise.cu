/*
 * kernels/cuda/cuda_elementwise.cu - activations, residual adds, CFG combination and
 * nearest upsampling. The per-element formulas are the CPU's (kernels/common/vs_math.h).
 */
#include "kernels/common/vs_math.h"
#include "kernels/cuda/cuda_dev.h"

#define VS_GRID_STRIDE(i, n)                                                   \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
       i += (size_t)gridDim.x * blockDim.x)

__global__ void vs_k_silu(float *x, size_t n) {
  VS_GRID_STRIDE(i, n) x[i] = vs_silu(x[i]);
}

__global__ void vs_k_swiglu(const float *gate, const float *up, size_t n, float *y) {
  VS_GRID_STRIDE(i, n) y[i] = vs_swiglu(gate[i], up[i]);
}

__global__ void vs_k_gelu_tanh(float *x, size_t n) {
  VS_GRID_STRIDE(i, n) x[i] = vs_gelu_tanh(x[i]);
}

__global__ void vs_k_gelu(float *x, size_t n) {
  VS_GRID_STRIDE(i, n) x[i] = vs_gelu_erf(x[i]);
}

__global__ void vs_k_mul(float *y, const float *x, size_t n) {
  VS_GRID_STRIDE(i, n) y[i] *= x[i];
}

__global__ void vs_k_add(float *y, const float *x, size_t n) {
  VS_GRID_STRIDE(i, n) y[i] += x[i];
}

__global__ void vs_k_cfg(const float *cond, const float *uncond, size_t n, float scale,
                         float *out) {
  VS_GRID_STRIDE(i, n) out[i] = vs_cfg_mix(cond[i], uncond[i], scale);
}

__global__ void vs_k_upsample2x(const float *x, int channels, int h, int w, float *y) {
  size_t total = (size_t)channels * 4 * h * w;
  int W2 = 2 * w, H2 = 2 * h;
  VS_GRID_STRIDE(i, total) {
    size_t j = i % (size_t)W2, r = (i / (size_t)W2) % (size_t)H2, c = i / ((size_t)W2 * H2);
    y[i] = x[(c * h + r / 2) * (size_t)w + j / 2];
  }
}

#define VS_LAUNCH(d, kernel, n, ...)                                                   \
  do {                                                                                 \
    if ((n) == 0 || (d)->failed || !vs_cuda_enter(d)) return;                          \
    kernel<<<vs_cuda_grid((n), 256), 256, 0, (d)->stream>>>(__VA_ARGS__);              \
    VS_CUDA_LAUNCHED((d), #kernel);                                                    \
  } while (0)

void vs_cuda_silu(vspec_dev *dev, float *x, size_t n) { VS_LAUNCH(vs_cuda(dev), vs_k_silu, n, x, n); }

void vs_cuda_swiglu(vspec_dev *dev, const float *gate, const float *up, size_t n, float *y) {
  VS_LAUNCH(vs_cuda(dev), vs_k_swiglu, n, gate, up, n, y);
}

void vs_cuda_gelu_tanh(vspec_dev *dev, float *x, size_t n) {
  VS_LAUNCH(vs_cuda(dev), vs_k_gelu_tanh, n, x, n);
}

void vs_cuda_gelu(vspec_dev *dev, float *x, size_t n) {
  VS_LAUNCH(vs_cuda(dev), vs_k_gelu, n, x, n);
}

void vs_cuda_mul(vspec_dev *dev, float *y, const float *x, size_t n) {
  VS_LAUNCH(vs_cuda(dev), vs_k_mul, n, y, x, n);
}

void vs_cuda_add(vspec_dev *dev, float *y, const float *x, size_t n) {
  VS_LAUNCH(vs_cuda(dev), vs_k_add, n, y, x, n);
}

void vs_cuda_cfg_combine(vspec_dev *dev, const float *cond, const float *uncond, size_t n,
                         float scale, float *out) {
  VS_LAUNCH(vs_cuda(dev), vs_k_cfg, n, cond, uncond, n, scale, out);
}

void vs_cuda_upsample_nearest2x(vspec_dev *dev, const float *x, int channels, int h, int w,
                                float *y) {
  size_t n = channels > 0 && h > 0 && w > 0 ? (size_t)channels * 4 * h * w : 0;
  VS_LAUNCH(vs_cuda(dev), vs_k_upsample2x, n, x, channels, h, w, y);
}
