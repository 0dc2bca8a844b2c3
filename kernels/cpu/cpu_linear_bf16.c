/*
 * kernels/cpu/cpu_linear_bf16.c - bf16 weights, fp32 activations (see cpu_linear_bf16.h).
 *
 * Blocking: four weight rows at a time, each activation row against them with four vector
 * accumulators, so every weight element is read from memory once and, for the other rows of
 * a CFG pair or a tree, from L1 (four rows of k bf16 are 6 KiB at k = 768). The weights come in
 * the pair-interleaved layout of vs_bf16_pack (cpu_linear_bf16.h). Products of one or two
 * rows (decoding) read a block as one stream; larger ones (verification) go over it once per
 * block of activation rows, prefetching ahead and reusing the first pass's widened weights
 * (bf16_rows). Every output element gets the same operations in the same order in every
 * block shape, so row i of an m-row product is the 1-row product of row i, bit for bit
 * (tests/test_linear_bf16.c).
 */
#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_linear_bf16.h"
#include "kernels/cpu/cpu_linear_skinny.h"
#include "kernels/cpu/cpu_threads.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define VS_BF16_X86 1
#include <immintrin.h>

#include "kernels/cpu/cpu_reduce4.h"
#else
#define VS_BF16_X86 0
#endif

#define VS_BF16_RB 4 /* weight rows per block */
/* Products of at most this many rows take a block's two pairs one after the other (seq in
 * bf16_block_512); larger ones side by side with software prefetch (bf16_rows). */
#define VS_BF16_SEQ_MAX_M 2
/* The side-by-side blocks prefetch the weight block this many blocks ahead (bf16_rows). */
#define VS_BF16_PF_BLOCKS 2
/* The longest rows whose widened copy bf16_rows keeps on the stack (4 rows: 64 KiB). */
#define VS_BF16_BUF_MAX_K 4096
/* A task streams at least this many weight bytes; fewer do not pay for a helper's wake-up
 * (the same reasoning as the AMX kernel's split, cpu_linear_amx.c). */
#define VS_BF16_TASK_MIN_BYTES ((size_t)256 << 10)
#define VS_BF16_TASKS_PER_THREAD 4

typedef struct bf16_job {
  const float *x, *bias;
  const uint16_t *w;
  float *y;
  int m, n, k, rows_per_task;
} bf16_job;

static void bf16_store(const bf16_job *jb, int i, int j, float s) {
  jb->y[(size_t)i * jb->n + j] = s + (jb->bias ? jb->bias[j] : 0.0f);
}

/* Where row j lies in the pair-interleaved layout (cpu_linear_bf16.h): its first 16-column
 * chunk, the step from one chunk to the next (32 in a pair, 16 for an unpaired last row), and
 * its k - k16 tail columns. */
typedef struct bf16_row {
  const uint16_t *v, *t;
  int cs;
} bf16_row;

/* Offset of element (j, p) of an n x k weight in the layout. */
static inline size_t bf16_index(int n, int k, int j, int p) {
  const int k16 = k & ~15;
  if (j >= (n & ~1)) return (size_t)j * k + p;
  size_t pair = (size_t)(j & ~1) * k;
  if (p < k16) return pair + (size_t)(p >> 4) * 32 + 16 * (size_t)(j & 1) + (p & 15);
  return pair + 2 * (size_t)k16 + (size_t)(j & 1) * (k - k16) + (p - k16);
}

static inline bf16_row bf16_row_at(const bf16_job *jb, int j) {
  const int n = jb->n, k = jb->k;
  return (bf16_row){jb->w + bf16_index(n, k, j, 0), jb->w + bf16_index(n, k, j, k & ~15),
                    j < (n & ~1) ? 32 : 16};
}

/* Row r's columns p .. p+7 (p a multiple of 8): within one chunk below k16, else in the tail. */
static inline const uint16_t *bf16_at(bf16_row r, int k16, int p) {
  return p < k16 ? r.v + (size_t)(p >> 4) * r.cs + (p & 15) : r.t + (p - k16);
}

void vs_bf16_pack(const float *w, int n, int k, uint16_t *out) {
  const int k16 = k & ~15;
  for (int j = 0; j < n; j++) {
    const float *src = w + (size_t)j * k;
    uint16_t *v = out + bf16_index(n, k, j, 0), *t = out + bf16_index(n, k, j, k16);
    const size_t cs = j < (n & ~1) ? 32 : 16;
    for (int p = 0; p < k16; p++) v[(size_t)(p >> 4) * cs + (p & 15)] = vs_f32_to_bf16(src[p]);
    for (int p = k16; p < k; p++) t[p - k16] = vs_f32_to_bf16(src[p]);
  }
}

/* The k tail past the vector loop (columns p0 .., all past k16), in order, added after the
 * lanes. */
static float bf16_tail(const float *x, bf16_row w, int k16, int p0, int k) {
  float t = 0.0f;
  for (int p = p0; p < k; p++) t += x[p] * vs_bf16_to_f32(w.t[p - k16]);
  return t;
}

/* ---- portable C: eight partial sums (lane p mod 8), added in a fixed tree ---------------- */
static void bf16_rows_scalar(const bf16_job *jb, int j0, int j1) {
  const int k = jb->k, kv = k / 8 * 8, k16 = k & ~15;
  for (int j = j0; j < j1; j++) {
    const bf16_row w = bf16_row_at(jb, j);
    for (int i = 0; i < jb->m; i++) {
      const float *x = jb->x + (size_t)i * k;
      float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int p = 0; p < kv; p += 8) {
        const uint16_t *wp = bf16_at(w, k16, p);
        for (int t = 0; t < 8; t++) l[t] += x[p + t] * vs_bf16_to_f32(wp[t]);
      }
      float s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
      bf16_store(jb, i, j, s + bf16_tail(x, w, k16, kv, k));
    }
  }
}

#if VS_BF16_X86
/* One k step at column P of rows [R0, R1) side by side: each weight vector (WP(r): row r's
 * columns at P) widened once and used for all mb activation rows. With bm = 1 the widened
 * vectors also go to the block's fp32 copy (BF16_BUF, bf16_rows), with bm = 2 they come from
 * it (WIDEN then a plain load): the same values either way. */
#define BF16_STEP(VEC, WIDEN, LOADX, FMADD, R0, R1, WP, P)                                   \
  do {                                                                                       \
    if (xw) {                                                                                \
      BF16_STEP_XW(VEC, WIDEN, LOADX, FMADD, R0, R1, WP, P);                                 \
      break;                                                                                 \
    }                                                                                        \
    VEC wv_[VS_BF16_RB];                                                                     \
    _Pragma("GCC unroll 4") for (int r = (R0); r < (R1); r++) wv_[r] = WIDEN(WP(r));         \
    if (bm == 1) _Pragma("GCC unroll 4") for (int r = (R0); r < (R1); r++)                   \
      STOREW(BF16_BUF(r, P), wv_[r]);                                                        \
    _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++) {                                   \
      VEC xv_ = LOADX(x + (size_t)q * k + (P));                                              \
      _Pragma("GCC unroll 4") for (int r = (R0); r < (R1); r++) acc[r][q] =                  \
          FMADD(wv_[r], xv_, acc[r][q]);                                                     \
    }                                                                                        \
  } while (0)

/* BF16_STEP with its loops turned round, for xw (AVX2 at mb = 3: 12 accumulators, 3
 * activation vectors and 1 weight vector fill the 16 registers, where the plain order needs
 * 4 weight vectors): each accumulator gets the same multiply-add, so the same bits. */
#define BF16_STEP_XW(VEC, WIDEN, LOADX, FMADD, R0, R1, WP, P)                                \
  do {                                                                                       \
    VEC xv_[4];                                                                              \
    _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++) xv_[q] =                            \
        LOADX(x + (size_t)q * k + (P));                                                      \
    _Pragma("GCC unroll 4") for (int r = (R0); r < (R1); r++) {                              \
      VEC wv_ = WIDEN(WP(r));                                                                \
      if (bm == 1) STOREW(BF16_BUF(r, P), wv_);                                              \
      _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++) acc[r][q] =                       \
          FMADD(wv_, xv_[q], acc[r][q]);                                                     \
    }                                                                                        \
  } while (0)

/* The prefetch of one k step at column P: pf / 4 of the weight block VS_BF16_PF_BLOCKS ahead
 * (pfw), from its row pr on, spread over the pass's k steps (bf16_rows). The block is 4 k
 * contiguous elements in the pair layout; the share of pf rows is taken as ceil(pf / 2) runs
 * of 2 k elements advancing 2 P, or for pf = 1 one run of k advancing P, so each step asks for
 * one line per run (some lines twice). */
#define BF16_PF(P)                                                                             \
  _Pragma("GCC unroll 2") for (int t_ = 0; t_ < (pf + 1) / 2; t_++)                            \
      _mm_prefetch((const char *)(pfw + (size_t)(pr + 2 * t_) * k + (pf > 1 ? 2 * (P) : (P))), \
                   _MM_HINT_T2)

/* Row r's columns at p, within a chunk, and its tail columns. */
#define BF16_AT(r) (w[r].v + (size_t)(p >> 4) * w[r].cs + (p & 15))
#define BF16_TAIL(r) (w[r].t)
/* Row r's widened columns at P in the block's fp32 copy: per k step the four rows' vectors
 * one after the other (VL floats each). */
#define BF16_BUF(r, P) (buf + (size_t)(P) * VS_BF16_RB + (r) * VL)
#define BF16_BUF_AT(r) BF16_BUF(r, p)

/* ---- AVX-512 ----------------------------------------------------------------------------- */
__attribute__((target("avx512f"))) static inline __m512 widen16(const uint16_t *p) {
  __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

/* rb weight rows (4 or 1) from j against mb activation rows from i: each weight vector is
 * widened once per k step and used for all mb rows. rb and mb are compile-time constants in
 * each instance below, and the unroll pragmas turn the loops over them into straight code, so
 * the rb x mb accumulators stay in registers. With seq (four rows, all activation rows in
 * this block, so the weights come from memory once) the block's two pairs go one after the
 * other, each pair's rows side by side: one sequential stream with two independent chains of
 * multiply-adds (see cpu_linear_bf16.h). Every accumulator sees the same operations in the
 * same order either way. */
/* y[i, j .. j+3] from the dot products s of four weight rows: lane-wise the operations of
 * bf16_store on s + bf16_tail (a tail of no columns adds 0.0f, as there). */
static inline __attribute__((always_inline)) void bf16_store4(const bf16_job *jb, int i, int j,
                                                              __m128 s, const float *x,
                                                              const bf16_row *w, int k16, int kv) {
  const int k = jb->k;
  __m128 t = _mm_setzero_ps();
  if (kv < k)
    t = _mm_setr_ps(bf16_tail(x, w[0], k16, kv, k), bf16_tail(x, w[1], k16, kv, k),
                    bf16_tail(x, w[2], k16, kv, k), bf16_tail(x, w[3], k16, kv, k));
  s = _mm_add_ps(s, t);
  s = _mm_add_ps(s, jb->bias ? _mm_loadu_ps(jb->bias + j) : _mm_setzero_ps());
  _mm_storeu_ps(jb->y + (size_t)i * jb->n + j, s);
}

static inline __attribute__((always_inline, target("avx512f,fma"))) void
bf16_block_512(const bf16_job *jb, int i, int j, int pr, float *buf, const int rb, const int mb,
               const int seq, const int pf, const int bm) {
  enum { VL = 16, xw = 0 };
#define STOREW _mm512_storeu_ps
  const int k = jb->k, kv = k / 16 * 16;
  const float *x = jb->x + (size_t)i * k;
  const uint16_t *pfw = jb->w + (size_t)(j + VS_BF16_PF_BLOCKS * VS_BF16_RB) * k;
  bf16_row w[VS_BF16_RB];
  __m512 acc[VS_BF16_RB][4];
  _Pragma("GCC unroll 4") for (int r = 0; r < rb; r++) {
    w[r] = bf16_row_at(jb, j + r);
    _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++) acc[r][q] = _mm512_setzero_ps();
  }
  if (seq) {
    _Pragma("GCC unroll 2") for (int h = 0; h < rb; h += 2)
      for (int p = 0; p < kv; p += 16)
        BF16_STEP(__m512, widen16, _mm512_loadu_ps, _mm512_fmadd_ps, h, h + 2, BF16_AT, p);
  } else {
    for (int p = 0; p < kv; p += 16) {
      BF16_PF(p);
      if (bm == 2)
        BF16_STEP(__m512, _mm512_loadu_ps, _mm512_loadu_ps, _mm512_fmadd_ps, 0, rb, BF16_BUF_AT, p);
      else
        BF16_STEP(__m512, widen16, _mm512_loadu_ps, _mm512_fmadd_ps, 0, rb, BF16_AT, p);
    }
  }
  if (rb == VS_BF16_RB) {
    _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++)
      bf16_store4(jb, i + q, j,
                  vs_reduce4_512(acc[0][q], acc[1 % rb][q], acc[2 % rb][q], acc[3 % rb][q]),
                  x + (size_t)q * k, w, kv, kv);
  } else {
    _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++)
      bf16_store(jb, i + q, j,
                 _mm512_reduce_add_ps(acc[0][q]) + bf16_tail(x + (size_t)q * k, w[0], kv, kv, k));
  }
#undef STOREW
}

/* ---- AVX2 --------------------------------------------------------------------------------- */
__attribute__((target("avx2"))) static inline __m256 widen8(const uint16_t *p) {
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* lanes added as ((0+4) + (2+6)) + ((1+5) + (3+7)) */
__attribute__((target("avx2"))) static inline float reduce8(__m256 a) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 g = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(g, _mm_shuffle_ps(g, g, 1)));
}

/* As bf16_block_512 with 8 lanes (the k16 columns in 8-column halves of the chunks, then one
 * more step from the tail columns when 8 or more remain); mb <= 3 (16 ymm registers: at
 * mb = 3 12 accumulators, 3 activations and 1 weight, the k step turned round). */
static inline __attribute__((always_inline, target("avx2,fma"))) void
bf16_block_256(const bf16_job *jb, int i, int j, int pr, float *buf, const int rb, const int mb,
               const int seq, const int pf, const int bm) {
  enum { VL = 8 };
  const int xw = mb == 3;
#define STOREW _mm256_storeu_ps
  const int k = jb->k, kv = k / 8 * 8, k16 = k & ~15;
  const float *x = jb->x + (size_t)i * k;
  const uint16_t *pfw = jb->w + (size_t)(j + VS_BF16_PF_BLOCKS * VS_BF16_RB) * k;
  bf16_row w[VS_BF16_RB];
  __m256 acc[VS_BF16_RB][3];
  _Pragma("GCC unroll 4") for (int r = 0; r < rb; r++) {
    w[r] = bf16_row_at(jb, j + r);
    _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++) acc[r][q] = _mm256_setzero_ps();
  }
  const int step = seq ? 2 : rb;
  _Pragma("GCC unroll 2") for (int h = 0; h < rb; h += step) {
    for (int p = 0; p < k16; p += 8) {
      BF16_PF(p);
      if (bm == 2)
        BF16_STEP(__m256, _mm256_loadu_ps, _mm256_loadu_ps, _mm256_fmadd_ps, h, h + step,
                  BF16_BUF_AT, p);
      else
        BF16_STEP(__m256, widen8, _mm256_loadu_ps, _mm256_fmadd_ps, h, h + step, BF16_AT, p);
    }
    if (kv > k16) {
      const int p = k16;
      if (bm == 2)
        BF16_STEP(__m256, _mm256_loadu_ps, _mm256_loadu_ps, _mm256_fmadd_ps, h, h + step,
                  BF16_BUF_AT, k16);
      else
        BF16_STEP(__m256, widen8, _mm256_loadu_ps, _mm256_fmadd_ps, h, h + step, BF16_TAIL, k16);
    }
  }
  if (rb == VS_BF16_RB) {
    _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++)
      bf16_store4(jb, i + q, j,
                  vs_reduce4_256(acc[0][q], acc[1 % rb][q], acc[2 % rb][q], acc[3 % rb][q]),
                  x + (size_t)q * k, w, k16, kv);
  } else {
    _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++)
      bf16_store(jb, i + q, j, reduce8(acc[0][q]) + bf16_tail(x + (size_t)q * k, w[0], k16, kv, k));
  }
#undef STOREW
}

#define BF16_INST(NAME, BODY, TGT, RB, MB, SEQ, PF, BM)                                     \
  __attribute__((noinline, target(TGT))) static void NAME(const bf16_job *jb, int i, int j,  \
                                                          int pr, float *buf) {              \
    BODY(jb, i, j, pr, buf, RB, MB, SEQ, PF, BM);                                            \
  }
/* The shapes of bf16_kernels.by_rb, per activation block height MB: one weight row; four side
 * by side; four as two pairs in sequence; four side by side prefetching 1, 2 or 4 rows' worth
 * (bf16_rows); the same writing the block's fp32 copy (1, 2 rows' worth) and reading it (0, 1,
 * 2). */
#define BF16_SHAPES(P, BODY, TGT, MB)                                                        \
  BF16_INST(P##_1x##MB, BODY, TGT, 1, MB, 0, 0, 0)                                           \
  BF16_INST(P##_4x##MB, BODY, TGT, 4, MB, 0, 0, 0)                                           \
  BF16_INST(P##_4x##MB##s, BODY, TGT, 4, MB, 1, 0, 0)                                        \
  BF16_INST(P##_4x##MB##p1, BODY, TGT, 4, MB, 0, 1, 0)                                       \
  BF16_INST(P##_4x##MB##p2, BODY, TGT, 4, MB, 0, 2, 0)                                       \
  BF16_INST(P##_4x##MB##p4, BODY, TGT, 4, MB, 0, 4, 0)                                       \
  BF16_INST(P##_4x##MB##w1, BODY, TGT, 4, MB, 0, 1, 1)                                       \
  BF16_INST(P##_4x##MB##w2, BODY, TGT, 4, MB, 0, 2, 1)                                       \
  BF16_INST(P##_4x##MB##r0, BODY, TGT, 4, MB, 0, 0, 2)                                       \
  BF16_INST(P##_4x##MB##r1, BODY, TGT, 4, MB, 0, 1, 2)                                       \
  BF16_INST(P##_4x##MB##r2, BODY, TGT, 4, MB, 0, 2, 2)
BF16_SHAPES(b512, bf16_block_512, "avx512f,fma", 1)
BF16_SHAPES(b512, bf16_block_512, "avx512f,fma", 2)
BF16_SHAPES(b512, bf16_block_512, "avx512f,fma", 3)
BF16_SHAPES(b512, bf16_block_512, "avx512f,fma", 4)
BF16_SHAPES(b256, bf16_block_256, "avx2,fma", 1)
BF16_SHAPES(b256, bf16_block_256, "avx2,fma", 2)
BF16_SHAPES(b256, bf16_block_256, "avx2,fma", 3)
#endif

typedef void (*bf16_block_fn)(const bf16_job *jb, int i, int j, int pr, float *buf);

/* Instances by [shape][activation rows - 1], the shapes of BF16_SHAPES (BF16_ONE ...); and the
 * most activation rows per block. */
enum {
  BF16_ONE, BF16_FOUR, BF16_SEQ, BF16_PF1, BF16_PF2, BF16_PF4, /* PFn + 3: also write the copy */
  BF16_W1, BF16_W2, BF16_R0, BF16_R1, BF16_R2, BF16_NSHAPES    /* Rn: read it */
};
typedef struct bf16_kernels {
  bf16_block_fn by_rb[BF16_NSHAPES][4];
  int mb;
} bf16_kernels;

#if VS_BF16_X86
#define BF16_ROW4(P, S) {P##_4x1##S, P##_4x2##S, P##_4x3##S, P##_4x4##S}
#define BF16_ROW3(P, S) {P##_4x1##S, P##_4x2##S, P##_4x3##S, NULL}
static const bf16_kernels k512 = {
    {{b512_1x1, b512_1x2, b512_1x3, b512_1x4}, BF16_ROW4(b512, ), BF16_ROW4(b512, s),
     BF16_ROW4(b512, p1), BF16_ROW4(b512, p2), BF16_ROW4(b512, p4), BF16_ROW4(b512, w1),
     BF16_ROW4(b512, w2), BF16_ROW4(b512, r0), BF16_ROW4(b512, r1), BF16_ROW4(b512, r2)},
    4};
static const bf16_kernels k256 = {
    {{b256_1x1, b256_1x2, b256_1x3, NULL}, BF16_ROW3(b256, ), BF16_ROW3(b256, s),
     BF16_ROW3(b256, p1), BF16_ROW3(b256, p2), BF16_ROW3(b256, p4), BF16_ROW3(b256, w1),
     BF16_ROW3(b256, w2), BF16_ROW3(b256, r0), BF16_ROW3(b256, r1), BF16_ROW3(b256, r2)},
    3};
#endif

static void bf16_rows(const bf16_job *jb, int isa, int j0, int j1) {
  const bf16_kernels *ks = NULL;
#if VS_BF16_X86
  if (isa >= VS_ISA_AVX512) ks = &k512;
  else if (isa >= VS_ISA_AVX2) ks = &k256;
#endif
  if (!ks) {
    bf16_rows_scalar(jb, j0, j1);
    return;
  }
  /* Blocks of four weight rows (single rows at the end) by blocks of activation rows: an
   * element sums the same way in every block shape. Decode-sized products take the pairs in
   * sequence (one stream); larger ones side by side, every pass (activation block) prefetching
   * a share of the block VS_BF16_PF_BLOCKS ahead into L2, as the fp32 kernel does
   * (skinny_cols_tab in cpu_linear_skinny.c, which says why). With more than one pass the
   * first also keeps the block's widened rows in buf and the others read them from there,
   * so the widening (a load, a zero-extension and a shift per vector) is done once per block
   * rather than once per pass. */
  float buf[VS_BF16_RB * VS_BF16_BUF_MAX_K] __attribute__((aligned(64)));
  const int m = jb->m, passes = (m + ks->mb - 1) / ks->mb;
  const int npf = passes >= 4 ? 1 : passes >= 2 ? 2 : 4;
  const int pf_shape = passes >= 4 ? BF16_PF1 : passes >= 2 ? BF16_PF2 : BF16_PF4;
  const int copy = passes >= 2 && jb->k <= VS_BF16_BUF_MAX_K;
  for (int j = j0; j < j1;) {
    if (j1 - j < VS_BF16_RB) {
      for (int i = 0; i < m; i += ks->mb)
        ks->by_rb[BF16_ONE][(m - i < ks->mb ? m - i : ks->mb) - 1](jb, i, j, 0, buf);
      j++;
      continue;
    }
    if (m <= VS_BF16_SEQ_MAX_M && m <= ks->mb) {
      ks->by_rb[BF16_SEQ][m - 1](jb, 0, j, 0, buf);
    } else {
      for (int i = 0, q = 0; i < m; i += ks->mb, q++) {
        const int rows = m - i < ks->mb ? m - i : ks->mb, pr = q * npf;
        int shape = pr < VS_BF16_RB ? pf_shape : BF16_FOUR;
        /* the copy: PFn -> Wn (write) in the first pass, PFn -> Rn, FOUR -> R0 (read) after */
        if (copy)
          shape = q == 0 ? shape + 3 : pr < VS_BF16_RB ? shape - BF16_PF1 + BF16_R1 : BF16_R0;
        ks->by_rb[shape][rows - 1](jb, i, j, pr < VS_BF16_RB ? pr : 0, buf);
      }
    }
    j += VS_BF16_RB;
  }
}

typedef struct bf16_task_ctx {
  const bf16_job *jb;
  int isa;
} bf16_task_ctx;

static void bf16_task(void *ctx, int task) {
  const bf16_task_ctx *c = ctx;
  int j0 = task * c->jb->rows_per_task;
  int j1 = j0 + c->jb->rows_per_task < c->jb->n ? j0 + c->jb->rows_per_task : c->jb->n;
  if (j0 < j1) bf16_rows(c->jb, c->isa, j0, j1);
}

void vs_bf16w_linear(vspec_dev *dev, const float *x, int m, int k, const uint16_t *w, int n,
                     const float *bias, float *y) {
  if (m <= 0 || n <= 0) return;
  bf16_job jb = {.x = x, .bias = bias, .w = w, .y = y, .m = m, .n = n, .k = k > 0 ? k : 0,
                 .rows_per_task = n};
  size_t bytes = (size_t)n * jb.k * sizeof(uint16_t);
  int threads = vs_pool_threads(dev->pool), tasks = 1;
  if (threads > 1 && bytes >= 2 * VS_BF16_TASK_MIN_BYTES) {
    size_t want = (size_t)threads * VS_BF16_TASKS_PER_THREAD;
    if (want > bytes / VS_BF16_TASK_MIN_BYTES) want = bytes / VS_BF16_TASK_MIN_BYTES;
    int per = (int)((n + want - 1) / want);
    jb.rows_per_task = (per + VS_BF16_RB - 1) / VS_BF16_RB * VS_BF16_RB;
    tasks = (n + jb.rows_per_task - 1) / jb.rows_per_task;
  }
  bf16_task_ctx c = {.jb = &jb, .isa = dev->isa};
  vs_pool_run(dev->pool, tasks, bf16_task, &c);
}
