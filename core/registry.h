/*
 * core/registry.h - the plugin registry: loading, ABI checks, generations, hot reload.
 *
 * Plugins live in one configured directory as <kind>_<name>.so (kind = backend, accept,
 * sched). Each load is a *generation*: the file is first copied to a private directory
 * under a unique name (so a rebuilt .so never replaces code that is running, and dlopen
 * cannot hand back a stale mapping), opened with RTLD_NOW | RTLD_LOCAL, checked against
 * the host ABI and initialised. Users hold generations by reference count; a reload makes
 * a new generation current, and the old one is shut down and closed when its last user
 * releases it. Plugins flagged HAS_DEVICE_CODE, or not flagged MAY_UNLOAD, are never
 * dlclose'd (see DESIGN.md, "Hot swap").
 *
 * Where code may come from (DESIGN.md, "Plugin loading rules"): the plugin directory and
 * each plugin file must be owned by root or the process's user and writable by nobody else
 * (no group or world write bit); only regular files are opened, a FIFO or device is refused
 * without opening it; a symbolic link is followed, and every directory along the chain
 * must pass the same check. Every load attempt is copied under a name never used before,
 * so a build that failed (and stayed mapped) never shadows a fixed one; that failed build is
 * then refused, without a copy, while its file keeps its size, mtime and content, so retries
 * (admin reloads, on-demand jobs, SIGHUP) do not map it again and again.
 */
#ifndef VS_REGISTRY_H
#define VS_REGISTRY_H

#include "vspec/plugin.h"

typedef struct vs_registry vs_registry;
typedef struct vs_plugin vs_plugin; /* one generation of one plugin */

/* `host` must outlive the registry and every generation it hands out. Refuses a plugin
 * directory others can write, with a message naming it and why. */
int vs_registry_open(const char *plugin_dir, const vspec_host *host, vs_registry **out, char *err,
                     size_t errlen);
/* Drops the registry's own references. Generations still held by users stay valid until
 * their last release. */
void vs_registry_close(vs_registry *reg);
const char *vs_registry_dir(const vs_registry *reg);

/* Current generation of plugin (kind, name), loading it on first use. The caller owns one
 * reference and must vs_plugin_release it. For callers that chose the plugin themselves
 * (the bench, tools, the engine after a job was checked). */
int vs_registry_acquire(vs_registry *reg, int kind, const char *name, vs_plugin **out, char *err,
                        size_t errlen);
/* The same, but never loads: a plugin not loaded yet (by vs_registry_scan, a reload or an
 * earlier vs_registry_acquire) is VSPEC_ENOENT with a message saying how to load it. For
 * names that come from job clients: naming a file must not be enough to run it. */
int vs_registry_acquire_loaded(vs_registry *reg, int kind, const char *name, vs_plugin **out,
                               char *err, size_t errlen);
/* Loads a new generation from the plugin directory and makes it current. Users of the
 * old generation are unaffected. On failure the current generation stays. */
int vs_registry_reload(vs_registry *reg, int kind, const char *name, char *err, size_t errlen);
/* Loads every <kind>_<name>.so of the directory that is not loaded yet; returns the number
 * of failures (each logged). */
int vs_registry_scan(vs_registry *reg);

/* What vs_registry_refresh did. */
#define VS_REFRESH_MAX_BACKENDS 8
typedef struct vs_registry_refresh_report {
  int loaded;   /* plugins new in the directory, loaded */
  int reloaded; /* rules and schedulers whose file changed, reloaded (a new generation) */
  int failed;   /* loads that failed (logged; the current generation stays) */
  int n_backends;
  char backends[VS_REFRESH_MAX_BACKENDS][64]; /* backends whose file changed: not reloaded
                                                 here, their models must be reopened too */
} vs_registry_refresh_report;
/* Brings the registry up to date with its directory (SIGHUP): loads plugins not loaded yet
 * and reloads those whose file changed since their current generation was read (another
 * inode, size or mtime); a removed file leaves its plugin loaded. Returns 0 or VSPEC_EIO
 * (the directory cannot be read). */
int vs_registry_refresh(vs_registry *reg, vs_registry_refresh_report *rep);

typedef struct vs_plugin_status {
  int kind;
  char name[64];
  char version[64];
  unsigned generation; /* current generation number, 1-based */
  int users;           /* references held on the current generation, the registry's own excluded */
  int retired_alive;   /* older generations still held by users */
} vs_plugin_status;
/* Fills up to `max` entries; returns the number of loaded plugins. */
int vs_registry_list(vs_registry *reg, vs_plugin_status *out, int max);

void vs_plugin_retain(vs_plugin *p);
void vs_plugin_release(vs_plugin *p);
const vspec_plugin_desc *vs_plugin_desc(const vs_plugin *p);
const void *vs_plugin_vtable(const vs_plugin *p);
const char *vs_plugin_name(const vs_plugin *p);
const char *vs_plugin_version(const vs_plugin *p);
unsigned vs_plugin_generation(const vs_plugin *p);

/* Kind names as used in file names and messages: "backend", "accept", "sched". */
const char *vs_plugin_kind_name(int kind);
int vs_plugin_kind_parse(const char *name); /* -1 if unknown */

/* ABI check of a descriptor, exposed for tests: 0 or VSPEC_EABI with a message naming
 * the plugin's and the host's versions. */
int vs_plugin_check_desc(const vspec_plugin_desc *desc, const char *file, int want_kind,
                         const char *want_name, char *err, size_t errlen);

#endif /* VS_REGISTRY_H */
