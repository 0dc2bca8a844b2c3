/* tests/test_math.c - kernels/common/vs_math.h: conversions and per-element formulas. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "tests/support/kernels_testutil.h"

/* binary16 decoded arithmetically, independent of the bit-assembly in vs_math.h */
static double ref_f16(uint16_t h) {
  int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexp((double)m, -24);
  else v = ldexp(1.0 + m / 1024.0, e - 15);
  return sign ? -v : v;
}

static void test_f16_all_values(void **state) {
  for (uint32_t h = 0; h < 65536; h++) {
    float got = vs_f16_to_f32((uint16_t)h);
    double want = ref_f16((uint16_t)h);
    if (isnan(want)) {
      assert_true(isnan(got));
      /* the payload survives */
      assert_int_equal(vs_f32_bits(got) & 0x7fffffu, (h & 1023u) << 13);
    } else if ((double)got != want || !signbit(got) != !signbit(want)) {
      fail_msg("f16 %04x: got %.10g want %.10g", h, (double)got, want);
    }
  }
  assert_true(vs_f16_to_f32(0x0001) == 5.9604644775390625e-8f); /* smallest subnormal */
  assert_true(vs_f16_to_f32(0x7bff) == 65504.0f);
}

static void test_bf16(void **state) {
  /* widening is exact */
  assert_true(vs_bf16_to_f32(0x3f80) == 1.0f);
  assert_true(vs_bf16_to_f32(0xc000) == -2.0f);
  assert_true(isinf(vs_bf16_to_f32(0x7f80)));
  /* round to nearest, ties to even */
  assert_int_equal(vs_f32_to_bf16(vs_bits_f32(0x3f808000u)), 0x3f80); /* tie, even down */
  assert_int_equal(vs_f32_to_bf16(vs_bits_f32(0x3f818000u)), 0x3f82); /* tie, odd up */
  assert_int_equal(vs_f32_to_bf16(vs_bits_f32(0x3f808001u)), 0x3f81); /* above half */
  assert_int_equal(vs_f32_to_bf16(vs_bits_f32(0x3f807fffu)), 0x3f80); /* below half */
  assert_int_equal(vs_f32_to_bf16(vs_bits_f32(0x7f7fffffu)), 0x7f80); /* overflow -> inf */
  assert_int_equal(vs_f32_to_bf16(-INFINITY), 0xff80);
  uint16_t qn = vs_f32_to_bf16(vs_bits_f32(0x7f800001u)); /* NaN with payload only low */
  assert_true(isnan(vs_bf16_to_f32(qn)));
  /* round trip of every bf16 value that is not NaN */
  for (uint32_t b = 0; b < 65536; b++) {
    float f = vs_bf16_to_f32((uint16_t)b);
    if (isnan(f)) continue;
    assert_int_equal(vs_f32_to_bf16(f), b);
  }
  /* against nearest-by-search on random floats */
  vspec_rng r;
  vs_rng_init(&r, 5, 5);
  for (int i = 0; i < 100000; i++) {
    uint32_t u = vs_rng_next_u32(&r);
    if (((u >> 23) & 0xffu) == 0xffu) continue; /* inf/NaN are covered above */
    float f = vs_bits_f32(u);
    uint16_t b = vs_f32_to_bf16(f);
    double lo = vs_bf16_to_f32((uint16_t)(vs_f32_bits(f) >> 16));
    double hi = vs_bf16_to_f32((uint16_t)((vs_f32_bits(f) >> 16) + 1));
    double dlo = fabs((double)f - lo), dhi = fabs((double)f - hi);
    double got = vs_bf16_to_f32(b);
    double want = dlo < dhi ? lo : hi;
    if (dlo == dhi) want = ((vs_f32_bits(f) >> 16) & 1) ? hi : lo;
    if (got != want) fail_msg("bf16 of %.9g: got %.9g want %.9g", (double)f, got, want);
  }
}

static void test_activations(void **state) {
  for (int i = -2000; i <= 2000; i++) {
    double x = i * 0.01;
    double silu = x / (1.0 + exp(-x));
    double gelu = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    assert_true(fabs(vs_silu((float)x) - silu) <= 2e-6 * fabs(silu) + 1e-7);
    assert_true(fabs(vs_gelu_tanh((float)x) - gelu) <= 2e-6 * fabs(gelu) + 1e-7);
  }
  assert_true(vs_silu(-200.0f) == 0.0f);
  assert_true(vs_silu(200.0f) == 200.0f);
  assert_true(vs_gelu_tanh(-20.0f) == 0.0f);
}

static void test_rope_theta(void **state) {
  const int dims[] = {16, 64, 100, 128};
  for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
    for (int k = 0; k < dims[d] / 4; k++) {
      double want = pow(10000.0, -4.0 * k / dims[d]);
      float got = vs_rope_theta(k, dims[d], 10000.0f);
      if (fabs(got - want) > 4e-7 * want)
        fail_msg("hd %d k %d: %.9g vs %.9g", dims[d], k, (double)got, want);
    }
  }
  assert_true(vs_rope_theta(0, 64, 10000.0f) == 1.0f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_f16_all_values),
      cmocka_unit_test(test_bf16),
      cmocka_unit_test(test_activations),
      cmocka_unit_test(test_rope_theta),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
