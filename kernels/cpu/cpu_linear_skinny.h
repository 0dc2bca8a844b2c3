/*
 * kernels/cpu/cpu_linear_skinny.h - products with few activation rows ("skinny" GEMM).
 *
 * Speculative decoding verifies a tree of draft tokens per target forward, times two rows
 * with classifier-free guidance, so the linear layers see y[m, N] = x[m, K] W^T with m of
 * 1..64 and a weight matrix W [N, K] of megabytes. For such m the work is reading W once;
 * BLIS packs all of W into its own layout on every call, which makes m = 2..16 cost 2-3x
 * what m = 1 does. The kernel here streams each weight row once from memory and takes its
 * dot products with all m activation rows while it is in registers/L1.
 */
#ifndef VS_CPU_LINEAR_SKINNY_H
#define VS_CPU_LINEAR_SKINNY_H

#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_isa.h"

/* Largest m for which the skinny kernel of `isa` beats BLIS (measured, see the .c file);
 * blis_tuned is vs_blis_tuned(). vs_dev_create and vs_cpu_set_isa store it in the device
 * (dev->skinny_max_m), where tests may lower it to cross the threshold at small sizes. */
int vs_skinny_max_m(int isa, int blis_tuned);

/* c[i, j] = alpha * sum_p a[i, p] b[j, p] + bias[j] + beta * c[i, j] for i < m, j < n,
 * all matrices row-major with the given leading dimensions: a [m, k], b [n, k] (the
 * PyTorch weight layout), c [m, n]. bias may be NULL; beta == 0 never reads c (BLAS
 * semantics, so c may hold NaN). Runs on the device's pool when the product is large
 * enough to pay for a wake-up, splitting n.
 *
 * Every element is reduced in an order that depends only on k and the instruction set:
 * not on m, n, the element's position or the thread count. So results are bit-identical
 * for any thread count, and a row's result does not depend on which other rows were
 * batched with it (a tree verify sees the same numbers as a one-token forward, as long
 * as both stay at or below vs_skinny_max_m). */
void vs_skinny_nt(vspec_dev *dev, int m, int n, int k, float alpha, const float *a, int lda,
                  const float *b, int ldb, const float *bias, float beta, float *c, int ldc);

#endif /* VS_CPU_LINEAR_SKINNY_H */
