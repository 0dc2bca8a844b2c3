/*
 * `exact`: speculative sampling that leaves the target distribution unchanged
 * (Leviathan et al., arXiv 2211.17192; Chen et al., arXiv 2302.01318; on trees as EAGLE's
 * evaluate_posterior, SafeAILab/EAGLE eagle/model/utils.py).
 *
 * Accept x with min(1, q(x) / p(x)). After a rejection continue from norm(max(0, q - p)),
 * p being the distribution x was drawn from (earlier siblings removed). For deterministic
 * top-k drafts p is one-hot at x, so the residual is q with x removed (EAGLE-2's rule).
 */
#include <stdio.h>

#include "cand.h"

struct vspec_rule {
  const vspec_host *host;
};

static int ex_create(const vspec_host *host, const vspec_params *params, vspec_rule **out,
                     char *err, size_t errlen) {
  static const char *const known[] = {NULL};
  int rc = host->param_check_known(params, known, err, errlen);
  if (rc) return rc;
  vspec_rule *r = host->alloc(sizeof *r);
  if (!r) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  r->host = host;
  *out = r;
  return VSPEC_OK;
}

static void ex_destroy(vspec_rule *r) { r->host->free(r); }

static double ex_accept(vspec_rule *r, const vspec_accept_input *in) {
  (void)r;
  return vs_walk_exact_accept(in->q[in->token], in->p_x);
}

static int ex_residual(vspec_rule *r, const vspec_accept_input *in, float *q_out) {
  (void)r;
  vs_walk_cand c = vs_accept_cand(in);
  for (int y = 0; y < in->vocab; y++) q_out[y] = vs_walk_exact_residual_at(&c, y);
  return VSPEC_OK;
}

/* The ops' verify_walk runs this rule as VSPEC_WALK_EXACT (the same functions above). */
static int ex_walk_rule(vspec_rule *r, int32_t max_depth, vspec_walk_rule *out) {
  (void)r;
  (void)max_depth;
  *out = (vspec_walk_rule){.kind = VSPEC_WALK_EXACT};
  return VSPEC_OK;
}

static const vspec_accept_vtable ex_vtable = {
    .struct_size = sizeof(vspec_accept_vtable),
    .create = ex_create,
    .destroy = ex_destroy,
    .accept_prob = ex_accept,
    .residual = ex_residual,
    .greedy_accept = NULL,
    .walk_rule = ex_walk_rule,
};

static const vspec_plugin_desc ex_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_ACCEPT, "exact", "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD | VSPEC_PLUGIN_EXACT),
    .description = "exact speculative sampling: min(1, q/p), residual norm(max(0, q - p))",
    .vtable = &ex_vtable,
};

VSPEC_PLUGIN_DEFINE(ex_desc)
