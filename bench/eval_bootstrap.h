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
 * so read an interval's width, and the ratio to AR computed on the same resample, rather than
 * its position against the point estimate.
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

typedef struct vs_eval_ci {
  vs_interval fid, class_acc, speedup; /* speedup: median over images of AR time / time */
  vs_interval fid_ratio_ar;            /* FID / FID of AR on the same resample */
  vs_interval acc_diff_ar;             /* class accuracy minus AR's */
} vs_eval_ci;

/* Intervals for n_methods methods over `images` images; ar is the index of AR (or -1: no
 * speed-up or paired intervals). q may be NULL when no method has features. */
int vs_eval_bootstrap(const vs_quality *q, const vs_eval_sample *m, int n_methods, int ar,
                      int images, const int32_t *labels, const vs_bootstrap_opts *o,
                      vs_eval_ci *out, char *err, size_t errlen);

#endif /* VS_BENCH_EVAL_BOOTSTRAP_H */
