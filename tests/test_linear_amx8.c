/* tests/test_linear_amx8.c - int8 weights on AMX tiles (kernels/cpu/cpu_linear_amx8.h): the
 * quantisation and the packed layout everywhere (a C model of TDPBSSD), the kernel itself,
 * bit for bit against that model, where this CPU has AMX-INT8 (skipped elsewhere). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_linear_amx8.h"
#include "tests/support/kernels_testutil.h"

/* The documented TDPBSSD semantics (Intel ISE reference): C[i][c] += sum over the tile's rows
 * r and e < 4 of A[i][4r + e] B[r][4c + e], signed bytes, int32 sums. Applied block by block
 * to the packed weights, then scaled as the header says: (float)acc * (sx * sw) + bias. */
static void model_linear(const float *x, int m, int k, const void *packed, int n,
                         const float *bias, float *y) {
  int kp = (k + 63) / 64 * 64, np = (n + 31) / 32 * 32, kbs = kp / 64;
  const int8_t *tiles = packed;
  const float *sw = (const float *)(tiles + (size_t)np * kp);
  int8_t *q = vt_malloc((size_t)k);
  for (int i = 0; i < m; i++) {
    float sx = vs_amx8_quantize_row(x + (size_t)i * k, k, q);
    assert_true(sx >= 0.0f);
    for (int col = 0; col < n; col++) {
      const int8_t *blocks = tiles + (size_t)(col / 16) * kbs * 1024;
      int32_t acc = 0;
      for (int kb = 0; kb < kbs; kb++)
        for (int r = 0; r < 16; r++)
          for (int e = 0; e < 4; e++) {
            int p = kb * 64 + 4 * r + e;
            int a = p < k ? q[p] : 0;
            acc += a * blocks[(size_t)kb * 1024 + r * 64 + (col % 16) * 4 + e];
          }
      float v = (float)acc * (sx * sw[col]);
      y[(size_t)i * n + col] = bias ? v + bias[col] : v;
    }
  }
  free(q);
}

static void fill_rows(vspec_rng *rng, float *x, int m, int k) {
  vt_fill(rng, x, (size_t)m * k, -2, 2);
  if (m > 1) memset(x + k, 0, (size_t)k * sizeof(float)); /* a zero row: scale 0 */
  if (m > 2) x[2 * k] = 40.0f;                           /* an outlier sets a row's scale */
}

/* Quantisation: every value within half a step of its scaled original, the largest magnitude
 * at +-127, a zero row and non-finite rows handled as documented. */
static void test_quantize_row(void **state) {
  (void)state;
  vspec_rng rng;
  vs_rng_init(&rng, 81, 0);
  float x[300];
  int8_t q[300];
  vt_fill(&rng, x, 300, -3, 3);
  x[17] = -5.0f;
  float s = vs_amx8_quantize_row(x, 300, q);
  assert_true(s == 5.0f / 127.0f);
  assert_int_equal(q[17], -127);
  for (int i = 0; i < 300; i++) assert_true(fabsf(q[i] * s - x[i]) <= 0.5f * s * 1.0001f);
  memset(x, 0, sizeof x);
  x[3] = 1e-31f;
  assert_true(vs_amx8_quantize_row(x, 300, q) == 0.0f);
  for (int i = 0; i < 300; i++) assert_int_equal(q[i], 0);
  x[5] = INFINITY;
  assert_true(vs_amx8_quantize_row(x, 300, q) < 0.0f);
  x[5] = NAN;
  assert_true(vs_amx8_quantize_row(x, 300, q) < 0.0f);
}

/* The packed layout through the C model: close to the fp32 product (int8 steps of both
 * operands), and a weight that is not finite refuses to pack. */
static void test_packed_layout(void **state) {
  (void)state;
  vspec_rng rng;
  vs_rng_init(&rng, 82, 0);
  int m = 5, n = 40, k = 100;
  float *x = vt_malloc((size_t)m * k * sizeof(float)), *w = vt_malloc((size_t)n * k * sizeof(float));
  float *y = vt_malloc((size_t)m * n * sizeof(float));
  fill_rows(&rng, x, m, k);
  vt_fill(&rng, w, (size_t)n * k, -0.5f, 0.5f);
  void *packed = vt_malloc(vs_amx8_packed_bytes(n, k));
  assert_int_equal(vs_amx8_pack(w, n, k, packed), 0);
  model_linear(x, m, k, packed, n, NULL, y);
  for (int i = 0; i < m; i++)
    for (int c = 0; c < n; c++) {
      double sx = 0, sw = 0, ref = 0, bound = 0;
      for (int p = 0; p < k; p++) {
        sx = fmax(sx, fabs(x[i * k + p]) / 127);
        sw = fmax(sw, fabs(w[c * k + p]) / 127);
      }
      /* each operand is off by at most half its step: |x| sw/2 + |w| sx/2 + sx sw/4 */
      for (int p = 0; p < k; p++) {
        ref += (double)x[i * k + p] * w[c * k + p];
        bound += fabs(x[i * k + p]) * sw / 2 + fabs(w[c * k + p]) * sx / 2 + sx * sw / 4;
      }
      if (fabs(y[i * n + c] - ref) > 1.001 * bound + 1e-6)
        fail_msg("row %d column %d: %g, fp32 %g (bound %g)", i, c, (double)y[i * n + c], ref, bound);
    }
  w[7] = NAN;
  assert_int_not_equal(vs_amx8_pack(w, n, k, packed), 0);
  free(x), free(w), free(y), free(packed);
}

static const int shapes[][3] = {{1, 16, 64},  {2, 20, 40},   {3, 48, 128}, {15, 33, 100},
                                {16, 64, 96}, {17, 96, 31},  {31, 40, 65}, {32, 32, 128},
                                {33, 80, 70}, {47, 130, 256}, {2, 1024, 128}, {3, 4096, 512}};

/* The kernel gives the model's bits, with and without a bias, and refuses a row with a NaN. */
static void test_kernel_matches_model(void **state) {
  (void)state;
  if (!vs_amx8_available()) {
    print_message("  (no AMX-INT8 on this CPU or OS: kernel test skipped)\n");
    skip();
  }
  vspec_dev *dev = vt_dev(1), *two = vt_dev(2);
  vspec_rng rng;
  vs_rng_init(&rng, 83, 0);
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    float *x = vt_malloc((size_t)m * k * sizeof(float)), *w = vt_malloc((size_t)n * k * sizeof(float));
    float *bias = vt_malloc((size_t)n * sizeof(float)), *y = vt_malloc((size_t)m * n * sizeof(float));
    float *want = vt_malloc((size_t)m * n * sizeof(float));
    fill_rows(&rng, x, m, k);
    vt_fill(&rng, w, (size_t)n * k, -0.5f, 0.5f);
    vt_fill(&rng, bias, (size_t)n, -3, 3);
    void *packed = vt_malloc(vs_amx8_packed_bytes(n, k));
    assert_int_equal(vs_amx8_pack(w, n, k, packed), 0);
    for (int b = 0; b < 2; b++) {
      const float *bb = b ? bias : NULL;
      model_linear(x, m, k, packed, n, bb, want);
      for (int t = 0; t < 2; t++) {
        memset(y, 0xCD, (size_t)m * n * sizeof(float));
        assert_int_equal(vs_amx8_linear(t ? two : dev, x, m, k, packed, n, bb, y), 0);
        for (size_t i = 0; i < (size_t)m * n; i++)
          if (vs_f32_bits(y[i]) != vs_f32_bits(want[i]))
            fail_msg("m=%d n=%d k=%d bias=%d threads=%d element %zu: %.9g, model %.9g", m, n, k,
                     b, t + 1, i, (double)y[i], (double)want[i]);
      }
    }
    x[(size_t)(m - 1) * k] = NAN; /* the caller must take the fp32 path */
    memset(y, 0, (size_t)m * n * sizeof(float));
    assert_int_not_equal(vs_amx8_linear(dev, x, m, k, packed, n, NULL, y), 0);
    for (size_t i = 0; i < (size_t)m * n; i++) assert_true(y[i] == 0.0f);
    free(x), free(w), free(bias), free(y), free(want), free(packed);
  }
  vs_dev_destroy(dev);
  vs_dev_destroy(two);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_quantize_row),
      cmocka_unit_test(test_packed_layout),
      cmocka_unit_test(test_kernel_matches_model),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
