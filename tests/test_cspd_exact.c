/*
 * Exactness of continuous speculative decoding (core/mar_loop.c, plugins/accept/
 * continuous.c) on nano MARs.
 *
 * The exact rule must give the same distribution of images as the target alone under the
 * same schedule (the rule with target_only=1: every drafted token replaced by a sample of the
 * target's final-step Gaussian). Two-sample test: the 16 values of each generated grid
 * projected on 16 random directions, Kolmogorov-Smirnov per direction, Bonferroni over the
 * directions; p > 1e-3 to pass. The same test must fail for the reference code's lossy
 * settings, which shows it can fail at this sample size: tau = 42 (the inner temperature
 * dividing the Mahalanobis terms) and the reference's per-step sigma factor (prod sigma_g /
 * sigma_d over the earlier steps, inverted relative to its own final-step normaliser).
 * docs/SPECULATIVE.md derives why the exact ratio, given the shared noises, has no such
 * factor in either direction.
 *
 * The worlds are in tests/golden/cspd (2x2 tokens of 4 values, a 10-step sampler, made by
 * tools/ref/make_mar_golden.py --cspd-only); see the test functions.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine.h"
#include "core/host.h"
#include "core/models.h"
#include "core/registry.h"
#include "kernels/common/vs_philox.h"
#include "kernels/vs_kernels.h"
#include "tests/support/method_of.h"

/* The sanitizer build is several times slower; its run checks memory and that the exact rule
 * passes, the plain run also that the lossy variants fail (which needs the larger sample). */
#ifdef VSPEC_SANITIZED
#define SAMPLES 600
#define CHECK_POWER 0
#else
#define SAMPLES 10000
#define CHECK_POWER 1
#endif
#define DIM 16 /* 4 tokens x 4 values */
#define DIRECTIONS 16
#define P_MIN 1e-3

static vspec_host g_host;
static vs_registry *g_reg;
static vspec_dev *g_dev;

static vs_models *open_models(const char *dir) {
  vs_models *m = NULL;
  char err[VSPEC_ERRLEN];
  if (vs_models_open(g_reg, &g_host, g_dev, dir, VS_ROLE_ALL, &m, err, sizeof err))
    fail_msg("%s: %s", dir, err);
  return m;
}

/* n images of one class with `method`, seeds seed0 .. seed0+n-1, into out [n, DIM]; the
 * first error, if any, into err. */
static int generate_set(vs_models *m, const char *method, int n, uint64_t seed0, float *out,
                        vs_metrics *total, char *err, size_t errlen) {
  memset(total, 0, sizeof *total);
  for (int i = 0; i < n; i++) {
    vs_job job = {.method = vs_method_of(method), .class_label = 3, .seed = seed0 + (uint64_t)i,
                  .latents = out + (size_t)i * DIM, .sampling = m->defaults};
    vs_metrics mt;
    int rc = vs_generate(m, g_dev, &job, NULL, &mt, err, errlen);
    if (rc) return rc;
    vs_metrics_add(total, &mt);
  }
  return 0;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Kolmogorov's limiting distribution: P(sqrt(n) D > lambda). */
static double ks_q(double lambda) {
  if (lambda < 0.2) return 1.0;
  double s = 0.0;
  for (int k = 1; k <= 100; k++) s += (k % 2 ? 2.0 : -2.0) * exp(-2.0 * k * k * lambda * lambda);
  return s < 0 ? 0 : (s > 1 ? 1 : s);
}

/* Two-sample KS on random projections, Bonferroni over the directions. */
static double two_sample_p(const float *a, const float *b, int n) {
  vspec_rng rng;
  vs_rng_init(&rng, 20261123, 9);
  double *pa = malloc((size_t)n * sizeof(double)), *pb = malloc((size_t)n * sizeof(double));
  double w[DIM], p_min = 1.0;
  for (int r = 0; r < DIRECTIONS; r++) {
    double norm = 0;
    for (int j = 0; j < DIM; j++) {
      w[j] = vs_rng_normal(&rng);
      norm += w[j] * w[j];
    }
    for (int i = 0; i < n; i++) {
      double sa = 0, sb = 0;
      for (int j = 0; j < DIM; j++) {
        sa += w[j] * a[(size_t)i * DIM + j];
        sb += w[j] * b[(size_t)i * DIM + j];
      }
      pa[i] = sa / sqrt(norm);
      pb[i] = sb / sqrt(norm);
    }
    qsort(pa, (size_t)n, sizeof(double), cmp_double);
    qsort(pb, (size_t)n, sizeof(double), cmp_double);
    double d = 0;
    for (int i = 0, j = 0; i < n && j < n;) {
      double v = pa[i] < pb[j] ? pa[i] : pb[j];
      while (i < n && pa[i] <= v) i++;
      while (j < n && pb[j] <= v) j++;
      double gap = fabs((double)i / n - (double)j / n);
      if (gap > d) d = gap;
    }
    double ne = n / 2.0;
    double p = ks_q((sqrt(ne) + 0.12 + 0.11 / sqrt(ne)) * d);
    if (p < p_min) p_min = p;
  }
  free(pa);
  free(pb);
  double p = p_min * DIRECTIONS;
  return p > 1 ? 1 : p;
}

/* Generates SAMPLES images with the rule's parameters and returns the two-sample p-value
 * against `base`, or -1 when the method cannot produce them (its error is printed). */
static double run_variant(vs_models *m, const char *rule_params, const float *base, float *set,
                          uint64_t seed0, const char *label) {
  char method[256], err[VSPEC_ERRLEN];
  snprintf(method, sizeof method, "sd:continuous%s%s@standard:shape=chain,depth=2",
           *rule_params ? ":" : "", rule_params);
  vs_metrics mt;
  if (generate_set(m, method, SAMPLES, seed0, set, &mt, err, sizeof err)) {
    printf("  %-14s %-40s cannot sample: %s\n", label, method + 3, err);
    return -1;
  }
  double p = two_sample_p(base, set, SAMPLES);
  printf("  %-14s %-40s accepted %5.1f %% of %lld drafts, residual proposals %.2f per "
         "rejection, fallbacks %lld; p = %.3g\n", label, method + 3,
         100.0 * (double)mt.accepted / (double)(mt.drafted ? mt.drafted : 1), (long long)mt.drafted,
         (double)mt.residual_rounds / (double)(mt.drafted - mt.accepted ? mt.drafted - mt.accepted : 1),
         (long long)mt.residual_fallbacks, p);
  return p;
}

/* The lossy variants must fail the test: rejected by it, or unable even to sample (their
 * residual vanished; run_variant returns -1). The paper's direction of the sigma factor is
 * shown for the record. */
static void check_lossy(vs_models *m, const char *dir, const float *base, float *set,
                        int lenient_must_fail, int inverted_must_fail) {
  double p42 = run_variant(m, "tau=42", base, set, 3000000, "lenient");
  double pref = run_variant(m, "sigma_factor=reference", base, set, 4000000, "inverted sigma");
  run_variant(m, "sigma_factor=paper", base, set, 5000000, "paper sigma");
  if (lenient_must_fail && !(p42 < P_MIN))
    fail_msg("%s: tau = 42 passed the two-sample test (p = %.3g)", dir, p42);
  if (inverted_must_fail && !(pref < P_MIN))
    fail_msg("%s: the reference's sigma factor passed the two-sample test (p = %.3g)", dir, pref);
}

static void check_world(const char *dir, int lenient_must_fail, int inverted_must_fail) {
  vs_models *m = open_models(dir);
  float *base = malloc((size_t)SAMPLES * DIM * sizeof(float));
  float *set = malloc((size_t)SAMPLES * DIM * sizeof(float));
  vs_metrics mt;
  char err[VSPEC_ERRLEN];
  printf("%s (%d images per method):\n", dir, SAMPLES);
  if (generate_set(m, "sd:continuous:target_only=1@standard:shape=chain,depth=2", SAMPLES,
                   1000000, base, &mt, err, sizeof err))
    fail_msg("%s: the target alone: %s", dir, err);
  double p = run_variant(m, "", base, set, 2000000, "exact");
  if (!(p > P_MIN)) fail_msg("%s: exact CSpD differs from the target alone (p = %.3g)", dir, p);
  if (CHECK_POWER) check_lossy(m, dir, base, set, lenient_must_fail, inverted_must_fail);
  free(base);
  free(set);
  vs_models_close(m);
}

/* Near: the lenient tau accepts most drafts and shows; the sigma factors are near 1 (the
 * two models' variances agree), so they need not. */
static void test_near_draft(void **state) { check_world("tests/golden/cspd/near", 1, 0); }

/* Far: acceptance is rare, so the exact rule is mostly its residual; the lenient tau pulls
 * the output towards the other model. */
static void test_far_draft(void **state) { check_world("tests/golden/cspd/far", 1, 0); }

/* Coarse: a 10-step schedule, so the final-step Gaussians overlap and drafts are accepted
 * often; the draft is the target with smaller learned sigmas, so the reference's factor
 * prod sigma_g / sigma_d is large and accepts the draft's tokens wholesale. */
static void test_coarse_world(void **state) { check_world("tests/golden/cspd/coarse", 0, 1); }

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&g_host, vs_cpu_ops());
  if (vs_dev_create(vs_cpu_ops(), 1, &g_dev, err, sizeof err) ||
      vs_registry_open(dir, &g_host, &g_reg, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_near_draft),
                                     cmocka_unit_test(test_far_draft),
                                     cmocka_unit_test(test_coarse_world)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_registry_close(g_reg);
  vs_dev_destroy(g_dev);
  return rc;
}
