/*
 * kernels/cuda/cuda_draw.cu - sample_tokens (ABI 1.4, include/vspec/ops.h) on the device: a
 * token per node from its logits, as the engine's host sampler draws it
 * (kernels/cpu/cpu_sampling.c vs_cpu_sample_tokens: vs_host_cfg_combine,
 * vs_host_logits_to_probs, vs_host_sample; greedy: the first maximum). An AR step then
 * downloads n tokens instead of n x rows x vocab logits.
 *
 * One launch, one block of VS_DRAW_THREADS per node; any vocabulary size. Nothing is stored
 * but a few kilobytes of shared memory: every pass recomputes a logit from the input (the CFG
 * mix with vs_cfg_mix, then the IEEE division by the temperature, NaN as -inf: the host's
 * bits), which the L1/L2 caches serve after the first pass. No scratch, upload, download or
 * wait. Passes over the vocabulary (non-greedy, top-k and top-p on): the maximum, 4 for the
 * top-k threshold, 4 for the top-p threshold (+1 when ties straddle it), the softmax sum, the
 * chunk sums of the draw and the walk to the drawn index.
 *
 * Ranking is the host's: (value descending, index ascending); -0 and +0 rank as equals.
 *
 *  - greedy (temperature <= 0 or NaN): the first maximum of the mixed logits, NaN skipped,
 *    0 when every entry is NaN (vs_host_argmax; the one-hot's first maximum is that index).
 *  - top-k (0 < k < vocab): the k-th largest value is found by a radix select over the
 *    float's order-preserving key (4 passes of 8 bits; a 256-bucket count histogram in shared
 *    memory per pass, warp 0 finds the bucket holding rank k). Values >= it are kept, so
 *    ties with it survive, as on the host.
 *  - top-p (top_p < 1): the host keeps the ranks 0..c of its sorted candidates, c the first
 *    rank whose cumulative softmax (a float, mass / z) exceeds top_p. The value T at rank c
 *    is the largest candidate value v whose mass of entries >= v crosses: found by the same
 *    radix select, each bucket carrying its mass besides its count. Every entry > T is kept;
 *    of the entries equal to T (ranked by index), the first j, with j the least tie count
 *    whose mass crosses (a binary search on one thread), so ties at the threshold are kept or
 *    dropped exactly as the host's order does; an index-order count scan finds the j-th tie
 *    when j is not all of them. Masses are fixed-point integers (w 2^(62 - ceil(log2 V))
 *    rounded, w = e^(v - max)), so bucket sums are exact and independent of the atomics'
 *    order (the result is deterministic) and a bucket's mass is exactly the sum of its
 *    sub-buckets'. Differences from the host, which only move the cut when the cumulative
 *    mass lies within about 1e-7 of top_p: w is vs_exp_poly where the host calls libm's
 *    expf (both within an ulp of e^x), and the host's mass is a double sum in its
 *    partition order.
 *  - softmax of the kept entries: vs_exp_poly(v - max) (the host's formula), the sum in
 *    double, rounded to float, p = e / sum: the host's probabilities bit for bit unless the
 *    double sums, added in another order, round to different floats.
 *  - the draw: the first index i whose cumulative probability (index order, nonzero entries)
 *    exceeds u x total; a block-wide prefix sum in double: a contiguous chunk per thread, a
 *    scan of the chunk sums, then each thread walks its chunk. The last nonzero entry when
 *    rounding runs past the sum, -1 when nothing has mass (no finite logit, or a +inf one:
 *    the host's softmax gives NaN then). The running sums are the host's sequential ones up to
 *    the order of the double additions: a different token only where u x total falls within
 *    about 1e-16 of a cumulative sum.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "kernels/common/vs_math.h"
#include "kernels/cuda/cuda_dev.h"

#define VS_DRAW_THREADS 1024
#define VS_DRAW_FULL 0xffffffffu
#define VS_DRAW_NONE INT_MAX /* no index */

typedef unsigned long long vs_u64;

/* What the kernel needs of vspec_sample_spec, normalised on the host. */
struct vs_draw_args {
  const float *logits;
  const uint8_t *guided;
  const double *u;
  int32_t *tokens;
  int rows, vocab;
  int top_k;       /* 0: off (also k >= vocab) */
  int has_p;       /* top_p < 1 */
  int greedy;      /* temperature <= 0 or NaN */
  float cfg_scale;
  float t;         /* max(temperature, 1e-5) */
  float top_p;
  double fx_scale; /* 2^(62 - ceil(log2 vocab)): a vocabulary of masses <= 1 sums below 2^62 */
};

struct vs_draw_smem {
  unsigned int hc[256]; /* radix histogram: entries per bucket */
  vs_u64 hm[256];       /* and their fixed-point mass (top-p) */
  float fred[32];
  int ired[32];
  double dred[32];
  vs_u64 above; /* count / mass of the keys above the current bucket */
  double z;     /* top-p: the candidates' total fixed-point mass */
  int digit;    /* the bucket the walk chose; -1: none */
  int jstar;    /* top-p: ties at the threshold kept */
  int tie_last; /* top-p: index of the last tie kept */
};

/* One node's logits: the conditional row, mixed with the unconditional one when guided. */
struct vs_draw_row {
  const float *c, *uc; /* uc NULL: no mix */
  float scale, t;
  __device__ float raw(int j) const { return uc ? vs_cfg_mix(c[j], uc[j], scale) : c[j]; }
  /* logits / temperature, NaN as -inf (vs_host_logits_to_probs) */
  __device__ float val(int j) const {
    float q = __fdiv_rn(raw(j), t);
    return q != q ? -INFINITY : q;
  }
};

/* Order-preserving key of a non-NaN float (unsigned order = float order), -0 as +0. */
__device__ static inline uint32_t vs_draw_key(float v) {
  uint32_t b = vs_f32_bits(v == 0.0f ? 0.0f : v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ static inline float vs_draw_key_value(uint32_t k) {
  return vs_bits_f32((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* Fixed-point mass of candidate v: e^(v - max) x fx_scale, rounded (exact product). */
__device__ static inline vs_u64 vs_draw_fx(float v, float mx, double scale) {
  return __double2ull_rn((double)vs_exp_poly(v - mx) * scale);
}

/* The host's crossing test: (float)(mass / z) > top_p. */
__device__ static inline bool vs_draw_crossed(vs_u64 mass, double z, float top_p) {
  return (float)((double)mass / z) > top_p;
}

/* ---- block-wide reductions and scans: every thread gets the result; a fixed order, so the
 * results are deterministic. Each begins with a barrier, so its shared slots are free. ---- */

__device__ static float vs_draw_max(float v, vs_draw_smem *s) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(VS_DRAW_FULL, v, off));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s->fred[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = s->fred[0];
  for (int w = 1; w < (int)(blockDim.x >> 5); w++) r = fmaxf(r, s->fred[w]);
  return r;
}

__device__ static double vs_draw_sum(double v, vs_draw_smem *s) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(VS_DRAW_FULL, v, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s->dred[threadIdx.x >> 5] = v;
  __syncthreads();
  double r = s->dred[0];
  for (int w = 1; w < (int)(blockDim.x >> 5); w++) r += s->dred[w];
  return r;
}

/* max (want_max) or min of an int */
__device__ static int vs_draw_iext(int v, int want_max, vs_draw_smem *s) {
  for (int off = 16; off > 0; off >>= 1) {
    int o = __shfl_xor_sync(VS_DRAW_FULL, v, off);
    v = want_max ? max(v, o) : min(v, o);
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s->ired[threadIdx.x >> 5] = v;
  __syncthreads();
  int r = s->ired[0];
  for (int w = 1; w < (int)(blockDim.x >> 5); w++)
    r = want_max ? max(r, s->ired[w]) : min(r, s->ired[w]);
  return r;
}

/* Whether candidate (ov, oi) beats (bv, bi) for the first maximum; index VS_DRAW_NONE: none. */
__device__ static inline bool vs_draw_better(float ov, int oi, float bv, int bi) {
  return oi != VS_DRAW_NONE && (bi == VS_DRAW_NONE || ov > bv || (ov == bv && oi < bi));
}

/* The first maximum's index over the block (VS_DRAW_NONE when no thread has one). */
__device__ static int vs_draw_argmax(float bv, int bi, vs_draw_smem *s) {
  for (int off = 16; off > 0; off >>= 1) {
    float ov = __shfl_xor_sync(VS_DRAW_FULL, bv, off);
    int oi = __shfl_xor_sync(VS_DRAW_FULL, bi, off);
    if (vs_draw_better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s->fred[threadIdx.x >> 5] = bv, s->ired[threadIdx.x >> 5] = bi;
  __syncthreads();
  for (int w = 0; w < (int)(blockDim.x >> 5); w++)
    if (vs_draw_better(s->fred[w], s->ired[w], bv, bi)) bv = s->fred[w], bi = s->ired[w];
  return bi;
}

/* Exclusive prefix sum of v in thread order; *total: the sum of all. */
template <typename T>
__device__ static T vs_draw_scan(T v, T *red, T *total) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T incl = v;
  for (int off = 1; off < 32; off <<= 1) {
    T y = __shfl_up_sync(VS_DRAW_FULL, incl, off);
    if (lane >= off) incl += y;
  }
  T excl = __shfl_up_sync(VS_DRAW_FULL, incl, 1);
  if (lane == 0) excl = 0;
  __syncthreads();
  if (lane == 31) red[warp] = incl;
  __syncthreads();
  T base = 0, all = 0;
  for (int w = 0; w < (int)(blockDim.x >> 5); w++) {
    if (w == warp) base = all;
    all += red[w];
  }
  *total = all;
  return base + excl;
}

/* Thread t's chunk of the vocabulary in index order is [start(t), start(t + 1)). */
__device__ static inline int vs_draw_chunk_start(int t, int chunk, int V) {
  long long s = (long long)t * chunk;
  return s < V ? (int)s : V;
}

/* ---- radix select ---------------------------------------------------------------------- */

/* Warp 0, after a histogram: the first bucket, from 255 down, that holds entries and whose
 * cumulative value (s->above plus the buckets from 255 down to it) satisfies the predicate:
 * count >= k (mode 0), or crossed top_p (mode 1: masses; on the first level z, the total,
 * is the sum of the histogram). s->digit gets the bucket (-1: none), s->above the cumulative
 * value of the buckets above it. Lane l owns buckets 255 - 8l down to 248 - 8l. */
__device__ static void vs_draw_walk(vs_draw_smem *s, int mode, vs_u64 k, float top_p,
                                    int first) {
  int lane = threadIdx.x;
  vs_u64 above = s->above, own = 0;
  for (int q = 0; q < 8; q++) {
    int d = 255 - 8 * lane - q;
    own += mode ? s->hm[d] : (vs_u64)s->hc[d];
  }
  vs_u64 incl = own;
  for (int off = 1; off < 32; off <<= 1) {
    vs_u64 y = __shfl_up_sync(VS_DRAW_FULL, incl, off);
    if (lane >= off) incl += y;
  }
  double z = 0.0;
  if (mode) z = first ? (double)__shfl_sync(VS_DRAW_FULL, incl, 31) : s->z;
  vs_u64 run = above + (incl - own);
  int found = -1;
  vs_u64 before = 0;
  for (int q = 0; q < 8; q++) {
    int d = 255 - 8 * lane - q;
    vs_u64 next = run + (mode ? s->hm[d] : (vs_u64)s->hc[d]);
    if (found < 0 && s->hc[d] != 0 && (mode ? vs_draw_crossed(next, z, top_p) : next >= k)) {
      found = d;
      before = run;
    }
    run = next;
  }
  unsigned hit = __ballot_sync(VS_DRAW_FULL, found >= 0);
  __syncwarp();
  if (lane == 0) {
    if (mode && first) s->z = z;
    if (!hit) s->digit = -1;
  }
  if (hit && lane == __ffs(hit) - 1) {
    s->digit = found;
    s->above = before;
  }
}

/* The key of the threshold: mode 0 (top-k) the k-th largest of every value; mode 1 (top-p)
 * the largest candidate value (> -inf, >= thr_k) whose mass of candidates >= it crosses
 * top_p. Returns 0 when no bucket qualifies (top-p: the total did not cross). *count and
 * *mass: the entries with the threshold's key and their mass; *above: the mass of the
 * candidates above it. Every thread calls it. */
__device__ static int vs_draw_select(vs_draw_smem *s, const vs_draw_row &r, int V, int mode,
                                     vs_u64 k, float thr_k, float mx, double fx_scale,
                                     float top_p, uint32_t *key, unsigned *count,
                                     vs_u64 *mass, vs_u64 *above) {
  uint32_t prefix = 0;
  for (int level = 0; level < 4; level++) {
    int shift = 24 - 8 * level;
    for (int b = threadIdx.x; b < 256; b += blockDim.x) s->hc[b] = 0, s->hm[b] = 0;
    if (threadIdx.x == 0 && level == 0) s->above = 0;
    __syncthreads(); /* also: every thread has read the previous level's result */
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
      float v = r.val(j);
      if (mode && (!(v > -INFINITY) || v < thr_k)) continue; /* not a top-p candidate */
      uint32_t kk = vs_draw_key(v);
      if (level > 0 && ((kk ^ prefix) >> (shift + 8)) != 0) continue; /* another bucket */
      unsigned d = (kk >> shift) & 255u;
      atomicAdd(&s->hc[d], 1u);
      if (mode) atomicAdd(&s->hm[d], vs_draw_fx(v, mx, fx_scale));
    }
    __syncthreads();
    if (threadIdx.x < 32) vs_draw_walk(s, mode, k, top_p, level == 0);
    __syncthreads();
    int d = s->digit; /* the same in every thread */
    if (d < 0) {
      __syncthreads();
      return 0;
    }
    prefix |= (uint32_t)d << shift;
    if (level == 3) *count = s->hc[d], *mass = s->hm[d], *above = s->above;
  }
  __syncthreads(); /* the histogram is free again */
  *key = prefix;
  return 1;
}

/* ---- the kernel --------------------------------------------------------------------------- */

__global__ void __launch_bounds__(VS_DRAW_THREADS) vs_k_sample_tokens(vs_draw_args a) {
  __shared__ vs_draw_smem s;
  const int node = blockIdx.x, V = a.vocab, tid = threadIdx.x, nt = blockDim.x;
  const float *base = a.logits + (size_t)node * a.rows * V;
  vs_draw_row r;
  r.c = base;
  r.uc = a.rows == 2 && (!a.guided || a.guided[node]) ? base + V : NULL;
  r.scale = a.cfg_scale;
  r.t = a.t;

  if (a.greedy) { /* the first maximum of the mixed logits, NaN skipped */
    float bv = -INFINITY;
    int bi = VS_DRAW_NONE;
    for (int j = tid; j < V; j += nt) {
      float v = r.raw(j);
      if (v == v && (bi == VS_DRAW_NONE || v > bv)) bv = v, bi = j;
    }
    bi = vs_draw_argmax(bv, bi, &s);
    if (tid == 0) a.tokens[node] = bi == VS_DRAW_NONE ? 0 : bi;
    return;
  }

  float mx = -INFINITY;
  for (int j = tid; j < V; j += nt) mx = fmaxf(mx, r.val(j));
  mx = vs_draw_max(mx, &s);
  if (!(mx > -INFINITY) || mx == INFINITY) { /* no mass (+inf: the host's softmax is NaN) */
    if (tid == 0) a.tokens[node] = -1;
    return;
  }

  uint32_t key;
  unsigned cnt;
  vs_u64 mass, above;
  float thr_k = -INFINITY; /* keep v >= thr_k */
  if (a.top_k > 0 && vs_draw_select(&s, r, V, 0, (vs_u64)a.top_k, 0.0f, mx, a.fx_scale, 0.0f,
                                    &key, &cnt, &mass, &above))
    thr_k = vs_draw_key_value(key);

  /* top-p: keep v > thr_p, and v == thr_p at indices <= tie_last */
  int has_p = a.has_p;
  float thr_p = -INFINITY;
  int tie_last = VS_DRAW_NONE;
  if (has_p && vs_draw_select(&s, r, V, 1, 0, thr_k, mx, a.fx_scale, a.top_p, &key, &cnt,
                              &mass, &above)) {
    thr_p = vs_draw_key_value(key);
    if (tid == 0) { /* the least tie count j whose mass crosses; j = cnt does */
      vs_u64 w = mass / cnt; /* every tie has the same value, hence the same mass */
      unsigned lo = 1, hi = cnt;
      while (lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        if (vs_draw_crossed(above + (vs_u64)mid * w, s.z, a.top_p)) hi = mid;
        else lo = mid + 1;
      }
      s.jstar = (int)lo;
      s.tie_last = VS_DRAW_NONE; /* set below by the thread holding the j-th tie */
    }
    __syncthreads();
    int jstar = s.jstar;
    if ((unsigned)jstar < cnt) { /* uniform: the j-th tie in index order is the last kept */
      int chunk = (V + nt - 1) / nt, lo = vs_draw_chunk_start(tid, chunk, V);
      int hi = vs_draw_chunk_start(tid + 1, chunk, V), ties = 0, all;
      for (int j = lo; j < hi; j++) ties += r.val(j) == thr_p;
      int ex = vs_draw_scan<int>(ties, s.ired, &all);
      if (ex < jstar && jstar <= ex + ties) {
        int need = jstar - ex;
        for (int j = lo; j < hi; j++)
          if (r.val(j) == thr_p && --need == 0) {
            s.tie_last = j;
            break;
          }
      }
      __syncthreads();
      tie_last = s.tie_last;
    }
  } else {
    has_p = 0; /* off, or no crossing: every candidate stays */
  }

  /* softmax of the kept entries */
#define VS_DRAW_KEPT(v, j)                                                                   \
  ((v) > -INFINITY && (v) >= thr_k &&                                                          \
   (!has_p || (v) > thr_p || ((v) == thr_p && (j) <= tie_last)))
  double se = 0.0;
  for (int j = tid; j < V; j += nt) {
    float v = r.val(j);
    if (VS_DRAW_KEPT(v, j)) se += vs_exp_poly(v - mx);
  }
  const float fsum = (float)vs_draw_sum(se, &s);

  /* the inverse-CDF draw: chunk sums, their scan, then the walk in each chunk */
  int chunk = (V + nt - 1) / nt, lo = vs_draw_chunk_start(tid, chunk, V);
  int hi = vs_draw_chunk_start(tid + 1, chunk, V), lastp = -1;
  double cs = 0.0, total;
  for (int j = lo; j < hi; j++) {
    float v = r.val(j);
    float p = VS_DRAW_KEPT(v, j) ? __fdiv_rn(vs_exp_poly(v - mx), fsum) : 0.0f;
    if (p > 0.0f) cs += p, lastp = j;
  }
  double run = vs_draw_scan<double>(cs, s.dred, &total);
  int last = vs_draw_iext(lastp, 1, &s);
  if (last < 0) {
    if (tid == 0) a.tokens[node] = -1;
    return;
  }
  double target = a.u[node] * total;
  int found = VS_DRAW_NONE;
  for (int j = lo; j < hi; j++) {
    float v = r.val(j);
    float p = VS_DRAW_KEPT(v, j) ? __fdiv_rn(vs_exp_poly(v - mx), fsum) : 0.0f;
    if (!(p > 0.0f)) continue; /* the running sum cannot cross on a zero entry */
    run += p;
    if (run > target) {
      found = j;
      break;
    }
  }
#undef VS_DRAW_KEPT
  found = vs_draw_iext(found, 0, &s);
  if (tid == 0) a.tokens[node] = found < last ? found : last;
}

void vs_cuda_sample_tokens(vspec_dev *dev, const float *logits, const vspec_sample_spec *spec,
                           int32_t *tokens) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (!spec || spec->n <= 0 || spec->vocab <= 0 || d->failed) return;
  int greedy = !(spec->temperature > 0.0f);
  if (spec->rows < 1 || !logits || !tokens || (!greedy && !spec->u)) {
    vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: sample_tokens: bad arguments", d->head.index);
    return;
  }
  if (!vs_cuda_enter(d)) return;
  int V = spec->vocab, lg = 0;
  while (((int64_t)1 << lg) < V) lg++;
  vs_draw_args a;
  a.logits = logits;
  a.guided = spec->guided;
  a.u = spec->u;
  a.tokens = tokens;
  a.rows = spec->rows;
  a.vocab = V;
  a.top_k = spec->top_k > 0 && spec->top_k < V ? spec->top_k : 0;
  a.has_p = spec->top_p < 1.0f;
  a.greedy = greedy;
  a.cfg_scale = spec->cfg_scale;
  a.t = spec->temperature > 1e-5f ? spec->temperature : 1e-5f;
  a.top_p = spec->top_p;
  a.fx_scale = ldexp(1.0, 62 - lg);
  vs_k_sample_tokens<<<(unsigned)spec->n, VS_DRAW_THREADS, 0, d->stream>>>(a);
  VS_CUDA_LAUNCHED(d, "sample_tokens");
}
