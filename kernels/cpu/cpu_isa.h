/*
 * kernels/cpu/cpu_isa.h - the instruction sets of the hand-written CPU kernels.
 *
 * Each kernel with vector loops (skinny products, bf16 rows, attention's softmax, norms,
 * RoPE, elementwise ops) has a variant per instruction set, compiled with GCC target
 * attributes and picked at run time from the device's `isa` (cpu_dev.h), so that one binary
 * runs on any x86-64. A leaf: it knows the CPU, not the kernels.
 */
#ifndef VS_CPU_ISA_H
#define VS_CPU_ISA_H

/* Instruction sets of the hand-written kernels, in increasing order. */
enum {
  VS_ISA_SCALAR = 1, /* portable C, any CPU */
  VS_ISA_AVX2 = 2,   /* AVX2 + FMA */
  VS_ISA_AVX512 = 3  /* AVX-512F/VL/BW + FMA */
};

/* The best instruction set this CPU (and OS) supports. */
int vs_isa_best(void);
/* Nonzero when `isa` can run here. */
int vs_isa_supported(int isa);
/* "scalar", "avx2", "avx512" ("?" otherwise). */
const char *vs_isa_name(int isa);

#endif /* VS_CPU_ISA_H */
