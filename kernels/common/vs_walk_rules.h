/*
 * kernels/common/vs_walk_rules.h - the per-element maths of the built-in acceptance rules,
 * host and device (VS_HD): the plugins of plugins/accept/ compute with it (exact.c, omega.h
 * for uniform_rsd and coolsd, proximity.h for lantern and lanternpp), and so do the ops'
 * verify_walk on the CPU (kernels/cpu/cpu_walk.c) and on CUDA (kernels/cuda/cuda_walk.cu).
 * One copy of each formula is what makes the CPU tests cover the GPU's rules: a device walk
 * cannot drift from the host walk in a formula, only in the order of its sums.
 *
 * Every function reads one candidate x at one tree node: q the current target residual, p
 * the distribution x was drawn from (NULL: a one-hot draft at x, p(x) := 1). A residual is
 * written element by element (vs_walk_residual_at, every y independently: one thread each on
 * a GPU), then patched (vs_walk_fix: a few entries set after the elementwise pass, in any
 * order, since no two patches of one residual touch one entry with different values).
 *
 * The formulas and their sources:
 *   exact        min(1, q(x)/p(x)); residual max(0, q - p), q without x for one-hot drafts
 *                (Leviathan et al., arXiv 2211.17192; Chen et al., arXiv 2302.01318; EAGLE-2's
 *                one-hot residual, SafeAILab/EAGLE eagle/model/utils.py)
 *   omega        min(1, omega q(x)/p(x)); residual G* = q - min(p, omega q) (optimal) or
 *                max(0, q - p) (rule) (Cool-SD, arXiv 2601.09212 §3.2, Eqs. (10), (12))
 *   proximity    min(1, q(A(x))/p(x)), A(x) = x and the longest prefix of its k nearest codes
 *                whose mass stays within the budget abs + rel q(x) (LANTERN, arXiv 2410.03355
 *                §4.2-4.3; LANTERN++, arXiv 2502.06352; code: jadohu/LANTERN
 *                models/ea_model_llamagen.py); residuals: plugins/accept/proximity.h
 */
#ifndef VS_WALK_RULES_H
#define VS_WALK_RULES_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "vs_math.h"
#include "vspec/ops.h"

/* One candidate at one node. */
typedef struct vs_walk_cand {
  const float *q;       /* [vocab] the current target residual */
  const float *p;       /* [vocab] the draft distribution x was drawn from, NULL: one-hot */
  float p_x;            /* p(x); 1 for one-hot drafts */
  int32_t x, vocab;
  const int32_t *table; /* [vocab, table_k] codebook neighbours, closest first, or NULL */
  int32_t table_k;
} vs_walk_cand;

/* What a residual needs beyond the candidate, found once (one thread) before its elements. */
typedef struct vs_walk_res {
  double omega; /* OMEGA: omega at this depth */
  int32_t n_fix; /* entries vs_walk_fix patches */
} vs_walk_res;

/* omega of an OMEGA rule at draft depth d (1-based). */
VS_HD static inline double vs_walk_omega(const vspec_walk_rule *r, int d) {
  if (d < 1) d = 1;
  if (d > VSPEC_WALK_MAX_DEPTH) d = VSPEC_WALK_MAX_DEPTH;
  return r->omega[d];
}

/* ---- exact ------------------------------------------------------------------------------- */

VS_HD static inline double vs_walk_exact_accept(float q_x, float p_x) {
  double a = (double)q_x / (double)p_x;
  return a < 1.0 ? a : 1.0;
}

/* max(0, q - p) in float (sampled drafts); q itself, x removed, for a one-hot draft. */
VS_HD static inline float vs_walk_exact_residual_at(const vs_walk_cand *c, int y) {
  if (!c->p) return y == c->x ? 0.0f : c->q[y];
  float d = c->q[y] - c->p[y];
  return d > 0.0f ? d : 0.0f;
}

/* ---- omega (uniform_rsd, coolsd) ---------------------------------------------------------- */

VS_HD static inline double vs_walk_omega_accept(float q_x, float p_x, double omega) {
  double a = omega * (double)q_x / (double)p_x;
  return a < 1.0 ? a : 1.0;
}

/* G* = q - min(p, omega q) (optimal) or max(0, q - p), in double; a one-hot draft puts mass 1
 * on x and 0 elsewhere. */
VS_HD static inline float vs_walk_omega_residual_at(const vs_walk_cand *c, double omega,
                                                    int optimal, int y) {
  double p = c->p ? (double)c->p[y] : (y == c->x ? 1.0 : 0.0);
  double q = c->q[y];
  double take = p;
  if (optimal && omega * q < p) take = omega * q;
  double d = q - take;
  return d > 0.0 ? (float)d : 0.0f;
}

/* Cool-SD's annealed omega at depth i of a round of draft depth L (arXiv 2601.09212 §3.2,
 * Eq. (16)): exp omega_i = delta exp(-nu i) / mean_j exp(-nu j), linear w_i = max(0, 1 +
 * nu ((L + 1)/2 - i)), both normalised to mean delta over the L positions (plugins/accept/
 * coolsd.c says why). Host only: the walk gets the values in vspec_walk_rule.omega, so that
 * no device's exp() can differ from the host's in a bit. */
static inline double vs_walk_coolsd_omega(double delta, double nu, int linear, int i, int L) {
  if (L < 1) L = 1;
  if (L > VSPEC_WALK_MAX_DEPTH) L = VSPEC_WALK_MAX_DEPTH;
  if (i < 1) i = 1;
  if (i > L) i = L;
  double sum = 0.0, wi = 0.0;
  for (int j = 1; j <= L; j++) {
    double w = !linear ? exp(-nu * j) : 1.0 + nu * ((L + 1) / 2.0 - j);
    if (w < 0.0) w = 0.0;
    sum += w;
    if (j == i) wi = w;
  }
  return sum > 0.0 ? delta * wi * L / sum : delta;
}

/* ---- proximity (lantern, lanternpp) ------------------------------------------------------- */

/* Pooled probability q(A(x)) = q(x) + S_m* over row[0 .. min(k, row_len)); *m_out = m*. */
VS_HD static inline double vs_walk_pool(const float *q, const int32_t *row, int row_len, int k,
                                        int32_t x, double budget, int *m_out) {
  int kk = k < row_len ? k : row_len;
  double s = 0.0;
  int m = 0;
  for (; m < kk; m++) {
    double next = s + (double)q[row[m]];
    if (next > budget) break;
    s = next;
  }
  if (m_out) *m_out = m;
  return (double)q[x] + s;
}

/* The rule's k against the table the engine supplies (0 without one). */
VS_HD static inline int vs_walk_k(const vs_walk_cand *c, int k) {
  return c->table && c->table_k > 0 ? (k < c->table_k ? k : c->table_k) : 0;
}

/* q(A(y)) under the current residual with budget abs + rel q(y); *m_out = m* (may be NULL). */
VS_HD static inline double vs_walk_pool_of(const vs_walk_cand *c, int k, double b_abs,
                                           double b_rel, int32_t y, int *m_out) {
  if (!c->table) {
    if (m_out) *m_out = 0;
    return c->q[y];
  }
  const int32_t *row = c->table + (size_t)y * c->table_k;
  return vs_walk_pool(c->q, row, c->table_k, vs_walk_k(c, k), y, b_abs + b_rel * (double)c->q[y],
                      m_out);
}

/* Cool-SD's G* for LANTERN: q - min(p, q(A(y))) where p(y) > 0, q elsewhere (arXiv
 * 2601.09212, Eq. (10), applied to LANTERN as in its §5.2); one-hot drafts: q without x. */
VS_HD static inline float vs_walk_pool_optimal_at(const vs_walk_cand *c, int k, double b_abs,
                                                  double b_rel, int y) {
  if (!c->p) return y == c->x ? 0.0f : c->q[y];
  if (c->p[y] <= 0.0f) return c->q[y];
  double pool = vs_walk_pool_of(c, k, b_abs, b_rel, y, NULL);
  double take = c->p[y] < pool ? c->p[y] : pool;
  double d = (double)c->q[y] - take;
  return d > 0.0 ? (float)d : 0.0f;
}

/* The elementwise pass of the `set` residual (max(0, q - p), q for one-hot drafts); the
 * patches then remove x and A(x). */
VS_HD static inline float vs_walk_pool_set_at(const vs_walk_cand *c, int y) {
  float d = c->p ? c->q[y] - c->p[y] : c->q[y];
  return d > 0.0f ? d : 0.0f;
}

/* How many of x's neighbours the authors' residual resets: k + 1 (clamped to the table) when
 * A(x) holds any neighbour (m* >= 1), else none (nearest_latents[xi, :lantern_k + 1]). */
VS_HD static inline int vs_walk_reference_zero(const vs_walk_cand *c, int k, int m) {
  if (m < 1) return 0;
  int kk = vs_walk_k(c, k);
  return kk + 1 < c->table_k ? kk + 1 : c->table_k;
}

/* The elementwise pass of the authors' residual: max(0, q - p) for sampled drafts (the
 * patches give the reset neighbours back their target mass), q without x for one-hot ones
 * (the patches zero the neighbours). */
VS_HD static inline float vs_walk_pool_reference_at(const vs_walk_cand *c, int y) {
  if (!c->p) return y == c->x ? 0.0f : c->q[y];
  float d = c->q[y] - c->p[y];
  return d > 0.0f ? d : 0.0f;
}

/* Greedy tests (LANTERN's greedy path in evaluate_posterior): whether token y keeps x from
 * winning against x's pooled mass. Not reference: y's own probability exceeds the pool;
 * reference (torch.argmax with q(x) replaced by the pool, as a float): y's is larger, or
 * equal at a lower index. x wins when no y beats it. */
VS_HD static inline int vs_walk_greedy_beats(const float *q, int32_t x, int y, double pool,
                                             int reference) {
  if (y == x) return 0;
  if (!reference) return q[y] > pool;
  float pf = (float)pool;
  return q[y] > pf || (q[y] == pf && y < x);
}

/* ---- a rule, by kind ---------------------------------------------------------------------- */

/* The probability of accepting c->x at draft depth `depth`. */
VS_HD static inline double vs_walk_accept(const vspec_walk_rule *r, const vs_walk_cand *c,
                                          int depth) {
  if (r->kind == VSPEC_WALK_OMEGA)
    return vs_walk_omega_accept(c->q[c->x], c->p_x, vs_walk_omega(r, depth));
  if (r->kind == VSPEC_WALK_PROXIMITY) {
    double a = vs_walk_pool_of(c, r->k, r->budget_abs, r->budget_rel, c->x, NULL) / (double)c->p_x;
    return a < 1.0 ? a : 1.0;
  }
  return vs_walk_exact_accept(c->q[c->x], c->p_x);
}

/* Before a residual's elements: the scalars they share. */
VS_HD static inline vs_walk_res vs_walk_residual_setup(const vspec_walk_rule *r,
                                                       const vs_walk_cand *c, int depth) {
  vs_walk_res s = {0.0, 0};
  if (r->kind == VSPEC_WALK_OMEGA) s.omega = vs_walk_omega(r, depth);
  if (r->kind != VSPEC_WALK_PROXIMITY || r->optimal) return s;
  int m;
  vs_walk_pool_of(c, r->k, r->budget_abs, r->budget_rel, c->x, &m);
  if (!r->reference) s.n_fix = 1 + m; /* x, then A(x)'s neighbours */
  else s.n_fix = vs_walk_reference_zero(c, r->k, m);
  return s;
}

/* Element y of the residual after c->x was rejected (unnormalised, nonnegative). */
VS_HD static inline float vs_walk_residual_at(const vspec_walk_rule *r, const vs_walk_cand *c,
                                              const vs_walk_res *s, int y) {
  if (r->kind == VSPEC_WALK_OMEGA) return vs_walk_omega_residual_at(c, s->omega, r->optimal, y);
  if (r->kind != VSPEC_WALK_PROXIMITY) return vs_walk_exact_residual_at(c, y);
  if (r->optimal) return vs_walk_pool_optimal_at(c, r->k, r->budget_abs, r->budget_rel, y);
  return r->reference ? vs_walk_pool_reference_at(c, y) : vs_walk_pool_set_at(c, y);
}

/* Patch i < s->n_fix of the residual, after every element: q_out[index] = value. */
VS_HD static inline void vs_walk_fix(const vspec_walk_rule *r, const vs_walk_cand *c,
                                     const vs_walk_res *s, int i, float *q_out) {
  (void)s;
  if (!r->reference && i == 0) { /* set: x, then A(x)'s neighbours, are removed */
    q_out[c->x] = 0.0f;
    return;
  }
  const int32_t *row = c->table + (size_t)c->x * c->table_k;
  if (!r->reference) {
    q_out[row[i - 1]] = 0.0f;
    return;
  }
  int32_t y = row[i];
  q_out[y] = c->p ? c->q[y] : 0.0f; /* sampled: the target mass back; one-hot: removed */
}

#endif /* VS_WALK_RULES_H */
