/*
 * bench/eval_coverage.h - `vspec-bench eval --coverage SETS`: how often eval's intervals
 * contain the truth, measured rather than assumed.
 *
 * 2 x SETS disjoint sets of AR images of eval's size (set s: image i has class i mod
 * classes and seed S + s * images + i) are generated once; their classifier features and
 * logits go to a cache file (--coverage-cache), so a run that stops goes on where it
 * stopped and a larger SETS reuses the sets already made. Set 2k is then compared with set
 * 2k + 1 exactly as eval compares a method with AR (eval_bootstrap.h: paired resamples
 * of image indices, the KID difference's jackknife): both are AR, so FID / AR is 1 and
 * the KID and class-accuracy differences are 0, and the fraction of the SETS intervals
 * of each type that contain that value is its coverage. A single set's FID interval is
 * also checked against the mean FID of all 2 x SETS sets (the expectation of FID at this
 * size, which the estimate estimates).
 */
#ifndef VS_BENCH_EVAL_COVERAGE_H
#define VS_BENCH_EVAL_COVERAGE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bench/bench.h"
#include "bench/quality_eval.h"

typedef struct vs_coverage_opts {
  vs_models *models;
  vspec_dev *dev;
  vs_quality *q;
  vs_sampling sampling;
  int images;        /* per set */
  int pairs;         /* SETS: pairs of sets compared */
  int classes;
  uint64_t seed;     /* of image 0 of set 0 */
  int resamples;     /* bootstrap B */
  const char *cache; /* features and logits of the sets made so far; NULL: none */
} vs_coverage_opts;

/* Generates (or reads from the cache) the sets and prints the coverage table to out
 * (markdown). Returns 0 or a negative vspec_status with a message. */
int vs_eval_coverage(const vs_coverage_opts *o, FILE *out, char *err, size_t errlen);

#endif /* VS_BENCH_EVAL_COVERAGE_H */
