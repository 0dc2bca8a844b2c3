/*
 * tests/gpu/gpu_testutil.h - helpers of the GPU suite (make gpu-test), header only.
 *
 * Every GPU test compares the CUDA device against the CPU device on the same inputs (or
 * against an exact emulation of what the GPU is asked to compute). Without a usable CUDA
 * device a test binary exits with VT_EXIT_SKIP after saying why, so the runner reports it
 * as skipped, never as passed.
 */
#ifndef VS_GPU_TESTUTIL_H
#define VS_GPU_TESTUTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/common/vs_philox.h"
#include "kernels/vs_kernels.h"
#include "tests/support/test_device.h"

/* cuda (or $VSPEC_TEST_DEVICE) with the given precision; exits VT_EXIT_SKIP if there is no
 * usable GPU. */
static inline vspec_dev *gt_gpu(int precision) {
  const char *spec = getenv("VSPEC_TEST_DEVICE");
  if (!spec || !*spec || strcmp(spec, "cpu") == 0) spec = "cuda";
  vs_device_options opt = {.precision = precision};
  char err[VSPEC_ERRLEN] = "";
  vspec_dev *dev = NULL;
  if (vs_device_open(spec, &opt, &dev, err, sizeof err) == VSPEC_OK) return dev;
  fprintf(stderr, "SKIPPED: %s\n", err);
  exit(VT_EXIT_SKIP);
}

static inline vspec_dev *gt_cpu(void) {
  char err[VSPEC_ERRLEN] = "";
  vspec_dev *dev = NULL;
  if (vs_device_open("cpu", &(vs_device_options){.threads = 1}, &dev, err, sizeof err)) {
    fprintf(stderr, "cannot open the CPU device: %s\n", err);
    exit(1);
  }
  return dev;
}

/* The devices of a test that holds one op of the CUDA device (fp32) to the CPU's: opens both
 * (exits VT_EXIT_SKIP without a GPU). */
static inline void gt_open_pair(vspec_dev **gpu, vspec_dev **cpu) {
  *gpu = gt_gpu(VS_PRECISION_FP32);
  *cpu = gt_cpu();
}

static inline void gt_close_pair(vspec_dev *gpu, vspec_dev *cpu) {
  vs_dev_destroy(gpu);
  vs_dev_destroy(cpu);
}

/* Nonzero when dev's table has the op `field` (a member of vspec_ops) and it is not NULL. */
#define GT_HAS_OP(dev, field)                                                                  \
  (VSPEC_HAS_FIELD(vs_dev_ops(dev), vspec_ops, field) && vs_dev_ops(dev)->field)

/* A setup's status: 0 when the CUDA device has the op under test, else -1 with a word why. */
static inline int gt_need_op(int has, const char *op) {
  if (has) return 0;
  fprintf(stderr, "the CUDA device has no %s\n", op);
  return -1;
}

/* A device copy of `bytes` host bytes (host NULL: the zeros alloc gives). */
static inline void *gt_up_bytes(vspec_dev *dev, const void *host, size_t bytes) {
  const vspec_ops *o = vs_dev_ops(dev);
  void *d = o->alloc(dev, bytes ? bytes : 1);
  if (!d || (host && bytes && o->upload(dev, d, host, bytes))) abort();
  return d;
}

static inline float *gt_host(size_t n) {
  float *p = (float *)malloc((n ? n : 1) * sizeof(float));
  if (!p) abort();
  return p;
}

static inline void gt_fill(vspec_rng *rng, float *x, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)vs_rng_uniform(rng);
}

/* A device copy of n host floats. */
static inline float *gt_up(vspec_dev *dev, const float *host, size_t n) {
  const vspec_ops *o = vs_dev_ops(dev);
  float *d = (float *)o->alloc(dev, (n ? n : 1) * sizeof(float));
  if (!d || o->upload(dev, d, host, n * sizeof(float))) abort();
  return d;
}

/* A host copy of n device floats (checks the device for errors first). */
static inline float *gt_down(vspec_dev *dev, const float *d, size_t n) {
  char err[VSPEC_ERRLEN] = "";
  if (vs_dev_check(dev, err, sizeof err)) {
    fprintf(stderr, "device error: %s\n", err);
    abort();
  }
  float *h = gt_host(n);
  if (vs_dev_ops(dev)->download(dev, h, d, n * sizeof(float))) abort();
  return h;
}

/* max |got - want| <= rtol * max |want| + atol, else the test fails naming the worst
 * element. Returns the max difference relative to max |want|. */
static inline double gt_close(const char *what, const float *got, const float *want, size_t n,
                              double rtol, double atol) {
  double scale = 0.0, worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++)
    if (fabs((double)want[i]) > scale) scale = fabs((double)want[i]);
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - (double)want[i]);
    if (!(d == d)) d = INFINITY;
    if (d > worst) worst = d, at = i;
  }
  double rel = scale > 0 ? worst / scale : worst;
  if (!(worst <= rtol * scale + atol))
    fail_msg("%s: max |gpu - cpu| %.3g at %zu (gpu %.8g, cpu %.8g), max |cpu| %.3g, allowed "
             "%.3g", what, worst, at, got[at], want[at], scale, rtol * scale + atol);
  return rel;
}

#endif /* VS_GPU_TESTUTIL_H */
