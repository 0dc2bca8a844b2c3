/* tests/test_fid_intervals.c - the bootstrap interval kinds of bench/bootstrap.h on FID, whose
 * resamples are biased (repeated images count as distinct), with synthetic features of a
 * known distribution: the percentile interval misses the estimate and the expectation it
 * estimates, the normal and shifted intervals contain the estimate always and cover the
 * expectation near their level, and a ratio of two FIDs of one distribution covers 1.
 * Seconds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bootstrap.h"
#include "bench/quality.h"
#include "kernels/common/vs_philox.h"
#include "vspec/types.h"

enum { N = 100, D = 16, B = 150 };

/* Generated features: N(0, s^2 I) with s = 1.2 against a reference N(0, I): FID's
 * population value is D (s - 1)^2 = 0.64, and at N = 100 images its estimate sits well
 * above (about 1.7), as eval's does at 300 images in 128 dimensions. */
static const double SCALE = 1.2;

static double ref_mu[D], ref_cov[D * D];

static void sample(vspec_rng *rng, float *x, int n) {
  for (int i = 0; i < n * D; i++) x[i] = (float)(SCALE * vs_rng_normal(rng));
}

static double fid_of(const float *x, int n) {
  double mu[D], cov[D * D], fid;
  char err[128];
  assert_int_equal(vs_feature_stats(x, n, D, mu, cov, err, sizeof err), VSPEC_OK);
  assert_int_equal(vs_fid(mu, cov, ref_mu, ref_cov, D, &fid, err, sizeof err), VSPEC_OK);
  return fid;
}

/* Statistics of a resample: FID of a, and FID(a) / FID(b) for a second sample b paired by
 * index (as eval pairs a method with AR). */
typedef struct fid_ctx {
  const float *a, *b;
  float buf[N * D];
} fid_ctx;

static double fid_idx(fid_ctx *c, const float *x, const int *idx, int n) {
  for (int i = 0; i < n; i++) memcpy(c->buf + i * D, x + idx[i] * D, sizeof(float) * D);
  return fid_of(c->buf, n);
}

static int fid_stats(void *ctx, const int *idx, int n, double *out) {
  fid_ctx *c = ctx;
  out[0] = fid_idx(c, c->a, idx, n);
  out[1] = out[0] / fid_idx(c, c->b, idx, n);
  return VSPEC_OK;
}

static void setup_ref(void) {
  memset(ref_mu, 0, sizeof ref_mu);
  memset(ref_cov, 0, sizeof ref_cov);
  for (int k = 0; k < D; k++) ref_cov[k * D + k] = 1;
}

static int inside(vs_interval v, double x) { return v.lo <= x && x <= v.hi; }

static void test_kinds_on_fid(void **state) {
  (void)state;
  enum { R = 50, MC = 1000 };
  setup_ref();
  static float a[N * D], b[N * D];
  vspec_rng rng;
  vs_rng_init(&rng, 3, 0);
  /* E[FID at N images], the value the estimate estimates, by Monte Carlo */
  double expect = 0;
  for (int i = 0; i < MC; i++) {
    sample(&rng, a, N);
    expect += fid_of(a, N) / MC;
  }
  int cover[VS_CI_KINDS] = {0}, has_est[VS_CI_KINDS] = {0}, ratio_cover[VS_CI_KINDS] = {0};
  for (int rep = 0; rep < R; rep++) {
    sample(&rng, a, N);
    sample(&rng, b, N);
    fid_ctx c = {.a = a, .b = b};
    vs_bootstrap_opts o = {.resamples = B, .level = 0.95, .seed = 100 + (uint64_t)rep};
    vs_interval iv[2 * VS_CI_KINDS];
    assert_int_equal(vs_bootstrap_intervals(N, 2, fid_stats, &c, &o, iv), VSPEC_OK);
    double est = fid_of(a, N);
    for (int k = 0; k < VS_CI_KINDS; k++) {
      cover[k] += inside(iv[k], expect);
      has_est[k] += inside(iv[k], est);
      ratio_cover[k] += inside(iv[VS_CI_KINDS + k], 1.0);
    }
  }
  print_message("E[FID at %d] = %.3f (population 0.64); of %d intervals:\n", N, expect, R);
  for (int k = 0; k < VS_CI_KINDS; k++)
    print_message("  %-10s cover E %2d, contain the estimate %2d, FID ratio covers 1 %2d\n",
                  vs_ci_kind_name(k), cover[k], has_est[k], ratio_cover[k]);
  /* the biased percentile interval: above the estimate and its expectation */
  assert_true(has_est[VS_CI_PERCENTILE] < 0.5 * R);
  assert_true(cover[VS_CI_PERCENTILE] < 0.7 * R);
  /* the corrected ones: the estimate always, the expectation near 95 % */
  assert_int_equal(has_est[VS_CI_NORMAL], R);
  assert_int_equal(has_est[VS_CI_SHIFTED], R);
  assert_true(cover[VS_CI_NORMAL] >= 0.85 * R);
  assert_true(cover[VS_CI_SHIFTED] >= 0.85 * R);
  assert_true(ratio_cover[VS_CI_NORMAL] >= 0.85 * R);
}

/* Known answers of the pieces: the normal quantile, and BCa on a symmetric unbiased
 * statistic (a mean) agreeing with the percentile interval. */
typedef struct mean_ctx {
  const double *v;
} mean_ctx;

static int mean_stat(void *ctx, const int *idx, int n, double *out) {
  const mean_ctx *c = ctx;
  double s = 0;
  for (int i = 0; i < n; i++) s += c->v[idx[i]];
  out[0] = s / n;
  return VSPEC_OK;
}

static void test_pieces(void **state) {
  (void)state;
  assert_true(fabs(vs_normal_quantile(0.975) - 1.959963984540054) < 1e-9);
  assert_true(fabs(vs_normal_cdf(1.959963984540054) - 0.975) < 1e-12);
  assert_true(fabs(vs_normal_quantile(0.5)) < 1e-12);
  enum { M = 400 };
  double v[M];
  vspec_rng rng;
  vs_rng_init(&rng, 9, 0);
  for (int i = 0; i < M; i++) v[i] = vs_rng_normal(&rng);
  mean_ctx c = {v};
  vs_bootstrap_opts o = {.resamples = 1000, .level = 0.95, .seed = 1};
  vs_interval iv[VS_CI_KINDS];
  assert_int_equal(vs_bootstrap_intervals(M, 1, mean_stat, &c, &o, iv), VSPEC_OK);
  double half = 1.96 / sqrt(M); /* the textbook interval's half width */
  for (int k = 0; k < VS_CI_KINDS; k++) {
    print_message("  %-10s [%.4f, %.4f]\n", vs_ci_kind_name(k), iv[k].lo, iv[k].hi);
    assert_true(fabs((iv[k].hi - iv[k].lo) / 2 - half) < 0.2 * half);
  }
  assert_true(fabs(iv[VS_CI_BCA].lo - iv[VS_CI_PERCENTILE].lo) < 0.2 * half);
  assert_string_equal(vs_ci_kind_name(VS_CI_BASIC), "basic");
  /* bad options: every interval NAN */
  o.resamples = 1;
  assert_int_equal(vs_bootstrap_intervals(M, 1, mean_stat, &c, &o, iv), VSPEC_EINVAL);
  assert_true(isnan(iv[VS_CI_NORMAL].lo));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pieces),
      cmocka_unit_test(test_kinds_on_fid),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
