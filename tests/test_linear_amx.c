/* tests/test_linear_amx.c - the AMX linear kernel (kernels/cpu/cpu_linear_amx.h): the packed
 * weight layout everywhere (through a C model of TDPBF16PS), the kernel itself where this CPU
 * has AMX (skipped elsewhere). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_linear_amx.h"
#include "tests/support/kernels_testutil.h"

static float bf16_round(float v) { return vs_bf16_to_f32(vs_f32_to_bf16(v)); }

/* y = round(x) round(W)^T + bias in double: what the kernel computes, up to fp32 sums. */
static double *reference(const float *x, int m, int k, const float *w, int n, const float *bias) {
  double *ref = vt_malloc((size_t)m * n * sizeof(double));
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double s = bias ? bias[j] : 0.0;
      for (int p = 0; p < k; p++)
        s += (double)bf16_round(x[(size_t)i * k + p]) * bf16_round(w[(size_t)j * k + p]);
      ref[(size_t)i * n + j] = s;
    }
  return ref;
}

/* fp32 sums of k terms of size |x||w| <= 2 x 0.5: a few ulps of the running sum each */
static double tolerance(int k) { return 4e-7 * k + 1e-6; }

/* The documented TDPBF16PS semantics (Intel ISE reference): C[i][c] += A[i][2r] B[r][2c] +
 * A[i][2r+1] B[r][2c+1] over the tile's rows r, with B row r holding k pair (2r, 2r+1) of the
 * 16 columns. Applied block by block to the packed weights, in C, on any CPU. */
static void model_linear(const float *x, int m, int k, const uint16_t *packed, int n, float *y) {
  int kbs = (k + 31) / 32;
  for (int i = 0; i < m; i++)
    for (int col = 0; col < n; col++) {
      const uint16_t *blocks = packed + (size_t)(col / 16) * kbs * 512;
      double s = 0.0;
      for (int kb = 0; kb < kbs; kb++)
        for (int r = 0; r < 16; r++)
          for (int e = 0; e < 2; e++) {
            int p = kb * 32 + 2 * r + e;
            float a = p < k ? bf16_round(x[(size_t)i * k + p]) : 0.0f;
            s += (double)a * vs_bf16_to_f32(blocks[(size_t)kb * 512 + r * 32 + (col % 16) * 2 + e]);
          }
      y[(size_t)i * n + col] = (float)s;
    }
}

typedef struct case_ {
  int m, n, k;
  float *x, *w, *bias, *y;
  uint16_t *packed;
} case_;

static void case_init(case_ *c, int m, int n, int k, vspec_rng *rng) {
  c->m = m, c->n = n, c->k = k;
  c->x = vt_malloc((size_t)m * k * sizeof(float));
  c->w = vt_malloc((size_t)n * k * sizeof(float));
  c->bias = vt_malloc((size_t)n * sizeof(float));
  c->y = vt_malloc((size_t)m * n * sizeof(float));
  vt_fill(rng, c->x, (size_t)m * k, -2, 2);
  vt_fill(rng, c->w, (size_t)n * k, -0.5f, 0.5f);
  vt_fill(rng, c->bias, (size_t)n, -3, 3);
  size_t bytes = vs_amx_packed_bytes(n, k);
  c->packed = vt_malloc(bytes);
  memset(c->packed, 0xAB, bytes); /* padding must be written, not left over */
  vs_amx_pack(c->w, n, k, c->packed);
}

static void case_free(case_ *c) {
  free(c->x), free(c->w), free(c->bias), free(c->y), free(c->packed);
}

static const int shapes[][3] = {{1, 16, 32},  {2, 20, 40},  {3, 48, 64},  {15, 33, 100},
                                {16, 64, 96}, {17, 96, 31}, {31, 40, 65}, {32, 32, 128},
                                {33, 80, 33}, {47, 130, 256}};
#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static void test_packed_layout(void **state) {
  (void)state;
  vspec_rng rng;
  vs_rng_init(&rng, 11, 0);
  for (int s = 0; s < N_SHAPES; s++) {
    case_ c;
    case_init(&c, shapes[s][0], shapes[s][1], shapes[s][2], &rng);
    assert_true(vs_amx_packed_bytes(c.n, c.k) >= (size_t)c.n * c.k * 2);
    model_linear(c.x, c.m, c.k, c.packed, c.n, c.y);
    double *ref = reference(c.x, c.m, c.k, c.w, c.n, NULL);
    vt_assert_close(c.y, ref, (size_t)c.m * c.n, 1e-6, 1e-6, "packed layout (C model)");
    free(ref);
    case_free(&c);
  }
}

static int amx_or_skip(void) {
  if (vs_amx_available()) return 1;
  print_message("  (no AMX-BF16 on this CPU or OS: kernel tests skipped)\n");
  return 0;
}

static void test_amx_matches_reference(void **state) {
  (void)state;
  if (!amx_or_skip()) skip();
  vspec_dev *dev = vt_dev(1);
  vspec_rng rng;
  vs_rng_init(&rng, 12, 0);
  for (int s = 0; s < N_SHAPES; s++)
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      case_ c;
      case_init(&c, shapes[s][0], shapes[s][1], shapes[s][2], &rng);
      const float *bias = with_bias ? c.bias : NULL;
      vs_amx_linear(dev, c.x, c.m, c.k, c.packed, c.n, bias, c.y);
      double *ref = reference(c.x, c.m, c.k, c.w, c.n, bias);
      char what[96];
      snprintf(what, sizeof what, "amx m=%d n=%d k=%d bias=%d", c.m, c.n, c.k, with_bias);
      vt_assert_close(c.y, ref, (size_t)c.m * c.n, 0, tolerance(c.k), what);
      free(ref);
      case_free(&c);
    }
  vs_dev_destroy(dev);
}

/* The same bits with 1 or 2 threads, and for a row alone or among 40. */
static void test_amx_invariance(void **state) {
  (void)state;
  if (!amx_or_skip()) skip();
  vspec_dev *one = vt_dev(1), *two = vt_dev(2);
  vspec_rng rng;
  vs_rng_init(&rng, 13, 0);
  case_ c;
  case_init(&c, 40, 1024, 256, &rng);
  float *y2 = vt_malloc((size_t)c.m * c.n * sizeof(float));
  float *row = vt_malloc((size_t)c.n * sizeof(float));
  vs_amx_linear(one, c.x, c.m, c.k, c.packed, c.n, c.bias, c.y);
  vs_amx_linear(two, c.x, c.m, c.k, c.packed, c.n, c.bias, y2);
  assert_memory_equal(c.y, y2, (size_t)c.m * c.n * sizeof(float));
  for (int i = 0; i < c.m; i += 13) {
    vs_amx_linear(two, c.x + (size_t)i * c.k, 1, c.k, c.packed, c.n, c.bias, row);
    assert_memory_equal(row, c.y + (size_t)i * c.n, (size_t)c.n * sizeof(float));
  }
  free(y2);
  free(row);
  case_free(&c);
  vs_dev_destroy(one);
  vs_dev_destroy(two);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_packed_layout),
      cmocka_unit_test(test_amx_matches_reference),
      cmocka_unit_test(test_amx_invariance),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
