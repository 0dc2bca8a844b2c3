#include "daemon/workers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/metrics.h" /* vs_now */
#include "core/autotune.h"
#include "core/engine.h"
#include "core/log.h"
#include "core/method.h"
#include "core/png_meta.h"
#include "core/status.h"
#include "kernels/vs_kernels.h"
#include "proto/vspec.pb-c.h"

typedef struct vs_worker {
  int index;
  pthread_t thread;
  int started;
  vspec_dev *dev;
  struct vs_workers *pool;
  _Atomic uint64_t job_id;
  atomic_int tokens_done, tokens_total;
  _Atomic uint64_t jobs_done;
} vs_worker;

struct vs_workers {
  vs_workers_config cfg;
  int n;
  vs_worker *w;
};

/* What the round callback needs. */
typedef struct wk_run {
  vs_worker *w;
  vs_djob *j;
  vs_model_set *set;
  int total;
  double t0;       /* when generation started (after size=auto's tuning): elapsed and ETA */
  double phase_at; /* when the last phase update went to the loop */
  int last_preview_tokens;
  int64_t last_preview_round;
  int every_tokens, every_rounds;
  int continuous;  /* the target's tokens are latents: positions come in any order */
  uint8_t *rgb;    /* [image_h, image_w, 3] preview scratch */
  int32_t *grid;   /* partial grid for decode previews (discrete models) */
  double preview_s;
  int previews;
  char rule_version[96], sched_version[96]; /* of the generations the engine runs with */
  const vs_job *job; /* as it runs: the previews' text chunks (core/png_meta.h) */
} wk_run;

/* Renders the preview of a round into r->rgb. A continuous-token model has no codes to paint:
 * both kinds decode the partial latents the engine reports. */
static int wk_render(wk_run *r, const vs_round_info *info, char *err, size_t errlen) {
  const vs_backend_model *t = &r->set->models->target;
  if (r->continuous) {
    if (!info->latents) {
      snprintf(err, errlen, "the engine reported no latents");
      return VSPEC_EINVAL;
    }
    return vs_preview_render_latents(r->set->models, r->w->dev, info->latents, r->rgb, err,
                                     errlen);
  }
  if (r->j->preview_kind == VSPEC__PREVIEW_KIND__PREVIEW_LUT) {
    vs_preview_render_lut(&r->set->lut, &t->info, info->tokens, info->n_tokens, r->rgb);
    return VSPEC_OK;
  }
  return vs_preview_render_decode(&r->set->lut, t, r->w->dev, info->tokens, info->n_tokens,
                                  r->grid, r->rgb, err, errlen);
}

static void wk_preview(wk_run *r, const vs_round_info *info) {
  vs_djob *j = r->j;
  const vspec_model_info *in = &r->set->models->target.info;
  double t0 = vs_now();
  char err[VSPEC_ERRLEN];
  if (wk_render(r, info, err, sizeof err)) {
    vs_log(VSPEC_LOG_WARN, "worker", "job %llu: preview failed: %s", (unsigned long long)j->id,
           err);
    return;
  }
  uint8_t *png = NULL;
  size_t len = 0;
  if (vs_png_encode_job(r->rgb, r->job, r->set->models, "vspecd", &png, &len, err, sizeof err)) {
    vs_log(VSPEC_LOG_WARN, "worker", "job %llu: preview PNG: %s", (unsigned long long)j->id, err);
    return;
  }
  pthread_mutex_lock(&j->mu);
  free(j->sh.preview_png); /* newest wins: the client had not taken the previous one */
  j->sh.preview_png = png;
  j->sh.preview_len = len;
  j->sh.preview_round = info->round;
  j->sh.preview_tokens = info->n_tokens;
  j->sh.preview_w = in->image_w;
  j->sh.preview_h = in->image_h;
  pthread_mutex_unlock(&j->mu);
  r->preview_s += vs_now() - t0;
  r->previews++;
}

/* "name version (generation g)" of one plugin generation. */
static void wk_plugin_version(const vs_plugin *p, char *out, size_t cap) {
  snprintf(out, cap, "%s %s (generation %u)", vs_plugin_name(p), vs_plugin_version(p),
           vs_plugin_generation(p));
}

static void wk_on_round(void *user, const vs_round_info *info) {
  wk_run *r = user;
  vs_djob *j = r->j;
  int n = info->n_tokens < r->total ? info->n_tokens : r->total;
  /* A discrete model's map is the prefix of n tokens (raster order). A continuous-token model
   * reveals positions in a random order and n only counts them: its status is current over
   * the whole grid (tokens are zeros there). */
  int m = r->continuous ? r->total : n;
  pthread_mutex_lock(&j->mu);
  if (info->tokens) memcpy(j->sh.tokens, info->tokens, (size_t)m * sizeof(int32_t));
  if (info->status) memcpy(j->sh.status, info->status, (size_t)m);
  j->sh.whole_map = r->continuous;
  if (j->sh.dirty) j->sh.coalesced++;
  j->sh.dirty = 1;
  j->sh.n_tokens = n;
  j->sh.round = info->round;
  j->sh.tpf = vs_metrics_tpf(info->metrics);
  j->sh.mal = vs_metrics_mal(info->metrics);
  j->sh.accept_rate = vs_metrics_accept_rate(info->metrics);
  j->sh.walk_accept_rate = vs_metrics_walk_accept_rate(info->metrics);
  j->sh.elapsed_s = vs_now() - r->t0;
  pthread_mutex_unlock(&j->mu);
  atomic_store(&r->w->tokens_done, n);
  /* The engine holds these generations for the whole job: what it reports is what ran. */
  if (info->rule_plugin && !*r->rule_version)
    wk_plugin_version(info->rule_plugin, r->rule_version, sizeof r->rule_version);
  if (info->sched_plugin && !*r->sched_version)
    wk_plugin_version(info->sched_plugin, r->sched_version, sizeof r->sched_version);
  if (j->preview_kind >= VSPEC__PREVIEW_KIND__PREVIEW_LUT && r->rgb && n < r->total) {
    int due = r->every_rounds > 0 ? info->round - r->last_preview_round >= r->every_rounds
                                   : n - r->last_preview_tokens >= r->every_tokens;
    if (due) {
      wk_preview(r, info);
      r->last_preview_tokens = n;
      r->last_preview_round = info->round;
    }
  }
  r->w->pool->cfg.post(j, r->w->pool->cfg.post_user);
}

/* Positions of a continuous-token grid generated so far. */
static int wk_revealed(const uint8_t *status, int n) {
  int k = 0;
  for (int i = 0; i < n; i++) k += status[i] != VS_TOKEN_NONE;
  return k;
}

/* A phase before generation for the client (Phase events), and a notice (Notice events and
 * the Result's notes). */
static void wk_set_phase(wk_run *r, const char *name, const char *msg, double done) {
  vs_djob *j = r->j;
  pthread_mutex_lock(&j->mu);
  snprintf(j->sh.phase_name, sizeof j->sh.phase_name, "%s", name);
  snprintf(j->sh.phase_msg, sizeof j->sh.phase_msg, "%s", msg);
  j->sh.phase_done = done;
  j->sh.phase_dirty = 1;
  pthread_mutex_unlock(&j->mu);
  r->phase_at = vs_now();
  r->w->pool->cfg.post(j, r->w->pool->cfg.post_user);
}

static void wk_add_note(wk_run *r, const char *kind, const char *note) {
  vs_djob *j = r->j;
  pthread_mutex_lock(&j->mu);
  if (j->sh.n_notes < VS_DJOB_MAX_NOTES) {
    snprintf(j->sh.note_kinds[j->sh.n_notes], sizeof j->sh.note_kinds[0], "%s", kind);
    snprintf(j->sh.notes[j->sh.n_notes++], sizeof j->sh.notes[0], "%s", note);
  }
  pthread_mutex_unlock(&j->mu);
  r->w->pool->cfg.post(j, r->w->pool->cfg.post_user);
}

/* size=auto's progress (core/autotune.h), a few updates a second at most. */
static void wk_tune_progress(void *user, double done, const char *message) {
  wk_run *r = user;
  if (done > 0 && vs_now() - r->phase_at < 0.25) return;
  wk_set_phase(r, "tuning", message, done);
}

/* The method as it runs: size=auto (asked for, or the default the submit added) replaced by
 * the choice stored for this model and machine, or by a tuning done here. Here, on the worker
 * that runs the job, so that the loop thread never waits for a tuning; other workers go on
 * with their jobs (tunings are serialised process-wide: a second job asking for the same
 * method waits for the first's tuning and reads its choice, core/autotune.h). The client
 * sees the tuning as a phase and the choice as a notice. */
static int wk_resolve_size(wk_run *r, vs_models *models, const char *who, const vs_method *me,
                           vs_method *run, char *err, size_t errlen) {
  vs_autotune_result tune;
  vs_autotune_opts opts = {.progress = wk_tune_progress, .user = r};
  int rc = vs_autotune_resolve(models, r->w->dev, me, &opts, &tune, err, errlen);
  if (rc) return rc;
  *run = tune.method;
  if (tune.choice[0]) {
    char note[VS_DJOB_NOTE_LEN];
    vs_autotune_describe(&tune, note, sizeof note);
    if (!tune.from_cache) {
      char done[128];
      snprintf(done, sizeof done, "size=auto: tuned %s in %.1f s", me->text, tune.tune_s);
      wk_set_phase(r, "tuning", done, 1.0);
    }
    wk_add_note(r, vs_autotune_is_ar(&tune) ? "fallback" : "autotune", note);
    /* not stored: every job tunes again and may choose differently (an unwritable cache);
     * slower than AR: the operator should know what the default costs */
    vs_log(tune.stored && !vs_autotune_slower_than_ar(&tune) ? VSPEC_LOG_INFO : VSPEC_LOG_WARN,
           who, "%s", note);
  }
  return VSPEC_OK;
}

/* The codebook neighbour table, made on the first job whose rule reads it (core/models.h:
 * seconds for a large codebook when the disk cache has no copy), is made here, before the
 * job's first round, so that its client sees the wait as a phase. */
static int wk_prepare_neighbours(wk_run *r, vs_models *models, const vs_method *me, char *err,
                                 size_t errlen) {
  vs_plugin *p;
  char inner[VSPEC_ERRLEN];
  if (me->kind != VS_METHOD_SD) return 0;
  if (vs_registry_acquire_loaded(models->reg, VSPEC_PLUGIN_ACCEPT, me->rule, &p, inner,
                                 sizeof inner))
    return 0; /* the engine says why */
  int uses = (vs_plugin_desc(p)->flags & VSPEC_PLUGIN_USES_NEIGHBOURS) != 0;
  vs_plugin_release(p);
  pthread_mutex_lock(&models->neighbours_mu);
  int made = models->neighbours != NULL;
  pthread_mutex_unlock(&models->neighbours_mu);
  if (!uses || made) return 0;
  const int32_t *table;
  int k;
  wk_set_phase(r, "loading", "making the codebook neighbour table (once per model)", 0.0);
  int rc = vs_models_neighbours(models, &table, &k, err, errlen);
  if (!rc) wk_set_phase(r, "loading", "the codebook neighbour table is ready", 1.0);
  return rc;
}

/* What a job makes, from the worker's buffers to the result the loop sends. */
typedef struct wk_out {
  int32_t *tokens;
  float *latents;
  uint8_t *status, *rgb, *png;
  size_t png_len;
  char desc[512];
  vs_metrics mt;
} wk_out;

/* The model's default sampling with what the submit set. */
static void wk_sampling(const vs_djob *j, vs_sampling *s) {
  if (j->sampling_set & VS_SET_TEMPERATURE) s->temperature = j->sampling.temperature;
  if (j->sampling_set & VS_SET_TOP_K) s->top_k = j->sampling.top_k;
  if (j->sampling_set & VS_SET_TOP_P) s->top_p = j->sampling.top_p;
  if (j->sampling_set & VS_SET_CFG) s->cfg_scale = j->sampling.cfg_scale;
  if (j->sampling_set & VS_SET_CFG_INTERVAL) s->cfg_interval = j->sampling.cfg_interval;
  if (j->sampling_set & VS_SET_NUM_ITER) s->num_iter = j->sampling.num_iter;
  if (j->sampling_set & VS_SET_CFG_SCHEDULE) s->cfg_schedule = j->sampling.cfg_schedule;
}

/* The output buffers, and the preview scratch when the job asked for previews. */
static int wk_alloc(wk_run *r, const vspec_model_info *in, wk_out *o, char *err,
                    size_t errlen) {
  o->tokens = calloc((size_t)r->total, sizeof *o->tokens);
  o->status = calloc((size_t)r->total, 1);
  /* A continuous-token model's output is its latents; the token grid stays zeros. */
  size_t n_latents = vs_models_latent_count(r->set->models);
  if (n_latents) o->latents = calloc(n_latents, sizeof *o->latents);
  size_t px = (size_t)in->image_h * in->image_w;
  if (px) o->rgb = malloc(px * 3);
  int previews = r->j->preview_kind >= VSPEC__PREVIEW_KIND__PREVIEW_LUT && r->set->previews && px;
  if (previews) {
    r->rgb = malloc(px * 3);
    if (!r->continuous) r->grid = malloc((size_t)r->total * sizeof *r->grid);
  }
  if (!o->tokens || !o->status || (n_latents && !o->latents) || (px && !o->rgb) ||
      (previews && (!r->rgb || (!r->continuous && !r->grid)))) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  return VSPEC_OK;
}

/* Generates the job, decodes it and encodes the PNG, on the model set r->set. */
static int wk_generate(wk_run *r, const char *who, wk_out *o, vs_djob_stats *st, char *err,
                       size_t errlen) {
  vs_djob *j = r->j;
  const vs_backend_model *t = &r->set->models->target;
  r->total = t->info.grid_h * t->info.grid_w;
  r->continuous = r->set->continuous;
  if (r->total != j->tokens_total)
    return vs_fail(err, errlen, VSPEC_EINVAL, "model '%s' was reloaded with a %dx%d grid after "
                   "this job was accepted; submit again", j->model, t->info.grid_h,
                   t->info.grid_w);
  vs_method run; /* the job's method with its size resolved */
  int rc = wk_resolve_size(r, r->set->models, who, &j->method, &run, err, errlen);
  if (!rc) rc = wk_prepare_neighbours(r, r->set->models, &run, err, errlen);
  if (rc) return rc;
  r->t0 = vs_now(); /* progress's elapsed time (and a client's ETA) count generation only */
  vs_job job = {.method = &run, .class_label = j->class_label, .caption = j->caption,
                .caption_mask = j->caption_mask, .seed = j->seed,
                .sampling = r->set->models->defaults, .on_round = wk_on_round, .user = r,
                .cancel = &j->cancel, .gate = r->set->gate};
  wk_sampling(j, &job.sampling);
  if ((rc = wk_alloc(r, &t->info, o, err, errlen))) return rc;
  job.status = o->status;
  job.latents = o->latents;
  r->job = &job;
  r->every_tokens = j->preview_every_tokens > 0 ? j->preview_every_tokens : r->total / 8;
  if (r->every_tokens < 1) r->every_tokens = 1;
  r->every_rounds = j->preview_every_rounds;
  rc = vs_generate(r->set->models, r->w->dev, &job, o->tokens, &o->mt, err, errlen);
  st->generate_s = vs_now() - r->t0;
  vs_job_describe(&job, r->set->models->name, o->desc, sizeof o->desc);
  if (!rc && !o->rgb)
    return vs_fail(err, errlen, VSPEC_ENOTSUP, "model '%s' has no image decoder", j->model);
  if (rc) return rc;
  double d0 = vs_now();
  char inner[VSPEC_ERRLEN] = "";
  rc = vs_models_decode(r->set->models, r->w->dev, o->tokens, o->latents, o->rgb, inner,
                        sizeof inner);
  if (rc)
    snprintf(err, errlen, "decode: %s", inner);
  else
    rc = vs_png_encode_job(o->rgb, &job, r->set->models, "vspecd", &o->png, &o->png_len, err,
                           errlen);
  st->decode_s = vs_now() - d0;
  return rc;
}

/* The job's figures from its metrics and its run. */
static void wk_stats(vs_djob_stats *st, const vs_metrics *mt, const wk_run *r) {
  st->tokens = mt->tokens;
  st->target_forwards = mt->target_forwards;
  st->rounds = mt->rounds;
  st->drafted = mt->drafted;
  st->draft_tokens = mt->draft_tokens;
  st->accepted = mt->accepted;
  st->tree_nodes = mt->tree_nodes;
  st->skipped_rounds = mt->skipped_rounds;
  st->unverified = mt->unverified_tokens;
  st->tpf = vs_metrics_tpf(mt);
  st->mal = vs_metrics_mal(mt);
  st->accept_rate = vs_metrics_accept_rate(mt);
  st->walk_accept_rate = vs_metrics_walk_accept_rate(mt);
  st->preview_s = r->preview_s;
  st->previews = r->previews;
  snprintf(st->rule_version, sizeof st->rule_version, "%s", r->rule_version);
  snprintf(st->sched_version, sizeof st->sched_version, "%s", r->sched_version);
}

/* The outcome into the job's shared state, under its lock (the PNG changes hands). */
static void wk_publish(wk_run *r, int rc, const char *err, wk_out *o,
                       const vs_djob_stats *st) {
  vs_djob *j = r->j;
  pthread_mutex_lock(&j->mu);
  j->sh.finished = 1;
  j->sh.rc = rc;
  snprintf(j->sh.error, sizeof j->sh.error, "%s", err);
  j->sh.png = o->png;
  j->sh.png_len = o->png_len;
  if (o->tokens && r->total == j->tokens_total) {
    memcpy(j->sh.tokens, o->tokens, (size_t)r->total * sizeof *o->tokens);
    memcpy(j->sh.status, o->status, (size_t)r->total);
    j->sh.n_tokens = (int)o->mt.tokens < r->total ? (int)o->mt.tokens : r->total;
    if (r->continuous) j->sh.n_tokens = wk_revealed(o->status, r->total); /* also when stopped */
    j->sh.whole_map = r->continuous;
  }
  if (r->set) {
    const vspec_model_info *in = &r->set->models->target.info;
    j->sh.width = in->image_w;
    j->sh.height = in->image_h;
    j->sh.grid_h = in->grid_h;
    j->sh.grid_w = in->grid_w;
  }
  snprintf(j->sh.describe, sizeof j->sh.describe, "%s", o->desc);
  j->sh.stats = *st;
  pthread_mutex_unlock(&j->mu);
}

static void wk_run_job(vs_worker *w, vs_djob *j) {
  vs_workers *pool = w->pool;
  double started = vs_now();
  wk_run r = {.w = w, .j = j, .t0 = started};
  vs_djob_stats st;
  memset(&st, 0, sizeof st);
  st.queue_s = started - j->submitted_at;
  int rc = VSPEC_OK;
  char err[VSPEC_ERRLEN] = "";
  wk_out o;
  memset(&o, 0, sizeof o);

  pthread_mutex_lock(&j->mu);
  j->sh.started = 1;
  j->sh.started_at = started;
  pthread_mutex_unlock(&j->mu);
  atomic_store(&w->job_id, j->id);
  atomic_store(&w->tokens_done, 0);
  atomic_store(&w->tokens_total, j->tokens_total);
  char who[40];
  snprintf(who, sizeof who, "job %llu", (unsigned long long)j->id);
  vs_log(VSPEC_LOG_INFO, who, "started on worker %d after %.3f s in the queue", w->index,
         st.queue_s);

  if (atomic_load(&j->cancel)) {
    rc = VSPEC_ECANCELED;
    snprintf(err, sizeof err, "job cancelled before it started");
  } else if (!(r.set = vs_model_table_acquire(pool->cfg.models, j->model, err, sizeof err))) {
    rc = VSPEC_ENOENT;
  } else {
    st.model_generation = r.set->generation;
    rc = wk_generate(&r, who, &o, &st, err, sizeof err);
  }
  wk_stats(&st, &o.mt, &r);
  wk_publish(&r, rc, err, &o, &st);
  /* Everything a status request shows is settled before the loop can send the result: the
   * model set (and with it, possibly, a retired generation) is released, the worker is idle
   * and the queue no longer counts the job. Only memory is freed after the post. */
  vs_model_set_release(r.set);
  r.set = NULL;
  atomic_store(&w->job_id, 0);
  atomic_fetch_add(&w->jobs_done, 1);
  vs_job_queue_done(pool->cfg.queue, j);
  pool->cfg.post(j, pool->cfg.post_user);
  if (rc)
    vs_log(rc == VSPEC_ECANCELED ? VSPEC_LOG_INFO : VSPEC_LOG_WARN, who, "failed: %s", err);
  else
    vs_log(VSPEC_LOG_INFO, who,
           "done on worker %d: %lld tokens, %lld target forwards, TPF %.3f, MAL %.3f, "
           "%.3f s (+%.3f s decode, %d previews %.3f s)",
           w->index, (long long)o.mt.tokens,
           (long long)o.mt.target_forwards, st.tpf, st.mal, st.generate_s, st.decode_s,
           st.previews, st.preview_s);
  free(o.tokens);
  free(o.latents);
  free(o.status);
  free(o.rgb);
  free(r.rgb);
  free(r.grid);
}

static void *wk_worker_main(void *arg) {
  vs_worker *w = arg;
  for (;;) {
    vs_djob *j = vs_job_queue_pop(w->pool->cfg.queue);
    if (!j) break;
    wk_run_job(w, j); /* marks the job done in the queue and posts it to the loop */
    vs_djob_release(j);
  }
  return NULL;
}

int vs_workers_start(const vs_workers_config *cfg, vs_workers **out, char *err, size_t errlen) {
  vs_workers *p = calloc(1, sizeof *p);
  if (!p) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  p->cfg = *cfg;
  p->n = cfg->count;
  p->w = calloc((size_t)p->n, sizeof *p->w);
  if (!p->w) {
    free(p);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  int threads = cfg->threads;
  if (threads <= 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    threads = cores > 0 ? (int)(cores / p->n) : 1;
    if (threads < 1) threads = 1;
  }
  int rc = VSPEC_OK;
  for (int i = 0; i < p->n && !rc; i++) {
    vs_worker *w = &p->w[i];
    w->index = i;
    w->pool = p;
    vs_device_options opt = cfg->device_options;
    opt.threads = threads;
    rc = vs_device_open(cfg->device[0] ? cfg->device : "cpu", &opt, &w->dev, err, errlen);
    if (rc) break;
    if (pthread_create(&w->thread, NULL, wk_worker_main, w)) {
      snprintf(err, errlen, "cannot start worker thread %d", i);
      rc = VSPEC_ENOMEM;
      break;
    }
    w->started = 1;
  }
  if (rc) {
    vs_job_queue_stop(cfg->queue);
    vs_workers_join(p);
    return rc;
  }
  vs_log(VSPEC_LOG_INFO, "workers", "%d worker(s), %d compute thread(s) each%s", p->n, threads,
         cfg->batch > 1 ? ", cross-job batching on" : "");
  *out = p;
  return VSPEC_OK;
}

void vs_workers_join(vs_workers *p) {
  if (!p) return;
  for (int i = 0; i < p->n; i++) {
    if (p->w[i].started) pthread_join(p->w[i].thread, NULL);
    if (p->w[i].dev) vs_dev_destroy(p->w[i].dev);
  }
  free(p->w);
  free(p);
}

int vs_workers_device_info(vs_workers *p, vs_device_info *out) {
  if (!p || p->n < 1) return VSPEC_EINVAL;
  return vs_dev_info(p->w[0].dev, out);
}

int vs_workers_status(vs_workers *p, vs_worker_status *out, int max) {
  if (!p) return 0; /* joined: the daemon is stopping */
  int n = p->n < max ? p->n : max;
  for (int i = 0; i < n; i++) {
    out[i].job_id = atomic_load(&p->w[i].job_id);
    out[i].tokens_done = atomic_load(&p->w[i].tokens_done);
    out[i].tokens_total = atomic_load(&p->w[i].tokens_total);
    out[i].jobs_done = atomic_load(&p->w[i].jobs_done);
  }
  return n;
}
