/*
 * core/registry_load.c - one generation of a plugin, loaded: the file checked for who may
 * write it, copied privately (a rebuild in place never changes running code), dlopened,
 * its descriptor checked, and a build whose init failed remembered (core/registry.h).
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
/* Minimum sizes this host needs: everything defined in ABI 1.0. */
#define VS_DESC_MIN_SIZE (offsetof(vspec_plugin_desc, shutdown) + sizeof(void (*)(void)))
static size_t regld_vtable_min_size(int kind) {
  switch (kind) {
    case VSPEC_PLUGIN_BACKEND: return sizeof(vspec_backend_vtable);
    /* walk_rule (ABI 1.6) is optional: the engine checks for it (VSPEC_HAS_FIELD), so a rule
     * built before it still loads */
    case VSPEC_PLUGIN_ACCEPT: return offsetof(vspec_accept_vtable, walk_rule);
    case VSPEC_PLUGIN_SCHED: return sizeof(vspec_sched_vtable);
    /* through skip (ABI 1.5); begin .. counts (ABI 1.6) are checked where used */
    case VSPEC_PLUGIN_DRAFTER:
      return offsetof(vspec_drafter_vtable, skip) + sizeof(((vspec_drafter_vtable *)0)->skip);
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
  if (!vs__plugin_name_ok(d->name)) {
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
  size_t need = regld_vtable_min_size((int)d->kind);
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
static int regld_trusted(const char *path, const struct stat *st, const char *what, char *err,
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

int vs__plugin_trusted_dir(const char *dir, const char *what, char *err, size_t errlen) {
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "%s '%s' does not exist or is not a directory", what, dir);
    return VSPEC_ENOENT;
  }
  return regld_trusted(dir, &st, what, err, errlen);
}

static const char *regld_file_type(mode_t m) {
  return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a directory" : S_ISSOCK(m) ? "a socket" :
         S_ISCHR(m) || S_ISBLK(m) ? "a device" : S_ISLNK(m) ? "a symbolic link" : "not a file";
}

/* The directory that holds `path` (canonical) and the name in it. */
static int regld_split(const char *path, char *dir, size_t dlen, char *base, size_t blen, char *err,
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
 * the file itself must pass regld_trusted: a link into a directory others can write is
 * refused. Fills `real` with the final path (no link in its last component). */
static int regld_resolve(const vs_registry *reg, const char *path, char *real, size_t rlen,
                       char *err, size_t errlen) {
  char cur[PATH_MAX], dir[PATH_MAX], base[NAME_MAX + 1];
  snprintf(cur, sizeof cur, "%s", path);
  for (int hop = 0;; hop++) {
    int rc = regld_split(cur, dir, sizeof dir, base, sizeof base, err, errlen);
    if (rc) return rc;
    /* the plugin directory itself, then every directory a link leads into */
    if ((rc = vs__plugin_trusted_dir(hop ? dir : reg->dir,
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
static int regld_open_plugin(const vs_registry *reg, const char *path, int *fd_out, char *err,
                           size_t errlen) {
  char real[PATH_MAX];
  int rc = regld_resolve(reg, path, real, sizeof real, err, errlen);
  if (rc) return rc;
  struct stat st;
  if (lstat(real, &st) != 0) {
    int e = errno;
    snprintf(err, errlen, "%s: cannot stat plugin: %s", real, strerror(e));
    return e == ENOENT ? VSPEC_ENOENT : VSPEC_EIO;
  }
  if (!S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "%s: %s, not a regular file: refused", real, regld_file_type(st.st_mode));
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
  if ((rc = regld_trusted(real, &st, "plugin file", err, errlen))) {
    close(fd);
    return rc;
  }
  *fd_out = fd;
  return VSPEC_OK;
}

/* FNV-1a, 64 bits: tells one build from another, not a defence (whoever can write the
 * plugin directory can run code anyway). */
#define VS__FNV_OFFSET 0xcbf29ce484222325ull
static uint64_t regld_fnv(uint64_t h, const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

/* The hash of the whole file `fd`, read with pread (the file offset does not move). */
static int regld_hash_fd(int fd, uint64_t *hash) {
  unsigned char buf[1 << 16];
  uint64_t h = VS__FNV_OFFSET;
  for (off_t off = 0;;) {
    ssize_t n = pread(fd, buf, sizeof buf, off);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return VSPEC_EIO;
    }
    h = regld_fnv(h, buf, (size_t)n);
    off += n;
  }
  *hash = h;
  return VSPEC_OK;
}

/* Copies the open plugin `in` (named `src` in messages) to dst (a fresh file); the copy is
 * what gets dlopen'ed. *hash gets the hash of what was copied. */
static int regld_copy_file(int in, const char *src, const char *dst, uint64_t *hash, char *err,
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
    *hash = regld_fnv(*hash, (const unsigned char *)buf, (size_t)n);
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
/* ---- builds that failed and stayed mapped ------------------------------------------- */

static vs__failed_build *regld_find_failed(vs_registry *reg, int kind, const char *name) {
  for (int i = 0; i < reg->n_failed; i++)
    if (reg->failed[i].kind == kind && !strcmp(reg->failed[i].name, name)) return &reg->failed[i];
  return NULL;
}

/* Whether the open plugin file `fd` (stat `st`) is the build of (kind, name) that failed
 * and stayed mapped: then the refusal is in err. Every attempt maps a fresh copy that is
 * never unmapped, so retrying an unchanged build only grows the daemon (issue 32, finding 1);
 * size and mtime are checked first, the content only when they match. */
static int regld_failed_before(vs_registry *reg, int kind, const char *name, int fd,
                             const struct stat *st, const char *file, char *err,
                             size_t errlen) {
  const vs__failed_build *f = regld_find_failed(reg, kind, name);
  uint64_t hash;
  if (!f || f->size != st->st_size || f->mtime.tv_sec != st->st_mtim.tv_sec ||
      f->mtime.tv_nsec != st->st_mtim.tv_nsec || regld_hash_fd(fd, &hash) || hash != f->hash)
    return 0;
  snprintf(err, errlen, "%s: this build failed to initialise before and is unchanged (same "
           "size, mtime and content): not loaded again, since every failed attempt stays "
           "mapped; install a fixed build (or touch the file to try this one again). It "
           "failed with: %s", file, f->why);
  return 1;
}

/* Remembers the build that just failed and stayed mapped, in place of an earlier failed
 * build of the same plugin: the table holds one per plugin file. */
static void regld_remember_failed(vs_registry *reg, int kind, const char *name,
                                const struct stat *st, uint64_t hash, const char *why) {
  vs__failed_build *f = regld_find_failed(reg, kind, name);
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
int vs__plugin_load_generation(vs_registry *reg, const char *file, int kind, const char *name,
                               unsigned generation, vs_plugin **out, char *err, size_t errlen) {
  int in;
  int rc = regld_open_plugin(reg, file, &in, err, errlen);
  if (rc) return rc;
  struct stat src;
  if (fstat(in, &src) != 0) memset(&src, 0, sizeof src);
  if (regld_failed_before(reg, kind, name, in, &src, file, err, errlen)) {
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
  rc = regld_copy_file(in, file, copy, &hash, err, errlen);
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
        regld_remember_failed(reg, kind, name, &src, hash, *perr ? perr : "no message");
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
