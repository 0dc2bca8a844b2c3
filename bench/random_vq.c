/*
 * bench/random_vq.c - random-weight LlamaGen VQ decoders (vq_model.py Decoder) for start-up
 * and cost measurements: the shape is what matters, not the values.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

enum { VS__MAX_T = 256 };

typedef struct vs__vq_t {
  char name[96];
  int64_t shape[4];
  int ndim;
  int kind; /* 0 weights (uniform, std 1/sqrt(fan in)), 1 ones, 2 zeros */
} vs__vq_t;

typedef struct vs__vq_list {
  vs__vq_t t[VS__MAX_T];
  int n;
} vs__vq_list;

static void rvq_add(vs__vq_list *l, const char *name, int kind, int ndim, int64_t a, int64_t b,
                    int64_t c, int64_t d) {
  if (l->n == VS__MAX_T) return;
  vs__vq_t *t = &l->t[l->n++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  t->kind = kind;
  int64_t s[4] = {a, b, c, d};
  memcpy(t->shape, s, sizeof s);
}

static void rv_conv(vs__vq_list *l, const char *prefix, int cout, int cin, int k) {
  char key[96];
  snprintf(key, sizeof key, "%s.weight", prefix);
  rvq_add(l, key, 0, 4, cout, cin, k, k);
  snprintf(key, sizeof key, "%s.bias", prefix);
  rvq_add(l, key, 2, 1, cout, 0, 0, 0);
}

static void rv_norm(vs__vq_list *l, const char *prefix, int c) {
  char key[96];
  snprintf(key, sizeof key, "%s.weight", prefix);
  rvq_add(l, key, 1, 1, c, 0, 0, 0);
  snprintf(key, sizeof key, "%s.bias", prefix);
  rvq_add(l, key, 2, 1, c, 0, 0, 0);
}

static void rv_res(vs__vq_list *l, const char *prefix, int cin, int cout) {
  char key[96];
  snprintf(key, sizeof key, "%s.norm1", prefix);
  rv_norm(l, key, cin);
  snprintf(key, sizeof key, "%s.conv1", prefix);
  rv_conv(l, key, cout, cin, 3);
  snprintf(key, sizeof key, "%s.norm2", prefix);
  rv_norm(l, key, cout);
  snprintf(key, sizeof key, "%s.conv2", prefix);
  rv_conv(l, key, cout, cout, 3);
  if (cin != cout) {
    snprintf(key, sizeof key, "%s.nin_shortcut", prefix);
    rv_conv(l, key, cout, cin, 1);
  }
}

static void rv_attn(vs__vq_list *l, const char *prefix, int c) {
  char key[96];
  snprintf(key, sizeof key, "%s.norm", prefix);
  rv_norm(l, key, c);
  const char *n[] = {"q", "k", "v", "proj_out"};
  for (int i = 0; i < 4; i++) {
    snprintf(key, sizeof key, "%s.%s", prefix, n[i]);
    rv_conv(l, key, c, c, 1);
  }
}

/* The decoder's tensors, in vq_model.py's order (2 res blocks + 1 per stage, attention in
 * the first, lowest-resolution stage, an upsample after every stage but the last). */
static void rv_decoder(vs__vq_list *l, int codebook, int dim, int ch, const int *mult, int nm,
                        int z) {
  char key[96];
  rvq_add(l, "quantize.embedding.weight", 0, 2, codebook, dim, 0, 0);
  rv_conv(l, "post_quant_conv", z, dim, 1);
  int c = ch * mult[nm - 1];
  rv_conv(l, "decoder.conv_in", c, z, 3);
  rv_res(l, "decoder.mid.0", c, c);
  rv_attn(l, "decoder.mid.1", c);
  rv_res(l, "decoder.mid.2", c, c);
  for (int s = 0; s < nm; s++) {
    int out = ch * mult[nm - 1 - s];
    for (int r = 0; r < 3; r++) {
      snprintf(key, sizeof key, "decoder.conv_blocks.%d.res.%d", s, r);
      rv_res(l, key, c, out);
      c = out;
      if (s == 0) {
        snprintf(key, sizeof key, "decoder.conv_blocks.%d.attn.%d", s, r);
        rv_attn(l, key, c);
      }
    }
    if (s != nm - 1) {
      snprintf(key, sizeof key, "decoder.conv_blocks.%d.upsample.conv", s);
      rv_conv(l, key, c, c, 3);
    }
  }
  rv_norm(l, "decoder.norm_out", c);
  rv_conv(l, "decoder.conv_out", 3, c, 3);
}

static uint64_t rv_mix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static int64_t rv_numel(const vs__vq_t *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

static char *rvq_header(const vs__vq_list *l, int image_size) {
  json_t *hdr = json_object(), *meta = json_object();
  char buf[32];
  snprintf(buf, sizeof buf, "%d", image_size);
  json_object_set_new(meta, "vspec.kind", json_string("llamagen-vq"));
  json_object_set_new(meta, "image_size", json_string(buf));
  json_object_set_new(meta, "codebook_l2_norm", json_string("true"));
  json_object_set_new(hdr, "__metadata__", meta);
  uint64_t off = 0;
  for (int i = 0; i < l->n; i++) {
    json_t *e = json_object(), *shape = json_array(), *offs = json_array();
    for (int d = 0; d < l->t[i].ndim; d++)
      json_array_append_new(shape, json_integer(l->t[i].shape[d]));
    json_array_append_new(offs, json_integer((json_int_t)off));
    off += (uint64_t)rv_numel(&l->t[i]) * 4;
    json_array_append_new(offs, json_integer((json_int_t)off));
    json_object_set_new(e, "dtype", json_string("F32"));
    json_object_set_new(e, "shape", shape);
    json_object_set_new(e, "data_offsets", offs);
    json_object_set_new(hdr, l->t[i].name, e);
  }
  char *text = json_dumps(hdr, JSON_COMPACT);
  json_decref(hdr);
  return text;
}

int vs_bench_write_random_vq(const char *path, int codebook, int embed_dim, int ch,
                             const int *ch_mult, int n_mult, int z_channels, int image_size,
                             uint64_t seed, char *err, size_t errlen) {
  vs__vq_list *l = calloc(1, sizeof *l);
  if (!l) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  rv_decoder(l, codebook, embed_dim, ch, ch_mult, n_mult, z_channels);
  char *text = l->n < VS__MAX_T ? rvq_header(l, image_size) : NULL;
  FILE *f = text ? fopen(path, "wb") : NULL;
  float *chunk = malloc(sizeof(float) << 16);
  int rc = VSPEC_OK;
  if (f && chunk) {
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    fwrite(le, 1, 8, f);
    fwrite(text, 1, len, f);
    for (size_t i = len; i < padded; i++) fputc(' ', f);
    uint64_t st = seed;
    for (int i = 0; i < l->n; i++) {
      const vs__vq_t *t = &l->t[i];
      int64_t n = rv_numel(t), fan = n / t->shape[0];
      /* uniform with std 1/sqrt(fan in): activations keep their scale through the layers */
      float a = t->ndim == 2 ? 1.7320508f : 1.7320508f / sqrtf((float)fan);
      for (int64_t done = 0; done < n; done += 1 << 16) {
        int64_t m = n - done < (1 << 16) ? n - done : (1 << 16);
        for (int64_t j = 0; j < m; j++)
          chunk[j] = t->kind == 1   ? 1.0f
                     : t->kind == 2 ? 0.0f
                                    : a * (2.0f * (float)(rv_mix(&st) >> 40) / 16777216.0f - 1.0f);
        fwrite(chunk, sizeof(float), (size_t)m, f);
      }
    }
  }
  if (!f || !chunk || ferror(f) || fclose(f)) {
    snprintf(err, errlen, "%s: cannot write the random VQ", path);
    rc = VSPEC_EIO;
  }
  free(chunk);
  free(text);
  free(l);
  return rc;
}
