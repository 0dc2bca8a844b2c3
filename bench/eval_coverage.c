/*
 * bench/eval_coverage.c - coverage of eval's intervals on AR against AR (see
 * eval_coverage.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/eval_bootstrap.h"
#include "bench/eval_coverage.h"
#include "bench/kid.h"
#include "vspec/types.h"

#define COV_MAGIC "VSCOVER1"

/* The cache's header: a file made with other settings is not reused. */
typedef struct cov_header {
  char magic[8];
  int32_t images, d, ncls, classes;
  uint64_t seed;
  float cfg_scale, temperature;
  char model[64];
} cov_header;

typedef struct cov_sets {
  int n_sets, images, d, ncls;
  float *feat;   /* [n_sets, images, d] */
  float *logits; /* [n_sets, images, ncls] */
} cov_sets;

static cov_header header_of(const vs_coverage_opts *o, int d, int ncls) {
  cov_header h;
  memset(&h, 0, sizeof h);
  memcpy(h.magic, COV_MAGIC, 8);
  h.images = o->images;
  h.d = d;
  h.ncls = ncls;
  h.classes = o->classes;
  h.seed = o->seed;
  h.cfg_scale = o->sampling.cfg_scale;
  h.temperature = o->sampling.temperature;
  snprintf(h.model, sizeof h.model, "%s", o->models->name);
  return h;
}

/* Reads the complete sets of a matching cache file; 0 when there is none or it differs. */
static int cache_read(const char *path, const cov_header *want, cov_sets *s) {
  FILE *f = path ? fopen(path, "rb") : NULL;
  if (!f) return 0;
  cov_header h;
  int got = 0;
  size_t nf = (size_t)s->images * s->d, nl = (size_t)s->images * s->ncls;
  if (fread(&h, sizeof h, 1, f) == 1 && memcmp(&h, want, sizeof h) == 0)
    while (got < s->n_sets && fread(s->feat + got * nf, sizeof(float), nf, f) == nf &&
           fread(s->logits + got * nl, sizeof(float), nl, f) == nl)
      got++;
  fclose(f);
  return got;
}

/* Rewrites the cache with the first `sets` sets (header, then per set features, logits). */
static void cache_write(const char *path, const cov_header *h, const cov_sets *s, int sets) {
  if (!path) return;
  char tmp[1200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) return;
  size_t nf = (size_t)s->images * s->d, nl = (size_t)s->images * s->ncls;
  int ok = fwrite(h, sizeof *h, 1, f) == 1;
  for (int k = 0; ok && k < sets; k++)
    ok = fwrite(s->feat + k * nf, sizeof(float), nf, f) == nf &&
         fwrite(s->logits + k * nl, sizeof(float), nl, f) == nl;
  if (fclose(f) == 0 && ok) rename(tmp, path);
  else remove(tmp);
}

/* Generates set k with AR and computes its features and logits. */
static int make_set(const vs_coverage_opts *o, cov_sets *s, int k, uint8_t *rgb,
                    vs_bench_grid *grid, char *err, size_t errlen) {
  const vs_backend_model *t = &o->models->target;
  size_t npix = (size_t)t->info.image_h * t->info.image_w * 3;
  for (int i = 0; i < o->images; i++) {
    vs_job job = {.method = NULL /* ar */, .class_label = i % o->classes,
                  .seed = o->seed + (uint64_t)k * o->images + (uint64_t)i,
                  .sampling = o->sampling};
    vs_metrics mt;
    int rc = vs_bench_generate(o->models, o->dev, &job, grid, &mt, err, errlen);
    if (!rc)
      rc = vs_models_decode(o->models, o->dev, grid->tokens, grid->latents, rgb + i * npix, err,
                            errlen);
    if (rc) return rc;
  }
  return vs_quality_features(o->q, rgb, o->images, s->feat + (size_t)k * o->images * s->d,
                             s->logits + (size_t)k * o->images * s->ncls, err, errlen);
}

static int vs_coverage_report(const vs_coverage_opts *o, const cov_sets *s, FILE *out,
                              char *err, size_t errlen);

int vs_eval_coverage(const vs_coverage_opts *o, FILE *out, char *err, size_t errlen) {
  cov_sets s = {.n_sets = 2 * o->pairs, .images = o->images};
  vs_quality_dims(o->q, &s.d, &s.ncls);
  const vs_backend_model *t = &o->models->target;
  size_t npix = (size_t)t->info.image_h * t->info.image_w * 3;
  s.feat = malloc(sizeof(float) * (size_t)s.n_sets * o->images * s.d);
  s.logits = malloc(sizeof(float) * (size_t)s.n_sets * o->images * s.ncls);
  uint8_t *rgb = malloc(npix * (size_t)o->images);
  vs_bench_grid grid = {0};
  int rc = s.feat && s.logits && rgb ? VSPEC_OK : VSPEC_ENOMEM;
  if (rc) snprintf(err, errlen, "coverage: out of memory");
  if (!rc) rc = vs_bench_grid_alloc(&grid, o->models, err, errlen);
  cov_header h = header_of(o, s.d, s.ncls);
  int have = rc ? 0 : cache_read(o->cache, &h, &s);
  if (!rc && have)
    fprintf(stderr, "coverage: %d of %d sets from %s\n", have, s.n_sets, o->cache);
  double t0 = vs_bench_now();
  for (int k = have; !rc && k < s.n_sets; k++) {
    rc = make_set(o, &s, k, rgb, &grid, err, errlen);
    if (rc) break;
    cache_write(o->cache, &h, &s, k + 1);
    double per = (vs_bench_now() - t0) / ((double)(k + 1 - have) * o->images);
    fprintf(stderr, "coverage: set %d/%d (%.3f s per image, %.0f s left)\n", k + 1, s.n_sets,
            per, per * o->images * (s.n_sets - k - 1));
  }
  if (!rc) rc = vs_coverage_report(o, &s, out, err, errlen);
  vs_bench_grid_free(&grid);
  free(rgb);
  free(s.feat);
  free(s.logits);
  return rc;
}

/* Coverage counts of one figure: hits[kind] of n intervals contain the truth, est[kind] of
 * them contain their own estimate; width[kind] sums their widths; sum and sq the estimates'
 * sum and sum of squares (their spread is what a 95 % interval's width / 3.92 should be). */
typedef struct cov_count {
  int n, hits[VS_CI_KINDS], est[VS_CI_KINDS];
  double width[VS_CI_KINDS], sum, sq;
} cov_count;

static int inside(vs_interval v, double x) { return v.lo <= x && x <= v.hi; }

static void count(cov_count *c, const vs_interval *v, int kinds, double truth, double estimate) {
  c->n++;
  c->sum += estimate;
  c->sq += estimate * estimate;
  for (int k = 0; k < kinds; k++) {
    c->hits[k] += inside(v[k], truth);
    c->est[k] += inside(v[k], estimate);
    c->width[k] += v[k].hi - v[k].lo;
  }
}

enum { F_RATIO, F_ACC, F_KID_DIFF, F_FID, F_KID, F_COUNT };

static void print_row(FILE *out, const char *name, const cov_count *c, int kid) {
  fprintf(out, "| %s |", name);
  for (int k = 0; k < VS_CI_KINDS; k++) {
    /* KID's interval is its estimate -/+ z se: a normal interval, no bootstrap */
    if (kid && k != VS_CI_NORMAL) fprintf(out, " - |");
    else
      fprintf(out, " %.2f (%d/%d; %.0f%%; w %.3g) |", (double)c->hits[k] / c->n, c->hits[k],
              c->n, 100.0 * c->est[k] / c->n, c->width[k] / c->n);
  }
  double var = c->n > 1 ? (c->sq - c->sum * c->sum / c->n) / (c->n - 1) : NAN;
  fprintf(out, " %.3g |\n", var > 0 ? 3.92 * sqrt(var) : 0.0);
}

/* The KID of every set (its interval: -/+ z se). */
static int all_kids(const vs_coverage_opts *o, const cov_sets *s, vs_kid *kid, char *err,
                    size_t errlen) {
  const float *ref;
  int n_ref;
  vs_quality_ref_features(o->q, &ref, &n_ref);
  vs_kid_ref *r;
  int rc = vs_kid_ref_open(ref, n_ref, s->d, NULL, &r, err, errlen);
  for (int k = 0; !rc && k < s->n_sets; k++)
    rc = vs_kid_compute(r, s->feat + (size_t)k * s->images * s->d, s->images, &kid[k], err,
                        errlen);
  vs_kid_ref_close(r);
  return rc;
}

/* Set 2p against set 2p + 1 as eval compares a method with AR. */
static int pair_intervals(const vs_coverage_opts *o, const cov_sets *s, int p,
                          const int32_t *labels, const double *times, vs_eval_ci ci[2],
                          double fid[2], char *err, size_t errlen) {
  vs_eval_sample m[2];
  for (int j = 0; j < 2; j++) {
    size_t k = (size_t)2 * p + j;
    m[j] = (vs_eval_sample){.feat = s->feat + k * s->images * s->d,
                            .logits = s->logits + k * s->images * s->ncls, .times = times};
  }
  /* the resamples' seed follows the pair's first image seed: a run split over seed ranges
   * (--seed S, with its own cache) computes the same intervals as one run */
  vs_bootstrap_opts bo = {.resamples = o->resamples, .level = 0.95,
                          .seed = 20261123u + o->seed + (uint64_t)2 * p * o->images};
  int rc = vs_eval_bootstrap(o->q, m, 2, 1, s->images, labels, &bo, ci, err, errlen);
  for (int j = 0; !rc && j < 2; j++)
    rc = vs_quality_fid_features(o->q, m[j].feat, s->images, &fid[j], err, errlen);
  return rc;
}

static double accuracy(const cov_sets *s, int k, const int32_t *labels) {
  int right = 0;
  for (int i = 0; i < s->images; i++) {
    const float *l = s->logits + ((size_t)k * s->images + i) * s->ncls;
    int best = 0;
    for (int c = 1; c < s->ncls; c++)
      if (l[c] > l[best]) best = c;
    right += best == labels[i];
  }
  return (double)right / s->images;
}

static void print_table(FILE *out, const vs_coverage_opts *o, const cov_count *c,
                        double mean_fid, double mean_kid) {
  fprintf(out, "\nCoverage of eval's 95 %% intervals: %d pairs of disjoint sets of %d AR images "
               "(%d bootstrap resamples). Cell: coverage (hits/intervals; share containing "
               "their estimate; mean width). Last column: the width a 95 %% interval would "
               "have from the estimates' spread across the sets.\n\n| figure (truth) |",
          o->pairs, o->images, o->resamples);
  for (int k = 0; k < VS_CI_KINDS; k++) fprintf(out, " %s |", vs_ci_kind_name(k));
  fprintf(out, " 3.92 sd of the estimates |\n|---|");
  for (int k = 0; k <= VS_CI_KINDS; k++) fprintf(out, "---:|");
  fprintf(out, "\n");
  print_row(out, "FID / AR (1)", &c[F_RATIO], 0);
  print_row(out, "class acc - AR (0)", &c[F_ACC], 0);
  print_row(out, "KID - AR (0)", &c[F_KID_DIFF], 1);
  char name[96];
  snprintf(name, sizeof name, "FID of a set (mean of all sets, %.4g)", mean_fid);
  print_row(out, name, &c[F_FID], 0);
  snprintf(name, sizeof name, "KID of a set (mean of all sets, %.3g)", mean_kid);
  print_row(out, name, &c[F_KID], 1);
  fprintf(out, "\neval prints the %s interval for FID and FID / AR, the %s interval for "
               "class accuracy and the %s interval for speed-up (bench/eval_bootstrap.h); KID "
               "-/+ 1.96 standard errors.\n", vs_ci_kind_name(VS_EVAL_CI_FID),
          vs_ci_kind_name(VS_EVAL_CI_ACC), vs_ci_kind_name(VS_EVAL_CI_SPEEDUP));
}

static int vs_coverage_report(const vs_coverage_opts *o, const cov_sets *s, FILE *out,
                              char *err, size_t errlen) {
  int n = s->images;
  int32_t *labels = malloc(sizeof *labels * (size_t)n);
  double *times = malloc(sizeof *times * (size_t)n);
  double *fid = malloc(sizeof *fid * (size_t)s->n_sets);
  vs_kid *kid = malloc(sizeof *kid * (size_t)s->n_sets);
  vs_eval_ci *ci = malloc(sizeof *ci * (size_t)s->n_sets);
  cov_count c[F_COUNT];
  memset(c, 0, sizeof c);
  int rc = labels && times && fid && kid && ci ? VSPEC_OK : VSPEC_ENOMEM;
  if (rc) snprintf(err, errlen, "coverage: out of memory");
  for (int i = 0; !rc && i < n; i++) labels[i] = i % o->classes, times[i] = 1;
  double t0 = vs_bench_now();
  if (!rc) rc = all_kids(o, s, kid, err, errlen);
  for (int p = 0; !rc && p < o->pairs; p++)
    rc = pair_intervals(o, s, p, labels, times, ci + 2 * p, fid + 2 * p, err, errlen);
  double mean_fid = 0, mean_kid = 0, z = vs_normal_quantile(0.975);
  for (int k = 0; !rc && k < s->n_sets; k++) {
    mean_fid += fid[k] / s->n_sets;
    mean_kid += kid[k].kid / s->n_sets;
  }
  for (int p = 0; !rc && p < o->pairs; p++) {
    const vs_kid *a = &kid[2 * p], *b = &kid[2 * p + 1];
    double acc_diff = accuracy(s, 2 * p, labels) - accuracy(s, 2 * p + 1, labels);
    double d = a->kid - b->kid, dse = vs_kid_diff_se(a, b);
    vs_interval kv[VS_CI_KINDS];
    for (int k = 0; k < VS_CI_KINDS; k++) kv[k] = (vs_interval){d - z * dse, d + z * dse};
    count(&c[F_RATIO], ci[2 * p].fid_ratio_ar, VS_CI_KINDS, 1, fid[2 * p] / fid[2 * p + 1]);
    count(&c[F_ACC], ci[2 * p].acc_diff_ar, VS_CI_KINDS, 0, acc_diff);
    count(&c[F_KID_DIFF], kv, VS_CI_KINDS, 0, d);
    for (int j = 0; j < 2; j++) {
      const vs_kid *e = &kid[2 * p + j];
      count(&c[F_FID], ci[2 * p + j].fid, VS_CI_KINDS, mean_fid, fid[2 * p + j]);
      for (int k = 0; k < VS_CI_KINDS; k++)
        kv[k] = (vs_interval){e->kid - z * e->se, e->kid + z * e->se};
      count(&c[F_KID], kv, VS_CI_KINDS, mean_kid, e->kid);
    }
  }
  if (!rc) {
    fprintf(stderr, "coverage: intervals of %d pairs in %.1f s\n", o->pairs, vs_bench_now() - t0);
    print_table(out, o, c, mean_fid, mean_kid);
  }
  free(labels);
  free(times);
  free(fid);
  free(kid);
  free(ci);
  return rc;
}
