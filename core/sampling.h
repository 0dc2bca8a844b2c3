/*
 * core/sampling.h - from a node's logits to a token, on the host.
 *
 * Whatever device ran the forward, its logits reach the engine as host memory (the backend
 * downloads them explicitly, include/vspec/plugin.h vspec_forward_out), and the engine
 * turns them into distributions and tokens here with the host implementations of
 * kernels/host/, which the CPU device's ops share: the same seed gives the same tokens on
 * every device that computes the same logits. An AR step may draw on the device instead
 * (vspec_forward_out.sample, ABI 1.4; vs_sample_spec_one), by the same rules.
 */
#ifndef VS_SAMPLING_H
#define VS_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#include "core/models.h"

/* Work space for vs_node_distribution over one vocabulary. */
typedef struct vs_sampler {
  int vocab;
  float *mixed; /* [vocab]: the CFG-combined logits */
  void *work;   /* top-k / top-p index and weight arrays */
} vs_sampler;

int vs_sampler_init(vs_sampler *s, int vocab);
void vs_sampler_free(vs_sampler *s);

/* The processed distribution of one node's logits ([rows, vocab], host memory) when
 * predicting image token `predicted_index`: CFG per LlamaGen's schedule (rows == 2; guided
 * unless cfg_interval > -1 and predicted_index - 1 > cfg_interval, the prediction of token
 * 0 always guided), then temperature / top-k / top-p (LlamaGen
 * autoregressive/models/generate.py). The target and every drafter use it, so both follow
 * the same rules. */
void vs_node_distribution(vs_sampler *sp, const float *logits, int rows, int predicted_index,
                          const vs_sampling *s, float *probs);

/* Whether the prediction of image token `predicted_index` is guided (LlamaGen's
 * cfg_interval, above): the CFG mix applies only then. */
int vs_cfg_guided(const vs_sampling *s, int predicted_index);
/* The spec of one node's draw on the device (vspec_forward_out.sample, ABI 1.4): the same
 * rules as vs_node_distribution; *guided and *u are the node's (host memory the spec points
 * to). */
void vs_sample_spec_one(const vs_sampling *s, int rows, int vocab, int predicted_index,
                        uint8_t *guided, double *u, vspec_sample_spec *spec);

/* Inverse-CDF draw from probs[n] with uniform u in [0, 1); -1 if nothing has mass. */
int vs_draw(const float *probs, int n, double u);
/* Index of the first maximum. */
int32_t vs_argmax_first(const float *p, int n);

/* Checks sampling parameters; the message names the offending one and its range. */
int vs_sampling_validate(const vs_sampling *s, int vocab, char *err, size_t errlen);

#endif /* VS_SAMPLING_H */
