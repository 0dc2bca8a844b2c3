/*
 * kernels/cuda/cuda_draw.h - the block-wide machinery of sample_tokens (cuda_draw.cu, whose
 * comment explains it) as device functions, for the kernels that need a node's processed
 * distribution: sample_tokens' draw and verify_walk's walk (cuda_walk.cu). One block of
 * VS_DRAW_THREADS threads works on one node; every function is called by every thread.
 * Included by .cu files only (static device functions: each file gets its own copy).
 */
#ifndef VS_CUDA_DRAW_H
#define VS_CUDA_DRAW_H

#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "kernels/common/vs_math.h"
#include "kernels/cuda/cuda_dev.h"

#define VS_DRAW_THREADS 1024
#define VS_DRAW_FULL 0xffffffffu
#define VS_DRAW_NONE INT_MAX /* no index */

typedef unsigned long long vs_u64;

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

/* The host's vs_host_sample over probabilities prob(j) (positive entries, index order): the
 * first j whose cumulative probability exceeds u x total, the last positive entry when
 * rounding runs past, -1 for none. Chunk sums, their scan, then the walk in each chunk;
 * prob is evaluated twice per entry, the same value each time. Every thread gets the token.
 * sample_tokens' and draw_probs' draw (cuda_draw.cu) and the walk's (cuda_walk.cu). */
template <typename Prob>
__device__ static int vs_draw_pick(vs_draw_smem *s, int V, double u, Prob prob) {
  const int tid = threadIdx.x, nt = blockDim.x;
  int chunk = (V + nt - 1) / nt, lo = vs_draw_chunk_start(tid, chunk, V);
  int hi = vs_draw_chunk_start(tid + 1, chunk, V), lastp = -1;
  double cs = 0.0, total;
  for (int j = lo; j < hi; j++) {
    float p = prob(j);
    if (p > 0.0f) cs += p, lastp = j;
  }
  double run = vs_draw_scan<double>(cs, s->dred, &total);
  int last = vs_draw_iext(lastp, 1, s);
  if (last < 0) return -1;
  double target = u * total;
  int found = VS_DRAW_NONE;
  for (int j = lo; j < hi; j++) {
    float p = prob(j);
    if (!(p > 0.0f)) continue; /* the running sum cannot cross on a zero entry */
    run += p;
    if (run > target) {
      found = j;
      break;
    }
  }
  found = vs_draw_iext(found, 0, s);
  return found < last ? found : last;
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

/* ---- a node's distribution ---------------------------------------------------------------- */

/* Which entries of a node's processed logits survive (top-k, top-p) and their softmax: the
 * entry v at index j has probability prob(v, j). Found by vs_draw_cut_find. */
struct vs_draw_cut {
  float mx;        /* the largest value */
  float thr_k;     /* keep v >= thr_k */
  int has_p;       /* top-p cut: keep v > thr_p, and v == thr_p at indices <= tie_last */
  float thr_p;
  int tie_last;
  float fsum;      /* the kept entries' sum of e^(v - mx), rounded to float */
  __device__ bool kept(float v, int j) const {
    return v > -INFINITY && v >= thr_k &&
           (!has_p || v > thr_p || (v == thr_p && j <= tie_last));
  }
  __device__ float prob(float v, int j) const {
    return kept(v, j) ? __fdiv_rn(vs_exp_poly(v - mx), fsum) : 0.0f;
  }
};

/* The top-k and top-p thresholds of a node (radix selects, above) and its softmax sum; every
 * thread calls it and gets the same cut. False when the node has no mass (no finite value, or
 * a +inf one: the host's softmax gives NaN then). top_k 0: off; has_p: top_p < 1. */
__device__ static bool vs_draw_cut_find(vs_draw_smem *s, const vs_draw_row &r, int V, int top_k,
                                        int has_p, float top_p, double fx_scale,
                                        vs_draw_cut *out) {
  const int tid = threadIdx.x, nt = blockDim.x;
  float mx = -INFINITY;
  for (int j = tid; j < V; j += nt) mx = fmaxf(mx, r.val(j));
  mx = vs_draw_max(mx, s);
  if (!(mx > -INFINITY) || mx == INFINITY) return false;

  uint32_t key;
  unsigned cnt;
  vs_u64 mass, above;
  float thr_k = -INFINITY; /* keep v >= thr_k */
  if (top_k > 0 && vs_draw_select(s, r, V, 0, (vs_u64)top_k, 0.0f, mx, fx_scale, 0.0f, &key,
                                  &cnt, &mass, &above))
    thr_k = vs_draw_key_value(key);

  /* top-p: keep v > thr_p, and v == thr_p at indices <= tie_last */
  float thr_p = -INFINITY;
  int tie_last = VS_DRAW_NONE;
  if (has_p && vs_draw_select(s, r, V, 1, 0, thr_k, mx, fx_scale, top_p, &key, &cnt, &mass,
                              &above)) {
    thr_p = vs_draw_key_value(key);
    if (tid == 0) { /* the least tie count j whose mass crosses; j = cnt does */
      vs_u64 w = mass / cnt; /* every tie has the same value, hence the same mass */
      unsigned lo = 1, hi = cnt;
      while (lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        if (vs_draw_crossed(above + (vs_u64)mid * w, s->z, top_p)) hi = mid;
        else lo = mid + 1;
      }
      s->jstar = (int)lo;
      s->tie_last = VS_DRAW_NONE; /* set below by the thread holding the j-th tie */
    }
    __syncthreads();
    int jstar = s->jstar;
    if ((unsigned)jstar < cnt) { /* uniform: the j-th tie in index order is the last kept */
      int chunk = (V + nt - 1) / nt, lo = vs_draw_chunk_start(tid, chunk, V);
      int hi = vs_draw_chunk_start(tid + 1, chunk, V), ties = 0, all;
      for (int j = lo; j < hi; j++) ties += r.val(j) == thr_p;
      int ex = vs_draw_scan<int>(ties, s->ired, &all);
      if (ex < jstar && jstar <= ex + ties) {
        int need = jstar - ex;
        for (int j = lo; j < hi; j++)
          if (r.val(j) == thr_p && --need == 0) {
            s->tie_last = j;
            break;
          }
      }
      __syncthreads();
      tie_last = s->tie_last;
    }
  } else {
    has_p = 0; /* off, or no crossing: every candidate stays */
  }
  vs_draw_cut c;
  c.mx = mx;
  c.thr_k = thr_k;
  c.has_p = has_p;
  c.thr_p = thr_p;
  c.tie_last = tie_last;
  c.fsum = 1.0f;
  /* softmax of the kept entries */
  double se = 0.0;
  for (int j = tid; j < V; j += nt) {
    float v = r.val(j);
    if (c.kept(v, j)) se += vs_exp_poly(v - mx);
  }
  c.fsum = (float)vs_draw_sum(se, s);
  *out = c;
  return true;
}

#endif /* VS_CUDA_DRAW_H */
