/* tests/test_cpu_weights.c - the CPU device's allocation table and bf16 weight copies
 * (kernels/cpu/cpu_weights.h), and the bf16 precision of the CPU device built on them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "kernels/cpu/cpu_linear_amx.h"
#include "kernels/cpu/cpu_linear_amx8.h"
#include "kernels/cpu/cpu_linear_bf16.h"
#include "kernels/cpu/cpu_weights.h"
#include "tests/support/kernels_testutil.h"

/* Random track/untrack against a plain list: every tracked pointer stays findable (as a
 * weight that gets a copy), every untracked one is gone, across growth and the backward
 * shifts of deletion. */
static void test_table_matches_list(void **state) {
  enum { N = 3000 };
  static char arena[N * 64];
  static int live[N];
  size_t base_allocs;
  vs_cpu_weights_stats(&base_allocs, NULL);
  vspec_rng rng;
  vs_rng_init(&rng, 41, 0);
  int count = 0;
  for (int step = 0; step < 20000; step++) {
    int i = (int)(vs_rng_uniform(&rng) * N);
    if (live[i]) {
      vs_cpu_weights_untrack(arena + 64 * i);
      live[i] = 0, count--;
    } else {
      assert_int_equal(vs_cpu_weights_track(arena + 64 * i, 64), VSPEC_OK);
      live[i] = 1, count++;
    }
    if (step % 997 == 0) {
      size_t n;
      vs_cpu_weights_stats(&n, NULL);
      assert_int_equal(n, base_allocs + (size_t)count);
    }
  }
  /* a tracked 64-byte block is a 4 x 4 weight: it gets a copy; an untracked one does not */
  for (int i = 0; i < N; i += 37) {
    const uint16_t *copy = vs_cpu_weights_amx((const float *)(arena + 64 * i), 4, 4);
    if (live[i]) assert_non_null(copy);
    else assert_null(copy);
  }
  for (int i = 0; i < N; i++)
    if (live[i]) vs_cpu_weights_untrack(arena + 64 * i);
  size_t n, bytes;
  vs_cpu_weights_stats(&n, &bytes);
  assert_int_equal(n, base_allocs);
}

/* A copy: made once, for whole allocations of at least n * k floats only, for one shape, and
 * gone with the weight (freed by the device, or by releasing the lent memory). */
static void test_copy_lifecycle(void **state) {
  vspec_dev *dev = vt_dev(1);
  const vspec_ops *ops = vs_dev_ops(dev);
  float *w = ops->alloc(dev, 32 * 64 * sizeof(float));
  for (int i = 0; i < 32 * 64; i++) w[i] = (float)(i % 7) - 3.0f;
  size_t before;
  vs_cpu_weights_stats(NULL, &before);
  const uint16_t *a = vs_cpu_weights_amx(w, 32, 64);
  assert_non_null(a);
  assert_ptr_equal(vs_cpu_weights_amx(w, 32, 64), a);       /* made once */
  assert_null(vs_cpu_weights_amx(w, 16, 64));               /* another shape: fp32 */
  assert_null(vs_cpu_weights_amx(w + 64, 16, 64));          /* not an allocation's start */
  assert_null(vs_cpu_weights_amx(w, 64, 64));               /* more than was allocated */
  /* the copy is the packing of w */
  uint16_t *want = vt_malloc(vs_amx_packed_bytes(32, 64));
  vs_amx_pack(w, 32, 64, want);
  assert_memory_equal(a, want, vs_amx_packed_bytes(32, 64));
  size_t held;
  vs_cpu_weights_stats(NULL, &held);
  assert_int_equal(held, before + vs_amx_packed_bytes(32, 64));
  ops->free(dev, w);
  vs_cpu_weights_stats(NULL, &held);
  assert_int_equal(held, before);

  /* lent memory (a mapped tensor): released by range */
  float *lent = vt_malloc(2 * 32 * 64 * sizeof(float));
  memset(lent, 0, 2 * 32 * 64 * sizeof(float));
  vs_cpu_memory_lend(lent, 32 * 64 * sizeof(float));
  vs_cpu_memory_lend(lent + 32 * 64, 32 * 64 * sizeof(float));
  vs_cpu_memory_lend(lent, 32 * 64 * sizeof(float)); /* lent twice: one entry */
  assert_non_null(vs_cpu_weights_amx(lent, 32, 64));
  assert_non_null(vs_cpu_weights_amx(lent + 32 * 64, 32, 64));
  vs_cpu_memory_release(lent, 2 * 32 * 64 * sizeof(float));
  vs_cpu_weights_stats(NULL, &held);
  assert_int_equal(held, before);
  assert_null(vs_cpu_weights_amx(lent, 32, 64));
  free(lent);
  free(want);
  vs_dev_destroy(dev);
}

/* bf16 copies (CPUs without AMX) are carved from shared arenas (cpu_weights.c): each is the
 * packing of its weight, and the memory goes back with the weights in any order, a copy
 * larger than half an arena (a block of its own) included. */
static void test_bf16_copy_lifecycle(void **state) {
  vspec_dev *dev = vt_dev(1);
  const vspec_ops *ops = vs_dev_ops(dev);
  enum { W = 5 };
  static const int ns[W] = {768, 3, 2048, 1, 4500}, ks[W] = {768, 17, 768, 40, 2048};
  float *w[W];
  size_t before, held;
  vs_cpu_weights_stats(NULL, &before);
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < W; i++) {
      size_t count = (size_t)ns[i] * ks[i];
      w[i] = ops->alloc(dev, count * sizeof(float));
      for (size_t e = 0; e < count; e++) w[i][e] = (float)((e * 7 + (size_t)i) % 13) - 6.0f;
      const uint16_t *rows = vs_cpu_weights_bf16_rows(w[i], ns[i], ks[i]);
      assert_non_null(rows);
      assert_ptr_equal(vs_cpu_weights_bf16_rows(w[i], ns[i], ks[i]), rows); /* made once */
      uint16_t *want = vt_malloc(count * sizeof *want);
      vs_bf16_pack(w[i], ns[i], ks[i], want);
      assert_memory_equal(rows, want, count * sizeof *want);
      free(want);
    }
    /* freed out of order: the middle ones first */
    static const int order[W] = {2, 1, 4, 0, 3};
    for (int i = 0; i < W; i++) ops->free(dev, w[order[i]]);
    vs_cpu_weights_stats(NULL, &held);
    assert_int_equal(held, before);
  }
  vs_dev_destroy(dev);
}

/* precision=bf16 with AMX: the linear layer runs the AMX kernel on the weight's copy (its
 * bits), and falls back to fp32 for a pointer into an allocation. Skipped without AMX
 * (tests/test_linear_bf16.c covers the path of CPUs without it). */
static void test_bf16_device(void **state) {
  vs_device_options opt = {.threads = 2, .precision = VS_PRECISION_BF16};
  vspec_dev *dev = NULL;
  char err[VSPEC_ERRLEN] = "";
  int rc = vs_device_open("cpu", &opt, &dev, err, sizeof err);
  if (!vs_amx_available()) {
    vs_dev_destroy(dev);
    skip();
  }
  assert_int_equal(rc, VSPEC_OK);
  vs_device_info info;
  assert_int_equal(vs_dev_info(dev, &info), VSPEC_OK);
  assert_int_equal(info.precision, VS_PRECISION_BF16);
  const vspec_ops *ops = vs_dev_ops(dev);
  enum { M = 3, K = 96, N = 80 };
  float *w = ops->alloc(dev, (size_t)N * K * sizeof(float));
  float x[M * K], y[M * N], want[M * N];
  vspec_rng rng;
  vs_rng_init(&rng, 42, 0);
  vt_fill(&rng, w, (size_t)N * K, -0.5f, 0.5f);
  vt_fill(&rng, x, M * K, -2, 2);
  ops->linear(dev, x, M, K, w, N, NULL, y);
  uint16_t *packed = vt_malloc(vs_amx_packed_bytes(N, K));
  vs_amx_pack(w, N, K, packed);
  vs_amx_linear(dev, x, M, K, packed, N, NULL, want);
  assert_memory_equal(y, want, sizeof y);
  /* an interior pointer has no copy: fp32, which differs from the bf16 result */
  ops->linear(dev, x, M, K, w + K, N - 1, NULL, y);
  double *ref = vt_malloc((size_t)M * (N - 1) * sizeof(double));
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N - 1; j++) {
      double s = 0;
      for (int p = 0; p < K; p++) s += (double)x[i * K + p] * w[(size_t)(j + 1) * K + p];
      ref[i * (N - 1) + j] = s;
    }
  vt_assert_close(y, ref, (size_t)M * (N - 1), 1e-5, 1e-5, "fp32 fallback");
  free(ref);
  free(packed);
  ops->free(dev, w);
  vs_dev_destroy(dev);
}

/* weight_format: a weight marked for int8 runs the int8 kernel on its packed copy (its bits)
 * at bf16 precision, activations that are not finite fall back to bf16, fp32 devices ignore
 * the mark, the copy is freed with the weight, and bad requests are refused. */
static void test_int8_weights(void **state) {
  vs_device_options opt = {.threads = 1, .precision = VS_PRECISION_BF16};
  vspec_dev *dev = NULL, *fp32 = vt_dev(1);
  char err[VSPEC_ERRLEN] = "";
  int rc = vs_device_open("cpu", &opt, &dev, err, sizeof err);
  const vspec_ops *ops = vs_dev_ops(fp32);
  enum { M = 5, K = 96, N = 80 };
  float *w = ops->alloc(fp32, (size_t)N * K * sizeof(float));
  float x[M * K], y[M * N], want[M * N];
  vspec_rng rng;
  vs_rng_init(&rng, 43, 0);
  vt_fill(&rng, w, (size_t)N * K, -0.5f, 0.5f);
  vt_fill(&rng, x, M * K, -2, 2);
  assert_int_equal(ops->weight_format(fp32, w + K, N - 1, K, VSPEC_WEIGHTS_INT8), VSPEC_EINVAL);
  assert_int_equal(ops->weight_format(fp32, w, N, K, 7), VSPEC_EINVAL);
  /* an fp32 device remembers the request but keeps fp32 */
  assert_int_equal(ops->weight_format(fp32, w, N, K, VSPEC_WEIGHTS_INT8), VSPEC_ENOTSUP);
  if (vs_amx8_available()) assert_int_equal(rc, VSPEC_OK);
  if (rc != VSPEC_OK || !vs_amx8_available()) {
    print_message("  (no AMX-INT8 on this CPU or OS: the int8 device path is not tested)\n");
    ops->free(fp32, w);
    vs_dev_destroy(dev);
    vs_dev_destroy(fp32);
    skip();
  }
  /* the fp32 device's request above still stands: this one makes two; until both are
   * withdrawn the weight stays int8 */
  assert_int_equal(ops->weight_format(dev, w, N, K, VSPEC_WEIGHTS_INT8), VSPEC_OK);
  size_t before, held;
  vs_cpu_weights_stats(NULL, &before);
  ops->linear(dev, x, M, K, w, N, NULL, y);
  void *packed = vt_malloc(vs_amx8_packed_bytes(N, K));
  assert_int_equal(vs_amx8_pack(w, N, K, packed), 0);
  assert_int_equal(vs_amx8_linear(dev, x, M, K, packed, N, NULL, want), 0);
  assert_memory_equal(y, want, sizeof y);
  uint16_t *bf = vt_malloc(vs_amx_packed_bytes(N, K));
  vs_amx_pack(w, N, K, bf);
  float bf_y[M * N];
  vs_amx_linear(dev, x, M, K, bf, N, NULL, bf_y);
  assert_int_equal(ops->weight_format(dev, w, N, K, VSPEC_WEIGHTS_DEFAULT), VSPEC_OK);
  ops->linear(dev, x, M, K, w, N, NULL, y);
  assert_memory_equal(y, want, sizeof y); /* one request left */
  assert_int_equal(ops->weight_format(fp32, w, N, K, VSPEC_WEIGHTS_DEFAULT), VSPEC_OK);
  ops->linear(dev, x, M, K, w, N, NULL, y);
  assert_memory_equal(y, bf_y, sizeof y); /* none: the bf16 copy */
  assert_memory_not_equal(bf_y, want, sizeof y);
  assert_int_equal(ops->weight_format(dev, w, N, K, VSPEC_WEIGHTS_INT8), VSPEC_OK);
  vs_cpu_weights_stats(NULL, &held);
  assert_int_equal(held, before + vs_amx8_packed_bytes(N, K) + vs_amx_packed_bytes(N, K));
  /* a NaN in the activations: the bf16 kernel's result (NaN in that row, the rest as bf16) */
  x[2 * K + 5] = NAN;
  ops->linear(dev, x, M, K, w, N, NULL, y);
  vs_amx_linear(dev, x, M, K, bf, N, NULL, want);
  assert_memory_equal(y, want, sizeof y);
  /* fp32 precision: the fp32 product, not the int8 one */
  x[2 * K + 5] = 1.0f;
  ops->linear(fp32, x, M, K, w, N, NULL, y);
  assert_int_equal(vs_amx8_linear(dev, x, M, K, packed, N, NULL, want), 0);
  assert_memory_not_equal(y, want, sizeof y);
  ops->free(fp32, w); /* both copies go with the weight */
  vs_cpu_weights_stats(NULL, &held);
  assert_int_equal(held, before);
  free(packed);
  free(bf);
  vs_dev_destroy(dev);
  vs_dev_destroy(fp32);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table_matches_list),
      cmocka_unit_test(test_copy_lifecycle),
      cmocka_unit_test(test_bf16_copy_lifecycle),
      cmocka_unit_test(test_bf16_device),
      cmocka_unit_test(test_int8_weights),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
