/*
 * kernels/cpu/cpu_elementwise.c - activations and elementwise arithmetic.
 *
 * The per-element formulas live in kernels/common/vs_math.h so that the CUDA kernels
 * compute exactly the same expressions.
 */
#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_dev.h"
#include "kernels/host/host_math.h"

void vs_cpu_silu(vspec_dev *dev, float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = vs_silu(x[i]);
}

/* LlamaGen gpt.py FeedForward: w2 (silu(w1 f) * (w3 f)); gate = w1 f, up = w3 f */
void vs_cpu_swiglu(vspec_dev *dev, const float *gate, const float *up, size_t n, float *y) {
  for (size_t i = 0; i < n; i++) y[i] = vs_swiglu(gate[i], up[i]);
}

void vs_cpu_gelu_tanh(vspec_dev *dev, float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = vs_gelu_tanh(x[i]);
}

void vs_cpu_gelu(vspec_dev *dev, float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = vs_gelu_erf(x[i]);
}

void vs_cpu_mul(vspec_dev *dev, float *y, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] *= x[i];
}

void vs_cpu_add(vspec_dev *dev, float *y, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] += x[i];
}

/* LlamaGen generate.py (prefill, decode_one_token): l_u + s (l_c - l_u). Both inputs are
 * read before out[i] is written, so out may alias either. */
void vs_cpu_cfg_combine(vspec_dev *dev, const float *cond, const float *uncond, size_t n,
                        float scale, float *out) {
  vs_host_cfg_combine(cond, uncond, n, scale, out);
}
