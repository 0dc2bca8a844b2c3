/*
 * bench/eval_bootstrap.c - bootstrap intervals of eval's figures (see eval_bootstrap.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/eval_bootstrap.h"
#include "bench/quality.h"
#include "vspec/types.h"

enum { ST_FID, ST_ACC, ST_SPEEDUP, ST_FID_RATIO, ST_ACC_DIFF, ST_COUNT };

typedef struct boot_ctx {
  const vs_quality *q;
  const vs_eval_sample *m;
  int n_methods, ar, d, ncls;
  const int32_t *labels;
  float *feat;    /* one resample's features [n, d] */
  double *ratios; /* [n] */
  double *fid, *acc;
  char *err;
  size_t errlen;
} boot_ctx;

static double resample_acc(const boot_ctx *c, const vs_eval_sample *s, const int *idx, int n) {
  if (!s->logits || !c->labels) return NAN;
  int right = 0;
  for (int i = 0; i < n; i++) {
    const float *l = s->logits + (size_t)idx[i] * c->ncls;
    int best = 0;
    for (int k = 1; k < c->ncls; k++)
      if (l[k] > l[best]) best = k;
    right += best == c->labels[idx[i]];
  }
  return (double)right / n;
}

static int resample_stats(void *ctx, const int *idx, int n, double *out) {
  boot_ctx *c = ctx;
  for (int j = 0; j < c->n_methods; j++) {
    const vs_eval_sample *s = &c->m[j];
    c->fid[j] = NAN;
    if (s->feat) {
      for (int i = 0; i < n; i++)
        memcpy(c->feat + (size_t)i * c->d, s->feat + (size_t)idx[i] * c->d, sizeof(float) * c->d);
      int rc = vs_quality_fid_features(c->q, c->feat, n, &c->fid[j], c->err, c->errlen);
      if (rc) return rc;
    }
    c->acc[j] = resample_acc(c, s, idx, n);
  }
  for (int j = 0; j < c->n_methods; j++) {
    double *o = out + (size_t)j * ST_COUNT;
    o[ST_FID] = c->fid[j];
    o[ST_ACC] = c->acc[j];
    o[ST_SPEEDUP] = o[ST_FID_RATIO] = o[ST_ACC_DIFF] = NAN;
    if (c->ar < 0) continue;
    for (int i = 0; i < n; i++) c->ratios[i] = c->m[c->ar].times[idx[i]] / c->m[j].times[idx[i]];
    o[ST_SPEEDUP] = vs_quantile(c->ratios, n, 0.5);
    o[ST_FID_RATIO] = c->fid[j] / c->fid[c->ar];
    o[ST_ACC_DIFF] = c->acc[j] - c->acc[c->ar];
  }
  return VSPEC_OK;
}

/* FID and its ratios are >= 0, an accuracy in [0, 1] and a difference of two in [-1, 1]:
 * the normal, basic and shifted intervals can reach past those bounds at small n, where no
 * truth lies (cutting there keeps the coverage). */
static vs_interval within(vs_interval v, double lo, double hi) {
  if (v.lo < lo) v.lo = lo;
  if (v.hi > hi) v.hi = hi;
  return v;
}

void vs_eval_ci_clear(vs_eval_ci *ci) {
  for (int k = 0; k < VS_CI_KINDS; k++) {
    vs_interval none = {NAN, NAN};
    ci->fid[k] = ci->class_acc[k] = ci->speedup[k] = none;
    ci->fid_ratio_ar[k] = ci->acc_diff_ar[k] = none;
  }
}

int vs_eval_bootstrap(const vs_quality *q, const vs_eval_sample *m, int n_methods, int ar,
                      int images, const int32_t *labels, const vs_bootstrap_opts *o,
                      vs_eval_ci *out, char *err, size_t errlen) {
  boot_ctx c = {.q = q, .m = m, .n_methods = n_methods, .ar = ar, .labels = labels, .err = err,
                .errlen = errlen};
  if (q) vs_quality_dims(q, &c.d, &c.ncls);
  c.feat = malloc(sizeof(float) * (size_t)images * (c.d ? c.d : 1));
  c.ratios = malloc(sizeof(double) * (size_t)images);
  c.fid = malloc(sizeof(double) * (size_t)n_methods);
  c.acc = malloc(sizeof(double) * (size_t)n_methods);
  vs_interval *iv = malloc(sizeof *iv * (size_t)n_methods * ST_COUNT * VS_CI_KINDS);
  int rc = c.feat && c.ratios && c.fid && c.acc && iv ? VSPEC_OK : VSPEC_ENOMEM;
  if (rc) snprintf(err, errlen, "bootstrap: out of memory");
  if (!rc) rc = vs_bootstrap_intervals(images, n_methods * ST_COUNT, resample_stats, &c, o, iv);
  for (int j = 0; !rc && j < n_methods; j++)
    for (int k = 0; k < VS_CI_KINDS; k++) {
      const vs_interval *v = iv + (size_t)j * ST_COUNT * VS_CI_KINDS + k;
      out[j].fid[k] = within(v[ST_FID * VS_CI_KINDS], 0, INFINITY);
      out[j].class_acc[k] = within(v[ST_ACC * VS_CI_KINDS], 0, 1);
      out[j].speedup[k] = v[ST_SPEEDUP * VS_CI_KINDS];
      out[j].fid_ratio_ar[k] = within(v[ST_FID_RATIO * VS_CI_KINDS], 0, INFINITY);
      out[j].acc_diff_ar[k] = within(v[ST_ACC_DIFF * VS_CI_KINDS], -1, 1);
    }
  free(c.feat);
  free(c.ratios);
  free(c.fid);
  free(c.acc);
  free(iv);
  return rc;
}
