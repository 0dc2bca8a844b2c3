/*
 * kernels/cpu/cpu_norm.c - RMSNorm (LlamaGen gpt.py, RMSNorm) and GroupNorm
 * (vq_model.py, Normalize: 32 groups, eps 1e-6).
 */
#include <math.h>

#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_isa.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define VS_NORM_SIMD 1
#include <immintrin.h>
#else
#define VS_NORM_SIMD 0
#endif

/* Sum of squares of a row in double: the mean of squares over a few thousand channels loses
 * several bits in a float running sum, and this scale multiplies every activation. Eight
 * partial sums (channel i goes to sum i mod 8), added in a fixed tree (vs_sum8): one running
 * sum is a chain of dependent adds that cost 7 % of a tree verify. */
static double sum_squares(const float *x, int dim) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= dim; i += 8)
    for (int t = 0; t < 8; t++) s[t] += (double)x[i + t] * (double)x[i + t];
  for (int t = 0; i + t < dim; t++) s[t] += (double)x[i + t] * (double)x[i + t];
  return vs_sum8(s);
}

static void rms_row_scalar(const float *x, const float *w, int dim, float eps, float *y) {
  float inv = vs_rms_inv(sum_squares(x, dim), dim, eps);
  for (int i = 0; i < dim; i++) y[i] = vs_rms_apply(x[i], inv, w[i]);
}

/* The vector rows give the scalar row's bits: the eight partial sums are the eight double
 * lanes (a float's square is exact in double, so the order of each lane's adds is all that
 * matters, and it is the same), and (x * inv) * w is two rounded multiplies lane by lane.
 * Before these, the scalar loop cost 8 % of a 16-node CFG verify on models/fmnist. */
#if VS_NORM_SIMD
__attribute__((target("avx512f,avx512vl"))) static void rms_row_512(const float *x, const float *w,
                                                           int dim, float eps, float *y) {
  __m512d s = _mm512_setzero_pd();
  int i = 0;
  for (; i + 8 <= dim; i += 8) {
    __m512d v = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
    s = _mm512_add_pd(s, _mm512_mul_pd(v, v));
  }
  if (i < dim) { /* absent lanes add 0 * 0, which leaves a sum of squares (>= +0) as it is */
    __m512d v = _mm512_cvtps_pd(_mm256_maskz_loadu_ps((__mmask8)((1u << (dim - i)) - 1u), x + i));
    s = _mm512_add_pd(s, _mm512_mul_pd(v, v));
  }
  double p[8];
  _mm512_storeu_pd(p, s);
  const __m512 inv = _mm512_set1_ps(vs_rms_inv(vs_sum8(p), dim, eps));
  /* whole vectors by plain stores: the next op reads y at once, and a load waits for a masked
   * store to reach the cache */
  for (i = 0; i + 16 <= dim; i += 16)
    _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), inv),
                                          _mm512_loadu_ps(w + i)));
  if (i < dim) {
    __mmask16 in = (__mmask16)((1u << (dim - i)) - 1u);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, x + i), inv);
    _mm512_mask_storeu_ps(y + i, in, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(in, w + i)));
  }
}

__attribute__((target("avx2"))) static void rms_row_256(const float *x, const float *w, int dim,
                                                        float eps, float *y) {
  __m256d lo = _mm256_setzero_pd(), hi = lo; /* partial sums 0-3 and 4-7 */
  int i = 0;
  for (; i + 8 <= dim; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), b = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    lo = _mm256_add_pd(lo, _mm256_mul_pd(a, a));
    hi = _mm256_add_pd(hi, _mm256_mul_pd(b, b));
  }
  double p[8];
  _mm256_storeu_pd(p, lo);
  _mm256_storeu_pd(p + 4, hi);
  for (int t = 0; i + t < dim; t++) p[t] += (double)x[i + t] * (double)x[i + t];
  float inv_s = vs_rms_inv(vs_sum8(p), dim, eps);
  const __m256 inv = _mm256_set1_ps(inv_s);
  for (i = 0; i + 8 <= dim; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv),
                                          _mm256_loadu_ps(w + i)));
  for (; i < dim; i++) y[i] = vs_rms_apply(x[i], inv_s, w[i]);
}
#endif

void vs_cpu_rmsnorm(vspec_dev *dev, const float *x, const float *w, int rows, int dim, float eps,
                    float *y) {
  VS_CPU_UNRECORDED(dev, "rmsnorm");
  if (dim <= 0) return;
  void (*row)(const float *, const float *, int, float, float *) = rms_row_scalar;
#if VS_NORM_SIMD
  if (dev->isa >= VS_ISA_AVX512) row = rms_row_512;
  else if (dev->isa >= VS_ISA_AVX2) row = rms_row_256;
#endif
  for (int r = 0; r < rows; r++) row(x + (size_t)r * dim, w, dim, eps, y + (size_t)r * dim);
}

void vs_cpu_layernorm(vspec_dev *dev, const float *x, const float *w, const float *b, int rows,
                      int dim, float eps, float *y) {
  VS_CPU_UNRECORDED(dev, "layernorm");
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
  VS_CPU_UNRECORDED(dev, "groupnorm");
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
