/* tests/support/accept_rule.c - see accept_rule.h. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include "core/host.h"
#include "core/params.h"
#include "kernels/vs_kernels.h"
#include "tests/support/accept_rule.h"

static vspec_host ar_host;
static vs_registry *ar_reg;

int vs_test_rules_open(void) {
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&ar_host, vs_cpu_ops());
  if (vs_registry_open(dir, &ar_host, &ar_reg, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  return 0;
}

void vs_test_rules_close(void) {
  vs_registry_close(ar_reg);
  ar_reg = NULL;
}

vs_test_rule vs_test_rule_make(const char *name, const char *params) {
  vs_test_rule x;
  char err[VSPEC_ERRLEN];
  if (vs_registry_acquire(ar_reg, VSPEC_PLUGIN_ACCEPT, name, &x.plugin, err, sizeof err))
    fail_msg("%s", err);
  x.vt = vs_plugin_vtable(x.plugin);
  vspec_params *p;
  assert_int_equal(vs_params_parse(params, &p, err, sizeof err), 0);
  if (x.vt->create(&ar_host, p, &x.r, err, sizeof err))
    fail_msg("%s(%s): %s", name, params, err);
  vs_params_free(p);
  return x;
}

void vs_test_rule_drop(vs_test_rule *x) {
  x->vt->destroy(x->r);
  vs_plugin_release(x->plugin);
}

int vs_test_rule_create_error(const char *name, const char *params, char *err, size_t n) {
  vs_plugin *pl;
  assert_int_equal(vs_registry_acquire(ar_reg, VSPEC_PLUGIN_ACCEPT, name, &pl, err, n), 0);
  const vspec_accept_vtable *vt = vs_plugin_vtable(pl);
  vspec_params *p;
  assert_int_equal(vs_params_parse(params, &p, err, n), 0);
  vspec_rule *r = NULL;
  int rc = vt->create(&ar_host, p, &r, err, n);
  if (!rc) vt->destroy(r);
  vs_params_free(p);
  vs_plugin_release(pl);
  return rc;
}
