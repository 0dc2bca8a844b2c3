/*
 * core/engine.h - the decode engine: one job from condition to token grid.
 *
 * Methods:
 *   "ar"   vanilla autoregressive decoding, LlamaGen's generate()
 *          (autoregressive/models/generate.py)
 *   "sd:"  speculative decoding: a drafter proposes a token tree, one target forward
 *          verifies it, an acceptance-rule plugin decides (docs/SPECULATIVE.md)
 * Both run the same round loop (core/round_loop.c); AR is a round with no draft. The
 * engine itself only validates the job and dispatches; sampling is core/sampling.c and
 * the metrics core/metrics.c.
 *
 * Devices: the job runs on `dev`, the device its models were loaded on (or another device
 * of the same kind and index). Backends hand logits and features back as host memory; the
 * engine never passes host buffers to device ops.
 */
#ifndef VS_ENGINE_H
#define VS_ENGINE_H

#include "core/job.h"
#include "core/metrics.h"
#include "core/sampling.h"

/* Generates one image's tokens (raster order) into tokens[grid_h * grid_w]. A
 * continuous-token (MAR) model writes job->latents instead (vs_models_latent_count values,
 * required) and zeros into tokens (which may then be NULL); vs_models_decode makes pixels
 * of either. */
int vs_generate(vs_models *models, vspec_dev *dev, const vs_job *job, int32_t *tokens,
                vs_metrics *metrics, char *err, size_t errlen);

/* "method=ar seed=1 class=3 cfg=4 ..." for PNG text chunks and logs. */
size_t vs_job_describe(const vs_job *job, const char *model_name, char *buf, size_t buflen);

#endif /* VS_ENGINE_H */
