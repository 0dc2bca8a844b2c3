/* tests/test_ops_gemm_paths.c - the BLIS products of the CPU ops (kernels/cpu/cpu_gemm.c)
 * neither read past their operands nor depend on which BLIS code path a shape takes.
 *
 * BLIS 0.9.0 chooses, per call, between its packed path and a small-matrix ("sup") path
 * by per-CPU size thresholds. The sup kernels read past the end of the operands (seen as a
 * segfault for m = 16, n = 1003, k = 301 on AMD Zen 4 and on Intel Sapphire Rapids) and
 * round differently, so vs_sgemm keeps BLIS on the packed path. These tests fail when the
 * sup path is allowed again: the first faults, the second sees other bits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/cpu/cpu_dev.h"
#include "tests/support/kernels_testutil.h"

/* `count` floats that end exactly where an inaccessible page begins, so that any read
 * past the end faults. */
typedef struct guarded {
  void *map;
  size_t map_bytes;
  float *x;
} guarded;

static void guarded_alloc(guarded *g, size_t count) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t bytes = count * sizeof(float);
  size_t data_pages = (bytes + page - 1) / page;
  g->map_bytes = (data_pages + 1) * page;
  g->map = mmap(NULL, g->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(g->map != MAP_FAILED);
  char *guard = (char *)g->map + data_pages * page;
  assert_int_equal(mprotect(guard, page, PROT_NONE), 0);
  g->x = (float *)(guard - bytes);
}

static void guarded_free(guarded *g) { munmap(g->map, g->map_bytes); }

/* A device whose products all go to BLIS: the few-row kernel is switched off. */
static vspec_dev *blis_only_dev(int threads) {
  vspec_dev *dev = vt_dev(threads);
  dev->skinny_max_m = 0;
  return dev;
}

/* Every transpose combination, for shapes small enough in m, n or k to be "small" to
 * BLIS on any CPU, with A, B and C each ending at a guard page; results are checked
 * against a double-precision reference so that a fix that skips work fails too. */
static void test_gemm_reads_within_operands(void **state) {
  static const int shapes[][3] = {{16, 1003, 301}, {5, 7, 2000}, {33, 3, 129}, {200, 16, 9}};
  vspec_dev *dev = blis_only_dev(1);
  vspec_rng rng;
  vs_rng_init(&rng, 41, 0);
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    for (int ta = 0; ta < 2; ta++) {
      for (int tb = 0; tb < 2; tb++) {
        int lda = ta ? m : k, ldb = tb ? k : n;
        size_t na = (size_t)m * k, nb = (size_t)n * k, nc = (size_t)m * n;
        guarded ga, gb, gc;
        guarded_alloc(&ga, na);
        guarded_alloc(&gb, nb);
        guarded_alloc(&gc, nc);
        vt_fill(&rng, ga.x, na, -1, 1);
        vt_fill(&rng, gb.x, nb, -1, 1);
        vs_dev_ops(dev)->gemm(dev, ta, tb, m, n, k, 1.0f, ga.x, lda, gb.x, ldb, 0.0f, gc.x, n);
        double *ref = vt_malloc(nc * sizeof(double));
        for (int i = 0; i < m; i++)
          for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int p = 0; p < k; p++) {
              double av = ta ? ga.x[(size_t)p * lda + i] : ga.x[(size_t)i * lda + p];
              double bv = tb ? gb.x[(size_t)j * ldb + p] : gb.x[(size_t)p * ldb + j];
              acc += av * bv;
            }
            ref[(size_t)i * n + j] = acc;
          }
        char what[80];
        snprintf(what, sizeof what, "guarded gemm ta=%d tb=%d %dx%dx%d", ta, tb, m, n, k);
        vt_assert_close_scaled(gc.x, ref, nc, 1e-5, what);
        free(ref);
        guarded_free(&ga);
        guarded_free(&gb);
        guarded_free(&gc);
      }
    }
  }
  vs_dev_destroy(dev);
}

/* Rows and columns computed as part of a large product (over every threshold, so on the
 * packed path on any CPU) equal, bit for bit, the same rows and columns computed alone in
 * a small product (which BLIS would send to the sup path), with 1 and 2 threads. */
static void test_gemm_bits_independent_of_shape(void **state) {
  const int M = 320, N = 700, K = 301;
  static const int sub_m[] = {1, 4, 16, 33};
  static const int sub_n[] = {7, 700};
  vspec_rng rng;
  vs_rng_init(&rng, 42, 0);
  float *a = vt_malloc((size_t)M * K * sizeof(float));
  float *b = vt_malloc((size_t)N * K * sizeof(float)); /* weight layout [N, K]: B^T */
  float *full = vt_malloc((size_t)M * N * sizeof(float));
  float *part = vt_malloc((size_t)M * N * sizeof(float));
  vt_fill(&rng, a, (size_t)M * K, -2, 2);
  vt_fill(&rng, b, (size_t)N * K, -0.5f, 0.5f);
  for (int threads = 1; threads <= 2; threads++) {
    vspec_dev *dev = blis_only_dev(threads);
    vs_dev_ops(dev)->gemm(dev, 0, 1, M, N, K, 1.0f, a, K, b, K, 0.0f, full, N);
    for (size_t i = 0; i < sizeof sub_m / sizeof sub_m[0]; i++) {
      for (size_t j = 0; j < sizeof sub_n / sizeof sub_n[0]; j++) {
        int m = sub_m[i], n = sub_n[j], row0 = 3, col0 = N - n;
        vs_dev_ops(dev)->gemm(dev, 0, 1, m, n, K, 1.0f, a + (size_t)row0 * K, K,
                              b + (size_t)col0 * K, K, 0.0f, part, n);
        for (int r = 0; r < m; r++) {
          const float *want = full + (size_t)(row0 + r) * N + col0;
          if (memcmp(part + (size_t)r * n, want, (size_t)n * sizeof(float)) != 0)
            fail_msg("threads=%d: rows of a %dx%d product differ from the same rows of the "
                     "%dx%d product (row %d)", threads, m, n, M, N, row0 + r);
        }
      }
    }
    vs_dev_destroy(dev);
  }
  free(a);
  free(b);
  free(full);
  free(part);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm_reads_within_operands),
      cmocka_unit_test(test_gemm_bits_independent_of_shape),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
