/*
 * kernels/cpu/cpu_elementwise.c - activations and elementwise arithmetic.
 *
 * The per-element formulas live in kernels/common/vs_math.h so that the CUDA kernels
 * compute exactly the same expressions. SiLU and SwiGLU also run in AVX-512 or AVX2 loops
 * (picked from the device's instruction set, cpu_linear_skinny.h): they repeat vs_exp_poly's
 * operations lane by lane, in its order and with an FMA where it calls fmaf, so every lane
 * gives the scalar function's bits (tests/test_ops_elementwise.c checks this bit for bit).
 */
#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_dev.h"
#include "kernels/common/vs_exp_simd.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/host/host_math.h"

#if VS_EXP_SIMD
/* y = silu(g) * u, or silu(g) when u is NULL; the tail by the scalar function. */
__attribute__((target("avx512f"))) static size_t swiglu_512(const float *g, const float *u,
                                                            size_t n, float *y) {
  size_t i = 0;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i + 16 <= n; i += 16) {
    __m512 x = _mm512_loadu_ps(g + i);
    __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, exp_poly_512(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    _mm512_storeu_ps(y + i, u ? _mm512_mul_ps(s, _mm512_loadu_ps(u + i)) : s);
  }
  return i;
}

__attribute__((target("avx2,fma"))) static size_t swiglu_256(const float *g, const float *u,
                                                             size_t n, float *y) {
  size_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(g + i);
    __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, exp_poly_256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
    _mm256_storeu_ps(y + i, u ? _mm256_mul_ps(s, _mm256_loadu_ps(u + i)) : s);
  }
  return i;
}
#endif

/* The vector loop of the device's instruction set over the longest prefix it covers;
 * returns where the scalar tail starts. */
static size_t swiglu_vector(const vspec_dev *dev, const float *g, const float *u, size_t n, float *y) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (dev->isa >= VS_ISA_AVX512) return swiglu_512(g, u, n, y);
  if (dev->isa >= VS_ISA_AVX2) return swiglu_256(g, u, n, y);
#endif
  return 0;
}

void vs_cpu_silu(vspec_dev *dev, float *x, size_t n) {
  VS_CPU_UNRECORDED(dev, "silu");
  for (size_t i = swiglu_vector(dev, x, NULL, n, x); i < n; i++) x[i] = vs_silu(x[i]);
}

/* LlamaGen gpt.py FeedForward: w2 (silu(w1 f) * (w3 f)); gate = w1 f, up = w3 f */
void vs_cpu_swiglu(vspec_dev *dev, const float *gate, const float *up, size_t n, float *y) {
  VS_CPU_UNRECORDED(dev, "swiglu");
  for (size_t i = swiglu_vector(dev, gate, up, n, y); i < n; i++) y[i] = vs_swiglu(gate[i], up[i]);
}

void vs_cpu_gelu_tanh(vspec_dev *dev, float *x, size_t n) {
  VS_CPU_UNRECORDED(dev, "gelu_tanh");
  for (size_t i = 0; i < n; i++) x[i] = vs_gelu_tanh(x[i]);
}

void vs_cpu_gelu(vspec_dev *dev, float *x, size_t n) {
  VS_CPU_UNRECORDED(dev, "gelu");
  for (size_t i = 0; i < n; i++) x[i] = vs_gelu_erf(x[i]);
}

void vs_cpu_mul(vspec_dev *dev, float *y, const float *x, size_t n) {
  VS_CPU_UNRECORDED(dev, "mul");
  for (size_t i = 0; i < n; i++) y[i] *= x[i];
}

/* The residual adds of every layer: GCC at -O2 leaves the plain loop scalar,
 * and at 32 rows it cost 3 % of a verify on models/fmnist. Lane by lane the same adds. */
#if VS_EXP_SIMD
__attribute__((target("avx512f"))) static size_t add_512(float *y, const float *x, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
  return i;
}

__attribute__((target("avx2"))) static size_t add_256(float *y, const float *x, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  return i;
}
#endif

void vs_cpu_add(vspec_dev *dev, float *y, const float *x, size_t n) {
  VS_CPU_UNRECORDED(dev, "add");
  size_t i = 0;
#if VS_EXP_SIMD
  if (dev->isa >= VS_ISA_AVX512) i = add_512(y, x, n);
  else if (dev->isa >= VS_ISA_AVX2) i = add_256(y, x, n);
#endif
  for (; i < n; i++) y[i] += x[i];
}

/* LlamaGen generate.py (prefill, decode_one_token): l_u + s (l_c - l_u). Both inputs are
 * read before out[i] is written, so out may alias either. */
void vs_cpu_cfg_combine(vspec_dev *dev, const float *cond, const float *uncond, size_t n,
                        float scale, float *out) {
  VS_CPU_UNRECORDED(dev, "cfg_combine");
  vs_host_cfg_combine(cond, uncond, n, scale, out);
}
