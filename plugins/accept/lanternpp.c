/*
 * `lanternpp`: LANTERN++'s multiplicative cap (arXiv 2502.06352; code: jadohu/LANTERN
 * models/ea_model_llamagen.py, evaluate_posterior_v1 with lantern_delta = lambda > 1).
 *
 * Accept x with min(1, q(A(x)) / p(x)), where A(x) pools the longest prefix of x's k
 * nearest codebook neighbours whose mass stays within (lambda - 1) q(x), so that
 * q(A(x)) <= lambda q(x).
 *
 * Parameters
 *   lambda=2        cap on the pooled probability relative to q(x), [1, 1000]
 *   k=1000          neighbours searched (clamped to the engine's neighbour table)
 *   resample=rule   rule: the residual chosen by `reject`; optimal: Cool-SD's G* with
 *                   f(y) = min(1, q(A(y))/p(y)) (Cool-SD, arXiv 2601.09212, Eq. (10))
 *   reject=reference
 *                   reference: the authors' code on every tree shape (proximity.h): when
 *                   A(x) has any neighbour, the first k+1 neighbours are zeroed in the draft
 *                   distribution (sampled drafts: residual max(0, q - p')) or, with x, in q
 *                   (one-hot drafts of dynamic trees); greedy ties go to the lower index.
 *                   set: x and A(x) removed from max(0, q - p), as lantern's default
 */
#include "proximity.h"

enum { LP_RULE = 0, LP_OPTIMAL = 1 };
enum { LP_REFERENCE = 0, LP_SET = 1 };

static int lp_create(const vspec_host *host, const vspec_params *params, vspec_rule **out,
                     char *err, size_t errlen) {
  static const char *const known[] = {"lambda", "k", "resample", "reject", NULL};
  static const char *const resample[] = {"rule", "optimal", NULL};
  static const char *const reject[] = {"reference", "set", NULL};
  double lambda;
  long k;
  int rs, rj, rc;
  if ((rc = host->param_check_known(params, known, err, errlen)) ||
      (rc = host->param_double(params, "lambda", 2.0, 1.0, 1000.0, &lambda, err, errlen)) ||
      (rc = host->param_int(params, "k", 1000, 1, 1 << 20, &k, err, errlen)) ||
      (rc = host->param_choice(params, "resample", resample, LP_RULE, &rs, err, errlen)) ||
      (rc = host->param_choice(params, "reject", reject, LP_REFERENCE, &rj, err, errlen)))
    return rc;
  return vs_proximity_new(host, (int)k, (vs_budget){0.0, lambda - 1.0}, rs == LP_OPTIMAL,
                          rj == LP_REFERENCE, out, err, errlen);
}

static const vspec_accept_vtable lp_vtable = VS_PROXIMITY_VTABLE(lp_create);

static const vspec_plugin_desc lp_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_ACCEPT, "lanternpp", "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD |
                          VSPEC_PLUGIN_USES_NEIGHBOURS),
    .description = "LANTERN++: pool neighbour mass up to lambda x q(x)",
    .vtable = &lp_vtable,
};

VSPEC_PLUGIN_DEFINE(lp_desc)
