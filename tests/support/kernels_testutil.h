/*
 * tests/support/kernels_testutil.h - small helpers shared by the kernel tests (header only).
 *
 * Include after <cmocka.h>. Random data come from the project's Philox so that every test
 * run sees the same inputs; references are written independently in double precision.
 */
#ifndef VS_KERNELS_TESTUTIL_H
#define VS_KERNELS_TESTUTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/common/vs_philox.h"
#include "kernels/vs_kernels.h"

static inline vspec_dev *vt_dev(int threads) {
  vspec_dev *dev = NULL;
  char err[VSPEC_ERRLEN] = "";
  int rc = vs_dev_create(vs_cpu_ops(), threads, &dev, err, sizeof err);
  if (rc != VSPEC_OK) fail_msg("vs_dev_create: %d %s", rc, err);
  return dev;
}

static inline void *vt_malloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  assert_non_null(p);
  return p;
}

/* uniform floats in [lo, hi) */
static inline void vt_fill(vspec_rng *rng, float *x, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * (float)vs_rng_uniform(rng);
}

/* |got - ref| <= atol + rtol |ref| for every element; reports the worst offender. */
static inline void vt_assert_close(const float *got, const double *ref, size_t n, double rtol,
                                   double atol, const char *what) {
  size_t worst = 0;
  double worst_excess = -1.0, max_err = 0.0;
  for (size_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - ref[i]);
    if (!(err == err)) err = INFINITY; /* NaN in got fails */
    if (err > max_err) max_err = err;
    double excess = err - (atol + rtol * fabs(ref[i]));
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  if (n && worst_excess > 0.0)
    fail_msg("%s: element %zu got %.9g want %.9g (max abs err %.3g, rtol %g atol %g)", what,
             worst, (double)got[worst], ref[worst], max_err, rtol, atol);
}

static inline double vt_max_abs(const double *x, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; i++)
    if (fabs(x[i]) > m) m = fabs(x[i]);
  return m;
}

/* Relative to the array's scale: what "1e-5 relative" means for sums of products, where
 * single elements near zero come from cancellation and have no meaningful relative error. */
static inline void vt_assert_close_scaled(const float *got, const double *ref, size_t n,
                                          double rtol, const char *what) {
  double scale = vt_max_abs(ref, n);
  vt_assert_close(got, ref, n, rtol, rtol * (scale > 1e-30 ? scale : 1.0), what);
}

#endif /* VS_KERNELS_TESTUTIL_H */
