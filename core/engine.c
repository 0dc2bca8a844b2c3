#include "core/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/method.h"
#include "core/speculative.h"
#include "kernels/common/vs_philox.h"
#include "kernels/vs_kernels.h"

double vs_metrics_tpf(const vs_metrics *m) {
  return m->target_forwards ? (double)m->tokens / (double)m->target_forwards : 0.0;
}

double vs_metrics_mal(const vs_metrics *m) {
  return m->rounds ? (double)m->tokens / (double)m->rounds : 0.0;
}

double vs_metrics_accept_rate(const vs_metrics *m) {
  return m->drafted ? (double)m->accepted / (double)m->drafted : 0.0;
}

double vs_metrics_accept_at(const vs_metrics *m, int depth) {
  if (depth < 1 || depth > VS_MAX_DEPTH || !m->reached[depth]) return 0.0;
  return (double)m->accepted_at[depth] / (double)m->reached[depth];
}

void vs_metrics_add(vs_metrics *a, const vs_metrics *b) {
  a->tokens += b->tokens;
  a->target_forwards += b->target_forwards;
  a->rounds += b->rounds;
  a->drafted += b->drafted;
  a->accepted += b->accepted;
  a->siblings_tried += b->siblings_tried;
  a->draft_forwards += b->draft_forwards;
  a->tree_nodes += b->tree_nodes;
  a->residual_fallbacks += b->residual_fallbacks;
  for (int d = 0; d <= VS_MAX_DEPTH; d++) {
    a->reached[d] += b->reached[d];
    a->accepted_at[d] += b->accepted_at[d];
  }
  a->wall_s += b->wall_s;
  a->draft_s += b->draft_s;
  a->verify_s += b->verify_s;
  a->accept_s += b->accept_s;
  a->skipped_rounds += b->skipped_rounds;
  a->unverified_tokens += b->unverified_tokens;
}

static double vs__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int vs_sampling_validate(const vs_sampling *s, int vocab, char *err, size_t errlen) {
  if (!isfinite(s->temperature) || s->temperature < 0.0f || s->temperature > 100.0f) {
    snprintf(err, errlen, "temperature %g is out of range: allowed [0, 100] (0 = greedy)",
             s->temperature);
    return VSPEC_ERANGE;
  }
  if (s->top_k < 0 || s->top_k > vocab) {
    snprintf(err, errlen, "top_k %d is out of range: allowed [0, %d] (0 = off)", s->top_k, vocab);
    return VSPEC_ERANGE;
  }
  if (!isfinite(s->top_p) || s->top_p <= 0.0f || s->top_p > 1.0f) {
    snprintf(err, errlen, "top_p %g is out of range: allowed (0, 1] (1 = off)", s->top_p);
    return VSPEC_ERANGE;
  }
  if (!isfinite(s->cfg_scale) || s->cfg_scale < 0.0f || s->cfg_scale > 100.0f) {
    snprintf(err, errlen, "cfg_scale %g is out of range: allowed [0, 100] (<= 1 = no guidance)",
             s->cfg_scale);
    return VSPEC_ERANGE;
  }
  if (s->cfg_interval < -1) {
    snprintf(err, errlen, "cfg_interval %d is out of range: -1 (always) or >= 0",
             s->cfg_interval);
    return VSPEC_ERANGE;
  }
  return VSPEC_OK;
}

size_t vs_job_describe(const vs_job *job, const char *model_name, char *buf, size_t buflen) {
  const vs_sampling *s = &job->sampling;
  int n = snprintf(buf, buflen,
                   "model=%s method=%s class=%d seed=%llu temperature=%g top_k=%d top_p=%g "
                   "cfg_scale=%g cfg_interval=%d",
                   model_name ? model_name : "?", job->method ? job->method : "ar",
                   job->class_label, (unsigned long long)job->seed, s->temperature, s->top_k,
                   s->top_p, s->cfg_scale, s->cfg_interval);
  return n < 0 ? 0 : (size_t)n;
}

void vs_node_distribution(const vspec_ops *ops, vspec_dev *dev, const float *logits, int rows,
                          int vocab, int predicted_index, const vs_sampling *s, float *scratch,
                          float *probs) {
  const float *l = logits;
  int guided = predicted_index == 0 || !(s->cfg_interval > -1 && predicted_index - 1 > s->cfg_interval);
  if (rows == 2 && guided) {
    ops->cfg_combine(dev, logits, logits + vocab, (size_t)vocab, s->cfg_scale, scratch);
    l = scratch;
  }
  ops->logits_to_probs(dev, l, vocab, s->temperature, s->top_k, s->top_p, probs);
}

/* Token map and round callback of an AR step that emitted token n-1. */
static void vs__ar_report(const vs_job *job, const vs_backend_model *t, vspec_session *sess,
                          const int32_t *tokens, int n, const vs_metrics *mt) {
  if (job->status) job->status[n - 1] = VS_TOKEN_TARGET;
  if (!job->on_round) return;
  vs_round_info info = {.round = mt->rounds - 1, .n_tokens = n, .tokens = tokens,
                        .status = job->status, .target = t, .session = sess, .metrics = mt};
  job->on_round(job->user, &info);
}

static int vs__generate_ar(vs_models *models, vspec_dev *dev, const vs_job *job, int32_t *tokens,
                           vs_metrics *mt, char *err, size_t errlen) {
  const vs_backend_model *t = &models->target;
  const vspec_ops *ops = vs_dev_ops(dev);
  const vs_sampling *s = &job->sampling;
  int V = t->info.vocab, N = t->info.grid_h * t->info.grid_w;
  /* LlamaGen doubles the batch when cfg_scale > 1 and keeps it doubled throughout, even
   * for steps past cfg_interval (models.md §1.10). */
  int rows = s->cfg_scale > 1.0f ? 2 : 1;
  vspec_session_config cfg = {.struct_size = sizeof cfg,
                              .class_label = job->class_label,
                              .caption = job->caption,
                              .caption_mask = job->caption_mask,
                              .rows = rows,
                              .max_nodes = 1};
  vspec_session *sess = NULL;
  char inner[VSPEC_ERRLEN] = "";
  int rc = t->vt->session_open(t->model, dev, &cfg, &sess, inner, sizeof inner);
  if (rc) {
    snprintf(err, errlen, "%s", inner);
    return rc;
  }
  float *logits = malloc((size_t)rows * V * sizeof(float));
  float *mixed = malloc((size_t)V * sizeof(float));
  float *probs = malloc((size_t)V * sizeof(float));
  if (!logits || !mixed || !probs) {
    rc = VSPEC_ENOMEM;
    snprintf(err, errlen, "out of memory");
    goto done;
  }
  vspec_rng rng;
  vs_rng_init(&rng, job->seed, VS_STREAM_TARGET_SAMPLE);
  vspec_forward_out out = {.struct_size = sizeof out, .logits = logits, .features = NULL};
  if ((rc = t->vt->prefill(sess, &out, inner, sizeof inner))) goto backend_fail;
  mt->target_forwards++;
  vs_node_distribution(ops, dev, logits, rows, V, 0, s, mixed, probs);
  tokens[0] = ops->sample(dev, probs, V, vs_rng_uniform(&rng));
  mt->tokens++;
  mt->rounds++;
  vs__ar_report(job, t, sess, tokens, 1, mt);
  const int32_t parent = -1, node0 = 0;
  for (int i = 0; i + 1 < N; i++) {
    if (job->cancel && atomic_load(job->cancel)) {
      snprintf(err, errlen, "job cancelled");
      rc = VSPEC_ECANCELED;
      goto done;
    }
    vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = 1, .tokens = &tokens[i],
                             .parents = &parent, .features = NULL};
    /* The same time split as speculative decoding: forwards, then sampling ("walk"). */
    double tf = vs__now();
    if ((rc = t->vt->forward(sess, &b, &out, inner, sizeof inner))) goto backend_fail;
    if ((rc = t->vt->commit(sess, &node0, 1, inner, sizeof inner))) goto backend_fail;
    double ts = vs__now();
    mt->verify_s += ts - tf;
    mt->target_forwards++;
    vs_node_distribution(ops, dev, logits, rows, V, i + 1, s, mixed, probs);
    tokens[i + 1] = ops->sample(dev, probs, V, vs_rng_uniform(&rng));
    mt->accept_s += vs__now() - ts;
    mt->tokens++;
    mt->rounds++;
    vs__ar_report(job, t, sess, tokens, i + 2, mt);
  }
  goto done;
backend_fail:
  snprintf(err, errlen, "target backend: %s", inner);
done:
  free(logits);
  free(mixed);
  free(probs);
  t->vt->session_close(sess);
  return rc;
}

int vs_generate(vs_models *models, vspec_dev *dev, const vs_job *job, int32_t *tokens,
                vs_metrics *metrics, char *err, size_t errlen) {
  vs_metrics mt;
  memset(&mt, 0, sizeof mt);
  if (!models->target.model) {
    snprintf(err, errlen, "no target model loaded");
    return VSPEC_EINVAL;
  }
  if (vs_dev_ops(dev)->device != VSPEC_DEVICE_CPU) {
    snprintf(err, errlen, "the engine's sampling runs on host memory: CPU devices only for now");
    return VSPEC_ENOTSUP;
  }
  int rc = vs_sampling_validate(&job->sampling, models->target.info.vocab, err, errlen);
  if (rc) return rc;
  vs_method m;
  if ((rc = vs_method_parse(job->method ? job->method : "ar", &m, err, errlen))) return rc;
  double t0 = vs__now();
  if (m.kind == VS_METHOD_AR)
    rc = vs__generate_ar(models, dev, job, tokens, &mt, err, errlen);
  else
    rc = vs_generate_sd(models, dev, job, &m, tokens, &mt, err, errlen);
  mt.wall_s = vs__now() - t0;
  if (metrics) *metrics = mt;
  return rc;
}
