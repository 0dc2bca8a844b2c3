/* tests/test_kid.c - KID (bench/kid.h, arXiv 1801.01401) on synthetic features whose answer
 * is known: the unbiased MMD^2 of a brute-force sum, its jackknife, mean 0 and intervals
 * that cover 0 for two samples of one Gaussian, coverage of a difference, and a shifted
 * Gaussian told apart. Seconds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/kid.h"
#include "kernels/common/vs_philox.h"
#include "vspec/types.h"

static void gaussian(vspec_rng *rng, float *x, int n, int d, double shift) {
  for (int i = 0; i < n * d; i++) x[i] = (float)(vs_rng_normal(rng) + shift);
}

static double k3(const float *a, const float *b, int d) {
  double s = 0;
  for (int k = 0; k < d; k++) s += (double)a[k] * b[k];
  return pow(s / d + 1, 3);
}

/* The unbiased MMD^2 of x [nx, d] (rows with keep[i] != 0) against y [ny, d], by the
 * definition. */
static double mmd2_brute(const float *x, const int *keep, int nx, const float *y, int ny,
                         int d) {
  double xx = 0, yy = 0, xy = 0;
  int m = 0;
  for (int i = 0; i < nx; i++) {
    if (!keep[i]) continue;
    m++;
    for (int j = 0; j < nx; j++)
      if (j != i && keep[j]) xx += k3(x + i * d, x + j * d, d);
    for (int j = 0; j < ny; j++) xy += k3(x + i * d, y + j * d, d);
  }
  for (int i = 0; i < ny; i++)
    for (int j = 0; j < ny; j++)
      if (i != j) yy += k3(y + i * d, y + j * d, d);
  return xx / ((double)m * (m - 1)) + yy / ((double)ny * (ny - 1)) - 2 * xy / ((double)m * ny);
}

/* One subset of all images: KID is MMD^2_u itself, and jack[g] the same without group g
 * (images g * n / G .. (g + 1) * n / G - 1). */
static void test_known_answer(void **state) {
  (void)state;
  enum { N = 60, D = 6 };
  float x[N * D], y[N * D];
  vspec_rng rng;
  vs_rng_init(&rng, 7, 0);
  gaussian(&rng, x, N, D, 0.3);
  gaussian(&rng, y, N, D, 0.0);
  vs_kid_ref *r;
  char err[256];
  vs_kid_opts o = {.subsets = 1, .subset_size = N, .seed = 1};
  assert_int_equal(vs_kid_ref_open(y, N, D, &o, &r, err, sizeof err), VSPEC_OK);
  vs_kid kid;
  assert_int_equal(vs_kid_compute(r, x, N, &kid, err, sizeof err), VSPEC_OK);
  int keep[N];
  for (int i = 0; i < N; i++) keep[i] = 1;
  double want = mmd2_brute(x, keep, N, y, N, D);
  assert_true(fabs(kid.kid - want) < 1e-5 * (1 + fabs(want)));
  for (int g = 0; g < VS_KID_GROUPS; g += 7) {
    for (int i = 0; i < N; i++) keep[i] = i * VS_KID_GROUPS / N != g;
    double wg = mmd2_brute(x, keep, N, y, N, D);
    assert_true(fabs(kid.jack[g] - wg) < 1e-5 * (1 + fabs(wg)));
  }
  assert_true(kid.se > 0);
  /* too few images for the jackknife's groups: refused */
  assert_int_equal(vs_kid_compute(r, x, 2 * VS_KID_GROUPS - 1, &kid, err, sizeof err),
                   VSPEC_EINVAL);
  vs_kid_ref_close(r);
}

/* R repetitions: generated x (n) and real y (n_ref) of N(shift_x) and N(0); returns the mean
 * KID and how many of the R intervals kid -/+ 1.96 se contain 0. */
static double repeat(double shift, int R, int *covered, double *mean_se) {
  enum { N = 100, NREF = 400, D = 8 };
  static float x[N * D], y[NREF * D];
  vspec_rng rng;
  vs_rng_init(&rng, 11, 0);
  double sum = 0, se = 0;
  *covered = 0;
  for (int rep = 0; rep < R; rep++) {
    gaussian(&rng, x, N, D, shift);
    gaussian(&rng, y, NREF, D, 0);
    vs_kid_ref *r;
    char err[256];
    vs_kid_opts o = {.subsets = 20, .subset_size = 1000, .seed = (uint64_t)rep};
    assert_int_equal(vs_kid_ref_open(y, NREF, D, &o, &r, err, sizeof err), VSPEC_OK);
    vs_kid kid;
    assert_int_equal(vs_kid_compute(r, x, N, &kid, err, sizeof err), VSPEC_OK);
    assert_int_equal(kid.m, N); /* min(subset size, n, n_ref) */
    sum += kid.kid;
    se += kid.se;
    *covered += fabs(kid.kid) <= 1.96 * kid.se;
    vs_kid_ref_close(r);
  }
  *mean_se = se / R;
  return sum / R;
}

/* Two samples of one Gaussian: MMD^2 = 0, which an unbiased estimator's mean matches (FID's
 * would sit above 0) and most intervals cover. A shifted Gaussian: KID well above 0, and its
 * intervals exclude 0. */
static void test_same_and_shifted(void **state) {
  (void)state;
  enum { R = 60 };
  int covered;
  double se, mean = repeat(0.0, R, &covered, &se);
  print_message("same Gaussian: mean KID %.3g (se of one %.3g), %d/%d intervals cover 0\n",
                mean, se, covered, R);
  assert_true(fabs(mean) < 3 * se / sqrt(R) + 1e-12);
  assert_true(covered >= 0.85 * R);
  double mean_shift = repeat(0.5, R, &covered, &se);
  print_message("shifted by 0.5: mean KID %.3g (se %.3g), %d/%d cover 0\n", mean_shift, se,
                covered, R);
  assert_true(mean_shift > 5 * se);
  assert_true(covered <= 0.1 * R);
}

/* Two independent generated sets of the same distribution (not the reference's: the
 * non-degenerate case eval's AR-vs-AR comparison is) against one reference: the difference
 * of their KIDs is 0 in expectation, and its interval covers 0 in about 95 % of the
 * repetitions. A difference with the jackknife left out (subset noise only) would not. */
static void test_difference_coverage(void **state) {
  (void)state;
  enum { N = 120, NREF = 400, D = 8, R = 80 };
  static float a[N * D], b[N * D], y[NREF * D];
  vspec_rng rng;
  vs_rng_init(&rng, 23, 0);
  gaussian(&rng, y, NREF, D, 0);
  vs_kid_ref *r;
  char err[256];
  vs_kid_opts o = {.subsets = 20, .seed = 5};
  assert_int_equal(vs_kid_ref_open(y, NREF, D, &o, &r, err, sizeof err), VSPEC_OK);
  int covered = 0, covered_subsets_only = 0;
  for (int rep = 0; rep < R; rep++) {
    gaussian(&rng, a, N, D, 0.3);
    gaussian(&rng, b, N, D, 0.3);
    vs_kid ka, kb;
    assert_int_equal(vs_kid_compute(r, a, N, &ka, err, sizeof err), VSPEC_OK);
    assert_int_equal(vs_kid_compute(r, b, N, &kb, err, sizeof err), VSPEC_OK);
    double diff = ka.kid - kb.kid, se = vs_kid_diff_se(&ka, &kb);
    covered += fabs(diff) <= 1.96 * se;
    /* the subsets' spread alone: with m = n every subset has all generated images */
    double s2 = 0, mean = 0;
    for (int s = 0; s < ka.subsets; s++) mean += (ka.sub[s] - kb.sub[s]) / ka.subsets;
    for (int s = 0; s < ka.subsets; s++)
      s2 += pow(ka.sub[s] - kb.sub[s] - mean, 2) / (ka.subsets - 1);
    covered_subsets_only += fabs(diff) <= 1.96 * sqrt(s2 / ka.subsets);
  }
  print_message("KID difference: %d/%d cover 0 (subset spread alone: %d/%d)\n", covered, R,
                covered_subsets_only, R);
  assert_true(covered >= 0.85 * R);
  assert_true(covered_subsets_only < 0.5 * R);
  vs_kid_ref_close(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_answer),
      cmocka_unit_test(test_same_and_shifted),
      cmocka_unit_test(test_difference_coverage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
