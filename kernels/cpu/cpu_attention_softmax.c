/*
 * kernels/cpu/cpu_attention_softmax.c - the masked softmax of attention's score rows
 * (cpu_attention.c), in AVX-512, AVX2 and scalar loops that give the same bits.
 */
#include <math.h>
#include <string.h>

#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_attention_softmax.h"
#include "kernels/common/vs_exp_simd.h"
#include "kernels/cpu/cpu_isa.h"

/* Masked entries -> 0, the rest -> e^(s - max) times 1 / sum (a multiply: a vector division
 * cost a tenth of the softmax). e is vs_exp_poly; the sum is kept in 16 partial sums (entry j
 * in sum j mod 16) that are added in halves (8 + 8, 4 + 4, 2 + 2, 1 + 1), so the scalar and
 * both vector loops give the same bits. */
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
  float inv = 1.0f / sum16(part); /* the sum is >= 1: the maximum contributes e^0 */
  for (int j = 0; j < n; j++) s[j] = s[j] * inv;
  return 1;
}

#if VS_EXP_SIMD
/* sum16 of the 16 lanes in registers: the same additions in the same order (lane i plus
 * lane i + w, for w = 8, 4, 2, 1), without the round trips through memory that made the
 * scalar tree the largest single cost of a short row. */
__attribute__((target("avx512f"))) static inline float sum16_512(__m512 v) {
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

#define VS_TARGET_AVX512_BW __attribute__((target("avx512f,avx512bw,avx512vl")))

/* Lanes of entries j .. j+15 that are present (j + lane < n) and visible. A short tail is a
 * masked byte load (AVX512BW, which VS_ISA_AVX512 requires), which cannot fault past the end
 * of the mask as a plain 16-byte load could; no byte-by-byte loop or copy for the tail. */
VS_TARGET_AVX512_BW static inline __mmask16 visible16(const uint8_t *mask, int j, int n) {
  int left = n - j;
  __mmask16 in = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
  if (!mask) return in;
  __m128i b = _mm_maskz_loadu_epi8(in, mask + j);
  return _mm_test_epi8_mask(b, b);
}

/* Rows of at most 64 entries (attention over a short prefix: a small image, a tree's first
 * rows) stay in four registers: one pass for the maximum, one for the exponentials and
 * their sum, one for the scaling, with each row's visibility computed once. The additions
 * are those of softmax_512 below (lane j mod 16, chunks in order), so the bits are too. */
VS_TARGET_AVX512_BW static int softmax_512_short(float *s, const uint8_t *mask, int n) {
  const int chunks = (n + 15) / 16;
  __mmask16 vis[4] = {0, 0, 0, 0};
  __m512 x[4];
  __m512 vmx = _mm512_set1_ps(-INFINITY);
  unsigned any = 0;
  for (int c = 0; c < chunks; c++) {
    vis[c] = visible16(mask, 16 * c, n);
    any |= vis[c];
    x[c] = _mm512_maskz_loadu_ps(vis[c], s + 16 * c);
    vmx = _mm512_mask_max_ps(vmx, vis[c], vmx, x[c]);
  }
  if (!any) {
    memset(s, 0, (size_t)n * sizeof(float));
    return 0;
  }
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));
  __m512 part = _mm512_setzero_ps();
  for (int c = 0; c < chunks; c++) {
    x[c] = _mm512_maskz_mov_ps(vis[c], exp_poly_512(_mm512_sub_ps(x[c], mx)));
    part = _mm512_add_ps(part, x[c]);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / sum16_512(part));
  for (int c = 0; c < chunks; c++) _mm512_storeu_ps(s + 16 * c, _mm512_mul_ps(x[c], inv));
  return 1;
}

VS_TARGET_AVX512_BW static int softmax_512(float *s, const uint8_t *mask, int n) {
  if (n <= 64) return softmax_512_short(s, mask, n);
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
  /* four (then two) chunks per step: an exponential is a long chain of dependent operations,
   * and independent ones fill the pipeline (entries still go to lane j mod 16 in order of j) */
#define VS_ATTN_EXP16(e, at) \
  __m512 e = _mm512_maskz_mov_ps(visible16(mask, at, n), \
                                 exp_poly_512(_mm512_sub_ps(_mm512_loadu_ps(s + (at)), mx)))
  for (; j + 64 <= n; j += 64) {
    VS_ATTN_EXP16(e0, j);
    VS_ATTN_EXP16(e1, j + 16);
    VS_ATTN_EXP16(e2, j + 32);
    VS_ATTN_EXP16(e3, j + 48);
    _mm512_storeu_ps(s + j, e0);
    _mm512_storeu_ps(s + j + 16, e1);
    _mm512_storeu_ps(s + j + 32, e2);
    _mm512_storeu_ps(s + j + 48, e3);
    part = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(part, e0), e1), e2), e3);
  }
  for (; j + 32 <= n; j += 32) {
    VS_ATTN_EXP16(e0, j);
    VS_ATTN_EXP16(e1, j + 16);
    _mm512_storeu_ps(s + j, e0);
    _mm512_storeu_ps(s + j + 16, e1);
    part = _mm512_add_ps(_mm512_add_ps(part, e0), e1);
  }
#undef VS_ATTN_EXP16
  for (; j < n; j += 16) {
    __mmask16 vis = visible16(mask, j, n);
    __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(vis, s + j), mx);
    __m512 e = _mm512_maskz_mov_ps(vis, exp_poly_512(x));
    _mm512_storeu_ps(s + j, e); /* lanes past n get 0 */
    part = _mm512_add_ps(part, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / sum16_512(part));
  for (int i = 0; i < n; i += 16)
    _mm512_storeu_ps(s + i, _mm512_mul_ps(_mm512_loadu_ps(s + i), inv));
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

/* e^(s - mx) of the visible entries j .. j+7 (zero elsewhere), stored back and returned. */
__attribute__((target("avx2,fma"))) static inline __m256 exp_chunk_256(float *s,
                                                                       const uint8_t *mask,
                                                                       int j, int n, __m256 mx) {
  __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - j), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i vis = visible8(mask, j, n);
  __m256 x = _mm256_sub_ps(_mm256_maskload_ps(s + j, vis), mx);
  __m256 e = _mm256_and_ps(exp_poly_256(x), _mm256_castsi256_ps(vis));
  _mm256_maskstore_ps(s + j, in, e);
  return e;
}

/* Eight lanes at a time; chunks alternate between the partial sums of lanes 0-7 and 8-15. */
__attribute__((target("avx2,fma"))) static int softmax_256(float *s, const uint8_t *mask, int n) {
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
  /* sixteen entries per step: lanes 0-7 into part_lo, 8-15 into part_hi (two variables, not an
   * array indexed by the step, which GCC would keep in memory) */
  __m256 part_lo = _mm256_setzero_ps(), part_hi = part_lo;
  for (int j = 0; j < n; j += 16) {
    part_lo = _mm256_add_ps(part_lo, exp_chunk_256(s, mask, j, n, mx));
    if (j + 8 < n) part_hi = _mm256_add_ps(part_hi, exp_chunk_256(s, mask, j + 8, n, mx));
  }
  float p[16];
  _mm256_storeu_ps(p, part_lo);
  _mm256_storeu_ps(p + 8, part_hi);
  const __m256 inv = _mm256_set1_ps(1.0f / sum16(p));
  for (int j = 0; j < n; j += 8) {
    int left = n - j;
    __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(s + j, in, _mm256_mul_ps(_mm256_maskload_ps(s + j, in), inv));
  }
  return 1;
}
#endif

int vs_cpu_masked_softmax(const vspec_dev *dev, float *s, const uint8_t *mask_row, int n_kv) {
#if VS_EXP_SIMD
  if (dev->isa >= VS_ISA_AVX512) return softmax_512(s, mask_row, n_kv);
  if (dev->isa >= VS_ISA_AVX2) return softmax_256(s, mask_row, n_kv);
#endif
  return softmax_scalar(s, mask_row, n_kv);
}
