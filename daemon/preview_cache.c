#include "daemon/preview_cache.h"

#include <dirent.h>
#include <errno.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vspec/types.h"

static const char vs__magic[8] = "VSLUT1\n";

static int vs__by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int vs__hash_file(crypto_generichash_state *st, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return VSPEC_EIO;
  unsigned char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) crypto_generichash_update(st, buf, n);
  int bad = ferror(f);
  fclose(f);
  return bad ? VSPEC_EIO : VSPEC_OK;
}

int vs_preview_cache_key(const char *dir, const char *device, char key[VS_LUT_KEY_LEN + 1]) {
  if (sodium_init() < 0) return VSPEC_EIO;
  DIR *d = opendir(dir);
  if (!d) return VSPEC_EIO;
  char **names = NULL;
  size_t n = 0, cap = 0;
  int rc = VSPEC_OK;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    if (n == cap) {
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
  crypto_generichash_state st;
  crypto_generichash_init(&st, NULL, 0, VS_LUT_KEY_LEN / 2);
  crypto_generichash_update(&st, (const unsigned char *)vs__magic, sizeof vs__magic);
  crypto_generichash_update(&st, (const unsigned char *)device, strlen(device) + 1);
  if (!rc) qsort(names, n, sizeof *names, vs__by_name);
  for (size_t i = 0; !rc && i < n; i++) {
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if (stat(path, &sb) || !S_ISREG(sb.st_mode)) continue; /* subdirectories: not the model */
    crypto_generichash_update(&st, (const unsigned char *)names[i], strlen(names[i]) + 1);
    rc = vs__hash_file(&st, path);
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  if (rc) return rc;
  unsigned char h[VS_LUT_KEY_LEN / 2];
  crypto_generichash_final(&st, h, sizeof h);
  for (size_t i = 0; i < sizeof h; i++) snprintf(key + 2 * i, 3, "%02x", h[i]);
  return VSPEC_OK;
}

void vs_preview_cache_dir(char *out, size_t cap) {
  const char *v = getenv("VSPEC_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
  if (v && *v) snprintf(out, cap, "%s", v);
  else if (x && *x) snprintf(out, cap, "%s/vspec", x);
  else if (h && *h) snprintf(out, cap, "%s/.cache/vspec", h);
  else if (cap) out[0] = '\0';
}

static void vs__path(char *out, size_t cap, const char *dir, const char *key) {
  snprintf(out, cap, "%s/lut-%s.bin", dir, key);
}

static uint32_t vs__get32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int vs_preview_cache_load(const char *cache_dir, const char *key, int vocab, vs_preview_lut *out) {
  memset(out, 0, sizeof *out);
  if (!*cache_dir || vocab <= 0) return 0;
  char path[4200];
  vs__path(path, sizeof path, cache_dir, key);
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  size_t want = sizeof vs__magic + 8 + (size_t)vocab * 3;
  unsigned char *buf = malloc(want + 1);
  size_t got = buf ? fread(buf, 1, want + 1, f) : 0; /* one more: a longer file is wrong too */
  fclose(f);
  int ok = buf && got == want && !memcmp(buf, vs__magic, sizeof vs__magic) &&
           vs__get32(buf + 8) == (uint32_t)vocab && vs__get32(buf + 12) < (uint32_t)vocab;
  if (ok && (out->rgb = malloc((size_t)vocab * 3))) {
    memcpy(out->rgb, buf + 16, (size_t)vocab * 3);
    out->vocab = vocab;
    out->neutral = (int)vs__get32(buf + 12);
  }
  free(buf);
  return out->rgb != NULL;
}

static int vs__mkdirs(const char *dir) {
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

int vs_preview_cache_store(const char *cache_dir, const char *key, const vs_preview_lut *lut) {
  if (!*cache_dir || !lut->rgb || vs__mkdirs(cache_dir)) return VSPEC_EIO;
  char path[4200], tmp[4300];
  vs__path(path, sizeof path, cache_dir, key);
  snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return VSPEC_EIO;
  unsigned char head[8];
  for (int i = 0; i < 4; i++) {
    head[i] = (unsigned char)((uint32_t)lut->vocab >> (8 * i));
    head[4 + i] = (unsigned char)((uint32_t)lut->neutral >> (8 * i));
  }
  int ok = fwrite(vs__magic, 1, sizeof vs__magic, f) == sizeof vs__magic &&
           fwrite(head, 1, sizeof head, f) == sizeof head &&
           fwrite(lut->rgb, 3, (size_t)lut->vocab, f) == (size_t)lut->vocab;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path)) {
    unlink(tmp);
    return VSPEC_EIO;
  }
  return VSPEC_OK;
}
