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

#include "vspec/plugin.h"

enum { VS_OMEGA_RULE = 0, VS_OMEGA_OPTIMAL = 1 };

static inline double vs_omega_accept(const vspec_accept_input *in, double omega) {
  double a = omega * (double)in->q[in->token] / (double)in->p_x;
  return a < 1.0 ? a : 1.0;
}

static inline void vs_omega_residual(const vspec_accept_input *in, double omega, int resample,
                                     float *q_out) {
  int V = in->vocab;
  for (int y = 0; y < V; y++) {
    /* A one-hot draft (p == NULL) puts mass 1 on x and 0 elsewhere. */
    double p = in->p ? (double)in->p[y] : (y == in->token ? 1.0 : 0.0);
    double q = in->q[y];
    double take = p;
    if (resample == VS_OMEGA_OPTIMAL && omega * q < p) take = omega * q;
    double d = q - take;
    q_out[y] = d > 0.0 ? (float)d : 0.0f;
  }
}

#endif /* VSPEC_ACCEPT_OMEGA_H */
