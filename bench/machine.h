/*
 * bench/machine.h - the machine a benchmark table was measured on.
 *
 * A speed-up is a property of a machine as much as of a method: the CPU model, the
 * instruction set the CPU kernels ran (AMX tiles for bf16 weights, AVX-512, AVX2 or the
 * portable code: kernels/cpu picks the best this CPU has, capped by VSPEC_CPU_ISA), the
 * weights' precision, the compute threads, and the GPU where one generated. eval's JSON,
 * markdown and plot carry all of them (issue 33, item 3).
 */
#ifndef VS_BENCH_MACHINE_H
#define VS_BENCH_MACHINE_H

#include <stdio.h>

#include "kernels/vs_kernels.h"

typedef struct vs_bench_machine {
  char cpu[256];      /* /proc/cpuinfo's model name; "unknown" when it has none */
  char isa[32];       /* "AMX", "AVX-512", "AVX2" or "scalar": what the CPU kernels ran */
  char precision[8];  /* "fp32" or "bf16" */
  int threads;        /* CPU compute threads */
  char gpu[128];      /* the GPU's name (vs_dev_info), "" when the CPU generated */
  char device[128];   /* the device's own description (vs_dev_info) */
} vs_bench_machine;

/* What dev (the generating device) and this host are. */
void vs_bench_machine_get(vspec_dev *dev, vs_bench_machine *m);
/* The model name of the first processor in a /proc/cpuinfo-format file, or "unknown". */
void vs_bench_machine_cpu_model(const char *cpuinfo_path, char *out, size_t cap);
/* One line: "CPU AMD EPYC 7B13, AVX2, fp32 weights, 1 thread" (and ", GPU NAME"). */
void vs_bench_machine_describe(const vs_bench_machine *m, char *out, size_t cap);
/* A JSON object {"cpu": ..., "isa": ..., "precision": ..., "threads": N, "gpu": ... | null,
 * "device": ...}. */
void vs_bench_machine_json(FILE *f, const vs_bench_machine *m);

#endif /* VS_BENCH_MACHINE_H */
