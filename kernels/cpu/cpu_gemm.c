/*
 * kernels/cpu/cpu_gemm.c - every matrix product of the CPU ops goes through vs_sgemm here.
 *
 * BLIS is called through its typed expert API (bli_sgemm_ex) rather than CBLAS because
 * that API takes a per-call runtime object, and every call runs on one thread:
 *  - BLIS 0.9's CBLAS path only knows the process-wide setting of
 *    bli_thread_set_num_threads, so two workers could not use different counts, and a
 *    setting change would race with other workers' calls;
 *  - multi-threaded BLIS spawns and joins its threads on every call and spins in its
 *    barriers. For the tiny per-head products of decode-time attention that overhead
 *    dominates (measured on this 2-core, shared machine, H=12 hd=64 n_kv=264 attention took
 *    0.29 ms with one thread and 45 ms with two), and with another process on the second
 *    core a fmnist image took 1.7-2.3 s on two threads against 0.14 s on one, nearly all of
 *    it the VQ decoder's products. Large products are split into blocks over the device's
 *    persistent pool instead (cpu_threads.c), which backs off when a helper stalls: 0.16 s.
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
#include "kernels/cpu/cpu_linear_amx.h"
#include "kernels/cpu/cpu_linear_amx8.h"
#include "kernels/cpu/cpu_linear_bf16.h"
#include "kernels/cpu/cpu_threads.h"
#include "kernels/cpu/cpu_weights.h"

/* Below this many multiply-adds a product runs on one thread: thread start-up and the
 * join barrier cost tens of microseconds per call, more than such a product takes. */
#define VS_GEMM_MT_MIN_MACS ((double)(1 << 20))
/* The rows or columns of one block of a split product: a multiple of the micro-tiles. */
#define VS_GEMM_BLOCK 64

static void gemm_one(int trans_a, int trans_b, int m, int n, int k, float alpha,
                     const float *a, int lda, const float *b, int ldb, float beta, float *c,
                     int ldc);
static void gemm_split(vspec_dev *dev, int nth, int trans_a, int trans_b, int m, int n,
                       int k, float alpha, const float *a, int lda, const float *b, int ldb,
                       float beta, float *c, int ldc);

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
  /* Large products are split over the device's own pool, each block one BLIS call on one
   * thread: multi-threaded BLIS spins in its barriers, and with another process on the
   * second core a VQ decode took seconds on two threads against 10 ms on one. Blocks of
   * the larger of m and n leave every element's reduction over k as it was, so the bits do
   * not depend on the thread count (tests/test_ops_dense.c, test_ops_gemm_paths.c). */
  int nth = vs_pool_threads(dev->pool);
  if (nth > 1 && (double)m * n * (k > 0 ? k : 1) >= VS_GEMM_MT_MIN_MACS &&
      (m >= 2 * VS_GEMM_BLOCK || n >= 2 * VS_GEMM_BLOCK)) {
    gemm_split(dev, nth, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  gemm_one(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* One BLIS call on one thread. */
static void gemm_one(int trans_a, int trans_b, int m, int n, int k, float alpha,
                     const float *a, int lda, const float *b, int ldb, float beta, float *c,
                     int ldc) {
  rntm_t rntm;
  bli_rntm_init_from_global(&rntm);
  bli_rntm_set_num_threads(1, &rntm);
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

typedef struct gemm_job {
  int trans_a, trans_b, m, n, k, lda, ldb, ldc, by_rows, block;
  float alpha, beta;
  const float *a, *b;
  float *c;
} gemm_job;

static void gemm_block(void *ctx, int t) {
  const gemm_job *g = ctx;
  int total = g->by_rows ? g->m : g->n, i0 = t * g->block;
  int len = total - i0 < g->block ? total - i0 : g->block;
  if (g->by_rows) /* rows i0.. of op(A) and of C */
    gemm_one(g->trans_a, g->trans_b, len, g->n, g->k, g->alpha,
             g->trans_a ? g->a + i0 : g->a + (size_t)i0 * g->lda, g->lda, g->b, g->ldb,
             g->beta, g->c + (size_t)i0 * g->ldc, g->ldc);
  else /* columns i0.. of op(B) and of C */
    gemm_one(g->trans_a, g->trans_b, g->m, len, g->k, g->alpha, g->a, g->lda,
             g->trans_b ? g->b + (size_t)i0 * g->ldb : g->b + i0, g->ldb, g->beta,
             g->c + i0, g->ldc);
}

static void gemm_split(vspec_dev *dev, int nth, int trans_a, int trans_b, int m, int n,
                       int k, float alpha, const float *a, int lda, const float *b, int ldb,
                       float beta, float *c, int ldc) {
  gemm_job g = {trans_a, trans_b, m, n, k, lda, ldb, ldc, m >= n, 0, alpha, beta, a, b, c};
  int total = g.by_rows ? m : n;
  /* Two blocks per thread (a late helper costs half a share), whole multiples of
   * VS_GEMM_BLOCK so that BLIS's micro-tiles are not cut more than they would be anyway. */
  int blocks = 2 * nth, per = (total + blocks - 1) / blocks;
  g.block = (per + VS_GEMM_BLOCK - 1) / VS_GEMM_BLOCK * VS_GEMM_BLOCK;
  vs_pool_run(dev->pool, (total + g.block - 1) / g.block, gemm_block, &g);
}

void vs_cpu_gemm(vspec_dev *dev, int trans_a, int trans_b, int m, int n, int k, float alpha,
                 const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
  VS_CPU_UNRECORDED(dev, "gemm");
  vs_sgemm(dev, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

int vs_cpu_weight_format(vspec_dev *dev, const float *w, int n_out, int n_in, int format) {
  if (vs_cpu_recording(dev)) vs_cpu_graph_refuse(dev, "weight_format"); /* runs */
  if (!dev || !w || (format != VSPEC_WEIGHTS_INT8 && format != VSPEC_WEIGHTS_DEFAULT))
    return VSPEC_EINVAL;
  int rc = vs_cpu_weights_request_int8(w, n_out, n_in, format == VSPEC_WEIGHTS_INT8 ? 1 : -1);
  if (rc || format == VSPEC_WEIGHTS_DEFAULT) return rc;
  int used = dev->precision == VS_PRECISION_BF16 && dev->amx_int8 && dev->isa == VS_ISA_AVX512;
  return used ? VSPEC_OK : VSPEC_ENOTSUP;
}

void vs_cpu_linear(vspec_dev *dev, const float *x, int m, int n_in, const float *w, int n_out,
                   const float *bias, float *y) {
  if (m <= 0 || n_out <= 0) return;
  /* bf16 precision: the weight's converted copy, on AMX tiles where the device has them
   * (and its ISA was not lowered under it), else widened in fp32 FMAs at every row count
   * (VS_BF16_ROWS_MAX_M: a verify uses a decode step's weights); fp32 for a weight that has
   * no copy (a pointer into an allocation). */
  if (dev->precision == VS_PRECISION_BF16) {
    if (dev->amx && dev->isa == VS_ISA_AVX512) {
      /* a weight its backend asked to keep in int8 (vs_cpu_weight_format); a call whose
       * activations are not finite falls through to bf16 */
      const void *int8 = dev->amx_int8 ? vs_cpu_weights_amx8(w, n_out, n_in) : NULL;
      if (int8 && vs_amx8_linear(dev, x, m, n_in, int8, n_out, bias, y) == 0) return;
      const uint16_t *packed = vs_cpu_weights_amx(w, n_out, n_in);
      if (packed) {
        vs_amx_linear(dev, x, m, n_in, packed, n_out, bias, y);
        return;
      }
    } else if (m <= VS_BF16_ROWS_MAX_M) {
      const uint16_t *rows = vs_cpu_weights_bf16_rows(w, n_out, n_in);
      if (rows) {
        vs_bf16w_linear(dev, x, m, n_in, rows, n_out, bias, y);
        return;
      }
    }
  }
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
