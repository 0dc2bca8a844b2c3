/*
 * kernels/cpu/cpu_norm.c - RMSNorm (LlamaGen gpt.py, RMSNorm) and GroupNorm
 * (vq_model.py, Normalize: 32 groups, eps 1e-6).
 */
#include <math.h>

#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_dev.h"

/* Sum of squares of a row in double: the mean of squares over a few thousand channels loses
 * several bits in a float running sum, and this scale multiplies every activation. Eight
 * partial sums (channel i goes to sum i mod 8), added in a fixed tree: one running sum is a
 * chain of dependent adds that cost 7 % of a tree verify; independent partials vectorise
 * without reassociating anything, so the result does not depend on the compiler or ISA. */
static double sum_squares(const float *x, int dim) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= dim; i += 8)
    for (int t = 0; t < 8; t++) s[t] += (double)x[i + t] * (double)x[i + t];
  for (int t = 0; i + t < dim; t++) s[t] += (double)x[i + t] * (double)x[i + t];
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

void vs_cpu_rmsnorm(vspec_dev *dev, const float *x, const float *w, int rows, int dim, float eps,
                    float *y) {
  if (dim <= 0) return;
  for (int r = 0; r < rows; r++) {
    const float *xr = x + (size_t)r * dim;
    float *yr = y + (size_t)r * dim;
    float inv = vs_rms_inv(sum_squares(xr, dim), dim, eps);
    for (int i = 0; i < dim; i++) yr[i] = vs_rms_apply(xr[i], inv, w[i]);
  }
}

void vs_cpu_layernorm(vspec_dev *dev, const float *x, const float *w, const float *b, int rows,
                      int dim, float eps, float *y) {
  if (dim <= 0) return;
  for (int r = 0; r < rows; r++) {
    const float *xr = x + (size_t)r * dim;
    float *yr = y + (size_t)r * dim;
    /* two passes in double, as GroupNorm below: a row's values can sit far from zero */
    double s = 0.0;
    for (int i = 0; i < dim; i++) s += xr[i];
    double mean = s / dim, sq = 0.0;
    for (int i = 0; i < dim; i++) {
      double d = (double)xr[i] - mean;
      sq += d * d;
    }
    float m = (float)mean, rstd = vs_ln_rstd(sq / dim, eps);
    for (int i = 0; i < dim; i++) yr[i] = vs_ln_apply(xr[i], m, rstd, w, b, i);
  }
}

/* gamma/beta may be NULL (no affine), which GroupNorm(affine=False) would need. A channel
 * count that is not a multiple of `groups` is a caller error; PyTorch rejects it. */
void vs_cpu_groupnorm(vspec_dev *dev, const float *x, int channels, int hw, int groups, float eps,
                      const float *gamma, const float *beta, float *y) {
  if (groups <= 0 || channels <= 0 || hw <= 0) return;
  int cpg = channels / groups;
  size_t count = (size_t)cpg * hw;
  for (int g = 0; g < groups; g++) {
    const float *xg = x + (size_t)g * count;
    float *yg = y + (size_t)g * count;
    /* two passes in double: the group holds up to C/32 * H * W ~ 260k values at the VQ
     * decoder's largest level, where the one-pass E[x^2]-E[x]^2 form cancels badly */
    double sum = 0.0;
    for (size_t i = 0; i < count; i++) sum += xg[i];
    double mean = sum / (double)count;
    double sq = 0.0;
    for (size_t i = 0; i < count; i++) {
      double d = (double)xg[i] - mean;
      sq += d * d;
    }
    double rstd = 1.0 / sqrt(sq / (double)count + (double)eps);
    for (int c = 0; c < cpg; c++) {
      int ch = g * cpg + c;
      double scale = rstd * (gamma ? gamma[ch] : 1.0f);
      double shift = beta ? beta[ch] : 0.0f;
      const float *xc = xg + (size_t)c * hw;
      float *yc = yg + (size_t)c * hw;
      /* centre in double: folding the mean into a float bias (x*s + b, as PyTorch's
       * kernel does) cancels catastrophically when |mean| >> std */
      for (int i = 0; i < hw; i++) yc[i] = (float)(((double)xc[i] - mean) * scale + shift);
    }
  }
}
