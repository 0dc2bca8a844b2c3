/*
 * core/engine.c - validates a job and hands it to the round loop (core/round_loop.c).
 */
#include "core/engine.h"

#include <stdio.h>
#include <string.h>

#include "core/method.h"
#include "core/mar_loop.h"
#include "core/round_loop.h"

size_t vs_job_describe(const vs_job *job, const char *model_name, char *buf, size_t buflen) {
  const vs_sampling *s = &job->sampling;
  int n = snprintf(buf, buflen,
                   "model=%s method=%s class=%d seed=%llu temperature=%g top_k=%d top_p=%g "
                   "cfg_scale=%g cfg_interval=%d",
                   model_name ? model_name : "?", job->method ? job->method->text : "ar",
                   job->class_label, (unsigned long long)job->seed, s->temperature, s->top_k,
                   s->top_p, s->cfg_scale, s->cfg_interval);
  if (n >= 0 && (size_t)n < buflen && job->latents) { /* continuous-token (MAR) jobs */
    char it[16] = "default";
    if (s->num_iter > 0) snprintf(it, sizeof it, "%d", s->num_iter);
    int k = snprintf(buf + n, buflen - (size_t)n, " num_iter=%s cfg_schedule=%s", it,
                     s->cfg_schedule == VS_CFG_CONSTANT ? "constant" : "linear");
    if (k > 0) n += k;
  }
  return n < 0 ? 0 : (size_t)n;
}

static int eng_continuous_only(const vs_models *m, const char *what, char *err, size_t errlen) {
  snprintf(err, errlen, "%s applies to discrete tokens; model '%s' has continuous tokens (MAR: "
           "sample with temperature, cfg_scale, num_iter and cfg_schedule)", what, m->name);
  return VSPEC_EINVAL;
}

/* MAR's sampler has no logits to filter and guides every step: refuse what it would ignore. */
static int eng_check_continuous(const vs_models *m, const vs_sampling *s, char *err,
                                size_t errlen) {
  if (s->top_k != 0) return eng_continuous_only(m, "top_k", err, errlen);
  if (s->top_p != 1.0f) return eng_continuous_only(m, "top_p", err, errlen);
  if (s->cfg_interval != -1) return eng_continuous_only(m, "cfg_interval", err, errlen);
  return VSPEC_OK;
}

int vs_generate(vs_models *models, vspec_dev *dev, const vs_job *job, int32_t *tokens,
                vs_metrics *metrics, char *err, size_t errlen) {
  vs_metrics mt;
  memset(&mt, 0, sizeof mt);
  if (!models->target.model) {
    snprintf(err, errlen, "no target model loaded");
    return VSPEC_EINVAL;
  }
  if (!dev) {
    snprintf(err, errlen, "no device to run the job on");
    return VSPEC_EINVAL;
  }
  int rc = vs_sampling_validate(&job->sampling, models->target.info.vocab, err, errlen);
  if (rc == VSPEC_ERANGE && models->target.info.token_kind == VSPEC_TOKENS_CONTINUOUS &&
      job->sampling.top_k != 0)
    rc = eng_continuous_only(models, "top_k", err, errlen);
  if (!rc && models->target.info.token_kind == VSPEC_TOKENS_CONTINUOUS)
    rc = eng_check_continuous(models, &job->sampling, err, errlen);
  if (rc) return rc;
  static const vs_method plain_ar = {.kind = VS_METHOD_AR, .text = "ar"};
  const vs_method *m = job->method ? job->method : &plain_ar;
  /* size=auto never reaches the scheduler (vs_method keeps it out of its parameters), so the
   * refusal that was the scheduler's is here */
  if (m->size == VS_METHOD_SIZE_AUTO) {
    snprintf(err, errlen, "method %s: size=auto is resolved before a job reaches the engine "
             "(vspec-bench, vspecd: core/autotune.h); a job handed to the engine directly gives "
             "depth, total_tokens or tree", m->text);
    return VSPEC_EINVAL;
  }
  double t0 = vs_now();
  if (models->target.info.token_kind == VSPEC_TOKENS_CONTINUOUS) {
    /* the ids a continuous model reports are zeros: its output is job->latents */
    if (tokens)
      memset(tokens, 0,
             (size_t)models->target.info.grid_h * models->target.info.grid_w * sizeof *tokens);
    rc = vs_mar_run(models, dev, job, m, &mt, err, errlen);
  }
  else
    rc = vs_round_loop_run(models, dev, job, m, tokens, &mt, err, errlen);
  mt.wall_s = vs_now() - t0;
  if (metrics) *metrics = mt;
  return rc;
}
