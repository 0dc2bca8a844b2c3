/*
 * Random-weight LlamaGen GPT checkpoints for cost measurements (the shape is what
 * matters for speed, not the values).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

typedef struct vs__tensor_spec {
  char name[96];
  int64_t rows, cols; /* cols == 0: 1-D */
  int ones;           /* norm weights start at 1 */
} vs__tensor_spec;

static uint64_t rm_splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int vs_bench_write_random_gpt(const char *path, int n_layer, int dim, int n_head, int n_kv_head,
                              int vocab, int grid, int num_classes, uint64_t seed, char *err,
                              size_t errlen) {
  int qkv_rows = dim + 2 * n_kv_head * (dim / n_head);
  int ffn = (2 * 4 * dim) / 3;
  ffn = (ffn + 255) / 256 * 256; /* LlamaGen's find_multiple(int(2*4d/3), 256) */
  int n = 4 + 7 * n_layer;
  vs__tensor_spec *t = calloc((size_t)n, sizeof *t);
  if (!t) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  int k = 0;
  t[k++] = (vs__tensor_spec){"tok_embeddings.weight", vocab, dim, 0};
  t[k++] = (vs__tensor_spec){"cls_embedding.embedding_table.weight", num_classes + 1, dim, 0};
  for (int l = 0; l < n_layer; l++) {
    struct { const char *n; int64_t r, c; int ones; } L[] = {
        {"attention_norm.weight", dim, 0, 1}, {"attention.wqkv.weight", qkv_rows, dim, 0},
        {"attention.wo.weight", dim, dim, 0},  {"ffn_norm.weight", dim, 0, 1},
        {"feed_forward.w1.weight", ffn, dim, 0}, {"feed_forward.w3.weight", ffn, dim, 0},
        {"feed_forward.w2.weight", dim, ffn, 0}};
    for (int j = 0; j < 7; j++) {
      snprintf(t[k].name, sizeof t[k].name, "layers.%d.%s", l, L[j].n);
      t[k].rows = L[j].r;
      t[k].cols = L[j].c;
      t[k].ones = L[j].ones;
      k++;
    }
  }
  t[k++] = (vs__tensor_spec){"norm.weight", dim, 0, 1};
  t[k++] = (vs__tensor_spec){"output.weight", vocab, dim, 0};

  json_t *hdr = json_object(), *meta = json_object();
  char buf[64];
#define VS_META(key, fmt, val) (snprintf(buf, sizeof buf, fmt, val), json_object_set_new(meta, key, json_string(buf)))
  VS_META("vspec.kind", "%s", "llamagen-gpt");
  VS_META("model_type", "%s", "c2i");
  VS_META("n_head", "%d", n_head);
  if (n_kv_head != n_head) VS_META("n_kv_head", "%d", n_kv_head);
  VS_META("block_size", "%d", grid * grid);
  VS_META("cls_token_num", "%d", 1);
  VS_META("num_classes", "%d", num_classes);
#undef VS_META
  json_object_set_new(hdr, "__metadata__", meta);
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    int64_t numel = t[i].rows * (t[i].cols ? t[i].cols : 1);
    json_t *e = json_object(), *shape = json_array(), *offs = json_array();
    json_array_append_new(shape, json_integer(t[i].rows));
    if (t[i].cols) json_array_append_new(shape, json_integer(t[i].cols));
    json_array_append_new(offs, json_integer((json_int_t)off));
    off += (uint64_t)numel * 4;
    json_array_append_new(offs, json_integer((json_int_t)off));
    json_object_set_new(e, "dtype", json_string("F32"));
    json_object_set_new(e, "shape", shape);
    json_object_set_new(e, "data_offsets", offs);
    json_object_set_new(hdr, t[i].name, e);
  }
  char *text = json_dumps(hdr, JSON_COMPACT);
  json_decref(hdr);
  int rc = VSPEC_OK;
  FILE *f = fopen(path, "wb");
  if (!text || !f) {
    snprintf(err, errlen, "%s: cannot write", path);
    rc = VSPEC_EIO;
    goto done;
  }
  size_t len = strlen(text), padded = (len + 7) / 8 * 8;
  uint64_t hl = padded;
  uint8_t le[8];
  for (int i = 0; i < 8; i++) le[i] = (uint8_t)(hl >> (8 * i));
  fwrite(le, 1, 8, f);
  fwrite(text, 1, len, f);
  for (size_t i = len; i < padded; i++) fputc(' ', f);
  enum { CHUNK = 1 << 16 };
  float *chunk = malloc(CHUNK * sizeof(float));
  uint64_t st = seed;
  /* Uniform with std 0.02, like LlamaGen's init (but nonzero output weights). */
  const float a = 0.02f * 1.7320508f;
  for (int i = 0; chunk && i < n; i++) {
    int64_t numel = t[i].rows * (t[i].cols ? t[i].cols : 1);
    for (int64_t done = 0; done < numel; done += CHUNK) {
      int64_t m = numel - done < CHUNK ? numel - done : CHUNK;
      for (int64_t j = 0; j < m; j++)
        chunk[j] = t[i].ones ? 1.0f
                             : a * (2.0f * (float)(rm_splitmix(&st) >> 40) / 16777216.0f - 1.0f);
      fwrite(chunk, sizeof(float), (size_t)m, f);
    }
  }
  if (!chunk || ferror(f)) {
    snprintf(err, errlen, "%s: write failed", path);
    rc = VSPEC_EIO;
  }
  free(chunk);
done:
  if (f && fclose(f) != 0 && !rc) {
    snprintf(err, errlen, "%s: write failed", path);
    rc = VSPEC_EIO;
  }
  free(text);
  free(t);
  return rc;
}
