/*
 * core/mar_loop.h - generation for continuous-token models (MAR, LTH14/mar
 * MAR.sample_tokens), and continuous speculative decoding on them (CSpD, arXiv 2411.11925).
 *
 * `ar` is MAR's own sampler: a random order, the cosine mask schedule (each step reveals
 * at least one token and keeps at least one masked until the last), CFG on the head's
 * noise prediction with a linear or constant schedule, K respaced diffusion steps per token
 * with the temperature on the noise and none added at the last step.
 *
 * `sd:RULE@SCHED` with a continuous rule (plugins/accept/continuous.c) is CSpD: the
 * scheduler's plan says, before each group, whether the target generates the next step
 * itself (shape none, e.g. during the pre-filling the standard scheduler's `prefill` asks
 * for) or the draft model runs `depth` steps on its own (shape chain) that one target
 * forward then verifies. Every position draws its noises from its own stream (stream
 * VS_STREAM_NOISE + position): draft and target denoise a position along the same noises
 * (trajectory alignment). Each drafted token is accepted or replaced independently; a
 * rejection does not discard the group's later tokens. The target verifies the group with
 * only the verified tokens as context, so what comes out is the target's distribution for
 * the group's positions revealed together in one step - exactly, when the final step adds
 * its Gaussian noise, which the speculative methods do (docs/SPECULATIVE.md derives it).
 */
#ifndef VS_MAR_LOOP_H
#define VS_MAR_LOOP_H

#include "core/engine.h"
#include "core/method.h"

/* Runs one job on a continuous-token target into job->latents [grid, token_dim]. */
int vs_mar_run(vs_models *models, vspec_dev *dev, const vs_job *job, const vs_method *m,
               vs_metrics *mt, char *err, size_t errlen);

/* MAR's schedule: tokens still masked after `step` of num_iter, with n_masked masked now. */
int vs_mar_mask_len(int step, int num_iter, int seq, int n_masked);

#endif /* VS_MAR_LOOP_H */
