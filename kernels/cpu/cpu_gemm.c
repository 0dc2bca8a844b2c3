/*
 * kernels/cpu/cpu_gemm.c - every matrix product of the CPU ops goes through vs_sgemm here.
 *
 * BLIS is called through its typed expert API (bli_sgemm_ex) rather than CBLAS because
 * that API takes a per-call runtime object, which gives each device its own thread count
 * and lets small products run on one thread:
 *  - BLIS 0.9's CBLAS path only knows the process-wide setting of
 *    bli_thread_set_num_threads, so two workers could not use different counts, and a
 *    setting change would race with other workers' calls;
 *  - multi-threaded BLIS spawns and joins its threads on every call. For the tiny
 *    per-head products of decode-time attention that overhead dominates: measured on this
 *    (2-core, shared) machine, H=12 hd=64 n_kv=264 attention took 0.29 ms with one
 *    thread and 45 ms with two.
 *
 * Few-row products A B^T (decode-time linear layers, m <= vs_skinny_max_m) bypass BLIS for
 * the kernel in cpu_linear_skinny.c, which streams B once instead of packing it.
 *
 * Determinism across thread counts: BLIS parallelises the m and n loops of gemm (the
 * jc/ic/jr/ir loops) and never the k (pc) loop, so every element of C is reduced by one
 * thread in the same order whatever the thread count; results are bit-identical for 1 or
 * N threads (tests/test_ops_dense.c checks this). Never set pc ways > 1.
 *
 * This is the only file that includes blis.h. Debian's BLIS 0.9 header defines unused
 * `static` functions and compares unsigned values against 0, which this project's
 * -Wextra -Werror rejects; the warnings are silenced around the include only.
 */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wtype-limits"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif
#include <blis.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_linear_skinny.h"

/* Below this many multiply-adds a product runs on one thread: thread start-up and the
 * join barrier cost tens of microseconds per call, more than such a product takes. */
#define VS_GEMM_MT_MIN_MACS ((double)(1 << 20))

int vs_blis_tuned(void) { return bli_arch_query_id() != BLIS_ARCH_GENERIC; }

void vs_sgemm(vspec_dev *dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  if (m <= 0 || n <= 0) return;
  /* A few rows times a transposed (weight-layout) matrix: the linear layers of decoding,
   * and the Q K^T of attention. BLIS would pack all of b for a handful of rows. */
  if (!trans_a && trans_b && m <= dev->skinny_max_m) {
    vs_skinny_nt(dev, m, n, k, alpha, a, lda, b, ldb, NULL, beta, c, ldc);
    return;
  }
  /* threads = 0 keeps BLIS's own default (BLIS_NUM_THREADS etc.), which the global
   * runtime object carries. */
  rntm_t rntm;
  bli_rntm_init_from_global(&rntm);
  if ((double)m * n * (k > 0 ? k : 1) < VS_GEMM_MT_MIN_MACS)
    bli_rntm_set_num_threads(1, &rntm);
  else if (dev->blis_threads > 0)
    bli_rntm_set_num_threads(dev->blis_threads, &rntm);
  /* Never BLIS's small-matrix ("sup") path: (1) in BLIS 0.9.0 its kernels read past the
   * end of the operands (a product with m = 16 whose B ends at an unmapped page faults,
   * tests/test_ops_gemm_paths.c); (2) whether it is taken depends on per-CPU size
   * thresholds and it rounds differently from the packed path, so the bits of a row would
   * depend on the CPU and on how many rows were computed with it. The packed path gives
   * every element the same reduction order whatever m, n and the thread count. */
  bli_rntm_disable_l3_sup(&rntm);
  /* Row-major storage is a row stride of ld and a column stride of 1; m, n, k describe
   * op(A) and op(B) as in BLAS, BLIS infers the stored shapes from the trans flags. BLIS
   * does not write through a or b; its prototype just lacks const. */
  bli_sgemm_ex(trans_a ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
               trans_b ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, m, n, k, &alpha, (float *)a, lda, 1,
               (float *)b, ldb, 1, &beta, c, ldc, 1, NULL, &rntm);
}

void vs_cpu_gemm(vspec_dev *dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  vs_sgemm(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void vs_cpu_linear(vspec_dev *dev, const float *x, int m, int n_in, const float *w, int n_out,
                   const float *bias, float *y) {
  if (m <= 0 || n_out <= 0) return;
  if (m <= dev->skinny_max_m) {
    vs_skinny_nt(dev, m, n_out, n_in, 1.0f, x, n_in, w, n_in, bias, 0.0f, y, n_out);
    return;
  }
  float beta = 0.0f;
  if (bias) {
    /* seed y with the bias and accumulate onto it: one pass over y instead of two */
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n_out; j++) y[(size_t)i * n_out + j] = bias[j];
    beta = 1.0f;
  }
  vs_sgemm(dev, 0, 1, m, n_out, n_in, 1.0f, x, n_in, w, n_in, beta, y, n_out);
}
