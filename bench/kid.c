/*
 * bench/kid.c - KID and its standard error (see kid.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/kid.h"
#include "kernels/common/vs_philox.h"
#include "vspec/types.h"

struct vs_kid_ref {
  const float *ref;
  int n_ref, d, subsets, subset_size;
  uint64_t seed;
  int m;        /* subset size the cached subsets are for; 0: none yet */
  int *real;    /* [subsets, m] real indices of each subset */
  double *yy;   /* [subsets] sum over i != j in the subset of k(y_i, y_j) */
};

static double poly_kernel(const float *a, const float *b, int d) {
  double s = 0;
  for (int k = 0; k < d; k++) s += (double)a[k] * b[k];
  double t = s / d + 1;
  return t * t * t;
}

/* m distinct indices of 0..n-1 into out (a partial Fisher-Yates shuffle of perm). */
static void draw_subset(vspec_rng *rng, int *perm, int n, int m, int *out) {
  for (int i = 0; i < n; i++) perm[i] = i;
  for (int i = 0; i < m; i++) {
    int j = i + (int)(vs_rng_uniform(rng) * (n - i));
    if (j >= n) j = n - 1;
    int t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
    out[i] = perm[i];
  }
}

int vs_kid_ref_open(const float *ref, int n_ref, int d, const vs_kid_opts *o, vs_kid_ref **r,
                    char *err, size_t errlen) {
  *r = NULL;
  if (!ref || n_ref < 2 || d <= 0) {
    snprintf(err, errlen, "kid: need at least 2 reference features");
    return VSPEC_EINVAL;
  }
  vs_kid_ref *k = calloc(1, sizeof *k);
  if (!k) {
    snprintf(err, errlen, "kid: out of memory");
    return VSPEC_ENOMEM;
  }
  *k = (vs_kid_ref){.ref = ref, .n_ref = n_ref, .d = d, .subsets = VS_KID_SUBSETS,
                    .subset_size = VS_KID_SUBSET_SIZE, .seed = 0x4b4944};
  if (o && o->subsets > 0 && o->subsets < VS_KID_SUBSETS) k->subsets = o->subsets;
  if (o && o->subset_size > 1) k->subset_size = o->subset_size;
  if (o) k->seed = o->seed;
  *r = k;
  return VSPEC_OK;
}

void vs_kid_ref_close(vs_kid_ref *r) {
  if (!r) return;
  free(r->real);
  free(r->yy);
  free(r);
}

/* The real subsets of size m and their kernel sums: they do not depend on the generated
 * images, so every KID against this reference at this size shares them. */
static int ref_subsets(vs_kid_ref *r, int m) {
  if (r->m == m) return VSPEC_OK;
  free(r->real);
  free(r->yy);
  r->m = 0;
  r->real = malloc(sizeof(int) * (size_t)r->subsets * m);
  r->yy = malloc(sizeof(double) * (size_t)r->subsets);
  int *perm = malloc(sizeof(int) * (size_t)r->n_ref);
  if (!r->real || !r->yy || !perm) {
    free(perm);
    return VSPEC_ENOMEM;
  }
  vspec_rng rng;
  vs_rng_init(&rng, r->seed, 0x6b6964);
  for (int s = 0; s < r->subsets; s++) {
    int *J = r->real + (size_t)s * m;
    draw_subset(&rng, perm, r->n_ref, m, J);
    double yy = 0;
    for (int i = 0; i < m; i++)
      for (int j = i + 1; j < m; j++)
        yy += poly_kernel(r->ref + (size_t)J[i] * r->d, r->ref + (size_t)J[j] * r->d, r->d);
    r->yy[s] = 2 * yy;
  }
  free(perm);
  r->m = m;
  return VSPEC_OK;
}

/* Scratch of one KID: the generated kernel matrix, the generated-real kernels, and per
 * subset the sums a group's removal takes away. */
typedef struct kid_work {
  int n, m, G;
  float *kxx;      /* [n, n] */
  float *kxr;      /* [n, n_ref] */
  int *gen, *perm; /* [m] generated indices of a subset; [n] */
  int *gid;        /* [n] group of each generated image: consecutive blocks */
  double *row_xx, *row_xy, *within; /* [n], [n], [G] */
  int *count;                       /* [G] images of group g in the subset */
} kid_work;

static void kernels(const vs_kid_ref *r, const float *x, kid_work *w) {
  int n = w->n, d = r->d;
  for (int i = 0; i < n; i++) {
    w->kxx[(size_t)i * n + i] = 0;
    for (int j = i + 1; j < n; j++)
      w->kxx[(size_t)i * n + j] = w->kxx[(size_t)j * n + i] =
          (float)poly_kernel(x + (size_t)i * d, x + (size_t)j * d, d);
    for (int j = 0; j < r->n_ref; j++)
      w->kxr[(size_t)i * r->n_ref + j] =
          (float)poly_kernel(x + (size_t)i * d, r->ref + (size_t)j * d, d);
  }
}

/* Subset s: its MMD^2_u, and without each group g of the generated images. */
static double subset_stats(const vs_kid_ref *r, kid_work *w, int s, double *without) {
  int n = w->n, m = w->m, G = w->G;
  const int *J = r->real + (size_t)s * m;
  double xx = 0, xy = 0;
  memset(w->within, 0, sizeof(double) * (size_t)G);
  memset(w->count, 0, sizeof(int) * (size_t)G);
  for (int a = 0; a < m; a++) {
    int i = w->gen[a], gi = w->gid[i];
    const float *ki = w->kxx + (size_t)i * n, *kr = w->kxr + (size_t)i * r->n_ref;
    double rx = 0, ry = 0;
    for (int b = 0; b < m; b++) {
      int j = w->gen[b];
      rx += ki[j];
      if (w->gid[j] == gi) w->within[gi] += ki[j];
    }
    for (int b = 0; b < m; b++) ry += kr[J[b]];
    w->row_xx[a] = rx;
    w->row_xy[a] = ry;
    xx += rx;
    xy += ry;
    w->count[gi]++;
  }
  double yy = r->yy[s] / ((double)m * (m - 1));
  for (int g = 0; g < G; g++) {
    double gxx = 0, gxy = 0;
    for (int a = 0; a < m; a++)
      if (w->gid[w->gen[a]] == g) gxx += w->row_xx[a], gxy += w->row_xy[a];
    double mg = m - w->count[g];
    without[g] = (xx - 2 * gxx + w->within[g]) / (mg * (mg - 1)) + yy -
                 2 * (xy - gxy) / (mg * m);
  }
  return xx / ((double)m * (m - 1)) + yy - 2 * xy / ((double)m * m);
}

static double jack_var(const double *t, int G) {
  double mean = 0, v = 0;
  for (int g = 0; g < G; g++) mean += t[g] / G;
  for (int g = 0; g < G; g++) v += (t[g] - mean) * (t[g] - mean);
  return v * (G - 1) / G;
}

static double sample_var(const double *t, int S) {
  if (S < 2) return 0;
  double mean = 0, v = 0;
  for (int s = 0; s < S; s++) mean += t[s] / S;
  for (int s = 0; s < S; s++) v += (t[s] - mean) * (t[s] - mean);
  return v / (S - 1);
}

int vs_kid_compute(vs_kid_ref *r, const float *x, int n, vs_kid *out, char *err,
                   size_t errlen) {
  memset(out, 0, sizeof *out);
  out->kid = out->se = NAN;
  if (n < 2 * VS_KID_GROUPS) {
    snprintf(err, errlen, "kid: need at least %d generated images (got %d)", 2 * VS_KID_GROUPS,
             n);
    return VSPEC_EINVAL;
  }
  int m = r->subset_size;
  if (m > n) m = n;
  if (m > r->n_ref) m = r->n_ref;
  kid_work w = {.n = n, .m = m, .G = VS_KID_GROUPS};
  w.kxx = malloc(sizeof(float) * (size_t)n * n);
  w.kxr = malloc(sizeof(float) * (size_t)n * r->n_ref);
  w.gen = malloc(sizeof(int) * (size_t)m);
  w.perm = malloc(sizeof(int) * (size_t)n);
  w.gid = malloc(sizeof(int) * (size_t)n);
  w.row_xx = malloc(sizeof(double) * (size_t)m);
  w.row_xy = malloc(sizeof(double) * (size_t)m);
  w.within = malloc(sizeof(double) * (size_t)w.G);
  w.count = malloc(sizeof(int) * (size_t)w.G);
  int ok = w.kxx && w.kxr && w.gen && w.perm && w.gid && w.row_xx && w.row_xy && w.within &&
           w.count;
  int rc = ok ? ref_subsets(r, m) : VSPEC_ENOMEM;
  if (rc) snprintf(err, errlen, "kid: out of memory");
  if (!rc) {
    for (int i = 0; i < n; i++) w.gid[i] = (int)((long long)i * w.G / n);
    kernels(r, x, &w);
    /* the generated subsets: all images when n <= subset_size, else the same draws for
     * every KID of this size (so that paired differences share them) */
    vspec_rng rng;
    vs_rng_init(&rng, r->seed, 0x67656e);
    double without[VS_KID_GROUPS];
    out->subsets = r->subsets;
    out->groups = w.G;
    out->m = m;
    for (int s = 0; s < r->subsets; s++) {
      draw_subset(&rng, w.perm, n, m, w.gen);
      out->sub[s] = subset_stats(r, &w, s, without);
      for (int g = 0; g < w.G; g++) out->jack[g] += without[g] / r->subsets;
    }
    out->kid = 0;
    for (int s = 0; s < r->subsets; s++) out->kid += out->sub[s] / r->subsets;
    out->se = sqrt(jack_var(out->jack, w.G) + sample_var(out->sub, r->subsets) / r->subsets);
  }
  free(w.kxx);
  free(w.kxr);
  free(w.gen);
  free(w.perm);
  free(w.gid);
  free(w.row_xx);
  free(w.row_xy);
  free(w.within);
  free(w.count);
  return rc;
}

double vs_kid_diff_se(const vs_kid *a, const vs_kid *b) {
  if (a->groups != b->groups || a->subsets != b->subsets || a->groups < 2) return NAN;
  double dj[VS_KID_GROUPS], ds[VS_KID_SUBSETS];
  for (int g = 0; g < a->groups; g++) dj[g] = a->jack[g] - b->jack[g];
  for (int s = 0; s < a->subsets; s++) ds[s] = a->sub[s] - b->sub[s];
  return sqrt(jack_var(dj, a->groups) + sample_var(ds, a->subsets) / a->subsets);
}
