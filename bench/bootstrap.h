/*
 * bench/bootstrap.h - percentile bootstrap intervals over images.
 *
 * A benchmark table's figures are statistics of a sample of images (FID of their features,
 * the fraction classified right, the median speed-up). Their noise is estimated by
 * resampling the images with replacement B times, recomputing the statistics on every
 * resample and taking the (1 - level) / 2 and (1 + level) / 2 quantiles of the B values:
 * the percentile interval (B. Efron and R. J. Tibshirani, "An Introduction to the
 * Bootstrap", 1993, ch. 13). Figures of several methods computed on the same images (same
 * seeds and classes) are resampled with the same indices, so a ratio or difference between
 * two methods gets a paired interval.
 *
 * Deterministic: the resamples come from the project's Philox generator with a fixed seed.
 */
#ifndef VS_BENCH_BOOTSTRAP_H
#define VS_BENCH_BOOTSTRAP_H

#include <stdint.h>

typedef struct vs_interval {
  double lo, hi; /* NAN when there is none */
} vs_interval;

/* Computes n_stats statistics of the images idx[0..n) (indices into the sample, repeats
 * allowed) into out[0..n_stats); a NAN leaves that resample out of that statistic's interval.
 * Returns 0, or a negative vspec_status that stops the bootstrap. */
typedef int (*vs_bootstrap_fn)(void *ctx, const int *idx, int n, double *out);

typedef struct vs_bootstrap_opts {
  int resamples; /* B, >= 2 */
  double level;  /* e.g. 0.95 */
  uint64_t seed;
} vs_bootstrap_opts;

/* Percentile intervals of the n_stats statistics fn computes, over o->resamples resamples of
 * n images. Returns 0, VSPEC_ENOMEM, VSPEC_EINVAL or fn's error. */
int vs_bootstrap(int n, int n_stats, vs_bootstrap_fn fn, void *ctx, const vs_bootstrap_opts *o,
                 vs_interval *out);

/* The interval types vs_bootstrap_intervals gives, from the same B resamples (Efron and
 * Tibshirani 1993, ch. 12-14; A. C. Davison and D. V. Hinkley, "Bootstrap Methods and their
 * Application", 1997, ch. 5). theta is the estimate on the whole sample, t* a resample's:
 *   percentile  the quantiles of t*. Off when t* is biased against theta: FID of a resample
 *               counts repeated images as distinct and sits above FID of the sample.
 *   basic       2 theta - the quantiles of t*: corrects that bias once more, so it targets
 *               the bias-free (infinite-sample) value and may not contain theta.
 *   bca         bias-corrected and accelerated percentile: z0 from the share of t* below
 *               theta, the acceleration from a delete-a-group jackknife. Degenerates when
 *               (nearly) every t* lies on one side of theta.
 *   normal      theta -/+ z sd(t*): only the spread of t* is used, so the bootstrap's own
 *               bias cannot move it; it contains theta by construction.
 *   shifted     the percentile interval moved by theta - mean(t*): the shape of t*, centred
 *               on theta.
 *   jackknife   theta -/+ z se, se from the delete-a-group jackknife (Efron and Tibshirani
 *               1993, ch. 11): no resample repeats an image, so FID's repeats do not widen
 *               it; it contains theta by construction.
 * Which of them holds its level for eval's figures is measured (vspec-bench eval
 * --coverage, docs/BENCHMARKS.md), not assumed. */
typedef enum vs_ci_kind {
  VS_CI_PERCENTILE,
  VS_CI_BASIC,
  VS_CI_BCA,
  VS_CI_NORMAL,
  VS_CI_SHIFTED,
  VS_CI_JACKKNIFE,
  VS_CI_KINDS
} vs_ci_kind;

const char *vs_ci_kind_name(vs_ci_kind k);

/* Groups of the delete-a-group jackknife behind BCa's acceleration and the jackknife
 * interval (n when n is smaller). */
#define VS_BOOT_JACK_GROUPS 50

/* Every kind of interval of the n_stats statistics fn computes: out[s * VS_CI_KINDS + kind].
 * fn is called on the whole sample (theta), on the o->resamples resamples and on the sample
 * without each jackknife group of consecutive images. Returns as vs_bootstrap. */
int vs_bootstrap_intervals(int n, int n_stats, vs_bootstrap_fn fn, void *ctx,
                           const vs_bootstrap_opts *o, vs_interval *out);

/* The standard normal distribution function and its inverse (0 < p < 1). */
double vs_normal_cdf(double z);
double vs_normal_quantile(double p);

/* The q-quantile (0 <= q <= 1) of v[0..n), linear between order statistics (Hyndman and Fan's
 * type 7, numpy's default); sorts v. NAN for n = 0. */
double vs_quantile(double *v, int n, double q);

#endif /* VS_BENCH_BOOTSTRAP_H */
