/*
 * core/method_plugins.c - a method's rule and scheduler, opened (core/method_plugins.h).
 */
#include "core/method_plugins.h"

#include <stdio.h>

int vs_rule_fits(const vspec_accept_vtable *vt, int continuous, const char *model, char *err,
                 size_t errlen) {
  int has_cont = VSPEC_HAS_FIELD(vt, vspec_accept_vtable, accept_prob_continuous) &&
                 vt->accept_prob_continuous;
  int full_cont = has_cont && VSPEC_HAS_FIELD(vt, vspec_accept_vtable, residual_continuous) &&
                  vt->residual_continuous;
  if (continuous && !full_cont) {
    snprintf(err, errlen, "it is for discrete tokens; model '%s' has continuous tokens (use "
             "the rule `continuous`, or method ar)", model);
    return VSPEC_EINVAL;
  }
  if (!continuous && has_cont) {
    snprintf(err, errlen, "it is for continuous tokens; model '%s' has discrete tokens (use "
             "exact, lantern, lanternpp, uniform_rsd, coolsd or gsd)", model);
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

int vs_rule_open(vs_registry *reg, const vspec_host *host, const char *name,
                 const vspec_params *params, int continuous, const char *model,
                 vs_plugin **plugin, vspec_rule **rule, char *err, size_t errlen) {
  *plugin = NULL;
  *rule = NULL;
  int rc = vs_registry_acquire(reg, VSPEC_PLUGIN_ACCEPT, name, plugin, err, errlen);
  if (rc) return rc;
  const vspec_accept_vtable *vt = vs_plugin_vtable(*plugin);
  char inner[VSPEC_ERRLEN] = "";
  rc = vs_rule_fits(vt, continuous, model, inner, sizeof inner);
  if (!rc) rc = vt->create(host, params, rule, inner, sizeof inner);
  if (rc) {
    snprintf(err, errlen, "acceptance rule '%s': %s", name, inner);
    *rule = NULL;
    vs_plugin_release(*plugin);
    *plugin = NULL;
  }
  return rc;
}

int vs_sched_open(vs_registry *reg, const vspec_host *host, const char *name,
                  const vspec_params *params, vs_plugin **plugin, vspec_sched **sched,
                  char *err, size_t errlen) {
  *plugin = NULL;
  *sched = NULL;
  int rc = vs_registry_acquire(reg, VSPEC_PLUGIN_SCHED, name, plugin, err, errlen);
  if (rc) return rc;
  const vspec_sched_vtable *vt = vs_plugin_vtable(*plugin);
  char inner[VSPEC_ERRLEN] = "";
  rc = vt->create(host, params, sched, inner, sizeof inner);
  if (rc) {
    snprintf(err, errlen, "scheduler '%s': %s", name, inner);
    *sched = NULL;
    vs_plugin_release(*plugin);
    *plugin = NULL;
  }
  return rc;
}
