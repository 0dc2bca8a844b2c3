/* tests/test_ops_elementwise.c - silu, swiglu, gelu_tanh, add, cfg_combine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "tests/support/kernels_testutil.h"

#define N 1031

static double ref_silu(double x) { return x / (1.0 + exp(-x)); }

static void test_activations(void **state) {
  vspec_dev *dev = vt_dev(1);
  const vspec_ops *ops = vs_dev_ops(dev);
  vspec_rng rng;
  vs_rng_init(&rng, 31, 0);
  float x[N], g[N], u[N], y[N];
  double ref[N];
  vt_fill(&rng, x, N, -12, 12);
  vt_fill(&rng, g, N, -12, 12);
  vt_fill(&rng, u, N, -3, 3);

  memcpy(y, x, sizeof y);
  ops->silu(dev, y, N);
  for (int i = 0; i < N; i++) ref[i] = ref_silu(x[i]);
  vt_assert_close(y, ref, N, 1e-6, 1e-7, "silu");

  memcpy(y, x, sizeof y);
  ops->gelu_tanh(dev, y, N);
  for (int i = 0; i < N; i++) {
    double v = x[i];
    ref[i] = 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
  }
  vt_assert_close(y, ref, N, 1e-6, 1e-7, "gelu_tanh");

  memcpy(y, x, sizeof y);
  ops->gelu(dev, y, N);
  for (int i = 0; i < N; i++) ref[i] = 0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0)));
  vt_assert_close(y, ref, N, 1e-6, 1e-7, "gelu (erf)");

  memcpy(y, x, sizeof y);
  ops->mul(dev, y, u, N);
  for (int i = 0; i < N; i++) ref[i] = (double)x[i] * u[i];
  vt_assert_close(y, ref, N, 1e-7, 0, "mul");

  for (int i = 0; i < N; i++) ref[i] = ref_silu(g[i]) * u[i];
  ops->swiglu(dev, g, u, N, y);
  vt_assert_close(y, ref, N, 1e-6, 1e-7, "swiglu");
  float g2[N], u2[N];
  memcpy(g2, g, sizeof g2);
  memcpy(u2, u, sizeof u2);
  ops->swiglu(dev, g2, u, N, g2); /* y aliases gate */
  ops->swiglu(dev, g, u2, N, u2); /* y aliases up */
  assert_memory_equal(g2, y, sizeof y);
  assert_memory_equal(u2, y, sizeof y);
  vs_dev_destroy(dev);
}

static void test_add_cfg(void **state) {
  vspec_dev *dev = vt_dev(1);
  const vspec_ops *ops = vs_dev_ops(dev);
  vspec_rng rng;
  vs_rng_init(&rng, 32, 0);
  float a[N], b[N], y[N];
  double ref[N];
  vt_fill(&rng, a, N, -5, 5);
  vt_fill(&rng, b, N, -5, 5);

  memcpy(y, a, sizeof y);
  ops->add(dev, y, b, N);
  for (int i = 0; i < N; i++) ref[i] = (double)a[i] + b[i];
  vt_assert_close(y, ref, N, 1e-7, 1e-7, "add");

  const float scales[] = {1.0f, 4.0f, 1.75f, 0.0f};
  for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
    /* LlamaGen order: [cond ; uncond], out = u + s (c - u) */
    for (int i = 0; i < N; i++) ref[i] = b[i] + (double)scales[s] * ((double)a[i] - b[i]);
    ops->cfg_combine(dev, a, b, N, scales[s], y);
    vt_assert_close(y, ref, N, 1e-6, 1e-6, "cfg_combine");
    float c[N];
    memcpy(c, a, sizeof c);
    ops->cfg_combine(dev, c, b, N, scales[s], c); /* out aliases cond */
    assert_memory_equal(c, y, sizeof y);
    memcpy(c, b, sizeof c);
    ops->cfg_combine(dev, a, c, N, scales[s], c); /* out aliases uncond */
    assert_memory_equal(c, y, sizeof y);
  }
  vs_dev_destroy(dev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_activations),
      cmocka_unit_test(test_add_cfg),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
