/*
 * kernels/cpu/cpu_rope.c - LlamaGen's 2-D rotary position embedding
 * (autoregressive/models/gpt.py, precompute_freqs_cis_2d and apply_rotary_emb).
 *
 * head_dim must be a multiple of 4 (two axes, each of head_dim/4 interleaved pairs); the
 * reference cannot build its table otherwise either.
 */
#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/host/host_math.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define VS_ROPE_SIMD 1
#include <immintrin.h>
#else
#define VS_ROPE_SIMD 0
#endif

void vs_cpu_rope2d_table(int n_cond, int grid, int head_dim, float base, float *table) {
  vs_host_rope2d_table(n_cond, grid, head_dim, base, table);
}

/* One head's pairs (x[2j], x[2j + 1]) rotated by (t[2j], t[2j + 1]) = (cos, sin) from pair
 * `from` on: the reference the vector loops below match. */
static void rotate_scalar(float *x, const float *t, int from, int half) {
  for (int j = from; j < half; j++)
    vs_rope_rotate(x[2 * j], x[2 * j + 1], t[2 * j], t[2 * j + 1], &x[2 * j], &x[2 * j + 1]);
}

/* Vector rotations with vs_rope_rotate's bits: p = x * cos and q = swapped(x) * sin are
 * rounded products, then even lanes take p - q and odd lanes p + q, as x0 c - x1 s and
 * x1 c + x0 s. Returns the pairs done. Before these, the scalar loop cost 3 % of a 16-node
 * CFG verify on models/fmnist. */
#if VS_ROPE_SIMD
__attribute__((target("avx512f"))) static int rotate_512(float *x, const float *t, int half) {
  int j = 0;
  for (; j + 8 <= half; j += 8) {
    __m512 v = _mm512_loadu_ps(x + 2 * j), cs = _mm512_loadu_ps(t + 2 * j);
    __m512 p = _mm512_mul_ps(v, _mm512_moveldup_ps(cs));
    __m512 q = _mm512_mul_ps(_mm512_permute_ps(v, 0xB1), _mm512_movehdup_ps(cs));
    _mm512_storeu_ps(x + 2 * j, _mm512_mask_sub_ps(_mm512_add_ps(p, q), (__mmask16)0x5555, p, q));
  }
  return j;
}

__attribute__((target("avx2"))) static int rotate_256(float *x, const float *t, int half) {
  int j = 0;
  for (; j + 4 <= half; j += 4) {
    __m256 v = _mm256_loadu_ps(x + 2 * j), cs = _mm256_loadu_ps(t + 2 * j);
    __m256 p = _mm256_mul_ps(v, _mm256_moveldup_ps(cs));
    __m256 q = _mm256_mul_ps(_mm256_permute_ps(v, 0xB1), _mm256_movehdup_ps(cs));
    _mm256_storeu_ps(x + 2 * j, _mm256_addsub_ps(p, q)); /* even lanes p - q, odd p + q */
  }
  return j;
}
#endif

void vs_cpu_rope_apply(vspec_dev *dev, float *x, int rows, int row_stride, int n_heads,
                       int head_dim, const int32_t *pos, const float *table) {
  VS_CPU_UNRECORDED(dev, "rope_apply");
  int half = head_dim / 2;
  for (int r = 0; r < rows; r++) {
    const float *t = table + (size_t)pos[r] * half * 2;
    float *xr = x + (size_t)r * row_stride;
    for (int h = 0; h < n_heads; h++) {
      float *xh = xr + (size_t)h * head_dim;
      int done = 0;
#if VS_ROPE_SIMD
      if (dev->isa >= VS_ISA_AVX512) done = rotate_512(xh, t, half);
      else if (dev->isa >= VS_ISA_AVX2) done = rotate_256(xh, t, half);
#endif
      rotate_scalar(xh, t, done, half);
    }
  }
}
