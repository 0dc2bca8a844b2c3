/*
 * kernels/common/vs_exp_simd.h - vs_exp_poly (kernels/common/vs_math.h) on 16 lanes (AVX-512)
 * and on 8 lanes (AVX2), for the CPU's SiLU and attention softmax (kernels/cpu/) and the host's
 * softmax over a vocabulary (kernels/host/host_sampling.c).
 *
 * They repeat vs_exp_poly's operations lane by lane, in its order, with an FMA where it has
 * fmaf, so every lane gives the scalar function's bits (tests/test_ops_elementwise.c
 * checks this bit for bit). Host code only (not CUDA device code): on x86-64 GCC/clang it
 * defines VS_EXP_SIMD and the two functions, elsewhere nothing.
 */
#ifndef VS_EXP_SIMD_H
#define VS_EXP_SIMD_H

#include <math.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDACC__)
#define VS_EXP_SIMD 1
#include <immintrin.h>

/* an immediate operand: clang wants a constant expression, not a const variable */
#define VS_ROUND_DOWN (_MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)

/* vs_exp_poly on 16 lanes. Out-of-range and NaN lanes compute on 0 and are patched after.
 * 2^n by scalef: the result is a normal float, so y 2^n is exact and equals the scalar
 * function's two multiplies. */
__attribute__((target("avx512f"))) static inline __m512 exp_poly_512(__m512 x) {
  __mmask16 big = _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.72283935546875f), _CMP_GT_OQ);
  __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654022216797f), _CMP_LT_OQ);
  __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  __m512 xs = _mm512_mask_mov_ps(x, big | tiny | nan, _mm512_setzero_ps());
  __m512 n = _mm512_roundscale_ps(
      _mm512_fmadd_ps(xs, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
      VS_ROUND_DOWN);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), xs);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  __m512 e = _mm512_scalef_ps(y, n);
  e = _mm512_mask_mov_ps(e, big, _mm512_set1_ps(INFINITY));
  e = _mm512_mask_mov_ps(e, tiny, _mm512_setzero_ps());
  return _mm512_mask_mov_ps(e, nan, x);
}

/* vs_exp_poly on 8 lanes (AVX2 + FMA). */
__attribute__((target("avx2,fma"))) static inline __m256 exp_poly_256(__m256 x) {
  __m256 big = _mm256_cmp_ps(x, _mm256_set1_ps(88.72283935546875f), _CMP_GT_OQ);
  __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654022216797f), _CMP_LT_OQ);
  __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  __m256 xs = _mm256_andnot_ps(_mm256_or_ps(_mm256_or_ps(big, tiny), nan), x);
  __m256 n = _mm256_floor_ps(
      _mm256_fmadd_ps(xs, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), xs);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  __m256 h = _mm256_floor_ps(_mm256_mul_ps(n, _mm256_set1_ps(0.5f)));
  const __m256i bias = _mm256_set1_epi32(127);
  __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(h), bias), 23));
  __m256 b = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(_mm256_sub_ps(n, h)), bias), 23));
  __m256 e = _mm256_mul_ps(_mm256_mul_ps(y, a), b);
  e = _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), big);
  e = _mm256_blendv_ps(e, _mm256_setzero_ps(), tiny);
  return _mm256_blendv_ps(e, x, nan);
}

#else
#define VS_EXP_SIMD 0
#endif

#endif /* VS_EXP_SIMD_H */
