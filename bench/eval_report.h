/*
 * bench/eval_report.h - what `vspec-bench eval` writes from the figures it measured: the
 * markdown tables (stdout and --markdown), the JSON (--json, the schema of
 * docs/BENCHMARKS.md) and the plot of FID against TPF (--plot). Each names the machine
 * (bench/machine.h) and the interval kinds it prints (bench/eval_bootstrap.h).
 */
#ifndef VS_BENCH_EVAL_REPORT_H
#define VS_BENCH_EVAL_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "bench/bench.h"
#include "bench/eval_bootstrap.h"
#include "bench/kid.h"
#include "bench/machine.h"
#include "bench/quality_eval.h"
#include "core/method.h"

#define VS_EVAL_MAX_METHODS 32

typedef struct vs_eval_method {
  vs_method m;
  vs_method run;       /* the method actually run (size=auto resolved) */
  char label[1200];    /* how the tables name it: spec, or what ran as AR */
  char note[1400];     /* e.g. what auto-tuning chose */
  vs_metrics total;
  double *times;       /* [images] wall seconds per image */
  uint8_t *rgb;        /* [images, H, W, 3] */
  int has_quality;
  vs_quality_result q;
  float *feat, *logits; /* [images, d], [images, classes]: kept for the bootstrap */
  double speedup_median, speedup_total;
  double fid_ratio_ar, acc_diff_ar; /* against AR's figures, NAN without AR */
  vs_eval_ci ci;                    /* bootstrap intervals (NAN: none) */
  vs_kid kid;                       /* kid.kid NAN: none */
  double kid_diff_ar, kid_diff_se;  /* KID - AR's and its standard error, NAN without AR */
} vs_eval_method;

#define VS_EVAL_BOOT_SEED 20261123u

/* The real-data floors: 10k training images, and as many as the table has images (FID is
 * biased upwards at small n: compare a row with the floor at its own n). */
typedef struct vs_eval_floor {
  double fid_10k, fid_at_n;
} vs_eval_floor;

/* The model's kind of tokens, and for continuous-token (MAR) models the sampler settings
 * every job of the run used (they change speed and quality alike, so the table names them). */
typedef struct vs_eval_tokens {
  float cfg_scale, temperature; /* every job's, either kind of model */
  int continuous;
  int num_iter;     /* generation steps per image */
  int cfg_schedule; /* VS_CFG_* */
} vs_eval_tokens;

/* The tables: figures, the paired table against AR, the time split, and the lines under
 * them (images, sampler, floors, interval kinds, machine). resamples 0: no intervals. */
void vs_eval_write_table(FILE *f, vs_eval_method *em, int n, int images, vs_eval_floor floor,
                         const vs_eval_tokens *tk, const vs_bench_machine *mc, int resamples);
int vs_eval_write_json(const char *path, const char *model, const char *device,
                       vs_eval_method *em, int n, int images, unsigned long long seed,
                       int threads, vs_eval_floor floor, const vs_eval_tokens *tk,
                       int resamples, const vs_bench_machine *mc, char *err, size_t errlen);
/* FID against TPF, one point per method with quality metrics, one series per rule. */
int vs_eval_write_plot(const char *path, vs_eval_method *em, int n, const vs_bench_machine *mc,
                       char *err, size_t errlen);

#endif /* VS_BENCH_EVAL_REPORT_H */
