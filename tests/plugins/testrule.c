/*
 * A minimal acceptance-rule plugin for the registry tests. Built several times:
 *   TEST_VALUE selects the acceptance probability (TEST_VALUE / 10), so two builds
 *   differ observably; overriding VSPEC_ABI_MAJOR builds an incompatible plugin;
 *   TEST_INIT_FAIL builds one whose init fails and that is not flagged MAY_UNLOAD, so the
 *   host keeps the failed build mapped (the case where dlopen's cache could shadow a fix).
 * It compiles against include/vspec/ alone, as a third-party plugin would.
 */
#include <stdio.h>

#include "vspec/plugin.h"

#ifndef TEST_VALUE
#define TEST_VALUE 1
#endif

struct vspec_rule {
  const vspec_host *host;
  double value;
};

static int tr_create(const vspec_host *host, const vspec_params *params, vspec_rule **out,
                     char *err, size_t errlen) {
  static const char *const known[] = {"scale", NULL};
  int rc = host->param_check_known(params, known, err, errlen);
  if (rc) return rc;
  double scale;
  if ((rc = host->param_double(params, "scale", 1.0, 0.0, 10.0, &scale, err, errlen))) return rc;
  vspec_rule *r = host->alloc(sizeof *r);
  if (!r) return VSPEC_ENOMEM;
  r->host = host;
  r->value = scale * TEST_VALUE / 10.0;
  *out = r;
  return VSPEC_OK;
}

static void tr_destroy(vspec_rule *r) { r->host->free(r); }

static double tr_accept(vspec_rule *r, const vspec_accept_input *in) {
  (void)in;
  return r->value;
}

static int tr_residual(vspec_rule *r, const vspec_accept_input *in, float *q_out) {
  (void)r;
  for (int i = 0; i < in->vocab; i++) q_out[i] = in->q[i];
  return VSPEC_OK;
}

static const vspec_accept_vtable tr_vtable = {
    .struct_size = sizeof(vspec_accept_vtable),
    .create = tr_create,
    .destroy = tr_destroy,
    .accept_prob = tr_accept,
    .residual = tr_residual,
};

#ifdef TEST_INIT_FAIL
static int tr_init(const vspec_host *host, char *err, size_t errlen) {
  (void)host;
  snprintf(err, errlen, "this build fails to initialise on purpose");
  return VSPEC_EPLUGIN;
}
#define TR_FLAGS VSPEC_PLUGIN_THREAD_SAFE
#define TR_INIT tr_init
#else
#define TR_FLAGS (VSPEC_PLUGIN_THREAD_SAFE | VSPEC_PLUGIN_MAY_UNLOAD)
#define TR_INIT NULL
#endif

static const vspec_plugin_desc tr_desc = {
    VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_ACCEPT, "testrule", "test-" VSPEC_STR(TEST_VALUE), TR_FLAGS),
    .description = "registry test rule",
    .vtable = &tr_vtable,
    .init = TR_INIT,
};

VSPEC_PLUGIN_DEFINE(tr_desc)
