/*
 * kernels/cpu/cpu_isa.c - which instruction sets of the hand-written kernels this CPU runs
 * (see cpu_isa.h).
 */
#include "kernels/cpu/cpu_isa.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define VS_ISA_X86 1
#else
#define VS_ISA_X86 0
#endif

int vs_isa_supported(int isa) {
  switch (isa) {
    case VS_ISA_SCALAR: return 1;
#if VS_ISA_X86
    case VS_ISA_AVX2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case VS_ISA_AVX512:
      /* libgcc's check includes the OS's XCR0 state for the zmm registers */
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("fma");
#endif
    default: return 0;
  }
}

int vs_isa_best(void) {
  if (vs_isa_supported(VS_ISA_AVX512)) return VS_ISA_AVX512;
  if (vs_isa_supported(VS_ISA_AVX2)) return VS_ISA_AVX2;
  return VS_ISA_SCALAR;
}

const char *vs_isa_name(int isa) {
  switch (isa) {
    case VS_ISA_SCALAR: return "scalar";
    case VS_ISA_AVX2: return "avx2";
    case VS_ISA_AVX512: return "avx512";
    default: return "?";
  }
}
