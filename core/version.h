/*
 * core/version.h - the release of vspec, printed by every program's --version together with
 * the plugin ABI it hosts (include/vspec/plugin.h), so a bug report says which build it was.
 */
#ifndef VS_VERSION_H
#define VS_VERSION_H

#include <stdio.h>

#include "vspec/plugin.h"

#define VSPEC_VERSION "0.9.0"

static inline void vs_print_version(FILE *f, const char *program) {
  fprintf(f, "%s (vspec) %s, plugin ABI %d.%d\n", program, VSPEC_VERSION, VSPEC_ABI_MAJOR,
          VSPEC_ABI_MINOR);
}

#endif /* VS_VERSION_H */
