/*
 * `coolsd`: Cool-SD's annealed relaxation (arXiv 2601.09212 §3.2, Eqs. (12) and (16)).
 *
 * Draft position i (1-based depth, L = the round's draft depth) is accepted with
 * f_i = min(1, omega_i q / p). The schedule decays with depth, relaxing early positions
 * and tightening late ones:
 *   exp     omega_i = delta exp(-nu i) / mean_j exp(-nu j)
 *   linear  omega_i = delta w_i / mean_j w_j,  w_i = max(0, 1 + nu ((L + 1)/2 - i))
 * Both are normalised so that the mean of omega_i over the L draft positions equals delta.
 * This normalisation is our reading of the condition that fixes the paper's normalising
 * constant mu in Eq. (16) ("the mean equals the budget"); the linear form is ours.
 *
 * Parameters
 *   delta=1.1          total relaxation budget (mean omega), (0, 100]
 *   nu=0.7             decay rate, [0, 10]
 *   schedule=exp       exp | linear
 *   resample=optimal   optimal: G* = norm(q - min(p, omega_i q)) (Eq. (10)); rule: vanilla
 *                      residual norm(max(0, q - p))
 */
#include <stdio.h>

#include "omega.h"

enum { CS_EXP = 0, CS_LINEAR = 1 };

struct vspec_rule {
  const vspec_host *host;
  double delta, nu;
  int schedule, resample;
};

static int cs_create(const vspec_host *host, const vspec_params *params, vspec_rule **out,
                     char *err, size_t errlen) {
  static const char *const known[] = {"delta", "nu", "schedule", "resample", NULL};
  static const char *const schedule[] = {"exp", "linear", NULL};
  static const char *const resample[] = {"rule", "optimal", NULL};
  double delta, nu;
  int sc, rs, rc;
  if ((rc = host->param_check_known(params, known, err, errlen)) ||
      (rc = host->param_double(params, "delta", 1.1, 1e-6, 100.0, &delta, err, errlen)) ||
      (rc = host->param_double(params, "nu", 0.7, 0.0, 10.0, &nu, err, errlen)) ||
      (rc = host->param_choice(params, "schedule", schedule, CS_EXP, &sc, err, errlen)) ||
      (rc = host->param_choice(params, "resample", resample, VS_OMEGA_OPTIMAL, &rs, err,
                               errlen)))
    return rc;
  vspec_rule *r = host->alloc(sizeof *r);
  if (!r) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  *r = (vspec_rule){.host = host, .delta = delta, .nu = nu, .schedule = sc, .resample = rs};
  *out = r;
  return VSPEC_OK;
}

static void cs_destroy(vspec_rule *r) { r->host->free(r); }

/* omega at depth i of a round with draft depth L (depths and L clamped to 1..64). */
static double cs_omega(const vspec_rule *r, int i, int L) {
  return vs_walk_coolsd_omega(r->delta, r->nu, r->schedule == CS_LINEAR, i, L);
}

static double cs_accept(vspec_rule *r, const vspec_accept_input *in) {
  return vs_omega_accept(in, cs_omega(r, in->depth, in->max_depth));
}

static int cs_residual(vspec_rule *r, const vspec_accept_input *in, float *q_out) {
  vs_omega_residual(in, cs_omega(r, in->depth, in->max_depth), r->resample, q_out);
  return VSPEC_OK;
}

/* VSPEC_WALK_OMEGA with this round's schedule by depth (omega[d] = cs_omega(d, L); depths
 * past 64 share omega[64], as cs_omega clamps them). */
static int cs_walk_rule(vspec_rule *r, int32_t max_depth, vspec_walk_rule *out) {
  *out = (vspec_walk_rule){.kind = VSPEC_WALK_OMEGA, .optimal = r->resample == VS_OMEGA_OPTIMAL};
  for (int d = 0; d <= VSPEC_WALK_MAX_DEPTH; d++) out->omega[d] = cs_omega(r, d, max_depth);
  return VSPEC_OK;
}

static const vspec_accept_vtable cs_vtable = {
    .struct_size = sizeof(vspec_accept_vtable),
    .create = cs_create,
    .destroy = cs_destroy,
    .accept_prob = cs_accept,
    .residual = cs_residual,
    .greedy_accept = NULL,
    .walk_rule = cs_walk_rule,
};

static const vspec_plugin_desc cs_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_ACCEPT, "coolsd", "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD),
    .description = "Cool-SD: annealed relaxation omega_i decaying with draft depth, mean delta",
    .vtable = &cs_vtable,
};

VSPEC_PLUGIN_DEFINE(cs_desc)
