/*
 * `uniform_rsd`: constant relaxation f = min(1, omega q / p) at every draft depth, Cool-SD's
 * UniformRSD (arXiv 2601.09212 §3.2, Eq. (13); compared in its §5.1).
 *
 * Parameters
 *   omega=2            relaxation, (0, 1000]; 1 = exact SD
 *   resample=optimal   optimal: Cool-SD's G* = norm(q - min(p, omega q)); rule: the vanilla
 *                      residual norm(max(0, q - p))
 */
#include <stdio.h>

#include "omega.h"

struct vspec_rule {
  const vspec_host *host;
  double omega;
  int resample;
};

static int ur_create(const vspec_host *host, const vspec_params *params, vspec_rule **out,
                     char *err, size_t errlen) {
  static const char *const known[] = {"omega", "resample", NULL};
  static const char *const resample[] = {"rule", "optimal", NULL};
  double omega;
  int rs, rc;
  if ((rc = host->param_check_known(params, known, err, errlen)) ||
      (rc = host->param_double(params, "omega", 2.0, 1e-6, 1000.0, &omega, err, errlen)) ||
      (rc = host->param_choice(params, "resample", resample, VS_OMEGA_OPTIMAL, &rs, err,
                               errlen)))
    return rc;
  vspec_rule *r = host->alloc(sizeof *r);
  if (!r) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  *r = (vspec_rule){.host = host, .omega = omega, .resample = rs};
  *out = r;
  return VSPEC_OK;
}

static void ur_destroy(vspec_rule *r) { r->host->free(r); }

static double ur_accept(vspec_rule *r, const vspec_accept_input *in) {
  return vs_omega_accept(in, r->omega);
}

static int ur_residual(vspec_rule *r, const vspec_accept_input *in, float *q_out) {
  vs_omega_residual(in, r->omega, r->resample, q_out);
  return VSPEC_OK;
}

/* VSPEC_WALK_OMEGA with the same omega at every depth. */
static int ur_walk_rule(vspec_rule *r, int32_t max_depth, vspec_walk_rule *out) {
  (void)max_depth;
  *out = (vspec_walk_rule){.kind = VSPEC_WALK_OMEGA, .optimal = r->resample == VS_OMEGA_OPTIMAL};
  for (int d = 0; d <= VSPEC_WALK_MAX_DEPTH; d++) out->omega[d] = r->omega;
  return VSPEC_OK;
}

static const vspec_accept_vtable ur_vtable = {
    .struct_size = sizeof(vspec_accept_vtable),
    .create = ur_create,
    .destroy = ur_destroy,
    .accept_prob = ur_accept,
    .residual = ur_residual,
    .greedy_accept = NULL,
    .walk_rule = ur_walk_rule,
};

static const vspec_plugin_desc ur_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_ACCEPT, "uniform_rsd", "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD),
    .description = "UniformRSD: f = min(1, omega q/p) at every depth",
    .vtable = &ur_vtable,
};

VSPEC_PLUGIN_DEFINE(ur_desc)
