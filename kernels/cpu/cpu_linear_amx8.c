/*
 * kernels/cpu/cpu_linear_amx8.c - int8 weights on AMX tiles (see cpu_linear_amx8.h for why).
 *
 * The tiles and the loop order are those of the bf16 kernel (cpu_linear_amx.c): tmm0-3 the
 * int32 sums of rows r .. r+31 and output columns 32c .. 32c+31, tmm4-5 two 16-row blocks of
 * the int8 activations (64 inputs per tile row), tmm6-7 the two 16-column weight blocks; the
 * output column pairs are outermost, so a pair's weights are read from memory once. The sums
 * always go through a buffer on the stack, where they are scaled into y.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_linear_amx.h"
#include "kernels/cpu/cpu_linear_amx8.h"
#include "kernels/cpu/cpu_threads.h"

#define VS_AMX8_ROWS 16     /* rows of an A or C tile */
#define VS_AMX8_KBLOCK 64   /* int8 values in a 64-byte tile row */
#define VS_AMX8_NBLOCK 16   /* int32 columns of a C tile */
#define VS_AMX8_BLOCK 1024  /* bytes of one packed 16-column x 64-input block */

size_t vs_amx8_packed_bytes(int n, int k) {
  size_t np = (size_t)vs_amx_round_up(n, 2 * VS_AMX8_NBLOCK);
  return np * (size_t)vs_amx_round_up(k, VS_AMX8_KBLOCK) + np * sizeof(float);
}

/* Below this largest magnitude a row counts as zero: 127 / max would overflow to infinity
 * near 1e-37, and such values add nothing to a product of activations of order one. */
#define VS_AMX8_TINY 1e-30f

/* One row of int8 values and its scale (max |v| / 127; 0 for a zero row), rounding v / scale
 * to the nearest integer, ties to even (lrintf in the default rounding mode, as CVTPS2DQ). */
static float quantize(const float *v, int k, int8_t *q) {
  float amax = 0.0f;
  for (int i = 0; i < k; i++) {
    if (!isfinite(v[i])) return -1.0f;
    amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
  }
  if (amax < VS_AMX8_TINY) {
    memset(q, 0, (size_t)k);
    return 0.0f;
  }
  float inv = 127.0f / amax;
  for (int i = 0; i < k; i++) {
    long r = lrintf(v[i] * inv);
    q[i] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
  }
  return amax / 127.0f;
}

float vs_amx8_quantize_row(const float *x, int k, int8_t *q) { return quantize(x, k, q); }

int vs_amx8_pack(const float *w, int n, int k, void *packed) {
  int np = vs_amx_round_up(n, 2 * VS_AMX8_NBLOCK), kp = vs_amx_round_up(k, VS_AMX8_KBLOCK);
  int kbs = kp / VS_AMX8_KBLOCK;
  if (k <= 0 || k > VS_AMX8_MAX_K || n <= 0) return -1;
  int8_t *tiles = packed, *row = malloc((size_t)k);
  float *scale = (float *)(tiles + (size_t)np * kp);
  if (!row) return -1;
  memset(packed, 0, vs_amx8_packed_bytes(n, k));
  for (int col = 0; col < n; col++) {
    float s = quantize(w + (size_t)col * k, k, row);
    if (s < 0) {
      free(row);
      return -1;
    }
    scale[col] = s;
    int8_t *blocks = tiles + (size_t)(col / VS_AMX8_NBLOCK) * kbs * VS_AMX8_BLOCK;
    for (int kk = 0; kk < k; kk++) /* input kk: block kk / 64, tile row (kk % 64) / 4 */
      blocks[(size_t)(kk / VS_AMX8_KBLOCK) * VS_AMX8_BLOCK + (kk % VS_AMX8_KBLOCK) / 4 * 64 +
             (col % VS_AMX8_NBLOCK) * 4 + kk % 4] = row[kk];
  }
  free(row);
  return 0;
}

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>

int vs_amx8_available(void) {
  unsigned a, b, c, d;
  if (!vs_amx_available() || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  return (d >> 25) & 1; /* CPUID.(EAX=7,ECX=0):EDX[25] AMX-INT8 */
}

typedef struct amx8_job {
  const int8_t *xq, *tiles;
  const float *sx, *sw, *bias;
  float *y;
  int m, mp, n, kp, pairs, pairs_per_task, tile_rows;
} amx8_job;

/* The activation rows in int8 ([mp, kp], zero padding) and their scales: quantize() in
 * vector loops, 16 values at a time. Nonzero when a row is not finite. */
__attribute__((target("avx512f"))) static int amx8_quantize_rows(const float *x, int m, int k,
                                                                int8_t *xq, float *sx, int mp,
                                                                int kp) {
  memset(xq, 0, (size_t)mp * kp);
  for (int i = 0; i < m; i++) {
    const float *v = x + (size_t)i * k;
    __m512 amax = _mm512_setzero_ps(), nan = _mm512_setzero_ps();
    for (int p = 0; p < k; p += 16) {
      __mmask16 in = k - p >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (k - p)) - 1u);
      __m512 t = _mm512_maskz_loadu_ps(in, v + p);
      nan = _mm512_add_ps(nan, _mm512_mul_ps(t, _mm512_setzero_ps())); /* inf, NaN -> NaN */
      amax = _mm512_max_ps(amax, _mm512_abs_ps(t));
    }
    if (_mm512_cmp_ps_mask(nan, nan, _CMP_UNORD_Q)) return -1;
    float a = _mm512_reduce_max_ps(amax);
    if (a < VS_AMX8_TINY) a = 0.0f;
    sx[i] = a / 127.0f;
    if (a == 0.0f) continue;
    const __m512 inv = _mm512_set1_ps(127.0f / a);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int p = 0; p < k; p += 16) {
      __mmask16 in = k - p >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (k - p)) - 1u);
      __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(in, v + p), inv));
      r = _mm512_min_epi32(_mm512_max_epi32(r, lo), hi);
      __m128i b = _mm512_cvtepi32_epi8(r);
      if (k - p >= 16) {
        _mm_storeu_si128((__m128i *)(xq + (size_t)i * kp + p), b);
      } else { /* the row's end: no byte-masked store without AVX512BW */
        int8_t tail[16];
        _mm_storeu_si128((__m128i *)tail, b);
        memcpy(xq + (size_t)i * kp + p, tail, (size_t)(k - p));
      }
    }
  }
  return 0;
}

/* The valid part of a 16 x 16 block of sums (rows row.., columns col..) scaled into y. */
__attribute__((target("avx512f"))) static void amx8_emit(const amx8_job *jb, const int32_t *acc,
                                                         int row, int col) {
  int rows = jb->m - row < VS_AMX8_ROWS ? jb->m - row : VS_AMX8_ROWS;
  int cols = jb->n - col < VS_AMX8_NBLOCK ? jb->n - col : VS_AMX8_NBLOCK;
  if (rows <= 0 || cols <= 0) return;
  __mmask16 mk = (__mmask16)((1u << cols) - 1u);
  __m512 sw = _mm512_maskz_loadu_ps(mk, jb->sw + col);
  __m512 b = jb->bias ? _mm512_maskz_loadu_ps(mk, jb->bias + col) : _mm512_setzero_ps();
  for (int i = 0; i < rows; i++) {
    __m512 s = _mm512_mul_ps(_mm512_set1_ps(jb->sx[row + i]), sw);
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(acc + i * VS_AMX8_NBLOCK)), s);
    if (jb->bias) v = _mm512_add_ps(v, b);
    if (cols == VS_AMX8_NBLOCK) /* as amx_emit: plain stores but at y's right edge */
      _mm512_storeu_ps(jb->y + (size_t)(row + i) * jb->n + col, v);
    else
      _mm512_mask_storeu_ps(jb->y + (size_t)(row + i) * jb->n + col, mk, v);
  }
}

/* Output columns [32 c, 32 c + 32) for every row, rows in blocks of 32 (or 16 at the end). */
__attribute__((target("amx-tile,amx-int8,avx512f"))) static void amx8_pair(const amx8_job *jb,
                                                                            int c) {
  const int kbs = jb->kp / VS_AMX8_KBLOCK;
  const int8_t *b0 = jb->tiles + (size_t)(2 * c) * kbs * VS_AMX8_BLOCK;
  const int8_t *b1 = b0 + (size_t)kbs * VS_AMX8_BLOCK;
  int32_t acc[VS_AMX8_ROWS * VS_AMX8_NBLOCK];
  int col = 2 * c * VS_AMX8_NBLOCK;
  for (int r = 0; r < jb->mp; r += 2 * VS_AMX8_ROWS) {
    const int two = r + VS_AMX8_ROWS < jb->mp;
    const int8_t *a0 = jb->xq + (size_t)r * jb->kp, *a1 = a0 + (size_t)VS_AMX8_ROWS * jb->kp;
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int kb = 0; kb < kbs; kb++) {
      _tile_loadd(4, a0 + kb * VS_AMX8_KBLOCK, jb->kp);
      _tile_loadd(6, b0 + (size_t)kb * VS_AMX8_BLOCK, 64);
      _tile_loadd(7, b1 + (size_t)kb * VS_AMX8_BLOCK, 64);
      _tile_dpbssd(0, 4, 6);
      _tile_dpbssd(1, 4, 7);
      if (two) {
        _tile_loadd(5, a1 + kb * VS_AMX8_KBLOCK, jb->kp);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
      }
    }
    _tile_stored(0, acc, 64);
    amx8_emit(jb, acc, r, col);
    _tile_stored(1, acc, 64);
    amx8_emit(jb, acc, r, col + VS_AMX8_NBLOCK);
    if (two) {
      _tile_stored(2, acc, 64);
      amx8_emit(jb, acc, r + VS_AMX8_ROWS, col);
      _tile_stored(3, acc, 64);
      amx8_emit(jb, acc, r + VS_AMX8_ROWS, col + VS_AMX8_NBLOCK);
    }
  }
}

/* Tile configuration is per thread: every task makes sure its thread holds it. */
__attribute__((target("amx-tile,amx-int8,avx512f"))) static void amx8_task(void *ctx, int task) {
  const amx8_job *jb = ctx;
  int c0 = task * jb->pairs_per_task;
  int c1 = c0 + jb->pairs_per_task < jb->pairs ? c0 + jb->pairs_per_task : jb->pairs;
  if (c0 >= c1) return;
  vs_amx_tile_config(jb->tile_rows); /* the bf16 kernel's shapes: 16 rows x 64 bytes */
  for (int c = c0; c < c1; c++) amx8_pair(jb, c);
}

int vs_amx8_linear(vspec_dev *dev, const float *x, int m, int k, const void *packed, int n,
                   const float *bias, float *y) {
  if (m <= 0 || n <= 0) return 0;
  int np = vs_amx_round_up(n, 2 * VS_AMX8_NBLOCK);
  amx8_job jb = {.tiles = packed, .bias = bias, .y = y, .m = m, .n = n,
                 .mp = m < VS_AMX8_ROWS ? m : vs_amx_round_up(m, VS_AMX8_ROWS),
                 .tile_rows = m < VS_AMX8_ROWS ? m : VS_AMX8_ROWS,
                 .kp = vs_amx_round_up(k > 0 ? k : 1, VS_AMX8_KBLOCK)};
  jb.sw = (const float *)(jb.tiles + (size_t)np * jb.kp);
  jb.pairs = np / (2 * VS_AMX8_NBLOCK);
  size_t xq_bytes = (size_t)vs_amx_round_up(jb.mp * jb.kp, 64);
  char *scratch = vs_scratch(dev, xq_bytes + (size_t)jb.mp * sizeof(float));
  int8_t *xq = (int8_t *)scratch;
  float *sx = (float *)(scratch + xq_bytes);
  if (amx8_quantize_rows(x, m, k, xq, sx, jb.mp, jb.kp)) return -1;
  jb.xq = xq, jb.sx = sx;
  /* split over the pool as the bf16 kernel is, by weight bytes per task */
  int tasks = vs_amx_split(dev, jb.pairs, (size_t)np * jb.kp, &jb.pairs_per_task);
  vs_pool_run(dev->pool, tasks, amx8_task, &jb);
  return 0;
}

#else

int vs_amx8_available(void) { return 0; }

int vs_amx8_linear(vspec_dev *dev, const float *x, int m, int k, const void *packed, int n,
                   const float *bias, float *y) {
  (void)dev, (void)x, (void)m, (void)k, (void)packed, (void)n, (void)bias, (void)y;
  return -1;
}

#endif
