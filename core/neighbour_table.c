/*
 * core/neighbour_table.c - a model's codebook neighbour table, made on first use and kept in
 * the disk cache (core/models.h, vs_models_neighbours).
 *
 * LANTERN's table lists, per code, the VS_NEIGHBOURS_K nearest codes: vocab^2 distances and
 * a selection per row, 4.5 s for a 16384-code codebook on the development CPU. Only rules
 * that declare VSPEC_PLUGIN_USES_NEIGHBOURS read it, so a model opens without it and a plain
 * AR or exact-SD job never pays for it. The table depends only on the codebook, i.e. on the
 * model's files: the cache key hashes them with the purpose "neighbours/<k>" and no salt.
 *
 * A file is nbr-<key>.bin: "VSNBR1\n\0", vocab and k (4 bytes each, little-endian), then
 * vocab x k int32 codes, little-endian. One that does not read back exactly so (size,
 * magic, shape, a code out of range) is ignored and rebuilt.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/disk_cache.h"
#include "core/log.h"
#include "core/metrics.h" /* vs_now */
#include "core/models.h"
#include "core/neighbours.h"

static const char vs__magic[8] = "VSNBR1\n";

static uint32_t nt_get32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void nt_put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static int32_t *nt_load(const char *dir, const char *name, int vocab, int k) {
  size_t n = (size_t)vocab * k, want = sizeof vs__magic + 8 + n * 4, got = 0;
  unsigned char *buf = NULL;
  if (!vs_cache_read(dir, name, want, &buf, &got)) return NULL;
  int32_t *t = NULL;
  if (got == want && !memcmp(buf, vs__magic, sizeof vs__magic) &&
      nt_get32(buf + 8) == (uint32_t)vocab && nt_get32(buf + 12) == (uint32_t)k &&
      (t = malloc(n * sizeof *t))) {
    for (size_t i = 0; i < n; i++) {
      uint32_t v = nt_get32(buf + 16 + i * 4);
      if (v >= (uint32_t)vocab) {
        free(t);
        t = NULL;
        break;
      }
      t[i] = (int32_t)v;
    }
  }
  free(buf);
  return t;
}

static int nt_store(const char *dir, const char *name, const int32_t *t, int vocab, int k) {
  size_t n = (size_t)vocab * k, len = sizeof vs__magic + 8 + n * 4;
  unsigned char *buf = malloc(len);
  if (!buf) return VSPEC_ENOMEM;
  memcpy(buf, vs__magic, sizeof vs__magic);
  nt_put32(buf + 8, (uint32_t)vocab);
  nt_put32(buf + 12, (uint32_t)k);
  for (size_t i = 0; i < n; i++) nt_put32(buf + 16 + i * 4, (uint32_t)t[i]);
  int rc = vs_cache_write(dir, name, buf, len);
  free(buf);
  return rc;
}

/* Reads or builds the table into m (its lock held). */
static int nt_make(vs_models *m, char *err, size_t errlen) {
  const vspec_model_info *in = &m->target.info;
  int vocab = in->vocab, k = VS_NEIGHBOURS_K < vocab - 1 ? VS_NEIGHBOURS_K : vocab - 1;
  char dir[2048], purpose[64], key[VS_CACHE_KEY_LEN + 1], name[128] = "";
  vs_cache_dir(dir, sizeof dir);
  snprintf(purpose, sizeof purpose, "neighbours/%d", k);
  if (*dir && !vs_cache_key(m->dir, purpose, "", key)) {
    snprintf(name, sizeof name, "nbr-%s.bin", key);
    double t0 = vs_now();
    if ((m->neighbours = nt_load(dir, name, vocab, k))) {
      m->neighbours_k = k;
      vs_log(VSPEC_LOG_INFO, "models", "%s: codebook neighbour table read from the cache in "
             "%.2f s", m->name, vs_now() - t0);
      return VSPEC_OK;
    }
  }
  double t0 = vs_now();
  m->neighbours = vs_neighbours_build(in->codebook, vocab, in->token_dim, k, &m->neighbours_k);
  if (!m->neighbours) {
    snprintf(err, errlen, "out of memory for the codebook neighbour table of model '%s'",
             m->name);
    return VSPEC_ENOMEM;
  }
  m->neighbours_builds++;
  int stored = *name && !nt_store(dir, name, m->neighbours, vocab, m->neighbours_k);
  vs_log(VSPEC_LOG_INFO, "models", "%s: codebook neighbour table built in %.2f s (%d codes, "
         "k %d)%s", m->name, vs_now() - t0, vocab, m->neighbours_k, stored ? ", cached" : "");
  return VSPEC_OK;
}

int vs_models_neighbours(vs_models *m, const int32_t **table, int *k, char *err,
                         size_t errlen) {
  *table = NULL;
  *k = 0;
  const vspec_model_info *in = &m->target.info;
  if (!m->target.model || !in->codebook || in->token_dim <= 0 || in->vocab < 2)
    return VSPEC_OK;
  /* The first asker builds; the others wait for it and share its table. */
  pthread_mutex_lock(&m->neighbours_mu);
  int rc = m->neighbours ? VSPEC_OK : nt_make(m, err, errlen);
  *table = m->neighbours;
  *k = m->neighbours_k;
  pthread_mutex_unlock(&m->neighbours_mu);
  return rc;
}
