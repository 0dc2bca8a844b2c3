/* tests/test_ops_elementwise.c - silu, swiglu, gelu_tanh, add, cfg_combine. */
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

/* The SiLU/SwiGLU vector loops give vs_silu's bits in every lane, on every instruction set this
 * CPU has: random values over the whole float range, the edges of vs_exp_poly's range, zeros,
 * infinities and NaN, at every offset (the tail runs the scalar function). And the polynomial
 * against exp() in double over its range. */
static void test_silu_vector_matches_scalar(void **state) {
  enum { M = 4099 };
  static float g[M], u[M], y[M], want[M];
  vspec_rng rng;
  vs_rng_init(&rng, 33, 0);
  for (int i = 0; i < M; i++) {
    g[i] = vs_bits_f32(vs_rng_next_u32(&rng)); /* any float, NaN and inf included */
    if (i % 3 == 0) g[i] = (float)(200.0 * vs_rng_uniform(&rng) - 100.0);
    u[i] = (float)(4.0 * vs_rng_uniform(&rng) - 2.0);
  }
  const float edges[] = {88.72283935546875f, -88.72283935546875f, 88.7228393f, -88.7228470f,
                         87.33654022216797f, -87.33654022216797f, 87.3365479f, -87.3365326f,
                         0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-30f, -1e-30f, 0.5f, -0.5f};
  memcpy(g + 100, edges, sizeof edges);
  const int isas[] = {VS_ISA_SCALAR, VS_ISA_AVX2, VS_ISA_AVX512};
  for (int t = 0; t < 3; t++) {
    vspec_dev *dev = vt_dev(1);
    if (vs_cpu_set_isa(dev, isas[t]) != VSPEC_OK) {
      vs_dev_destroy(dev);
      continue;
    }
    const vspec_ops *ops = vs_dev_ops(dev);
    for (int off = 0; off < 17; off++) {
      const int n = M - off; /* 4082..4099 */
      ops->swiglu(dev, g + off, u + off, (size_t)n, y);
      for (int i = 0; i < n; i++) want[i] = vs_swiglu(g[off + i], u[off + i]);
      for (int i = 0; i < n; i++)
        if (vs_f32_bits(y[i]) != vs_f32_bits(want[i]))
          fail_msg("swiglu %s lane %d of offset %d: gate %.9g got %.9g want %.9g",
                   vs_isa_name(isas[t]), i, off, (double)g[off + i], (double)y[i], (double)want[i]);
      for (int i = 0; i < n; i++) y[i] = g[off + i];
      ops->silu(dev, y, (size_t)n);
      for (int i = 0; i < n; i++)
        if (vs_f32_bits(y[i]) != vs_f32_bits(vs_silu(g[off + i])))
          fail_msg("silu %s lane %d of offset %d: x %.9g", vs_isa_name(isas[t]), i, off,
                   (double)g[off + i]);
    }
    vs_dev_destroy(dev);
  }
  for (int i = -87000; i <= 88700; i += 7) {
    double x = i * 1e-3 + 1e-4;
    double want_e = exp((double)(float)x), got = vs_exp_poly((float)x);
    if (fabs(got - want_e) > 2.5e-7 * want_e) fail_msg("exp_poly(%.9g) = %.9g, exp %.9g", x, got, want_e);
  }
  assert_true(isinf(vs_exp_poly(89.0f)) && vs_exp_poly(-88.0f) == 0.0f && isnan(vs_exp_poly(NAN)));
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
  /* every instruction set, every length up to N: the same bits as one float add each */
  const int isas[] = {VS_ISA_SCALAR, VS_ISA_AVX2, VS_ISA_AVX512};
  for (int t = 0; t < 3; t++) {
    vspec_dev *d2 = vt_dev(1);
    if (vs_cpu_set_isa(d2, isas[t]) == VSPEC_OK)
      for (int n = 0; n <= N; n++) {
        memcpy(y, a, sizeof y);
        vs_dev_ops(d2)->add(d2, y, b, (size_t)n);
        for (int i = 0; i < N; i++)
          if (vs_f32_bits(y[i]) != vs_f32_bits(i < n ? a[i] + b[i] : a[i]))
            fail_msg("add %s length %d element %d", vs_isa_name(isas[t]), n, i);
      }
    vs_dev_destroy(d2);
  }

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
      cmocka_unit_test(test_silu_vector_matches_scalar),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
