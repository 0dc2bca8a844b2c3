/*
 * kernels/device.c - opening devices by name; the CUDA module is loaded on first use
 * (kernels/vs_device.h explains why it is a module).
 */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/vs_kernels.h"

#define VS_CUDA_MODULE "libvspec-cuda.so"

const vspec_ops *vs_dev_ops(const vspec_dev *dev) {
  return dev ? ((const vs_dev_head *)(const void *)dev)->ops : NULL;
}

void vs_dev_destroy(vspec_dev *dev) {
  if (dev) ((const vs_dev_head *)(const void *)dev)->cls->close(dev);
}

int vs_dev_info(vspec_dev *dev, vs_device_info *out) {
  memset(out, 0, sizeof *out);
  if (!dev) return VSPEC_EINVAL;
  return ((const vs_dev_head *)(const void *)dev)->cls->info(dev, out);
}

int vs_dev_check(vspec_dev *dev, char *err, size_t errlen) {
  if (!dev) return VSPEC_OK;
  return ((const vs_dev_head *)(const void *)dev)->cls->check(dev, err, errlen);
}

const char *vs_dev_alloc_error(vspec_dev *dev) {
  if (!dev) return "";
  const vs_device_class *cls = ((const vs_dev_head *)(const void *)dev)->cls;
  const char *why = cls->alloc_error ? cls->alloc_error(dev) : NULL;
  return why ? why : "";
}

int vs_dev_sync(vspec_dev *dev) {
  if (!dev) return VSPEC_OK;
  const vs_device_class *cls = ((const vs_dev_head *)(const void *)dev)->cls;
  return cls->sync ? cls->sync(dev) : VSPEC_OK;
}

int vs_dev_order(vspec_dev *dev, vspec_dev *after) {
  if (!dev || !after || dev == after) return VSPEC_OK;
  vs_dev_head *h = (vs_dev_head *)(void *)dev;
  vs_dev_count(&h->counters.orders, 1);
  return h->cls->order ? h->cls->order(dev, after) : VSPEC_OK;
}

uint32_t vs_dev_space(const vspec_dev *dev) {
  const vs_dev_head *h = (const vs_dev_head *)(const void *)dev;
  if (!h || h->cls->kind == VSPEC_DEVICE_CPU) return 0;
  return 0x100u * h->cls->kind + (uint32_t)h->index;
}

int vs_device_parse(const char *spec, uint32_t *kind, int *index, char *err, size_t errlen) {
  *index = 0;
  if (!spec || strcmp(spec, "cpu") == 0) {
    *kind = VSPEC_DEVICE_CPU;
    return VSPEC_OK;
  }
  if (strncmp(spec, "cuda", 4) == 0 && (spec[4] == '\0' || spec[4] == ':')) {
    *kind = VSPEC_DEVICE_CUDA;
    if (spec[4] == '\0') return VSPEC_OK;
    char *end = NULL;
    long v = strtol(spec + 5, &end, 10);
    if (spec[5] >= '0' && spec[5] <= '9' && end && *end == '\0' && v >= 0 && v < 1024) {
      *index = (int)v;
      return VSPEC_OK;
    }
  }
  snprintf(err, errlen, "unknown device '%s': use cpu, cuda or cuda:N (N = 0, 1, ...)", spec);
  return VSPEC_EINVAL;
}

/* ---- the CUDA module ------------------------------------------------------------------ */

static pthread_mutex_t dev_cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static const vs_device_class *dev_cuda_class;
static char dev_cuda_error[VSPEC_ERRLEN];

/* Where the module may be: $VSPEC_CUDA_MODULE, else lib/ next to the executable or one or
 * two levels up (build/vspecd, build/tests/test_* and build/tests/gpu/test_* all find
 * build/lib/). */
static int dev_cuda_candidates(char paths[][PATH_MAX], int max) {
  int n = 0;
  const char *env = getenv("VSPEC_CUDA_MODULE");
  if (env && *env) {
    snprintf(paths[n++], PATH_MAX, "%s", env);
    return n;
  }
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) return 0;
  exe[len] = '\0';
  char *slash = strrchr(exe, '/');
  if (!slash) return 0;
  *slash = '\0';
  if (n < max) snprintf(paths[n++], PATH_MAX, "%s/lib/%s", exe, VS_CUDA_MODULE);
  if (n < max) snprintf(paths[n++], PATH_MAX, "%s/../lib/%s", exe, VS_CUDA_MODULE);
  if (n < max) snprintf(paths[n++], PATH_MAX, "%s/../../lib/%s", exe, VS_CUDA_MODULE);
  return n;
}

static void dev_cuda_load_locked(void) {
  char paths[3][PATH_MAX];
  int n = dev_cuda_candidates(paths, 3);
  for (int i = 0; i < n; i++) {
    if (access(paths[i], F_OK) != 0) continue;
    void *h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      snprintf(dev_cuda_error, sizeof dev_cuda_error,
               "cannot load the CUDA module %s: %s (the CUDA 13 runtime and cuBLAS must be on "
               "the library path)", paths[i], dlerror());
      return;
    }
    vs_device_class_fn fn = (vs_device_class_fn)dlsym(h, VS_CUDA_CLASS_SYMBOL);
    const vs_device_class *cls = fn ? fn() : NULL;
    if (!cls || cls->struct_size < sizeof(vs_device_class) ||
        cls->version != VS_DEVICE_CLASS_VERSION || cls->kind != VSPEC_DEVICE_CUDA) {
      snprintf(dev_cuda_error, sizeof dev_cuda_error,
               "%s is not a CUDA module of this build (device class version %u, expected %u); "
               "rebuild it with this tree", paths[i], cls ? cls->version : 0u,
               (unsigned)VS_DEVICE_CLASS_VERSION);
      return; /* never dlclose: a half-initialised CUDA runtime must not be unloaded */
    }
    dev_cuda_class = cls;
    return;
  }
  const char *env = getenv("VSPEC_CUDA_MODULE");
  if (env && *env) {
    snprintf(dev_cuda_error, sizeof dev_cuda_error,
             "VSPEC_CUDA_MODULE=%s: no such file (the CUDA module, libvspec-cuda.so)", env);
    return;
  }
  char *dir = n ? strrchr(paths[0], '/') : NULL;
  if (dir) *dir = '\0';
  snprintf(dev_cuda_error, sizeof dev_cuda_error,
           "this build has no CUDA support: %s not found (looked in %s%s; it is built when "
           "nvcc is found, or with make VSPEC_CUDA=1; VSPEC_CUDA_MODULE names another)",
           VS_CUDA_MODULE, n ? paths[0] : "nowhere: cannot locate the executable",
           n > 1 ? " and above" : "");
}

static const vs_device_class *dev_cuda(char *err, size_t errlen) {
  pthread_mutex_lock(&dev_cuda_lock);
  if (!dev_cuda_class && !dev_cuda_error[0]) dev_cuda_load_locked();
  const vs_device_class *cls = dev_cuda_class;
  if (!cls) snprintf(err, errlen, "%s", dev_cuda_error);
  pthread_mutex_unlock(&dev_cuda_lock);
  return cls;
}

int vs_device_open(const char *spec, const vs_device_options *opt, vspec_dev **out, char *err,
                   size_t errlen) {
  *out = NULL;
  uint32_t kind;
  vs_device_options o = {0};
  if (opt) o = *opt;
  int rc = vs_device_parse(spec, &kind, &o.index, err, errlen);
  if (rc) return rc;
  const vs_device_class *cls =
      kind == VSPEC_DEVICE_CPU ? vs_cpu_device_class() : dev_cuda(err, errlen);
  if (!cls) return VSPEC_ENOTSUP;
  rc = cls->open(&o, out, err, errlen);
  /* The head hands out the counting table (kernels/op_counts.c); the module's own stays in
   * its class. */
  if (!rc) ((vs_dev_head *)(void *)*out)->ops = vs__counted_ops(cls);
  return rc;
}
