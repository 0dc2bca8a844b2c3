#include "daemon/preview_cache.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vspec/types.h"

static const char pc_magic[8] = "VSLUT1\n";

int vs_preview_cache_key(const char *dir, const char *device, char key[VS_LUT_KEY_LEN + 1]) {
  return vs_cache_key(dir, pc_magic, device, key);
}

static void pc_name(char *out, size_t cap, const char *key) {
  snprintf(out, cap, "lut-%s.bin", key);
}

static uint32_t pc_get32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int vs_preview_cache_load(const char *cache_dir, const char *key, int vocab, vs_preview_lut *out) {
  memset(out, 0, sizeof *out);
  if (vocab <= 0) return 0;
  char name[128];
  pc_name(name, sizeof name, key);
  size_t want = sizeof pc_magic + 8 + (size_t)vocab * 3, got = 0;
  unsigned char *buf = NULL;
  if (!vs_cache_read(cache_dir, name, want, &buf, &got)) return 0;
  int ok = got == want && !memcmp(buf, pc_magic, sizeof pc_magic) &&
           pc_get32(buf + 8) == (uint32_t)vocab && pc_get32(buf + 12) < (uint32_t)vocab;
  if (ok && (out->rgb = malloc((size_t)vocab * 3))) {
    memcpy(out->rgb, buf + 16, (size_t)vocab * 3);
    out->vocab = vocab;
    out->neutral = (int)pc_get32(buf + 12);
  }
  free(buf);
  return out->rgb != NULL;
}

int vs_preview_cache_store(const char *cache_dir, const char *key, const vs_preview_lut *lut) {
  if (!lut->rgb || lut->vocab <= 0) return VSPEC_EINVAL;
  size_t len = sizeof pc_magic + 8 + (size_t)lut->vocab * 3;
  unsigned char *buf = malloc(len);
  if (!buf) return VSPEC_ENOMEM;
  memcpy(buf, pc_magic, sizeof pc_magic);
  for (int i = 0; i < 4; i++) {
    buf[8 + i] = (unsigned char)((uint32_t)lut->vocab >> (8 * i));
    buf[12 + i] = (unsigned char)((uint32_t)lut->neutral >> (8 * i));
  }
  memcpy(buf + 16, lut->rgb, (size_t)lut->vocab * 3);
  char name[128];
  pc_name(name, sizeof name, key);
  int rc = vs_cache_write(cache_dir, name, buf, len);
  free(buf);
  return rc;
}
