/* tests/test_ops_norm.c - RMSNorm (LlamaGen gpt.py), GroupNorm (vq_model.py Normalize) and
 * LayerNorm (MAR's timm blocks and diffusion head). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/support/kernels_testutil.h"

static void ref_rmsnorm(const float *x, const float *w, int rows, int dim, double eps,
                        double *y) {
  for (int r = 0; r < rows; r++) {
    double ss = 0;
    for (int i = 0; i < dim; i++) ss += (double)x[r * dim + i] * x[r * dim + i];
    double inv = 1.0 / sqrt(ss / dim + eps);
    for (int i = 0; i < dim; i++) y[r * dim + i] = x[r * dim + i] * inv * w[i];
  }
}

static void test_rmsnorm(void **state) {
  vspec_dev *dev = vt_dev(1);
  vspec_rng rng;
  vs_rng_init(&rng, 21, 0);
  const int dims[] = {1, 8, 64, 768, 1280};
  for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
    int rows = 5, dim = dims[d];
    size_t n = (size_t)rows * dim;
    float *x = vt_malloc(n * sizeof(float)), *y = vt_malloc(n * sizeof(float));
    float *w = vt_malloc(dim * sizeof(float));
    double *ref = vt_malloc(n * sizeof(double));
    vt_fill(&rng, x, n, -3, 3);
    vt_fill(&rng, w, dim, 0.5f, 1.5f);
    for (int i = 0; i < dim; i++) x[i] *= 1e-3f; /* a row where eps matters */
    ref_rmsnorm(x, w, rows, dim, 1e-5, ref);
    vs_dev_ops(dev)->rmsnorm(dev, x, w, rows, dim, 1e-5f, y);
    vt_assert_close(y, ref, n, 1e-5, 1e-6, "rmsnorm");
    /* in place */
    vs_dev_ops(dev)->rmsnorm(dev, x, w, rows, dim, 1e-5f, x);
    assert_memory_equal(x, y, n * sizeof(float));
    free(x);
    free(y);
    free(w);
    free(ref);
  }
  /* a zero row stays zero (eps keeps the scale finite) */
  float z[4] = {0, 0, 0, 0}, w1[4] = {1, 1, 1, 1};
  vs_dev_ops(dev)->rmsnorm(dev, z, w1, 1, 4, 1e-5f, z);
  for (int i = 0; i < 4; i++) assert_true(z[i] == 0.0f);
  vs_dev_destroy(dev);
}

/* The AVX2 and AVX-512 rows give the scalar row's bits (cpu_norm.c): every length around the
 * vector widths, values from 1e-20 to 1e4 in one row (where the order of a sum shows), in
 * place and not. */
static void test_rmsnorm_isas_agree_bitwise(void **state) {
  (void)state;
  enum { ROWS = 3, MAXD = 800 };
  static float x[ROWS * MAXD], w[MAXD], want[ROWS * MAXD], y[ROWS * MAXD];
  vspec_rng rng;
  vs_rng_init(&rng, 24, 0);
  for (int i = 0; i < ROWS * MAXD; i++)
    x[i] = (float)((vs_rng_uniform(&rng) - 0.5) * pow(10.0, 24.0 * vs_rng_uniform(&rng) - 20.0));
  vt_fill(&rng, w, MAXD, -1.5f, 1.5f);
  const int dims[] = {1, 3, 7, 8, 9, 15, 16, 17, 23, 31, 33, 64, 100, 256, 768, 777};
  const int isas[] = {VS_ISA_AVX2, VS_ISA_AVX512};
  vspec_dev *ref = vt_dev(1);
  assert_int_equal(vs_cpu_set_isa(ref, VS_ISA_SCALAR), VSPEC_OK);
  int compared = 0;
  for (int t = 0; t < 2; t++) {
    vspec_dev *dev = vt_dev(1);
    if (vs_cpu_set_isa(dev, isas[t]) != VSPEC_OK) {
      vs_dev_destroy(dev);
      continue;
    }
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
      int dim = dims[d];
      size_t n = (size_t)ROWS * dim;
      vs_dev_ops(ref)->rmsnorm(ref, x, w, ROWS, dim, 1e-5f, want);
      vs_dev_ops(dev)->rmsnorm(dev, x, w, ROWS, dim, 1e-5f, y);
      for (size_t i = 0; i < n; i++)
        if (vs_f32_bits(y[i]) != vs_f32_bits(want[i]))
          fail_msg("rmsnorm %s dim %d element %zu: %.9g, scalar %.9g", vs_isa_name(isas[t]), dim,
                   i, (double)y[i], (double)want[i]);
      memcpy(y, x, n * sizeof(float));
      vs_dev_ops(dev)->rmsnorm(dev, y, w, ROWS, dim, 1e-5f, y);
      assert_memory_equal(y, want, n * sizeof(float));
      compared++;
    }
    vs_dev_destroy(dev);
  }
  vs_dev_destroy(ref);
  if (!compared) print_message("  (no AVX2 on this CPU: nothing to compare)\n");
}

static void ref_groupnorm(const float *x, int channels, int hw, int groups, double eps,
                          const float *gamma, const float *beta, double *y) {
  int cpg = channels / groups;
  for (int g = 0; g < groups; g++) {
    double mean = 0, var = 0;
    size_t cnt = (size_t)cpg * hw;
    const float *xg = x + (size_t)g * cnt;
    for (size_t i = 0; i < cnt; i++) mean += xg[i];
    mean /= cnt;
    for (size_t i = 0; i < cnt; i++) var += (xg[i] - mean) * (xg[i] - mean);
    var /= cnt; /* biased */
    for (int c = g * cpg; c < (g + 1) * cpg; c++)
      for (int i = 0; i < hw; i++) {
        double v = (x[(size_t)c * hw + i] - mean) / sqrt(var + eps);
        y[(size_t)c * hw + i] = v * (gamma ? gamma[c] : 1.0) + (beta ? beta[c] : 0.0);
      }
  }
}

static void check_groupnorm(vspec_dev *dev, int channels, int hw, int groups, float offset,
                            int affine, vspec_rng *rng) {
  size_t n = (size_t)channels * hw;
  float *x = vt_malloc(n * sizeof(float)), *y = vt_malloc(n * sizeof(float));
  float *gamma = vt_malloc(channels * sizeof(float)), *beta = vt_malloc(channels * sizeof(float));
  double *ref = vt_malloc(n * sizeof(double));
  vt_fill(rng, x, n, -2, 2);
  for (size_t i = 0; i < n; i++) x[i] += offset; /* a large mean tests the variance pass */
  /* make group statistics differ per group */
  for (int c = 0; c < channels; c++)
    for (int i = 0; i < hw; i++) x[(size_t)c * hw + i] *= 1.0f + (float)(c / (channels / groups));
  vt_fill(rng, gamma, channels, 0.5f, 2);
  vt_fill(rng, beta, channels, -1, 1);
  ref_groupnorm(x, channels, hw, groups, 1e-6, affine ? gamma : NULL, affine ? beta : NULL, ref);
  vs_dev_ops(dev)->groupnorm(dev, x, channels, hw, groups, 1e-6f, affine ? gamma : NULL,
                             affine ? beta : NULL, y);
  vt_assert_close(y, ref, n, 1e-5, 1e-6, "groupnorm");
  vs_dev_ops(dev)->groupnorm(dev, x, channels, hw, groups, 1e-6f, affine ? gamma : NULL,
                             affine ? beta : NULL, x);
  assert_memory_equal(x, y, n * sizeof(float));
  free(x);
  free(y);
  free(gamma);
  free(beta);
  free(ref);
}

static void test_groupnorm(void **state) {
  vspec_dev *dev = vt_dev(1);
  vspec_rng rng;
  vs_rng_init(&rng, 22, 0);
  check_groupnorm(dev, 64, 16, 32, 0.0f, 1, &rng);
  check_groupnorm(dev, 128, 64 * 64, 32, 0.0f, 1, &rng);
  check_groupnorm(dev, 6, 7, 3, 0.0f, 0, &rng);
  check_groupnorm(dev, 32, 100, 32, 0.0f, 1, &rng); /* one channel per group */
  check_groupnorm(dev, 64, 1024, 32, 300.0f, 1, &rng);
  vs_dev_destroy(dev);
}

/* LayerNorm (PyTorch nn.LayerNorm, MAR's eps 1e-6) with and without affine parameters, on
 * rows far from zero and a constant row (variance 0: eps keeps it finite). */
static void test_layernorm(void **state) {
  vspec_dev *dev = vt_dev(1);
  vspec_rng rng;
  vs_rng_init(&rng, 23, 0);
  const int dims[] = {1, 16, 160, 1024};
  for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
    int rows = 4, dim = dims[d];
    size_t n = (size_t)rows * dim;
    float *x = vt_malloc(n * sizeof(float)), *y = vt_malloc(n * sizeof(float));
    float *w = vt_malloc(dim * sizeof(float)), *b = vt_malloc(dim * sizeof(float));
    double *ref = vt_malloc(n * sizeof(double));
    vt_fill(&rng, x, n, -3, 3);
    for (int i = 0; i < dim; i++) x[dim + i] += 100.0f; /* a row far from zero */
    for (int i = 0; i < dim; i++) x[2 * dim + i] = 0.5f; /* a constant row */
    vt_fill(&rng, w, dim, 0.5f, 1.5f);
    vt_fill(&rng, b, dim, -1, 1);
    for (int affine = 0; affine < 2; affine++) {
      for (int r = 0; r < rows; r++) {
        double mean = 0, var = 0;
        for (int i = 0; i < dim; i++) mean += x[r * dim + i];
        mean /= dim;
        for (int i = 0; i < dim; i++) var += (x[r * dim + i] - mean) * (x[r * dim + i] - mean);
        var /= dim;
        for (int i = 0; i < dim; i++) {
          double v = (x[r * dim + i] - mean) / sqrt(var + 1e-6);
          ref[r * dim + i] = affine ? v * w[i] + b[i] : v;
        }
      }
      vs_dev_ops(dev)->layernorm(dev, x, affine ? w : NULL, affine ? b : NULL, rows, dim, 1e-6f,
                                 y);
      vt_assert_close(y, ref, n, 1e-5, 1e-5, affine ? "layernorm (affine)" : "layernorm");
    }
    memcpy(y, x, n * sizeof(float)); /* in place gives the same bits */
    vs_dev_ops(dev)->layernorm(dev, y, w, b, rows, dim, 1e-6f, y);
    float *z = vt_malloc(n * sizeof(float));
    vs_dev_ops(dev)->layernorm(dev, x, w, b, rows, dim, 1e-6f, z);
    assert_memory_equal(y, z, n * sizeof(float));
    free(x), free(y), free(z), free(w), free(b), free(ref);
  }
  vs_dev_destroy(dev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rmsnorm),
      cmocka_unit_test(test_rmsnorm_isas_agree_bitwise),
      cmocka_unit_test(test_groupnorm),
      cmocka_unit_test(test_layernorm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
