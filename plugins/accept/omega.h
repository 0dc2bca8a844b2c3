/*
 * plugins/accept/omega.h - the acceptance f(x) = min(1, omega q(x) / p(x)) shared by
 * uniform_rsd and coolsd, and its residual (gsd's too, at omega = 1; header-only: each rule
 * is its own plugin).
 *
 * Cool-SD (arXiv 2601.09212 §3.2, Eq. (12)): omega = 1 is exact SD, omega > 1 relaxes.
 * The TV-optimal resampling distribution after a rejection is
 *   G* = norm([q - p f]+) = norm(q - min(p, omega q))             (Theorem 2, Eq. (10))
 * which equals the vanilla residual (q - p)+ whenever omega >= 1; `rule` keeps the vanilla
 * residual at every omega, which is what an implementation unaware of G* does.
 */
#ifndef VSPEC_ACCEPT_OMEGA_H
#define VSPEC_ACCEPT_OMEGA_H

#include "cand.h"

enum { VS_OMEGA_RULE = 0, VS_OMEGA_OPTIMAL = 1 };

static inline double vs_omega_accept(const vspec_accept_input *in, double omega) {
  return vs_walk_omega_accept(in->q[in->token], in->p_x, omega);
}

static inline void vs_omega_residual(const vspec_accept_input *in, double omega, int resample,
                                     float *q_out) {
  vs_walk_cand c = vs_accept_cand(in);
  for (int y = 0; y < in->vocab; y++)
    q_out[y] = vs_walk_omega_residual_at(&c, omega, resample == VS_OMEGA_OPTIMAL, y);
}

#endif /* VSPEC_ACCEPT_OMEGA_H */
