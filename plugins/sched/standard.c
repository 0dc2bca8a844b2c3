/*
 * `standard` scheduler: the same draft shape every round, always verified.
 *
 * Parameters: the shape parameters of plugins/sched/shape.h (shape, depth, top_k,
 * total_tokens, tree, drafter), and prefill=F: until a fraction F of the image's tokens is
 * out, the target generates alone (no draft: CSpD's token pre-filling, arXiv 2411.11925
 * §3.2; default 0).
 */
#include <stdio.h>

#include "shape.h"

struct vspec_sched {
  const vspec_host *host;
  vs_shape shape;
  double prefill;
};

static int st_create(const vspec_host *host, const vspec_params *params, vspec_sched **out,
                     char *err, size_t errlen) {
  static const char *const known[] = {VS_SHAPE_KEYS, "size", "prefill", NULL};
  int rc = host->param_check_known(params, known, err, errlen);
  if (rc) return rc;
  vspec_sched *s = host->calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  s->host = host;
  if ((rc = vs_shape_parse(host, params, &s->shape, err, errlen)) ||
      (rc = host->param_double(params, "prefill", 0.0, 0.0, 1.0, &s->prefill, err, errlen))) {
    host->free(s);
    return rc;
  }
  *out = s;
  return VSPEC_OK;
}

static void st_destroy(vspec_sched *s) { s->host->free(s); }

static int st_plan(vspec_sched *s, const vspec_round_state *state, vspec_round_plan *plan) {
  vs_shape_plan(&s->shape, plan);
  /* pre-filling: while fewer than prefill x total tokens are out (the sizing call, round
   * -1, gets the full shape) */
  if (s->prefill > 0.0 && state->round >= 0 &&
      state->tokens_done < s->prefill * state->tokens_total)
    plan->shape = VSPEC_DRAFT_NONE;
  return VSPEC_OK;
}

static const vspec_sched_vtable st_vtable = {
    .struct_size = sizeof(vspec_sched_vtable),
    .create = st_create,
    .destroy = st_destroy,
    .plan = st_plan,
    .decide = NULL,
};

static const vspec_plugin_desc st_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_SCHED, "standard", "1.0.0",
                      VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD),
    .description = "fixed draft shape (chain, EAGLE-1 static tree, EAGLE-2 dynamic tree), "
                   "always verified",
    .vtable = &st_vtable,
};

VSPEC_PLUGIN_DEFINE(st_desc)
