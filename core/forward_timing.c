/*
 * Median latency of one target forward over a tree of n nodes, the cost curve that tree
 * sizes follow (DESIGN.md "Performance notes"). In core/ because size=auto (core/autotune.c)
 * measures it wherever jobs run, the daemon included; vspec-bench costcurve prints it.
 */
#include "core/forward_timing.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/metrics.h" /* vs_now */
#include "core/status.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of k > 0 samples in seconds, in ms (the samples sorted in place). */
static double ft_median_ms(double *samples, int k) {
  qsort(samples, (size_t)k, sizeof samples[0], cmp_double);
  return 1e3 * (k % 2 ? samples[k / 2] : 0.5 * (samples[k / 2 - 1] + samples[k / 2]));
}

/* A session of t after its prefill and, with `prefix`, a committed half-image prefix
 * (attention then sees a realistic cache), with a binary tree of n nodes in *b; logits
 * [64, rows, V] in *logits. */
typedef struct vs__probe {
  vspec_session *s;
  float *logits;
  int32_t tokens[64], parents[64];
  vspec_forward_batch b;
  vspec_forward_out out;
} vs__probe;

static void ft_probe_close(const vs_backend_model *t, vs__probe *p) {
  free(p->logits);
  if (p->s) t->vt->session_close(p->s);
}

static int ft_probe_open(vspec_dev *dev, const vs_backend_model *t, int rows, int n,
                          int prefix_wanted, vs__probe *p, char *err, size_t errlen) {
  const int cap = 64;
  memset(p, 0, sizeof *p);
  /* The timed forward feeds token ids and reads logits: a continuous-token target has
   * neither (costcurve and size=auto refuse such models first; this is the backstop). */
  if (t->info.token_kind == VSPEC_TOKENS_CONTINUOUS || t->info.vocab <= 0)
    return vs_fail(err, errlen, VSPEC_ENOTSUP, "forward timing over a token tree is not "
                   "supported for continuous-token (MAR) models");
  if (n < 1 || n > cap)
    return vs_fail(err, errlen, VSPEC_EINVAL, "forward timing: %d nodes (1..%d)", n, cap);
  vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = 0, .rows = rows,
                              .max_nodes = cap};
  int rc = t->vt->session_open(t->model, dev, &cfg, &p->s, err, errlen);
  if (rc) return rc;
  int V = t->info.vocab, N = t->info.grid_h * t->info.grid_w;
  p->logits = malloc((size_t)cap * rows * V * sizeof(float));
  if (!p->logits) {
    ft_probe_close(t, p);
    return vs_fail(err, errlen, VSPEC_ENOMEM, "out of memory");
  }
  int32_t path[64];
  p->out = (vspec_forward_out){.struct_size = sizeof p->out, .logits = p->logits};
  rc = t->vt->prefill(p->s, &p->out, err, errlen);
  /* Commit half of the image as a chain so attention sees a realistic prefix. */
  int prefix = prefix_wanted ? N / 2 : 0, done = 0;
  while (!rc && done < prefix) {
    int m = prefix - done < cap ? prefix - done : cap;
    for (int i = 0; i < m; i++) {
      p->tokens[i] = (done + i) % V;
      p->parents[i] = i - 1;
      path[i] = i;
    }
    vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = m, .tokens = p->tokens,
                             .parents = p->parents};
    rc = t->vt->forward(p->s, &b, &p->out, err, errlen);
    if (!rc) rc = t->vt->commit(p->s, path, m, err, errlen);
    done += m;
  }
  for (int i = 0; i < n; i++) {
    p->tokens[i] = (7 * i) % V;
    p->parents[i] = i == 0 ? -1 : (i - 1) / 2;
  }
  p->b = (vspec_forward_batch){.struct_size = sizeof p->b, .n_nodes = n, .tokens = p->tokens,
                               .parents = p->parents};
  if (rc) ft_probe_close(t, p);
  return rc;
}

int vs_time_forward(vspec_dev *dev, const vs_backend_model *t, int rows, int n,
                    double min_time, double *median_ms, char *err, size_t errlen) {
  return vs_time_forward_clock(dev, t, rows, n, min_time, NULL, median_ms, err, errlen);
}

int vs_time_forward_clock(vspec_dev *dev, const vs_backend_model *t, int rows, int n,
                          double min_time, double (*clock)(void), double *median_ms, char *err,
                          size_t errlen) {
  if (!clock) clock = vs_now;
  vs__probe p;
  int rc = ft_probe_open(dev, t, rows, n, 1, &p, err, errlen);
  if (rc) return rc;
  double samples[256];
  int k = 0;
  rc = t->vt->forward(p.s, &p.b, &p.out, err, errlen); /* warm-up */
  double start = vs_now();
  while (!rc && k < 256 && (k < 3 || vs_now() - start < min_time)) {
    double t0 = clock();
    rc = t->vt->forward(p.s, &p.b, &p.out, err, errlen);
    samples[k++] = clock() - t0;
  }
  if (!rc) *median_ms = ft_median_ms(samples, k);
  ft_probe_close(t, &p);
  return rc;
}

int vs_count_forward(vspec_dev *dev, const vs_backend_model *t, int rows, int n,
                     vs_dev_counters *out, char *err, size_t errlen) {
  /* What a forward issues does not depend on the cache's length: no prefix to pay for. */
  vs__probe p;
  int rc = ft_probe_open(dev, t, rows, n, 0, &p, err, errlen);
  if (rc) return rc;
  vs_dev_counters before;
  vs_dev_counters_get(dev, &before);
  rc = t->vt->forward(p.s, &p.b, &p.out, err, errlen);
  vs_dev_counters_get(dev, out);
  vs_dev_counters_sub(out, &before);
  ft_probe_close(t, &p);
  return rc;
}

int vs_time_forward_multi(vspec_dev *dev, const vs_backend_model *t, int sessions, int rows,
                          double min_time, double *median_ms, char *err, size_t errlen) {
  if (!VSPEC_HAS_FIELD(t->vt, vspec_backend_vtable, forward_multi) || !t->vt->forward_multi) {
    return vs_fail(err, errlen, VSPEC_ENOTSUP,
                   "the model's backend has no batched forward (forward_multi)");
  }
  if (sessions < 1 || sessions > VS_TIME_MULTI_MAX) {
    return vs_fail(err, errlen, VSPEC_EINVAL, "forward timing: %d sessions in a batch (1..%d)",
                   sessions, VS_TIME_MULTI_MAX);
  }
  vs__probe p[VS_TIME_MULTI_MAX];
  vspec_session *ss[VS_TIME_MULTI_MAX];
  const vspec_forward_batch *bs[VS_TIME_MULTI_MAX];
  vspec_forward_out *outs[VS_TIME_MULTI_MAX];
  int opened = 0, rc = VSPEC_OK;
  for (; opened < sessions && !rc; opened++) {
    rc = ft_probe_open(dev, t, rows, 1, 1, &p[opened], err, errlen);
    if (rc) break;
    ss[opened] = p[opened].s, bs[opened] = &p[opened].b, outs[opened] = &p[opened].out;
  }
  double samples[256];
  int k = 0;
  /* two warm-ups: a backend may record a batch shape's graph the second time it comes */
  for (int w = 0; w < 2 && !rc; w++)
    rc = t->vt->forward_multi(dev, ss, bs, outs, sessions, err, errlen);
  double start = vs_now();
  while (!rc && k < 256 && (k < 3 || vs_now() - start < min_time)) {
    double t0 = vs_now();
    rc = t->vt->forward_multi(dev, ss, bs, outs, sessions, err, errlen);
    samples[k++] = vs_now() - t0;
  }
  if (!rc) *median_ms = ft_median_ms(samples, k);
  for (int i = 0; i < opened; i++) ft_probe_close(t, &p[i]);
  return rc;
}
