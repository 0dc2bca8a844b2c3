/*
 * kernels/cpu/cpu_linear_amx8.h - linear layers with int8 weights on AMX tiles (TDPBSSD).
 *
 * Why: a draft model is read once per drafted token, and on the CPU a decode-sized forward
 * costs what streaming its weights costs. The shipped draft GPT holds 2.4 MB of bf16 weights,
 * a little more than a core's L2 cache (2 MB on Sapphire Rapids), so every draft forward
 * streams them from L3; in int8 (1.2 MB) they stay in L2 between the forwards of one round.
 * `vspec-bench costcurve --random 4xDx4x1024x8` on that CPU: a one-row forward of width 96
 * (1.1 MB of bf16) took 0.03-0.05 ms against 0.13-0.15 ms at width 128 (2.4 MB).
 *
 * Only weights a backend asks for (the `weight_format` op, llamagen's `weight_format=int8`)
 * take this path, and only at bf16 precision: fp32 stays the reference everywhere.
 *
 * Numbers: each weight row (output channel) c has the scale sw[c] = max|W[c, :]| / 127 and
 * int8 values q = round(W / sw) (nearest, ties to even); each activation row i is quantised
 * the same way when the product runs (sx[i], its own maximum). TDPBSSD sums the int8
 * products exactly in int32 (no overflow up to k = VS_AMX8_MAX_K), and
 *   y[i, c] = (float)acc[i, c] * (sx[i] * sw[c]) + bias[c]
 * in fp32, in that order, so a C model of the instruction gives the same bits
 * (tests/test_linear_amx8.c). A row whose values are not all finite cannot be scaled; then
 * the call does nothing and returns nonzero, and the caller (vs_cpu_linear) runs the whole
 * product on the weight's bf16 copy instead.
 */
#ifndef VS_CPU_LINEAR_AMX8_H
#define VS_CPU_LINEAR_AMX8_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu_dev.h"

/* The longest input for which no int32 sum can overflow: 127 * 127 * k < 2^31. */
#define VS_AMX8_MAX_K 133000

/* Nonzero when AMX tiles are usable (vs_amx_available) and the CPU has AMX-INT8. */
int vs_amx8_available(void);

/* Bytes of a packed int8 weight W [n, k]: the tiles (n rounded up to 32, k to 64) followed by
 * the n (rounded up to 32) float scales. */
size_t vs_amx8_packed_bytes(int n, int k);

/* Quantises W [n, k] (row-major fp32) per output channel and packs it in TDPBSSD's B layout:
 * for every block of 16 output columns and every block of 64 inputs, 16 rows of 64 bytes,
 * row r holding inputs 4r .. 4r + 3 of each of the 16 columns. Plain C: packs on any CPU.
 * Nonzero when a weight is not finite (nothing to scale by) or k > VS_AMX8_MAX_K: the weight
 * then stays in bf16. */
int vs_amx8_pack(const float *w, int n, int k, void *packed);

/* The activation quantisation of one row of k values, as the kernel does it: returns the
 * scale sx and writes q (sx 0 and q all zeros when the largest magnitude is below 1e-30), or
 * returns a negative value when a value is not finite. The reference the tests compare the
 * kernel's vector loop with. */
float vs_amx8_quantize_row(const float *x, int k, int8_t *q);

/* y[m, n] = x[m, k] W^T + bias (bias may be NULL) with W packed by vs_amx8_pack, or nonzero
 * (y untouched) when a row of x is not finite. Only call when vs_amx8_available(). A row's
 * result depends only on that row and W, not on m or on the thread count; but one row that is
 * not finite sends the whole call (every row of a batch) to the caller's bf16 path. */
int vs_amx8_linear(vspec_dev *dev, const float *x, int m, int k, const void *packed, int n,
                   const float *bias, float *y);

#endif /* VS_CPU_LINEAR_AMX8_H */
