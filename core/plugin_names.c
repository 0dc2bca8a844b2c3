/*
 * core/plugin_names.c - what plugins are called: the kinds' names and the rule for a plugin's
 * name (core/registry.h, registry_internal.h). A leaf: the registry (registry.c) and the
 * loader (registry_load.c) both use it, and it uses neither.
 */
#include <string.h>

#include "core/registry_internal.h"

static const char *const kind_names[] = {NULL, "backend", "accept", "sched", "drafter"};

const char *vs_plugin_kind_name(int kind) {
  return (kind >= VSPEC_PLUGIN_BACKEND && kind <= VSPEC_PLUGIN_DRAFTER) ? kind_names[kind]
                                                                      : "unknown";
}

int vs_plugin_kind_parse(const char *name) {
  for (int k = VSPEC_PLUGIN_BACKEND; k <= VSPEC_PLUGIN_DRAFTER; k++)
    if (name && strcmp(name, kind_names[k]) == 0) return k;
  return -1;
}

int vs__plugin_name_ok(const char *name) {
  if (!name || !*name || strlen(name) >= 64) return 0;
  for (const char *c = name; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) return 0;
  return 1;
}
