/*
 * kernels/cpu/cpu_sampling.c - the distribution ops of the CPU device: the host
 * implementations of kernels/host/ on device (= host) memory, with the device's scratch
 * arena as their work space.
 */
#include <string.h>

#include "kernels/cpu/cpu_dev.h"
#include "kernels/host/host_math.h"

void vs_cpu_softmax(vspec_dev *dev, float *x, int rows, int n) {
  VS_CPU_UNRECORDED(dev, "softmax");
  vs_host_softmax(x, rows, n);
}

void vs_cpu_log_softmax(vspec_dev *dev, float *x, int rows, int n) {
  VS_CPU_UNRECORDED(dev, "log_softmax");
  vs_host_log_softmax(x, rows, n);
}

int vs_cpu_argmax(vspec_dev *dev, const float *x, int n) {
  VS_CPU_UNRECORDED_RC(dev, "argmax", -1);
  return vs_host_argmax(x, n);
}

int vs_cpu_logits_to_probs(vspec_dev *dev, const float *logits, int n, float temperature,
                           int top_k, float top_p, float *probs) {
  VS_CPU_UNRECORDED_RC(dev, "logits_to_probs", 0);
  /* Only top-k and top-p need the work space; the scratch arena is not touched otherwise. */
  void *work = NULL;
  if (n > 0 && ((top_k > 0 && top_k < n) || top_p < 1.0f))
    work = vs_scratch(dev, vs_host_probs_work_bytes(n));
  return vs_host_logits_to_probs(logits, n, temperature, top_k, top_p, probs, work);
}

int vs_cpu_sample(vspec_dev *dev, const float *probs, int n, double u) {
  VS_CPU_UNRECORDED_RC(dev, "sample", -1);
  return vs_host_sample(probs, n, u);
}

/* The engine's host sampler, node by node (core/sampling.c: vs_node_distribution, then
 * vs_draw or, greedy, the first maximum of the one-hot), so the tokens are those it draws. */
void vs_cpu_sample_tokens(vspec_dev *dev, const float *logits, const vspec_sample_spec *spec,
                          int32_t *tokens) {
  int V = spec->vocab;
  if (spec->n <= 0 || V <= 0) return;
  size_t row = vs_host_align_up((size_t)V * sizeof(float));
  unsigned char *s = vs_scratch(dev, 2 * row + vs_host_probs_work_bytes(V));
  float *mixed = (float *)(void *)s, *probs = (float *)(void *)(s + row);
  void *work = s + 2 * row;
  for (int i = 0; i < spec->n; i++) {
    const float *l = logits + (size_t)i * spec->rows * V;
    if (spec->rows == 2 && (!spec->guided || spec->guided[i])) {
      vs_host_cfg_combine(l, l + V, (size_t)V, spec->cfg_scale, mixed);
      l = mixed;
    }
    vs_host_logits_to_probs(l, V, spec->temperature, spec->top_k, spec->top_p, probs, work);
    if (spec->temperature > 0.0f) {
      tokens[i] = vs_host_sample(probs, V, spec->u[i]);
      continue;
    }
    int best = 0; /* plain comparisons, as the engine's vs_argmax_first */
    for (int k = 1; k < V; k++)
      if (probs[k] > probs[best]) best = k;
    tokens[i] = best;
  }
}

/* sample_tokens that keeps each node's distribution (ABI 1.8): the rows the engine's chain
 * drafter computes with vs_node_distribution, and its token as the drafter takes it
 * (core/draft_tree.c: vs_draw at u, or the first maximum, vs_argmax_first). */
void vs_cpu_draw_probs(vspec_dev *dev, const float *logits, const vspec_sample_spec *spec,
                       float *probs, int32_t *tokens) {
  int V = spec->vocab;
  if (spec->n <= 0 || V <= 0) return;
  size_t row = vs_host_align_up((size_t)V * sizeof(float));
  unsigned char *s = vs_scratch(dev, row + vs_host_probs_work_bytes(V));
  float *mixed = (float *)(void *)s;
  void *work = s + row;
  for (int i = 0; i < spec->n; i++) {
    const float *l = logits + (size_t)i * spec->rows * V;
    float *p = probs + (size_t)i * V;
    if (spec->rows == 2 && (!spec->guided || spec->guided[i])) {
      vs_host_cfg_combine(l, l + V, (size_t)V, spec->cfg_scale, mixed);
      l = mixed;
    }
    vs_host_logits_to_probs(l, V, spec->temperature, spec->top_k, spec->top_p, p, work);
    int best = 0;
    if (spec->u) {
      best = vs_host_sample(p, V, spec->u[i]);
    } else {
      for (int k = 1; k < V; k++)
        if (p[k] > p[best]) best = k;
    }
    if (best < 0) { /* no mass: a zero row and a token a forward can be fed */
      memset(p, 0, (size_t)V * sizeof(float));
      best = 0;
    }
    tokens[i] = best;
  }
}

/* A tree's children drawn from draw_probs' rows without replacement (ABI 1.10): the engine's
 * host drafter step for step (core/draft_tree.c, dt_sample_children: vs_draw over the row with
 * the earlier children zeroed, unnormalised, a uniform a child while the row has mass; greedy,
 * u NULL: the first maximum of what is left), with the children it does not add marked
 * absent. */
void vs_cpu_draw_children(vspec_dev *dev, const float *probs, const vspec_children_spec *spec,
                          int32_t *tokens) {
  VS_CPU_UNRECORDED(dev, "draw_children");
  int V = spec->vocab;
  if (spec->n <= 0 || V <= 0) return;
  float *w = vs_scratch(dev, (size_t)V * sizeof(float));
  for (int i = 0; i < spec->n; i++) {
    int32_t *out = tokens + spec->first[i];
    uint8_t *drawn = spec->drawn + spec->first[i];
    int live = spec->node[i] < 0 || spec->drawn[spec->node[i]];
    memcpy(w, probs + (size_t)i * V, (size_t)V * sizeof(float));
    for (int j = 0; j < spec->counts[i]; j++) {
      int x = -1;
      if (live && j < VSPEC_CHILDREN_MAX && spec->u) {
        x = vs_host_sample(w, V, spec->u[*spec->cursor]);
      } else if (live && j < VSPEC_CHILDREN_MAX) { /* greedy: vs_argmax_first of what is left */
        int best = 0;
        for (int k = 1; k < V; k++)
          if (w[k] > w[best]) best = k;
        x = w[best] > 0.0f ? best : -1;
      }
      live = x >= 0;
      if (spec->u) *spec->cursor += live;
      drawn[j] = (uint8_t)live;
      out[j] = live ? x : j > 0 && drawn[0] ? out[0] : 0;
      if (live) w[x] = 0.0f;
    }
  }
}
