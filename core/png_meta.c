#include "core/png_meta.h"

#include <pthread.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/engine.h"
#include "core/manifest.h"
#include "core/version.h"
#include "vspec/types.h"

/* ---- the target's short hash, remembered per model directory ----------------------------- */

#define VS__HASH_MEMO 8
typedef struct vs__hash_memo {
  char dir[1024], weights[2048];
  struct stat manifest_st, weights_st;
  char hash[11];
} vs__hash_memo;
static vs__hash_memo vs__memo[VS__HASH_MEMO];
static int vs__memo_n, vs__memo_next;
static pthread_mutex_t vs__memo_mu = PTHREAD_MUTEX_INITIALIZER;

static int pmeta_same_file(const struct stat *a, const struct stat *b) {
  return a->st_size == b->st_size && a->st_ino == b->st_ino && a->st_dev == b->st_dev &&
         a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* SHA-256 of the file, its first 5 bytes in hex (A1111's "Model hash"). */
static int pmeta_sha256_short(const char *path, char out[11]) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  unsigned char buf[1 << 16], digest[crypto_hash_sha256_BYTES];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) crypto_hash_sha256_update(&st, buf, n);
  int bad = ferror(f);
  fclose(f);
  if (bad) return -1;
  crypto_hash_sha256_final(&st, digest);
  for (int i = 0; i < 5; i++) snprintf(out + 2 * i, 3, "%02x", digest[i]);
  return 0;
}

/* The memo entry of dir when its manifest and weights are unchanged; call with the lock. */
static const vs__hash_memo *pmeta_memo_find(const char *dir, const struct stat *manifest_st) {
  for (int i = 0; i < vs__memo_n; i++) {
    const vs__hash_memo *e = &vs__memo[i];
    struct stat wst;
    if (strcmp(e->dir, dir) == 0 && pmeta_same_file(&e->manifest_st, manifest_st) &&
        stat(e->weights, &wst) == 0 && pmeta_same_file(&e->weights_st, &wst))
      return e;
  }
  return NULL;
}

int vs_model_short_hash(const char *dir, char out[11]) {
  out[0] = '\0';
  char path[1100];
  struct stat mst, wst;
  snprintf(path, sizeof path, "%s/%s", dir, VS_MANIFEST_FILE);
  if (stat(path, &mst) != 0) return -1;
  pthread_mutex_lock(&vs__memo_mu);
  const vs__hash_memo *hit = pmeta_memo_find(dir, &mst);
  if (hit) memcpy(out, hit->hash, sizeof hit->hash);
  pthread_mutex_unlock(&vs__memo_mu);
  if (hit) return 0;

  /* Hashed outside the lock: another thread may hash the same file meanwhile, no harm. */
  char err[VSPEC_ERRLEN];
  vs_sampling base = {0};
  vs_manifest *mf = malloc(sizeof *mf);
  int rc = -1;
  if (mf && vs_manifest_read(dir, &base, VS_ROLE_TARGET, mf, err, sizeof err) == VSPEC_OK &&
      mf->target.present && strcmp(mf->target.weights, "-") != 0 &&
      stat(mf->target.weights, &wst) == 0 && sodium_init() >= 0 &&
      pmeta_sha256_short(mf->target.weights, out) == 0) {
    pthread_mutex_lock(&vs__memo_mu);
    vs__hash_memo *e = &vs__memo[vs__memo_next];
    snprintf(e->dir, sizeof e->dir, "%s", dir);
    snprintf(e->weights, sizeof e->weights, "%s", mf->target.weights);
    e->manifest_st = mst;
    e->weights_st = wst;
    memcpy(e->hash, out, sizeof e->hash);
    vs__memo_next = (vs__memo_next + 1) % VS__HASH_MEMO;
    if (vs__memo_n < VS__HASH_MEMO) vs__memo_n++;
    pthread_mutex_unlock(&vs__memo_mu);
    rc = 0;
  } else {
    out[0] = '\0';
  }
  if (mf) vs_manifest_free(mf); /* read zeroes it first: safe whatever failed */
  free(mf);
  return rc;
}

/* ---- the parameters text ------------------------------------------------------------------ */

/* Appends to buf at *n, never past cap (a cut text stays NUL-terminated). */
static void pm_add(char *buf, size_t cap, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void pm_add(char *buf, size_t cap, size_t *n, const char *fmt, ...) {
  if (*n >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(buf + *n, cap - *n, fmt, ap);
  va_end(ap);
  if (k > 0) *n = *n + (size_t)k < cap ? *n + (size_t)k : cap - 1;
}

/* ", Key: value" with A1111's quoting: a value holding ',', ':' or a newline goes in JSON
 * double quotes (json.dumps), so that a reader's "Key: value, " split keeps it whole. */
static void pmeta_pair(char *buf, size_t cap, size_t *n, const char *key, const char *value) {
  pm_add(buf, cap, n, "%s%s: ", *n && buf[*n - 1] != '\n' ? ", " : "", key);
  if (!strpbrk(value, ",:\n")) {
    pm_add(buf, cap, n, "%s", value);
    return;
  }
  pm_add(buf, cap, n, "\"");
  for (const char *c = value; *c; c++) {
    if (*c == '"' || *c == '\\') pm_add(buf, cap, n, "\\%c", *c);
    else if (*c == '\n') pm_add(buf, cap, n, "\\n");
    else pm_add(buf, cap, n, "%c", *c);
  }
  pm_add(buf, cap, n, "\"");
}

static void pmeta_pairf(char *buf, size_t cap, size_t *n, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void pmeta_pairf(char *buf, size_t cap, size_t *n, const char *key, const char *fmt, ...) {
  char v[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v, sizeof v, fmt, ap);
  va_end(ap);
  pmeta_pair(buf, cap, n, key, v);
}

/* What a job samples: a discrete model's tokens, one per step; a continuous-token model's
 * generation steps (the MAR loop's choice: the job's, else the model's, else one per token). */
static int pmeta_steps(const vs_models *m, const vs_sampling *s) {
  const vspec_model_info *in = &m->target.info;
  int tokens = in->grid_h * in->grid_w;
  if (in->token_kind != VSPEC_TOKENS_CONTINUOUS) return tokens;
  return s->num_iter > 0 ? s->num_iter : in->num_iter > 0 ? in->num_iter : tokens;
}

size_t vs_png_parameters(const vs_job *job, const vs_models *models, char *buf, size_t cap) {
  const vs_sampling *s = &job->sampling;
  const vspec_model_info *in = &models->target.info;
  size_t n = 0;
  if (!cap) return 0;
  buf[0] = '\0';
  if (job->caption) pm_add(buf, cap, &n, "(a caption embedding)\n");
  else if (vs_models_class_name(models, job->class_label))
    pm_add(buf, cap, &n, "class %d (%s)\n", job->class_label,
           vs_models_class_name(models, job->class_label));
  else pm_add(buf, cap, &n, "class %d\n", job->class_label);
  pmeta_pairf(buf, cap, &n, "Steps", "%d", pmeta_steps(models, s));
  pmeta_pair(buf, cap, &n, "Sampler", job->method ? job->method->text : "ar");
  pmeta_pairf(buf, cap, &n, "CFG scale", "%g", s->cfg_scale);
  pmeta_pairf(buf, cap, &n, "Seed", "%llu", (unsigned long long)job->seed);
  pmeta_pairf(buf, cap, &n, "Size", "%dx%d", in->image_w, in->image_h);
  char hash[11];
  if (vs_model_short_hash(models->dir, hash) == 0) pmeta_pair(buf, cap, &n, "Model hash", hash);
  /* A1111 drops these two from model names rather than quoting them */
  char name[sizeof models->name];
  size_t k = 0;
  for (const char *c = models->name; *c && k + 1 < sizeof name; c++)
    if (*c != ',' && *c != ':') name[k++] = *c;
  name[k] = '\0';
  pmeta_pair(buf, cap, &n, "Model", name);
  pmeta_pairf(buf, cap, &n, "Temperature", "%g", s->temperature);
  if (in->token_kind == VSPEC_TOKENS_CONTINUOUS) {
    pmeta_pair(buf, cap, &n, "CFG schedule",
             s->cfg_schedule == VS_CFG_CONSTANT ? "constant" : "linear");
  } else {
    if (s->top_k > 0) pmeta_pairf(buf, cap, &n, "Top k", "%d", s->top_k);
    if (s->top_p < 1.0f) pmeta_pairf(buf, cap, &n, "Top p", "%g", s->top_p);
    if (s->cfg_interval >= 0) pmeta_pairf(buf, cap, &n, "CFG interval", "%d", s->cfg_interval);
  }
  pmeta_pairf(buf, cap, &n, "Version", "vspec %s", VSPEC_VERSION);
  return n;
}

int vs_png_meta_init(vs_png_meta *m, const vs_job *job, const vs_models *models,
                     const char *software) {
  vs_job_describe(job, models->name, m->describe, sizeof m->describe);
  vs_png_parameters(job, models, m->parameters, sizeof m->parameters);
  m->texts[0] = (vs_png_text){"vspec", m->describe};
  m->texts[1] = (vs_png_text){"parameters", m->parameters};
  m->texts[2] = (vs_png_text){"Software", software};
  return VS_PNG_META_TEXTS;
}

int vs_png_encode_job(const uint8_t *rgb, const vs_job *job, const vs_models *models,
                      const char *software, uint8_t **out, size_t *out_len, char *err,
                      size_t errlen) {
  vs_png_meta m;
  int n = vs_png_meta_init(&m, job, models, software);
  const vspec_model_info *in = &models->target.info;
  return vs_png_encode(rgb, in->image_w, in->image_h, m.texts, n, out, out_len, err, errlen);
}
