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
 *
 * Why the softmax and W V have vector loops of their own: once the linear layers ran on AMX,
 * attention was the part of a tree verify that grew with the rows. On a GPT-B shape with a
 * 16-node tree, two CFG rows and 129 cached tokens, the attention of one forward took 14.1 ms
 * of CPU time with a scalar expf softmax and one W V row at a time, and 5.6 ms with the
 * softmax below (vs_exp_poly on 16 lanes) and four rows per pass over V (Xeon SPR).
 */
#include <math.h>
#include <string.h>

#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_exp_simd.h"
#include "kernels/cpu/cpu_linear_skinny.h"

/* Query rows whose W V share one pass over the values (the AVX-512 loop, head_dim 64). */
#define VS_ATTN_ROW_GROUP 4

/* ---- W V ------------------------------------------------------------------------------------
 * o_r[0..hd) = sum over the slots j visible to row r of w_r[j] v[j, 0..hd), slot by slot in
 * order of j, one fused multiply-add per element (fmaf in the scalar loop, the same bits as
 * the vector instructions'). Rows r < nr of a group: weights at w + r * n_kv, mask rows at
 * mask + r * n_kv, outputs at o + r * o_stride. */
static void weighted_sum_scalar(const float *w, const uint8_t *mask, int nr, int n_kv,
                                const float *v, int hd, float *o, size_t o_stride) {
  for (int r = 0; r < nr; r++) {
    const float *wr = w + (size_t)r * n_kv;
    const uint8_t *mr = mask ? mask + (size_t)r * n_kv : NULL;
    float *orow = o + (size_t)r * o_stride;
    for (int d = 0; d < hd; d++) orow[d] = 0.0f;
    for (int j = 0; j < n_kv; j++) {
      if (mr && !mr[j]) continue;
      const float *vj = v + (size_t)j * hd;
      for (int d = 0; d < hd; d++) orow[d] = fmaf(wr[j], vj[d], orow[d]);
    }
  }
}

#if VS_EXP_SIMD
/* head_dim 64, up to four rows: one load of a slot's values serves every row that sees it,
 * and the 16 independent accumulators keep both FMA ports busy (one row alone waits on the
 * latency of its four). Written out row by row: as an array indexed by the row, GCC kept
 * the accumulators in memory. */
#define VS_ATTN_ROW_FMA(r, a0, a1, a2, a3)                           \
  do {                                                               \
    if (see##r) {                                                    \
      const __m512 wj = _mm512_set1_ps(w[(size_t)(r) * n_kv + j]);   \
      a0 = _mm512_fmadd_ps(wj, v0, a0);                              \
      a1 = _mm512_fmadd_ps(wj, v1, a1);                              \
      a2 = _mm512_fmadd_ps(wj, v2, a2);                              \
      a3 = _mm512_fmadd_ps(wj, v3, a3);                              \
    }                                                                \
  } while (0)

__attribute__((target("avx512f,fma"))) static void weighted_sum_512_hd64(
    const float *w, const uint8_t *mask, int nr, int n_kv, const float *v, float *o,
    size_t o_stride) {
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
  __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
  __m512 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
  __m512 a30 = a00, a31 = a00, a32 = a00, a33 = a00;
  const uint8_t *m0 = mask, *m1 = mask ? mask + n_kv : NULL;
  const uint8_t *m2 = mask ? mask + 2 * (size_t)n_kv : NULL;
  const uint8_t *m3 = mask ? mask + 3 * (size_t)n_kv : NULL;
  for (int j = 0; j < n_kv; j++) {
    const int see0 = !m0 || m0[j], see1 = nr > 1 && (!m1 || m1[j]);
    const int see2 = nr > 2 && (!m2 || m2[j]), see3 = nr > 3 && (!m3 || m3[j]);
    if (!(see0 | see1 | see2 | see3)) continue;
    const float *vj = v + (size_t)j * 64;
    const __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16);
    const __m512 v2 = _mm512_loadu_ps(vj + 32), v3 = _mm512_loadu_ps(vj + 48);
    VS_ATTN_ROW_FMA(0, a00, a01, a02, a03);
    VS_ATTN_ROW_FMA(1, a10, a11, a12, a13);
    VS_ATTN_ROW_FMA(2, a20, a21, a22, a23);
    VS_ATTN_ROW_FMA(3, a30, a31, a32, a33);
  }
  const __m512 acc[VS_ATTN_ROW_GROUP][4] = {
      {a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}, {a30, a31, a32, a33}};
  for (int r = 0; r < nr; r++)
    for (int t = 0; t < 4; t++) _mm512_storeu_ps(o + (size_t)r * o_stride + 16 * t, acc[r][t]);
}
#undef VS_ATTN_ROW_FMA

/* One row, hd a multiple of 16, at most 256 (16 registers of accumulators). */
__attribute__((target("avx512f,fma"))) static void weighted_sum_512(const float *w,
                                                                    const uint8_t *mask_row,
                                                                    int n_kv, const float *v,
                                                                    int hd, float *o) {
  __m512 acc[16];
  int nv = hd / 16;
  for (int t = 0; t < nv; t++) acc[t] = _mm512_setzero_ps();
  for (int j = 0; j < n_kv; j++) {
    if (mask_row && !mask_row[j]) continue;
    const __m512 wj = _mm512_set1_ps(w[j]);
    const float *vj = v + (size_t)j * hd;
    for (int t = 0; t < nv; t++) acc[t] = _mm512_fmadd_ps(wj, _mm512_loadu_ps(vj + 16 * t), acc[t]);
  }
  for (int t = 0; t < nv; t++) _mm512_storeu_ps(o + 16 * t, acc[t]);
}

/* One row, hd a multiple of 8, at most 128. */
__attribute__((target("avx2,fma"))) static void weighted_sum_256(const float *w,
                                                                 const uint8_t *mask_row,
                                                                 int n_kv, const float *v, int hd,
                                                                 float *o) {
  __m256 acc[16];
  int nv = hd / 8;
  for (int t = 0; t < nv; t++) acc[t] = _mm256_setzero_ps();
  for (int j = 0; j < n_kv; j++) {
    if (mask_row && !mask_row[j]) continue;
    const __m256 wj = _mm256_set1_ps(w[j]);
    const float *vj = v + (size_t)j * hd;
    for (int t = 0; t < nv; t++) acc[t] = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vj + 8 * t), acc[t]);
  }
  for (int t = 0; t < nv; t++) _mm256_storeu_ps(o + 8 * t, acc[t]);
}
#endif

/* W V for rows 0..nr-1 (nr <= VS_ATTN_ROW_GROUP) of a chunk, in the device's instruction set. */
static void weighted_sum(const vspec_dev *dev, const float *w, const uint8_t *mask, int nr,
                         int n_kv, const float *v, int hd, float *o, size_t o_stride) {
#if VS_EXP_SIMD
  if (dev->isa >= VS_ISA_AVX512 && hd == 64) {
    weighted_sum_512_hd64(w, mask, nr, n_kv, v, o, o_stride);
    return;
  }
  for (int r = 0; r < nr; r++) {
    const float *wr = w + (size_t)r * n_kv;
    const uint8_t *mr = mask ? mask + (size_t)r * n_kv : NULL;
    if (dev->isa >= VS_ISA_AVX512 && hd % 16 == 0 && hd <= 256)
      weighted_sum_512(wr, mr, n_kv, v, hd, o + (size_t)r * o_stride);
    else if (dev->isa >= VS_ISA_AVX2 && hd % 8 == 0 && hd <= 128)
      weighted_sum_256(wr, mr, n_kv, v, hd, o + (size_t)r * o_stride);
    else
      weighted_sum_scalar(wr, mr, 1, n_kv, v, hd, o + (size_t)r * o_stride, o_stride);
  }
#else
  weighted_sum_scalar(w, mask, nr, n_kv, v, hd, o, o_stride);
#endif
}

/* ---- masked softmax -------------------------------------------------------------------------
 * In place on scores s[0..n): masked entries -> 0, the rest -> e^(s - max) / sum. e is
 * vs_exp_poly; the sum is kept in 16 partial sums (entry j in sum j mod 16) that are added
 * in halves (8 + 8, 4 + 4, 2 + 2, 1 + 1), so the scalar and both vector loops give the same
 * bits. Returns 0 (and zeros the row) when nothing is visible. */
static float sum16(float *part) {
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; i++) part[i] = part[i] + part[i + w];
  return part[0];
}

static int softmax_scalar(float *s, const uint8_t *mask, int n) {
  float mx = -INFINITY;
  int any = 0;
  for (int j = 0; j < n; j++) {
    if (mask && !mask[j]) continue;
    if (!any || s[j] > mx) mx = s[j];
    any = 1;
  }
  if (!any) {
    memset(s, 0, (size_t)n * sizeof(float));
    return 0;
  }
  float part[16] = {0};
  for (int j = 0; j < n; j++) {
    float e = mask && !mask[j] ? 0.0f : vs_exp_poly(s[j] - mx);
    s[j] = e;
    part[j % 16] += e;
  }
  float sum = sum16(part); /* >= 1: the maximum contributes e^0 */
  for (int j = 0; j < n; j++) s[j] = s[j] / sum;
  return 1;
}

#if VS_EXP_SIMD
/* Lanes of entries j .. j+15 that are present (j + lane < n) and visible. */
__attribute__((target("avx512f"))) static __mmask16 visible16(const uint8_t *mask, int j, int n) {
  int left = n - j;
  __mmask16 in = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
  if (!mask) return in;
  uint8_t pad[16] = {0};
  const uint8_t *m = mask + j;
  if (left < 16) memcpy(pad, m, (size_t)left), m = pad;
  __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)m));
  return in & _mm512_test_epi32_mask(b, b);
}

__attribute__((target("avx512f"))) static int softmax_512(float *s, const uint8_t *mask, int n) {
  __m512 vmx = _mm512_set1_ps(-INFINITY);
  int any = 0;
  for (int j = 0; j < n; j += 16) {
    __mmask16 vis = visible16(mask, j, n);
    any |= vis != 0;
    vmx = _mm512_mask_max_ps(vmx, vis, vmx, _mm512_maskz_loadu_ps(vis, s + j));
  }
  if (!any) {
    memset(s, 0, (size_t)n * sizeof(float));
    return 0;
  }
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));
  __m512 part = _mm512_setzero_ps();
  int j = 0;
  /* two chunks per step: an exponential is a long chain of dependent operations, and two
   * independent ones fill the pipeline (entries still go to lane j mod 16 in order of j) */
  for (; j + 32 <= n; j += 32) {
    __mmask16 vis0 = visible16(mask, j, n), vis1 = visible16(mask, j + 16, n);
    __m512 e0 = _mm512_maskz_mov_ps(vis0, exp_poly_512(_mm512_sub_ps(_mm512_loadu_ps(s + j), mx)));
    __m512 e1 = _mm512_maskz_mov_ps(
        vis1, exp_poly_512(_mm512_sub_ps(_mm512_loadu_ps(s + j + 16), mx)));
    _mm512_storeu_ps(s + j, e0);
    _mm512_storeu_ps(s + j + 16, e1);
    part = _mm512_add_ps(_mm512_add_ps(part, e0), e1);
  }
  for (; j < n; j += 16) {
    int left = n - j;
    __mmask16 in = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
    __mmask16 vis = visible16(mask, j, n);
    __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(vis, s + j), mx);
    __m512 e = _mm512_maskz_mov_ps(vis, exp_poly_512(x));
    _mm512_mask_storeu_ps(s + j, in, e);
    part = _mm512_add_ps(part, e);
  }
  float p[16];
  _mm512_storeu_ps(p, part);
  const __m512 sum = _mm512_set1_ps(sum16(p));
  for (int i = 0; i < n; i += 16) {
    int left = n - i;
    __mmask16 in = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
    _mm512_mask_storeu_ps(s + i, in, _mm512_div_ps(_mm512_maskz_loadu_ps(in, s + i), sum));
  }
  return 1;
}

/* Lanes of entries j .. j+7 that are present and visible, as all-ones lanes. */
__attribute__((target("avx2"))) static __m256i visible8(const uint8_t *mask, int j, int n) {
  int left = n - j;
  __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  if (!mask) return in;
  uint8_t pad[8] = {0};
  const uint8_t *m = mask + j;
  if (left < 8) memcpy(pad, m, (size_t)left), m = pad;
  __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)m));
  return _mm256_andnot_si256(_mm256_cmpeq_epi32(b, _mm256_setzero_si256()), in);
}

/* Eight lanes at a time; chunks alternate between the partial sums of lanes 0-7 and 8-15. */
__attribute__((target("avx2"))) static int softmax_256(float *s, const uint8_t *mask, int n) {
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 vmx = ninf;
  int any = 0;
  for (int j = 0; j < n; j += 8) {
    __m256i vis = visible8(mask, j, n);
    any |= !_mm256_testz_si256(vis, vis);
    __m256 x = _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + j, vis), _mm256_castsi256_ps(vis));
    vmx = _mm256_max_ps(vmx, x);
  }
  if (!any) {
    memset(s, 0, (size_t)n * sizeof(float));
    return 0;
  }
  float m8[8];
  _mm256_storeu_ps(m8, vmx);
  float mxs = m8[0];
  for (int i = 1; i < 8; i++) mxs = m8[i] > mxs ? m8[i] : mxs;
  const __m256 mx = _mm256_set1_ps(mxs);
  __m256 part[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int j = 0; j < n; j += 8) {
    int left = n - j;
    __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i vis = visible8(mask, j, n);
    __m256 x = _mm256_sub_ps(_mm256_maskload_ps(s + j, vis), mx);
    __m256 e = _mm256_and_ps(exp_poly_256(x), _mm256_castsi256_ps(vis));
    _mm256_maskstore_ps(s + j, in, e);
    part[(j / 8) & 1] = _mm256_add_ps(part[(j / 8) & 1], e);
  }
  float p[16];
  _mm256_storeu_ps(p, part[0]);
  _mm256_storeu_ps(p + 8, part[1]);
  const __m256 sum = _mm256_set1_ps(sum16(p));
  for (int j = 0; j < n; j += 8) {
    int left = n - j;
    __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(s + j, in, _mm256_div_ps(_mm256_maskload_ps(s + j, in), sum));
  }
  return 1;
}
#endif

static int masked_softmax_row(const vspec_dev *dev, float *s, const uint8_t *mask_row, int n_kv) {
#if VS_EXP_SIMD
  if (dev->isa >= VS_ISA_AVX512) return softmax_512(s, mask_row, n_kv);
  if (dev->isa >= VS_ISA_AVX2) return softmax_256(s, mask_row, n_kv);
#endif
  return softmax_scalar(s, mask_row, n_kv);
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
        masked_softmax_row(dev, s + (size_t)i * n_kv,
                           mask ? mask + (size_t)(i0 + i) * n_kv : NULL, n_kv);
      for (int i = 0; i < nc; i += VS_ATTN_ROW_GROUP) {
        int nr = nc - i < VS_ATTN_ROW_GROUP ? nc - i : VS_ATTN_ROW_GROUP;
        weighted_sum(dev, s + (size_t)i * n_kv, mask ? mask + (size_t)(i0 + i) * n_kv : NULL,
                     nr, n_kv, vh, head_dim, oh + (size_t)i * out_stride, out_stride);
      }
    }
  }
}
