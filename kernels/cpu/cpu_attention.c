/*
 * kernels/cpu/cpu_attention.c - masked multi-head attention over a KV cache (LlamaGen
 * gpt.py, Attention.forward: PyTorch scaled_dot_product_attention with a boolean mask).
 *
 * Per query head: S = Q_h K_g^T / sqrt(hd) into scratch, masked stable softmax row by row
 * (cpu_attention_softmax.c), then each output row O_h[i] = sum over the visible slots j of
 * W[i, j] V_g[j], accumulated slot by slot straight into the output. Queries are processed in chunks sized to
 * the scratch arena, so only one row of scores (n_kv floats) is ever required and the arena
 * never has to grow for realistic cache lengths.
 *
 * Why not sgemm for W V: it is a product of a few rows with a [n_kv, 64] matrix, and BLIS
 * packed both operands on every call: 16 % of a speculative-decoding run's time went to BLIS
 * there (perf, models/fmnist, Cool-SD with the draft GPT). Skipping masked slots also means a
 * slot never written (which may hold anything) is never read, and a row with nothing visible
 * comes out as zeros, as the ops contract says.
 *
 * Why Q K^T, the softmax and W V have vector loops of their own: once the linear layers ran on
 * AMX, attention was the part of a tree verify that grew with the rows. `vspec-bench attention`
 * (GPT-B: 12 layers x 2 CFG rows, 12 heads, 129 cached tokens) measured 13.0 ms of CPU time
 * per forward at 16 nodes with a scalar expf softmax, one W V row at a time and Q K^T through
 * the skinny GEMM, and 4.9 ms with the loops below; 1.79 against 0.66 ms for a one-node CFG
 * step (Xeon SPR, AVX-512; docs/BENCHMARKS.md).
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_attention_softmax.h"
#include "kernels/cpu/cpu_dev.h"
#include "kernels/common/vs_exp_simd.h"
#include "kernels/cpu/cpu_isa.h"

/* Query rows whose W V share one pass over the values (the AVX-512 loop, head_dim 64). */
#define VS_ATTN_ROW_GROUP 4

/* ---- W V ------------------------------------------------------------------------------------
 * o_r[0..hd) = sum over the slots j visible to row r of w_r[j] v[j, 0..hd), slot by slot in
 * order of j, one fused multiply-add per element (fmaf in the scalar loop, the same bits as
 * the vector instructions'). Rows r < nr of a group: weights at w + r * w_stride, mask rows
 * at mask + r * n_kv, outputs at o + r * o_stride. */
static void weighted_sum_scalar(const float *w, size_t w_stride, const uint8_t *mask, int nr,
                                int n_kv, const float *v, int hd, float *o, size_t o_stride) {
  for (int r = 0; r < nr; r++) {
    const float *wr = w + (size_t)r * w_stride;
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
/* head_dim 64 or 32 (HD, a constant in each copy), up to four rows: one load of a slot's
 * values serves every row that sees it, and the independent accumulators (four per row at
 * 64, two at 32) keep both FMA ports busy (one row alone waits on the latency of its
 * own). Written out row by row: as an array indexed by the row, GCC kept the accumulators
 * in memory. */
#define VS_ATTN_ROW_FMA(r, a0, a1, a2, a3)                           \
  do {                                                               \
    if (see##r) {                                                    \
      const __m512 wj = _mm512_set1_ps(w[(size_t)(r) * w_stride + j]); \
      a0 = _mm512_fmadd_ps(wj, v0, a0);                              \
      a1 = _mm512_fmadd_ps(wj, v1, a1);                              \
      if (HD == 64) {                                                \
        a2 = _mm512_fmadd_ps(wj, v2, a2);                            \
        a3 = _mm512_fmadd_ps(wj, v3, a3);                            \
      }                                                              \
    }                                                                \
  } while (0)

__attribute__((target("avx512f,fma"), always_inline)) static inline void weighted_sum_512_rows(
    const float *w, size_t w_stride, const uint8_t *mask, int nr, int n_kv, const float *v,
    float *o, size_t o_stride, const int HD) {
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
    const float *vj = v + (size_t)j * HD;
    const __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16);
    const __m512 v2 = HD == 64 ? _mm512_loadu_ps(vj + 32) : v0;
    const __m512 v3 = HD == 64 ? _mm512_loadu_ps(vj + 48) : v0;
    VS_ATTN_ROW_FMA(0, a00, a01, a02, a03);
    VS_ATTN_ROW_FMA(1, a10, a11, a12, a13);
    VS_ATTN_ROW_FMA(2, a20, a21, a22, a23);
    VS_ATTN_ROW_FMA(3, a30, a31, a32, a33);
  }
  const __m512 acc[VS_ATTN_ROW_GROUP][4] = {
      {a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}, {a30, a31, a32, a33}};
  for (int r = 0; r < nr; r++)
    for (int t = 0; t < HD / 16; t++) _mm512_storeu_ps(o + (size_t)r * o_stride + 16 * t, acc[r][t]);
}
#undef VS_ATTN_ROW_FMA

__attribute__((target("avx512f,fma"))) static void weighted_sum_512_hd64(
    const float *w, size_t w_stride, const uint8_t *mask, int nr, int n_kv, const float *v,
    float *o, size_t o_stride) {
  weighted_sum_512_rows(w, w_stride, mask, nr, n_kv, v, o, o_stride, 64);
}

/* head_dim 32: the shipped draft GPT's (width 128, four heads) */
__attribute__((target("avx512f,fma"))) static void weighted_sum_512_hd32(
    const float *w, size_t w_stride, const uint8_t *mask, int nr, int n_kv, const float *v,
    float *o, size_t o_stride) {
  weighted_sum_512_rows(w, w_stride, mask, nr, n_kv, v, o, o_stride, 32);
}

/* One row, hd a multiple of 8: 64 dimensions per pass over the slots (eight accumulators that
 * stay in registers; an array indexed by a run-time count would live in memory), then 32, then
 * 8. AVX-512 CPUs run it too for head sizes other than 64: those are rare, and the results are
 * the same bits. */
__attribute__((target("avx2,fma"))) static void weighted_sum_256(const float *w,
                                                                 const uint8_t *mask_row,
                                                                 int n_kv, const float *v, int hd,
                                                                 float *o) {
  int d0 = 0;
  for (; d0 + 64 <= hd; d0 += 64) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
           a7 = a0;
    for (int j = 0; j < n_kv; j++) {
      if (mask_row && !mask_row[j]) continue;
      const __m256 wj = _mm256_set1_ps(w[j]);
      const float *vj = v + (size_t)j * hd + d0;
      a0 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vj), a0);
      a1 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vj + 8), a1);
      a2 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vj + 16), a2);
      a3 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vj + 24), a3);
      a4 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vj + 32), a4);
      a5 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vj + 40), a5);
      a6 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vj + 48), a6);
      a7 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vj + 56), a7);
    }
    const __m256 acc[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
    for (int t = 0; t < 8; t++) _mm256_storeu_ps(o + d0 + 8 * t, acc[t]);
  }
  if (d0 + 32 <= hd) { /* head_dim 32: four chains in one pass */
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int j = 0; j < n_kv; j++) {
      if (mask_row && !mask_row[j]) continue;
      const __m256 wj = _mm256_set1_ps(w[j]);
      const float *vj = v + (size_t)j * hd + d0;
      a0 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vj), a0);
      a1 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vj + 8), a1);
      a2 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vj + 16), a2);
      a3 = _mm256_fmadd_ps(wj, _mm256_loadu_ps(vj + 24), a3);
    }
    _mm256_storeu_ps(o + d0, a0);
    _mm256_storeu_ps(o + d0 + 8, a1);
    _mm256_storeu_ps(o + d0 + 16, a2);
    _mm256_storeu_ps(o + d0 + 24, a3);
    d0 += 32;
  }
  for (; d0 < hd; d0 += 8) {
    __m256 a = _mm256_setzero_ps();
    for (int j = 0; j < n_kv; j++)
      if (!mask_row || mask_row[j])
        a = _mm256_fmadd_ps(_mm256_set1_ps(w[j]), _mm256_loadu_ps(v + (size_t)j * hd + d0), a);
    _mm256_storeu_ps(o + d0, a);
  }
}
#endif

/* W V for rows 0..nr-1 (nr <= VS_ATTN_ROW_GROUP) of a chunk, in the device's instruction set. */
static void weighted_sum(const vspec_dev *dev, const float *w, size_t w_stride,
                         const uint8_t *mask, int nr, int n_kv, const float *v, int hd, float *o,
                         size_t o_stride) {
#if VS_EXP_SIMD
  if (dev->isa >= VS_ISA_AVX512 && (hd == 64 || hd == 32)) {
    (hd == 64 ? weighted_sum_512_hd64 : weighted_sum_512_hd32)(w, w_stride, mask, nr, n_kv, v, o,
                                                               o_stride);
    return;
  }
  for (int r = 0; r < nr; r++) {
    const float *wr = w + (size_t)r * w_stride;
    const uint8_t *mr = mask ? mask + (size_t)r * n_kv : NULL;
    if (dev->isa >= VS_ISA_AVX2 && hd % 8 == 0)
      weighted_sum_256(wr, mr, n_kv, v, hd, o + (size_t)r * o_stride);
    else
      weighted_sum_scalar(wr, w_stride, mr, 1, n_kv, v, hd, o + (size_t)r * o_stride, o_stride);
  }
#else
  weighted_sum_scalar(w, w_stride, mask, nr, n_kv, v, hd, o, o_stride);
#endif
}

/* ---- Q K^T ------------------------------------------------------------------------------------
 * s[i, j] = scale * (q_i . k_j). For head_dim 64 on AVX-512, sixteen keys at a time: one
 * accumulator per key (four multiply-adds over the 64 dimensions), then the 16 horizontal sums
 * in one transpose-and-add tree. Through vs_sgemm the skinny kernel spent more on its
 * reductions than on its four steps over 64 dimensions. Other shapes and instruction sets use
 * vs_sgemm. */
#if VS_EXP_SIMD
/* Sums of the 16 lanes of a0..a15, as lanes 0..15 of the result. */
__attribute__((target("avx512f"))) static inline __m512 hsum4x4(__m512 a0, __m512 a1, __m512 a2,
                                                                __m512 a3) {
  /* per 128-bit lane: pairs, then quads, of a0..a3 */
  __m512 x = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  __m512 y = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  return _mm512_add_ps(_mm512_shuffle_ps(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_ps(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
}

__attribute__((target("avx512f"))) static inline __m512 hsum16(__m512 z0, __m512 z1, __m512 z2,
                                                               __m512 z3) {
  /* z_g holds, in 128-bit lane L, the part of keys 4g..4g+3 from dimensions of lane L */
  __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_f32x4(z0, z1, _MM_SHUFFLE(3, 1, 3, 1)));
  __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(z2, z3, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_f32x4(z2, z3, _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(w0, w1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* a = q . k over 64 dimensions as 16 lanes of partial sums (k: one key's 64 values). */
#define VS_ATTN_DOT64(a, k)                                                             \
  __m512 a = _mm512_mul_ps(q0, _mm512_loadu_ps(k));                                     \
  a = _mm512_fmadd_ps(q1, _mm512_loadu_ps((k) + 16), a);                                \
  if (HD == 64) {                                                                       \
    a = _mm512_fmadd_ps(q2, _mm512_loadu_ps((k) + 32), a);                              \
    a = _mm512_fmadd_ps(q3, _mm512_loadu_ps((k) + 48), a);                              \
  }

/* Four keys' dot products, reduced to their 128-bit-lane quads (see hsum4x4). */
#define VS_ATTN_QUAD(z, j)                                                              \
  __m512 z;                                                                             \
  {                                                                                     \
    VS_ATTN_DOT64(d0, key(j));                                                          \
    VS_ATTN_DOT64(d1, key((j) + 1));                                                    \
    VS_ATTN_DOT64(d2, key((j) + 2));                                                    \
    VS_ATTN_DOT64(d3, key((j) + 3));                                                    \
    z = hsum4x4(d0, d1, d2, d3);                                                        \
  }

/* Query rows i and i + 1 (q and q + q_stride: both read every key once). */
#define VS_ATTN_DOT64X2(a, b, kp)                                                      \
  __m512 a, b;                                                                          \
  {                                                                                     \
    const float *k_ = (kp);                                                             \
    __m512 k0 = _mm512_loadu_ps(k_), k1 = _mm512_loadu_ps(k_ + 16);                     \
    a = _mm512_fmadd_ps(q1, k1, _mm512_mul_ps(q0, k0));                                 \
    b = _mm512_fmadd_ps(r1, k1, _mm512_mul_ps(r0, k0));                                 \
    if (HD == 64) {                                                                     \
      __m512 k2 = _mm512_loadu_ps(k_ + 32), k3 = _mm512_loadu_ps(k_ + 48);              \
      a = _mm512_fmadd_ps(q3, k3, _mm512_fmadd_ps(q2, k2, a));                          \
      b = _mm512_fmadd_ps(r3, k3, _mm512_fmadd_ps(r2, k2, b));                          \
    }                                                                                   \
  }

#define VS_ATTN_QUAD2(za, zb, j)                                                        \
  __m512 za, zb;                                                                        \
  {                                                                                     \
    VS_ATTN_DOT64X2(a0, b0, key(j));                                                    \
    VS_ATTN_DOT64X2(a1, b1, key((j) + 1));                                              \
    VS_ATTN_DOT64X2(a2, b2, key((j) + 2));                                              \
    VS_ATTN_DOT64X2(a3, b3, key((j) + 3));                                              \
    za = hsum4x4(a0, a1, a2, a3);                                                       \
    zb = hsum4x4(b0, b1, b2, b3);                                                       \
  }

/* keys past the end repeat the last one; their lanes are not stored */
#define key(j) (k + (size_t)(j0 + (j) < n_kv ? j0 + (j) : n_kv - 1) * HD)

/* HD (64 or 32) is a constant in each copy below; at 32 the upper two quarters drop out. */
__attribute__((target("avx512f,fma"), always_inline)) static inline void scores_512_rows(
    const float *q, int q_stride, int nc, const float *k, int n_kv, float scale, float *s,
    int s_stride, const int HD) {
  const __m512 sc = _mm512_set1_ps(scale);
  int i = 0;
  for (; i + 2 <= nc; i += 2) {
    const float *qi = q + (size_t)i * q_stride, *qn = qi + q_stride;
    const __m512 q0 = _mm512_loadu_ps(qi), q1 = _mm512_loadu_ps(qi + 16);
    const __m512 q2 = HD == 64 ? _mm512_loadu_ps(qi + 32) : q0;
    const __m512 q3 = HD == 64 ? _mm512_loadu_ps(qi + 48) : q0;
    const __m512 r0 = _mm512_loadu_ps(qn), r1 = _mm512_loadu_ps(qn + 16);
    const __m512 r2 = HD == 64 ? _mm512_loadu_ps(qn + 32) : r0;
    const __m512 r3 = HD == 64 ? _mm512_loadu_ps(qn + 48) : r0;
    float *si = s + (size_t)i * s_stride, *sn = si + s_stride;
    for (int j0 = 0; j0 < n_kv; j0 += 16) {
      VS_ATTN_QUAD2(z0, y0, 0);
      VS_ATTN_QUAD2(z1, y1, 4);
      VS_ATTN_QUAD2(z2, y2, 8);
      VS_ATTN_QUAD2(z3, y3, 12);
      _mm512_storeu_ps(si + j0, _mm512_mul_ps(sc, hsum16(z0, z1, z2, z3)));
      _mm512_storeu_ps(sn + j0, _mm512_mul_ps(sc, hsum16(y0, y1, y2, y3)));
    }
  }
  for (; i < nc; i++) {
    const float *qi = q + (size_t)i * q_stride;
    const __m512 q0 = _mm512_loadu_ps(qi), q1 = _mm512_loadu_ps(qi + 16);
    const __m512 q2 = HD == 64 ? _mm512_loadu_ps(qi + 32) : q0;
    const __m512 q3 = HD == 64 ? _mm512_loadu_ps(qi + 48) : q0;
    float *si = s + (size_t)i * s_stride;
    for (int j0 = 0; j0 < n_kv; j0 += 16) {
      VS_ATTN_QUAD(z0, 0);
      VS_ATTN_QUAD(z1, 4);
      VS_ATTN_QUAD(z2, 8);
      VS_ATTN_QUAD(z3, 12);
      _mm512_storeu_ps(si + j0, _mm512_mul_ps(sc, hsum16(z0, z1, z2, z3)));
    }
  }
}

__attribute__((target("avx512f,fma"))) static void scores_512_hd64(const float *q, int q_stride,
                                                                   int nc, const float *k,
                                                                   int n_kv, float scale,
                                                                   float *s, int s_stride) {
  scores_512_rows(q, q_stride, nc, k, n_kv, scale, s, s_stride, 64);
}

/* head_dim 32 (the shipped draft GPT): through vs_sgemm it was a tenth of a draft forward */
__attribute__((target("avx512f,fma"))) static void scores_512_hd32(const float *q, int q_stride,
                                                                   int nc, const float *k,
                                                                   int n_kv, float scale,
                                                                   float *s, int s_stride) {
  scores_512_rows(q, q_stride, nc, k, n_kv, scale, s, s_stride, 32);
}
#undef key
#undef VS_ATTN_QUAD2
#undef VS_ATTN_DOT64X2
#undef VS_ATTN_QUAD
#undef VS_ATTN_DOT64
#endif

static void scores(vspec_dev *dev, const float *q, int q_stride, int nc, const float *k, int n_kv,
                   int hd, float scale, float *s, int s_stride) {
#if VS_EXP_SIMD
  if (dev->isa >= VS_ISA_AVX512 && (hd == 64 || hd == 32)) {
    (hd == 64 ? scores_512_hd64 : scores_512_hd32)(q, q_stride, nc, k, n_kv, scale, s, s_stride);
    return;
  }
#endif
  vs_sgemm(dev, 0, 1, nc, n_kv, hd, scale, q, q_stride, k, hd, 0.0f, s, s_stride);
}

void vs_cpu_attention(vspec_dev *dev, const float *q, int n_q, int q_stride, int n_heads,
                      int n_kv_heads, int head_dim, const float *k, const float *v,
                      int slot_stride, int n_kv, const uint8_t *mask, float *out) {
  VS_CPU_UNRECORDED(dev, "attention");
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

  /* Score rows padded to whole vectors: the kernels store whole vectors, never a masked tail.
   * A load of a line a masked store has not yet written back cannot take its data from the
   * store (Intel), and with unpadded rows each row's first load met the previous row's
   * masked tail: a 39-entry row's softmax took 69 ns that way and 38 ns padded. */
  const int s_stride = VS_SOFTMAX_ROW_FLOATS(n_kv);
  size_t row_bytes = (size_t)s_stride * sizeof(float);
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
      scores(dev, qh, q_stride, nc, kh, n_kv, head_dim, scale, s, s_stride);
      for (int i = 0; i < nc; i++)
        vs_cpu_masked_softmax(dev, s + (size_t)i * s_stride,
                              mask ? mask + (size_t)(i0 + i) * n_kv : NULL, n_kv);
      for (int i = 0; i < nc; i += VS_ATTN_ROW_GROUP) {
        int nr = nc - i < VS_ATTN_ROW_GROUP ? nc - i : VS_ATTN_ROW_GROUP;
        weighted_sum(dev, s + (size_t)i * s_stride, (size_t)s_stride,
                     mask ? mask + (size_t)(i0 + i) * n_kv : NULL, nr, n_kv, vh, head_dim,
                     oh + (size_t)i * out_stride, out_stride);
      }
    }
  }
}
