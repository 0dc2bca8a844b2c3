/* tests/test_ops_linear_skinny.c - the few-row linear kernel (every instruction set this
 * CPU has), its dispatch from linear/gemm, and the device's worker pool. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/cpu_linear_skinny.h"
#include "kernels/cpu/cpu_threads.h"
#include "tests/support/kernels_testutil.h"

static const int all_isas[] = {VS_ISA_SCALAR, VS_ISA_AVX2, VS_ISA_AVX512};
#define N_ISAS ((int)(sizeof all_isas / sizeof all_isas[0]))

/* A device forced to `isa`; NULL (and a note) when this CPU lacks it. */
static vspec_dev *dev_with_isa(int threads, int isa) {
  vspec_dev *dev = vt_dev(threads);
  int rc = vs_cpu_set_isa(dev, isa);
  if (rc == VSPEC_ENOTSUP) {
    vs_dev_destroy(dev);
    return NULL;
  }
  assert_int_equal(rc, VSPEC_OK);
  return dev;
}

typedef struct prob {
  int m, n, k, lda, ldb, ldc;
  float *a, *b, *bias, *c;
} prob;

static void prob_init(prob *p, int m, int n, int k, int pad, vspec_rng *rng) {
  p->m = m, p->n = n, p->k = k;
  p->lda = k + pad, p->ldb = k + 2 * pad, p->ldc = n + 3 * pad;
  p->a = vt_malloc((size_t)m * p->lda * sizeof(float));
  p->b = vt_malloc((size_t)n * p->ldb * sizeof(float));
  p->bias = vt_malloc((size_t)n * sizeof(float));
  p->c = vt_malloc((size_t)m * p->ldc * sizeof(float));
  vt_fill(rng, p->a, (size_t)m * p->lda, -2, 2);
  vt_fill(rng, p->b, (size_t)n * p->ldb, -0.5f, 0.5f);
  vt_fill(rng, p->bias, (size_t)n, -3, 3);
  vt_fill(rng, p->c, (size_t)m * p->ldc, -1, 1);
}

static void prob_free(prob *p) {
  free(p->a);
  free(p->b);
  free(p->bias);
  free(p->c);
}

/* alpha * a b^T + bias + beta * c0 in double, [m, n] dense */
static double *reference(const prob *p, float alpha, int with_bias, float beta, const float *c0) {
  double *ref = vt_malloc((size_t)p->m * p->n * sizeof(double));
  for (int i = 0; i < p->m; i++) {
    for (int j = 0; j < p->n; j++) {
      double s = 0;
      for (int q = 0; q < p->k; q++)
        s += (double)p->a[(size_t)i * p->lda + q] * p->b[(size_t)j * p->ldb + q];
      double v = alpha * s;
      if (with_bias) v += p->bias[j];
      if (beta != 0.0f) v += (double)beta * c0[(size_t)i * p->ldc + j];
      ref[(size_t)i * p->n + j] = v;
    }
  }
  return ref;
}

/* c [m, ldc] -> dense [m, n] */
static float *dense(const prob *p) {
  float *d = vt_malloc((size_t)p->m * p->n * sizeof(float));
  for (int i = 0; i < p->m; i++)
    memcpy(d + (size_t)i * p->n, p->c + (size_t)i * p->ldc, (size_t)p->n * sizeof(float));
  return d;
}

/* One skinny product against the double reference; also checks that the padding of c
 * between rows is untouched. */
static void check_skinny(vspec_dev *dev, int m, int n, int k, int pad, float alpha, int with_bias,
                         float beta, vspec_rng *rng) {
  prob p;
  prob_init(&p, m, n, k, pad, rng);
  if (beta == 0.0f)
    for (size_t i = 0; i < (size_t)m * p.ldc; i++) p.c[i] = NAN; /* must never be read */
  float *c0 = vt_malloc((size_t)m * p.ldc * sizeof(float));
  memcpy(c0, p.c, (size_t)m * p.ldc * sizeof(float));
  double *ref = reference(&p, alpha, with_bias, beta, c0);
  vs_skinny_nt(dev, m, n, k, alpha, p.a, p.lda, p.b, p.ldb, with_bias ? p.bias : NULL, beta, p.c,
               p.ldc);
  for (int i = 0; i < m; i++)
    for (int j = n; j < p.ldc; j++) {
      size_t at = (size_t)i * p.ldc + j;
      assert_memory_equal(&p.c[at], &c0[at], sizeof(float));
    }
  float *got = dense(&p);
  char what[128];
  snprintf(what, sizeof what, "skinny %s m=%d n=%d k=%d pad=%d alpha=%g bias=%d beta=%g",
           vs_isa_name(dev->isa), m, n, k, pad, alpha, with_bias, beta);
  vt_assert_close_scaled(got, ref, (size_t)m * n, 1e-5, what);
  free(got);
  free(ref);
  free(c0);
  prob_free(&p);
}

/* Every instruction set, m across the register blocks, k and n not multiples of the
 * vector width or the column block, dense and strided, linear and gemm forms. */
static void test_skinny_matches_reference(void **state) {
  static const int ks[] = {1, 3, 8, 15, 16, 17, 33, 100, 257};
  static const int ns[] = {1, 3, 4, 5, 7, 16, 17, 67};
  int tested = 0;
  for (int s = 0; s < N_ISAS; s++) {
    vspec_dev *dev = dev_with_isa(1, all_isas[s]);
    if (!dev) {
      print_message("  (%s not supported here: skipped)\n", vs_isa_name(all_isas[s]));
      continue;
    }
    tested++;
    vspec_rng rng;
    vs_rng_init(&rng, 21, (uint64_t)s);
    for (int m = 1; m <= 10; m++)
      for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
          check_skinny(dev, m, ns[ni], ks[ki], 0, 1.0f, (int)((m + ki + ni) & 1), 0.0f, &rng);
    static const int big_m[] = {11, 12, 13, 16, 17, 23, 31, 32, 33, 64, 70};
    for (size_t mi = 0; mi < sizeof big_m / sizeof big_m[0]; mi++) {
      check_skinny(dev, big_m[mi], 37, 45, 0, 1.0f, 1, 0.0f, &rng);
      check_skinny(dev, big_m[mi], 64, 200, 0, 1.0f, 0, 0.0f, &rng);
    }
    /* gemm form: leading dimensions > widths, alpha and beta */
    check_skinny(dev, 3, 29, 41, 5, -0.75f, 0, 0.5f, &rng);
    check_skinny(dev, 9, 64, 64, 1, 2.0f, 1, -1.0f, &rng);
    check_skinny(dev, 5, 130, 19, 3, 0.125f, 0, 0.0f, &rng);
    check_skinny(dev, 2, 8, 0, 0, 1.0f, 1, 0.0f, &rng); /* empty product: bias only */
    /* long rows: the activations are taken 8 rows per pass over the weights */
    check_skinny(dev, 21, 9, 20000, 0, 1.0f, 1, 0.0f, &rng);
    vs_dev_destroy(dev);
  }
  assert_true(tested >= 1);
}

/* linear and gemm route small m to the kernel and larger m to BLIS; both sides of the
 * threshold (lowered to 16 here so that small sizes cross it) give the same results up to
 * rounding, with every instruction set. */
static void check_linear_op(vspec_dev *dev, int m, int n_in, int n_out, int with_bias,
                            vspec_rng *rng) {
  prob p;
  prob_init(&p, m, n_out, n_in, 0, rng);
  for (size_t i = 0; i < (size_t)m * n_out; i++) p.c[i] = NAN;
  double *ref = reference(&p, 1.0f, with_bias, 0.0f, NULL);
  vs_dev_ops(dev)->linear(dev, p.a, m, n_in, p.b, n_out, with_bias ? p.bias : NULL, p.c);
  char what[96];
  snprintf(what, sizeof what, "linear %s m=%d n_in=%d n_out=%d bias=%d", vs_isa_name(dev->isa), m,
           n_in, n_out, with_bias);
  vt_assert_close_scaled(p.c, ref, (size_t)m * n_out, 1e-5, what);
  free(ref);
  prob_free(&p);
}

static void test_linear_dispatch(void **state) {
  for (int s = 0; s < N_ISAS; s++) {
    vspec_dev *dev = dev_with_isa(1, all_isas[s]);
    if (!dev) continue;
    assert_true(dev->skinny_max_m >= 1);
    dev->skinny_max_m = 16;
    vspec_rng rng;
    vs_rng_init(&rng, 22, (uint64_t)s);
    for (int m = 1; m <= 70; m += (m < 20 ? 1 : 7))
      check_linear_op(dev, m, 50 + m % 7, 21 + m % 5, m & 1, &rng);
    /* gemm with op(B) = B^T and small m takes the kernel too */
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 1, 0, 1, 1};
    float c[4] = {NAN, NAN, NAN, NAN};
    /* [1 2 3; 4 5 6] [1 0 1; 0 1 1]^T = [4 5; 10 11] */
    vs_dev_ops(dev)->gemm(dev, 0, 1, 2, 2, 3, 1.0f, a, 3, b, 3, 0.0f, c, 2);
    assert_true(c[0] == 4 && c[1] == 5 && c[2] == 10 && c[3] == 11);
    vs_dev_destroy(dev);
  }
}

/* Results must be bit-identical for 1, 2, 3 and 4 threads. The shapes are big enough for
 * the kernel to split the columns (n k >= 128K), with n not a multiple of the chunk
 * alignment so the last chunk is ragged. */
static void test_skinny_thread_invariance(void **state) {
  static const int ms[] = {1, 2, 3, 5, 8, 13, 16};
  const int n = 1003, k = 301;
  for (int s = 0; s < N_ISAS; s++) {
    vspec_dev *dev[4];
    int ok = 1;
    for (int t = 0; t < 4; t++) {
      dev[t] = dev_with_isa(t + 1, all_isas[s]);
      if (!dev[t]) ok = 0;
    }
    if (!ok) {
      for (int t = 0; t < 4; t++) vs_dev_destroy(dev[t]);
      continue;
    }
    for (int t = 0; t < 4; t++) assert_int_equal(dev[t]->threads, t + 1);
    vspec_rng rng;
    vs_rng_init(&rng, 23, (uint64_t)s);
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
      int m = ms[mi];
      prob p;
      prob_init(&p, m, n, k, 0, &rng);
      float *want = vt_malloc((size_t)m * n * sizeof(float));
      for (int t = 0; t < 4; t++) {
        for (size_t i = 0; i < (size_t)m * n; i++) p.c[i] = NAN;
        vs_dev_ops(dev[t])->linear(dev[t], p.a, m, k, p.b, n, (m & 1) ? p.bias : NULL, p.c);
        if (t == 0)
          memcpy(want, p.c, (size_t)m * n * sizeof(float));
        else
          assert_memory_equal(p.c, want, (size_t)m * n * sizeof(float));
      }
      free(want);
      prob_free(&p);
    }
    for (int t = 0; t < 4; t++) vs_dev_destroy(dev[t]);
  }
}

/* A row's result does not depend on the other rows batched with it: the tree verify of
 * speculative decoding must reproduce a one-token forward bit for bit. Batches of 1 and 2 rows
 * take the weight rows in sequence (VS_SKINNY_SEQ), larger ones side by side with a prefetch
 * pattern that depends on the number of activation blocks (1 to 17 rows: 1 to 6 blocks on
 * AVX2, 1 to 5 on AVX-512), 40 rows side by side: same bits. */
static void test_skinny_row_independence(void **state) {
  const int n = 75, k = 131, m = 40;
  for (int s = 0; s < N_ISAS; s++) {
    vspec_dev *dev = dev_with_isa(2, all_isas[s]);
    if (!dev) continue;
    vspec_rng rng;
    vs_rng_init(&rng, 24, (uint64_t)s);
    prob p;
    prob_init(&p, m, n, k, 0, &rng);
    vs_skinny_nt(dev, m, n, k, 1.0f, p.a, k, p.b, k, p.bias, 0.0f, p.c, n);
    float few[17 * 75];
    for (int rows = 1; rows <= 17; rows++)
      for (int i = 0; i + rows <= m; i += rows) {
        vs_skinny_nt(dev, rows, n, k, 1.0f, p.a + (size_t)i * k, k, p.b, k, p.bias, 0.0f, few, n);
        assert_memory_equal(few, p.c + (size_t)i * n, (size_t)rows * n * sizeof(float));
      }
    prob_free(&p);
    vs_dev_destroy(dev);
  }
}

static void test_isa_hook(void **state) {
  vspec_dev *dev = vt_dev(1);
  /* VSPEC_CPU_ISA caps the default (to run the suite on the AVX2 or portable kernels) */
  const char *cap = getenv("VSPEC_CPU_ISA");
  if (!cap || !*cap) assert_int_equal(dev->isa, vs_isa_best());
  assert_true(vs_isa_supported(VS_ISA_SCALAR));
  assert_int_equal(vs_cpu_set_isa(dev, 0), VSPEC_EINVAL);
  assert_int_equal(vs_cpu_set_isa(dev, 99), VSPEC_EINVAL);
  for (int s = 0; s < N_ISAS; s++) {
    int rc = vs_cpu_set_isa(dev, all_isas[s]);
    assert_int_equal(rc, vs_isa_supported(all_isas[s]) ? VSPEC_OK : VSPEC_ENOTSUP);
    print_message("  %s: %s\n", vs_isa_name(all_isas[s]),
                  rc == VSPEC_OK ? "supported" : "not supported");
  }
  vs_dev_destroy(dev);
}

/* ---- the worker pool ---------------------------------------------------------------- */

typedef struct pool_ctx {
  atomic_int hits[64];
  atomic_int on_helper; /* tasks that ran on a thread other than the caller */
  pthread_t caller;
  int slow; /* microseconds each task sleeps */
  int slow_helper; /* microseconds a task sleeps when a helper runs it (a helper losing its core) */
} pool_ctx;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void pool_mark(void *ctx, int task) {
  pool_ctx *c = ctx;
  int helper = !pthread_equal(pthread_self(), c->caller);
  if (c->slow) usleep((useconds_t)c->slow);
  if (helper && c->slow_helper) usleep((useconds_t)c->slow_helper);
  atomic_fetch_add(&c->hits[task], 1);
  if (helper) atomic_fetch_add(&c->on_helper, 1);
}

/* A helper that stalls (here: sleeps 5 ms in its task, as one preempted by another process
 * would) makes the caller wait; the pool then runs the next regions on the caller alone, 16
 * after a first stall and twice as many after each stall in a row, and the work stays
 * exactly once per task throughout. */
static void test_pool_stall_backoff(void **state) {
  vs_pool *pool = vs_pool_create(2);
  assert_non_null(pool);
  pool_ctx c;
  int stalled = 0;
  /* Until the pool saw a stall: on a loaded machine the helper's thread may not get a core
   * for a while, or it may take a task while the caller is the one descheduled (then the
   * caller does not wait, and nothing stalls), so the bound is time (3 s, thousands of
   * regions), not a few tries. */
  double t0 = now_s();
  while (!stalled && now_s() - t0 < 3.0) {
    memset(&c, 0, sizeof c);
    c.caller = pthread_self();
    c.slow = 200;
    c.slow_helper = 5000;
    vs_pool_run(pool, 4, pool_mark, &c);
    stalled = vs_pool_stalls(pool) > 0;
  }
  if (!stalled) {
    print_message("  the helper thread never stalled the caller in 3 s (no free core): not "
                  "testable\n");
    vs_pool_destroy(pool);
    skip();
  }
  assert_int_equal(vs_pool_stalls(pool), 1);
  /* 16 regions on the caller alone, though tasks of 200 us leave helpers time to join */
  memset(&c, 0, sizeof c);
  c.caller = pthread_self();
  c.slow = 200;
  for (int r = 0; r < 16; r++) vs_pool_run(pool, 4, pool_mark, &c);
  assert_int_equal(atomic_load(&c.on_helper), 0);
  for (int t = 0; t < 4; t++) assert_int_equal(atomic_load(&c.hits[t]), 16);
  /* then helpers again: a probe region they take part in, and no stall, ends the backoff */
  int helped = 0;
  t0 = now_s();
  while (!helped && now_s() - t0 < 3.0) {
    vs_pool_run(pool, 4, pool_mark, &c);
    helped = atomic_load(&c.on_helper) > 0;
  }
  assert_true(helped);
  assert_int_equal(vs_pool_stalls(pool), 1);
  vs_pool_destroy(pool);
}

/* Every task of every region runs exactly once, whatever the thread count, the number of
 * tasks, and whether the helpers are spinning, asleep or late. */
static void test_pool(void **state) {
  static const int counts[] = {0, 1, 2, 3, 5, 17, 64};
  for (int threads = 1; threads <= 4; threads++) {
    vs_pool *pool = vs_pool_create(threads);
    assert_non_null(pool);
    assert_int_equal(vs_pool_threads(pool), threads);
    int helped = 0;
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
      int ntasks = counts[ci];
      pool_ctx c;
      memset(&c, 0, sizeof c);
      c.caller = pthread_self();
      for (int rep = 0; rep < 100; rep++) {
        c.slow = rep % 10 == 0 ? 200 : 0; /* helpers join while tasks are left */
        vs_pool_run(pool, ntasks, pool_mark, &c);
        if (rep == 50) usleep(2000); /* helpers fall asleep: the wake-up path */
      }
      for (int t = 0; t < 64; t++) assert_int_equal(atomic_load(&c.hits[t]), t < ntasks ? 100 : 0);
      helped += atomic_load(&c.on_helper);
    }
    /* the helpers do take part (tasks of 200 us leave them ample time to join) */
    if (threads == 1)
      assert_int_equal(helped, 0);
    else
      assert_true(helped > 0);
    vs_pool_destroy(pool);
  }
  vs_pool_destroy(NULL);
  assert_int_equal(vs_pool_threads(NULL), 1);
  /* threads = 0 means one per online core */
  vspec_dev *dev = vt_dev(0);
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  assert_int_equal(dev->threads, online < 1 ? 1 : (online > 256 ? 256 : online));
  assert_int_equal(vs_pool_threads(dev->pool), dev->threads);
  vs_dev_destroy(dev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_isa_hook),
      cmocka_unit_test(test_skinny_matches_reference),
      cmocka_unit_test(test_linear_dispatch),
      cmocka_unit_test(test_skinny_thread_invariance),
      cmocka_unit_test(test_skinny_row_independence),
      cmocka_unit_test(test_pool),
      cmocka_unit_test(test_pool_stall_backoff),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
