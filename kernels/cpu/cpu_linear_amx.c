/*
 * kernels/cpu/cpu_linear_amx.c - linear layers on AMX tiles (see cpu_linear_amx.h for why).
 *
 * Tiles (palette 1, all 16 rows x 64 bytes):
 *   tmm0, tmm1  C of rows r .. r+15,    output column blocks 2c and 2c + 1 (16 fp32 each)
 *   tmm2, tmm3  C of rows r+16 .. r+31, the same column blocks
 *   tmm4, tmm5  A: 16 rows x 32 bf16 of x (rows r .. r+15 and r+16 .. r+31)
 *   tmm6, tmm7  B: the packed 16 x 32 weight block of column block 2c and 2c + 1
 * so one B tile load serves 32 rows and one A load 32 columns. The loop over output column
 * pairs is outermost: a pair's weights (2 x k/32 KiB, 48 KiB at k = 768) are read from memory
 * once and stay in L2 while every row block uses them.
 *
 * x is rounded to bf16 once per call into the device's scratch, zero-padded to 32 columns and,
 * above 16 rows, to a multiple of 16 rows, so every tile is full and the padding adds zeros;
 * below 16 rows the A and C tiles are configured with m rows instead (decoding: no work on
 * padding). C goes through a
 * small buffer on the stack, from which the valid rows and columns (plus the bias) are copied,
 * unless the tile lies wholly inside y and there is no bias: then it is stored in place.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/common/vs_math.h"
#include "kernels/cpu/cpu_linear_amx.h"
#include "kernels/cpu/cpu_threads.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#define VS_AMX_BUILD 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#define VS_AMX_BUILD 0
#endif

#define VS_AMX_ROWS 16        /* rows of an A or C tile */
#define VS_AMX_KBLOCK 32      /* bf16 values in a 64-byte tile row */
#define VS_AMX_NBLOCK 16      /* fp32 columns of a C tile */
#define VS_AMX_BLOCK_ELEMS 512 /* bf16 values in one packed 16 x 32 block */

size_t vs_amx_packed_bytes(int n, int k) {
  return (size_t)vs_amx_round_up(n, 2 * VS_AMX_NBLOCK) *
         (size_t)vs_amx_round_up(k, VS_AMX_KBLOCK) * sizeof(uint16_t);
}

void vs_amx_pack(const float *w, int n, int k, uint16_t *packed) {
  int nb_count = vs_amx_round_up(n, 2 * VS_AMX_NBLOCK) / VS_AMX_NBLOCK;
  int kb_count = vs_amx_round_up(k, VS_AMX_KBLOCK) / VS_AMX_KBLOCK;
  for (int nb = 0; nb < nb_count; nb++)
    for (int kb = 0; kb < kb_count; kb++) {
      uint16_t *blk = packed + ((size_t)nb * kb_count + kb) * VS_AMX_BLOCK_ELEMS;
      /* row r of the B tile holds k pair (2r, 2r + 1) of all 16 columns, column-major pairs */
      for (int r = 0; r < VS_AMX_KBLOCK / 2; r++)
        for (int c = 0; c < VS_AMX_NBLOCK; c++)
          for (int e = 0; e < 2; e++) {
            int col = nb * VS_AMX_NBLOCK + c, kk = kb * VS_AMX_KBLOCK + 2 * r + e;
            blk[r * 2 * VS_AMX_NBLOCK + 2 * c + e] =
                col < n && kk < k ? vs_f32_to_bf16(w[(size_t)col * k + kk]) : 0;
          }
    }
}

#if VS_AMX_BUILD

#define VS_ARCH_REQ_XCOMP_PERM 0x1023
#define VS_XFEATURE_XTILEDATA 18

static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static int amx_ok;

static void amx_probe(void) {
  const char *env = getenv("VSPEC_CPU_AMX");
  if (env && strcmp(env, "0") == 0) return;
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
  int tile = (d >> 24) & 1, bf16 = (d >> 22) & 1;
  __builtin_cpu_init();
  if (!tile || !bf16 || !__builtin_cpu_supports("avx512f")) return;
  /* Linux keeps the 8 KiB tile state out of every thread's context until a process asks;
   * the permission is process-wide. It fails on kernels before 5.16 (no AMX then). */
  amx_ok = syscall(SYS_arch_prctl, VS_ARCH_REQ_XCOMP_PERM, VS_XFEATURE_XTILEDATA) == 0;
}

int vs_amx_available(void) {
  pthread_once(&amx_once, amx_probe);
  return amx_ok;
}

typedef struct amx_tilecfg {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_tilecfg;

/* The tile rows this thread's configuration holds, 0 for none. A draft forward runs about
 * twenty products of a few rows each; loading the configuration for every one and releasing
 * the tiles after was 3.5 % of a draft-only decode (perf, models/fmnist's draft GPT), so a
 * thread keeps it until the rows change. Keeping the tiles in use costs the kernel's
 * context switch the 8 KiB of tile state, which the compute threads rarely see. */
static __thread int amx_thread_rows;

__attribute__((target("amx-tile"))) void vs_amx_tile_config(int tile_rows) {
  if (amx_thread_rows == tile_rows) return;
  amx_tilecfg cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) cfg.rows[t] = VS_AMX_ROWS, cfg.colsb[t] = 64;
  for (int t = 0; t < 6; t++) cfg.rows[t] = (uint8_t)tile_rows; /* C and A tiles */
  /* GCC's _tile_loadconfig does not tell the compiler that it reads all 64 bytes, and
   * without this barrier it dropped the stores above (LDTILECFG then faults) */
  __asm__ __volatile__("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
  amx_thread_rows = tile_rows;
}

typedef struct amx_job {
  const uint16_t *xb, *packed;
  const float *bias;
  float *y;
  int m, mp, n, kp, pairs, pairs_per_task;
  int tile_rows; /* rows of the A and C tiles: 16, or m when m < 16 (no padding rows) */
} amx_job;

/* x [m, k] -> bf16 [mp, kp], zero-padded; the same rounding as vs_f32_to_bf16 (nearest even,
 * NaN stays a quiet NaN), 16 at a time. Padding rows are cleared in one go. */
__attribute__((target("avx512f"))) static void amx_convert_rows(const float *x, int m, int k,
                                                               uint16_t *xb, int mp, int kp) {
  const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  if (mp > m) memset(xb + (size_t)m * kp, 0, (size_t)(mp - m) * kp * sizeof(uint16_t));
  for (int i = 0; i < m; i++) {
    uint16_t *dst = xb + (size_t)i * kp;
    for (int p = 0; p < kp; p += 16) {
      int left = k - p;
      __mmask16 mk = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
      __m512 v = _mm512_maskz_loadu_ps(mk, x + (size_t)i * k + p);
      __m512i u = _mm512_castps_si512(v);
      __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
      __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(half, lsb));
      r = _mm512_srli_epi32(r, 16);
      __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), quiet);
      _mm256_storeu_si256((__m256i *)(dst + p), _mm512_cvtepi32_epi16(r));
    }
  }
}

/* Copies the valid part of a 16 x 16 C tile (rows row.., columns col..) to y, adding bias:
 * one vector per row, masked only at y's right edge (a load of a line a masked store wrote
 * waits for that store to reach the cache, and the next op reads y at once). */
__attribute__((target("avx512f"))) static void amx_emit(const amx_job *jb, const float *tile,
                                                        int row, int col) {
  int rows = jb->m - row < VS_AMX_ROWS ? jb->m - row : VS_AMX_ROWS;
  int cols = jb->n - col < VS_AMX_NBLOCK ? jb->n - col : VS_AMX_NBLOCK;
  __mmask16 mk = (__mmask16)((1u << cols) - 1u);
  __m512 b = jb->bias ? _mm512_maskz_loadu_ps(mk, jb->bias + col) : _mm512_setzero_ps();
  for (int i = 0; i < rows; i++) {
    float *dst = jb->y + (size_t)(row + i) * jb->n + col;
    __m512 v = _mm512_add_ps(_mm512_loadu_ps(tile + i * VS_AMX_NBLOCK), b);
    if (cols == VS_AMX_NBLOCK)
      _mm512_storeu_ps(dst, v);
    else
      _mm512_mask_storeu_ps(dst, mk, v);
  }
}

/* C tile t (rows row.., columns col..) to y: straight from the tile when it lies wholly
 * inside y and there is no bias (the common case: LlamaGen's linears have none), else through
 * `buf` and amx_emit. The macro keeps the tile number a compile-time constant. */
#define AMX_STORE(t, buf, row, col)                                                       \
  do {                                                                                    \
    if (!jb->bias && (row) + jb->tile_rows <= jb->m && (col) + VS_AMX_NBLOCK <= jb->n) { \
      _tile_stored(t, jb->y + (size_t)(row) * jb->n + (col), jb->n * (int)sizeof(float)); \
    } else if ((col) < jb->n) {                                                           \
      _tile_stored(t, buf, 64);                                                           \
      amx_emit(jb, buf, row, col);                                                        \
    }                                                                                     \
  } while (0)

/* Output columns [32 c, 32 c + 32) for every row: rows in blocks of 32 (or 16 at the end). */
__attribute__((target("amx-tile,amx-bf16,avx512f"))) static void amx_pair(const amx_job *jb,
                                                                           int c) {
  const int kbs = jb->kp / VS_AMX_KBLOCK, stride = jb->kp * (int)sizeof(uint16_t);
  const uint16_t *b0 = jb->packed + (size_t)(2 * c) * kbs * VS_AMX_BLOCK_ELEMS;
  const uint16_t *b1 = b0 + (size_t)kbs * VS_AMX_BLOCK_ELEMS;
  float tile[VS_AMX_ROWS * VS_AMX_NBLOCK];
  for (int r = 0; r < jb->mp; r += 2 * VS_AMX_ROWS) {
    const int two = r + VS_AMX_ROWS < jb->mp;
    const uint16_t *a0 = jb->xb + (size_t)r * jb->kp, *a1 = a0 + (size_t)VS_AMX_ROWS * jb->kp;
    _tile_zero(0);
    _tile_zero(1);
    if (two) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int kb = 0; kb < kbs; kb++) {
      _tile_loadd(4, a0 + kb * VS_AMX_KBLOCK, stride);
      _tile_loadd(6, b0 + (size_t)kb * VS_AMX_BLOCK_ELEMS, 64);
      _tile_loadd(7, b1 + (size_t)kb * VS_AMX_BLOCK_ELEMS, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if (two) {
        _tile_loadd(5, a1 + kb * VS_AMX_KBLOCK, stride);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    int col = 2 * c * VS_AMX_NBLOCK;
    AMX_STORE(0, tile, r, col);
    AMX_STORE(1, tile, r, col + VS_AMX_NBLOCK);
    if (two && r + VS_AMX_ROWS < jb->m) {
      AMX_STORE(2, tile, r + VS_AMX_ROWS, col);
      AMX_STORE(3, tile, r + VS_AMX_ROWS, col + VS_AMX_NBLOCK);
    }
  }
}

/* Tile configuration is per thread: every task makes sure its thread holds it. */
__attribute__((target("amx-tile,amx-bf16,avx512f"))) static void amx_task(void *ctx, int task) {
  const amx_job *jb = ctx;
  int c0 = task * jb->pairs_per_task;
  int c1 = c0 + jb->pairs_per_task < jb->pairs ? c0 + jb->pairs_per_task : jb->pairs;
  if (c0 >= c1) return;
  vs_amx_tile_config(jb->tile_rows);
  for (int c = c0; c < c1; c++) amx_pair(jb, c);
}

/* The split over the pool is sized by weight bytes per task: a task must stream at least
 * VS_AMX_TASK_MIN_BYTES, else waking a helper (and loading its tile configuration) costs
 * more than it saves. Measured with `vspec-bench eval --methods ar --threads 1|2` on
 * models/fmnist (largest product 1024 x 256: 512 KiB of bf16) and `vspec-bench costcurve
 * --random gpt-b`: fmnist split 8 ways was slower on 2 threads than on 1 (1.69 against
 * 1.59 s for 30 images), unsplit the same (1.57 / 1.55); GPT-B split, 8.8 against 13.7 ms
 * per 1-row forward. At most VS_AMX_TASKS_PER_THREAD tasks per thread, so a thread that
 * loses its core leaves the rest of its share to the others. */
#define VS_AMX_TASK_MIN_BYTES ((size_t)512 << 10)
#define VS_AMX_TASKS_PER_THREAD 4

int vs_amx_split(const vspec_dev *dev, int pairs, size_t bytes, int *pairs_per_task) {
  int threads = vs_pool_threads(dev->pool), tasks = 1;
  *pairs_per_task = pairs;
  if (threads > 1 && bytes >= 2 * VS_AMX_TASK_MIN_BYTES) {
    int want = threads * VS_AMX_TASKS_PER_THREAD;
    if ((size_t)want > bytes / VS_AMX_TASK_MIN_BYTES) want = (int)(bytes / VS_AMX_TASK_MIN_BYTES);
    *pairs_per_task = (pairs + want - 1) / want;
    tasks = (pairs + *pairs_per_task - 1) / *pairs_per_task;
  }
  return tasks;
}

void vs_amx_linear(vspec_dev *dev, const float *x, int m, int k, const uint16_t *packed, int n,
                   const float *bias, float *y) {
  if (m <= 0 || n <= 0) return;
  amx_job jb = {.packed = packed, .bias = bias, .y = y, .m = m, .n = n,
                .mp = m < VS_AMX_ROWS ? m : vs_amx_round_up(m, VS_AMX_ROWS),
                .tile_rows = m < VS_AMX_ROWS ? m : VS_AMX_ROWS,
                .kp = vs_amx_round_up(k > 0 ? k : 1, VS_AMX_KBLOCK)};
  jb.pairs = vs_amx_round_up(n, 2 * VS_AMX_NBLOCK) / (2 * VS_AMX_NBLOCK);
  uint16_t *xb = vs_scratch(dev, (size_t)jb.mp * jb.kp * sizeof(uint16_t));
  amx_convert_rows(x, m, k, xb, jb.mp, jb.kp);
  jb.xb = xb;
  int tasks = vs_amx_split(dev, jb.pairs, vs_amx_packed_bytes(n, k), &jb.pairs_per_task);
  vs_pool_run(dev->pool, tasks, amx_task, &jb);
}

#else /* !VS_AMX_BUILD */

int vs_amx_available(void) { return 0; }

void vs_amx_linear(vspec_dev *dev, const float *x, int m, int k, const uint16_t *packed, int n,
                   const float *bias, float *y) {
  (void)dev, (void)x, (void)m, (void)k, (void)packed, (void)n, (void)bias, (void)y;
}

#endif
