/* tests/test_ops_rope.c - LlamaGen 2-D RoPE table and application (gpt.py,
 * precompute_freqs_cis_2d and apply_rotary_emb). */
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

/* precompute_freqs_cis_2d written out directly in double: theta_k = base^(-4k/hd), the first
 * hd/4 pairs rotate by the row, the next hd/4 by the column, condition rows are (0, 0) */
static void ref_table(int n_cond, int grid, int hd, double base, double *t) {
  int half = hd / 2, quarter = hd / 4;
  for (int p = 0; p < n_cond + grid * grid; p++) {
    for (int j = 0; j < half; j++) {
      double angle = 0, c = 0, s = 0;
      if (p >= n_cond) {
        int i = p - n_cond, r = i / grid, col = i % grid;
        if (j < quarter) angle = r * pow(base, -4.0 * j / hd);
        else angle = col * pow(base, -4.0 * (j - quarter) / hd);
        c = cos(angle);
        s = sin(angle);
      }
      t[((size_t)p * half + j) * 2] = c;
      t[((size_t)p * half + j) * 2 + 1] = s;
    }
  }
}

static void test_table_layout(void **state) {
  /* a small worked example: hd 16, G 3, one condition token */
  const int hd = 16, grid = 3, n_cond = 1, half = 8;
  float t[(1 + 9) * 8 * 2];
  vs_cpu_ops()->rope2d_table(n_cond, grid, hd, 10000.0f, t);
  for (int j = 0; j < 2 * half; j++) assert_true(t[j] == 0.0f); /* condition row: (0, 0) */
  /* position 2 = token 1 = (row 0, col 1): only pairs 4..7 rotate, by col * theta_(j-4) */
  const float *p2 = t + 2 * half * 2;
  for (int j = 0; j < 4; j++) assert_true(p2[2 * j] == 1.0f && p2[2 * j + 1] == 0.0f);
  for (int j = 4; j < 8; j++) {
    double th = pow(10000.0, -4.0 * (j - 4) / hd);
    assert_true(fabs(p2[2 * j] - cos(th)) < 1e-6 && fabs(p2[2 * j + 1] - sin(th)) < 1e-6);
    assert_true(p2[2 * j + 1] != 0.0f);
  }
  /* position 4 = token 3 = (row 1, col 0): only pairs 0..3 rotate */
  const float *p4 = t + 4 * half * 2;
  for (int j = 4; j < 8; j++) assert_true(p4[2 * j] == 1.0f && p4[2 * j + 1] == 0.0f);
  for (int j = 0; j < 4; j++) assert_true(p4[2 * j + 1] != 0.0f);
  /* pair 0 of position 4 rotates by exactly 1 rad (theta_0 = 1) */
  assert_true(fabs(p4[0] - cos(1.0)) < 1e-7 && fabs(p4[1] - sin(1.0)) < 1e-7);
  /* the origin token (row 0, col 0) is the identity */
  const float *p1 = t + 1 * half * 2;
  for (int j = 0; j < 8; j++) assert_true(p1[2 * j] == 1.0f && p1[2 * j + 1] == 0.0f);
}

static void check_table(int n_cond, int grid, int hd, float base) {
  size_t rows = (size_t)n_cond + (size_t)grid * grid, n = rows * hd;
  float *t = vt_malloc(n * sizeof(float));
  double *ref = vt_malloc(n * sizeof(double));
  vs_cpu_ops()->rope2d_table(n_cond, grid, hd, base, t);
  ref_table(n_cond, grid, hd, base, ref);
  /* the reference builds theta in float32; angles up to ~grid rad carry that rounding */
  vt_assert_close(t, ref, n, 0.0, 4e-6, "rope2d_table");
  free(t);
  free(ref);
}

static void test_table_values(void **state) {
  check_table(1, 16, 64, 10000.0f);
  check_table(120, 24, 64, 10000.0f);
  check_table(1, 16, 16, 10000.0f);
  check_table(3, 8, 100, 10000.0f);
  check_table(0, 5, 100, 500.0f);
}

static void check_apply(int n_cond, int grid, int hd, int n_heads) {
  vspec_dev *dev = vt_dev(1);
  vspec_rng rng;
  vs_rng_init(&rng, 41, (uint64_t)hd);
  int half = hd / 2, n_pos = n_cond + grid * grid;
  float *t = vt_malloc((size_t)n_pos * hd * sizeof(float));
  double *rt = vt_malloc((size_t)n_pos * hd * sizeof(double));
  vs_cpu_ops()->rope2d_table(n_cond, grid, hd, 10000.0f, t);
  ref_table(n_cond, grid, hd, 10000.0, rt);

  const int rows = 9, stride = n_heads * hd + 5; /* padded rows */
  int32_t pos[9];
  for (int r = 0; r < rows; r++) pos[r] = (int32_t)((r * 7 + 3) % n_pos);
  pos[0] = 0; /* a condition token */
  float *x = vt_malloc((size_t)rows * stride * sizeof(float));
  vt_fill(&rng, x, (size_t)rows * stride, -2, 2);
  float *orig = vt_malloc((size_t)rows * stride * sizeof(float));
  memcpy(orig, x, (size_t)rows * stride * sizeof(float));
  double *ref = vt_malloc((size_t)rows * n_heads * hd * sizeof(double));
  float *got = vt_malloc((size_t)rows * n_heads * hd * sizeof(float));
  for (int r = 0; r < rows; r++) {
    for (int h = 0; h < n_heads; h++) {
      const float *xh = orig + (size_t)r * stride + h * hd;
      double *o = ref + ((size_t)r * n_heads + h) * hd;
      for (int j = 0; j < half; j++) {
        double c = rt[((size_t)pos[r] * half + j) * 2], s = rt[((size_t)pos[r] * half + j) * 2 + 1];
        o[2 * j] = xh[2 * j] * c - xh[2 * j + 1] * s;
        o[2 * j + 1] = xh[2 * j + 1] * c + xh[2 * j] * s;
      }
    }
  }
  vs_dev_ops(dev)->rope_apply(dev, x, rows, stride, n_heads, hd, pos, t);
  for (int r = 0; r < rows; r++) {
    memcpy(got + (size_t)r * n_heads * hd, x + (size_t)r * stride, n_heads * hd * sizeof(float));
    for (int i = n_heads * hd; i < stride; i++) /* padding untouched */
      assert_true(x[(size_t)r * stride + i] == orig[(size_t)r * stride + i]);
  }
  vt_assert_close(got, ref, (size_t)rows * n_heads * hd, 1e-5, 2e-5, "rope_apply");
  if (n_cond > 0) /* condition rows: q and k become exactly zero (upstream quirk) */
    for (int i = 0; i < n_heads * hd; i++) assert_true(x[i] == 0.0f);
  free(t);
  free(rt);
  free(x);
  free(orig);
  free(ref);
  free(got);
  vs_dev_destroy(dev);
}

static void test_apply(void **state) {
  check_apply(1, 3, 16, 2);
  check_apply(1, 16, 64, 4);
  check_apply(2, 6, 100, 3);
}

/* The AVX2 and AVX-512 rotations give vs_rope_rotate's bits (cpu_rope.c), for head sizes
 * that leave scalar pairs after the vector ones (20, 36) and none (16, 64), heads packed in a
 * row with padding, every position of the table. */
static void test_apply_isas_agree_bitwise(void **state) {
  (void)state;
  const int hds[] = {4, 16, 20, 36, 64};
  const int isas[] = {VS_ISA_AVX2, VS_ISA_AVX512};
  vspec_rng rng;
  vs_rng_init(&rng, 45, 0);
  vspec_dev *ref = vt_dev(1);
  assert_int_equal(vs_cpu_set_isa(ref, VS_ISA_SCALAR), VSPEC_OK);
  for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++) {
    int hd = hds[h], heads = 3, grid = 4, n_cond = 1, rows = n_cond + grid * grid;
    int stride = heads * hd + 5;
    float *t = vt_malloc((size_t)rows * hd * sizeof(float));
    vs_cpu_ops()->rope2d_table(n_cond, grid, hd, 10000.0f, t);
    int32_t pos[32];
    for (int r = 0; r < rows; r++) pos[r] = (r * 7) % rows;
    size_t n = (size_t)rows * stride;
    float *x = vt_malloc(n * sizeof(float)), *want = vt_malloc(n * sizeof(float));
    float *y = vt_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
      x[i] = (float)((vs_rng_uniform(&rng) - 0.5) * pow(10.0, 8.0 * vs_rng_uniform(&rng) - 4.0));
    memcpy(want, x, n * sizeof(float));
    vs_dev_ops(ref)->rope_apply(ref, want, rows, stride, heads, hd, pos, t);
    for (int k = 0; k < 2; k++) {
      vspec_dev *dev = vt_dev(1);
      if (vs_cpu_set_isa(dev, isas[k]) != VSPEC_OK) {
        vs_dev_destroy(dev);
        continue;
      }
      memcpy(y, x, n * sizeof(float));
      vs_dev_ops(dev)->rope_apply(dev, y, rows, stride, heads, hd, pos, t);
      for (size_t i = 0; i < n; i++)
        if (vs_f32_bits(y[i]) != vs_f32_bits(want[i]))
          fail_msg("rope %s head_dim %d element %zu: %.9g, scalar %.9g", vs_isa_name(isas[k]), hd,
                   i, (double)y[i], (double)want[i]);
      vs_dev_destroy(dev);
    }
    free(t), free(x), free(want), free(y);
  }
  vs_dev_destroy(ref);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table_layout),
      cmocka_unit_test(test_table_values),
      cmocka_unit_test(test_apply),
      cmocka_unit_test(test_apply_isas_agree_bitwise),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
