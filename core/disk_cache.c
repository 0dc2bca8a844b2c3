#include "core/disk_cache.h"

#include <dirent.h>
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vspec/types.h"

void vs_cache_dir(char *out, size_t cap) {
  const char *v = getenv("VSPEC_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
  if (v && *v) snprintf(out, cap, "%s", v);
  else if (x && *x) snprintf(out, cap, "%s/vspec", x);
  else if (h && *h) snprintf(out, cap, "%s/.cache/vspec", h);
  else if (cap) out[0] = '\0';
}

static int dc_by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int dc_hash_file(crypto_generichash_state *st, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return VSPEC_EIO;
  unsigned char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) crypto_generichash_update(st, buf, n);
  int bad = ferror(f);
  fclose(f);
  return bad ? VSPEC_EIO : VSPEC_OK;
}

/* The names in `dir` (hidden ones left out), sorted; *out is NULL-terminated. */
static int dc_list_sorted(const char *dir, char ***out, size_t *count) {
  DIR *d = opendir(dir);
  if (!d) return VSPEC_EIO;
  char **names = NULL;
  size_t n = 0, cap = 0;
  int rc = VSPEC_OK;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    if (n + 1 >= cap) {
      cap = cap ? 2 * cap : 16;
      char **nn = realloc(names, cap * sizeof *nn);
      if (!nn) {
        rc = VSPEC_ENOMEM;
        break;
      }
      names = nn;
    }
    if (!(names[n] = strdup(e->d_name))) {
      rc = VSPEC_ENOMEM;
      break;
    }
    n++;
  }
  closedir(d);
  if (names) qsort(names, n, sizeof *names, dc_by_name);
  *out = names;
  *count = n;
  return rc;
}

int vs_cache_key(const char *dir, const char *purpose, const char *salt,
                 char key[VS_CACHE_KEY_LEN + 1]) {
  if (sodium_init() < 0) return VSPEC_EIO;
  char **names = NULL;
  size_t n = 0;
  int rc = dc_list_sorted(dir, &names, &n);
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, VS_CACHE_KEY_LEN / 2);
  crypto_generichash_update(&st, (const unsigned char *)purpose, strlen(purpose) + 1);
  crypto_generichash_update(&st, (const unsigned char *)salt, strlen(salt) + 1);
  for (size_t i = 0; !rc && i < n; i++) {
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if (stat(path, &sb) || !S_ISREG(sb.st_mode)) continue; /* subdirectories: not the model */
    crypto_generichash_update(&st, (const unsigned char *)names[i], strlen(names[i]) + 1);
    rc = dc_hash_file(&st, path);
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  if (rc) return rc;
  unsigned char h[VS_CACHE_KEY_LEN / 2];
  crypto_generichash_final(&st, h, sizeof h);
  for (size_t i = 0; i < sizeof h; i++) snprintf(key + 2 * i, 3, "%02x", h[i]);
  return VSPEC_OK;
}

int vs_cache_read(const char *cache_dir, const char *name, size_t max_len, unsigned char **buf,
                  size_t *len) {
  *buf = NULL;
  *len = 0;
  if (!*cache_dir) return 0;
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", cache_dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  struct stat sb;
  unsigned char *b = NULL;
  size_t got = 0;
  if (!fstat(fileno(f), &sb) && S_ISREG(sb.st_mode) && (size_t)sb.st_size <= max_len &&
      (b = malloc((size_t)sb.st_size + 1)))
    got = fread(b, 1, (size_t)sb.st_size + 1, f); /* one more: a file that grew is refused */
  fclose(f);
  if (!b || got != (size_t)sb.st_size) {
    free(b);
    return 0;
  }
  *buf = b;
  *len = got;
  return 1;
}

static int dc_mkdirs(const char *dir) {
  char p[4200];
  snprintf(p, sizeof p, "%s", dir);
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = '\0';
      if (mkdir(p, 0700) && errno != EEXIST) return VSPEC_EIO;
      *s = '/';
    }
  return mkdir(p, 0700) && errno != EEXIST ? VSPEC_EIO : VSPEC_OK;
}

int vs_cache_write(const char *cache_dir, const char *name, const void *buf, size_t len) {
  if (!*cache_dir || dc_mkdirs(cache_dir)) return VSPEC_EIO;
  char path[4200], tmp[4300];
  snprintf(path, sizeof path, "%s/%s", cache_dir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return VSPEC_EIO;
  int ok = fwrite(buf, 1, len, f) == len;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path)) {
    unlink(tmp);
    return VSPEC_EIO;
  }
  return VSPEC_OK;
}
