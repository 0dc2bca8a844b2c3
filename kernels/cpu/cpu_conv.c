/*
 * kernels/cpu/cpu_conv.c - 2-D convolution (im2col + sgemm) and nearest-neighbour x2
 * upsampling for the VQ decoder (LlamaGen tokenizer/tokenizer_image/vq_model.py: ResnetBlock,
 * Upsample, Decoder).
 *
 * y[cout, ho*wo] = W[cout, cin*kh*kw] * col[cin*kh*kw, ho*wo]. The column matrix of a full
 * 256x256, 128-channel 3x3 layer would be 288 MiB, so it is built a band of output rows at
 * a time, sized to stay around VS_CONV_TILE_BYTES: large enough that the sgemm's n
 * dimension (rows * wo) keeps BLIS efficient, small enough to stay in L2/L3.
 */
#include <string.h>

#include "kernels/cpu/cpu_dev.h"

#define VS_CONV_TILE_BYTES ((size_t)4 << 20)

/* Column rows for output rows [r0, r0 + nr): col[(ci*kh + ki)*kw + kj][(r - r0)*wo + ox]
 * = x[ci][r*stride - pt + ki][ox*stride - pl + kj], zero outside the image. */
static void im2col_band(const float *x, int cin, int h, int w, int kh, int kw, int stride,
                        int pt, int pl, int wo, int r0, int nr, float *col) {
  size_t ncols = (size_t)nr * wo;
  for (int ci = 0; ci < cin; ci++) {
    const float *xc = x + (size_t)ci * h * w;
    for (int ki = 0; ki < kh; ki++) {
      for (int kj = 0; kj < kw; kj++) {
        float *dst = col + ((size_t)(ci * kh + ki) * kw + kj) * ncols;
        /* ox range whose input column ox*stride - pl + kj lies inside [0, w) */
        int off = kj - pl;
        int lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
        int hi = (w - 1 - off) >= 0 ? (w - 1 - off) / stride + 1 : 0; /* exclusive */
        if (hi > wo) hi = wo;
        if (lo > hi) lo = hi;
        for (int rr = 0; rr < nr; rr++) {
          float *d = dst + (size_t)rr * wo;
          int iy = (r0 + rr) * stride - pt + ki;
          if (iy < 0 || iy >= h || lo == hi) {
            memset(d, 0, (size_t)wo * sizeof(float));
            continue;
          }
          const float *src = xc + (size_t)iy * w;
          if (lo > 0) memset(d, 0, (size_t)lo * sizeof(float));
          if (stride == 1) {
            memcpy(d + lo, src + lo + off, (size_t)(hi - lo) * sizeof(float));
          } else {
            for (int ox = lo; ox < hi; ox++) d[ox] = src[ox * stride + off];
          }
          if (hi < wo) memset(d + hi, 0, (size_t)(wo - hi) * sizeof(float));
        }
      }
    }
  }
}

void vs_cpu_conv2d(vspec_dev *dev, const float *x, int cin, int h, int w, const float *weight,
                   const float *bias, int cout, int kh, int kw, int stride, int pad_top,
                   int pad_left, int pad_bottom, int pad_right, float *y) {
  VS_CPU_UNRECORDED(dev, "conv2d");
  if (cout <= 0 || stride <= 0 || kh <= 0 || kw <= 0) return;
  int ho_span = h + pad_top + pad_bottom - kh, wo_span = w + pad_left + pad_right - kw;
  if (ho_span < 0 || wo_span < 0) return;
  int ho = ho_span / stride + 1, wo = wo_span / stride + 1;
  size_t hw_out = (size_t)ho * wo;
  int kdim = cin * kh * kw;

  /* seed the output with the bias; the products accumulate onto it (beta = 1) */
  for (int co = 0; co < cout; co++) {
    float b = bias ? bias[co] : 0.0f;
    float *yc = y + (size_t)co * hw_out;
    for (size_t i = 0; i < hw_out; i++) yc[i] = b;
  }
  if (kdim <= 0) return;

  if (kh == 1 && kw == 1 && stride == 1 && pad_top == 0 && pad_left == 0 && ho == h &&
      wo == w) {
    /* pointwise conv: the input already is the column matrix */
    vs_sgemm(dev, 0, 0, cout, (int)hw_out, cin, 1.0f, weight, cin, x, (int)hw_out, 1.0f, y,
             (int)hw_out);
    return;
  }

  size_t band_row_bytes = (size_t)kdim * wo * sizeof(float);
  size_t budget = vs_scratch_size(dev) < VS_CONV_TILE_BYTES ? vs_scratch_size(dev)
                                                            : VS_CONV_TILE_BYTES;
  size_t fit = budget / band_row_bytes;
  int band = fit < 1 ? 1 : (fit < (size_t)ho ? (int)fit : ho);
  float *col = vs_scratch(dev, (size_t)band * band_row_bytes);

  for (int r0 = 0; r0 < ho; r0 += band) {
    int nr = ho - r0 < band ? ho - r0 : band;
    int ncols = nr * wo;
    im2col_band(x, cin, h, w, kh, kw, stride, pad_top, pad_left, wo, r0, nr, col);
    vs_sgemm(dev, 0, 0, cout, ncols, kdim, 1.0f, weight, kdim, col, ncols, 1.0f,
             y + (size_t)r0 * wo, (int)hw_out);
  }
}

void vs_cpu_upsample_nearest2x(vspec_dev *dev, const float *x, int channels, int h, int w,
                               float *y) {
  VS_CPU_UNRECORDED(dev, "upsample_nearest2x");
  size_t w2 = (size_t)w * 2;
  for (int c = 0; c < channels; c++) {
    const float *xc = x + (size_t)c * h * w;
    float *yc = y + (size_t)c * h * 2 * w2;
    for (int i = 0; i < h; i++) {
      float *row = yc + (size_t)(2 * i) * w2;
      const float *src = xc + (size_t)i * w;
      for (int j = 0; j < w; j++) row[2 * j] = row[2 * j + 1] = src[j];
      memcpy(row + w2, row, w2 * sizeof(float));
    }
  }
}
