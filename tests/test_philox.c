/* tests/test_philox.c - Philox4x32-10 known answers and the vspec_rng stream helpers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "tests/support/kernels_testutil.h"

/* Random123 kat_vectors, philox4x32 10: counter, key -> output */
static const struct {
  uint32_t ctr[4], key[2], out[4];
} kat[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

static void test_known_answers(void **state) {
  for (size_t t = 0; t < sizeof kat / sizeof kat[0]; t++) {
    uint32_t out[4];
    vs_philox4x32_10(kat[t].ctr, kat[t].key, out);
    for (int i = 0; i < 4; i++) {
      if (out[i] != kat[t].out[i])
        fail_msg("vector %zu word %d: got %08x want %08x", t, i, out[i], kat[t].out[i]);
    }
  }
  /* out may alias ctr */
  uint32_t c[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
  vs_philox4x32_10(c, kat[2].key, c);
  assert_memory_equal(c, kat[2].out, sizeof c);
}

/* The stream is block b = philox((b_lo, b_hi, stream_lo, stream_hi), (seed_lo, seed_hi)). */
static void test_stream_layout(void **state) {
  const uint64_t seed = 0x0123456789abcdefull, stream = 0xfedcba9876543210ull;
  vspec_rng r;
  vs_rng_init(&r, seed, stream);
  uint32_t key[2] = {0x89abcdefu, 0x01234567u};
  for (uint32_t b = 0; b < 3; b++) {
    uint32_t ctr[4] = {b, 0, 0x76543210u, 0xfedcba98u}, blk[4];
    vs_philox4x32_10(ctr, key, blk);
    for (int i = 0; i < 4; i++) assert_int_equal(vs_rng_next_u32(&r), blk[i]);
  }
  /* the block counter carries into its high word */
  r.ctr[0] = 0xffffffffu;
  r.ctr[1] = 7;
  r.used = 4;
  uint32_t ctr[4] = {0xffffffffu, 7, 0x76543210u, 0xfedcba98u}, blk[4];
  vs_philox4x32_10(ctr, key, blk);
  assert_int_equal(vs_rng_next_u32(&r), blk[0]);
  assert_int_equal(r.ctr[0], 0);
  assert_int_equal(r.ctr[1], 8);
}

static void test_determinism(void **state) {
  vspec_rng a, b, c, d;
  vs_rng_init(&a, 42, 7);
  vs_rng_init(&b, 42, 7);
  vs_rng_init(&c, 42, 8);
  vs_rng_init(&d, 43, 7);
  int same_c = 0, same_d = 0;
  for (int i = 0; i < 1000; i++) {
    double x = vs_rng_normal(&a);
    assert_true(x == vs_rng_normal(&b));
    same_c += x == vs_rng_normal(&c);
    same_d += x == vs_rng_normal(&d);
  }
  assert_true(same_c < 5);
  assert_true(same_d < 5);
}

static void test_uniform(void **state) {
  vspec_rng r;
  vs_rng_init(&r, 1, 2);
  const int n = 1000000;
  double sum = 0, sum2 = 0, lo = 1, hi = 0;
  for (int i = 0; i < n; i++) {
    double u = vs_rng_uniform(&r);
    assert_true(u >= 0.0 && u < 1.0);
    double scaled = u * 9007199254740992.0; /* a multiple of 2^-53 */
    assert_true(scaled == floor(scaled));
    sum += u;
    sum2 += u * u;
    if (u < lo) lo = u;
    if (u > hi) hi = u;
  }
  double mean = sum / n, var = sum2 / n - mean * mean;
  /* standard errors: mean 2.9e-4, variance ~8.5e-5 */
  assert_true(fabs(mean - 0.5) < 0.002);
  assert_true(fabs(var - 1.0 / 12.0) < 0.001);
  assert_true(lo < 1e-5 && hi > 1.0 - 1e-5);
  /* each uniform consumes exactly two words */
  vspec_rng s;
  vs_rng_init(&s, 1, 2);
  (void)vs_rng_uniform(&s);
  assert_int_equal(s.used, 2);
}

/* vs_rng_uniform_at(seed, stream, n) is the n-th uniform of the stream, walked or not. */
static void test_uniform_at(void **state) {
  (void)state;
  vspec_rng r;
  vs_rng_init(&r, 0x123456789abcdefull, 0x40000007ull);
  for (uint64_t n = 0; n < 1000; n++) {
    double u = vs_rng_uniform(&r);
    assert_true(u == vs_rng_uniform_at(0x123456789abcdefull, 0x40000007ull, n));
  }
  /* far into a stream: the block counter's high word */
  vs_rng_init(&r, 7, 9);
  r.ctr[0] = 0;
  r.ctr[1] = 3; /* block 3 << 32: uniforms 2 * (3 << 32) onward */
  double u = vs_rng_uniform(&r);
  assert_true(u == vs_rng_uniform_at(7, 9, (uint64_t)3 << 33));
}

static void test_uniform_edges(void **state) {
  /* words that are all zero / all one give exactly 0 and the largest double below 1 */
  vspec_rng r;
  vs_rng_init(&r, 0, 0);
  r.used = 0;
  r.buf[0] = r.buf[1] = 0;
  r.buf[2] = r.buf[3] = 0xffffffffu;
  assert_true(vs_rng_uniform(&r) == 0.0);
  double top = vs_rng_uniform(&r);
  assert_true(top == 1.0 - 1.0 / 9007199254740992.0);
  /* a normal built from u1 = 0 must still be finite: the radius uses 1 - u */
  r.used = 0;
  r.buf[0] = r.buf[1] = r.buf[2] = r.buf[3] = 0;
  double z = vs_rng_normal(&r);
  assert_true(z == 0.0);
  r.used = 0;
  r.buf[0] = r.buf[1] = 0xffffffffu;
  r.buf[2] = r.buf[3] = 0;
  z = vs_rng_normal(&r);
  assert_true(isfinite(z) && z > 8.0 && z < 9.0);
}

static void test_normal(void **state) {
  vspec_rng r;
  vs_rng_init(&r, 123, 0);
  const int n = 400000;
  double sum = 0, sum2 = 0, sum4 = 0;
  int beyond2 = 0;
  for (int i = 0; i < n; i++) {
    double z = vs_rng_normal(&r);
    assert_true(isfinite(z));
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
    beyond2 += fabs(z) > 2.0;
  }
  double mean = sum / n, var = sum2 / n - mean * mean, kurt = sum4 / n;
  assert_true(fabs(mean) < 0.01);      /* se 1.6e-3 */
  assert_true(fabs(var - 1.0) < 0.01); /* se 2.2e-3 */
  assert_true(fabs(kurt - 3.0) < 0.1); /* se ~1.5e-2 */
  double frac = (double)beyond2 / n;   /* P(|Z| > 2) = 0.0455 */
  assert_true(fabs(frac - 0.0455) < 0.002);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_known_answers), cmocka_unit_test(test_stream_layout),
      cmocka_unit_test(test_determinism),   cmocka_unit_test(test_uniform),
      cmocka_unit_test(test_uniform_edges),
      cmocka_unit_test(test_uniform_at), cmocka_unit_test(test_normal),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
