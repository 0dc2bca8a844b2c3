/*
 * Median latency of one target forward over a tree of n nodes, the cost curve that tree
 * sizes follow (DESIGN.md "Performance notes"). In core/ because size=auto (core/autotune.c)
 * measures it wherever jobs run, the daemon included; vspec-bench costcurve prints it.
 */
#include "core/forward_timing.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/metrics.h" /* vs_now */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int vs_time_forward(vspec_dev *dev, const vs_backend_model *t, int rows, int n,
                          double min_time, double *median_ms, char *err, size_t errlen) {
  const int cap = 64;
  /* The timed forward feeds token ids and reads logits: a continuous-token target has
   * neither (costcurve and size=auto refuse such models first; this is the backstop). */
  if (t->info.token_kind == VSPEC_TOKENS_CONTINUOUS || t->info.vocab <= 0) {
    snprintf(err, errlen, "forward timing over a token tree is not supported for "
             "continuous-token (MAR) models");
    return VSPEC_ENOTSUP;
  }
  vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = 0, .rows = rows,
                              .max_nodes = cap};
  vspec_session *s;
  int rc = t->vt->session_open(t->model, dev, &cfg, &s, err, errlen);
  if (rc) return rc;
  int V = t->info.vocab, N = t->info.grid_h * t->info.grid_w;
  float *logits = malloc((size_t)cap * rows * V * sizeof(float));
  if (!logits) {
    t->vt->session_close(s);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  int32_t tokens[64], parents[64], path[64];
  vspec_forward_out out = {.struct_size = sizeof out, .logits = logits};
  rc = t->vt->prefill(s, &out, err, errlen);
  /* Commit half of the image as a chain so attention sees a realistic prefix. */
  int prefix = N / 2, done = 0;
  while (!rc && done < prefix) {
    int m = prefix - done < cap ? prefix - done : cap;
    for (int i = 0; i < m; i++) {
      tokens[i] = (done + i) % V;
      parents[i] = i - 1;
      path[i] = i;
    }
    vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = m, .tokens = tokens,
                             .parents = parents};
    rc = t->vt->forward(s, &b, &out, err, errlen);
    if (!rc) rc = t->vt->commit(s, path, m, err, errlen);
    done += m;
  }
  for (int i = 0; i < n; i++) {
    tokens[i] = (7 * i) % V;
    parents[i] = i == 0 ? -1 : (i - 1) / 2;
  }
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = n, .tokens = tokens,
                           .parents = parents};
  double samples[256];
  int k = 0;
  if (!rc) rc = t->vt->forward(s, &b, &out, err, errlen); /* warm-up */
  double start = vs_now();
  while (!rc && k < 256 && (k < 3 || vs_now() - start < min_time)) {
    double t0 = vs_now();
    rc = t->vt->forward(s, &b, &out, err, errlen);
    samples[k++] = vs_now() - t0;
  }
  if (!rc) {
    qsort(samples, (size_t)k, sizeof samples[0], cmp_double);
    *median_ms = 1e3 * (k % 2 ? samples[k / 2] : 0.5 * (samples[k / 2 - 1] + samples[k / 2]));
  }
  free(logits);
  t->vt->session_close(s);
  return rc;
}

