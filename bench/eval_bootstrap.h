/*
 * bench/eval_bootstrap.h - bootstrap intervals for the figures of `vspec-bench eval`.
 *
 * Every method generated the same images (image i: class i mod classes, seed S + i), so one
 * resample of image indices serves all methods: each method's FID, class accuracy and median
 * speed-up over AR get a percentile interval, and the ratio FID(method) / FID(AR) and the
 * difference of class accuracy get paired intervals (bench/bootstrap.h). Precision and recall
 * get none: recall's k-NN radii are among the generated images themselves, which a resample
 * with repeats would shrink to 0.
 *
 * FID of a resample is biased upwards like FID of any n images (repeats count as distinct),
 * so the percentile interval of FID sits above the estimate (AR on 300 fmnist images: 1.129
 * [1.15, 1.79]). Every kind of bootstrap.h is computed; the ones eval prints
 * (VS_EVAL_CI_FID, VS_EVAL_CI_ACC) are those whose coverage, measured on AR against AR with
 * `vspec-bench eval --coverage`, holds its level (docs/BENCHMARKS.md). KID (bench/kid.h), an
 * unbiased companion of FID, gets its interval from its own standard error instead.
 */
#ifndef VS_BENCH_EVAL_BOOTSTRAP_H
#define VS_BENCH_EVAL_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "bench/bootstrap.h"
#include "bench/quality_eval.h"

typedef struct vs_eval_sample {
  const float *feat;   /* [images, feature_dim], or NULL: no quality for this method */
  const float *logits; /* [images, num_classes], or NULL */
  const double *times; /* [images] wall seconds */
} vs_eval_sample;

/* The interval kinds eval prints, chosen by their coverage measured on 34 pairs of 300 AR
 * images (docs/BENCHMARKS.md, "Intervals that hold their level"): FID and FID / AR, whose
 * resamples are biased, the shifted percentile interval (FID / AR covered 1 in 0.97, a
 * set's FID its expectation in 1.00; the percentile interval 0.38); class accuracy and its
 * difference from AR the normal interval (0.97; percentile 0.94), cut to [0, 1] and
 * [-1, 1]; the median speed-up, which the AR-against-AR sets cannot test, the percentile
 * interval as before. */
#define VS_EVAL_CI_FID VS_CI_SHIFTED
#define VS_EVAL_CI_ACC VS_CI_NORMAL
#define VS_EVAL_CI_SPEEDUP VS_CI_PERCENTILE

/* Each figure's intervals, one per vs_ci_kind. */
typedef struct vs_eval_ci {
  vs_interval fid[VS_CI_KINDS], class_acc[VS_CI_KINDS];
  vs_interval speedup[VS_CI_KINDS];      /* median over images of AR time / time */
  vs_interval fid_ratio_ar[VS_CI_KINDS]; /* FID / FID of AR on the same resample */
  vs_interval acc_diff_ar[VS_CI_KINDS];  /* class accuracy minus AR's */
} vs_eval_ci;

/* No interval (NAN) of any kind. */
void vs_eval_ci_clear(vs_eval_ci *ci);

/* Intervals for n_methods methods over `images` images; ar is the index of AR (or -1: no
 * speed-up or paired intervals). q may be NULL when no method has features. */
int vs_eval_bootstrap(const vs_quality *q, const vs_eval_sample *m, int n_methods, int ar,
                      int images, const int32_t *labels, const vs_bootstrap_opts *o,
                      vs_eval_ci *out, char *err, size_t errlen);

#endif /* VS_BENCH_EVAL_BOOTSTRAP_H */
