/*
 * `lantern`: relaxed acceptance over the latent proximity set (LANTERN, ICLR'25,
 * arXiv 2410.03355 §4.2-4.3; code: jadohu/LANTERN models/ea_model_llamagen.py).
 *
 * Accept x with min(1, q(A(x)) / p(x)), where A(x) is x plus the longest prefix of its k
 * nearest codebook neighbours whose target mass stays within delta (the TV budget). q is
 * the current residual at the node, as in the reference code.
 *
 * Parameters
 *   k=1000          neighbours searched (clamped to the engine's neighbour table)
 *   delta=0.1       total-variation budget, [0, 1]
 *   resample=rule   after a rejection:
 *                     rule    remove x and A(x) from max(0, q - p) (q itself for top-k drafts)
 *                     optimal Cool-SD's G* = norm([q - p f]+), f(y) = min(1, q(A(y))/p(y))
 *                             at every y (Cool-SD, arXiv 2601.09212, Eq. (10))
 *   reject=set      what `rule` removes after a rejection:
 *                     set        x and A(x) from max(0, q - p): exact SD against the
 *                                relaxed target, each tried candidate moves at most delta
 *                                (the project's variant)
 *                     reference  the authors' code on every tree shape: when A(x) has any
 *                                neighbour, the first k+1 neighbours are zeroed in the
 *                                draft distribution p (sampled static trees and chains,
 *                                EaModel.evaluate_posterior_v1) and the residual is
 *                                max(0, q - p'), so they keep their target mass; for
 *                                one-hot drafts (dynamic trees, EaModel.evaluate_posterior)
 *                                x and those k+1 are zeroed in q. The greedy test is
 *                                torch.argmax's (ties go to the lower index).
 */
#include "proximity.h"

enum { LT_RULE = 0, LT_OPTIMAL = 1 };
enum { LT_SET = 0, LT_REFERENCE = 1 };

static int lt_create(const vspec_host *host, const vspec_params *params, vspec_rule **out,
                     char *err, size_t errlen) {
  static const char *const known[] = {"k", "delta", "resample", "reject", NULL};
  static const char *const resample[] = {"rule", "optimal", NULL};
  static const char *const reject[] = {"set", "reference", NULL};
  long k;
  double delta;
  int rs, rj, rc;
  if ((rc = host->param_check_known(params, known, err, errlen)) ||
      (rc = host->param_int(params, "k", 1000, 1, 1 << 20, &k, err, errlen)) ||
      (rc = host->param_double(params, "delta", 0.1, 0.0, 1.0, &delta, err, errlen)) ||
      (rc = host->param_choice(params, "resample", resample, LT_RULE, &rs, err, errlen)) ||
      (rc = host->param_choice(params, "reject", reject, LT_SET, &rj, err, errlen)))
    return rc;
  return vs_proximity_new(host, (int)k, (vs_budget){delta, 0.0}, rs == LT_OPTIMAL,
                          rj == LT_REFERENCE, out, err, errlen);
}

static const vspec_accept_vtable lt_vtable = VS_PROXIMITY_VTABLE(lt_create);

static const vspec_plugin_desc lt_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_ACCEPT, "lantern", "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD |
                          VSPEC_PLUGIN_USES_NEIGHBOURS),
    .description = "LANTERN: pool the target mass of x's codebook neighbours within a TV "
                   "budget delta",
    .vtable = &lt_vtable,
};

VSPEC_PLUGIN_DEFINE(lt_desc)
