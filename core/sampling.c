#include "core/sampling.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/host/host_math.h"

int vs_sampler_init(vs_sampler *s, int vocab) {
  s->vocab = vocab;
  s->mixed = malloc((size_t)(vocab > 0 ? vocab : 1) * sizeof(float));
  s->work = malloc(vs_host_probs_work_bytes(vocab > 0 ? vocab : 1));
  if (s->mixed && s->work) return VSPEC_OK;
  vs_sampler_free(s);
  return VSPEC_ENOMEM;
}

void vs_sampler_free(vs_sampler *s) {
  free(s->mixed);
  free(s->work);
  s->mixed = NULL;
  s->work = NULL;
}

void vs_node_distribution(vs_sampler *sp, const float *logits, int rows, int predicted_index,
                          const vs_sampling *s, float *probs) {
  int vocab = sp->vocab;
  const float *l = logits;
  if (rows == 2 && vs_cfg_guided(s, predicted_index)) {
    vs_host_cfg_combine(logits, logits + vocab, (size_t)vocab, s->cfg_scale, sp->mixed);
    l = sp->mixed;
  }
  vs_host_logits_to_probs(l, vocab, s->temperature, s->top_k, s->top_p, probs, sp->work);
}

int vs_cfg_guided(const vs_sampling *s, int predicted_index) {
  return predicted_index == 0 || !(s->cfg_interval > -1 && predicted_index - 1 > s->cfg_interval);
}

void vs_sample_spec_one(const vs_sampling *s, int rows, int vocab, int predicted_index,
                        uint8_t *guided, double *u, vspec_sample_spec *spec) {
  *guided = (uint8_t)vs_cfg_guided(s, predicted_index);
  *spec = (vspec_sample_spec){.n = 1, .rows = rows, .vocab = vocab, .top_k = s->top_k,
                              .cfg_scale = s->cfg_scale, .temperature = s->temperature,
                              .top_p = s->top_p, .guided = guided, .u = u};
}

int vs_draw(const float *probs, int n, double u) { return vs_host_sample(probs, n, u); }

/* Unlike vs_host_argmax this compares plainly (a NaN first entry stays the answer), as the
 * walk and the drafters always have. */
int32_t vs_argmax_first(const float *p, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; i++)
    if (p[i] > p[best]) best = i;
  return best;
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
