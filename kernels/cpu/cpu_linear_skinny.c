/*
 * kernels/cpu/cpu_linear_skinny.c - c = alpha * a b^T (+ bias) (+ beta c) for few rows of a.
 *
 * Blocking. The kernel walks the rows of b (the weight rows, output columns) in blocks of
 * RB = 4 and, for each block, the rows of a (activations) in blocks of MB; a micro-kernel
 * holds RB x MB vector accumulators and streams the k dimension through them, so every
 * weight element comes from memory once and is used m times from L1 (the 4 weight rows of
 * a block are at most 4 x 8 KiB at the GPT-B shapes; the activations, m x K, sit in L2).
 * The accumulators are reduced horizontally once at the end. When all m rows fit one
 * activation block (decoding: 1 or 2 rows), the block's weight rows are taken one after the
 * other rather than side by side (VS_SKINNY_SEQ), so that the weights are read as one
 * sequential stream.
 *
 * Summation order. Lane l of the accumulator of element (i, j) sums
 * a[i, p] b[j, p] for p = l, l + W, l + 2W, ... in that order (fused multiply-adds, W the
 * vector width; the k tail enters as masked lanes of one more step), then the W lanes are
 * added in a fixed tree. Edge blocks (fewer than RB or MB rows) run the same code with
 * smaller constants, so this order does not depend on where the element sits, on m, or
 * on how the columns are split among threads.
 *
 * Instruction sets: AVX-512 and AVX2 variants are compiled with GCC target attributes and
 * picked at run time (cpu_device.c stores the choice in the device), so the same binary runs
 * on any x86-64; the portable C variant is the fallback and the reference for the others'
 * structure.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_linear_skinny.h"
#include "kernels/cpu/cpu_threads.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define VS_SKINNY_X86 1
#include <immintrin.h>

#include "kernels/cpu/cpu_reduce4.h"
#else
#define VS_SKINNY_X86 0
#endif

/* Thresholds: the largest m that takes the skinny kernel rather than BLIS, per instruction
 * set and per kind of BLIS, chosen from `vspec-bench linear --threads 1 --cpu-time --isa X`
 * (the 61 linear products of a GPT-B forward); the tables are in docs/BENCHMARKS.md, "The
 * skinny kernel against BLIS". With Debian's BLIS on its generic reference kernels
 * (vs_blis_tuned() == 0) the AVX2 and AVX-512 kernels win at every m measured (2x to 6x) and
 * take every m; the scalar loop ties from m = 4 on. With tuned BLIS kernels nothing in BLIS
 * 0.9 beat the AVX-512 kernel up to m = 256, and on its packed path (its small-matrix path is
 * off, cpu_gemm.c) BLIS passed the AVX2 kernel between m = 32 and 48. */
#define VS_SKINNY_MAX_M_AVX512 256
#define VS_SKINNY_MAX_M_AVX2 32
#define VS_SKINNY_MAX_M_SCALAR 4
#define VS_SKINNY_MAX_M_UNLIMITED (1 << 30)

/* Activation bytes per pass over the weights (see skinny_task): half the 1 MiB L2 of the
 * development machine's cores, leaving room for the weight block and c. 170 rows at
 * K = 768, 64 at K = 2048; GPT-B decoding never needs more than one pass. */
#define VS_SKINNY_ROWS_BYTES ((size_t)512 << 10)

/* Weight rows per micro-kernel block, and the column alignment of the per-task chunks:
 * a multiple of the block and of a 64-byte line of c, so threads never share a line. */
#define VS_SKINNY_RB 4

/* Products of at most this many rows take a block's weight rows in sequence
 * (VS_SKINNY_SEQ); larger ones side by side with software prefetch (skinny_cols_tab). */
#define VS_SKINNY_SEQ_MAX_M 2

/* How far ahead the side-by-side blocks prefetch into L2: the weight block this many blocks
 * after the current one (skinny_cols_tab); into L1 they prefetch the next block. */
#define VS_SKINNY_PF_BLOCKS 2
#define VS_SKINNY_CHUNK_ALIGN 16
#define VS_SKINNY_TASKS_PER_THREAD 8

/* Below this much work a product runs on the calling thread: waking a helper costs in
 * the order of 10 us, about what streaming 512 KiB of weights or 1M multiply-adds take on
 * one core. Attention's per-head Q K^T (64-wide rows) stays single-threaded this way. */
#define VS_SKINNY_MT_MIN_WEIGHTS ((double)(128 << 10))
#define VS_SKINNY_MT_MIN_MACS ((double)(1 << 20))

typedef struct skinny_job {
  const float *a, *b, *bias;
  float *c;
  int m, n, k, lda, ldb, ldc;
  float alpha, beta;
  int isa;
  int chunk;     /* columns per task */
  int row_chunk; /* rows of a per pass over the weights */
} skinny_job;

/* Final value of element (i, j) from its dot product s. */
static inline void skinny_store(const skinny_job *jb, float s, int i, int j) {
  float v = jb->alpha * s;
  if (jb->bias) v += jb->bias[j];
  float *cp = jb->c + (size_t)i * jb->ldc + j;
  if (jb->beta != 0.0f) v += jb->beta * *cp;
  *cp = v;
}

/* ---- portable C ------------------------------------------------------------------------ */

/* Eight partial sums per element, the same shape as the vector kernels (and a shape
 * compilers can vectorise without reassociating anything). */
static void skinny_cols_scalar(const skinny_job *jb, int j0, int j1) {
  int k = jb->k;
  for (int j = j0; j < j1; j++) {
    const float *w = jb->b + (size_t)j * jb->ldb;
    for (int i = 0; i < jb->m; i++) {
      const float *x = jb->a + (size_t)i * jb->lda;
      float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int p = 0;
      for (; p + 8 <= k; p += 8)
        for (int t = 0; t < 8; t++) l[t] += w[p + t] * x[p + t];
      for (int t = 0; p + t < k; t++) l[t] += w[p + t] * x[p + t];
      float s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
      skinny_store(jb, s, i, j);
    }
  }
}

#if VS_SKINNY_X86

#define VS_ALWAYS_INLINE static inline __attribute__((always_inline))
#define VS_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,fma")))
#define VS_TARGET_AVX2 __attribute__((target("avx2,fma")))

/* A micro-kernel: c[i .. i+mb, j .. j+rb) for one (rb, mb). Each (rb, mb) is its own
 * non-inlined function (generated below) so that the register allocator sees only that
 * kernel's k loop: inlined into one big driver, GCC ran out of general registers for the
 * row pointers and reloaded them from the stack inside the loop. */
typedef void (*skinny_mk)(const skinny_job *jb, int i, int j, int pr);

/* The micro-kernels of one instruction set, indexed by mb - 1: 1-row (right edge) and
 * RB-row blocks, RB-row blocks that also prefetch 1, 2 or 4 weight rows of a block ahead
 * (pf[0], pf[1], pf[2]; see skinny_cols_tab), and RB-row blocks that take their rows in
 * sequence (VS_SKINNY_SEQ). */
typedef struct skinny_kernels {
  const skinny_mk *rows1, *rows4, *rows4_pf[3], *rows4_seq;
  int mb; /* activation rows per block */
} skinny_kernels;

/* Final values of c[i, j .. j+n) (n = 4, or 1 at the right edge) from their dot products
 * in s. Lane-wise the same operations as skinny_store, so edge and interior elements
 * agree. */
VS_ALWAYS_INLINE void skinny_store4(const skinny_job *jb, __m128 s, int i, int j, const int n) {
  float *cp = jb->c + (size_t)i * jb->ldc + j;
  __m128 v = _mm_mul_ps(_mm_set1_ps(jb->alpha), s);
  if (jb->bias) v = _mm_add_ps(v, n == 4 ? _mm_loadu_ps(jb->bias + j) : _mm_load_ss(jb->bias + j));
  if (jb->beta != 0.0f)
    v = _mm_add_ps(v, _mm_mul_ps(_mm_set1_ps(jb->beta), n == 4 ? _mm_loadu_ps(cp) : _mm_load_ss(cp)));
  if (n == 4)
    _mm_storeu_ps(cp, v);
  else
    _mm_store_ss(cp, v);
}

/* Walks weight rows [j0, j1) in blocks of RB (edge: single rows) and, per block, all
 * activation rows in blocks of ks->mb (edge: the rest).
 *
 * Up to VS_SKINNY_SEQ_MAX_M rows (decoding: 1 row, or 2 with CFG) the block's weight rows are
 * taken one after the other (VS_SKINNY_SEQ): one sequential stream, which the hardware
 * prefetcher keeps up with, made the GPT-B products at m = 1 and 2 about 1.3x faster than four
 * rows side by side on the Zen 4 development machine, 1.8x with huge pages (cpu_dev.c).
 *
 * Larger products are compute-heavy enough that what matters is keeping memory busy while
 * the FMAs run: the blocks go side by side (4 weight rows x mb activation rows, the most reuse
 * per load) and every pass over the block prefetches a share of the weight block
 * VS_SKINNY_PF_BLOCKS blocks ahead into L2 (_MM_HINT_T2), and the same share of the next
 * block from there into L1: with P passes (activation blocks) pass q takes rows
 * q npf .. (q + 1) npf - 1, npf = 4, 2 or 1 as P is 1, 2-3 or more, so the requests spread
 * evenly over the block's compute instead of bunching in its first pass. Prefetching only the
 * next block into L1 and only in the first pass, as before, left memory idle during the other
 * passes and ran into the L1's few outstanding misses: on the Zen 4 machine the GPT-B products
 * at m = 4 / 8 / 16 went from 34-39 / 36 / 46 ms to 19 / 25 / 38 ms with the L2 prefetch, to
 * 35 ms at m = 16 with the L1 one added (docs/BENCHMARKS.md, issue 33 item 4). Every element
 * sees the same operations in the same order in every kernel, so the choice of path changes
 * no bits. */
static void skinny_cols_tab(const skinny_job *jb, int j0, int j1, const skinny_kernels *ks) {
  const int m = jb->m, mb = ks->mb;
  const int passes = (m + mb - 1) / mb;
  /* rows of the block ahead per pass, and the index of its kernels in rows4_pf */
  const int npf = passes >= 4 ? 1 : passes >= 2 ? 2 : 4;
  const int pf_index = passes >= 4 ? 0 : passes >= 2 ? 1 : 2;
  for (int j = j0; j < j1;) {
    if (j1 - j >= VS_SKINNY_RB) {
      if (m <= VS_SKINNY_SEQ_MAX_M && m <= mb) {
        ks->rows4_seq[m - 1](jb, 0, j, 0);
      } else {
        for (int i = 0, q = 0; i < m; i += mb, q++) {
          const int rows = m - i < mb ? m - i : mb;
          if (q * npf < VS_SKINNY_RB)
            ks->rows4_pf[pf_index][rows - 1](jb, i, j, q * npf);
          else
            ks->rows4[rows - 1](jb, i, j, 0);
        }
      }
      j += VS_SKINNY_RB;
    } else {
      for (int i = 0; i < m; i += mb) ks->rows1[(m - i < mb ? m - i : mb) - 1](jb, i, j, 0);
      j++;
    }
  }
}

/* One k step of the rb x mb micro-kernel: rb weight vectors, then per activation row one
 * vector and rb fused multiply-adds; with pf, prefetches of the same offset in pf rows (from
 * row pr) of the weight block VS_SKINNY_PF_BLOCKS ahead into L2 and of the next block into L1
 * (skinny_cols_tab). LOAD is a plain or a masked load. The unroll pragmas
 * turn the loops over the compile-time rb/mb into straight code, so acc lives in
 * registers (checked in the generated assembly: no spills in the k loop). */
#define VS_SKINNY_STEP(VEC, FMADD, LOAD)                                                \
  do {                                                                                  \
    VEC w_[VS_SKINNY_RB];                                                               \
    _Pragma("GCC unroll 8") for (int r = 0; r < pf; r++) {                              \
      _mm_prefetch((const char *)(b + (VS_SKINNY_PF_BLOCKS * VS_SKINNY_RB + pr + r) * ldb + p), \
                   _MM_HINT_T2);                                                        \
      _mm_prefetch((const char *)(b + (VS_SKINNY_RB + pr + r) * ldb + p), _MM_HINT_T0); \
    }                                                                                   \
    _Pragma("GCC unroll 8") for (int r = 0; r < rb; r++) w_[r] = LOAD(b + r * ldb + p); \
    _Pragma("GCC unroll 8") for (int q = 0; q < mb; q++) {                              \
      VEC x_ = LOAD(a + q * lda + p);                                                   \
      _Pragma("GCC unroll 8") for (int r = 0; r < rb; r++) acc[r][q] =                  \
          FMADD(w_[r], x_, acc[r][q]);                                                  \
    }                                                                                   \
  } while (0)

/* VS_SKINNY_STEP with the loops turned round, for register files too small for rb weight
 * vectors beside rb x mb accumulators (AVX2 at mb = 3: 12 + 4 + 1 > 16): mb activation
 * vectors, then per weight row one vector and mb fused multiply-adds. Each accumulator gets
 * the same one multiply-add per step, so the bits are the same. */
#define VS_SKINNY_STEP_XW(VEC, FMADD, LOAD)                                             \
  do {                                                                                  \
    VEC x_[VS_SKINNY_MB_MAX];                                                           \
    _Pragma("GCC unroll 8") for (int r = 0; r < pf; r++) {                              \
      _mm_prefetch((const char *)(b + (VS_SKINNY_PF_BLOCKS * VS_SKINNY_RB + pr + r) * ldb + p), \
                   _MM_HINT_T2);                                                        \
      _mm_prefetch((const char *)(b + (VS_SKINNY_RB + pr + r) * ldb + p), _MM_HINT_T0); \
    }                                                                                   \
    _Pragma("GCC unroll 8") for (int q = 0; q < mb; q++) x_[q] = LOAD(a + q * lda + p); \
    _Pragma("GCC unroll 8") for (int r = 0; r < rb; r++) {                              \
      VEC w_ = LOAD(b + r * ldb + p);                                                   \
      _Pragma("GCC unroll 8") for (int q = 0; q < mb; q++) acc[r][q] =                  \
          FMADD(w_, x_[q], acc[r][q]);                                                  \
    }                                                                                   \
  } while (0)
#define VS_SKINNY_MB_MAX 4

/* The rb x mb micro-kernel with the weight rows taken one after the other instead of side
 * by side: row r's whole k loop (one weight vector, then per activation row one vector and
 * one fused multiply-add into acc[r][q]), then row r + 1's. Every accumulator sees the same
 * operations in the same order as in VS_SKINNY_STEP, so the bits are the same; only the
 * order of the memory reads changes: the block's rows, adjacent in memory, are read as one
 * sequential stream. That is what the hardware prefetcher keeps up with: on the AMD EPYC
 * (Zen 4) development machine four side-by-side rows of 3-8 KiB streamed at 13-19 GB/s, the
 * same rows in sequence at 25-31 GB/s, a plain read at 30-33 GB/s (docs/BENCHMARKS.md, issue
 * 33 item 4). LOADM is the masked load of the k tail (its mask set up by TAIL_SETUP). */
#define VS_SKINNY_SEQ(VEC, FMADD, LOAD, LOADM, W, TAIL_SETUP)                            \
  _Pragma("GCC unroll 8") for (int r = 0; r < rb; r++) {                                \
    const float *wr_ = b + r * ldb;                                                     \
    int p = 0;                                                                          \
    for (; p + (W) <= k; p += (W)) {                                                    \
      VEC w_ = LOAD(wr_ + p);                                                           \
      _Pragma("GCC unroll 8") for (int q = 0; q < mb; q++) acc[r][q] =                  \
          FMADD(w_, LOAD(a + q * lda + p), acc[r][q]);                                  \
    }                                                                                   \
    if (p < k) {                                                                        \
      TAIL_SETUP;                                                                       \
      VEC w_ = LOADM(wr_ + p);                                                          \
      _Pragma("GCC unroll 8") for (int q = 0; q < mb; q++) acc[r][q] =                  \
          FMADD(w_, LOADM(a + q * lda + p), acc[r][q]);                                 \
    }                                                                                   \
  }

/* ---- AVX-512 ------------------------------------------------------------------------- */

/* Activation rows per block: 4 x 4 accumulators + 4 weight vectors + 1 activation vector
 * = 21 of 32 registers. 4 x 6 (29 registers) measured the same within the noise of the
 * shared development machine, 4 x 8 slower (it runs out of general registers for the row
 * pointers); 4 divides the row counts trees and CFG produce (2, 4, 8, ...). */
#define VS512_MB 4

#define VS512_LOAD(ptr) _mm512_loadu_ps(ptr)
#define VS512_LOADM(ptr) _mm512_maskz_loadu_ps(tail, ptr)

/* VS_SKINNY_SEQ on 256-bit halves: lanes 0-7 and 8-15 of each accumulator in two ymm
 * registers, every lane the same fused multiply-adds in the same order as in a zmm (the tail
 * too: masked-off lanes load 0), so the bits are those of the AVX-512 kernel. Why: on the Zen 4
 * development machine 256-bit loads streamed faster than 512-bit ones (docs/BENCHMARKS.md,
 * issue 33 item 4). */
VS_ALWAYS_INLINE VS_TARGET_AVX512 void seq512_halves(const float *a, size_t lda, const float *b,
                                                     size_t ldb, int k, const int rb,
                                                     const int mb,
                                                     __m512 acc[VS_SKINNY_RB][VS512_MB]) {
  _Pragma("GCC unroll 8") for (int r = 0; r < rb; r++) {
    const float *wr = b + r * ldb;
    __m256 lo[VS512_MB], hi[VS512_MB];
    _Pragma("GCC unroll 8") for (int q = 0; q < mb; q++) lo[q] = hi[q] = _mm256_setzero_ps();
    int p = 0;
    for (; p + 16 <= k; p += 16) {
      __m256 wl = _mm256_loadu_ps(wr + p), wh = _mm256_loadu_ps(wr + p + 8);
      _Pragma("GCC unroll 8") for (int q = 0; q < mb; q++) {
        lo[q] = _mm256_fmadd_ps(wl, _mm256_loadu_ps(a + q * lda + p), lo[q]);
        hi[q] = _mm256_fmadd_ps(wh, _mm256_loadu_ps(a + q * lda + p + 8), hi[q]);
      }
    }
    if (p < k) {
      const __mmask16 tail = (__mmask16)((1u << (k - p)) - 1u);
      const __mmask8 tl = (__mmask8)tail, th = (__mmask8)(tail >> 8);
      __m256 wl = _mm256_maskz_loadu_ps(tl, wr + p), wh = _mm256_maskz_loadu_ps(th, wr + p + 8);
      _Pragma("GCC unroll 8") for (int q = 0; q < mb; q++) {
        lo[q] = _mm256_fmadd_ps(wl, _mm256_maskz_loadu_ps(tl, a + q * lda + p), lo[q]);
        hi[q] = _mm256_fmadd_ps(wh, _mm256_maskz_loadu_ps(th, a + q * lda + p + 8), hi[q]);
      }
    }
    _Pragma("GCC unroll 8") for (int q = 0; q < mb; q++) acc[r][q] =
        _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo[q])),
                                            _mm256_castps_pd(hi[q]), 1));
  }
}

/* pf: how many rows (from row pr) of the block ahead to prefetch (VS_SKINNY_STEP); seq: the
 * rows in sequence (VS_SKINNY_SEQ). */
VS_ALWAYS_INLINE VS_TARGET_AVX512 void mk_avx512(const skinny_job *jb, int i, int j, int pr,
                                                 const int rb, const int mb, const int pf,
                                                 const int seq) {
  const float *a = jb->a + (size_t)i * jb->lda, *b = jb->b + (size_t)j * jb->ldb;
  const size_t lda = (size_t)jb->lda, ldb = (size_t)jb->ldb;
  const int k = jb->k;
  __m512 acc[VS_SKINNY_RB][VS512_MB];
  _Pragma("GCC unroll 8") for (int r = 0; r < rb; r++)
  _Pragma("GCC unroll 8") for (int q = 0; q < mb; q++) acc[r][q] = _mm512_setzero_ps();
  if (seq) {
    seq512_halves(a, lda, b, ldb, k, rb, mb, acc);
  } else {
    int p = 0;
    for (; p + 16 <= k; p += 16) VS_SKINNY_STEP(__m512, _mm512_fmadd_ps, VS512_LOAD);
    if (p < k) {
      /* Masked-off lanes load as 0 (and fault-free past the end of a row): 0 * 0 + acc. */
      const __mmask16 tail = (__mmask16)((1u << (k - p)) - 1u);
      VS_SKINNY_STEP(__m512, _mm512_fmadd_ps, VS512_LOADM);
    }
  }
  /* rb is 4 or 1; for 1 the index expressions keep to acc[0] */
  _Pragma("GCC unroll 8") for (int q = 0; q < mb; q++)
      skinny_store4(jb,
                    vs_reduce4_512(acc[0][q], acc[rb > 1 ? 1 : 0][q], acc[rb > 2 ? 2 : 0][q],
                                  acc[rb > 3 ? 3 : 0][q]),
                    i + q, j, rb);
}

#define VS512_DEF(NAME, RB, MB, PF, SEQ)                                                     \
  __attribute__((noinline)) VS_TARGET_AVX512 static void NAME(const skinny_job *jb, int i, int j, \
                                                              int pr) {                       \
    mk_avx512(jb, i, j, pr, RB, MB, PF, SEQ);                                                 \
  }
VS512_DEF(mk512_1x1, 1, 1, 0, 0) VS512_DEF(mk512_1x2, 1, 2, 0, 0)
VS512_DEF(mk512_1x3, 1, 3, 0, 0) VS512_DEF(mk512_1x4, 1, 4, 0, 0)
VS512_DEF(mk512_4x1, 4, 1, 0, 0) VS512_DEF(mk512_4x2, 4, 2, 0, 0)
VS512_DEF(mk512_4x3, 4, 3, 0, 0) VS512_DEF(mk512_4x4, 4, 4, 0, 0)
VS512_DEF(mk512_4x1_pf1, 4, 1, 1, 0) VS512_DEF(mk512_4x2_pf1, 4, 2, 1, 0)
VS512_DEF(mk512_4x3_pf1, 4, 3, 1, 0) VS512_DEF(mk512_4x4_pf1, 4, 4, 1, 0)
VS512_DEF(mk512_4x1_pf2, 4, 1, 2, 0) VS512_DEF(mk512_4x2_pf2, 4, 2, 2, 0)
VS512_DEF(mk512_4x3_pf2, 4, 3, 2, 0) VS512_DEF(mk512_4x4_pf2, 4, 4, 2, 0)
VS512_DEF(mk512_4x1_pf4, 4, 1, 4, 0) VS512_DEF(mk512_4x2_pf4, 4, 2, 4, 0)
VS512_DEF(mk512_4x3_pf4, 4, 3, 4, 0) VS512_DEF(mk512_4x4_pf4, 4, 4, 4, 0)
VS512_DEF(mk512_4x1_seq, 4, 1, 0, 1) VS512_DEF(mk512_4x2_seq, 4, 2, 0, 1)
VS512_DEF(mk512_4x3_seq, 4, 3, 0, 1) VS512_DEF(mk512_4x4_seq, 4, 4, 0, 1)

static const skinny_mk mk512_rows1[VS512_MB] = {mk512_1x1, mk512_1x2, mk512_1x3, mk512_1x4};
static const skinny_mk mk512_rows4[VS512_MB] = {mk512_4x1, mk512_4x2, mk512_4x3, mk512_4x4};
static const skinny_mk mk512_rows4_pf1[VS512_MB] = {mk512_4x1_pf1, mk512_4x2_pf1, mk512_4x3_pf1,
                                                    mk512_4x4_pf1};
static const skinny_mk mk512_rows4_pf2[VS512_MB] = {mk512_4x1_pf2, mk512_4x2_pf2, mk512_4x3_pf2,
                                                    mk512_4x4_pf2};
static const skinny_mk mk512_rows4_pf4[VS512_MB] = {mk512_4x1_pf4, mk512_4x2_pf4, mk512_4x3_pf4,
                                                    mk512_4x4_pf4};
static const skinny_mk mk512_rows4_seq[VS512_MB] = {mk512_4x1_seq, mk512_4x2_seq, mk512_4x3_seq,
                                                    mk512_4x4_seq};
static const skinny_kernels vs512_kernels = {
    mk512_rows1, mk512_rows4, {mk512_rows4_pf1, mk512_rows4_pf2, mk512_rows4_pf4}, mk512_rows4_seq,
    VS512_MB};

/* ---- AVX2 ------------------------------------------------------------------------------ */

/* 16 ymm registers: 4 x 3 accumulators + 3 activation vectors + 1 weight vector, with the
 * loops of a k step turned round (VS_SKINNY_STEP_XW; the plain order would need 17 and
 * spill, as it does in the one masked tail step). Against 4 x 2 blocks on the Zen 4 machine
 * the GPT-B products at m = 12 / 16 / 64 went from 37 / 48 / 182 ms to 28 / 37 / 133 (12
 * accumulators hide the FMA latency that 8 only just cover), m = 3-4 within the noise. */
#define VS256_MB 3

/* _mm256_maskload_ps takes a lane mask of int32 sign bits: a window into this table. */
static const int32_t vs256_tail_mask[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                            0,  0,  0,  0,  0,  0,  0,  0};

#define VS256_LOAD(ptr) _mm256_loadu_ps(ptr)
#define VS256_LOADM(ptr) _mm256_maskload_ps(ptr, tail)

VS_ALWAYS_INLINE VS_TARGET_AVX2 void mk_avx2(const skinny_job *jb, int i, int j, int pr,
                                             const int rb, const int mb, const int pf,
                                             const int seq) {
  const float *a = jb->a + (size_t)i * jb->lda, *b = jb->b + (size_t)j * jb->ldb;
  const size_t lda = (size_t)jb->lda, ldb = (size_t)jb->ldb;
  const int k = jb->k;
  __m256 acc[VS_SKINNY_RB][VS256_MB];
  _Pragma("GCC unroll 8") for (int r = 0; r < rb; r++)
  _Pragma("GCC unroll 8") for (int q = 0; q < mb; q++) acc[r][q] = _mm256_setzero_ps();
  if (seq) {
    VS_SKINNY_SEQ(__m256, _mm256_fmadd_ps, VS256_LOAD, VS256_LOADM, 8,
                  const __m256i tail =
                      _mm256_loadu_si256((const __m256i *)(vs256_tail_mask + 8 - (k - p))))
  } else {
    int p = 0;
    if (mb == 3) {
      for (; p + 8 <= k; p += 8) VS_SKINNY_STEP_XW(__m256, _mm256_fmadd_ps, VS256_LOAD);
    } else {
      for (; p + 8 <= k; p += 8) VS_SKINNY_STEP(__m256, _mm256_fmadd_ps, VS256_LOAD);
    }
    if (p < k) {
      const __m256i tail = _mm256_loadu_si256((const __m256i *)(vs256_tail_mask + 8 - (k - p)));
      VS_SKINNY_STEP(__m256, _mm256_fmadd_ps, VS256_LOADM);
    }
  }
  _Pragma("GCC unroll 8") for (int q = 0; q < mb; q++)
      skinny_store4(jb,
                    vs_reduce4_256(acc[0][q], acc[rb > 1 ? 1 : 0][q], acc[rb > 2 ? 2 : 0][q],
                                  acc[rb > 3 ? 3 : 0][q]),
                    i + q, j, rb);
}

#define VS256_DEF(NAME, RB, MB, PF, SEQ)                                                     \
  __attribute__((noinline)) VS_TARGET_AVX2 static void NAME(const skinny_job *jb, int i, int j, \
                                                            int pr) {                         \
    mk_avx2(jb, i, j, pr, RB, MB, PF, SEQ);                                                   \
  }
VS256_DEF(mk256_1x1, 1, 1, 0, 0) VS256_DEF(mk256_1x2, 1, 2, 0, 0) VS256_DEF(mk256_1x3, 1, 3, 0, 0)
VS256_DEF(mk256_4x1, 4, 1, 0, 0) VS256_DEF(mk256_4x2, 4, 2, 0, 0) VS256_DEF(mk256_4x3, 4, 3, 0, 0)
VS256_DEF(mk256_4x1_pf1, 4, 1, 1, 0) VS256_DEF(mk256_4x2_pf1, 4, 2, 1, 0)
VS256_DEF(mk256_4x3_pf1, 4, 3, 1, 0)
VS256_DEF(mk256_4x1_pf2, 4, 1, 2, 0) VS256_DEF(mk256_4x2_pf2, 4, 2, 2, 0)
VS256_DEF(mk256_4x3_pf2, 4, 3, 2, 0)
VS256_DEF(mk256_4x1_pf4, 4, 1, 4, 0) VS256_DEF(mk256_4x2_pf4, 4, 2, 4, 0)
VS256_DEF(mk256_4x3_pf4, 4, 3, 4, 0)
VS256_DEF(mk256_4x1_seq, 4, 1, 0, 1) VS256_DEF(mk256_4x2_seq, 4, 2, 0, 1)
VS256_DEF(mk256_4x3_seq, 4, 3, 0, 1)

static const skinny_mk mk256_rows1[VS256_MB] = {mk256_1x1, mk256_1x2, mk256_1x3};
static const skinny_mk mk256_rows4[VS256_MB] = {mk256_4x1, mk256_4x2, mk256_4x3};
static const skinny_mk mk256_rows4_pf1[VS256_MB] = {mk256_4x1_pf1, mk256_4x2_pf1, mk256_4x3_pf1};
static const skinny_mk mk256_rows4_pf2[VS256_MB] = {mk256_4x1_pf2, mk256_4x2_pf2, mk256_4x3_pf2};
static const skinny_mk mk256_rows4_pf4[VS256_MB] = {mk256_4x1_pf4, mk256_4x2_pf4, mk256_4x3_pf4};
static const skinny_mk mk256_rows4_seq[VS256_MB] = {mk256_4x1_seq, mk256_4x2_seq, mk256_4x3_seq};
static const skinny_kernels vs256_kernels = {
    mk256_rows1, mk256_rows4, {mk256_rows4_pf1, mk256_rows4_pf2, mk256_rows4_pf4}, mk256_rows4_seq,
    VS256_MB};

#endif /* VS_SKINNY_X86 */

/* ---- dispatch ------------------------------------------------------------------------ */

int vs_skinny_max_m(int isa, int blis_tuned) {
  switch (isa) {
    case VS_ISA_AVX512: return blis_tuned ? VS_SKINNY_MAX_M_AVX512 : VS_SKINNY_MAX_M_UNLIMITED;
    case VS_ISA_AVX2: return blis_tuned ? VS_SKINNY_MAX_M_AVX2 : VS_SKINNY_MAX_M_UNLIMITED;
    default: return VS_SKINNY_MAX_M_SCALAR;
  }
}

static void skinny_cols(const skinny_job *jb, int j0, int j1) {
  switch (jb->isa) {
#if VS_SKINNY_X86
    case VS_ISA_AVX512: skinny_cols_tab(jb, j0, j1, &vs512_kernels); break;
    case VS_ISA_AVX2: skinny_cols_tab(jb, j0, j1, &vs256_kernels); break;
#endif
    default: skinny_cols_scalar(jb, j0, j1); break;
  }
}

static void skinny_task(void *ctx, int task) {
  const skinny_job *jb = ctx;
  int j0 = task * jb->chunk;
  if (j0 >= jb->n) return;
  int j1 = jb->n - j0 > jb->chunk ? j0 + jb->chunk : jb->n;
  if (jb->m <= jb->row_chunk) {
    skinny_cols(jb, j0, j1);
    return;
  }
  /* Many rows: a slice of rows at a time, so that the activations stay in L2 while the
   * weights stream past (each slice streams them once more). */
  for (int i0 = 0; i0 < jb->m; i0 += jb->row_chunk) {
    skinny_job sub = *jb;
    sub.a += (size_t)i0 * jb->lda;
    sub.c += (size_t)i0 * jb->ldc;
    sub.m = jb->m - i0 < jb->row_chunk ? jb->m - i0 : jb->row_chunk;
    skinny_cols(&sub, j0, j1);
  }
}

void vs_skinny_nt(vspec_dev *dev, int m, int n, int k, float alpha, const float *a, int lda,
                  const float *b, int ldb, const float *bias, float beta, float *c, int ldc) {
  if (m <= 0 || n <= 0) return;
  if (k < 0) k = 0;
  skinny_job jb = {.a = a, .b = b, .bias = bias, .c = c, .m = m, .n = n, .k = k, .lda = lda,
                   .ldb = ldb, .ldc = ldc, .alpha = alpha, .beta = beta, .isa = dev->isa,
                   .chunk = n};
  jb.row_chunk = (int)(VS_SKINNY_ROWS_BYTES / ((size_t)k * sizeof(float) + 1)) / 8 * 8;
  if (jb.row_chunk < 8) jb.row_chunk = 8;
  int tasks = 1, threads = vs_pool_threads(dev->pool);
  if (threads > 1 &&
      ((double)n * k >= VS_SKINNY_MT_MIN_WEIGHTS || (double)m * n * k >= VS_SKINNY_MT_MIN_MACS)) {
    /* Contiguous column chunks, a multiple of VS_SKINNY_CHUNK_ALIGN, about
     * VS_SKINNY_TASKS_PER_THREAD per thread so that a thread slowed down by another
     * process on its core leaves its later chunks to the others. */
    int want = threads * VS_SKINNY_TASKS_PER_THREAD;
    int chunk = (n + want - 1) / want;
    chunk = (chunk + VS_SKINNY_CHUNK_ALIGN - 1) / VS_SKINNY_CHUNK_ALIGN * VS_SKINNY_CHUNK_ALIGN;
    jb.chunk = chunk;
    tasks = (n + chunk - 1) / chunk;
  }
  vs_pool_run(dev->pool, tasks, skinny_task, &jb);
}
