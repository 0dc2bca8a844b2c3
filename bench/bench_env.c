#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "core/paths.h"
#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_isa.h"

double vs_bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double vs_bench_cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int vs_bench_parse_sizes(const char *cmd, const char *opt, const char *text, int lo, int hi,
                         int *sizes, int max) {
  int n = 0;
  for (const char *p = text; *p && n < max;) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < lo || v > hi || (*end && *end != ',')) {
      fprintf(stderr, "vspec-bench %s: %s '%s' must be a list of %d..%d\n", cmd, opt, text, lo,
              hi);
      return -1;
    }
    sizes[n++] = (int)v;
    p = *end ? end + 1 : end;
  }
  if (n == 0) fprintf(stderr, "vspec-bench %s: %s is empty\n", cmd, opt);
  return n ? n : -1;
}

int vs_bench_set_isa(vspec_dev *dev, const char *cmd, const char *name) {
  int isa = 0;
  for (int i = VS_ISA_SCALAR; i <= VS_ISA_AVX512; i++)
    if (strcmp(name, vs_isa_name(i)) == 0) isa = i;
  if (vs_cpu_set_isa(dev, isa) != VSPEC_OK) {
    fprintf(stderr, "vspec-bench %s: --isa '%s' is unknown or not supported here\n", cmd, name);
    return 0;
  }
  return 1;
}

int vs_bench_parse_precision(const char *option, const char *text, int *out) {
  if (strcmp(text, "fp32") == 0) *out = VS_PRECISION_FP32;
  else if (strcmp(text, "bf16") == 0) *out = VS_PRECISION_BF16;
  else {
    fprintf(stderr, "%s: '%s' is not a precision: use fp32 or bf16\n", option, text);
    return 0;
  }
  return 1;
}

void vs_bench_print_device(FILE *f, vspec_dev *dev) {
  vs_device_info info;
  if (vs_dev_info(dev, &info)) return;
  fprintf(f, "device: %s, %s weights\n", info.name,
          info.precision == VS_PRECISION_BF16 ? "bf16" : "fp32");
}

const char *vs_bench_model_dir(const char *dir) {
  static char buf[4096];
  /* an absolute path is what the user means, wherever the program is */
  if (dir[0] == '/') return dir;
  vs_default_data_path(dir, buf, sizeof buf);
  return buf;
}

int vs_bench_env_open(vs_bench_env *env, const char *argv0, const char *plugin_dir,
                      const vs_bench_device *dv, char *err, size_t errlen) {
  memset(env, 0, sizeof *env);
  if (plugin_dir) {
    snprintf(env->plugin_dir, sizeof env->plugin_dir, "%s", plugin_dir);
  } else {
    /* Default: the plugins built or installed with this executable (core/paths.h). */
    vs_default_plugin_dir(env->plugin_dir, sizeof env->plugin_dir);
  }
  vs_bench_device def = {0};
  if (!dv) dv = &def;
  vs_device_options opt = {.threads = dv->threads, .precision = dv->precision};
  int rc = vs_device_open(dv->spec ? dv->spec : "cpu", &opt, &env->dev, err, errlen);
  if (rc) return rc;
  vs_host_init(&env->host, vs_cpu_ops());
  rc = vs_registry_open(env->plugin_dir, &env->host, &env->reg, err, errlen);
  if (rc) {
    vs_dev_destroy(env->dev);
    env->dev = NULL;
  }
  return rc;
}

void vs_bench_env_close(vs_bench_env *env) {
  vs_registry_close(env->reg);
  if (env->dev) vs_dev_destroy(env->dev);
  memset(env, 0, sizeof *env);
}

void vs_bench_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\') fputc('\\', f);
    if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
    else fputc(*s, f);
  }
  fputc('"', f);
}

