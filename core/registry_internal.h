/*
 * core/registry_internal.h - what the two files of the plugin registry share (not a public
 * API; the registry is core/registry.h): registry.c keeps the registry (names, kinds,
 * acquire, scan, refresh, list, close), registry_load.c loads one generation of a plugin
 * (where plugin code may come from, its private copy, builds that failed, dlopen and the
 * descriptor check).
 */
#ifndef VS_REGISTRY_INTERNAL_H
#define VS_REGISTRY_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>

#include "core/registry.h"

struct vs_plugin {
  atomic_int refs;
  int kind;
  unsigned generation;
  char name[64];
  char version[64];
  char file[512]; /* the original file in plugin_dir, for messages */
  /* The file this generation was read from, to tell a rebuilt plugin (SIGHUP refresh). */
  dev_t src_dev;
  ino_t src_ino;
  off_t src_size;
  struct timespec src_mtime;
  void *handle;
  const vspec_plugin_desc *desc;
  const void *vtable;
  struct vs_registry *reg; /* for the retired count; NULL after the registry closed */
};

/* A build whose init failed and that stayed mapped (it may not be unloaded): the file it was
 * read from, so that the same build is refused before it is copied and mapped again. */
typedef struct vs__failed_build {
  int kind;
  char name[64];
  off_t size;
  struct timespec mtime;
  uint64_t hash; /* FNV-1a of the content: a rebuild may keep size and mtime */
  char why[256]; /* the plugin's own message, repeated in the refusal */
} vs__failed_build;

typedef struct vs__entry {
  int kind;
  char name[64];
  unsigned next_generation;
  vs_plugin *current;
  int retired_alive; /* generations of this entry no longer current but still referenced */
} vs__entry;

struct vs_registry {
  pthread_mutex_t lock;
  char dir[512];
  char private_dir[256]; /* mkdtemp template of the directory a load's copy is opened from */
  unsigned copies;        /* copies made so far: each load attempt gets a name of its own */
  const vspec_host *host;
  vs__entry *entries;
  int n_entries, cap_entries;
  vs__failed_build *failed; /* at most one per (kind, name): the last build that failed */
  int n_failed, cap_failed;
  int refs; /* 1 for the registry itself + 1 per live generation: freed at 0 */
};
/* A plugin name: [a-z0-9_], 1 to 63 characters (registry.c). */
int vs__plugin_name_ok(const char *name);
/* A plugin directory only its owner (root or this user) can write (registry_load.c). */
int vs__plugin_trusted_dir(const char *dir, const char *what, char *err, size_t errlen);
/* Opens one generation of `file` (a path inside plugin_dir) (registry_load.c). */
int vs__plugin_load_generation(vs_registry *reg, const char *file, int kind, const char *name,
                               unsigned generation, vs_plugin **out, char *err, size_t errlen);

#endif /* VS_REGISTRY_INTERNAL_H */
