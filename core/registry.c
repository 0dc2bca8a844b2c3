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
#include "core/suggest.h"

/* Minimum sizes this host needs: everything defined in ABI 1.0. */
#define VS_DESC_MIN_SIZE (offsetof(vspec_plugin_desc, shutdown) + sizeof(void (*)(void)))

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

static const char *const vs__kind_names[] = {NULL, "backend", "accept", "sched", "drafter"};

const char *vs_plugin_kind_name(int kind) {
  return (kind >= VSPEC_PLUGIN_BACKEND && kind <= VSPEC_PLUGIN_DRAFTER) ? vs__kind_names[kind]
                                                                      : "unknown";
}

int vs_plugin_kind_parse(const char *name) {
  for (int k = VSPEC_PLUGIN_BACKEND; k <= VSPEC_PLUGIN_DRAFTER; k++)
    if (name && strcmp(name, vs__kind_names[k]) == 0) return k;
  return -1;
}

static int vs__name_ok(const char *name) {
  if (!name || !*name || strlen(name) >= 64) return 0;
  for (const char *c = name; *c; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) return 0;
  return 1;
}

static size_t vs__vtable_min_size(int kind) {
  switch (kind) {
    case VSPEC_PLUGIN_BACKEND: return sizeof(vspec_backend_vtable);
    case VSPEC_PLUGIN_ACCEPT: return sizeof(vspec_accept_vtable);
    case VSPEC_PLUGIN_SCHED: return sizeof(vspec_sched_vtable);
    case VSPEC_PLUGIN_DRAFTER: return sizeof(vspec_drafter_vtable);
    default: return (size_t)-1;
  }
}

int vs_plugin_check_desc(const vspec_plugin_desc *d, const char *file, int want_kind,
                         const char *want_name, char *err, size_t errlen) {
  if (!d) {
    snprintf(err, errlen, "%s: %s() returned NULL", file, VSPEC_PLUGIN_ENTRY_SYMBOL);
    return VSPEC_EABI;
  }
  /* The frozen head is safe to read from any plugin that claims to be a vspec plugin. */
  if (d->abi_major != VSPEC_ABI_MAJOR || d->abi_minor > VSPEC_ABI_MINOR) {
    snprintf(err, errlen,
             "%s: plugin was built for vspec plugin ABI %u.%u, but this host implements ABI %d.%d "
             "(the major version must match and the minor must not be newer); rebuild the "
             "plugin against this host's include/vspec/",
             file, d->abi_major, d->abi_minor, VSPEC_ABI_MAJOR, VSPEC_ABI_MINOR);
    return VSPEC_EABI;
  }
  if (d->struct_size < VS_DESC_MIN_SIZE) {
    snprintf(err, errlen,
             "%s: plugin descriptor is %u bytes, ABI %d.%d needs at least %zu (plugin claims ABI "
             "%u.%u)",
             file, d->struct_size, VSPEC_ABI_MAJOR, VSPEC_ABI_MINOR, (size_t)VS_DESC_MIN_SIZE,
             d->abi_major, d->abi_minor);
    return VSPEC_EABI;
  }
  if (want_kind > 0 && (int)d->kind != want_kind) {
    snprintf(err, errlen, "%s: plugin kind is '%s', expected '%s'", file,
             vs_plugin_kind_name((int)d->kind), vs_plugin_kind_name(want_kind));
    return VSPEC_EABI;
  }
  if (!vs__name_ok(d->name)) {
    snprintf(err, errlen, "%s: plugin name is missing or not [a-z0-9_]{1,63}", file);
    return VSPEC_EABI;
  }
  if (want_name && strcmp(d->name, want_name) != 0) {
    snprintf(err, errlen, "%s: plugin calls itself '%s', expected '%s'", file, d->name, want_name);
    return VSPEC_EABI;
  }
  if (!d->version || strlen(d->version) >= 64) {
    snprintf(err, errlen, "%s: plugin '%s' has no version string", file, d->name);
    return VSPEC_EABI;
  }
  if (!d->vtable) {
    snprintf(err, errlen, "%s: plugin '%s' has no vtable", file, d->name);
    return VSPEC_EABI;
  }
  uint32_t vsize = *(const uint32_t *)d->vtable;
  size_t need = vs__vtable_min_size((int)d->kind);
  if (vsize < need) {
    snprintf(err, errlen,
             "%s: plugin '%s' %s vtable is %u bytes, ABI %d.%d needs %zu (plugin claims ABI %u.%u)",
             file, d->name, vs_plugin_kind_name((int)d->kind), vsize, VSPEC_ABI_MAJOR,
             VSPEC_ABI_MINOR, need, d->abi_major, d->abi_minor);
    return VSPEC_EABI;
  }
  return VSPEC_OK;
}

/* ---- where plugin code may come from ------------------------------------------------ */

/* Anyone who can write a plugin file, or the directory that names it, can make the daemon
 * run their code: both must be writable by their owner only, and the owner must be root or
 * the user the daemon runs as. Parent directories are not checked (a checkout in a
 * group-writable home is fine); the directory that holds the file is. */
static int vs__trusted(const char *path, const struct stat *st, const char *what, char *err,
                       size_t errlen) {
  if (st->st_uid != 0 && st->st_uid != geteuid()) {
    snprintf(err, errlen, "%s %s is owned by uid %u, not by root or the user vspecd runs as "
             "(uid %u): refused, its owner could swap the code vspecd runs", what, path,
             (unsigned)st->st_uid, (unsigned)geteuid());
    return VSPEC_EPLUGIN;
  }
  if (st->st_mode & (S_IWGRP | S_IWOTH)) {
    snprintf(err, errlen, "%s %s is writable by %s (mode %04o): refused, whoever can write it "
             "can make vspecd run their code (chmod go-w %s)", what, path,
             (st->st_mode & S_IWOTH) ? "everyone" : "its group", (unsigned)(st->st_mode & 07777),
             path);
    return VSPEC_EPLUGIN;
  }
  return VSPEC_OK;
}

static int vs__trusted_dir(const char *dir, const char *what, char *err, size_t errlen) {
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "%s '%s' does not exist or is not a directory", what, dir);
    return VSPEC_ENOENT;
  }
  return vs__trusted(dir, &st, what, err, errlen);
}

static const char *vs__file_type(mode_t m) {
  return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a directory" : S_ISSOCK(m) ? "a socket" :
         S_ISCHR(m) || S_ISBLK(m) ? "a device" : S_ISLNK(m) ? "a symbolic link" : "not a file";
}

/* The directory that holds `path` (canonical) and the name in it. */
static int vs__split(const char *path, char *dir, size_t dlen, char *base, size_t blen, char *err,
                     size_t errlen) {
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s", path);
  char *slash = strrchr(tmp, '/');
  snprintf(base, blen, "%s", slash ? slash + 1 : tmp);
  if (slash == tmp) snprintf(tmp, sizeof tmp, "/");
  else if (slash) *slash = 0;
  else snprintf(tmp, sizeof tmp, ".");
  char real[PATH_MAX];
  if (!realpath(tmp, real)) {
    snprintf(err, errlen, "%s: cannot resolve directory %s: %s", path, tmp, strerror(errno));
    return VSPEC_ENOENT;
  }
  snprintf(dir, dlen, "%s", real);
  return VSPEC_OK;
}

/* Follows `path` to the file it names. Symbolic links are followed (a plugin directory of
 * links into a build tree is fine), but every directory that holds a link of the chain or
 * the file itself must pass vs__trusted: a link into a directory others can write is
 * refused. Fills `real` with the final path (no link in its last component). */
static int vs__resolve(const vs_registry *reg, const char *path, char *real, size_t rlen,
                       char *err, size_t errlen) {
  char cur[PATH_MAX], dir[PATH_MAX], base[NAME_MAX + 1];
  snprintf(cur, sizeof cur, "%s", path);
  for (int hop = 0;; hop++) {
    int rc = vs__split(cur, dir, sizeof dir, base, sizeof base, err, errlen);
    if (rc) return rc;
    /* the plugin directory itself, then every directory a link leads into */
    if ((rc = vs__trusted_dir(hop ? dir : reg->dir,
                              hop ? "directory a plugin's symbolic link leads into" :
                                    "plugin directory", err, errlen)))
      return rc;
    snprintf(real, rlen, "%s/%s", dir, base);
    struct stat st;
    if (lstat(real, &st) != 0) {
      snprintf(err, errlen, hop ? "%s: symbolic link leads to %s, which does not exist" :
               "%s: no such file%.0s", path, real);
      return VSPEC_ENOENT;
    }
    if (!S_ISLNK(st.st_mode)) return VSPEC_OK;
    if (hop == 8) {
      snprintf(err, errlen, "%s: more than 8 symbolic links", path);
      return VSPEC_EPLUGIN;
    }
    char target[PATH_MAX];
    ssize_t n = readlink(real, target, sizeof target - 1);
    if (n < 0) {
      snprintf(err, errlen, "%s: cannot read symbolic link %s: %s", path, real, strerror(errno));
      return VSPEC_EIO;
    }
    target[n] = 0;
    if (target[0] == '/') snprintf(cur, sizeof cur, "%s", target);
    else snprintf(cur, sizeof cur, "%s/%s", dir, target);
  }
}

/* Opens plugin file `path` for copying, after the checks above. Nothing but a regular file
 * is ever opened (a FIFO would block the caller, on the loop thread, under the registry
 * lock), and O_NOFOLLOW | O_NONBLOCK keep a file swapped after the check from doing it. */
static int vs__open_plugin(const vs_registry *reg, const char *path, int *fd_out, char *err,
                           size_t errlen) {
  char real[PATH_MAX];
  int rc = vs__resolve(reg, path, real, sizeof real, err, errlen);
  if (rc) return rc;
  struct stat st;
  if (lstat(real, &st) != 0) {
    int e = errno;
    snprintf(err, errlen, "%s: cannot stat plugin: %s", real, strerror(e));
    return e == ENOENT ? VSPEC_ENOENT : VSPEC_EIO;
  }
  if (!S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "%s: %s, not a regular file: refused", real, vs__file_type(st.st_mode));
    return VSPEC_EPLUGIN;
  }
  int fd = open(real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    snprintf(err, errlen, "%s: cannot open plugin: %s", real, strerror(errno));
    return VSPEC_EIO;
  }
  /* The checks hold for the file opened, not one that was there a moment ago. */
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "%s: not a regular file: refused", real);
    close(fd);
    return VSPEC_EPLUGIN;
  }
  if ((rc = vs__trusted(real, &st, "plugin file", err, errlen))) {
    close(fd);
    return rc;
  }
  *fd_out = fd;
  return VSPEC_OK;
}

/* FNV-1a, 64 bits: tells one build from another, not a defence (whoever can write the
 * plugin directory can run code anyway). */
#define VS__FNV_OFFSET 0xcbf29ce484222325ull
static uint64_t vs__fnv(uint64_t h, const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* The hash of the whole file `fd`, read with pread (the file offset does not move). */
static int vs__hash_fd(int fd, uint64_t *hash) {
  unsigned char buf[1 << 16];
  uint64_t h = VS__FNV_OFFSET;
  for (off_t off = 0;;) {
    ssize_t n = pread(fd, buf, sizeof buf, off);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return VSPEC_EIO;
    }
    h = vs__fnv(h, buf, (size_t)n);
    off += n;
  }
  *hash = h;
  return VSPEC_OK;
}

/* Copies the open plugin `in` (named `src` in messages) to dst (a fresh file); the copy is
 * what gets dlopen'ed. *hash gets the hash of what was copied. */
static int vs__copy_file(int in, const char *src, const char *dst, uint64_t *hash, char *err,
                         size_t errlen) {
  int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0700);
  if (out < 0) {
    snprintf(err, errlen, "%s: cannot create generation copy: %s", dst, strerror(errno));
    return VSPEC_EIO;
  }
  char buf[1 << 16];
  int rc = VSPEC_OK;
  *hash = VS__FNV_OFFSET;
  for (;;) {
    ssize_t n = read(in, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      rc = VSPEC_EIO;
      break;
    }
    *hash = vs__fnv(*hash, (const unsigned char *)buf, (size_t)n);
    for (ssize_t off = 0; off < n;) {
      ssize_t w = write(out, buf + off, (size_t)(n - off));
      if (w < 0) {
        if (errno == EINTR) continue;
        rc = VSPEC_EIO;
        break;
      }
      off += w;
    }
    if (rc) break;
  }
  if (rc) snprintf(err, errlen, "%s: copying to %s failed: %s", src, dst, strerror(errno));
  if (close(out) != 0 && !rc) {
    snprintf(err, errlen, "%s: closing %s failed: %s", src, dst, strerror(errno));
    rc = VSPEC_EIO;
  }
  return rc;
}

static void vs__registry_unref_locked(vs_registry *reg, int *free_it) {
  *free_it = (--reg->refs == 0);
}

static void vs__registry_free(vs_registry *reg) {
  pthread_mutex_destroy(&reg->lock);
  free(reg->entries);
  free(reg->failed);
  free(reg);
}

/* ---- builds that failed and stayed mapped ------------------------------------------- */

static vs__failed_build *vs__find_failed(vs_registry *reg, int kind, const char *name) {
  for (int i = 0; i < reg->n_failed; i++)
    if (reg->failed[i].kind == kind && !strcmp(reg->failed[i].name, name)) return &reg->failed[i];
  return NULL;
}

/* Whether the open plugin file `fd` (stat `st`) is the build of (kind, name) that failed
 * and stayed mapped: then the refusal is in err. Every attempt maps a fresh copy that is
 * never unmapped, so retrying an unchanged build only grows the daemon (issue 32, finding 1);
 * size and mtime are checked first, the content only when they match. */
static int vs__failed_before(vs_registry *reg, int kind, const char *name, int fd,
                             const struct stat *st, const char *file, char *err,
                             size_t errlen) {
  const vs__failed_build *f = vs__find_failed(reg, kind, name);
  uint64_t hash;
  if (!f || f->size != st->st_size || f->mtime.tv_sec != st->st_mtim.tv_sec ||
      f->mtime.tv_nsec != st->st_mtim.tv_nsec || vs__hash_fd(fd, &hash) || hash != f->hash)
    return 0;
  snprintf(err, errlen, "%s: this build failed to initialise before and is unchanged (same "
           "size, mtime and content): not loaded again, since every failed attempt stays "
           "mapped; install a fixed build (or touch the file to try this one again). It "
           "failed with: %s", file, f->why);
  return 1;
}

/* Remembers the build that just failed and stayed mapped, in place of an earlier failed
 * build of the same plugin: the table holds one per plugin file. */
static void vs__remember_failed(vs_registry *reg, int kind, const char *name,
                                const struct stat *st, uint64_t hash, const char *why) {
  vs__failed_build *f = vs__find_failed(reg, kind, name);
  if (!f) {
    if (reg->n_failed == reg->cap_failed) {
      int cap = reg->cap_failed ? 2 * reg->cap_failed : 4;
      vs__failed_build *nf = realloc(reg->failed, (size_t)cap * sizeof *nf);
      if (!nf) return; /* not remembered: a retry maps one more copy, nothing worse */
      reg->failed = nf;
      reg->cap_failed = cap;
    }
    f = &reg->failed[reg->n_failed++];
  }
  f->kind = kind;
  snprintf(f->name, sizeof f->name, "%s", name);
  f->size = st->st_size;
  f->mtime = st->st_mtim;
  f->hash = hash;
  snprintf(f->why, sizeof f->why, "%s", why);
}

/* Opens one generation of `file` (a path inside plugin_dir). */
static int vs__load_generation(vs_registry *reg, const char *file, int kind, const char *name,
                               unsigned generation, vs_plugin **out, char *err, size_t errlen) {
  int in;
  int rc = vs__open_plugin(reg, file, &in, err, errlen);
  if (rc) return rc;
  struct stat src;
  if (fstat(in, &src) != 0) memset(&src, 0, sizeof src);
  if (vs__failed_before(reg, kind, name, in, &src, file, err, errlen)) {
    close(in);
    return VSPEC_EPLUGIN;
  }
  /* dlopen hands back an object already open under the same path without reading the file:
   * every attempt, failed ones included, gets a name never used before, or a fixed build
   * could not be loaded after a failed one that stays open (not MAY_UNLOAD). */
  /* The copy's directory lives only as long as the load: a daemon killed with SIGKILL (or a
   * program that never closes its registry) leaves nothing behind in /tmp. */
  char dir[sizeof reg->private_dir], copy[sizeof reg->private_dir + 96];
  snprintf(dir, sizeof dir, "%s", reg->private_dir);
  if (!mkdtemp(dir)) {
    snprintf(err, errlen, "%s: cannot create a private directory for the copy (%s): %s", file,
             reg->private_dir, strerror(errno));
    close(in);
    return VSPEC_EIO;
  }
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  snprintf(copy, sizeof copy, "%s/g%u.%u-%.60s", dir, generation, ++reg->copies, base);
  uint64_t hash;
  rc = vs__copy_file(in, file, copy, &hash, err, errlen);
  close(in);
  if (rc) {
    unlink(copy);
    rmdir(dir);
    return rc;
  }

  dlerror();
  void *h = dlopen(copy, RTLD_NOW | RTLD_LOCAL);
  /* The mapping keeps the code alive; the name is not needed any more. */
  unlink(copy);
  rmdir(dir);
  if (!h) {
    const char *why = dlerror();
    snprintf(err, errlen, "%s: not a loadable shared object: %s", file, why ? why : "unknown error");
    return VSPEC_EPLUGIN;
  }
  dlerror();
  vspec_plugin_entry_fn entry;
  *(void **)&entry = dlsym(h, VSPEC_PLUGIN_ENTRY_SYMBOL);
  if (!entry) {
    snprintf(err, errlen, "%s: no '%s' symbol: not a vspec plugin (build it with "
             "VSPEC_PLUGIN_DEFINE from vspec/plugin.h)", file, VSPEC_PLUGIN_ENTRY_SYMBOL);
    dlclose(h);
    return VSPEC_EPLUGIN;
  }
  const vspec_plugin_desc *d = entry();
  rc = vs_plugin_check_desc(d, file, kind, name, err, errlen);
  if (rc) {
    dlclose(h);
    return rc;
  }
  if (d->init) {
    char perr[VSPEC_ERRLEN] = "";
    rc = d->init(reg->host, perr, sizeof perr);
    if (rc) {
      snprintf(err, errlen, "%s: plugin '%s' failed to initialise: %s", file, d->name,
               *perr ? perr : "no message");
      /* A failed init may have left state behind (threads, handlers, device code): only
       * close what says it may unload; the rest stays mapped, unused, under its own copy's
       * name, which does not keep a fixed build from loading. */
      if ((d->flags & VSPEC_PLUGIN_MAY_UNLOAD) && !(d->flags & VSPEC_PLUGIN_HAS_DEVICE_CODE)) {
        dlclose(h);
      } else {
        vs__remember_failed(reg, kind, name, &src, hash, *perr ? perr : "no message");
        vs_log(VSPEC_LOG_WARN, "registry", "%s: the failed build stays mapped (it may not be "
               "unloaded) and is not loaded again while the file is unchanged; a fixed build "
               "can still be loaded", file);
      }
      return VSPEC_EPLUGIN;
    }
  }
  vs_plugin *p = calloc(1, sizeof *p);
  if (!p) {
    if (d->shutdown) d->shutdown();
    dlclose(h);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  atomic_init(&p->refs, 1);
  p->kind = kind;
  p->generation = generation;
  /* Copies, so nothing points into a library that may be closed later. */
  snprintf(p->name, sizeof p->name, "%s", d->name);
  snprintf(p->version, sizeof p->version, "%s", d->version);
  snprintf(p->file, sizeof p->file, "%s", file);
  p->src_dev = src.st_dev;
  p->src_ino = src.st_ino;
  p->src_size = src.st_size;
  p->src_mtime = src.st_mtim;
  p->handle = h;
  p->desc = d;
  p->vtable = d->vtable;
  p->reg = reg;
  *out = p;
  return VSPEC_OK;
}

int vs_registry_open(const char *plugin_dir, const vspec_host *host, vs_registry **out, char *err,
                     size_t errlen) {
  if (!plugin_dir) {
    snprintf(err, errlen, "no plugin directory given");
    return VSPEC_ENOENT;
  }
  int rc = vs__trusted_dir(plugin_dir, "plugin directory", err, errlen);
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

static vs__entry *vs__find_entry(vs_registry *reg, int kind, const char *name) {
  for (int i = 0; i < reg->n_entries; i++)
    if (reg->entries[i].kind == kind && strcmp(reg->entries[i].name, name) == 0)
      return &reg->entries[i];
  return NULL;
}

static int vs__plugin_path(const vs_registry *reg, int kind, const char *name, char *path,
                           size_t n, char *err, size_t errlen) {
  if (kind < VSPEC_PLUGIN_BACKEND || kind > VSPEC_PLUGIN_DRAFTER) {
    snprintf(err, errlen, "unknown plugin kind %d", kind);
    return VSPEC_EINVAL;
  }
  if (!vs__name_ok(name)) {
    snprintf(err, errlen, "plugin name '%.80s' is not valid: use [a-z0-9_], at most 63 characters",
             name ? name : "(null)");
    return VSPEC_EINVAL;
  }
  snprintf(path, n, "%s/%s_%s.so", reg->dir, vs_plugin_kind_name(kind), name);
  return VSPEC_OK;
}

static int vs__parse_file_name(const char *n, char name[64]);

#define VS__MAX_NAMES 64

static int vs__cmp_name(const void *a, const void *b) {
  return strcmp((const char *)a, (const char *)b);
}

/* The names of the loaded plugins of `kind` and, with `files`, of the plugin directory's
 * files of that kind too: sorted, each once, at most VS__MAX_NAMES. Caller holds reg->lock. */
static int vs__kind_names_locked(vs_registry *reg, int kind, int files,
                                 char names[VS__MAX_NAMES][64]) {
  int n = 0;
  for (int i = 0; i < reg->n_entries && n < VS__MAX_NAMES; i++)
    if (reg->entries[i].kind == kind && reg->entries[i].current)
      snprintf(names[n++], 64, "%s", reg->entries[i].name);
  DIR *d = files ? opendir(reg->dir) : NULL;
  for (struct dirent *de; d && n < VS__MAX_NAMES && (de = readdir(d));) {
    char name[64];
    if (vs__parse_file_name(de->d_name, name) != kind || !vs__name_ok(name)) continue;
    int seen = 0;
    for (int i = 0; i < n && !seen; i++) seen = !strcmp(names[i], name);
    if (!seen) snprintf(names[n++], 64, "%s", name);
  }
  if (d) closedir(d);
  qsort(names, (size_t)n, sizeof names[0], vs__cmp_name);
  return n;
}

/* For a name that matches no plugin file, the names there are instead: "there is no KIND
 * plugin 'NAME' (loaded: a, b); did you mean 'x'?", or with `path` (the file it would be),
 * "...: no file PATH (the directory has: a, b, c); ...". Caller holds reg->lock. */
static void vs__no_such_plugin_locked(vs_registry *reg, int kind, const char *name,
                                      const char *path, char *err, size_t errlen) {
  static char names[VS__MAX_NAMES][64]; /* under reg->lock */
  const char *ptr[VS__MAX_NAMES];
  int n = vs__kind_names_locked(reg, kind, path != NULL, names);
  for (int i = 0; i < n; i++) ptr[i] = names[i];
  snprintf(err, errlen, "there is no %s plugin '%s'%s%s", vs_plugin_kind_name(kind), name,
           path ? ": no file " : "", path ? path : "");
  vs_suggest_append(err, errlen, path ? "the directory has" : "loaded", name, ptr, n);
}

/* Loads (kind, name) as a new current generation. Caller holds reg->lock. */
static int vs__load_locked(vs_registry *reg, int kind, const char *name, vs__entry **entry_out,
                           char *err, size_t errlen) {
  char path[1024];
  int rc = vs__plugin_path(reg, kind, name, path, sizeof path, err, errlen);
  if (rc) return rc;
  struct stat st;
  if (lstat(path, &st) != 0) {
    vs__no_such_plugin_locked(reg, kind, name, path, err, errlen);
    return VSPEC_ENOENT;
  }
  vs__entry *e = vs__find_entry(reg, kind, name);
  unsigned gen = e ? e->next_generation : 1;
  vs_plugin *p;
  rc = vs__load_generation(reg, path, kind, name, gen, &p, err, errlen);
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
    *entry_out = vs__find_entry(reg, kind, name);
  }
  return VSPEC_OK;
}

int vs_registry_acquire(vs_registry *reg, int kind, const char *name, vs_plugin **out, char *err,
                        size_t errlen) {
  char path[1024];
  int rc = vs__plugin_path(reg, kind, name, path, sizeof path, err, errlen);
  if (rc) return rc;
  pthread_mutex_lock(&reg->lock);
  vs__entry *e = vs__find_entry(reg, kind, name);
  if (!e) {
    rc = vs__load_locked(reg, kind, name, &e, err, errlen);
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
  int rc = vs__plugin_path(reg, kind, name, path, sizeof path, err, errlen);
  if (rc) return rc;
  pthread_mutex_lock(&reg->lock);
  vs__entry *e = vs__find_entry(reg, kind, name);
  vs_plugin *p = e ? e->current : NULL;
  if (p) atomic_fetch_add(&p->refs, 1);
  struct stat st;
  /* A reload helps only where there is a file to load; a typo gets the loaded names. */
  if (!p && lstat(path, &st) != 0) vs__no_such_plugin_locked(reg, kind, name, NULL, err, errlen);
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
  int rc = vs__load_locked(reg, kind, name, &e, err, errlen);
  pthread_mutex_unlock(&reg->lock);
  return rc;
}

/* KIND and NAME of a directory entry named <kind>_<name>.so; -1 for any other name. */
static int vs__parse_file_name(const char *n, char name[64]) {
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
    int kind = vs__parse_file_name(de->d_name, name);
    if (kind < 0) continue;
    char err[VSPEC_ERRLEN];
    pthread_mutex_lock(&reg->lock);
    vs__entry *e = vs__find_entry(reg, kind, name);
    int rc = e ? 0 : vs__load_locked(reg, kind, name, &e, err, sizeof err);
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
static int vs__file_changed(const vs_registry *reg, const vs__entry *e) {
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
    int kind = vs__parse_file_name(de->d_name, name);
    if (kind < 0) continue;
    pthread_mutex_lock(&reg->lock);
    vs__entry *e = vs__find_entry(reg, kind, name);
    int isnew = !e, changed = e && vs__file_changed(reg, e), rc = 0;
    /* Backends serve models: their caller reloads them with their models. */
    if (isnew || (changed && kind != VSPEC_PLUGIN_BACKEND))
      rc = vs__load_locked(reg, kind, name, &e, err, sizeof err);
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
  vs__registry_unref_locked(reg, &free_it);
  pthread_mutex_unlock(&reg->lock);
  /* Each release may free the registry when it drops the last generation. */
  for (int i = 0; cur && i < n; i++)
    if (cur[i]) vs_plugin_release(cur[i]);
  free(cur);
  if (free_it) vs__registry_free(reg);
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
  vs__entry *e = vs__find_entry(reg, p->kind, p->name);
  if (e && e->current != p && e->retired_alive > 0) e->retired_alive--;
  vs__registry_unref_locked(reg, &free_it);
  pthread_mutex_unlock(&reg->lock);
  free(p);
  if (free_it) vs__registry_free(reg);
}

const vspec_plugin_desc *vs_plugin_desc(const vs_plugin *p) { return p->desc; }
const void *vs_plugin_vtable(const vs_plugin *p) { return p->vtable; }
const char *vs_plugin_name(const vs_plugin *p) { return p->name; }
const char *vs_plugin_version(const vs_plugin *p) { return p->version; }
unsigned vs_plugin_generation(const vs_plugin *p) { return p->generation; }
