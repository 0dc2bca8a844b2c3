/*
 * kernels/host/host_math.h - math on host memory that every device shares.
 *
 * The decode engine turns logits into distributions and draws tokens on the host, whatever
 * device ran the forward (core/sampling.c): logits cross to the host by an explicit
 * download, and from there these functions are the one implementation. The CPU device's
 * ops wrap them (kernels/cpu/cpu_sampling.c), so CPU ops and the engine agree bit for bit,
 * and a device module that has no kernel of its own for an op can download, call one of
 * these and upload. Nothing here allocates or knows about devices.
 */
#ifndef VS_HOST_MATH_H
#define VS_HOST_MATH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Row-wise in place, numerically stable; -INFINITY entries get probability 0; a row with
 * no finite entry becomes all zeros (softmax) or stays all -inf (log_softmax). softmax (and
 * logits_to_probs) take e^x from vs_exp_poly (0 below x - max = -87.34) and sum in double, in
 * vector loops chosen from CPUID that give the scalar loop's bits. */
void vs_host_softmax(float *x, int rows, int n);
void vs_host_log_softmax(float *x, int rows, int n);
/* Index of the first maximum; NaN never wins; -1 for n <= 0. */
int vs_host_argmax(const float *x, int n);

/* Bytes of `work` vs_host_logits_to_probs needs for n tokens (top-k / top-p only). */
size_t vs_host_probs_work_bytes(int n);
/* LlamaGen's logit processing then softmax (generate.py sample); the semantics of
 * vspec_ops.logits_to_probs (include/vspec/ops.h). `work` holds vs_host_probs_work_bytes(n)
 * bytes, aligned for int and float; it may be NULL when top_k and top_p filter nothing.
 * Returns the number of tokens with nonzero probability. */
int vs_host_logits_to_probs(const float *logits, int n, float temperature, int top_k,
                            float top_p, float *probs, void *work);
/* Inverse-CDF draw: the first i with cumsum(probs)[i] > u * sum(probs), u in [0, 1);
 * zero, negative and NaN entries are never returned; -1 when nothing has mass. */
int vs_host_sample(const float *probs, int n, double u);
/* out = uncond + scale * (cond - uncond); out may alias either input. */
void vs_host_cfg_combine(const float *cond, const float *uncond, size_t n, float scale,
                         float *out);

/* LlamaGen's 2-D RoPE table (vspec_ops.rope2d_table) into host memory. */
void vs_host_rope2d_table(int n_cond, int grid, int head_dim, float base, float *table);

/* The vector loops of the host's softmax: VS_HOST_SIMD_* levels. vs_host_simd_set(level)
 * sets the level in force (capped at what this CPU has; a negative level only asks) and
 * returns it. Results do not depend on it: tests compare the levels bit for bit. */
enum { VS_HOST_SIMD_NONE = 0, VS_HOST_SIMD_AVX2 = 1, VS_HOST_SIMD_AVX512 = 2 };
int vs_host_simd_set(int level);
/* softmax's inner step, exposed for tests: x[i] = vs_exp_poly(x[i] - mx) for i < n, and the
 * sum of the results with entry i in double partial sum i mod 8, the eight added as
 * ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)). */
double vs_host_exp_row(float *x, int n, float mx);

/* 64-byte rounding for carving several arrays out of one work buffer. */
static inline size_t vs_host_align_up(size_t n) { return (n + 63) & ~(size_t)63; }

#ifdef __cplusplus
}
#endif
#endif /* VS_HOST_MATH_H */
