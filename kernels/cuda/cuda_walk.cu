/*
 * kernels/cuda/cuda_walk.cu - verify_walk (ABI 1.6, include/vspec/ops_list.h) on the device:
 * the engine's verification walk (core/verify_walk.c: SpecInfer's multi-candidate
 * verification, arXiv 2305.09781 §4; EAGLE's tree walk, arXiv 2401.15077 §4.2) for the
 * built-in rules, in one launch of one block, so that a round downloads the walk's result
 * instead of the tree's logits.
 *
 * The walk is kernels/cpu/cpu_walk.c's, step for step: the same rule maths
 * (kernels/common/vs_walk_rules.h, which the plugins and the CPU op compute with), the same
 * draws from the same Philox streams (kernels/common/vs_philox.h; thread 0 holds the streams
 * and makes every decision that depends on a draw), the same fallbacks. A node's target
 * distribution is sample_tokens' (cuda_draw.h: CFG mix, temperature, top-k and top-p by radix
 * select, the softmax), written to a scratch row. Vocabulary-wide steps run over the block:
 * a residual's elements, the sums that normalise it (block-wide in a fixed order: the result
 * is deterministic, but the host sums sequentially, so a probability can differ from the
 * CPU's in its last bit; a path or token then differs only where a uniform falls within that
 * rounding of an acceptance probability or a cumulative sum, as for sample_tokens), the
 * greedy tests and the draw. Sequential per candidate on thread 0: LANTERN's pool over the
 * neighbour row, the accept test, the residual's patches (a few entries).
 *
 * Scratch: four rows of vocab floats (q, the residual, its new value, the draft
 * distribution). A bad tree (a parent not before its child, a token outside the vocabulary)
 * is reported in the result's status; a bad spec (host-checkable) fails the context.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "kernels/common/vs_philox.h"
#include "kernels/common/vs_walk_rules.h"
#include "kernels/cuda/cuda_draw.h"

struct vs_walk_args {
  const float *logits;
  vspec_walk_spec sp; /* the host's spec, by value; its arrays are device memory */
  vspec_walk_result *out;
  float *buf;         /* scratch [4, vocab] */
  int greedy, top_k, has_p;
  float t;            /* max(temperature, 1e-5) */
  double fx_scale;    /* as sample_tokens' */
};

/* What thread 0 decides and every thread reads. */
struct vs_walk_smem {
  vs_draw_smem d;
  vs_walk_res res;
  double pool, u;
  int32_t child, x, flag, ok;
  float px;
};

/* ---- block-wide helpers (every thread calls them) ------------------------------------------ */

/* Sum of p[0 .. V) in double, in a fixed order. */
__device__ static double gw_sum(const float *p, int V, vs_draw_smem *s) {
  double a = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) a += p[j];
  return vs_draw_sum(a, s);
}

/* p = (float)(p / sum) where the sum is positive (core/verify_walk.c vs__normalise), from src. */
__device__ static void gw_normalise(float *p, const float *src, int V, vs_draw_smem *s) {
  double sum = gw_sum(src, V, s);
  if (sum > 0.0)
    for (int j = threadIdx.x; j < V; j += blockDim.x) p[j] = (float)(src[j] / sum);
  __syncthreads();
}

__device__ static void gw_copy(float *dst, const float *src, int V) {
  for (int j = threadIdx.x; j < V; j += blockDim.x) dst[j] = src[j];
  __syncthreads();
}

/* The host's vs_host_sample over p (cuda_draw.h, vs_draw_pick: sample_tokens' draw). */
__device__ static int gw_draw(const float *p, int V, double u, vs_draw_smem *s) {
  return vs_draw_pick(s, V, u, [p](int j) { return p[j]; });
}

/* The target distribution after `node` into probs (core/sampling.c vs_node_distribution):
 * greedy the one-hot at the first maximum of the mixed logits (returned; 0 when all are NaN),
 * else sample_tokens' processing (all zero when nothing has mass). Returns -1 when not greedy. */
__device__ static int gw_dist(const vs_walk_args &a, int node, int greedy, float t,
                              int top_k, int has_p, float *probs, vs_draw_smem *s) {
  const vspec_sample_spec &sp = a.sp.sample;
  const int V = sp.vocab, tid = threadIdx.x, nt = blockDim.x;
  const float *base = a.logits + (size_t)node * sp.rows * V;
  vs_draw_row r;
  r.c = base;
  r.uc = sp.rows == 2 && (!sp.guided || sp.guided[node]) ? base + V : NULL;
  r.scale = sp.cfg_scale;
  r.t = t;
  if (greedy) {
    float bv = -INFINITY;
    int bi = VS_DRAW_NONE;
    for (int j = tid; j < V; j += nt) {
      float v = r.raw(j);
      if (v == v && (bi == VS_DRAW_NONE || v > bv)) bv = v, bi = j;
    }
    bi = vs_draw_argmax(bv, bi, s);
    if (bi == VS_DRAW_NONE) bi = 0;
    for (int j = tid; j < V; j += nt) probs[j] = j == bi ? 1.0f : 0.0f;
    __syncthreads();
    return bi;
  }
  vs_draw_cut c;
  bool ok = vs_draw_cut_find(s, r, V, top_k, has_p, sp.top_p, a.fx_scale, &c);
  for (int j = tid; j < V; j += nt) probs[j] = ok ? c.prob(r.val(j), j) : 0.0f;
  __syncthreads();
  return -1;
}

/* ---- the walk ------------------------------------------------------------------------------ */

/* The first child of `node` after `after` (index order), or -1; thread 0. */
__device__ static int32_t gw_child(const vspec_walk_spec &sp, int32_t node, int32_t after) {
  for (int32_t j = after + 1; j < sp.sample.n; j++)
    if (sp.parents[j] == node) return j;
  return -1;
}

/* Thread 0's state: the streams and the counters of the result. */
struct vs_walk_t0 {
  vspec_rng acc, tgt;
  int32_t accept_draws, target_draws, tried, fallbacks;
};

/* After candidate ch (token x) at node was rejected: q_res := the normalised residual, with the
 * host walk's fallbacks. Every thread. */
__device__ static void gw_reject(const vs_walk_args &a, vs_walk_smem *sh, vs_walk_t0 *t0,
                                 const vs_walk_cand &c, int depth, int32_t node,
                                 int32_t ch, float *q, float *q_res, float *q_tmp) {
  const vspec_walk_rule *r = &a.sp.rule;
  const int V = c.vocab;
  if (threadIdx.x == 0) sh->res = vs_walk_residual_setup(r, &c, depth);
  __syncthreads();
  const vs_walk_res res = sh->res;
  for (int y = threadIdx.x; y < V; y += blockDim.x)
    q_tmp[y] = vs_walk_residual_at(r, &c, &res, y);
  __syncthreads();
  if (threadIdx.x == 0)
    for (int i = 0; i < res.n_fix; i++) vs_walk_fix(r, &c, &res, i, q_tmp);
  __syncthreads();
  double mass = gw_sum(q_tmp, V, &sh->d);
  if (mass > 0.0) {
    for (int y = threadIdx.x; y < V; y += blockDim.x) q_res[y] = (float)(q_tmp[y] / mass);
    __syncthreads();
    return;
  }
  /* Fallback: the target distribution without the candidates rejected so far. */
  gw_copy(q_res, q, V);
  if (threadIdx.x == 0) {
    t0->fallbacks++;
    for (int32_t j = gw_child(a.sp, node, node); j >= 0; j = gw_child(a.sp, node, j)) {
      q_res[a.sp.tokens[j]] = 0.0f;
      if (j == ch) break;
    }
  }
  __syncthreads();
  if (gw_sum(q_res, V, &sh->d) > 0.0) gw_normalise(q_res, q_res, V, &sh->d);
  else gw_copy(q_res, q, V);
}

/* Judges node's children (core/verify_walk.c's loop): the accepted child, -1 when every child
 * was rejected (q_res holds the residual), -2 for a token outside the vocabulary. amax: the
 * greedy target's argmax. */
__device__ static int32_t gw_node(const vs_walk_args &a, vs_walk_smem *sh, vs_walk_t0 *t0,
                                  int32_t node, int depth, int amax, float *q, float *q_res,
                                  float *q_tmp, float *p_work) {
  const vspec_walk_spec &sp = a.sp;
  const vspec_walk_rule *r = &sp.rule;
  const int V = sp.sample.vocab;
  const int relaxed_greedy = a.greedy && r->kind == VSPEC_WALK_PROXIMITY;
  if (relaxed_greedy) /* the target's unfiltered softmax, as the host walk's greedy rules */
    gw_dist(a, node, 0, 1.0f, 0, 0, q_res, &sh->d);
  else
    gw_copy(q_res, q, V);
  const int32_t di = sp.dist ? sp.dist[node] : -1;
  const int sampled = di >= 0 && sp.dists;
  if (sampled) gw_copy(p_work, sp.dists + (size_t)di * V, V);
  const int32_t *table = sp.neighbours && sp.table_k > 0 ? sp.neighbours : NULL;
  int32_t ch = -1;
  for (;;) {
    __syncthreads(); /* everyone has read the last broadcast */
    if (threadIdx.x == 0) {
      sh->child = gw_child(sp, node, ch);
      if (sh->child >= 0) {
        sh->x = sp.tokens[sh->child];
        sh->flag = sh->x < 0 || sh->x >= V;
        sh->px = sh->flag ? 0.0f : sampled ? p_work[sh->x] : 1.0f;
      }
    }
    __syncthreads();
    ch = sh->child;
    if (ch < 0) return -1;
    if (sh->flag) return -2;
    const int32_t x = sh->x;
    const float px = sh->px;
    if (!(px > 0.0f)) continue; /* no draft mass: skipped, as EAGLE's evaluate_posterior does */
    vs_walk_cand c = {q_res, sampled ? p_work : NULL, px, x, V, table, sp.table_k};
    if (threadIdx.x == 0) t0->tried++;
    int ok;
    if (relaxed_greedy) {
      if (threadIdx.x == 0)
        sh->pool = vs_walk_pool_of(&c, r->k, r->budget_abs, r->budget_rel, x, NULL);
      __syncthreads();
      const double pool = sh->pool;
      int beaten = 0;
      for (int y = threadIdx.x; y < V && !beaten; y += blockDim.x)
        beaten = vs_walk_greedy_beats(q_res, x, y, pool, r->reference);
      ok = !__syncthreads_or(beaten);
    } else if (a.greedy) {
      ok = x == amax;
    } else {
      if (threadIdx.x == 0) {
        double pa = vs_walk_accept(r, &c, depth);
        t0->accept_draws++;
        sh->ok = vs_rng_uniform(&t0->acc) < pa;
      }
      __syncthreads();
      ok = sh->ok;
    }
    if (ok) return ch;
    if (a.greedy) continue;
    gw_reject(a, sh, t0, c, depth, node, ch, q, q_res, q_tmp);
    if (sampled) { /* the next sibling was drawn from p without the tokens tried so far */
      if (threadIdx.x == 0) p_work[x] = 0.0f;
      __syncthreads();
      gw_normalise(p_work, p_work, V, &sh->d);
    }
  }
}

/* Thread 0: whether every parent comes before its child (node 0 the root). */
__device__ static int gw_tree_ok(const vspec_walk_spec &sp) {
  if (sp.parents[0] != -1) return 0;
  for (int j = 1; j < sp.sample.n; j++)
    if (sp.parents[j] < 0 || sp.parents[j] >= j) return 0;
  return 1;
}

__global__ void __launch_bounds__(VS_DRAW_THREADS) vs_k_verify_walk(vs_walk_args a) {
  __shared__ vs_walk_smem sh;
  const int V = a.sp.sample.vocab;
  float *q = a.buf, *q_res = a.buf + V, *q_tmp = a.buf + 2 * (size_t)V;
  float *p_work = a.buf + 3 * (size_t)V;
  vspec_walk_result *out = a.out;
  vs_walk_t0 t0 = {a.sp.accept, a.sp.target, 0, 0, 0, 0};
  if (threadIdx.x == 0) sh.flag = gw_tree_ok(a.sp);
  __syncthreads();
  if (!sh.flag) {
    if (threadIdx.x == 0) *out = vspec_walk_result{VSPEC_EINVAL, 0, -1};
    return;
  }
  int32_t node = 0, n_path = 1, next = -1, status = VSPEC_OK;
  if (threadIdx.x == 0) out->path[0] = 0;
  for (;;) {
    int amax = gw_dist(a, node, a.greedy, a.t, a.top_k, a.has_p, q, &sh.d);
    __syncthreads();
    if (threadIdx.x == 0) sh.child = gw_child(a.sp, node, node);
    __syncthreads();
    const int leaf = sh.child < 0;
    int32_t ch =
        leaf ? -1 : gw_node(a, &sh, &t0, node, n_path, amax, q, q_res, q_tmp, p_work);
    if (ch == -2 || (ch >= 0 && n_path == VSPEC_WALK_MAX_PATH)) {
      status = VSPEC_EINVAL;
      break;
    }
    if (ch >= 0) {
      if (threadIdx.x == 0) out->path[n_path] = ch;
      n_path++;
      node = ch;
      continue;
    }
    /* A leaf: the bonus token from the target; all rejected: the draw from the residual. */
    if (a.greedy) {
      next = amax;
    } else {
      __syncthreads();
      if (threadIdx.x == 0) {
        t0.target_draws++;
        sh.u = vs_rng_uniform(&t0.tgt);
      }
      __syncthreads();
      next = gw_draw(leaf ? q : q_res, V, sh.u, &sh.d);
    }
    if (next < 0) status = VSPEC_EINVAL;
    break;
  }
  if (threadIdx.x == 0) {
    out->status = status;
    out->n_path = n_path;
    out->next = next;
    out->accept_draws = t0.accept_draws;
    out->target_draws = t0.target_draws;
    out->tried = t0.tried;
    out->fallbacks = t0.fallbacks;
  }
}

void vs_cuda_verify_walk(vspec_dev *dev, const float *logits, const vspec_walk_spec *spec,
                         vspec_walk_result *out) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (d->failed) return;
  if (!spec || !logits || !out || spec->sample.n < 1 || spec->sample.vocab < 1 ||
      (spec->sample.rows != 1 && spec->sample.rows != 2) || !spec->parents || !spec->tokens ||
      (spec->rule.kind != VSPEC_WALK_EXACT && spec->rule.kind != VSPEC_WALK_OMEGA &&
       spec->rule.kind != VSPEC_WALK_PROXIMITY)) {
    vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: verify_walk: bad arguments", d->head.index);
    return;
  }
  if (!vs_cuda_enter(d)) return;
  int V = spec->sample.vocab, lg = 0;
  while (((int64_t)1 << lg) < V) lg++;
  float *buf = (float *)vs__cuda_op_scratch(d, 4 * (size_t)V * sizeof(float), "verify_walk");
  if (!buf) return; /* the failure is recorded */
  vs_walk_args a;
  a.logits = logits;
  a.sp = *spec;
  a.out = out;
  a.buf = buf;
  a.greedy = !(spec->sample.temperature > 0.0f);
  a.top_k = spec->sample.top_k > 0 && spec->sample.top_k < V ? spec->sample.top_k : 0;
  a.has_p = spec->sample.top_p < 1.0f;
  a.t = spec->sample.temperature > 1e-5f ? spec->sample.temperature : 1e-5f;
  a.fx_scale = ldexp(1.0, 62 - lg);
  vs_k_verify_walk<<<1, VS_DRAW_THREADS, 0, d->stream>>>(a);
  VS_CUDA_LAUNCHED(d, "verify_walk");
}
