/*
 * core/method_plugins.h - the plugin objects a method names, opened once for the engine and
 * once for a trial at submission (daemon): the acceptance rule, checked against the model's
 * kind of tokens, and the scheduler. The check that a rule fits the tokens lives here only.
 */
#ifndef VS_METHOD_PLUGINS_H
#define VS_METHOD_PLUGINS_H

#include <stddef.h>

#include "core/registry.h"
#include "vspec/plugin.h"

/* Whether acceptance rule `vt` judges the tokens of model `model`: a continuous-token (MAR)
 * model needs the continuous entry points, a discrete one a rule without them. The message
 * ("it is for ...") says which rules to use instead. */
int vs_rule_fits(const vspec_accept_vtable *vt, int continuous, const char *model, char *err,
                 size_t errlen);

/* Acquires rule `name` from reg, checks it fits the model's tokens and creates it with
 * `params`, the set the method parsed (vs_method.rule_set). On success the caller owns
 * *plugin (vs_plugin_release) and *rule (destroy through the plugin's vtable); on failure both
 * are NULL. */
int vs_rule_open(vs_registry *reg, const vspec_host *host, const char *name,
                 const vspec_params *params, int continuous, const char *model,
                 vs_plugin **plugin, vspec_rule **rule, char *err, size_t errlen);

/* The same for scheduler `name` (vs_method.sched_set). */
int vs_sched_open(vs_registry *reg, const vspec_host *host, const char *name,
                  const vspec_params *params, vs_plugin **plugin, vspec_sched **sched,
                  char *err, size_t errlen);

#endif /* VS_METHOD_PLUGINS_H */
