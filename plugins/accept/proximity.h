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

#include <stdio.h>

#include "cand.h"

/* Pooled probability q(A(x)) = q(x) + S_m*; *m_out = m* (may be NULL). */
static inline double vs_proximity_pool(const float *q, const int32_t *row, int row_len, int k,
                                       int32_t x, double budget, int *m_out) {
  return vs_walk_pool(q, row, row_len, k, x, budget, m_out);
}

/* A budget of the form abs + rel * q(y): LANTERN uses (delta, 0), LANTERN++ (0, lambda-1). */
typedef struct vs_budget {
  double abs, rel;
} vs_budget;

/* q(A(y)) under the current residual; *m_out = m* (may be NULL). */
static inline double vs_proximity_pool_of(const vspec_accept_input *in, int k, vs_budget b,
                                          int32_t y, int *m_out) {
  vs_walk_cand c = vs_accept_cand(in);
  return vs_walk_pool_of(&c, k, b.abs, b.rel, y, m_out);
}

/* The rule as the ops' verify_walk runs it (vspec_walk_rule, kind PROXIMITY); the residuals
 * and greedy tests below go through it, so the plugins compute what the device walk does. */
static inline vspec_walk_rule vs_proximity_rule(int k, vs_budget b, int optimal, int reference) {
  vspec_walk_rule r = {.kind = VSPEC_WALK_PROXIMITY, .optimal = optimal,
                       .reference = reference, .k = k, .budget_abs = b.abs,
                       .budget_rel = b.rel};
  return r;
}

/* A residual elementwise, then its patches (vs_walk_rules.h). The three residuals:
 *   optimal    Cool-SD's G* = [q - p f]+ with f(y) = min(1, q(A(y)) / p(y)) at every y
 *              (Cool-SD, arXiv 2601.09212, Eq. (10), applied to LANTERN as in its §5.2); for
 *              a one-hot draft only x carries draft mass and q(A(x)) >= q(x): x is removed.
 *   set        the project's: max(0, q - p) (q itself for a one-hot draft) with x and A(x)
 *              removed, i.e. exact SD against the target with the pooled set taken out: the
 *              mass the rule moved onto x cannot be drawn again, so each tried candidate
 *              moves at most the budget (the TV bound of docs/SPECULATIVE.md).
 *   reference  the authors': when A(x) has any neighbour (m* >= 1), the first k+1 entries of
 *              x's neighbour row are reset, one more than were searched, as
 *              nearest_latents[xi, :lantern_k + 1] does (jadohu/LANTERN
 *              models/ea_model_llamagen.py). Sampled drafts (static trees, chains;
 *              evaluate_posterior_v1): they are zeroed in the draft distribution p (earlier
 *              siblings already removed), not renormalised, and the residual is max(0, q - p'):
 *              the neighbours keep their target mass and x keeps max(0, q(x) - p(x)), which a
 *              rejection makes 0. One-hot drafts (dynamic trees; evaluate_posterior): q with x
 *              and them zeroed. k + 1 is clamped to the table's width (the engine's table is
 *              one wider than the default k for this reason). */
static inline void vs_proximity_residual(const vspec_accept_input *in, const vspec_walk_rule *r,
                                         float *q_out) {
  vs_walk_cand c = vs_accept_cand(in);
  vs_walk_res s = vs_walk_residual_setup(r, &c, in->depth);
  for (int y = 0; y < in->vocab; y++) q_out[y] = vs_walk_residual_at(r, &c, &s, y);
  for (int i = 0; i < s.n_fix; i++) vs_walk_fix(r, &c, &s, i, q_out);
}

/* Greedy acceptance (LANTERN's greedy path in evaluate_posterior): x wins if its pooled
 * probability is at least every other token's own probability; the authors' test
 * (reference) is torch.argmax of q with q(x) replaced by the pooled mass, so a tie with a
 * lower-indexed token loses (the first maximum wins). */
static inline int vs_proximity_greedy_test(const vspec_accept_input *in, int k, vs_budget b,
                                           int reference) {
  double pool = vs_proximity_pool_of(in, k, b, in->token, NULL);
  for (int y = 0; y < in->vocab; y++)
    if (vs_walk_greedy_beats(in->q, in->token, y, pool, reference)) return 0;
  return 1;
}

/* ---- the rules over the proximity set: lantern and lanternpp ---------------------------- */

/* Both rules are this struct and the vtable functions below (VS_PROXIMITY_VTABLE); they
 * differ in their parameters only, which each one's create parses (LANTERN's delta,
 * LANTERN++'s lambda) before vs_proximity_new. */
struct vspec_rule {
  const vspec_host *host;
  int k;            /* neighbours searched */
  vs_budget budget; /* of the pool */
  int optimal;      /* resample=optimal: Cool-SD's G*, else the residual `reject` names */
  int reference;    /* reject=reference: the authors' residual and greedy test; else set */
};

static inline int vs_proximity_new(const vspec_host *host, int k, vs_budget b, int optimal,
                                   int reference, vspec_rule **out, char *err, size_t errlen) {
  vspec_rule *r = host->alloc(sizeof *r);
  if (!r) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  *r = (vspec_rule){.host = host, .k = k, .budget = b, .optimal = optimal,
                    .reference = reference};
  *out = r;
  return VSPEC_OK;
}

static inline void vs_proximity_destroy(vspec_rule *r) { r->host->free(r); }

/* min(1, q(A(x)) / p(x)) */
static inline double vs_proximity_accept(vspec_rule *r, const vspec_accept_input *in) {
  double a = vs_proximity_pool_of(in, r->k, r->budget, in->token, NULL) / (double)in->p_x;
  return a < 1.0 ? a : 1.0;
}

static inline int vs_proximity_residual_of(vspec_rule *r, const vspec_accept_input *in,
                                           float *q_out) {
  vspec_walk_rule w = vs_proximity_rule(r->k, r->budget, r->optimal,
                                        !r->optimal && r->reference);
  vs_proximity_residual(in, &w, q_out);
  return VSPEC_OK;
}

static inline int vs_proximity_greedy(vspec_rule *r, const vspec_accept_input *in) {
  return vs_proximity_greedy_test(in, r->k, r->budget, r->reference);
}

/* VSPEC_WALK_PROXIMITY: the functions above are the walk's, on the same settings. */
static inline int vs_proximity_walk_rule(vspec_rule *r, int32_t max_depth, vspec_walk_rule *out) {
  (void)max_depth;
  *out = vs_proximity_rule(r->k, r->budget, r->optimal, r->reference);
  return VSPEC_OK;
}

/* The vtable of a proximity rule whose create is create_fn. */
#define VS_PROXIMITY_VTABLE(create_fn)                                                         \
  {                                                                                            \
    .struct_size = sizeof(vspec_accept_vtable), .create = (create_fn),                         \
    .destroy = vs_proximity_destroy, .accept_prob = vs_proximity_accept,                       \
    .residual = vs_proximity_residual_of, .greedy_accept = vs_proximity_greedy,                \
    .walk_rule = vs_proximity_walk_rule,                                                       \
  }

#endif /* VSPEC_ACCEPT_PROXIMITY_H */
