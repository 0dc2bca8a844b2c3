#include "daemon/submit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "core/metrics.h" /* vs_now */
#include "core/autotune.h"
#include "core/class_prompt.h"
#include "core/engine.h"
#include "core/method.h"
#include "core/method_plugins.h"
#include "core/names.h"
#include "core/status.h"
#include "core/text.h"

/* What a plugin kind is called in messages. */
static const char *sb_plugin_what(int kind) {
  return kind == VSPEC_PLUGIN_ACCEPT ? "acceptance rule"
         : kind == VSPEC_PLUGIN_SCHED ? "scheduler"
                                      : "drafter";
}

/* A trial drafter for a job on a model of `vocab` codes. */
static int sb_try_drafter(const vs_submit_ctx *c, const vs_plugin *p, const vspec_params *pp,
                          int32_t vocab, char *err, size_t errlen) {
  const vspec_drafter_vtable *vt = vs_plugin_vtable(p);
  vspec_drafter_job job = {.struct_size = sizeof job, .vocab = vocab, .n_image = 1,
                           .max_depth = VS_MAX_DEPTH};
  vspec_drafter *d = NULL;
  int rc = vt->create(c->host, pp, &job, &d, err, errlen);
  if (!rc) vt->destroy(d);
  return rc;
}

/* Creates and destroys one instance of plugin (kind, name) with `pp`, the set the method
 * parsed; an acceptance rule must also fit the model's kind of tokens (`continuous`). */
static int sb_try_plugin(const vs_submit_ctx *c, int kind, const char *name,
                         const vspec_params *pp, int continuous, const char *model, int32_t vocab, char *err,
                         size_t errlen) {
  vs_plugin *p = NULL;
  char inner[VSPEC_ERRLEN] = "";
  /* A client naming a file in the plugin directory must not be enough to run its code:
   * plugins come from the start-up scan or an admin reload unless plugins.on_demand. */
  int rc = c->cfg->plugins_on_demand
               ? vs_registry_acquire(c->reg, kind, name, &p, inner, sizeof inner)
               : vs_registry_acquire_loaded(c->reg, kind, name, &p, inner, sizeof inner);
  if (rc) {
    snprintf(err, errlen, "%s '%s' is not available: %s", sb_plugin_what(kind), name, inner);
    return rc;
  }
  if (kind == VSPEC_PLUGIN_ACCEPT) {
    const vspec_accept_vtable *vt = vs_plugin_vtable(p);
    vspec_rule *r = NULL;
    rc = vs_rule_fits(vt, continuous, model, inner, sizeof inner);
    if (!rc) rc = vt->create(c->host, pp, &r, inner, sizeof inner);
    if (!rc) vt->destroy(r);
  } else if (kind == VSPEC_PLUGIN_DRAFTER) {
    rc = sb_try_drafter(c, p, pp, vocab, inner, sizeof inner);
  } else {
    const vspec_sched_vtable *vt = vs_plugin_vtable(p);
    vspec_sched *s = NULL;
    rc = vt->create(c->host, pp, &s, inner, sizeof inner);
    if (!rc) vt->destroy(s);
  }
  vs_plugin_release(p);
  if (rc) snprintf(err, errlen, "%s '%s': %s", sb_plugin_what(kind), name, inner);
  return rc;
}

/* A seed for a submit that names none. Kept below 2^53 so that it survives a round trip
 * through JSON numbers (the CLI's --json, scripts) unchanged. */
static uint64_t sb_fresh_seed(uint64_t id) {
  uint64_t x = 0;
  if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x) {
    /* No entropy yet (early boot): the clock and the job id, mixed (splitmix64). */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    x = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ (id * 0x9E3779B97F4A7C15ull);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
  }
  return x & ((1ull << 53) - 1);
}

/* The sampling fields that depend on the kind of tokens: top_k / top_p shape a distribution
 * over codes and cfg_interval follows LlamaGen's raster steps, so they mean nothing to a
 * continuous-token (MAR) model (which guides every step, as cfg_schedule says); num_iter and
 * cfg_schedule
 * drive MAR's sampler and mean nothing to a discrete one. A field that does not apply is
 * refused rather than ignored, so a request never silently differs from what runs. */
static int sb_sampling_tokens(const Vspec__Submit *s, const vs_model_set *set, vs_sampling *smp,
                              unsigned *set_mask, char *err, size_t errlen) {
  const vspec_model_info *in = &set->models->target.info;
  const char *model = set->name;
  if (set->continuous) {
    if (s->has_top_k && s->top_k != 0) {
      snprintf(err, errlen, "top_k: model '%s' has continuous tokens, top-k does not apply "
               "(leave it unset or 0)", model);
      return VSPEC_EINVAL;
    }
    if (s->has_top_p && s->top_p != 1.0f) {
      snprintf(err, errlen, "top_p: model '%s' has continuous tokens, top-p does not apply "
               "(leave it unset or 1)", model);
      return VSPEC_EINVAL;
    }
    if (s->has_cfg_interval && s->cfg_interval != -1) {
      snprintf(err, errlen, "cfg_interval: model '%s' has continuous tokens, it guides every "
               "step (leave it unset or -1; cfg_schedule shapes the guidance)", model);
      return VSPEC_EINVAL;
    }
  }
  if (s->cfg_schedule) {
    char q[64];
    if (!strcmp(s->cfg_schedule, "linear")) smp->cfg_schedule = VS_CFG_LINEAR;
    else if (!strcmp(s->cfg_schedule, "constant")) smp->cfg_schedule = VS_CFG_CONSTANT;
    else {
      snprintf(err, errlen, "cfg_schedule: %s is not linear or constant",
               vs_text_quote(q, sizeof q, s->cfg_schedule, strlen(s->cfg_schedule)));
      return VSPEC_EINVAL;
    }
    *set_mask |= VS_SET_CFG_SCHEDULE;
  }
  if (s->has_num_iter) {
    int n = in->grid_h * in->grid_w;
    /* at most one step per position: each step reveals at least one (MAR's mask schedule) */
    if (s->num_iter < 0 || s->num_iter > n) {
      snprintf(err, errlen, "num_iter: %d is out of range: allowed 0..%d for model '%s' "
               "(0 = the model's default)", s->num_iter, n, model);
      return VSPEC_ERANGE;
    }
    smp->num_iter = s->num_iter;
    *set_mask |= VS_SET_NUM_ITER;
  }
  if (!set->continuous && (s->has_num_iter || s->cfg_schedule)) {
    snprintf(err, errlen, "%s: model '%s' has discrete tokens; num_iter and cfg_schedule are "
             "for continuous-token (MAR) models", s->has_num_iter ? "num_iter" : "cfg_schedule",
             model);
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

/* What each string field of a Submit may hold (core/names.h), checked before anything reads
 * them, so that no message, log line or plugin sees other bytes. An empty value means "not
 * given" for all of them. `draft` and `cfg_schedule` are keywords: which ones is checked
 * where they are read. */
static int sb_check_strings(const Vspec__Submit *s, char *err, size_t errlen) {
  const struct {
    const char *field, *value;
    const vs_name_kind *kind;
  } f[] = {
      {"model", s->model, &vs_name_model},
      {"method", s->method, &vs_name_method},
      {"accept", s->accept, &vs_name_plugin},
      {"accept_params", s->accept_params, &vs_name_params},
      {"sched", s->sched, &vs_name_plugin},
      {"sched_params", s->sched_params, &vs_name_params},
      {"draft", s->draft, &vs_name_word},
      {"cfg_schedule", s->cfg_schedule, &vs_name_word},
      {"tag", s->tag, &vs_name_tag},
      {"prompt", s->prompt, &vs_name_prompt},
  };
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].value && *f[i].value && vs_name_check(f[i].kind, f[i].field, f[i].value, err, errlen))
      return VSPEC_EINVAL;
  return VSPEC_OK;
}

/* A submit's parts, each checked against the model before the job is made. */
typedef struct sb_req {
  const char *model;
  vs_model_set *set;
  const vspec_model_info *in;
  vs_method me;
  char rule[64], sched[64]; /* a speculative method's plugins, for the stats */
  int32_t class_label;
  const float *caption;  /* in the request's blob frame, [caption_len, caption_dim] */
  const uint8_t *mask;   /* NULL: every caption slot counts */
  vs_sampling smp;
  unsigned set_mask;     /* VS_SET_*: what the client set */
  int kind, credit, priority, total;
} sb_req;

/* In the checks below: the request is invalid, for the reason given (the caller sends
 * ERR_INVALID). */
#define SB_INVALID(...) return vs_fail(err, errlen, -1, __VA_ARGS__)

/* The method, built once from the form the Submit uses: a complete method (the `method`
 * string, parsed), its parts (accept/sched/draft and their parameters), or the configured
 * default. Its parameters are parsed here too: nothing downstream parses it, or them, again. */
static int sb_method_build(const vs_daemon_config *cfg, const Vspec__Submit *s, vs_method *me,
                           char *err, size_t errlen) {
  char inner[VSPEC_ERRLEN];
  const char *draft = s->draft && *s->draft ? s->draft : NULL;
  if (draft && vs_name_check(&vs_name_plugin, "draft", draft, inner, sizeof inner))
    SB_INVALID("draft: auto, model, head or a drafter plugin such as jacobi: %s", inner);
  int rc;
  if (s->method && *s->method) {
    if (s->accept || s->sched || s->accept_params || s->sched_params || draft)
      SB_INVALID("method: give either a complete method or accept/sched/draft, not both");
    rc = vs_method_parse(s->method, me, inner, sizeof inner);
  } else if (s->accept && *s->accept) {
    /* `draft` is the scheduler's drafter= unless its parameters name one */
    const char *sp = s->sched_params ? s->sched_params : "";
    char spx[512];
    int add = draft && strstr(sp, "drafter=") == NULL;
    snprintf(spx, sizeof spx, "%s%s%s%s", sp, add && *sp ? "," : "", add ? "drafter=" : "",
             add ? draft : "");
    rc = vs_method_make(s->accept, s->accept_params, s->sched, spx, me, inner, sizeof inner);
  } else if (s->sched || s->sched_params || s->accept_params || draft) {
    SB_INVALID("sched/draft/params given without an acceptance rule (accept)");
  } else {
    *me = cfg->default_method; /* parsed when the configuration was read */
    rc = 0;
  }
  /* malformed parameters are told as the plugin's, as when they were parsed at its trial */
  if (rc == VSPEC_EFORMAT) SB_INVALID("%s", inner);
  if (rc) SB_INVALID("method: %s", inner);
  return 0;
}

/* The method, built and checked: its drafter against the model, its plugins as they will
 * run it. */
static int sb_method(const vs_submit_ctx *c, const Vspec__Submit *s, sb_req *q, char *err,
                     size_t errlen) {
  char inner[VSPEC_ERRLEN];
  const char *model = q->model;
  vs_model_set *set = q->set;
  vs_method *me = &q->me;
  if (sb_method_build(c->cfg, s, me, err, errlen)) return -1;
  /* size=auto is resolved by the worker that runs the job (daemon/workers.c); here it is the
   * default for a method that names no size (defaults.auto_size), and the scheduler is
   * checked with the parameters it will get, less the size the worker adds (vs_method keeps
   * size=auto out of them). */
  if (c->cfg->auto_size) vs_autotune_default(me, set->continuous);
  if (vs_autotune_wanted(me) && set->continuous)
    SB_INVALID("method %s: size=auto is not supported for continuous-token (MAR) models "
               "(model '%s'); use depth=L explicitly", me->text, model);
  if (me->kind != VS_METHOD_SD) return 0;
  int has_draft = set->models->draft.model != NULL, has_eagle = set->models->eagle.model != NULL;
  if (!has_draft && !has_eagle && vs_method_drafter(me) != VSPEC_DRAFTER_PLUGIN)
    SB_INVALID("method %s: model '%s' has no drafter (no draft model, no eagle head); "
               "use ar, or drafter=jacobi (no draft model needed)", me->text, model);
  unsigned drafter = vs_method_drafter(me);
  if (drafter == VSPEC_DRAFTER_MODEL && !has_draft)
    SB_INVALID("draft: model '%s' has no draft model", model);
  if (drafter == VSPEC_DRAFTER_HEAD && !has_eagle)
    SB_INVALID("draft: model '%s' has no eagle head", model);
  int vocab = q->in->vocab;
  if (sb_try_plugin(c, VSPEC_PLUGIN_ACCEPT, me->rule, &me->rule_set, set->continuous, model,
                    vocab, inner, sizeof inner) ||
      sb_try_plugin(c, VSPEC_PLUGIN_SCHED, me->sched, &me->sched_set, set->continuous, model,
                    vocab, inner, sizeof inner) ||
      (drafter == VSPEC_DRAFTER_PLUGIN &&
       sb_try_plugin(c, VSPEC_PLUGIN_DRAFTER, me->drafter, &me->drafter_set,
                     set->continuous, model, vocab, inner, sizeof inner)))
    SB_INVALID("%s", inner);
  snprintf(q->rule, sizeof q->rule, "%s", me->rule);
  snprintf(q->sched, sizeof q->sched, "%s", me->sched);
  return 0;
}

/* The class: class_label, or the one a prompt names among the model's class names. */
static int sb_class(const Vspec__Submit *s, sb_req *q, char *err, size_t errlen) {
  const vspec_model_info *in = q->in;
  q->class_label = s->has_class_label ? s->class_label : 0;
  if (s->prompt && *s->prompt) {
    if (s->has_class_label) SB_INVALID("prompt: give either a prompt or class_label, not both");
    if (in->caption_len > 0)
      SB_INVALID("prompt: model '%s' takes caption embeddings and vspecd has no text "
                 "encoder to make them from words (send them as caption blobs)", q->model);
    /* an unconditional model draws what it draws: the prompt (which OpenAI's clients must
     * send) is not refused */
    vs_class_pick pk = {0, 0};
    char inner[VSPEC_ERRLEN];
    const vs_models *ms = q->set->models;
    if (in->num_classes > 0 &&
        vs_class_prompt_match(s->prompt, q->model, (const char *const *)ms->class_names,
                              ms->n_class_names, in->num_classes, &pk, inner, sizeof inner))
      SB_INVALID("%s", inner);
    q->class_label = pk.label;
  }
  if (in->num_classes > 0) {
    if (q->class_label < 0 || q->class_label >= in->num_classes)
      SB_INVALID("class_label: %d is out of range: model '%s' has classes 0..%d",
                 q->class_label, q->model, in->num_classes - 1);
    if (s->has_caption_len || s->has_caption_dim)
      SB_INVALID("caption: model '%s' is class-conditional", q->model);
  }
  return 0;
}

/* A text-conditional model's caption embeddings and mask, from the request's blob frames. */
static int sb_caption(const Vspec__Submit *s, const Vspec__Request *r, const vs_wire_msg *m,
                      sb_req *q, char *err, size_t errlen) {
  const vspec_model_info *in = q->in;
  if (in->caption_len <= 0) return 0;
  if (!s->has_caption_len || !s->has_caption_dim || (int)s->caption_len != in->caption_len ||
      (int)s->caption_dim != in->caption_dim)
    SB_INVALID("caption: model '%s' needs caption_len %d and caption_dim %d", q->model,
               in->caption_len, in->caption_dim);
  int bi = vs_wire_find_blob(r->blobs, r->n_blobs, VSPEC__BLOB_KIND__BLOB_CAPTION_F32LE);
  size_t want = (size_t)in->caption_len * in->caption_dim * sizeof(float);
  if (bi < 0) SB_INVALID("caption: no caption blob frame (float32 [%d, %d])",
                         in->caption_len, in->caption_dim);
  if (zmq_msg_size((zmq_msg_t *)&m->blobs[bi]) != want)
    SB_INVALID("caption: blob has %zu bytes, the model needs %zu",
               zmq_msg_size((zmq_msg_t *)&m->blobs[bi]), want);
  q->caption = zmq_msg_data((zmq_msg_t *)&m->blobs[bi]);
  int mi = vs_wire_find_blob(r->blobs, r->n_blobs, VSPEC__BLOB_KIND__BLOB_CAPTION_MASK_U8);
  if (mi >= 0) {
    if (zmq_msg_size((zmq_msg_t *)&m->blobs[mi]) != (size_t)in->caption_len)
      SB_INVALID("caption mask: blob has %zu bytes, the model needs %d",
                 zmq_msg_size((zmq_msg_t *)&m->blobs[mi]), in->caption_len);
    q->mask = zmq_msg_data((zmq_msg_t *)&m->blobs[mi]);
  }
  return 0;
}

/* Sampling: merged with the model's defaults and checked as the engine will. */
static int sb_sampling(const Vspec__Submit *s, sb_req *q, char *err, size_t errlen) {
  char inner[VSPEC_ERRLEN];
  vs_sampling *smp = &q->smp;
  *smp = q->set->models->defaults;
  q->set_mask = 0;
  if (s->has_temperature) smp->temperature = s->temperature, q->set_mask |= VS_SET_TEMPERATURE;
  if (s->has_top_k) smp->top_k = s->top_k, q->set_mask |= VS_SET_TOP_K;
  if (s->has_top_p) smp->top_p = s->top_p, q->set_mask |= VS_SET_TOP_P;
  if (s->has_cfg_scale) smp->cfg_scale = s->cfg_scale, q->set_mask |= VS_SET_CFG;
  if (s->has_cfg_interval)
    smp->cfg_interval = s->cfg_interval, q->set_mask |= VS_SET_CFG_INTERVAL;
  if (sb_sampling_tokens(s, q->set, smp, &q->set_mask, inner, sizeof inner))
    SB_INVALID("%s", inner);
  if (vs_sampling_validate(smp, q->in->vocab, inner, sizeof inner)) SB_INVALID("%s", inner);
  return 0;
}

/* Delivery: previews, credit, deadline, progress cadence, priority. */
static int sb_delivery(const vs_daemon_config *cfg, const Vspec__Submit *s, sb_req *q,
                       char *err, size_t errlen) {
  int kind = s->has_preview ? (int)s->preview : VSPEC__PREVIEW_KIND__PREVIEW_NONE;
  if (kind < VSPEC__PREVIEW_KIND__PREVIEW_NONE || kind > VSPEC__PREVIEW_KIND__PREVIEW_DECODE)
    SB_INVALID("preview: kind %d is not none(0), tokens(1), lut(2) or decode(3)", kind);
  if (kind >= VSPEC__PREVIEW_KIND__PREVIEW_LUT && !q->set->previews)
    SB_INVALID("preview: model '%s' cannot render lut/decode previews (no image decoder%s)",
               q->model, q->set->continuous ? " for its latents" : " or colour table");
  q->kind = kind;
  int total = q->total;
  if (s->has_preview_every_tokens && (int64_t)s->preview_every_tokens > total)
    SB_INVALID("preview_every_tokens: %u is more than the %d tokens of an image",
               s->preview_every_tokens, total);
  if (s->has_preview_every_rounds && s->preview_every_rounds > 1000000)
    SB_INVALID("preview_every_rounds: %u is over 1000000", s->preview_every_rounds);
  q->credit = s->has_credit ? (int)s->credit : cfg->credit;
  if (s->has_credit && (s->credit < 1 || (int64_t)s->credit > cfg->max_credit))
    SB_INVALID("credit: %u is out of range: allowed 1..%d", s->credit, cfg->max_credit);
  if (s->has_deadline_ms && (int64_t)s->deadline_ms > cfg->max_deadline_ms)
    SB_INVALID("deadline_ms: %u is over the limit of %ld", s->deadline_ms, cfg->max_deadline_ms);
  if (s->has_progress_interval_ms && s->progress_interval_ms > 60000)
    SB_INVALID("progress_interval_ms: %u is over 60000", s->progress_interval_ms);
  q->priority = s->has_priority ? s->priority : 0;
  if (q->priority < -10 || q->priority > 10)
    SB_INVALID("priority: %d is out of range: allowed -10..10", q->priority);
  return 0;
}

/* The job's copy of the caption (checked finite) and its mask. 0, or the ErrorCode. */
static int sb_job_caption(vs_djob *j, const sb_req *q, char *err, size_t errlen) {
  const vspec_model_info *in = q->in;
  size_t cb = (size_t)in->caption_len * in->caption_dim * sizeof(float);
  j->caption = malloc(cb);
  j->caption_mask = malloc((size_t)in->caption_len);
  if (!j->caption || !j->caption_mask)
    return vs_fail(err, errlen, VSPEC__ERROR_CODE__ERR_INTERNAL, "out of memory");
  memcpy(j->caption, q->caption, cb);
  for (size_t i = 0; i < cb / sizeof(float); i++)
    if (!isfinite(j->caption[i]))
      return vs_fail(err, errlen, VSPEC__ERROR_CODE__ERR_INVALID,
                     "caption: value %zu is not finite", i);
  if (q->mask) memcpy(j->caption_mask, q->mask, (size_t)in->caption_len);
  else memset(j->caption_mask, 1, (size_t)in->caption_len);
  j->caption_len = in->caption_len;
  j->caption_dim = in->caption_dim;
  return 0;
}

/* The job's fields from the checked parts and the request's delivery options. */
static void sb_job_fill(vs_djob *j, const vs_daemon_config *cfg, const Vspec__Request *r,
                        const sb_req *q, uint64_t id) {
  const Vspec__Submit *s = r->submit;
  snprintf(j->model, sizeof j->model, "%s", q->model);
  j->method = q->me;
  snprintf(j->rule_name, sizeof j->rule_name, "%s", q->rule);
  snprintf(j->sched_name, sizeof j->sched_name, "%s", q->sched);
  snprintf(j->tag, sizeof j->tag, "%s", s->tag ? s->tag : "");
  j->class_label = q->class_label;
  j->has_class = q->in->num_classes > 0;
  const char *cn = j->has_class ? vs_models_class_name(q->set->models, q->class_label) : NULL;
  snprintf(j->class_name, sizeof j->class_name, "%s", cn ? cn : "");
  /* proto2 presence: an unset seed is not seed 0 but a fresh one, reported back in Accepted
   * and Result so the image can be made again. */
  j->seed = s->has_seed ? s->seed : sb_fresh_seed(id);
  j->sampling = q->smp;
  j->sampling_set = q->set_mask;
  j->preview_kind = q->kind;
  int total = q->total;
  j->preview_every_tokens = s->has_preview_every_tokens ? (int)s->preview_every_tokens : 0;
  if (!j->preview_every_tokens && cfg->preview_every_tokens)
    j->preview_every_tokens = cfg->preview_every_tokens < total ? cfg->preview_every_tokens : total;
  j->preview_every_rounds = s->has_preview_every_rounds ? (int)s->preview_every_rounds : 0;
  j->progress = s->has_progress ? s->progress : 1;
  j->progress_interval =
      (s->has_progress_interval_ms ? (double)s->progress_interval_ms : cfg->progress_interval_ms) /
      1000.0;
  j->priority = q->priority;
  j->submitted_at = vs_now();
  j->deadline = s->has_deadline_ms && s->deadline_ms ? j->submitted_at + s->deadline_ms / 1000.0 : 0;
  j->lp.credit = q->credit;
  j->lp.request_id = r->has_request_id ? r->request_id : 0;
}

vs_djob *vs_submit_build(const vs_submit_ctx *c, const Vspec__Request *r, const vs_wire_msg *m,
                         uint64_t id, int *code, char *err, size_t errlen) {
  const Vspec__Submit *s = r->submit;
  const vs_daemon_config *cfg = c->cfg;
  vs_djob *j = NULL;
  char inner[VSPEC_ERRLEN];
  sb_req q;
  memset(&q, 0, sizeof q);
  *code = VSPEC__ERROR_CODE__ERR_INVALID;
  if (sb_check_strings(s, inner, sizeof inner)) {
    snprintf(err, errlen, "%s", inner);
    return NULL;
  }
  q.model = s->model && *s->model ? s->model : cfg->default_model;
  q.set = vs_model_table_acquire(c->models, q.model, inner, sizeof inner);
  if (!q.set) {
    snprintf(err, errlen, "model: %s", inner);
    return NULL;
  }
  q.in = &q.set->models->target.info;
  q.total = q.in->grid_h * q.in->grid_w;
  if (sb_method(c, s, &q, err, errlen) || sb_class(s, &q, err, errlen) ||
      sb_caption(s, r, m, &q, err, errlen) || sb_sampling(s, &q, err, errlen) ||
      sb_delivery(cfg, s, &q, err, errlen))
    goto fail;
  j = vs_djob_new(id, q.total);
  if (!j) {
    *code = vs_fail(err, errlen, VSPEC__ERROR_CODE__ERR_INTERNAL, "out of memory");
    goto fail;
  }
  if (q.caption && (*code = sb_job_caption(j, &q, err, errlen))) goto fail;
  sb_job_fill(j, cfg, r, &q, id);
  vs_model_set_release(q.set);
  return j;
fail:
  vs_model_set_release(q.set);
  if (j) vs_djob_release(j);
  return NULL;
}
