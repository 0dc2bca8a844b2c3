/*
 * bench/classifier.h - the Fashion-MNIST classifier used only for quality metrics.
 *
 * The network is not hard-coded: classifier.safetensors carries its own description in
 * the metadata key "layers", a JSON list interpreted in order:
 *
 *   {"op":"conv2d","weight":"conv0.weight","bias":"conv0.bias","in":1,"out":32,
 *    "kernel":3,"stride":1,"padding":1}          kernel/stride/padding: int or [h, w]
 *   {"op":"relu"}
 *   {"op":"global_avg_pool"}                      its output is the feature (FID space)
 *   {"op":"linear","weight":"fc.weight","bias":"fc.bias","in":128,"out":10}   logits
 *
 * plus "feature_dim" and "num_classes" (checked against the graph when present) and an
 * optional "input_shape" (JSON [c, h, w], default [1, 32, 32]). Weights are PyTorch
 * layouts: conv [out, in, kh, kw], linear [out, in]; "bias" may be absent or null.
 * Every shape is checked at open, so running can not go out of bounds; an unknown op or
 * key is an error rather than something silently skipped, because a skipped layer would
 * give plausible but wrong metrics.
 *
 * Running uses the device's ops table (conv2d, linear); ReLU and the pooling are plain
 * loops on host memory, so the device must be the CPU one.
 */
#ifndef VS_BENCH_CLASSIFIER_H
#define VS_BENCH_CLASSIFIER_H

#include <stddef.h>

#include "vspec/ops.h"

typedef struct vs_classifier vs_classifier;

/* Opens and validates `path` (classifier.safetensors). The device must be a CPU device
 * and outlive the classifier. Returns 0 or a negative vspec_status with a message naming
 * the file and the layer at fault. */
int vs_classifier_open(const char *path, vspec_dev *dev, vs_classifier **out, char *err,
                       size_t errlen);
void vs_classifier_close(vs_classifier *c);

int vs_classifier_feature_dim(const vs_classifier *c);
int vs_classifier_num_classes(const vs_classifier *c);
/* Floats of one input sample (c * h * w) and its shape. */
size_t vs_classifier_input_size(const vs_classifier *c);
void vs_classifier_input_shape(const vs_classifier *c, int *ch, int *h, int *w);

/* Runs n samples x [n, c, h, w] (host memory) and writes features [n, feature_dim] and
 * logits [n, num_classes]; either output may be NULL. Works through the samples in
 * internal batches with buffers allocated at open, so it never allocates. Not reentrant
 * on one classifier. */
int vs_classifier_run(vs_classifier *c, const float *x, int n, float *features, float *logits,
                      char *err, size_t errlen);

#endif /* VS_BENCH_CLASSIFIER_H */
