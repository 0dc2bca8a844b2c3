/*
 * bench/machine.c - the machine a benchmark table was measured on (see machine.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/machine.h"
#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_isa.h"
#include "vspec/types.h"

void vs_bench_machine_cpu_model(const char *cpuinfo_path, char *out, size_t cap) {
  snprintf(out, cap, "unknown");
  FILE *f = fopen(cpuinfo_path, "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    /* x86: "model name"; some ARM kernels only have "Processor" or "Hardware" */
    if (strncmp(line, "model name", 10) != 0 && strncmp(line, "Processor", 9) != 0) continue;
    char *v = strchr(line, ':');
    if (!v) continue;
    v++;
    while (*v == ' ' || *v == '\t') v++;
    v[strcspn(v, "\r\n")] = 0;
    if (*v) {
      snprintf(out, cap, "%s", v);
      break;
    }
  }
  fclose(f);
}

/* The instruction set in a CPU device's description, "cpu (avx512+amx, 2 threads)" (the
 * device info API is how the kernels say what they chose): AMX where bf16 weights run on its
 * tiles, else the vector extension of the hand-written kernels. */
static void isa_of(const char *name, int precision, char *isa, size_t cap, int *threads) {
  const char *p = strchr(name, '(');
  char base[32] = "";
  if (p) sscanf(p + 1, "%31[^,+)]", base);
  const char *t = p ? strchr(p, ',') : NULL;
  if (t) *threads = atoi(t + 1);
  if (precision == VS_PRECISION_BF16 && strstr(name, "+amx")) snprintf(isa, cap, "AMX");
  else if (strcmp(base, "avx512") == 0) snprintf(isa, cap, "AVX-512");
  else if (strcmp(base, "avx2") == 0) snprintf(isa, cap, "AVX2");
  else snprintf(isa, cap, "%s", *base ? base : "unknown");
}

void vs_bench_machine_get(vspec_dev *dev, vs_bench_machine *m) {
  memset(m, 0, sizeof *m);
  vs_bench_machine_cpu_model("/proc/cpuinfo", m->cpu, sizeof m->cpu);
  vs_device_info info;
  memset(&info, 0, sizeof info);
  if (vs_dev_info(dev, &info) != VSPEC_OK) snprintf(info.name, sizeof info.name, "unknown");
  snprintf(m->device, sizeof m->device, "%s", info.name);
  snprintf(m->precision, sizeof m->precision, "%s",
           info.precision == VS_PRECISION_BF16 ? "bf16" : "fp32");
  if (info.kind == VSPEC_DEVICE_CPU) {
    isa_of(info.name, info.precision, m->isa, sizeof m->isa, &m->threads);
    return;
  }
  /* a GPU generated: the CPU kernels only ran the host's share (sampling, quality
   * metrics), with the best instruction set this CPU has */
  snprintf(m->gpu, sizeof m->gpu, "%s", info.name);
  char host[64];
  snprintf(host, sizeof host, "cpu (%s, 1 thread)", vs_isa_name(vs_isa_best()));
  isa_of(host, VS_PRECISION_FP32, m->isa, sizeof m->isa, &m->threads);
  m->threads = 0;
}

void vs_bench_machine_describe(const vs_bench_machine *m, char *out, size_t cap) {
  int n = snprintf(out, cap, "CPU %s, %s, %s weights", m->cpu, m->isa, m->precision);
  if (n > 0 && (size_t)n < cap && m->threads > 0)
    n += snprintf(out + n, cap - n, ", %d thread%s", m->threads, m->threads == 1 ? "" : "s");
  if (n > 0 && (size_t)n < cap && m->gpu[0]) snprintf(out + n, cap - n, ", GPU %s", m->gpu);
}

void vs_bench_machine_json(FILE *f, const vs_bench_machine *m) {
  fprintf(f, "{\"cpu\": ");
  vs_bench_json_str(f, m->cpu);
  fprintf(f, ", \"isa\": ");
  vs_bench_json_str(f, m->isa);
  fprintf(f, ", \"precision\": ");
  vs_bench_json_str(f, m->precision);
  fprintf(f, ", \"threads\": %d, \"gpu\": ", m->threads);
  if (m->gpu[0]) vs_bench_json_str(f, m->gpu);
  else fputs("null", f);
  fprintf(f, ", \"device\": ");
  vs_bench_json_str(f, m->device);
  fputc('}', f);
}
