/*
 * kernels/cpu/cpu_linear_amx.h - linear layers on Intel AMX tiles (bf16 x bf16 -> fp32).
 *
 * Why: verifying a draft tree runs the linear layers over 16-64 activation rows (tree nodes
 * times two CFG rows). With fp32 FMAs that is compute-bound on one core: a 16-node CFG verify
 * costs about 3x a one-token step (`vspec-bench costcurve`). An AMX tile multiply
 * (TDPBF16PS: 16x16 fp32 += 16x32 bf16 . 32x16 bf16) does 8192 multiply-adds per
 * instruction, so with AMX those rows cost about what reading the bf16 weights once costs,
 * which is also what a one-token step costs.
 *
 * Precision: weights and activations are rounded to bf16 (round to nearest even), products
 * are exact in fp32 and accumulate in fp32 (Intel Architecture Instruction Set Extensions
 * Programming Reference, TDPBF16PS; denormal inputs and results are flushed to zero). This is
 * the `bf16` precision of the CPU device, never its fp32 reference path.
 *
 * Availability is decided at run time: CPUID leaf 7 (AMX-TILE, AMX-BF16) and Linux's
 * permission for the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+), requested
 * once per process. VSPEC_CPU_AMX=0 in the environment turns the path off (for comparisons).
 */
#ifndef VS_CPU_LINEAR_AMX_H
#define VS_CPU_LINEAR_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu_dev.h"

/* Nonzero when this CPU and OS run AMX-BF16 tiles (and VSPEC_CPU_AMX is not 0). Thread-safe;
 * the first call asks the kernel for the tile state permission. */
int vs_amx_available(void);

/* Bytes of the packed copy of a weight W [n, k]: n rounded up to 32 and k to 32, bf16. */
size_t vs_amx_packed_bytes(int n, int k);

/* Packs W [n, k] (row-major fp32, the PyTorch nn.Linear layout) into tile order: for every
 * block of 16 output columns and every block of 32 inputs, the 16 x 32 bf16 values as the B
 * operand of TDPBF16PS wants them (16 rows of k pairs, each row holding the 16 columns' pairs:
 * the "VNNI" layout), 1 KiB per block, blocks of a column block contiguous in k. Padding is 0.
 * Needs no AMX (plain C), so a weight can be packed anywhere. */
void vs_amx_pack(const float *w, int n, int k, uint16_t *packed);

/* y[m, n] = x[m, k] W^T + bias with W packed by vs_amx_pack; bias may be NULL. Only call when
 * vs_amx_available(). Uses the device's pool (split by output columns) and its scratch for the
 * bf16 copy of x. A row's result depends only on that row of x and on W: not on m, on the
 * other rows or on the thread count. */
void vs_amx_linear(vspec_dev *dev, const float *x, int m, int k, const uint16_t *packed, int n,
                   const float *bias, float *y);

/* For the AMX kernels (this one and cpu_linear_amx8.c), which use the same tiles: loads
 * palette 1 with all eight tiles at 16 rows x 64 bytes, tiles 0-5 (C and A) at tile_rows
 * rows. Per thread: call in each task before its tile instructions. A thread keeps its
 * configuration (and its tiles) between tasks: the call loads it only when tile_rows
 * differs from what the thread holds. Defined only where AMX builds (x86-64 Linux, GCC or
 * clang). */
void vs_amx_tile_config(int tile_rows);

/* The split of a product over `pairs` 32-column pairs that streams `bytes` of weights over
 * dev's pool: the number of tasks, with *pairs_per_task pairs each (one task unless every
 * task streams at least 512 KiB; see cpu_linear_amx.c). */
int vs_amx_split(const vspec_dev *dev, int pairs, size_t bytes, int *pairs_per_task);

/* v rounded up to a multiple of m: the tiles' padding, in both AMX kernels. */
static inline int vs_amx_round_up(int v, int m) { return (v + m - 1) / m * m; }

#endif /* VS_CPU_LINEAR_AMX_H */
