/*
 * `lanternpp`: LANTERN++'s multiplicative cap (algorithms.md §4.2).
 *
 * Accept x with min(1, q(A(x)) / p(x)), where A(x) pools the longest prefix of x's k
 * nearest codebook neighbours whose mass stays within (lambda - 1) q(x), so that
 * q(A(x)) <= lambda q(x).
 *
 * Parameters
 *   lambda=2        cap on the pooled probability relative to q(x), [1, 1000]
 *   k=1000          neighbours searched (clamped to the engine's neighbour table)
 *   resample=rule   rule: the reference's LlamaGen residual: the draft distribution with the
 *                   first k+1 neighbours zeroed (not renormalised) when A(x) has any, then
 *                   norm(max(0, q - p')); optimal: Cool-SD's G* with f(y) = min(1,
 *                   q(A(y))/p(y)) (algorithms.md §5.2)
 */
#include <stdio.h>

#include "proximity.h"

enum { LP_RULE = 0, LP_OPTIMAL = 1 };

struct vspec_rule {
  const vspec_host *host;
  double lambda;
  int k, resample;
};

static int lp_create(const vspec_host *host, const vspec_params *params, vspec_rule **out,
                     char *err, size_t errlen) {
  static const char *const known[] = {"lambda", "k", "resample", NULL};
  static const char *const resample[] = {"rule", "optimal", NULL};
  double lambda;
  long k;
  int rs, rc;
  if ((rc = host->param_check_known(params, known, err, errlen)) ||
      (rc = host->param_double(params, "lambda", 2.0, 1.0, 1000.0, &lambda, err, errlen)) ||
      (rc = host->param_int(params, "k", 1000, 1, 1 << 20, &k, err, errlen)) ||
      (rc = host->param_choice(params, "resample", resample, LP_RULE, &rs, err, errlen)))
    return rc;
  vspec_rule *r = host->alloc(sizeof *r);
  if (!r) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  *r = (vspec_rule){.host = host, .lambda = lambda, .k = (int)k, .resample = rs};
  *out = r;
  return VSPEC_OK;
}

static void lp_destroy(vspec_rule *r) { r->host->free(r); }

static double lp_pool(const vspec_rule *r, const vspec_accept_input *in, int32_t y, int *m) {
  if (!in->neighbour_table) {
    if (m) *m = 0;
    return in->q[y];
  }
  const int32_t *row = in->neighbour_table + (size_t)y * in->table_k;
  return vs_proximity_pool(in->q, row, in->table_k, vs_proximity_k(in, r->k), y,
                           (r->lambda - 1.0) * (double)in->q[y], m);
}

static double lp_accept(vspec_rule *r, const vspec_accept_input *in) {
  double a = lp_pool(r, in, in->token, NULL) / (double)in->p_x;
  return a < 1.0 ? a : 1.0;
}

static int lp_residual(vspec_rule *r, const vspec_accept_input *in, float *q_out) {
  int V = in->vocab;
  if (!in->p) {
    /* One-hot draft: both residuals reduce to removing x. */
    for (int y = 0; y < V; y++) q_out[y] = in->q[y];
    q_out[in->token] = 0.0f;
    return VSPEC_OK;
  }
  if (r->resample == LP_OPTIMAL) {
    for (int y = 0; y < V; y++) {
      if (in->p[y] <= 0.0f) {
        q_out[y] = in->q[y];
        continue;
      }
      double pool = lp_pool(r, in, y, NULL);
      double take = in->p[y] < pool ? in->p[y] : pool;
      double d = (double)in->q[y] - take;
      q_out[y] = d > 0.0 ? (float)d : 0.0f;
    }
    return VSPEC_OK;
  }
  int m;
  lp_pool(r, in, in->token, &m);
  for (int y = 0; y < V; y++) {
    float d = in->q[y] - in->p[y];
    q_out[y] = d > 0.0f ? d : 0.0f;
  }
  if (m >= 1) {
    /* The neighbours keep their own target mass: p' is zero there (§4.2). */
    int kk = vs_proximity_k(in, r->k);
    int zero = kk + 1 < in->n_neighbours ? kk + 1 : in->n_neighbours;
    for (int i = 0; i < zero; i++) q_out[in->neighbours[i]] = in->q[in->neighbours[i]];
  }
  return VSPEC_OK;
}

static int lp_greedy(vspec_rule *r, const vspec_accept_input *in) {
  double pool = lp_pool(r, in, in->token, NULL);
  for (int y = 0; y < in->vocab; y++)
    if (y != in->token && in->q[y] > pool) return 0;
  return 1;
}

static const vspec_accept_vtable lp_vtable = {
    .struct_size = sizeof(vspec_accept_vtable),
    .create = lp_create,
    .destroy = lp_destroy,
    .accept_prob = lp_accept,
    .residual = lp_residual,
    .greedy_accept = lp_greedy,
};

static const vspec_plugin_desc lp_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_ACCEPT, "lanternpp", "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD),
    .description = "LANTERN++: pool neighbour mass up to lambda x q(x)",
    .vtable = &lp_vtable,
};

VSPEC_PLUGIN_DEFINE(lp_desc)
