/*
 * kernels/cpu/cpu_walk.c - verify_walk (ABI 1.6, include/vspec/ops_list.h) on the CPU: the
 * engine's host walk (core/verify_walk.c: SpecInfer's multi-candidate verification, arXiv
 * 2305.09781 §4; EAGLE's tree walk, arXiv 2401.15077 §4.2) step for step, with the rules'
 * maths from kernels/common/vs_walk_rules.h (the plugins' and the CUDA kernel's too) instead
 * of the plugins' vtables, and the distributions from the host sampler (kernels/host/), so
 * that the path, the next token and the draws taken from each stream are the host walk's
 * bit for bit (tests/test_device_walk.c compares them on random trees for every rule).
 *
 * The walk's order of operations is the host walk's: the target distribution at a node, the
 * children in index order, one accept uniform per judged candidate, the residual normalised
 * by a sequential double sum (or the fallbacks when it has no mass), the tried token removed
 * from the draft distribution, one target uniform for the token after the path.
 */
#include <string.h>

#include "kernels/common/vs_philox.h"
#include "kernels/common/vs_walk_rules.h"
#include "kernels/cpu/cpu_dev.h"
#include "kernels/host/host_math.h"

typedef struct vs_walk {
  const float *logits;
  const vspec_walk_spec *sp;
  int V;
  float *mixed, *q, *q_res, *q_tmp, *p_work;
  void *work; /* vs_host_logits_to_probs' top-k / top-p arrays */
  vspec_rng acc, tgt;
  vspec_walk_result *out;
} vs_walk;

/* core/verify_walk.c's vs__normalise and vs__mass: sequential double sums. */
static void cw_normalise(float *p, int n) {
  double s = 0.0;
  for (int i = 0; i < n; i++) s += p[i];
  if (s > 0.0)
    for (int i = 0; i < n; i++) p[i] = (float)(p[i] / s);
}

static double cw_mass(const float *p, int n) {
  double s = 0.0;
  for (int i = 0; i < n; i++) s += p[i];
  return s;
}

/* The target distribution after `node` (core/sampling.c vs_node_distribution), processed
 * with temperature t, top_k and top_p. */
static void cw_dist(vs_walk *w, int node, float t, int top_k, float top_p, float *probs) {
  const vspec_sample_spec *s = &w->sp->sample;
  const float *l = w->logits + (size_t)node * s->rows * w->V;
  if (s->rows == 2 && (!s->guided || s->guided[node])) {
    vs_host_cfg_combine(l, l + w->V, (size_t)w->V, s->cfg_scale, w->mixed);
    l = w->mixed;
  }
  vs_host_logits_to_probs(l, w->V, t, top_k, top_p, probs, w->work);
}

/* The first child of `node` after index `after` (children in index order), or -1. */
static int32_t cw_child(const vspec_walk_spec *sp, int32_t node, int32_t after) {
  for (int32_t j = after + 1; j < sp->sample.n; j++)
    if (sp->parents[j] == node) return j;
  return -1;
}

/* c->q_res := norm(residual) after candidate `ch` (the `rank`-th child tried) was rejected,
 * with the host walk's fallbacks when it has no mass. */
static void cw_reject(vs_walk *w, const vs_walk_cand *c, int depth, int32_t node,
                      int32_t ch) {
  const vspec_walk_rule *r = &w->sp->rule;
  int V = w->V;
  vs_walk_res s = vs_walk_residual_setup(r, c, depth);
  for (int y = 0; y < V; y++) w->q_tmp[y] = vs_walk_residual_at(r, c, &s, y);
  for (int i = 0; i < s.n_fix; i++) vs_walk_fix(r, c, &s, i, w->q_tmp);
  if (cw_mass(w->q_tmp, V) > 0.0) {
    memcpy(w->q_res, w->q_tmp, (size_t)V * sizeof(float));
    cw_normalise(w->q_res, V);
    return;
  }
  /* Fallback: the target distribution without the candidates rejected so far. */
  w->out->fallbacks++;
  memcpy(w->q_res, w->q, (size_t)V * sizeof(float));
  for (int32_t j = cw_child(w->sp, node, node); j >= 0; j = cw_child(w->sp, node, j)) {
    w->q_res[w->sp->tokens[j]] = 0.0f;
    if (j == ch) break;
  }
  if (cw_mass(w->q_res, V) > 0.0) cw_normalise(w->q_res, V);
  else memcpy(w->q_res, w->q, (size_t)V * sizeof(float));
}

static int32_t cw_argmax_first(const float *p, int n) {
  int32_t best = 0; /* plain comparisons, as the engine's vs_argmax_first */
  for (int i = 1; i < n; i++)
    if (p[i] > p[best]) best = i;
  return best;
}

/* Judges node's children; returns the accepted one or -1 (q_res then holds the residual). */
static int32_t cw_node(vs_walk *w, int32_t node, int depth, int greedy) {
  const vspec_walk_spec *sp = w->sp;
  const vspec_walk_rule *r = &sp->rule;
  int V = w->V;
  memcpy(w->q_res, w->q, (size_t)V * sizeof(float));
  int relaxed_greedy = greedy && r->kind == VSPEC_WALK_PROXIMITY;
  if (relaxed_greedy) /* the target's unfiltered softmax (core/verify_walk.c says why) */
    cw_dist(w, node, 1.0f, 0, 1.0f, w->q_res);
  int32_t di = sp->dist ? sp->dist[node] : -1;
  int sampled = di >= 0 && sp->dists;
  if (sampled) memcpy(w->p_work, sp->dists + (size_t)di * V, (size_t)V * sizeof(float));
  for (int32_t ch = cw_child(sp, node, node); ch >= 0; ch = cw_child(sp, node, ch)) {
    int32_t x = sp->tokens[ch];
    if (x < 0 || x >= V) return -2;
    float px = sampled ? w->p_work[x] : 1.0f;
    if (!(px > 0.0f)) continue; /* no draft mass: skipped, as EAGLE's evaluate_posterior does */
    vs_walk_cand c = {w->q_res, sampled ? w->p_work : NULL, px, x, V, sp->neighbours,
                      sp->table_k};
    if (!sp->neighbours || sp->table_k <= 0) c.table = NULL;
    w->out->tried++;
    int ok;
    if (relaxed_greedy) {
      double pool = vs_walk_pool_of(&c, r->k, r->budget_abs, r->budget_rel, x, NULL);
      ok = 1;
      for (int y = 0; y < V && ok; y++)
        if (vs_walk_greedy_beats(w->q_res, x, y, pool, r->reference)) ok = 0;
    } else if (greedy) {
      ok = x == cw_argmax_first(w->q, V);
    } else {
      double a = vs_walk_accept(r, &c, depth);
      w->out->accept_draws++;
      ok = vs_rng_uniform(&w->acc) < a;
    }
    if (ok) return ch;
    if (greedy) continue;
    cw_reject(w, &c, depth, node, ch);
    if (sampled) { /* the next sibling was drawn from p without the tokens tried so far */
      w->p_work[x] = 0.0f;
      cw_normalise(w->p_work, V);
    }
  }
  return -1;
}

static int cw_valid(const float *logits, const vspec_walk_spec *sp, vspec_walk_result *out) {
  const vspec_sample_spec *s = &sp->sample;
  if (!logits || !out || s->n < 1 || s->vocab < 1 || (s->rows != 1 && s->rows != 2) ||
      !sp->parents || !sp->tokens || sp->parents[0] != -1)
    return 0;
  if (sp->rule.kind != VSPEC_WALK_EXACT && sp->rule.kind != VSPEC_WALK_OMEGA &&
      sp->rule.kind != VSPEC_WALK_PROXIMITY)
    return 0;
  for (int j = 1; j < s->n; j++)
    if (sp->parents[j] < 0 || sp->parents[j] >= j) return 0;
  return 1;
}

void vs_cpu_verify_walk(vspec_dev *dev, const float *logits, const vspec_walk_spec *spec,
                        vspec_walk_result *out) {
  VS_CPU_UNRECORDED(dev, "verify_walk");
  if (!out) return;
  memset(out, 0, sizeof *out);
  out->next = -1;
  out->status = VSPEC_EINVAL;
  if (!spec || !cw_valid(logits, spec, out)) return;
  int V = spec->sample.vocab;
  size_t row = vs_host_align_up((size_t)V * sizeof(float));
  unsigned char *m = vs_scratch(dev, 5 * row + vs_host_probs_work_bytes(V));
  vs_walk w = {.logits = logits, .sp = spec, .V = V, .acc = spec->accept, .tgt = spec->target,
               .out = out};
  w.mixed = (float *)(void *)m;
  w.q = (float *)(void *)(m + row);
  w.q_res = (float *)(void *)(m + 2 * row);
  w.q_tmp = (float *)(void *)(m + 3 * row);
  w.p_work = (float *)(void *)(m + 4 * row);
  w.work = m + 5 * row;
  const vspec_sample_spec *s = &spec->sample;
  int greedy = !(s->temperature > 0.0f);
  int32_t node = 0, next;
  out->path[out->n_path++] = 0;
  for (;;) {
    cw_dist(&w, node, s->temperature, s->top_k, s->top_p, w.q);
    int32_t ch = cw_child(spec, node, node) >= 0 ? cw_node(&w, node, out->n_path, greedy)
                                                      : -1;
    if (ch == -2) return; /* a drafted token outside the vocabulary */
    if (ch >= 0) {
      if (out->n_path == VSPEC_WALK_MAX_PATH) return;
      out->path[out->n_path++] = ch;
      node = ch;
      continue;
    }
    /* A leaf: the bonus token from the target; all rejected: the draw from the residual. */
    const float *from = cw_child(spec, node, node) >= 0 ? w.q_res : w.q;
    if (greedy) {
      next = cw_argmax_first(w.q, V);
    } else {
      out->target_draws++;
      next = vs_host_sample(from, V, vs_rng_uniform(&w.tgt));
    }
    break;
  }
  out->next = next;
  out->status = next < 0 ? VSPEC_EINVAL : VSPEC_OK;
}
