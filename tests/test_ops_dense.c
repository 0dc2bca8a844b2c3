/* tests/test_ops_dense.c - gemm (all transposes, strides, alpha/beta) and linear. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "tests/support/kernels_testutil.h"

/* element (i, j) of op(X) where X is row-major with leading dimension ld */
static double at(const float *x, int ld, int trans, int i, int j) {
  return trans ? x[(size_t)j * ld + i] : x[(size_t)i * ld + j];
}

static void check_gemm(vspec_dev *dev, int ta, int tb, int m, int n, int k, float alpha,
                       float beta, vspec_rng *rng) {
  const vspec_ops *ops = vs_dev_ops(dev);
  /* stored shapes, padded leading dimensions so that ld != logical width is exercised */
  int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
  int lda = ac + 3, ldb = bc + 1, ldc = n + 2;
  float *a = vt_malloc((size_t)ar * lda * sizeof(float));
  float *b = vt_malloc((size_t)br * ldb * sizeof(float));
  float *c = vt_malloc((size_t)m * ldc * sizeof(float));
  double *ref = vt_malloc((size_t)m * n * sizeof(double));
  float *got = vt_malloc((size_t)m * n * sizeof(float));
  vt_fill(rng, a, (size_t)ar * lda, -1, 1);
  vt_fill(rng, b, (size_t)br * ldb, -1, 1);
  vt_fill(rng, c, (size_t)m * ldc, -1, 1);
  for (int i = 0; i < m; i++) {
    for (int j = 0; j < n; j++) {
      double s = 0;
      for (int p = 0; p < k; p++) s += at(a, lda, ta, i, p) * at(b, ldb, tb, p, j);
      ref[(size_t)i * n + j] = alpha * s + beta * (double)c[(size_t)i * ldc + j];
    }
  }
  float pad_before = c[n]; /* the padding of row 0 must stay untouched */
  ops->gemm(dev, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  assert_true(c[n] == pad_before);
  for (int i = 0; i < m; i++) memcpy(got + (size_t)i * n, c + (size_t)i * ldc, n * sizeof(float));
  char what[64];
  snprintf(what, sizeof what, "gemm ta=%d tb=%d %dx%dx%d", ta, tb, m, n, k);
  vt_assert_close_scaled(got, ref, (size_t)m * n, 1e-5, what);
  free(a);
  free(b);
  free(c);
  free(ref);
  free(got);
}

static void test_gemm_transposes(void **state) {
  vspec_dev *dev = vt_dev(1);
  vspec_rng rng;
  vs_rng_init(&rng, 11, 0);
  for (int ta = 0; ta < 2; ta++) {
    for (int tb = 0; tb < 2; tb++) {
      check_gemm(dev, ta, tb, 1, 1, 1, 1.0f, 0.0f, &rng);
      check_gemm(dev, ta, tb, 7, 5, 3, 1.0f, 0.0f, &rng);
      check_gemm(dev, ta, tb, 33, 17, 65, 0.5f, 1.0f, &rng);
      check_gemm(dev, ta, tb, 2, 129, 300, -1.5f, 0.25f, &rng);
      check_gemm(dev, ta, tb, 64, 1, 31, 1.0f, -1.0f, &rng);
    }
  }
  vs_dev_destroy(dev);
}

/* beta = 0 must ignore whatever C held (including NaN), as BLAS specifies */
static void test_gemm_beta_zero(void **state) {
  vspec_dev *dev = vt_dev(1);
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1};
  float c[4] = {NAN, NAN, NAN, NAN};
  vs_dev_ops(dev)->gemm(dev, 0, 0, 2, 2, 3, 1.0f, a, 3, b, 2, 0.0f, c, 2);
  /* [1 2 3; 4 5 6] [1 0; 0 1; 1 1] = [4 5; 10 11] */
  assert_true(c[0] == 4 && c[1] == 5 && c[2] == 10 && c[3] == 11);
  vs_dev_destroy(dev);
}

static void check_linear(vspec_dev *dev, int m, int n_in, int n_out, int with_bias,
                         vspec_rng *rng) {
  float *x = vt_malloc((size_t)m * n_in * sizeof(float));
  float *w = vt_malloc((size_t)n_out * n_in * sizeof(float));
  float *bias = vt_malloc((size_t)n_out * sizeof(float));
  float *y = vt_malloc((size_t)m * n_out * sizeof(float));
  double *ref = vt_malloc((size_t)m * n_out * sizeof(double));
  vt_fill(rng, x, (size_t)m * n_in, -2, 2);
  vt_fill(rng, w, (size_t)n_out * n_in, -0.5f, 0.5f);
  vt_fill(rng, bias, n_out, -3, 3);
  for (size_t i = 0; i < (size_t)m * n_out; i++) y[i] = NAN; /* y is output only */
  for (int i = 0; i < m; i++) {
    for (int o = 0; o < n_out; o++) {
      double s = with_bias ? bias[o] : 0.0;
      for (int p = 0; p < n_in; p++) s += (double)x[(size_t)i * n_in + p] * w[(size_t)o * n_in + p];
      ref[(size_t)i * n_out + o] = s;
    }
  }
  vs_dev_ops(dev)->linear(dev, x, m, n_in, w, n_out, with_bias ? bias : NULL, y);
  vt_assert_close_scaled(y, ref, (size_t)m * n_out, 1e-5, with_bias ? "linear+bias" : "linear");
  free(x);
  free(w);
  free(bias);
  free(y);
  free(ref);
}

static void test_linear(void **state) {
  vspec_dev *dev = vt_dev(1);
  vspec_rng rng;
  vs_rng_init(&rng, 12, 0);
  for (int wb = 0; wb < 2; wb++) {
    check_linear(dev, 1, 64, 48, wb, &rng);
    check_linear(dev, 2, 96, 300, wb, &rng);
    check_linear(dev, 37, 130, 70, wb, &rng);
    check_linear(dev, 3, 0, 5, wb, &rng); /* empty product: bias (or zeros) */
  }
  vs_dev_destroy(dev);
}

/* BLIS splits m/n, never k: results must not depend on the thread count. Shapes: a
 * square-ish prefill product and a skinny decode product (BLIS's small-matrix path). */
static void check_invariance(int m, int n, int k, uint64_t seed) {
  vspec_rng rng;
  vs_rng_init(&rng, seed, 0);
  float *a = vt_malloc((size_t)m * k * sizeof(float));
  float *b = vt_malloc((size_t)n * k * sizeof(float));
  float *c1 = vt_malloc((size_t)m * n * sizeof(float));
  float *c2 = vt_malloc((size_t)m * n * sizeof(float));
  vt_fill(&rng, a, (size_t)m * k, -1, 1);
  vt_fill(&rng, b, (size_t)n * k, -1, 1);
  vspec_dev *d1 = vt_dev(1), *d2 = vt_dev(2);
  vs_dev_ops(d1)->linear(d1, a, m, k, b, n, NULL, c1);
  vs_dev_ops(d2)->linear(d2, a, m, k, b, n, NULL, c2);
  assert_memory_equal(c1, c2, (size_t)m * n * sizeof(float));
  vs_dev_destroy(d1);
  vs_dev_destroy(d2);
  free(a);
  free(b);
  free(c1);
  free(c2);
}

/* The same through gemm with every transpose: products large enough to be split over the
 * pool by rows (m >= n) or by columns, whose blocks must add up to the same bits. */
static void check_gemm_invariance(int m, int n, int k, uint64_t seed) {
  vspec_rng rng;
  vs_rng_init(&rng, seed, 0);
  size_t na = (size_t)m * k, nb = (size_t)n * k;
  float *a = vt_malloc(na * sizeof(float)), *b = vt_malloc(nb * sizeof(float));
  float *c1 = vt_malloc((size_t)m * n * sizeof(float)), *c2 = vt_malloc((size_t)m * n * sizeof(float));
  vt_fill(&rng, a, na, -1, 1);
  vt_fill(&rng, b, nb, -1, 1);
  vspec_dev *d1 = vt_dev(1), *d2 = vt_dev(2);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int lda = ta ? m : k, ldb = tb ? k : n;
      vt_fill(&rng, c1, (size_t)m * n, -1, 1);
      memcpy(c2, c1, (size_t)m * n * sizeof(float));
      vs_dev_ops(d1)->gemm(d1, ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 1.0f, c1, n);
      vs_dev_ops(d2)->gemm(d2, ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 1.0f, c2, n);
      assert_memory_equal(c1, c2, (size_t)m * n * sizeof(float));
    }
  vs_dev_destroy(d1);
  vs_dev_destroy(d2);
  free(a);
  free(b);
  free(c1);
  free(c2);
}

static void test_thread_count_invariance(void **state) {
  check_invariance(300, 260, 700, 13);
  check_invariance(2, 4096, 768, 14);
  check_invariance(64, 2048, 96, 15);
  check_gemm_invariance(333, 150, 200, 16); /* by rows, a short last block */
  check_gemm_invariance(40, 1000, 120, 17); /* by columns */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm_transposes),
      cmocka_unit_test(test_gemm_beta_zero),
      cmocka_unit_test(test_linear),
      cmocka_unit_test(test_thread_count_invariance),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
