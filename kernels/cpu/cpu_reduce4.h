/*
 * kernels/cpu/cpu_reduce4.h - four vector accumulators reduced to their four lane sums at
 * once, by one fixed addition tree per vector width.
 *
 * Why one header: the fp32 few-row kernel (cpu_linear_skinny.c) and the bf16-weight kernel
 * (cpu_linear_bf16.c) must add an element's lanes in the same order, so that an element's
 * bits depend on neither its place in a block nor the row count (their tests check it
 * bit for bit). Reducing four accumulators together shares the shuffles: a quarter of the
 * instructions of four separate reductions. A single accumulator goes through the same code
 * (passed four times) so that its tree is the same.
 *
 * The target attributes name only what the instructions need (AVX-512F; AVX), so that
 * callers compiled for wider sets (avx512vl, fma) can inline them.
 */
#ifndef VS_CPU_REDUCE4_H
#define VS_CPU_REDUCE4_H

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* [sum a0, sum a1, sum a2, sum a3] of 16 lanes each by the halving tree h[l] = a[l] + a[l+8],
 * g[l] = h[l] + h[l+4], f[l] = g[l] + g[l+2], f0 + f1 (that of GCC's _mm512_reduce_add_ps;
 * operand order within one addition does not matter: additions commute exactly). */
static inline __attribute__((always_inline, target("avx512f"))) __m128
vs_reduce4_512(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  /* 128-bit blocks [a0 h(0..3), a0 h(4..7), a1 h(0..3), a1 h(4..7)] and likewise a2, a3 */
  __m512 s01 =
      _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
  __m512 s23 =
      _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
  /* blocks [g of a0, g of a1, g of a2, g of a3] */
  __m512 g =
      _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xDD));
  /* lanes 0, 1 of each block: f0, f1; then lane 0: f0 + f1 */
  __m512 f = _mm512_add_ps(g, _mm512_permute_ps(g, _MM_SHUFFLE(1, 0, 3, 2)));
  __m512 t = _mm512_add_ps(f, _mm512_permute_ps(f, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), t));
}

/* The same of 8 lanes each by the tree h[l] = a[l] + a[l+4], g[l] = h[l] + h[l+2], g0 + g1. */
static inline __attribute__((always_inline, target("avx"))) __m128
vs_reduce4_256(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  /* 128-bit halves [h of a0, h of a1] and [h of a2, h of a3] */
  __m256 s01 =
      _mm256_add_ps(_mm256_permute2f128_ps(a0, a1, 0x20), _mm256_permute2f128_ps(a0, a1, 0x31));
  __m256 s23 =
      _mm256_add_ps(_mm256_permute2f128_ps(a2, a3, 0x20), _mm256_permute2f128_ps(a2, a3, 0x31));
  /* low half [g of a0 (2), g of a2 (2)], high half [g of a1, g of a3] */
  __m256 g = _mm256_add_ps(_mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm256_shuffle_ps(s01, s23, _MM_SHUFFLE(3, 2, 3, 2)));
  /* low half [sum a0, sum a2, ...], high half [sum a1, sum a3, ...] */
  __m256 f = _mm256_hadd_ps(g, g);
  return _mm_unpacklo_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1));
}
#endif

#endif /* VS_CPU_REDUCE4_H */
