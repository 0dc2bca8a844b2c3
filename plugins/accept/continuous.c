/*
 * `continuous`: speculative sampling of continuous tokens for diffusion-head models (CSpD,
 * arXiv 2411.11925; reference code MarkXCloud/CSpD spec_decode/spec_decode_runner.py).
 *
 * The engine (core/mar_loop.c) runs draft and target along the same diffusion noises up to
 * the final step and hands this rule the two final-step Gaussians, p = N(mu_d, sigma_d^2)
 * and q = N(mu_g, sigma_g^2) per dimension; the drafted token x is a sample of p. Given the
 * shared noises, speculative sampling between p and q is exact: accept x with
 * min(1, q(x) / p(x)), and after a rejection draw from norm(max(0, q - p)). The residual is
 * drawn by acceptance-rejection with q as the proposal and bound M = 1: a proposal y ~ q is
 * kept with probability max(0, 1 - p(y) / q(y)), which needs no normalising integral.
 *
 * Parameters:
 *   tau=T            divides the Mahalanobis terms of the ratio by T^2. The reference code
 *                    uses T = 42 (its `inner_temperature`), undocumented in the paper; any
 *                    T != 1 accepts more than the exact rule and is LOSSY. Default 1 (exact).
 *   sigma_factor=    off (default, exact): no trajectory factor.
 *                    paper: times prod over the earlier steps of sigma_d / sigma_g (the
 *                    normalisers of the per-step Gaussian ratio along an aligned path).
 *                    reference: times prod sigma_g / sigma_d, the reference code's direction
 *                    (inverted relative to its own final-step normaliser). Both are lossy
 *                    under shared noises: docs/SPECULATIVE.md derives why the exact ratio has
 *                    no such factor. Residuals divide p by the same factor, as the reference.
 *   budget=N         proposals per residual call (default 100, the reference's); when a call
 *                    runs out the engine calls again and counts it (it never keeps a zero
 *                    vector, which is what the reference does).
 *   target_only=1    rejects every draft and samples q itself: the target's process under
 *                    the same schedule and noises, the baseline exactness is measured against.
 */
#include <math.h>
#include <stdio.h>

#include "vspec/plugin.h"

enum { SF_OFF = 0, SF_PAPER = 1, SF_REFERENCE = 2 };

struct vspec_rule {
  const vspec_host *host;
  double tau;
  int sigma_factor;
  long budget;
  int target_only;
};

static int ct_create(const vspec_host *host, const vspec_params *params, vspec_rule **out,
                     char *err, size_t errlen) {
  static const char *const known[] = {"tau", "sigma_factor", "budget", "target_only", NULL};
  static const char *const factors[] = {"off", "paper", "reference", NULL};
  int rc = host->param_check_known(params, known, err, errlen);
  if (rc) return rc;
  vspec_rule *r = host->calloc(1, sizeof *r);
  if (!r) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  r->host = host;
  long t_only = 0;
  if ((rc = host->param_double(params, "tau", 1.0, 1e-3, 1e6, &r->tau, err, errlen)) ||
      (rc = host->param_choice(params, "sigma_factor", factors, SF_OFF, &r->sigma_factor, err,
                               errlen)) ||
      (rc = host->param_int(params, "budget", 100, 1, 1000000, &r->budget, err, errlen)) ||
      (rc = host->param_int(params, "target_only", 0, 0, 1, &t_only, err, errlen))) {
    host->free(r);
    return rc;
  }
  r->target_only = (int)t_only;
  *out = r;
  return VSPEC_OK;
}

static void ct_destroy(vspec_rule *r) { r->host->free(r); }

/* log of the trajectory factor F (0 when off). */
static double ct_log_factor(const vspec_rule *r, const vspec_continuous_input *in) {
  if (r->sigma_factor == SF_OFF) return 0.0;
  double s = 0.0;
  for (int j = 0; j < in->dim; j++)
    s += (double)in->sum_log_sigma_d[j] - (double)in->sum_log_sigma_g[j];
  return r->sigma_factor == SF_PAPER ? s : -s;
}

/* log q(x) - log p(x) with the Mahalanobis terms divided by tau^2 (tau = 1: the exact
 * log density ratio of the two diagonal Gaussians). */
static double ct_log_ratio(const vspec_continuous_input *in, const float *x, double tau) {
  double s = 0.0, t2 = tau * tau;
  for (int j = 0; j < in->dim; j++) {
    double sd = in->sigma_d[j], sg = in->sigma_g[j];
    double zd = ((double)x[j] - in->mu_d[j]) / sd, zg = ((double)x[j] - in->mu_g[j]) / sg;
    s += log(sd) - log(sg) + 0.5 * (zd * zd - zg * zg) / t2;
  }
  return s;
}

static double ct_accept(vspec_rule *r, const vspec_continuous_input *in) {
  if (r->target_only) return 0.0;
  double l = ct_log_ratio(in, in->x, r->tau) + ct_log_factor(r, in);
  return l >= 0.0 ? 1.0 : exp(l);
}

static int ct_residual(vspec_rule *r, const vspec_continuous_input *in, vspec_rng *rng, float *y,
                       int32_t *rounds) {
  const vspec_host *H = r->host;
  double log_f = ct_log_factor(r, in);
  *rounds = 0;
  for (long i = 0; i < r->budget; i++) {
    for (int j = 0; j < in->dim; j++) y[j] = in->mu_g[j] + in->sigma_g[j] * H->rng_normal(rng);
    ++*rounds;
    if (r->target_only) return VSPEC_OK;
    /* keep y with probability max(0, 1 - p(y) / (F q(y))) */
    double l = -ct_log_ratio(in, y, 1.0) - log_f; /* log p(y) - log q(y) - log F */
    double keep = l >= 0.0 ? 0.0 : 1.0 - exp(l);
    if (H->rng_uniform(rng) < keep) return VSPEC_OK;
  }
  return VSPEC_ERANGE;
}

static double ct_accept_discrete(vspec_rule *r, const vspec_accept_input *in) { return 0.0; }

static int ct_residual_discrete(vspec_rule *r, const vspec_accept_input *in, float *q_out) {
  return VSPEC_ENOTSUP;
}

static const vspec_accept_vtable ct_vtable = {
    .struct_size = sizeof(vspec_accept_vtable),
    .create = ct_create,
    .destroy = ct_destroy,
    /* a continuous rule judges no discrete token: the engine refuses it for VQ models */
    .accept_prob = ct_accept_discrete,
    .residual = ct_residual_discrete,
    .greedy_accept = NULL,
    .accept_prob_continuous = ct_accept,
    .residual_continuous = ct_residual,
};

static const vspec_plugin_desc ct_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_ACCEPT, "continuous", "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD),
    .description = "speculative sampling of continuous tokens (CSpD); exact by default, "
                   "tau != 1 or a sigma factor is lossy",
    .vtable = &ct_vtable,
};

VSPEC_PLUGIN_DEFINE(ct_desc)
