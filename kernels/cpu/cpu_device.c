/*
 * kernels/cpu/cpu_device.c - the CPU device: open, close, info, and the instruction set its
 * kernels use. The top of kernels/cpu/: it calls the other files, none calls it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_linear_skinny.h"
#include "kernels/cpu/cpu_linear_amx.h"
#include "kernels/cpu/cpu_linear_amx8.h"
#include "kernels/cpu/cpu_threads.h"

static void set_err(char *err, size_t errlen, const char *msg) {
  if (err && errlen) snprintf(err, errlen, "%s", msg);
}

/* threads = 0: one compute thread per online core (what "all cores" means to the CLIs). */
static int online_cores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (n > 256 ? 256 : (int)n);
}

/* The best instruction set of this CPU, capped by VSPEC_CPU_ISA=scalar|avx2|avx512: a way
 * to measure or reproduce the AVX2 and portable paths on an AVX-512 machine without a
 * rebuild. An unknown or unsupported value is ignored. */
static int default_isa(void) {
  int isa = vs_isa_best();
  const char *env = getenv("VSPEC_CPU_ISA");
  if (env && *env) {
    for (int i = VS_ISA_SCALAR; i <= VS_ISA_AVX512; i++)
      if (strcmp(env, vs_isa_name(i)) == 0 && i < isa) isa = i;
  }
  return isa;
}

int vs_cpu_set_isa(vspec_dev *dev, int isa) {
  if (!dev || isa < VS_ISA_SCALAR || isa > VS_ISA_AVX512) return VSPEC_EINVAL;
  if (!vs_isa_supported(isa)) return VSPEC_ENOTSUP;
  dev->isa = isa;
  dev->skinny_max_m = vs_skinny_max_m(isa, vs_blis_tuned());
  return VSPEC_OK;
}

static int cpu_count(char *err, size_t errlen) { return 1; }

static int cpu_open(const vs_device_options *opt, vspec_dev **out, char *err, size_t errlen) {
  if (out) *out = NULL;
  if (!opt || !out || opt->threads < 0) {
    set_err(err, errlen, "cpu device: bad argument");
    return VSPEC_EINVAL;
  }
  if (opt->index != 0) {
    snprintf(err, errlen, "cpu device %d does not exist: the CPU is device 0", opt->index);
    return VSPEC_ERANGE;
  }
  int amx = default_isa() == VS_ISA_AVX512 && vs_amx_available();
  if (opt->precision == VS_PRECISION_BF16 && !amx && default_isa() < VS_ISA_AVX2) {
    set_err(err, errlen, "cpu device: precision bf16 needs AVX2 (or AMX tiles), which this "
            "CPU lacks (or VSPEC_CPU_ISA turned off): use fp32");
    return VSPEC_ENOTSUP;
  }
  vspec_dev *dev = calloc(1, sizeof *dev);
  if (!dev) {
    set_err(err, errlen, "cpu device: out of memory");
    return VSPEC_ENOMEM;
  }
  dev->head.cls = vs_cpu_device_class();
  dev->head.ops = vs__counted_ops(dev->head.cls);
  dev->threads = opt->threads ? opt->threads : online_cores();
  dev->isa = default_isa();
  dev->skinny_max_m = vs_skinny_max_m(dev->isa, vs_blis_tuned());
  dev->precision = opt->precision == VS_PRECISION_BF16 ? VS_PRECISION_BF16 : VS_PRECISION_FP32;
  dev->amx = amx;
  dev->amx_int8 = amx && vs_amx8_available();
  if (vs_cpu_reserve_scratch(dev, VS_CPU_SCRATCH_DEFAULT) != VSPEC_OK) {
    free(dev);
    set_err(err, errlen, "cpu device: cannot allocate the scratch arena");
    return VSPEC_ENOMEM;
  }
  if (dev->threads > 1 && !(dev->pool = vs_pool_create(dev->threads))) {
    free(dev->scratch);
    free(dev);
    set_err(err, errlen, "cpu device: cannot start the compute threads");
    return VSPEC_ENOMEM;
  }
  *out = dev;
  return VSPEC_OK;
}

static void cpu_close(vspec_dev *dev) {
  if (!dev) return;
  if (dev->rec) { /* a recording left open: end it, dropping what it recorded */
    vspec_graph *g;
    if (vs_cpu_graph_end(dev, &g) == VSPEC_OK) vs_cpu_graph_free(dev, g);
  }
  vs_pool_destroy(dev->pool);
  free(dev->scratch);
  free(dev->fused);
  free(dev);
}

static int cpu_info(vspec_dev *dev, vs_device_info *out) {
  out->kind = VSPEC_DEVICE_CPU;
  out->index = 0;
  snprintf(out->name, sizeof out->name, "cpu (%s%s, %d thread%s)", vs_isa_name(dev->isa),
           dev->precision != VS_PRECISION_BF16 ? "" : dev->amx ? "+amx" : "+bf16",
           dev->threads,
           dev->threads == 1 ? "" : "s");
  out->precision = dev->precision;
  return VSPEC_OK;
}

/* CPU ops that fail abort (vs_scratch) or return their error; nothing is left pending. */
static int cpu_check(vspec_dev *dev, char *err, size_t errlen) { return VSPEC_OK; }

static const vs_device_class cpu_class = {
    .struct_size = sizeof(vs_device_class),
    .version = VS_DEVICE_CLASS_VERSION,
    .name = "cpu",
    .kind = VSPEC_DEVICE_CPU,
    .count = cpu_count,
    .open = cpu_open,
    .close = cpu_close,
    .info = cpu_info,
    .check = cpu_check,
    .sync = NULL,        /* CPU ops are done when they return */
    .alloc_error = NULL, /* the C library's malloc says nothing more */
};

const vs_device_class *vs_cpu_device_class(void) {
  /* .ops is filled here rather than in the initialiser: vs_cpu_ops() is not a constant
   * expression. The table is the same object every time, so the race is benign. */
  static vs_device_class cls;
  if (!cls.ops) {
    cls = cpu_class;
    cls.ops = vs_cpu_ops();
  }
  return &cls;
}

int vs_dev_create(const vspec_ops *ops, int threads, vspec_dev **out, char *err, size_t errlen) {
  if (out) *out = NULL;
  if (!ops || !out || threads < 0) {
    set_err(err, errlen, "vs_dev_create: bad argument");
    return VSPEC_EINVAL;
  }
  if (ops != vs_cpu_ops()) {
    set_err(err, errlen, "vs_dev_create: only the CPU device is created this way; open other "
            "devices with vs_device_open");
    return VSPEC_ENOTSUP;
  }
  vs_device_options opt = {.threads = threads};
  return cpu_open(&opt, out, err, errlen);
}
