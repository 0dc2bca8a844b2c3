/*
 * plugins/accept/proximity.h - LANTERN's latent proximity set, shared by the relaxed rules
 * (header-only: each rule is its own plugin and links nothing but the host table).
 *
 * LANTERN (arXiv 2410.03355 §4.2-4.3; code: jadohu/LANTERN models/ea_model_llamagen.py):
 * with x's codebook neighbours n_1, n_2, ... (closest first, x excluded) and
 * S_m = sum_{i<=m} q(n_i), the proximity set is A(x) = {x, n_1..n_m*} with m* the largest
 * m <= k whose S_m stays within the budget. LANTERN's budget is the TV distance delta;
 * LANTERN++ (arXiv 2502.06352) caps the pooled mass at lambda * q(x), i.e. the budget is
 * (lambda - 1) q(x) (the code's lantern_delta > 1 branch). Because S_m is monotone, A(x) is
 * a prefix of the list.
 * Neighbours with zero target mass (filtered out by top-k / top-p) still count towards m*,
 * as in the reference code: so the reference-style rejections that fire when m* >= 1 can
 * fire although nothing was pooled.
 */
#ifndef VSPEC_ACCEPT_PROXIMITY_H
#define VSPEC_ACCEPT_PROXIMITY_H

#include "vspec/plugin.h"

/* Pooled probability q(A(x)) = q(x) + S_m*; *m_out = m* (may be NULL). */
static inline double vs_proximity_pool(const float *q, const int32_t *row, int row_len, int k,
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

/* Checks the shared parameter `k` against the neighbour table the engine supplies. */
static inline int vs_proximity_k(const vspec_accept_input *in, int k) {
  return in->neighbours && in->n_neighbours > 0 ? (k < in->n_neighbours ? k : in->n_neighbours) : 0;
}

/* A budget of the form abs + rel * q(y): LANTERN uses (delta, 0), LANTERN++ (0, lambda-1). */
typedef struct vs_budget {
  double abs, rel;
} vs_budget;

/* q(A(y)) under the current residual; *m_out = m* (may be NULL). */
static inline double vs_proximity_pool_of(const vspec_accept_input *in, int k, vs_budget b,
                                          int32_t y, int *m_out) {
  if (!in->neighbour_table) {
    if (m_out) *m_out = 0;
    return in->q[y];
  }
  const int32_t *row = in->neighbour_table + (size_t)y * in->table_k;
  return vs_proximity_pool(in->q, row, in->table_k, vs_proximity_k(in, k), y,
                           b.abs + b.rel * (double)in->q[y], m_out);
}

/* Cool-SD's optimal resampling G* = [q - p f]+ with f(y) = min(1, q(A(y)) / p(y)) at every y,
 * i.e. q - min(p, q(A(y))) (Cool-SD, arXiv 2601.09212, Eq. (10), applied to LANTERN as in
 * its §5.2). For a one-hot draft only x carries draft
 * mass and q(A(x)) >= q(x), so x is removed. */
static inline void vs_proximity_optimal_residual(const vspec_accept_input *in, int k, vs_budget b,
                                                 float *q_out) {
  int V = in->vocab;
  for (int y = 0; y < V; y++) q_out[y] = in->q[y];
  if (!in->p) {
    q_out[in->token] = 0.0f;
    return;
  }
  for (int y = 0; y < V; y++) {
    if (in->p[y] <= 0.0f) continue;
    double pool = vs_proximity_pool_of(in, k, b, y, NULL);
    double take = in->p[y] < pool ? in->p[y] : pool;
    double d = (double)in->q[y] - take;
    q_out[y] = d > 0.0 ? (float)d : 0.0f;
  }
}

/* The project's `set` residual: max(0, q - p) (q itself for a one-hot draft) with x and
 * A(x) removed, i.e. exact SD against the target with the pooled set taken out: the mass
 * the rule moved onto x cannot be drawn again, so each tried candidate moves at most the
 * budget (the TV bound of docs/SPECULATIVE.md). */
static inline void vs_proximity_set_residual(const vspec_accept_input *in, int k, vs_budget b,
                                             float *q_out) {
  for (int y = 0; y < in->vocab; y++) {
    float d = in->p ? in->q[y] - in->p[y] : in->q[y];
    q_out[y] = d > 0.0f ? d : 0.0f;
  }
  q_out[in->token] = 0.0f;
  int m;
  vs_proximity_pool_of(in, k, b, in->token, &m);
  for (int i = 0; i < m; i++) q_out[in->neighbours[i]] = 0.0f;
}

/* The authors' residual (`reference`): when A(x) has any neighbour (m* >= 1), the first
 * k+1 entries of x's neighbour row are zeroed, one more than were searched, as
 * nearest_latents[xi, :lantern_k + 1] does (jadohu/LANTERN models/ea_model_llamagen.py).
 *   sampled drafts (static trees, chains; evaluate_posterior_v1): they are zeroed in the
 *     draft distribution p (earlier siblings already removed), not renormalised, and the
 *     residual is max(0, q - p'): the neighbours keep their target mass and x keeps
 *     max(0, q(x) - p(x)), which a rejection makes 0.
 *   one-hot drafts (dynamic trees; evaluate_posterior): q with x and them zeroed.
 * k + 1 is clamped to the table's width (the engine's table is one wider than the default
 * k for this reason). */
static inline void vs_proximity_reference_residual(const vspec_accept_input *in, int k,
                                                   vs_budget b, float *q_out) {
  int m, zero = 0;
  vs_proximity_pool_of(in, k, b, in->token, &m);
  if (m >= 1) {
    int kk = vs_proximity_k(in, k);
    zero = kk + 1 < in->n_neighbours ? kk + 1 : in->n_neighbours;
  }
  if (!in->p) {
    for (int y = 0; y < in->vocab; y++) q_out[y] = in->q[y];
    q_out[in->token] = 0.0f;
    for (int i = 0; i < zero; i++) q_out[in->neighbours[i]] = 0.0f;
    return;
  }
  for (int y = 0; y < in->vocab; y++) {
    float d = in->q[y] - in->p[y];
    q_out[y] = d > 0.0f ? d : 0.0f;
  }
  for (int i = 0; i < zero; i++) q_out[in->neighbours[i]] = in->q[in->neighbours[i]];
}

/* Greedy acceptance (LANTERN's greedy path in evaluate_posterior): x wins if its pooled
 * probability is at least every other token's own probability. */
static inline int vs_proximity_greedy(const vspec_accept_input *in, int k, vs_budget b) {
  double pool = vs_proximity_pool_of(in, k, b, in->token, NULL);
  for (int y = 0; y < in->vocab; y++)
    if (y != in->token && in->q[y] > pool) return 0;
  return 1;
}

/* The authors' greedy test: x wins if it is torch.argmax of q with q(x) replaced by the
 * pooled mass, so a tie with a lower-indexed token loses (the first maximum wins). */
static inline int vs_proximity_greedy_reference(const vspec_accept_input *in, int k,
                                                vs_budget b) {
  float pool = (float)vs_proximity_pool_of(in, k, b, in->token, NULL);
  for (int y = 0; y < in->vocab; y++)
    if (y != in->token && (in->q[y] > pool || (in->q[y] == pool && y < in->token))) return 0;
  return 1;
}

#endif /* VSPEC_ACCEPT_PROXIMITY_H */
