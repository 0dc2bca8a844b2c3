/*
 * kernels/cpu/cpu_linear_bf16.h - linear layers with bf16 weights and fp32 activations, for
 * CPUs without AMX (AMD Zen 4, Intel before Sapphire Rapids, any AVX2 machine).
 *
 * Why: batch-1 decoding reads every weight once per token, so on the CPU it runs at the
 * memory bound (docs/BENCHMARKS.md, "Decode against llama2.c"); bf16 weights halve the bytes.
 * Each weight row is widened to fp32 in registers (bf16 is the top half of a float: a shift)
 * and multiplied with fp32 activations in fp32 FMAs, so only the weights are rounded; with
 * AMX the device uses cpu_linear_amx.h instead, which also rounds the activations.
 *
 * Summation order: element (i, j) accumulates x[i, p] w[j, p] over p in one vector of the
 * instruction set's width (lane p mod W), the k tail in masked lanes (AVX-512) or in a
 * scalar sum added after (AVX2, scalar), then the lanes are added in a fixed order. It
 * depends on k and the instruction set only: not on m, on the other rows, on the element's
 * position or on the thread count.
 */
#ifndef VS_CPU_LINEAR_BF16_H
#define VS_CPU_LINEAR_BF16_H

#include <stdint.h>

#include "kernels/cpu/cpu_dev.h"

/* The most rows a product may have to take this kernel: all. Without AMX every product of a
 * bf16 device takes the bf16 weights, so a tree or chain verify multiplies by the same weights
 * as a decode step, and row i of an m-row product has the bits of the 1-row product of row i
 * (tests/test_linear_bf16.c); speculative decoding's target distribution is then AR's.
 * Until issue 33 item 4 (multi-row) the limit was 2 and larger products used the fp32
 * weights (a decode step and a verify then differed in their weights), because the kernel's multi-row blocks
 * were slow. With the prefetch and the widened copy of bf16_rows it is as fast as the fp32
 * kernel or faster at every m measured on the GPT-B shapes (m 1-64, AVX-512, Zen 4), and
 * 0-10 % slower at m 16-64 on the small fmnist model, whose fp32 weights are the ones that
 * lose least from memory (docs/BENCHMARKS.md, issue 33 item 4, multi-row products).
 *
 * AVX512-BF16 dot products (vdpbf16ps) would double the multiply-adds per instruction but
 * round the activations to bf16 as well, so an m-row product would no longer match the 1-row
 * path (which keeps fp32 activations) bit for bit; not used. */
#define VS_BF16_ROWS_MAX_M (1 << 30)

/* W [n, k] (row-major fp32) in bf16 (round to nearest even) into out (n k elements), in the
 * layout the kernel reads: rows in pairs (0, 1), (2, 3), ... and, within a pair's 2 k elements,
 * the first k16 = k / 16 * 16 columns in chunks of 16, the chunks of the two rows alternating
 * (row 2i chunk 0, row 2i+1 chunk 0, row 2i chunk 1, ...), then row 2i's k - k16 last columns,
 * then row 2i+1's; an odd last row stays as it is. Why: decoding multiplies one or two
 * activation rows into each weight row, a chain of dependent fused multiply-adds per row
 * whose latency, not memory, set the pace on the Zen 4 development machine at k = 2048
 * (20 GB/s for one row's stream, 29-30 GB/s for a pair's two chains reading one stream,
 * docs/BENCHMARKS.md issue 33 item 4); side by side in separate rows the two chains would be
 * two memory streams, which streamed slower still. */
void vs_bf16_pack(const float *w, int n, int k, uint16_t *out);

/* y[m, n] = x[m, k] W^T + bias with W [n, k] given as vs_bf16_pack made it; bias may be NULL.
 * Runs the device's instruction set (dev->isa) on its pool, split by output rows of W. */
void vs_bf16w_linear(vspec_dev *dev, const float *x, int m, int k, const uint16_t *w, int n,
                     const float *bias, float *y);

#endif /* VS_CPU_LINEAR_BF16_H */
