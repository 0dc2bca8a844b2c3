/*
 * kernels/cpu/cpu_linear_bf16.c - bf16 weights, fp32 activations (see cpu_linear_bf16.h).
 *
 * Blocking: four weight rows at a time, each activation row against them with four vector
 * accumulators, so every weight element is read from memory once and, for the other rows of
 * a CFG pair or a tree, from L1 (four rows of k bf16 are 6 KiB at k = 768).
 */
#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_linear_bf16.h"
#include "kernels/cpu/cpu_linear_skinny.h"
#include "kernels/cpu/cpu_threads.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define VS_BF16_X86 1
#include <immintrin.h>
#else
#define VS_BF16_X86 0
#endif

#define VS_BF16_RB 4 /* weight rows per block */
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

/* The k tail past the vector loop, in order, added after the lanes. */
static float bf16_tail(const float *x, const uint16_t *w, int p0, int k) {
  float t = 0.0f;
  for (int p = p0; p < k; p++) t += x[p] * vs_bf16_to_f32(w[p]);
  return t;
}

/* ---- portable C: eight partial sums (lane p mod 8), added in a fixed tree ---------------- */
static void bf16_rows_scalar(const bf16_job *jb, int j0, int j1) {
  const int k = jb->k, kv = k / 8 * 8;
  for (int j = j0; j < j1; j++) {
    const uint16_t *w = jb->w + (size_t)j * k;
    for (int i = 0; i < jb->m; i++) {
      const float *x = jb->x + (size_t)i * k;
      float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int p = 0; p < kv; p += 8)
        for (int t = 0; t < 8; t++) l[t] += x[p + t] * vs_bf16_to_f32(w[p + t]);
      float s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
      bf16_store(jb, i, j, s + bf16_tail(x, w, kv, k));
    }
  }
}

#if VS_BF16_X86
/* The vector loop of a block with its weight rows taken one after the other (row r's whole k
 * loop, then row r + 1's) rather than side by side: each accumulator sees the same operations
 * in the same order, so the bits do not change, but the block's rows, adjacent in memory, are
 * read as one sequential stream, which the hardware prefetcher keeps up with (see
 * cpu_linear_skinny.c, VS_SKINNY_SEQ). Used when all activation rows fit one block, i.e.
 * when the weights come from memory exactly once. */
#define BF16_SEQ(VEC, WIDEN, LOADX, FMADD, W)                                                \
  _Pragma("GCC unroll 4") for (int r = 0; r < rb; r++) {                                   \
    const uint16_t *wr_ = w + (size_t)r * k;                                               \
    for (int p = 0; p < kv; p += (W)) {                                                    \
      VEC wv_ = WIDEN(wr_ + p);                                                            \
      _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++) acc[r][q] =                     \
          FMADD(wv_, LOADX(x + (size_t)q * k + p), acc[r][q]);                             \
    }                                                                                      \
  }

/* ---- AVX-512 ----------------------------------------------------------------------------- */
__attribute__((target("avx512f"))) static inline __m512 widen16(const uint16_t *p) {
  __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

/* rb weight rows (4 or 1) from j against mb activation rows from i: each weight vector is
 * widened once per k step and used for all mb rows. rb and mb are compile-time constants in
 * each instance below, and the unroll pragmas turn the loops over them into straight code, so
 * the rb x mb accumulators stay in registers. */
static inline __attribute__((always_inline, target("avx512f,fma"))) void
bf16_block_512(const bf16_job *jb, int i, int j, const int rb, const int mb, const int seq) {
  const int k = jb->k, kv = k / 16 * 16;
  const float *x = jb->x + (size_t)i * k;
  const uint16_t *w = jb->w + (size_t)j * k;
  __m512 acc[VS_BF16_RB][4];
  _Pragma("GCC unroll 4") for (int r = 0; r < rb; r++)
    _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++) acc[r][q] = _mm512_setzero_ps();
  if (seq) {
    BF16_SEQ(__m512, widen16, _mm512_loadu_ps, _mm512_fmadd_ps, 16);
  } else {
    for (int p = 0; p < kv; p += 16) {
      __m512 wv[VS_BF16_RB];
      _Pragma("GCC unroll 4") for (int r = 0; r < rb; r++) wv[r] = widen16(w + (size_t)r * k + p);
      _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++) {
        __m512 xv = _mm512_loadu_ps(x + (size_t)q * k + p);
        _Pragma("GCC unroll 4") for (int r = 0; r < rb; r++) acc[r][q] = _mm512_fmadd_ps(wv[r], xv, acc[r][q]);
      }
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < rb; r++)
    _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++)
      bf16_store(jb, i + q, j + r,
                 _mm512_reduce_add_ps(acc[r][q]) +
                     bf16_tail(x + (size_t)q * k, w + (size_t)r * k, kv, k));
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

/* As bf16_block_512 with 8 lanes; mb <= 2 (16 ymm registers: 8 accumulators, 4 weights). */
static inline __attribute__((always_inline, target("avx2,fma"))) void
bf16_block_256(const bf16_job *jb, int i, int j, const int rb, const int mb, const int seq) {
  const int k = jb->k, kv = k / 8 * 8;
  const float *x = jb->x + (size_t)i * k;
  const uint16_t *w = jb->w + (size_t)j * k;
  __m256 acc[VS_BF16_RB][2];
  _Pragma("GCC unroll 4") for (int r = 0; r < rb; r++)
    _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++) acc[r][q] = _mm256_setzero_ps();
  if (seq) {
    BF16_SEQ(__m256, widen8, _mm256_loadu_ps, _mm256_fmadd_ps, 8);
  } else {
    for (int p = 0; p < kv; p += 8) {
      __m256 wv[VS_BF16_RB];
      _Pragma("GCC unroll 4") for (int r = 0; r < rb; r++) wv[r] = widen8(w + (size_t)r * k + p);
      _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++) {
        __m256 xv = _mm256_loadu_ps(x + (size_t)q * k + p);
        _Pragma("GCC unroll 4") for (int r = 0; r < rb; r++) acc[r][q] = _mm256_fmadd_ps(wv[r], xv, acc[r][q]);
      }
    }
  }
  _Pragma("GCC unroll 4") for (int r = 0; r < rb; r++)
    _Pragma("GCC unroll 4") for (int q = 0; q < mb; q++)
      bf16_store(jb, i + q, j + r,
                 reduce8(acc[r][q]) + bf16_tail(x + (size_t)q * k, w + (size_t)r * k, kv, k));
}

#define BF16_INST(NAME, BODY, TGT, RB, MB, SEQ)                                             \
  __attribute__((noinline, target(TGT))) static void NAME(const bf16_job *jb, int i, int j) { \
    BODY(jb, i, j, RB, MB, SEQ);                                                            \
  }
BF16_INST(b512_4x1, bf16_block_512, "avx512f,fma", 4, 1, 0)
BF16_INST(b512_4x2, bf16_block_512, "avx512f,fma", 4, 2, 0)
BF16_INST(b512_4x3, bf16_block_512, "avx512f,fma", 4, 3, 0)
BF16_INST(b512_4x4, bf16_block_512, "avx512f,fma", 4, 4, 0)
BF16_INST(b512_1x1, bf16_block_512, "avx512f,fma", 1, 1, 0)
BF16_INST(b512_1x2, bf16_block_512, "avx512f,fma", 1, 2, 0)
BF16_INST(b512_1x3, bf16_block_512, "avx512f,fma", 1, 3, 0)
BF16_INST(b512_1x4, bf16_block_512, "avx512f,fma", 1, 4, 0)
BF16_INST(b512_4x1s, bf16_block_512, "avx512f,fma", 4, 1, 1)
BF16_INST(b512_4x2s, bf16_block_512, "avx512f,fma", 4, 2, 1)
BF16_INST(b512_4x3s, bf16_block_512, "avx512f,fma", 4, 3, 1)
BF16_INST(b512_4x4s, bf16_block_512, "avx512f,fma", 4, 4, 1)
BF16_INST(b256_4x1, bf16_block_256, "avx2,fma", 4, 1, 0)
BF16_INST(b256_4x2, bf16_block_256, "avx2,fma", 4, 2, 0)
BF16_INST(b256_1x1, bf16_block_256, "avx2,fma", 1, 1, 0)
BF16_INST(b256_1x2, bf16_block_256, "avx2,fma", 1, 2, 0)
BF16_INST(b256_4x1s, bf16_block_256, "avx2,fma", 4, 1, 1)
BF16_INST(b256_4x2s, bf16_block_256, "avx2,fma", 4, 2, 1)
#endif

typedef void (*bf16_block_fn)(const bf16_job *jb, int i, int j);

/* Instances by [shape][activation rows - 1]: shape 0 one weight row, 1 four side by side,
 * 2 four in sequence (BF16_SEQ); and the most activation rows per block. */
typedef struct bf16_kernels {
  bf16_block_fn by_rb[3][4];
  int mb;
} bf16_kernels;

#if VS_BF16_X86
static const bf16_kernels k512 = {{{b512_1x1, b512_1x2, b512_1x3, b512_1x4},
                                   {b512_4x1, b512_4x2, b512_4x3, b512_4x4},
                                   {b512_4x1s, b512_4x2s, b512_4x3s, b512_4x4s}}, 4};
static const bf16_kernels k256 = {{{b256_1x1, b256_1x2, NULL, NULL},
                                   {b256_4x1, b256_4x2, NULL, NULL},
                                   {b256_4x1s, b256_4x2s, NULL, NULL}}, 2};
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
  /* blocks of four weight rows (single rows at the end) by blocks of activation rows: an
   * element sums the same way in every block shape */
  for (int j = j0; j < j1;) {
    int four = j1 - j >= VS_BF16_RB;
    int shape = four && jb->m <= ks->mb ? 2 : four;
    for (int i = 0; i < jb->m; i += ks->mb) {
      int mb = jb->m - i < ks->mb ? jb->m - i : ks->mb;
      ks->by_rb[shape][mb - 1](jb, i, j);
    }
    j += four ? VS_BF16_RB : 1;
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
