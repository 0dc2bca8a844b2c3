#include "daemon/model_set.h"

#include "core/forward_timing.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/forward_gate.h"
#include "core/metrics.h" /* vs_now */
#include "core/log.h"
#include "core/text.h"
#include "daemon/preview_cache.h"
#include "daemon/preview_fit.h"
#include "daemon/sd_notify.h"
#include "kernels/vs_kernels.h"

struct vs_model_table {
  pthread_mutex_t mu;
  vs_registry *reg;
  const vspec_host *host;
  vspec_dev *load_dev;
  pthread_mutex_t load_mu; /* one load at a time: the load device is single-threaded */
  int lut_exact;           /* [defaults] preview_table = exact */
  int batch, batch_wait_ms, batch_lanes; /* [workers]: cross-job batching (gates in sets) */
  char batch_dev_spec[32];   /* the device of the sets' batches ([device]) ... */
  vs_device_options batch_dev_opt; /* ... with every core, or [workers] threads */
  int n;
  struct {
    char name[64];
    char dir[VS_CONF_PATH];
    char error[256];
    vs_model_set *cur;
    unsigned last_generation;
    int retired_alive;
  } e[VS_CONF_MAX_MODELS];
  int closing;
  int sets_alive; /* the table is freed with its last set */
};

static void ms_table_free(vs_model_table *t) {
  pthread_mutex_destroy(&t->mu);
  pthread_mutex_destroy(&t->load_mu);
  free(t);
}

/* What lut/decode previews of the set need. A continuous-token model has no codes, so no
 * colour table: its previews decode the partial latent grid, which only needs the latent
 * decoder. A model without previews still serves jobs; only such previews are refused. */
static void ms_set_previews(vs_model_set *s, vspec_dev *dev) {
  const vs_backend_model *t = &s->models->target;
  s->continuous = t->info.token_kind == VSPEC_TOKENS_CONTINUOUS;
  if (!t->info.image_h || !t->info.image_w) return;
  if (s->continuous) {
    s->previews = VSPEC_HAS_FIELD(t->vt, vspec_backend_vtable, decode_latents) &&
                  t->vt->decode_latents != NULL;
    if (!s->previews)
      vs_log(VSPEC_LOG_WARN, "models", "%s: no lut/decode previews: its backend cannot decode "
             "latents", s->name);
    return;
  }
  /* The colour table: from the cache when this model's files were decoded on this kind of
   * device by the same method before (daemon/preview_cache.h), else built and stored. A
   * fitted table is keyed apart from an exact one, so a change of preview_table rebuilds. */
  char inner[VSPEC_ERRLEN], key[VS_LUT_KEY_LEN + 1] = "", dir[2048], device[240];
  vs_device_info di;
  memset(&di, 0, sizeof di);
  vs_dev_info(dev, &di);
  int exact = s->table->lut_exact;
  snprintf(device, sizeof device, "%s, precision %d%s", di.name, di.precision,
           exact ? "" : ", fitted table 1");
  vs_cache_dir(dir, sizeof dir);
  double t0 = vs_now();
  int keyed = *dir && !vs_preview_cache_key(s->dir, device, key);
  if (keyed)
    vs_log(VSPEC_LOG_INFO, "models", "%s: model files hashed for the cache key in %.2f s",
           s->name, vs_now() - t0);
  t0 = vs_now();
  vs_preview_fit_opts fo;
  vs_preview_fit_default(&t->info, &fo);
  if (keyed && vs_preview_cache_load(dir, key, t->info.vocab, &s->lut)) {
    vs_log(VSPEC_LOG_INFO, "models", "%s: preview colour table read from the cache in %.2f s "
           "(%s/lut-%.12s...)", s->name, vs_now() - t0, dir, key);
    s->previews = 1;
    return;
  }
  vs_sd_notifyf("loading %s: building its preview colour table", s->name);
  int rc = exact ? vs_preview_lut_build(t, dev, &s->lut, inner, sizeof inner)
                 : vs_preview_lut_fit(t, dev, &fo, &s->lut, inner, sizeof inner);
  if (rc == VSPEC_ENOTSUP && !exact && t->info.image_h && !s->continuous) {
    vs_log(VSPEC_LOG_WARN, "models", "%s: %s; decoding every code instead", s->name, inner);
    rc = vs_preview_lut_build(t, dev, &s->lut, inner, sizeof inner);
    exact = 1;
  }
  if (rc) {
    vs_log(VSPEC_LOG_WARN, "models", "%s: no lut/decode previews: %s", s->name, inner);
    return;
  }
  int stored = keyed && !vs_preview_cache_store(dir, key, &s->lut);
  if (exact)
    vs_log(VSPEC_LOG_INFO, "models", "%s: preview colour table built in %.2f s (%d decodes)%s",
           s->name, vs_now() - t0, t->info.vocab, stored ? ", cached" : "");
  else
    vs_log(VSPEC_LOG_INFO, "models", "%s: preview colour table fitted in %.2f s (%d codes "
           "sampled, %d to a decode)%s", s->name, vs_now() - t0,
           fo.samples < t->info.vocab ? fo.samples : t->info.vocab,
           fo.tiles_per_side * fo.tiles_per_side, stored ? ", cached" : "");
  s->previews = 1;
}

/* Cross-job batching: the gate and its lanes' devices, which share every core (or [workers]
 * threads) between them: while a batch runs, the jobs in it wait. */
/* What one target forward issues, counted once at load on the load device (a step and a
 * 16-node verify, the default CFG rows), for `vspec status`. A failure leaves the costs
 * unknown and is only logged: it costs the model nothing else. */
static void ms_set_costs(vs_model_table *t, vs_model_set *s) {
  if (s->continuous) return;
  const vs_backend_model *tg = &s->models->target;
  int rows = s->models->defaults.cfg_scale > 1.0f ? 2 : 1;
  char err[VSPEC_ERRLEN];
  pthread_mutex_lock(&t->load_mu);
  int rc = vs_count_forward(t->load_dev, tg, rows, 1, &s->step_cost, err, sizeof err);
  if (!rc) rc = vs_count_forward(t->load_dev, tg, rows, 16, &s->verify16_cost, err, sizeof err);
  pthread_mutex_unlock(&t->load_mu);
  if (rc) {
    vs_log(VSPEC_LOG_WARN, "models", "%s: what a forward issues could not be counted: %s",
           s->name, err);
    return;
  }
  s->costed = 1;
  vs_log(VSPEC_LOG_INFO, "models", "%s: a step issues %llu ops and %llu download(s), a 16-node "
         "verify %llu ops", s->name, (unsigned long long)s->step_cost.ops,
         (unsigned long long)s->step_cost.downloads, (unsigned long long)s->verify16_cost.ops);
}

static void ms_set_gate_close(vs_model_set *s) {
  vs_forward_gate_destroy(&s->gate);
  for (int i = 0; i < s->gate_lanes; i++) vs_dev_destroy(s->gate_dev[i]);
  s->gate_lanes = 0;
}

static int ms_set_gate(vs_model_table *t, vs_model_set *s, char *err, size_t errlen) {
  vs_device_options opt = t->batch_dev_opt;
  /* the cores shared out between the lanes */
  opt.threads = opt.threads / t->batch_lanes > 0 ? opt.threads / t->batch_lanes : 1;
  char inner[VSPEC_ERRLEN];
  int rc = VSPEC_OK;
  for (int i = 0; i < t->batch_lanes && !rc; i++)
    if (!(rc = vs_device_open(t->batch_dev_spec, &opt, &s->gate_dev[i], inner, sizeof inner)))
      s->gate_lanes++;
  if (!rc) rc = vs_forward_gate_create(t->batch, 1e-3 * t->batch_wait_ms, s->gate_dev,
                                       s->gate_lanes, &s->gate, inner, sizeof inner);
  if (rc) {
    ms_set_gate_close(s);
    snprintf(err, errlen, "cross-job batching: %s", inner);
  }
  return rc;
}

static int ms_set_open(vs_model_table *t, int idx, unsigned generation, vs_model_set **out,
                       char *err, size_t errlen) {
  double t0 = vs_now();
  vs_model_set *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  snprintf(s->name, sizeof s->name, "%s", t->e[idx].name);
  snprintf(s->dir, sizeof s->dir, "%s", t->e[idx].dir);
  s->generation = generation;
  s->table = t;
  atomic_init(&s->refs, 1);
  vs_sd_notifyf("loading model %s from %s", s->name, s->dir);
  pthread_mutex_lock(&t->load_mu);
  double t_lock = vs_now();
  int rc = vs_models_open(t->reg, t->host, t->load_dev, s->dir, VS_ROLE_ALL, &s->models, err,
                          errlen);
  /* One line per phase, so that a slow start shows where its time goes. */
  if (!rc) {
    vs_log(VSPEC_LOG_INFO, "models", "%s: weights read in %.2f s%s", s->name, vs_now() - t_lock,
           s->models->target.info.codebook ? "; codebook neighbour table deferred to the first "
           "job whose rule uses it" : "");
    ms_set_previews(s, t->load_dev);
  }
  pthread_mutex_unlock(&t->load_mu);
  if (rc) {
    free(s);
    return rc;
  }
  if (t->batch > 1 && !s->continuous && (rc = ms_set_gate(t, s, err, errlen))) {
    vs_models_close(s->models);
    vs_preview_lut_free(&s->lut);
    free(s);
    return rc;
  }
  ms_set_costs(t, s);
  s->load_s = vs_now() - t0;
  const vspec_model_info *in = &s->models->target.info;
  char tokens[64];
  if (s->continuous)
    snprintf(tokens, sizeof tokens, "continuous tokens of %d values", in->token_dim);
  else
    snprintf(tokens, sizeof tokens, "vocab %d, neutral code %d", in->vocab,
             s->lut.rgb ? s->lut.neutral : -1);
  vs_log(VSPEC_LOG_INFO, "models",
         "%s generation %u from %s: %s, grid %dx%d, %s, image %dx%d, draft %s, eagle %s "
         "(%.2f s)",
         s->name, generation, s->dir, in->arch ? in->arch : "?", in->grid_h, in->grid_w, tokens,
         in->image_w, in->image_h, s->models->draft.model ? "yes" : "no",
         s->models->eagle.model ? "yes" : "no", s->load_s);
  pthread_mutex_lock(&t->mu);
  t->sets_alive++;
  pthread_mutex_unlock(&t->mu);
  *out = s;
  return VSPEC_OK;
}

int vs_model_table_open(vs_registry *reg, const vspec_host *host, vspec_dev *load_dev,
                        const vs_daemon_config *cfg, vs_model_table **out, char *err,
                        size_t errlen) {
  vs_model_table *t = calloc(1, sizeof *t);
  if (!t) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  pthread_mutex_init(&t->mu, NULL);
  pthread_mutex_init(&t->load_mu, NULL);
  t->reg = reg;
  t->host = host;
  t->load_dev = load_dev;
  t->lut_exact = cfg->preview_table_exact;
  t->batch = cfg->batch;
  t->batch_wait_ms = cfg->batch_wait_ms;
  t->batch_lanes = cfg->batch_lanes;
  vs_config_device_spec(cfg, t->batch_dev_spec, sizeof t->batch_dev_spec);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  t->batch_dev_opt = (vs_device_options){
      .threads = cfg->threads > 0 ? cfg->threads : cores > 0 ? (int)cores : 1,
      .precision = cfg->device_precision, .memory_limit = (size_t)cfg->device_memory_mb << 20};
  t->n = cfg->n_models;
  int loaded = 0;
  for (int i = 0; i < t->n; i++) {
    snprintf(t->e[i].name, sizeof t->e[i].name, "%s", cfg->models[i].name);
    snprintf(t->e[i].dir, sizeof t->e[i].dir, "%s", cfg->models[i].dir);
    char inner[VSPEC_ERRLEN];
    /* A model that does not load is reported (status, submit errors) but does not stop the
     * daemon: the default fmnist model may simply not be trained yet. */
    if (ms_set_open(t, i, 1, &t->e[i].cur, inner, sizeof inner)) {
      snprintf(t->e[i].error, sizeof t->e[i].error, "%s", inner);
      vs_log(VSPEC_LOG_WARN, "models", "%s: not available: %s", t->e[i].name, inner);
    } else {
      t->e[i].last_generation = 1;
      loaded++;
    }
  }
  if (!loaded) {
    snprintf(err, errlen, "none of the %d configured models could be loaded (%s: %s)", t->n,
             t->e[0].name, t->e[0].error);
    vs_model_table_close(t);
    return VSPEC_ENOENT;
  }
  *out = t;
  return VSPEC_OK;
}

static void ms_set_close(vs_model_set *s) {
  vs_model_table *t = s->table;
  vs_log(VSPEC_LOG_INFO, "models", "%s generation %u closed", s->name, s->generation);
  if (s->gate) {
    vs_forward_gate_stats gs;
    vs_forward_gate_get_stats(s->gate, &gs);
    vs_log(VSPEC_LOG_INFO, "models",
           "%s generation %u: %llu forwards (target and draft) in %llu batches (%llu of several "
           "jobs, %llu started by the wait limit), %.1f nodes per batch, %.2f s waited, %llu "
           "device orderings (a GPU stream's event wait each, no host wait)",
           s->name, s->generation, (unsigned long long)gs.forwards,
           (unsigned long long)gs.batches, (unsigned long long)gs.multi,
           (unsigned long long)gs.timeouts,
           gs.batches ? (double)gs.rows / (double)gs.batches : 0.0, gs.wait_s,
           (unsigned long long)gs.orders);
    vs_forward_gate_destroy(&s->gate);
  }
  /* the models before the lanes' devices: a backend frees what it keeps per lane (a batch
   * workspace, graphs) with the lane's device */
  vs_models_close(s->models);
  ms_set_gate_close(s);
  vs_preview_lut_free(&s->lut);
  pthread_mutex_lock(&t->mu);
  for (int i = 0; i < t->n; i++)
    if (s->retired && !strcmp(t->e[i].name, s->name)) {
      t->e[i].retired_alive--;
      break;
    }
  int last = --t->sets_alive == 0 && t->closing;
  pthread_mutex_unlock(&t->mu);
  free(s);
  if (last) ms_table_free(t);
}

void vs_model_set_release(vs_model_set *s) {
  if (s && atomic_fetch_sub(&s->refs, 1) == 1) ms_set_close(s);
}

void vs_model_table_close(vs_model_table *t) {
  if (!t) return;
  vs_model_set *drop[VS_CONF_MAX_MODELS];
  int n = 0;
  pthread_mutex_lock(&t->mu);
  t->closing = 1;
  for (int i = 0; i < t->n; i++) {
    if (t->e[i].cur) drop[n++] = t->e[i].cur;
    t->e[i].cur = NULL;
  }
  int none = t->sets_alive == 0;
  pthread_mutex_unlock(&t->mu);
  for (int i = 0; i < n; i++) vs_model_set_release(drop[i]);
  if (none) ms_table_free(t);
}

vs_model_set *vs_model_table_acquire(vs_model_table *t, const char *name, char *err,
                                     size_t errlen) {
  pthread_mutex_lock(&t->mu);
  for (int i = 0; i < t->n; i++) {
    if (strcmp(t->e[i].name, name)) continue;
    vs_model_set *s = t->e[i].cur;
    if (s) atomic_fetch_add(&s->refs, 1);
    else snprintf(err, errlen, "model '%s' is configured but failed to load: %s", name,
                  t->e[i].error);
    pthread_mutex_unlock(&t->mu);
    return s;
  }
  /* The name comes from a client: quoted, so that its bytes reach nobody as they are. */
  char q[96];
  size_t o = (size_t)snprintf(err, errlen, "unknown model %s; this daemon serves:",
                              vs_text_quote(q, sizeof q, name, strlen(name)));
  for (int i = 0; i < t->n && o < errlen; i++)
    if (t->e[i].cur) o += (size_t)snprintf(err + o, errlen - o, " %s", t->e[i].name);
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

static int ms_uses_backend(const vs_model_set *s, const char *backend) {
  const vs_backend_model *b[] = {&s->models->target, &s->models->draft, &s->models->eagle};
  for (int i = 0; i < 3; i++)
    if (b[i]->model && !strcmp(vs_plugin_name(b[i]->plugin), backend)) return 1;
  return 0;
}

int vs_model_table_reload_backend(vs_model_table *t, const char *backend, char names[][64],
                                  int max, char *err, size_t errlen) {
  int count = 0;
  for (int i = 0; i < t->n; i++) {
    pthread_mutex_lock(&t->mu);
    vs_model_set *old = t->e[i].cur;
    int use = old ? ms_uses_backend(old, backend) : 0;
    unsigned gen = t->e[i].last_generation + 1;
    pthread_mutex_unlock(&t->mu);
    if (!use) continue;
    vs_model_set *s;
    int rc = ms_set_open(t, i, gen, &s, err, errlen);
    if (rc) return rc; /* the old set stays current */
    pthread_mutex_lock(&t->mu);
    old = t->e[i].cur;
    t->e[i].cur = s;
    t->e[i].last_generation = gen;
    if (old) {
      old->retired = 1;
      t->e[i].retired_alive++;
    }
    pthread_mutex_unlock(&t->mu);
    vs_model_set_release(old);
    if (count < max) snprintf(names[count], 64, "%s", t->e[i].name);
    count++;
  }
  return count;
}

int vs_model_table_status(vs_model_table *t, vs_model_status *out, int max) {
  pthread_mutex_lock(&t->mu);
  int n = t->n < max ? t->n : max;
  for (int i = 0; i < n; i++) {
    vs_model_status *o = &out[i];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", t->e[i].name);
    snprintf(o->dir, sizeof o->dir, "%s", t->e[i].dir);
    snprintf(o->error, sizeof o->error, "%s", t->e[i].error);
    o->retired_alive = t->e[i].retired_alive;
    vs_model_set *s = t->e[i].cur;
    if (s) {
      o->loaded = 1;
      o->generation = s->generation;
      o->jobs = atomic_load(&s->refs) - 1;
      o->info = s->models->target.info;
      o->has_draft = s->models->draft.model != NULL;
      o->has_eagle = s->models->eagle.model != NULL;
      o->n_backends = vs_models_backends(s->models, o->backends);
      o->costed = s->costed;
      o->step_cost = s->step_cost;
      o->verify16_cost = s->verify16_cost;
    }
  }
  pthread_mutex_unlock(&t->mu);
  return n;
}

char **vs_model_table_class_names(vs_model_table *t, int i, int *n) {
  *n = 0;
  pthread_mutex_lock(&t->mu);
  char **names = i >= 0 && i < t->n && t->e[i].cur
                     ? vs_models_class_names_copy(t->e[i].cur->models, n) : NULL;
  pthread_mutex_unlock(&t->mu);
  return names;
}
