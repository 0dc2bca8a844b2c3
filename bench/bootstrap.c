/*
 * bench/bootstrap.c - percentile bootstrap (see bootstrap.h).
 */
#include <math.h>
#include <stdlib.h>

#include "bench/bootstrap.h"
#include "kernels/common/vs_philox.h"
#include "vspec/types.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double vs_quantile(double *v, int n, double q) {
  if (n <= 0) return NAN;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  double h = (n - 1) * q;
  int lo = (int)floor(h);
  if (lo >= n - 1) return v[n - 1];
  return v[lo] + (h - lo) * (v[lo + 1] - v[lo]);
}

int vs_bootstrap(int n, int n_stats, vs_bootstrap_fn fn, void *ctx, const vs_bootstrap_opts *o,
                 vs_interval *out) {
  for (int s = 0; s < n_stats; s++) out[s] = (vs_interval){NAN, NAN};
  if (n <= 0 || n_stats <= 0 || !o || o->resamples < 2 || !(o->level > 0 && o->level < 1))
    return VSPEC_EINVAL;
  int B = o->resamples;
  int *idx = malloc((size_t)n * sizeof *idx);
  double *vals = malloc((size_t)B * n_stats * sizeof *vals);
  double *one = malloc((size_t)n_stats * sizeof *one);
  int *count = calloc((size_t)n_stats, sizeof *count);
  int rc = idx && vals && one && count ? VSPEC_OK : VSPEC_ENOMEM;
  vspec_rng rng;
  vs_rng_init(&rng, o->seed, 0x62);
  for (int b = 0; rc == VSPEC_OK && b < B; b++) {
    for (int i = 0; i < n; i++) {
      int j = (int)(vs_rng_uniform(&rng) * n);
      idx[i] = j < n ? j : n - 1;
    }
    rc = fn(ctx, idx, n, one);
    for (int s = 0; rc == VSPEC_OK && s < n_stats; s++)
      if (isfinite(one[s])) vals[(size_t)s * B + count[s]++] = one[s];
  }
  for (int s = 0; rc == VSPEC_OK && s < n_stats; s++)
    if (count[s] >= 2) {
      double *v = vals + (size_t)s * B;
      out[s].lo = vs_quantile(v, count[s], (1 - o->level) / 2);
      out[s].hi = vs_quantile(v, count[s], (1 + o->level) / 2);
    }
  free(idx);
  free(vals);
  free(one);
  free(count);
  return rc;
}
