#include "core/host.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/log.h"
#include "core/params.h"
#include "kernels/common/vs_philox.h"
#include "core/safetensors.h"
#include "kernels/vs_kernels.h"

static void host_host_log(int level, const char *who, const char *fmt, ...) {
  if (level > vs_log_get_level()) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  vs_log(level, who, "%s", line);
}

/* The RNG lives in static inline host/device functions (kernels/common/vs_philox.h);
 * plugins reach it through these out-of-line copies. */
static void host_rng_init(vspec_rng *r, uint64_t seed, uint64_t stream) {
  vs_rng_init(r, seed, stream);
}
static double host_rng_uniform(vspec_rng *r) { return vs_rng_uniform(r); }
static float host_rng_normal(vspec_rng *r) { return (float)vs_rng_normal(r); }
static double host_rng_uniform_at(uint64_t seed, uint64_t stream, uint64_t n) {
  return vs_rng_uniform_at(seed, stream, n);
}

static void *host_host_alloc(size_t n) { return malloc(n ? n : 1); }
static void *host_host_calloc(size_t n, size_t s) { return calloc(n ? n : 1, s ? s : 1); }
static void *host_host_realloc(void *p, size_t n) { return realloc(p, n ? n : 1); }
static void host_host_free(void *p) { free(p); }

void vs_host_init(vspec_host *h, const vspec_ops *ops) {
  *h = (vspec_host){
      .struct_size = sizeof(vspec_host),
      .abi_major = VSPEC_ABI_MAJOR,
      .abi_minor = VSPEC_ABI_MINOR,
      .log = host_host_log,
      .alloc = host_host_alloc,
      .calloc = host_host_calloc,
      .realloc = host_host_realloc,
      .free = host_host_free,
      .ops = ops,
      .rng_init = host_rng_init,
      .rng_uniform = host_rng_uniform,
      .rng_normal = host_rng_normal,
      .param_double = vs_param_double,
      .param_int = vs_param_int,
      .param_choice = vs_param_choice,
      .param_string = vs_param_string,
      .param_check_known = vs_param_check_known,
      .tensors_open = vs_st_open,
      .tensors_close = vs_st_close,
      .tensors_meta = vs_st_meta,
      .tensors_find = vs_st_find,
      .tensors_get_f32 = vs_st_get_f32,
      .dev_ops = vs_dev_ops,
      .dev_space = vs_dev_space,
      .rng_uniform_at = host_rng_uniform_at,
  };
}
