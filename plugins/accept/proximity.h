/*
 * plugins/accept/proximity.h - LANTERN's latent proximity set, shared by the relaxed rules
 * (header-only: each rule is its own plugin and links nothing but the host table).
 *
 * algorithms.md §3.2: with x's codebook neighbours n_1, n_2, ... (closest first, x
 * excluded) and S_m = sum_{i<=m} q(n_i), the proximity set is A(x) = {x, n_1..n_m*} with
 * m* the largest m <= k whose S_m stays within the budget. LANTERN's budget is the TV
 * distance delta; LANTERN++ caps the pooled mass at lambda * q(x), i.e. the budget is
 * (lambda - 1) q(x) (§4.2). Because S_m is monotone, A(x) is a prefix of the list.
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

#endif /* VSPEC_ACCEPT_PROXIMITY_H */
