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

/* The q-quantile (0 <= q <= 1) of v[0..n), linear between order statistics (Hyndman and Fan's
 * type 7, numpy's default); sorts v. NAN for n = 0. */
double vs_quantile(double *v, int n, double q);

#endif /* VS_BENCH_BOOTSTRAP_H */
