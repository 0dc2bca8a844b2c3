/*
 * bench/bootstrap.c - percentile bootstrap (see bootstrap.h).
 */
#include <math.h>
#include <stdlib.h>

#include "bench/bootstrap.h"
#include "kernels/common/vs_philox.h"
#include "vspec/types.h"

static int boot_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double vs_quantile(double *v, int n, double q) {
  if (n <= 0) return NAN;
  qsort(v, (size_t)n, sizeof *v, boot_cmp_double);
  double h = (n - 1) * q;
  int lo = (int)floor(h);
  if (lo >= n - 1) return v[n - 1];
  return v[lo] + (h - lo) * (v[lo + 1] - v[lo]);
}

const char *vs_ci_kind_name(vs_ci_kind k) {
  static const char *const names[VS_CI_KINDS] = {"percentile", "basic", "bca", "normal",
                                                 "shifted", "jackknife"};
  return (int)k >= 0 && k < VS_CI_KINDS ? names[k] : "?";
}

double vs_normal_cdf(double z) { return 0.5 * erfc(-z / sqrt(2.0)); }

/* By bisection on the distribution function: 80 halvings of [-40, 40] are exact to double
 * precision, and this runs a few times per interval. */
double vs_normal_quantile(double p) {
  if (!(p > 0 && p < 1)) return p <= 0 ? -INFINITY : INFINITY;
  double lo = -40, hi = 40;
  for (int i = 0; i < 80; i++) {
    double mid = 0.5 * (lo + hi);
    if (vs_normal_cdf(mid) < p) lo = mid;
    else hi = mid;
  }
  return 0.5 * (lo + hi);
}

static int valid_opts(int n, int n_stats, const vs_bootstrap_opts *o) {
  return n > 0 && n_stats > 0 && o && o->resamples >= 2 && o->level > 0 && o->level < 1;
}

/* The B resamples: vals[s * B + i] for the count[s] finite values of statistic s. */
static int resample_all(int n, int n_stats, vs_bootstrap_fn fn, void *ctx,
                        const vs_bootstrap_opts *o, double *vals, int *count) {
  int B = o->resamples;
  int *idx = malloc((size_t)n * sizeof *idx);
  double *one = malloc((size_t)n_stats * sizeof *one);
  int rc = idx && one ? VSPEC_OK : VSPEC_ENOMEM;
  vspec_rng rng;
  vs_rng_init(&rng, o->seed, 0x62);
  for (int b = 0; rc == VSPEC_OK && b < B; b++) {
    for (int i = 0; i < n; i++) {
      int j = (int)(vs_rng_uniform(&rng) * n);
      idx[i] = j < n ? j : n - 1;
    }
    rc = fn(ctx, idx, n, one);
    for (int s = 0; rc == VSPEC_OK && s < n_stats; s++)
      if (isfinite(one[s])) vals[(size_t)s * B + count[s]++] = one[s];
  }
  free(idx);
  free(one);
  return rc;
}

int vs_bootstrap(int n, int n_stats, vs_bootstrap_fn fn, void *ctx, const vs_bootstrap_opts *o,
                 vs_interval *out) {
  for (int s = 0; s < n_stats; s++) out[s] = (vs_interval){NAN, NAN};
  if (!valid_opts(n, n_stats, o)) return VSPEC_EINVAL;
  int B = o->resamples;
  double *vals = malloc((size_t)B * n_stats * sizeof *vals);
  int *count = calloc((size_t)n_stats, sizeof *count);
  int rc = vals && count ? resample_all(n, n_stats, fn, ctx, o, vals, count) : VSPEC_ENOMEM;
  for (int s = 0; rc == VSPEC_OK && s < n_stats; s++)
    if (count[s] >= 2) {
      double *v = vals + (size_t)s * B;
      out[s].lo = vs_quantile(v, count[s], (1 - o->level) / 2);
      out[s].hi = vs_quantile(v, count[s], (1 + o->level) / 2);
    }
  free(vals);
  free(count);
  return rc;
}

/* fn on the whole sample (jack = NULL) or on the sample without each of G groups of
 * consecutive indices: jack[s * G + g]. */
static int whole_and_jackknife(int n, int n_stats, int G, vs_bootstrap_fn fn, void *ctx,
                               double *theta, double *jack) {
  int *idx = malloc((size_t)n * sizeof *idx);
  double *one = malloc((size_t)n_stats * sizeof *one);
  int rc = idx && one ? VSPEC_OK : VSPEC_ENOMEM;
  for (int i = 0; i < n; i++) idx[i] = i;
  if (!rc) rc = fn(ctx, idx, n, theta);
  for (int g = 0; rc == VSPEC_OK && g < G; g++) {
    int m = 0;
    for (int i = 0; i < n; i++)
      if ((int)((long long)i * G / n) != g) idx[m++] = i;
    rc = fn(ctx, idx, m, one);
    for (int s = 0; rc == VSPEC_OK && s < n_stats; s++) jack[(size_t)s * G + g] = one[s];
  }
  free(idx);
  free(one);
  return rc;
}

/* From the jackknife values (NAN ones left out): BCa's acceleration (0 when undefined) and
 * the jackknife standard error (NAN when undefined). */
static double acceleration(const double *jack, int G, double *se) {
  double mean = 0, s2 = 0, s3 = 0;
  int k = 0;
  *se = NAN;
  for (int g = 0; g < G; g++)
    if (isfinite(jack[g])) mean += jack[g], k++;
  if (k < 2) return 0;
  mean /= k;
  for (int g = 0; g < G; g++)
    if (isfinite(jack[g])) {
      double u = mean - jack[g];
      s2 += u * u;
      s3 += u * u * u;
    }
  *se = sqrt(s2 * (k - 1) / k);
  return s2 > 0 ? s3 / (6 * pow(s2, 1.5)) : 0;
}

/* The intervals of one statistic from its resample values v[0..B) (sorted here), BCa's
 * acceleration a and the jackknife standard error se. */
static void kinds_of(double theta, double *v, int B, double level, double a, double se,
                     vs_interval *out) {
  double plo = (1 - level) / 2, phi = (1 + level) / 2;
  double qlo = vs_quantile(v, B, plo), qhi = vs_quantile(v, B, phi);
  double mean = 0, var = 0;
  int below = 0, equal = 0;
  for (int i = 0; i < B; i++) {
    mean += v[i] / B;
    below += v[i] < theta;
    equal += v[i] == theta;
  }
  for (int i = 0; i < B; i++) var += (v[i] - mean) * (v[i] - mean) / (B - 1);
  double z = vs_normal_quantile(phi), sd = sqrt(var);
  out[VS_CI_PERCENTILE] = (vs_interval){qlo, qhi};
  out[VS_CI_BASIC] = (vs_interval){2 * theta - qhi, 2 * theta - qlo};
  out[VS_CI_NORMAL] = (vs_interval){theta - z * sd, theta + z * sd};
  out[VS_CI_SHIFTED] = (vs_interval){qlo + theta - mean, qhi + theta - mean};
  out[VS_CI_JACKKNIFE] = (vs_interval){theta - z * se, theta + z * se};
  /* z0: the share of t* below theta, kept inside (0, 1) so that all on one side gives a
   * finite, if extreme, correction */
  double p0 = (below + 0.5 * equal) / B, eps = 0.5 / B;
  p0 = p0 < eps ? eps : p0 > 1 - eps ? 1 - eps : p0;
  double z0 = vs_normal_quantile(p0), q[2];
  for (int e = 0; e < 2; e++) {
    double zq = z0 + (e ? z : -z);
    q[e] = vs_normal_cdf(z0 + zq / (1 - a * zq));
  }
  out[VS_CI_BCA] = (vs_interval){vs_quantile(v, B, q[0]), vs_quantile(v, B, q[1])};
}

int vs_bootstrap_intervals(int n, int n_stats, vs_bootstrap_fn fn, void *ctx,
                           const vs_bootstrap_opts *o, vs_interval *out) {
  for (int s = 0; s < n_stats * VS_CI_KINDS; s++) out[s] = (vs_interval){NAN, NAN};
  if (!valid_opts(n, n_stats, o)) return VSPEC_EINVAL;
  int B = o->resamples, G = n < VS_BOOT_JACK_GROUPS ? n : VS_BOOT_JACK_GROUPS;
  double *vals = malloc((size_t)B * n_stats * sizeof *vals);
  double *theta = malloc((size_t)n_stats * sizeof *theta);
  double *jack = malloc((size_t)n_stats * G * sizeof *jack);
  int *count = calloc((size_t)n_stats, sizeof *count);
  int rc = vals && theta && jack && count ? VSPEC_OK : VSPEC_ENOMEM;
  if (!rc) rc = whole_and_jackknife(n, n_stats, G, fn, ctx, theta, jack);
  if (!rc) rc = resample_all(n, n_stats, fn, ctx, o, vals, count);
  for (int s = 0; rc == VSPEC_OK && s < n_stats; s++)
    if (count[s] >= 2 && isfinite(theta[s])) {
      double se, a = acceleration(jack + (size_t)s * G, G, &se);
      kinds_of(theta[s], vals + (size_t)s * B, count[s], o->level, a, se,
               out + (size_t)s * VS_CI_KINDS);
    }
  free(vals);
  free(theta);
  free(jack);
  free(count);
  return rc;
}
