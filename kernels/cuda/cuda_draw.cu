/*
 * kernels/cuda/cuda_draw.cu - sample_tokens (ABI 1.4, include/vspec/ops.h) on the device: a
 * token per node from its logits, as the engine's host sampler draws it; draw_probs (ABI 1.8),
 * which keeps the distribution; draw_children (ABI 1.10), a tree's children from those rows
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

#include "kernels/cuda/cuda_draw.h"

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

/* ---- the kernels -------------------------------------------------------------------------- */

/* The inverse-CDF draw over the cut's probabilities at u: chunk sums, their scan, then the
 * walk in each chunk. -1 when nothing has mass. Every thread gets the token. */
__device__ static int vs_draw_invcdf(vs_draw_smem *s, const vs_draw_row &r, const vs_draw_cut &c,
                                     int V, double u) {
  return vs_draw_pick(s, V, u, [&](int j) { return c.prob(r.val(j), j); });
}


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

  vs_draw_cut c;
  if (!vs_draw_cut_find(&s, r, V, a.top_k, a.has_p, a.top_p, a.fx_scale, &c)) {
    if (tid == 0) a.tokens[node] = -1; /* no mass */
    return;
  }

  int tok = vs_draw_invcdf(&s, r, c, V, a.u[node]);
  if (tid == 0) a.tokens[node] = tok;
}

/* draw_probs (ABI 1.8): sample_tokens' distribution written out, then its draw at u (or, u
 * NULL, the row's first maximum). Without mass: a zero row and token 0. */
__global__ void __launch_bounds__(VS_DRAW_THREADS) vs_k_draw_probs(vs_draw_args a, float *probs) {
  __shared__ vs_draw_smem s;
  const int node = blockIdx.x, V = a.vocab, tid = threadIdx.x, nt = blockDim.x;
  const float *base = a.logits + (size_t)node * a.rows * V;
  float *out = probs + (size_t)node * V;
  vs_draw_row r;
  r.c = base;
  r.uc = a.rows == 2 && (!a.guided || a.guided[node]) ? base + V : NULL;
  r.scale = a.cfg_scale;
  r.t = a.t;
  vs_draw_cut c;
  if (!vs_draw_cut_find(&s, r, V, a.top_k, a.has_p, a.top_p, a.fx_scale, &c)) {
    for (int j = tid; j < V; j += nt) out[j] = 0.0f;
    if (tid == 0) a.tokens[node] = 0;
    return;
  }
  float bv = -1.0f;
  int bi = VS_DRAW_NONE;
  for (int j = tid; j < V; j += nt) {
    float p = c.prob(r.val(j), j);
    out[j] = p;
    if (p > bv) bv = p, bi = j; /* ascending j: a thread keeps its first maximum */
  }
  int tok = a.u ? vs_draw_invcdf(&s, r, c, V, a.u[node]) : vs_draw_argmax(bv, bi, &s);
  if (tid == 0) a.tokens[node] = tok < 0 || tok == VS_DRAW_NONE ? 0 : tok;
}

/* The kernels' arguments from a spec, normalised. */
static vs_draw_args cd_args(const vspec_sample_spec *spec, const float *logits, int32_t *tokens) {
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
  a.greedy = !(spec->temperature > 0.0f);
  a.cfg_scale = spec->cfg_scale;
  a.t = spec->temperature > 1e-5f ? spec->temperature : 1e-5f;
  a.top_p = spec->top_p;
  a.fx_scale = ldexp(1.0, 62 - lg);
  return a;
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
  vs_draw_args a = cd_args(spec, logits, tokens);
  vs_k_sample_tokens<<<(unsigned)spec->n, VS_DRAW_THREADS, 0, d->stream>>>(a);
  VS_CUDA_LAUNCHED(d, "sample_tokens");
}

void vs_cuda_draw_probs(vspec_dev *dev, const float *logits, const vspec_sample_spec *spec,
                        float *probs, int32_t *tokens) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (!spec || spec->n <= 0 || spec->vocab <= 0 || d->failed) return;
  if (spec->rows < 1 || !logits || !probs || !tokens || !(spec->temperature > 0.0f)) {
    vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: draw_probs: bad arguments", d->head.index);
    return;
  }
  if (!vs_cuda_enter(d)) return;
  vs_draw_args a = cd_args(spec, logits, tokens);
  vs_k_draw_probs<<<(unsigned)spec->n, VS_DRAW_THREADS, 0, d->stream>>>(a, probs);
  VS_CUDA_LAUNCHED(d, "draw_probs");
}

/* draw_children (ABI 1.10): one block, the rows one after the other (each row's uniforms
 * follow the rows before it), a row's children one after the other, each by vs_draw_pick over
 * the row with the children drawn so far read as zero (kept in shared memory, at most
 * VSPEC_CHILDREN_MAX), or with u NULL the first maximum of what is left: cpu_sampling.c's
 * vs_cpu_draw_children, the host drafter's dt_sample_children. */
__global__ void __launch_bounds__(VS_DRAW_THREADS)
    vs_k_draw_children(const float *probs, int n, int V, const int32_t *counts,
                       const int32_t *first, const int32_t *node, const double *u,
                       int32_t *cursor, uint8_t *drawn, int32_t *tokens) {
  __shared__ vs_draw_smem s;
  __shared__ int taken[VSPEC_CHILDREN_MAX];
  int at = u ? *cursor : 0; /* every thread keeps the same count */
  for (int row = 0; row < n; row++) {
    const float *p = probs + (size_t)row * V;
    int k0 = first[row], got = 0;
    int live = node[row] < 0 || drawn[node[row]];
    for (int j = 0; j < counts[row]; j++) {
      int x = -1;
      auto left = [&](int y) { /* the row without the children drawn so far */
        for (int i = 0; i < got; i++)
          if (taken[i] == y) return 0.0f;
        return p[y];
      };
      if (live && j < VSPEC_CHILDREN_MAX && u) {
        x = vs_draw_pick(&s, V, u[at], left);
      } else if (live && j < VSPEC_CHILDREN_MAX) { /* greedy: the first maximum left */
        float bv = -1.0f;
        int bi = VS_DRAW_NONE;
        for (int y = threadIdx.x; y < V; y += blockDim.x) {
          float v = left(y);
          if (v > bv) bv = v, bi = y; /* ascending y: a thread keeps its first maximum */
        }
        bi = vs_draw_argmax(bv, bi, &s);
        x = bi != VS_DRAW_NONE && left(bi) > 0.0f ? bi : -1;
      }
      live = x >= 0;
      at += live && u;
      if (threadIdx.x == 0) {
        drawn[k0 + j] = (uint8_t)live;
        tokens[k0 + j] = live ? x : got > 0 ? taken[0] : 0;
      }
      if (live) {
        __syncthreads(); /* every thread is past the reads of taken[] in this draw */
        if (threadIdx.x == 0) taken[got] = x;
        __syncthreads();
        got++;
      }
    }
    __syncthreads(); /* thread 0's drawn[] writes before a later row reads its node's */
  }
  if (threadIdx.x == 0 && u) *cursor = at;
}

void vs_cuda_draw_children(vspec_dev *dev, const float *probs, const vspec_children_spec *spec,
                           int32_t *tokens) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (!spec || spec->n <= 0 || spec->vocab <= 0 || d->failed) return;
  if (!probs || !tokens || !spec->counts || !spec->first || !spec->node ||
      (spec->u && !spec->cursor) || !spec->drawn || spec->max_count < 0 ||
      spec->max_count > VSPEC_CHILDREN_MAX) {
    vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: draw_children: bad arguments", d->head.index);
    return;
  }
  if (!vs_cuda_enter(d)) return;
  vs_k_draw_children<<<1, VS_DRAW_THREADS, 0, d->stream>>>(
      probs, spec->n, spec->vocab, spec->counts, spec->first, spec->node, spec->u, spec->cursor,
      spec->drawn, tokens);
  VS_CUDA_LAUNCHED(d, "draw_children");
}
