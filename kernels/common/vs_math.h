/*
 * kernels/common/vs_math.h - per-element math shared by the CPU kernels and the CUDA
 * kernels (kernels/cuda/).
 *
 * Everything is `static inline` and marked VS_HD so that one definition serves host C and
 * CUDA device code: the two backends must agree on formulas (and, where the hardware
 * allows, on bits), and keeping a single copy is how that is guaranteed. Only C11 / CUDA
 * C++ common ground is used here: no hex-float literals, no C-only constructs, no type
 * punning through unions (memcpy is allowed in device code and is what compilers turn
 * into a register move).
 */
#ifndef VS_MATH_H
#define VS_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define VS_HD __host__ __device__
#else
#define VS_HD
#endif

/* ---- bit casts ------------------------------------------------------------------------- */

VS_HD static inline uint32_t vs_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

VS_HD static inline float vs_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ---- activations (LlamaGen: SwiGLU, tanh-GELU caption MLP, VQ swish; MAR: erf GELU) ---- */

/* e^x in float: Cody-Waite range reduction and the polynomial of Cephes' expf (S. L. Moshier,
 * Cephes Math Library, expf.c): n = floor(x log2(e) + 1/2), r = x - n ln 2 (ln 2 in two
 * parts), e^r = 1 + r + r^2 P(r), e^x = e^r 2^n with 2^n applied as two powers of two that are
 * both normal floats for every n in range (the product is a normal float, so it is exact and
 * equals AVX-512's scalef). Relative error below 8.5e-8 on [-87.3, 88.7] (each float with
 * |x| > 1e-3 checked); 0 below (where e^x is subnormal), +inf above, NaN stays NaN.
 * Why not expf: the CPU's SiLU and softmaxes run this in AVX-512/AVX2 loops (cpu_elementwise.c;
 * a fifth of a tree verify's time was scalar expf), and every step here is one IEEE operation
 * (fmaf: one rounding) in a fixed order, which those loops repeat lane by lane with vector
 * FMAs: scalar and vector code give the same bits, so an element's value does not depend on
 * the lane it lands in. Fused, the AVX-512 loop has about half the operations it had with
 * separate multiplies and adds (its SiLU of a 12-row verify took 0.86 ns an element then,
 * 0.49 ns now). */
VS_HD static inline float vs_exp_poly(float x) {
  if (x != x) return x;
  if (x > 88.72283935546875f) return INFINITY;
  if (x < -87.33654022216797f) return 0.0f;
  float n = floorf(fmaf(x, 1.44269504088896341f, 0.5f));
  float r = fmaf(n, -0.693359375f, x);
  r = fmaf(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  float y = fmaf(p, r * r, r) + 1.0f;
  float h = floorf(n * 0.5f);
  float a = vs_bits_f32((uint32_t)((int32_t)h + 127) << 23);
  float b = vs_bits_f32((uint32_t)((int32_t)(n - h) + 127) << 23);
  return y * a * b;
}

/* x * sigmoid(x), written as x / (1 + e^-x) like PyTorch's CPU kernel. For very negative x,
 * e^-x is +inf and the quotient is a correctly signed zero, so no clamp is needed. */
VS_HD static inline float vs_silu(float x) { return x / (1.0f + vs_exp_poly(-x)); }

/* exact GELU (PyTorch nn.GELU(), approximate='none'): 0.5 x (1 + erf(x / sqrt 2)). */
VS_HD static inline float vs_gelu_erf(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

/* tanh-approximated GELU (PyTorch approximate='tanh', LlamaGen's caption MLP):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
VS_HD static inline float vs_gelu_tanh(float x) {
  const float k_beta = 0.7978845608028654f; /* sqrt(2/pi) */
  const float k_kappa = 0.044715f;
  float inner = k_beta * (x + k_kappa * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}

/* LlamaGen's FeedForward (autoregressive/models/gpt.py): w2(silu(w1 f) * w3 f), gate = w1 f,
 * up = w3 f. */
VS_HD static inline float vs_swiglu(float gate, float up) { return vs_silu(gate) * up; }

/* Classifier-free guidance on logits, LlamaGen autoregressive/models/generate.py:
 * l_u + s (l_c - l_u). */
VS_HD static inline float vs_cfg_mix(float cond, float uncond, float scale) {
  return uncond + (cond - uncond) * scale;
}

/* ---- normalisation ------------------------------------------------------------------------ */

/* Eight partial double sums (entry i went to sum i mod 8) added in a fixed tree: independent
 * partials vectorise without reassociating anything, so a sum (RMSNorm's squares, softmax's
 * exponentials) has the same bits whatever the compiler or instruction set. */
VS_HD static inline double vs_sum8(const double *s) {
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* RMSNorm's scale (LlamaGen autoregressive/models/gpt.py RMSNorm) from the double sum of squares of a row of `dim` values:
 * x * rsqrt(mean(x^2) + eps) in fp32 (the mean rounded to float first, as the reference's
 * float32 mean is), then times the weight (vs_rms_apply). */
VS_HD static inline float vs_rms_inv(double sum_sq, int dim, float eps) {
  float mean = (float)(sum_sq / dim);
  return (float)(1.0 / sqrt((double)(mean + eps)));
}
VS_HD static inline float vs_rms_apply(float x, float inv, float w) { return (x * inv) * w; }

/* LayerNorm (PyTorch nn.LayerNorm) from the double mean and biased variance of a row:
 * rstd in float as the reference's rsqrt(var + eps), then (x - mean) * rstd, times w and
 * plus b when the layer is affine. */
VS_HD static inline float vs_ln_rstd(double var, float eps) {
  return (float)(1.0 / sqrt((double)((float)var + eps)));
}
VS_HD static inline float vs_ln_apply(float x, float mean, float rstd, const float *w,
                                      const float *b, int i) {
  float y = (x - mean) * rstd;
  if (w) y = y * w[i];
  if (b) y = y + b[i];
  return y;
}

/* ---- rotary embedding frequencies (LlamaGen gpt.py, precompute_freqs_cis_2d) ----------- */

/* Rotation of one interleaved pair (x0, x1) by the table entry (c, s) = (cos, sin):
 * torch.view_as_complex(x) * freqs_cis. */
VS_HD static inline void vs_rope_rotate(float x0, float x1, float c, float s, float *y0,
                                        float *y1) {
  *y0 = x0 * c - x1 * s;
  *y1 = x1 * c + x0 * s;
}

/* theta_k = base^(-4k/head_dim), evaluated the way precompute_freqs_cis_2d does in float32:
 * 1 / (base ** (float(2k) / half)) with half = head_dim/2. Doing each step in float rather
 * than evaluating the closed form in double keeps the table within an ulp or so of the
 * reference checkpoints' training-time table. */
VS_HD static inline float vs_rope_theta(int k, int head_dim, float base) {
  float half = (float)(head_dim / 2);
  float e = (float)(2 * k) / half;
  return 1.0f / powf(base, e);
}

/* ---- half-precision conversions ---------------------------------------------------------- */

/* bf16 is the top half of a float32, so widening is a shift. */
VS_HD static inline float vs_bf16_to_f32(uint16_t b) { return vs_bits_f32((uint32_t)b << 16); }

/* float32 -> bf16 with round-to-nearest-even. NaNs stay NaN (quiet bit forced, because
 * truncating a signalling NaN whose payload lives in the low bits would yield an inf).
 * Overflow rounds to inf, as RNE requires. */
VS_HD static inline uint16_t vs_f32_to_bf16(float f) {
  uint32_t u = vs_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return (uint16_t)(u >> 16);
}

/* IEEE binary16 -> float32, exact for every input: subnormals are renormalised, inf and
 * NaN (payload included) are carried over. */
VS_HD static inline float vs_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + (127u - 15u)) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    /* subnormal: value = mant * 2^-24; shift the leading one up to the implicit bit */
    uint32_t e = 127u - 15u + 1u;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      e--;
    }
    bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  return vs_bits_f32(bits);
}

#endif /* VS_MATH_H */
