/*
 * kernels/cpu/cpu_attention.c - masked multi-head attention over a KV cache (LlamaGen
 * gpt.py, Attention.forward: PyTorch scaled_dot_product_attention with a boolean mask).
 *
 * Per query head: S = Q_h K_g^T / sqrt(hd) by sgemm into scratch, masked stable softmax
 * row by row, then each output row O_h[i] = sum over the visible slots j of W[i, j] V_g[j],
 * accumulated slot by slot straight into the output. Queries are processed in chunks sized to
 * the scratch arena, so only one row of scores (n_kv floats) is ever required and the arena
 * never has to grow for realistic cache lengths.
 *
 * Why not sgemm for W V: it is a product of a few rows with a [n_kv, 64] matrix, and BLIS
 * packed both operands on every call: 16 % of a speculative-decoding run's time went to BLIS
 * there (perf, models/fmnist, Cool-SD with the draft GPT). Skipping masked slots also means a
 * slot never written (which may hold anything) is never read, and a row with nothing visible
 * comes out as zeros, as the ops contract says.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_linear_skinny.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define VS_ATTN_X86 1
#else
#define VS_ATTN_X86 0
#endif

/* o[0..hd) = sum over visible j of w[j] v[j, 0..hd), slot by slot in order of j, each element
 * a multiply then an add (no fused multiply-add), so every instruction set below gives the
 * same bits. */
static void weighted_sum_scalar(const float *w, const uint8_t *mask_row, int n_kv,
                                const float *v, int hd, float *o) {
  for (int d = 0; d < hd; d++) o[d] = 0.0f;
  for (int j = 0; j < n_kv; j++) {
    if (mask_row && !mask_row[j]) continue;
    const float *vj = v + (size_t)j * hd;
    for (int d = 0; d < hd; d++) o[d] = o[d] + w[j] * vj[d];
  }
}

#if VS_ATTN_X86
/* hd a multiple of 16, at most 256 (16 registers of accumulators). */
__attribute__((target("avx512f"))) static void weighted_sum_512(const float *w,
                                                                const uint8_t *mask_row, int n_kv,
                                                                const float *v, int hd, float *o) {
  __m512 acc[16];
  int nv = hd / 16;
  for (int t = 0; t < nv; t++) acc[t] = _mm512_setzero_ps();
  for (int j = 0; j < n_kv; j++) {
    if (mask_row && !mask_row[j]) continue;
    const __m512 wj = _mm512_set1_ps(w[j]);
    const float *vj = v + (size_t)j * hd;
    for (int t = 0; t < nv; t++)
      acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(wj, _mm512_loadu_ps(vj + 16 * t)));
  }
  for (int t = 0; t < nv; t++) _mm512_storeu_ps(o + 16 * t, acc[t]);
}

/* hd a multiple of 8, at most 128. */
__attribute__((target("avx2"))) static void weighted_sum_256(const float *w,
                                                             const uint8_t *mask_row, int n_kv,
                                                             const float *v, int hd, float *o) {
  __m256 acc[16];
  int nv = hd / 8;
  for (int t = 0; t < nv; t++) acc[t] = _mm256_setzero_ps();
  for (int j = 0; j < n_kv; j++) {
    if (mask_row && !mask_row[j]) continue;
    const __m256 wj = _mm256_set1_ps(w[j]);
    const float *vj = v + (size_t)j * hd;
    for (int t = 0; t < nv; t++)
      acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(wj, _mm256_loadu_ps(vj + 8 * t)));
  }
  for (int t = 0; t < nv; t++) _mm256_storeu_ps(o + 8 * t, acc[t]);
}
#endif

static void weighted_sum(const vspec_dev *dev, const float *w, const uint8_t *mask_row, int n_kv,
                         const float *v, int hd, float *o) {
#if VS_ATTN_X86
  if (dev->isa >= VS_ISA_AVX512 && hd % 16 == 0 && hd <= 256) {
    weighted_sum_512(w, mask_row, n_kv, v, hd, o);
    return;
  }
  if (dev->isa >= VS_ISA_AVX2 && hd % 8 == 0 && hd <= 128) {
    weighted_sum_256(w, mask_row, n_kv, v, hd, o);
    return;
  }
#endif
  weighted_sum_scalar(w, mask_row, n_kv, v, hd, o);
}

/* In place on scores s[0..n_kv): masked entries -> 0, the rest -> softmax weights.
 * Returns 0 (and zeros the row) when nothing is visible. */
static int masked_softmax_row(float *s, const uint8_t *mask_row, int n_kv) {
  float mx = -INFINITY;
  int any = 0;
  for (int j = 0; j < n_kv; j++) {
    if (mask_row && !mask_row[j]) continue;
    if (!any || s[j] > mx) mx = s[j];
    any = 1;
  }
  if (!any) {
    memset(s, 0, (size_t)n_kv * sizeof(float));
    return 0;
  }
  double sum = 0.0;
  for (int j = 0; j < n_kv; j++) {
    if (mask_row && !mask_row[j]) {
      s[j] = 0.0f;
      continue;
    }
    float e = expf(s[j] - mx);
    s[j] = e;
    sum += e;
  }
  float fsum = (float)sum; /* >= 1: the maximum contributes exp(0) */
  for (int j = 0; j < n_kv; j++) s[j] /= fsum;
  return 1;
}

void vs_cpu_attention(vspec_dev *dev, const float *q, int n_q, int q_stride, int n_heads,
                      int n_kv_heads, int head_dim, const float *k, const float *v,
                      int slot_stride, int n_kv, const uint8_t *mask, float *out) {
  if (n_q <= 0 || n_heads <= 0 || head_dim <= 0) return;
  size_t out_stride = (size_t)n_heads * head_dim;
  if (n_kv <= 0) { /* nothing to attend to: every row is "fully masked" */
    memset(out, 0, (size_t)n_q * out_stride * sizeof(float));
    return;
  }
  if (n_kv_heads <= 0) n_kv_heads = n_heads;
  int group = n_heads / n_kv_heads; /* query heads per kv head (repeat_interleave) */
  if (group < 1) group = 1;
  float scale = (float)(1.0 / sqrt((double)head_dim));

  size_t row_bytes = (size_t)n_kv * sizeof(float);
  size_t fit = vs_scratch_size(dev) / row_bytes;
  int chunk = fit < 1 ? 1 : (fit < (size_t)n_q ? (int)fit : n_q);
  float *s = vs_scratch(dev, (size_t)chunk * row_bytes);

  for (int h = 0; h < n_heads; h++) {
    size_t g = (size_t)(h / group);
    const float *kh = k + g * (size_t)slot_stride * head_dim;
    const float *vh = v + g * (size_t)slot_stride * head_dim;
    for (int i0 = 0; i0 < n_q; i0 += chunk) {
      int nc = n_q - i0 < chunk ? n_q - i0 : chunk;
      const float *qh = q + (size_t)i0 * q_stride + (size_t)h * head_dim;
      float *oh = out + (size_t)i0 * out_stride + (size_t)h * head_dim;
      vs_sgemm(dev, 0, 1, nc, n_kv, head_dim, scale, qh, q_stride, kh, head_dim, 0.0f, s, n_kv);
      for (int i = 0; i < nc; i++)
        masked_softmax_row(s + (size_t)i * n_kv, mask ? mask + (size_t)(i0 + i) * n_kv : NULL,
                           n_kv);
      for (int i = 0; i < nc; i++)
        weighted_sum(dev, s + (size_t)i * n_kv, mask ? mask + (size_t)(i0 + i) * n_kv : NULL,
                     n_kv, vh, head_dim, oh + (size_t)i * out_stride);
    }
  }
}
