#include "tests/support/table_model.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/common/vs_philox.h"
#include "kernels/vs_kernels.h"

static double vs__normal(vspec_rng *r) { return vs_rng_normal(r); }

void vs_table_model_make(vs_table_model *m, int vocab, int len, uint64_t seed, double scale,
                         double draft_noise) {
  memset(m, 0, sizeof *m);
  m->vocab = vocab;
  m->len = len;
  m->rows = 2;
  int64_t n = 0, pw = 1;
  for (int l = 0; l < len; l++) {
    n += pw;
    pw *= vocab;
  }
  m->n_prefixes = n;
  size_t cells = (size_t)n * m->rows * vocab;
  m->target = malloc(cells * sizeof(float));
  m->draft = malloc(cells * sizeof(float));
  m->codebook = malloc((size_t)vocab * 2 * sizeof(float));
  vspec_rng r;
  vs_rng_init(&r, seed, 77);
  for (size_t i = 0; i < cells; i++) {
    m->target[i] = (float)(scale * vs__normal(&r));
    m->draft[i] = m->target[i] + (float)(draft_noise * vs__normal(&r));
  }
  for (int i = 0; i < vocab * 2; i++) m->codebook[i] = (float)vs__normal(&r);
}

void vs_table_model_free(vs_table_model *m) {
  free(m->target);
  free(m->draft);
  free(m->codebook);
  memset(m, 0, sizeof *m);
}

int64_t vs_table_prefix_index(const vs_table_model *m, const int32_t *tokens, int n) {
  int64_t idx = 0, off = 0, pw = 1;
  for (int l = 0; l < n; l++) {
    off += pw;
    pw *= m->vocab;
  }
  for (int i = 0; i < n; i++) idx = idx * m->vocab + tokens[i];
  return off + idx;
}

/* Minimal safetensors writer: F32 tensors and string metadata. */
static void vs__write_st(const char *path, const char *meta_json, const char *const *names,
                         const float *const *data, const int64_t (*shapes)[3], const int *ndims,
                         int n) {
  char header[4096];
  size_t used = (size_t)snprintf(header, sizeof header, "{\"__metadata__\":%s", meta_json);
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    int64_t numel = 1;
    char shape[128] = "";
    size_t su = 0;
    for (int d = 0; d < ndims[i]; d++) {
      numel *= shapes[i][d];
      su += (size_t)snprintf(shape + su, sizeof shape - su, "%s%lld", d ? "," : "",
                             (long long)shapes[i][d]);
    }
    used += (size_t)snprintf(header + used, sizeof header - used,
                             ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
                             names[i], shape, (unsigned long long)off,
                             (unsigned long long)(off + (uint64_t)numel * 4));
    off += (uint64_t)numel * 4;
  }
  used += (size_t)snprintf(header + used, sizeof header - used, "}");
  while (used % 8) header[used++] = ' ';
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  uint64_t hl = used;
  unsigned char le[8];
  for (int i = 0; i < 8; i++) le[i] = (unsigned char)(hl >> (8 * i));
  fwrite(le, 1, 8, f);
  fwrite(header, 1, used, f);
  for (int i = 0; i < n; i++) {
    int64_t numel = 1;
    for (int d = 0; d < ndims[i]; d++) numel *= shapes[i][d];
    fwrite(data[i], sizeof(float), (size_t)numel, f);
  }
  fclose(f);
}

void vs_table_model_write(const vs_table_model *m, const char *dir, const vs_sampling *s) {
  char meta[256], path[512];
  snprintf(meta, sizeof meta, "{\"vocab\":\"%d\",\"length\":\"%d\",\"rows\":\"%d\"}", m->vocab,
           m->len, m->rows);
  const char *names[] = {"logits", "codebook"};
  int64_t shapes[2][3] = {{m->n_prefixes, m->rows, m->vocab}, {m->vocab, 2, 0}};
  int ndims[] = {3, 2};
  const float *td[] = {m->target, m->codebook}, *dd[] = {m->draft, m->codebook};
  snprintf(path, sizeof path, "%s/target.safetensors", dir);
  vs__write_st(path, meta, names, td, shapes, ndims, 2);
  snprintf(path, sizeof path, "%s/draft.safetensors", dir);
  vs__write_st(path, meta, names, dd, shapes, ndims, 2);
  snprintf(path, sizeof path, "%s/vspec-model.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) abort();
  fprintf(f,
          "{\"name\": \"table\", \"target\": {\"backend\": \"table\", \"gpt\": "
          "\"target.safetensors\"}, \"draft\": {\"backend\": \"table\", \"gpt\": "
          "\"draft.safetensors\"}, \"eagle\": {\"backend\": \"table\", \"gpt\": "
          "\"draft.safetensors\", \"mode\": \"head\"}, \"defaults\": {\"temperature\": %g, \"top_k\": %d, "
          "\"top_p\": %g, \"cfg_scale\": %g, \"cfg_interval\": %d}}\n",
          s->temperature, s->top_k, s->top_p, s->cfg_scale, s->cfg_interval);
  fclose(f);
}

/* Written independently of the engine: CFG on the two rows, temperature, softmax, in
 * double precision (top-k / top-p are not used by these tests). */
void vs_table_dist(const vs_table_model *m, const float *table, const int32_t *prefix, int n,
                   const vs_sampling *s, double *out) {
  int64_t idx = vs_table_prefix_index(m, prefix, n);
  const float *c = table + (size_t)idx * m->rows * m->vocab, *u = c + m->vocab;
  int guided = s->cfg_scale > 1.0f && (n == 0 || !(s->cfg_interval > -1 && n - 1 > s->cfg_interval));
  double mx = -INFINITY;
  for (int v = 0; v < m->vocab; v++) {
    double l = guided ? u[v] + s->cfg_scale * ((double)c[v] - u[v]) : c[v];
    out[v] = l / (s->temperature > 1e-5 ? s->temperature : 1e-5);
    if (out[v] > mx) mx = out[v];
  }
  double z = 0.0;
  for (int v = 0; v < m->vocab; v++) z += (out[v] = exp(out[v] - mx));
  for (int v = 0; v < m->vocab; v++) out[v] /= z;
}

void vs_table_joint(const vs_table_model *m, const vs_sampling *s, double *joint) {
  int64_t total = 1;
  for (int l = 0; l < m->len; l++) total *= m->vocab;
  double *q = malloc((size_t)m->vocab * sizeof(double));
  int32_t seq[16];
  for (int64_t code = 0; code < total; code++) {
    int64_t c = code;
    for (int l = m->len - 1; l >= 0; l--) {
      seq[l] = (int32_t)(c % m->vocab);
      c /= m->vocab;
    }
    double p = 1.0;
    for (int l = 0; l < m->len; l++) {
      vs_table_dist(m, m->target, seq, l, s, q);
      p *= q[seq[l]];
    }
    joint[code] = p;
  }
  free(q);
}

static void vs__link_all(const char *from, const char *to, const char *suffix) {
  DIR *d = opendir(from);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name), k = strlen(suffix);
    if (n < k || strcmp(e->d_name + n - k, suffix) != 0) continue;
    char src[1024], dst[1024], abs_src[1024];
    snprintf(src, sizeof src, "%s/%s", from, e->d_name);
    if (!realpath(src, abs_src)) continue;
    snprintf(dst, sizeof dst, "%s/%s", to, e->d_name);
    if (symlink(abs_src, dst) != 0) abort();
  }
  closedir(d);
}

void vs_table_plugin_dir(char *dir) {
  const char *b = getenv("VSPEC_BUILD");
  char from[512];
  snprintf(dir, 256, "/tmp/vspec-sd-plugins-XXXXXX");
  if (!mkdtemp(dir)) abort();
  snprintf(from, sizeof from, "%s/plugins", b ? b : "build");
  vs__link_all(from, dir, ".so");
  snprintf(from, sizeof from, "%s/tests/plugins", b ? b : "build");
  vs__link_all(from, dir, "backend_table.so");
  vs__link_all(from, dir, "drafter_jacobi_wrong.so");
}

void vs_table_world_open(vs_table_world *w, int vocab, int len, uint64_t seed, double scale,
                         double draft_noise, const vs_sampling *s) {
  memset(w, 0, sizeof *w);
  char err[VSPEC_ERRLEN];
  vs_table_plugin_dir(w->plugins);
  snprintf(w->model_dir, sizeof w->model_dir, "/tmp/vspec-sd-model-XXXXXX");
  if (!mkdtemp(w->model_dir)) abort();
  /* The neighbour tables LANTERN jobs build go to the model's own directory (removed with
   * it), not to the user's cache, unless the test chose a cache itself. */
  static int cache_ours;
  if (!getenv("VSPEC_CACHE_DIR") || cache_ours) {
    char cache[300];
    snprintf(cache, sizeof cache, "%s/cache", w->model_dir);
    setenv("VSPEC_CACHE_DIR", cache, 1);
    cache_ours = 1;
  }
  w->s = *s;
  vs_table_model_make(&w->tm, vocab, len, seed, scale, draft_noise);
  vs_table_model_write(&w->tm, w->model_dir, &w->s);
  vs_host_init(&w->host, vs_cpu_ops());
  if (vs_dev_create(vs_cpu_ops(), 1, &w->dev, err, sizeof err) ||
      vs_registry_open(w->plugins, &w->host, &w->reg, err, sizeof err) ||
      vs_models_open(w->reg, &w->host, w->dev, w->model_dir, VS_ROLE_ALL, &w->models, err,
                     sizeof err)) {
    fprintf(stderr, "table world: %s\n", err);
    abort();
  }
  w->cells = 1;
  for (int l = 0; l < len; l++) w->cells *= vocab;
}

void vs_table_world_close(vs_table_world *w) {
  vs_models_close(w->models);
  vs_registry_close(w->reg);
  vs_dev_destroy(w->dev);
  vs_table_model_free(&w->tm);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", w->plugins, w->model_dir);
  if (system(cmd) != 0) fprintf(stderr, "table world: could not remove %s\n", w->model_dir);
}
