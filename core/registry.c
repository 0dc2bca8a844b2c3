/*
 * core/registry.c - the plugin registry (core/registry.h): kinds and names, acquire and
 * release, scan, refresh, list, close; one generation's loading is registry_load.c.
 */
#include "core/registry.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "core/registry_internal.h"
#include "core/suggest.h"

static void reg_registry_unref_locked(vs_registry *reg, int *free_it) {
  *free_it = (--reg->refs == 0);
}

static void reg_registry_free(vs_registry *reg) {
  pthread_mutex_destroy(&reg->lock);
  free(reg->entries);
  free(reg->failed);
  free(reg);
}
int vs_registry_open(const char *plugin_dir, const vspec_host *host, vs_registry **out, char *err,
                     size_t errlen) {
  if (!plugin_dir) {
    snprintf(err, errlen, "no plugin directory given");
    return VSPEC_ENOENT;
  }
  int rc = vs__plugin_trusted_dir(plugin_dir, "plugin directory", err, errlen);
  if (rc) return rc;
  vs_registry *reg = calloc(1, sizeof *reg);
  if (!reg) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  snprintf(reg->dir, sizeof reg->dir, "%s", plugin_dir);
  const char *tmp = getenv("TMPDIR");
  snprintf(reg->private_dir, sizeof reg->private_dir, "%s/vspec-plugins-XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  /* Checked now, so that an unusable TMPDIR stops the start rather than every load. */
  char probe[sizeof reg->private_dir];
  snprintf(probe, sizeof probe, "%s", reg->private_dir);
  if (!mkdtemp(probe)) {
    snprintf(err, errlen, "cannot create a private directory for plugin generations (%s): %s",
             reg->private_dir, strerror(errno));
    free(reg);
    return VSPEC_EIO;
  }
  rmdir(probe);
  pthread_mutex_init(&reg->lock, NULL);
  reg->host = host;
  reg->refs = 1;
  *out = reg;
  return VSPEC_OK;
}

const char *vs_registry_dir(const vs_registry *reg) { return reg->dir; }

static vs__entry *reg_find_entry(vs_registry *reg, int kind, const char *name) {
  for (int i = 0; i < reg->n_entries; i++)
    if (reg->entries[i].kind == kind && strcmp(reg->entries[i].name, name) == 0)
      return &reg->entries[i];
  return NULL;
}

static int reg_plugin_path(const vs_registry *reg, int kind, const char *name, char *path,
                           size_t n, char *err, size_t errlen) {
  if (kind < VSPEC_PLUGIN_BACKEND || kind > VSPEC_PLUGIN_DRAFTER) {
    snprintf(err, errlen, "unknown plugin kind %d", kind);
    return VSPEC_EINVAL;
  }
  if (!vs__plugin_name_ok(name)) {
    snprintf(err, errlen, "plugin name '%.80s' is not valid: use [a-z0-9_], at most 63 characters",
             name ? name : "(null)");
    return VSPEC_EINVAL;
  }
  snprintf(path, n, "%s/%s_%s.so", reg->dir, vs_plugin_kind_name(kind), name);
  return VSPEC_OK;
}

static int reg_parse_file_name(const char *n, char name[64]);

#define VS__MAX_NAMES 64

static int reg_cmp_name(const void *a, const void *b) {
  return strcmp((const char *)a, (const char *)b);
}

/* The names of the loaded plugins of `kind` and, with `files`, of the plugin directory's
 * files of that kind too: sorted, each once, at most VS__MAX_NAMES. Caller holds reg->lock. */
static int reg_kind_names_locked(vs_registry *reg, int kind, int files,
                                 char names[VS__MAX_NAMES][64]) {
  int n = 0;
  for (int i = 0; i < reg->n_entries && n < VS__MAX_NAMES; i++)
    if (reg->entries[i].kind == kind && reg->entries[i].current)
      snprintf(names[n++], 64, "%s", reg->entries[i].name);
  DIR *d = files ? opendir(reg->dir) : NULL;
  for (struct dirent *de; d && n < VS__MAX_NAMES && (de = readdir(d));) {
    char name[64];
    if (reg_parse_file_name(de->d_name, name) != kind || !vs__plugin_name_ok(name)) continue;
    int seen = 0;
    for (int i = 0; i < n && !seen; i++) seen = !strcmp(names[i], name);
    if (!seen) snprintf(names[n++], 64, "%s", name);
  }
  if (d) closedir(d);
  qsort(names, (size_t)n, sizeof names[0], reg_cmp_name);
  return n;
}

/* For a name that matches no plugin file, the names there are instead: "there is no KIND
 * plugin 'NAME' (loaded: a, b); did you mean 'x'?", or with `path` (the file it would be),
 * "...: no file PATH (the directory has: a, b, c); ...". Caller holds reg->lock. */
static void reg_no_such_plugin_locked(vs_registry *reg, int kind, const char *name,
                                      const char *path, char *err, size_t errlen) {
  static char names[VS__MAX_NAMES][64]; /* under reg->lock */
  const char *ptr[VS__MAX_NAMES];
  int n = reg_kind_names_locked(reg, kind, path != NULL, names);
  for (int i = 0; i < n; i++) ptr[i] = names[i];
  snprintf(err, errlen, "there is no %s plugin '%s'%s%s", vs_plugin_kind_name(kind), name,
           path ? ": no file " : "", path ? path : "");
  vs_suggest_append(err, errlen, path ? "the directory has" : "loaded", name, ptr, n);
}

/* Loads (kind, name) as a new current generation. Caller holds reg->lock. */
static int reg_load_locked(vs_registry *reg, int kind, const char *name, vs__entry **entry_out,
                           char *err, size_t errlen) {
  char path[1024];
  int rc = reg_plugin_path(reg, kind, name, path, sizeof path, err, errlen);
  if (rc) return rc;
  struct stat st;
  if (lstat(path, &st) != 0) {
    reg_no_such_plugin_locked(reg, kind, name, path, err, errlen);
    return VSPEC_ENOENT;
  }
  vs__entry *e = reg_find_entry(reg, kind, name);
  unsigned gen = e ? e->next_generation : 1;
  vs_plugin *p;
  rc = vs__plugin_load_generation(reg, path, kind, name, gen, &p, err, errlen);
  if (rc) return rc;
  if (!e) {
    if (reg->n_entries == reg->cap_entries) {
      int cap = reg->cap_entries ? 2 * reg->cap_entries : 8;
      vs__entry *ne = realloc(reg->entries, (size_t)cap * sizeof *ne);
      if (!ne) {
        /* Undo the generation we just opened. */
        if (p->desc->shutdown) p->desc->shutdown();
        dlclose(p->handle);
        free(p);
        snprintf(err, errlen, "out of memory");
        return VSPEC_ENOMEM;
      }
      reg->entries = ne;
      reg->cap_entries = cap;
    }
    e = &reg->entries[reg->n_entries++];
    memset(e, 0, sizeof *e);
    e->kind = kind;
    snprintf(e->name, sizeof e->name, "%s", name);
  }
  e->next_generation = gen + 1;
  reg->refs++; /* the generation points back at the registry */
  vs_plugin *old = e->current;
  e->current = p;
  if (old) {
    e->retired_alive++;
    vs_log(VSPEC_LOG_INFO, "registry", "%s plugin '%s': generation %u replaces %u",
           vs_plugin_kind_name(kind), name, gen, old->generation);
  } else {
    vs_log(VSPEC_LOG_INFO, "registry", "%s plugin '%s' %s loaded from %s (generation %u)",
           vs_plugin_kind_name(kind), name, p->version, path, gen);
  }
  *entry_out = e;
  /* Drop the registry's reference on the replaced generation outside the lock. */
  if (old) {
    pthread_mutex_unlock(&reg->lock);
    vs_plugin_release(old);
    pthread_mutex_lock(&reg->lock);
    /* `e` may have moved if another thread grew the table meanwhile. */
    *entry_out = reg_find_entry(reg, kind, name);
  }
  return VSPEC_OK;
}

int vs_registry_acquire(vs_registry *reg, int kind, const char *name, vs_plugin **out, char *err,
                        size_t errlen) {
  char path[1024];
  int rc = reg_plugin_path(reg, kind, name, path, sizeof path, err, errlen);
  if (rc) return rc;
  pthread_mutex_lock(&reg->lock);
  vs__entry *e = reg_find_entry(reg, kind, name);
  if (!e) {
    rc = reg_load_locked(reg, kind, name, &e, err, errlen);
    if (rc) {
      pthread_mutex_unlock(&reg->lock);
      return rc;
    }
  }
  vs_plugin *p = e->current;
  atomic_fetch_add(&p->refs, 1);
  pthread_mutex_unlock(&reg->lock);
  *out = p;
  return VSPEC_OK;
}

int vs_registry_acquire_loaded(vs_registry *reg, int kind, const char *name, vs_plugin **out,
                               char *err, size_t errlen) {
  char path[1024];
  int rc = reg_plugin_path(reg, kind, name, path, sizeof path, err, errlen);
  if (rc) return rc;
  pthread_mutex_lock(&reg->lock);
  vs__entry *e = reg_find_entry(reg, kind, name);
  vs_plugin *p = e ? e->current : NULL;
  if (p) atomic_fetch_add(&p->refs, 1);
  struct stat st;
  /* A reload helps only where there is a file to load; a typo gets the loaded names. */
  if (!p && lstat(path, &st) != 0) reg_no_such_plugin_locked(reg, kind, name, NULL, err, errlen);
  else if (!p)
    snprintf(err, errlen, "%s plugin '%s' is not loaded: jobs use only plugins loaded at start "
             "or by an admin reload (vspec plugins reload %s/%s); plugins.on_demand = true lets "
             "jobs load them", vs_plugin_kind_name(kind), name, vs_plugin_kind_name(kind), name);
  pthread_mutex_unlock(&reg->lock);
  if (!p) return VSPEC_ENOENT;
  *out = p;
  return VSPEC_OK;
}

int vs_registry_reload(vs_registry *reg, int kind, const char *name, char *err, size_t errlen) {
  pthread_mutex_lock(&reg->lock);
  vs__entry *e;
  int rc = reg_load_locked(reg, kind, name, &e, err, errlen);
  pthread_mutex_unlock(&reg->lock);
  return rc;
}

/* KIND and NAME of a directory entry named <kind>_<name>.so; -1 for any other name. */
static int reg_parse_file_name(const char *n, char name[64]) {
  size_t len = strlen(n);
  if (len < 4 || strcmp(n + len - 3, ".so") != 0) return -1;
  const char *us = strchr(n, '_');
  if (!us) return -1;
  char kind_name[16];
  size_t kl = (size_t)(us - n);
  size_t nl = len - 3 - kl - 1;
  if (kl >= sizeof kind_name || nl == 0 || nl >= 64) return -1;
  memcpy(kind_name, n, kl);
  kind_name[kl] = 0;
  memcpy(name, us + 1, nl);
  name[nl] = 0;
  return vs_plugin_kind_parse(kind_name);
}

int vs_registry_scan(vs_registry *reg) {
  DIR *d = opendir(reg->dir);
  if (!d) return 1;
  int failures = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    char name[64];
    int kind = reg_parse_file_name(de->d_name, name);
    if (kind < 0) continue;
    char err[VSPEC_ERRLEN];
    pthread_mutex_lock(&reg->lock);
    vs__entry *e = reg_find_entry(reg, kind, name);
    int rc = e ? 0 : reg_load_locked(reg, kind, name, &e, err, sizeof err);
    pthread_mutex_unlock(&reg->lock);
    if (rc) {
      vs_log(VSPEC_LOG_WARN, "registry", "%s", err);
      failures++;
    }
  }
  closedir(d);
  return failures;
}

/* Whether the file of `e` differs from the one its current generation was read from. */
static int reg_file_changed(const vs_registry *reg, const vs__entry *e) {
  char path[1024];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s_%s.so", reg->dir, vs_plugin_kind_name(e->kind), e->name);
  const vs_plugin *p = e->current;
  if (!p || stat(path, &st) != 0) return 0; /* a removed file: the loaded generation stays */
  return st.st_dev != p->src_dev || st.st_ino != p->src_ino || st.st_size != p->src_size ||
         st.st_mtim.tv_sec != p->src_mtime.tv_sec || st.st_mtim.tv_nsec != p->src_mtime.tv_nsec;
}

int vs_registry_refresh(vs_registry *reg, vs_registry_refresh_report *rep) {
  memset(rep, 0, sizeof *rep);
  DIR *d = opendir(reg->dir);
  if (!d) return VSPEC_EIO;
  struct dirent *de;
  while ((de = readdir(d))) {
    char name[64], err[VSPEC_ERRLEN];
    int kind = reg_parse_file_name(de->d_name, name);
    if (kind < 0) continue;
    pthread_mutex_lock(&reg->lock);
    vs__entry *e = reg_find_entry(reg, kind, name);
    int isnew = !e, changed = e && reg_file_changed(reg, e), rc = 0;
    /* Backends serve models: their caller reloads them with their models. */
    if (isnew || (changed && kind != VSPEC_PLUGIN_BACKEND))
      rc = reg_load_locked(reg, kind, name, &e, err, sizeof err);
    pthread_mutex_unlock(&reg->lock);
    if (rc) {
      vs_log(VSPEC_LOG_WARN, "registry", "%s", err);
      rep->failed++;
    } else if (isnew) {
      rep->loaded++;
    } else if (changed && kind == VSPEC_PLUGIN_BACKEND) {
      if (rep->n_backends < VS_REFRESH_MAX_BACKENDS)
        snprintf(rep->backends[rep->n_backends++], sizeof rep->backends[0], "%s", name);
    } else if (changed) {
      rep->reloaded++;
    }
  }
  closedir(d);
  return VSPEC_OK;
}

int vs_registry_list(vs_registry *reg, vs_plugin_status *out, int max) {
  pthread_mutex_lock(&reg->lock);
  int n = reg->n_entries;
  for (int i = 0; i < n && i < max; i++) {
    vs__entry *e = &reg->entries[i];
    vs_plugin_status *s = &out[i];
    memset(s, 0, sizeof *s);
    s->kind = e->kind;
    snprintf(s->name, sizeof s->name, "%s", e->name);
    snprintf(s->version, sizeof s->version, "%s", e->current ? e->current->version : "");
    s->generation = e->current ? e->current->generation : 0;
    s->users = e->current ? atomic_load(&e->current->refs) - 1 : 0;
    s->retired_alive = e->retired_alive;
  }
  pthread_mutex_unlock(&reg->lock);
  return n;
}

void vs_registry_close(vs_registry *reg) {
  if (!reg) return;
  pthread_mutex_lock(&reg->lock);
  int n = reg->n_entries;
  vs_plugin **cur = calloc((size_t)n + 1, sizeof *cur);
  for (int i = 0; i < n; i++) {
    if (cur) cur[i] = reg->entries[i].current;
    reg->entries[i].current = NULL;
  }
  int free_it;
  reg_registry_unref_locked(reg, &free_it);
  pthread_mutex_unlock(&reg->lock);
  /* Each release may free the registry when it drops the last generation. */
  for (int i = 0; cur && i < n; i++)
    if (cur[i]) vs_plugin_release(cur[i]);
  free(cur);
  if (free_it) reg_registry_free(reg);
}

void vs_plugin_retain(vs_plugin *p) { atomic_fetch_add(&p->refs, 1); }

void vs_plugin_release(vs_plugin *p) {
  if (!p || atomic_fetch_sub(&p->refs, 1) != 1) return;
  vs_registry *reg = p->reg;
  const vspec_plugin_desc *d = p->desc;
  vs_log(VSPEC_LOG_INFO, "registry", "%s plugin '%s' generation %u released",
         vs_plugin_kind_name(p->kind), p->name, p->generation);
  if (d->shutdown) d->shutdown();
  if ((d->flags & VSPEC_PLUGIN_MAY_UNLOAD) && !(d->flags & VSPEC_PLUGIN_HAS_DEVICE_CODE))
    dlclose(p->handle);
  int free_it = 0;
  pthread_mutex_lock(&reg->lock);
  vs__entry *e = reg_find_entry(reg, p->kind, p->name);
  if (e && e->current != p && e->retired_alive > 0) e->retired_alive--;
  reg_registry_unref_locked(reg, &free_it);
  pthread_mutex_unlock(&reg->lock);
  free(p);
  if (free_it) reg_registry_free(reg);
}

const vspec_plugin_desc *vs_plugin_desc(const vs_plugin *p) { return p->desc; }
const void *vs_plugin_vtable(const vs_plugin *p) { return p->vtable; }
const char *vs_plugin_name(const vs_plugin *p) { return p->name; }
const char *vs_plugin_version(const vs_plugin *p) { return p->version; }
unsigned vs_plugin_generation(const vs_plugin *p) { return p->generation; }
