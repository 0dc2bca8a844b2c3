/*
 * core/engine.h - the decode engine: one job from condition to token grid.
 *
 * The engine owns the round loop and everything methods share: sampling with LlamaGen's
 * logit processing, CFG combination, the per-job RNG streams and the metrics. Methods:
 *   "ar"   vanilla autoregressive decoding, LlamaGen's generate() (models.md §1.10)
 */
#ifndef VS_ENGINE_H
#define VS_ENGINE_H

#include "core/models.h"

/* RNG stream ids (one purpose each, so methods never share draws by accident). */
enum {
  VS_STREAM_TARGET_SAMPLE = 1, /* tokens drawn from the target distribution */
  VS_STREAM_DRAFT_SAMPLE = 2,  /* tokens drawn from the draft distribution */
  VS_STREAM_ACCEPT = 3,        /* acceptance tests */
  VS_STREAM_SCHED = 4          /* scheduler decisions */
};

typedef struct vs_metrics {
  int64_t tokens;          /* image tokens emitted */
  int64_t target_forwards; /* target passes, prefill included */
  int64_t rounds;          /* verification rounds (AR: one per token) */
  int64_t drafted;         /* draft tokens on walked paths */
  int64_t accepted;        /* of which accepted */
  double wall_s;           /* wall-clock time of the job */
} vs_metrics;

/* TPF and MAL as defined in DESIGN.md "Metrics". */
double vs_metrics_tpf(const vs_metrics *m);
double vs_metrics_mal(const vs_metrics *m);

typedef struct vs_job {
  const char *method;          /* "ar" */
  int32_t class_label;         /* class-conditional models */
  const float *caption;        /* text models: [caption_len, caption_dim] */
  const uint8_t *caption_mask; /* text models: [caption_len] */
  uint64_t seed;
  vs_sampling sampling;
} vs_job;

/* Generates one image's tokens (raster order) into tokens[grid_h * grid_w]. */
int vs_generate(vs_models *models, vspec_dev *dev, const vs_job *job, int32_t *tokens,
                vs_metrics *metrics, char *err, size_t errlen);

/* Checks sampling parameters; the message names the offending one and its range. */
int vs_sampling_validate(const vs_sampling *s, int vocab, char *err, size_t errlen);

/* "method=ar seed=1 class=3 cfg=4 ..." for PNG text chunks and logs. */
size_t vs_job_describe(const vs_job *job, const char *model_name, char *buf, size_t buflen);

#endif /* VS_ENGINE_H */
