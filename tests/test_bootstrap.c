/* tests/test_bootstrap.c - percentile bootstrap intervals (bench/bootstrap.h): coverage where
 * the truth is known, determinism, quantiles, and a paired statistic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "bench/bootstrap.h"
#include "kernels/common/vs_philox.h"
#include "vspec/types.h"

/* The fraction of ones among the resampled images (a class accuracy), and the same for a
 * second sample paired with the first, and their difference. */
typedef struct bern {
  const uint8_t *a, *b;
  int shrink; /* test hook: > 1 resamples only n / shrink images (a planted fault) */
} bern;

static int bern_stats(void *ctx, const int *idx, int n, double *out) {
  const bern *c = ctx;
  int m = c->shrink > 1 ? n / c->shrink : n;
  double sa = 0, sb = 0;
  for (int i = 0; i < m; i++) sa += c->a[idx[i]], sb += c->b ? c->b[idx[i]] : 0;
  out[0] = sa / m;
  out[1] = c->b ? (sa - sb) / m : NAN;
  return VSPEC_OK;
}

/* Coverage of the 95 % interval of a Bernoulli(p) mean over R samples of n: within a band
 * around 0.95 that binomial noise (R = 400: sd 0.011) and the percentile interval's known
 * small under-coverage leave room for. */
static double coverage(int shrink, int R) {
  enum { N = 300 };
  const double p = 0.8;
  uint8_t a[N];
  vspec_rng rng;
  vs_rng_init(&rng, 91, 0);
  int hit = 0;
  for (int r = 0; r < R; r++) {
    for (int i = 0; i < N; i++) a[i] = vs_rng_uniform(&rng) < p;
    bern c = {.a = a, .shrink = shrink};
    vs_interval iv[2];
    vs_bootstrap_opts o = {.resamples = 200, .level = 0.95, .seed = 1000 + (uint64_t)r};
    assert_int_equal(vs_bootstrap(N, 2, bern_stats, &c, &o, iv), VSPEC_OK);
    assert_true(isnan(iv[1].lo) && isnan(iv[1].hi)); /* all-NAN statistic: no interval */
    hit += iv[0].lo <= p && p <= iv[0].hi;
  }
  return (double)hit / R;
}

static void test_coverage(void **state) {
  double cov = coverage(1, 400);
  print_message("  coverage of the 95 %% interval: %.3f\n", cov);
  assert_true(cov >= 0.91 && cov <= 0.98);
}

/* The planted fault the coverage test must catch: intervals from resamples of a quarter of
 * the images are twice too wide (coverage near 1). */
static void test_coverage_catches_wrong_width(void **state) {
  double cov = coverage(4, 200);
  print_message("  coverage with quarter-size resamples: %.3f\n", cov);
  assert_true(cov > 0.98);
}

static void test_deterministic_and_paired(void **state) {
  enum { N = 200 };
  uint8_t a[N], b[N];
  for (int i = 0; i < N; i++) a[i] = (uint8_t)(i % 3 != 0), b[i] = a[i];
  bern c = {.a = a, .b = b};
  vs_bootstrap_opts o = {.resamples = 100, .level = 0.9, .seed = 5};
  vs_interval x[2], y[2];
  assert_int_equal(vs_bootstrap(N, 2, bern_stats, &c, &o, x), VSPEC_OK);
  assert_int_equal(vs_bootstrap(N, 2, bern_stats, &c, &o, y), VSPEC_OK);
  assert_memory_equal(x, y, sizeof x);
  /* identical paired samples: the difference is exactly 0 on every resample */
  assert_true(x[1].lo == 0.0 && x[1].hi == 0.0);
  assert_true(x[0].lo < 2.0 / 3 && 2.0 / 3 < x[0].hi);
  /* bad options */
  o.resamples = 1;
  assert_int_equal(vs_bootstrap(N, 2, bern_stats, &c, &o, x), VSPEC_EINVAL);
  assert_true(isnan(x[0].lo));
}

static void test_quantile(void **state) {
  double v[5] = {5, 1, 4, 2, 3};
  assert_true(vs_quantile(v, 5, 0.0) == 1 && vs_quantile(v, 5, 1.0) == 5);
  assert_true(vs_quantile(v, 5, 0.5) == 3);
  assert_true(fabs(vs_quantile(v, 5, 0.1) - 1.4) < 1e-12); /* type 7: 1 + 0.4 (2 - 1) */
  assert_true(isnan(vs_quantile(v, 0, 0.5)));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_coverage),
      cmocka_unit_test(test_coverage_catches_wrong_width),
      cmocka_unit_test(test_deterministic_and_paired),
      cmocka_unit_test(test_quantile),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
