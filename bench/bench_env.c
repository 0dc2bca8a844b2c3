#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"

double vs_bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int vs_bench_env_open(vs_bench_env *env, const char *argv0, const char *plugin_dir, int threads,
                      char *err, size_t errlen) {
  memset(env, 0, sizeof *env);
  if (plugin_dir) {
    snprintf(env->plugin_dir, sizeof env->plugin_dir, "%s", plugin_dir);
  } else {
    /* Default: the plugins built next to this executable (build/plugins). */
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
      exe[n] = 0;
    } else {
      snprintf(exe, sizeof exe, "%s", argv0);
    }
    snprintf(env->plugin_dir, sizeof env->plugin_dir, "%s/plugins", dirname(exe));
  }
  int rc = vs_dev_create(vs_cpu_ops(), threads, &env->dev, err, errlen);
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
