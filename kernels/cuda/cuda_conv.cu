/*
 * kernels/cuda/cuda_conv.cu - 2-D convolution as im2col + cuBLAS, a band of output rows at
 * a time (the CPU's scheme, kernels/cpu/cpu_conv.c), for the VQ decoder.
 */
#include "kernels/cuda/cuda_dev.h"

/* Column matrix of the VQ decoder's largest layer at 256x256 would be 288 MiB: bands keep
 * the scratch at about this size. */
#define VS_CUDA_CONV_TILE_BYTES ((size_t)64 << 20)

/* col[(ci*kh + ki)*kw + kj][(r - r0)*wo + ox] = x[ci][r*stride - pt + ki][ox*stride - pl + kj],
 * zero outside the image; one thread per column-matrix element. */
__global__ void vs_k_im2col(const float *x, int cin, int h, int w, int kh, int kw, int stride,
                            int pt, int pl, int wo, int r0, int nr, float *col) {
  size_t ncols = (size_t)nr * wo, total = (size_t)cin * kh * kw * ncols;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t colx = i % ncols, row = i / ncols;
    int kj = (int)(row % (size_t)kw), ki = (int)((row / (size_t)kw) % (size_t)kh);
    int ci = (int)(row / ((size_t)kw * kh));
    int ox = (int)(colx % (size_t)wo), rr = (int)(colx / (size_t)wo);
    int iy = (r0 + rr) * stride - pt + ki, ix = ox * stride - pl + kj;
    col[i] = (iy >= 0 && iy < h && ix >= 0 && ix < w) ? x[((size_t)ci * h + iy) * w + ix] : 0.0f;
  }
}

__global__ void vs_k_bias_channels(float *y, const float *bias, int cout, size_t hw) {
  size_t total = (size_t)cout * hw;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x)
    y[i] = bias ? bias[i / hw] : 0.0f;
}

void vs_cuda_conv2d(vspec_dev *dev, const float *x, int cin, int h, int w, const float *weight,
                    const float *bias, int cout, int kh, int kw, int stride, int pad_top,
                    int pad_left, int pad_bottom, int pad_right, float *y) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (cout <= 0 || stride <= 0 || kh <= 0 || kw <= 0 || d->failed || !vs_cuda_enter(d)) return;
  int ho_span = h + pad_top + pad_bottom - kh, wo_span = w + pad_left + pad_right - kw;
  if (ho_span < 0 || wo_span < 0) return;
  int ho = ho_span / stride + 1, wo = wo_span / stride + 1;
  size_t hw_out = (size_t)ho * wo;
  int kdim = cin * kh * kw;
  /* seed the output with the bias; the products accumulate onto it (beta = 1) */
  vs_k_bias_channels<<<vs_cuda_grid((size_t)cout * hw_out, 256), 256, 0, d->stream>>>(
      y, bias, cout, hw_out);
  if (!VS_CUDA_LAUNCHED(d, "conv2d (bias)") || kdim <= 0) return;
  if (kh == 1 && kw == 1 && stride == 1 && pad_top == 0 && pad_left == 0 && ho == h && wo == w) {
    /* pointwise: the input already is the column matrix */
    vs_cuda_gemm(dev, 0, 0, cout, (int)hw_out, cin, 1.0f, weight, cin, x, (int)hw_out, 1.0f, y,
                 (int)hw_out);
    return;
  }
  size_t band_row_bytes = (size_t)kdim * wo * sizeof(float);
  int band = (int)(VS_CUDA_CONV_TILE_BYTES / band_row_bytes);
  if (band < 1) band = 1;
  if (band > ho) band = ho;
  float *col = (float *)vs__cuda_op_scratch(d, (size_t)band * band_row_bytes, "conv2d");
  if (!col) return;
  for (int r0 = 0; r0 < ho; r0 += band) {
    int nr = ho - r0 < band ? ho - r0 : band;
    size_t total = (size_t)kdim * nr * wo;
    vs_k_im2col<<<vs_cuda_grid(total, 256), 256, 0, d->stream>>>(
        x, cin, h, w, kh, kw, stride, pad_top, pad_left, wo, r0, nr, col);
    if (!VS_CUDA_LAUNCHED(d, "conv2d (im2col)")) return;
    /* y[:, r0*wo .. (r0+nr)*wo) += W col */
    vs_cuda_gemm(dev, 0, 0, cout, nr * wo, kdim, 1.0f, weight, kdim, col, nr * wo, 1.0f,
                 y + (size_t)r0 * wo, (int)hw_out);
  }
}
