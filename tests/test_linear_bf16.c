/* tests/test_linear_bf16.c - the bf16-weight linear kernel for CPUs without AMX
 * (kernels/cpu/cpu_linear_bf16.h), on every instruction set this CPU has, and the device's
 * dispatch to it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_linear_bf16.h"
#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_weights.h"
#include "tests/support/kernels_testutil.h"

static const int isas[] = {VS_ISA_SCALAR, VS_ISA_AVX2, VS_ISA_AVX512};

static vspec_dev *dev_isa(int threads, int isa) {
  vspec_dev *dev = vt_dev(threads);
  if (vs_cpu_set_isa(dev, isa) != VSPEC_OK) {
    vs_dev_destroy(dev);
    return NULL;
  }
  return dev;
}

static uint16_t *to_bf16(const float *w, size_t n) {
  uint16_t *b = vt_malloc(n * sizeof *b);
  for (size_t i = 0; i < n; i++) b[i] = vs_f32_to_bf16(w[i]);
  return b;
}

/* the kernel's layout (vs_bf16_pack) */
static uint16_t *packed(const float *w, int n, int k) {
  uint16_t *b = vt_malloc((size_t)n * k * sizeof *b);
  vs_bf16_pack(w, n, k, b);
  return b;
}

/* x round(W)^T + bias in double: only the weights are rounded */
static double *reference(const float *x, int m, int k, const uint16_t *w, int n,
                         const float *bias) {
  double *ref = vt_malloc((size_t)m * n * sizeof(double));
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double s = bias ? bias[j] : 0.0;
      for (int p = 0; p < k; p++) s += (double)x[(size_t)i * k + p] * vs_bf16_to_f32(w[(size_t)j * k + p]);
      ref[(size_t)i * n + j] = s;
    }
  return ref;
}

static void test_matches_reference(void **state) {
  static const int shapes[][3] = {{1, 4, 16}, {2, 5, 17}, {3, 9, 40},  {4, 13, 100},
                                  {5, 7, 7},  {7, 33, 64}, {9, 20, 129}};
  vspec_rng rng;
  vs_rng_init(&rng, 61, 0);
  for (int t = 0; t < 3; t++) {
    vspec_dev *dev = dev_isa(1, isas[t]);
    if (!dev) continue;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
      float *x = vt_malloc((size_t)m * k * 4), *w = vt_malloc((size_t)n * k * 4);
      float *bias = vt_malloc((size_t)n * 4), *y = vt_malloc((size_t)m * n * 4);
      vt_fill(&rng, x, (size_t)m * k, -2, 2);
      vt_fill(&rng, w, (size_t)n * k, -0.5f, 0.5f);
      vt_fill(&rng, bias, (size_t)n, -1, 1);
      uint16_t *wb = to_bf16(w, (size_t)n * k), *wp = packed(w, n, k);
      for (int with_bias = 0; with_bias < 2; with_bias++) {
        vs_bf16w_linear(dev, x, m, k, wp, n, with_bias ? bias : NULL, y);
        double *ref = reference(x, m, k, wb, n, with_bias ? bias : NULL);
        char what[80];
        snprintf(what, sizeof what, "bf16 %s m=%d n=%d k=%d", vs_isa_name(isas[t]), m, n, k);
        vt_assert_close(y, ref, (size_t)m * n, 0, 4e-7 * k + 1e-6, what);
        free(ref);
      }
      free(x), free(w), free(bias), free(y), free(wb), free(wp);
    }
    vs_dev_destroy(dev);
  }
}

/* The same bits on 1 and 2 threads, and for a row alone or among others. */
static void test_invariance(void **state) {
  enum { M = 7, N = 1100, K = 300 };
  vspec_rng rng;
  vs_rng_init(&rng, 62, 0);
  static float x[M * K], w[N * K], y1[M * N], y2[M * N], few[4 * N];
  vt_fill(&rng, x, M * K, -1, 1);
  vt_fill(&rng, w, N * K, -1, 1);
  uint16_t *wb = packed(w, N, K);
  for (int t = 0; t < 3; t++) {
    vspec_dev *one = dev_isa(1, isas[t]), *two = dev_isa(2, isas[t]);
    if (!one || !two) {
      vs_dev_destroy(one);
      vs_dev_destroy(two);
      continue;
    }
    vs_bf16w_linear(one, x, M, K, wb, N, NULL, y1);
    vs_bf16w_linear(two, x, M, K, wb, N, NULL, y2);
    assert_memory_equal(y1, y2, sizeof y1);
    /* 1 to 4 rows take the weight rows in sequence (BF16_SEQ) where they fit one block, 7 rows
     * side by side: the same bits */
    for (int rows = 1; rows <= 4; rows++)
      for (int i = 0; i + rows <= M; i += 3) {
        vs_bf16w_linear(two, x + (size_t)i * K, rows, K, wb, N, NULL, few);
        assert_memory_equal(few, y1 + (size_t)i * N, (size_t)rows * N * sizeof(float));
      }
    vs_dev_destroy(one);
    vs_dev_destroy(two);
  }
  free(wb);
}

/* Row i of an m-row product has the bits of the 1-row product of row i, for m = 1 .. 17 (every
 * block and prefetch shape of bf16_rows: rows in sequence up to 2, then 1 to 5 activation
 * blocks on AVX-512, 1 to 6 on AVX2), on every instruction set this CPU has, with k tails
 * past the 16-column chunks and an unpaired last weight row: a verify's rows reproduce decode
 * steps. */
static void test_rows_match_one_row(void **state) {
  /* the last shape's rows are longer than bf16_rows keeps a widened copy of (4096) */
  static const int shapes[][2] = {{37, 131}, {64, 64}, {9, 200}, {9, 4105}};
  enum { MAXM = 17 };
  vspec_rng rng;
  vs_rng_init(&rng, 64, 0);
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const int n = shapes[s][0], k = shapes[s][1];
    float *x = vt_malloc((size_t)MAXM * k * 4), *w = vt_malloc((size_t)n * k * 4);
    float *bias = vt_malloc((size_t)n * 4), *y = vt_malloc((size_t)MAXM * n * 4);
    float *one = vt_malloc((size_t)MAXM * n * 4);
    vt_fill(&rng, x, (size_t)MAXM * k, -2, 2);
    vt_fill(&rng, w, (size_t)n * k, -1, 1);
    vt_fill(&rng, bias, (size_t)n, -1, 1);
    uint16_t *wp = packed(w, n, k);
    for (int t = 0; t < 3; t++) {
      vspec_dev *dev = dev_isa(2, isas[t]);
      if (!dev) continue;
      for (int i = 0; i < MAXM; i++)
        vs_bf16w_linear(dev, x + (size_t)i * k, 1, k, wp, n, bias, one + (size_t)i * n);
      for (int m = 1; m <= MAXM; m++) {
        vs_bf16w_linear(dev, x, m, k, wp, n, bias, y);
        for (int e = 0; e < m * n; e++)
          if (memcmp(&y[e], &one[e], sizeof(float)) != 0)
            fail_msg("bf16 %s n=%d k=%d: row %d of %d rows, column %d: %.9g, alone %.9g",
                     vs_isa_name(isas[t]), n, k, e / n, m, e % n, y[e], one[e]);
        /* the last three weight rows alone (from an even row, a valid packed matrix): at the
         * right edge, one row at a time, where the full product had some in a 4-row block */
        const int j0 = (n - 3) & ~1, nn = n - j0;
        vs_bf16w_linear(dev, x, m, k, wp + (size_t)j0 * k, nn, bias + j0, y);
        for (int i = 0; i < m; i++)
          for (int c = 0; c < nn; c++)
            if (memcmp(&y[i * nn + c], &one[i * n + j0 + c], sizeof(float)) != 0)
              fail_msg("bf16 %s n=%d k=%d: column %d alone differs (row %d of %d)",
                       vs_isa_name(isas[t]), n, k, j0 + c, i, m);
      }
      vs_dev_destroy(dev);
    }
    free(x), free(w), free(bias), free(y), free(one), free(wp);
  }
}

/* A bf16 device without AMX: products of any row count take the bf16 rows
 * (VS_BF16_ROWS_MAX_M), so a verify multiplies by the weights a decode step uses. */
static void test_device_dispatch(void **state) {
  vs_device_options opt = {.threads = 1, .precision = VS_PRECISION_BF16};
  vspec_dev *dev = NULL;
  char err[VSPEC_ERRLEN];
  if (vs_device_open("cpu", &opt, &dev, err, sizeof err) != VSPEC_OK) skip(); /* no AVX2 */
  dev->amx = 0; /* as on a CPU without AMX */
  const vspec_ops *ops = vs_dev_ops(dev);
  enum { M = 33, N = 24, K = 48 };
  float *w = ops->alloc(dev, N * K * sizeof(float));
  float x[M * K], y[M * N], want[M * N];
  vspec_rng rng;
  vs_rng_init(&rng, 63, 0);
  vt_fill(&rng, w, N * K, -1, 1);
  vt_fill(&rng, x, M * K, -1, 1);
  const uint16_t *rows = vs_cpu_weights_bf16_rows(w, N, K);
  assert_non_null(rows);
  static const int ms[] = {1, 2, 3, 5, 12, M};
  for (size_t t = 0; t < sizeof ms / sizeof ms[0]; t++) {
    ops->linear(dev, x, ms[t], K, w, N, NULL, y);
    vs_bf16w_linear(dev, x, ms[t], K, rows, N, NULL, want);
    assert_memory_equal(y, want, (size_t)ms[t] * N * sizeof(float));
  }
  ops->free(dev, w);
  vs_dev_destroy(dev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matches_reference),
      cmocka_unit_test(test_invariance),
      cmocka_unit_test(test_rows_match_one_row),
      cmocka_unit_test(test_device_dispatch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
