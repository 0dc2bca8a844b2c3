/*
 * core/draft_model.h - a draft model the engine loaded (the model directory's "draft" or
 * "eagle"), served to a drafter plugin through the ABI (vspec_draft_model,
 * include/vspec/plugin.h). The engine keeps the forwards: they go through the job's forward
 * gate (cross-job batching) and the draft distributions through the engine's sampler, so
 * that a drafter plugin sees the same numbers the target's walk does.
 */
#ifndef VS_DRAFT_MODEL_H
#define VS_DRAFT_MODEL_H

#include "core/job.h"
#include "core/models.h"

typedef struct vs_draft_model vs_draft_model;
struct vs_forward_gate;

/* A server of `bm` for one job: sessions of the job's condition with `rows` CFG rows and
 * room for max_nodes per forward. */
int vs_draft_model_new(const vs_backend_model *bm, vspec_dev *dev, const vs_job *job, int rows,
                       int max_nodes, vs_draft_model **out, char *err, size_t errlen);
/* Frees it and sets *m to NULL; the drafter's sessions are closed by then. */
void vs_draft_model_free(vs_draft_model **m);
/* What the drafter plugin is handed (valid until vs_draft_model_free). */
const vspec_draft_model *vs_draft_model_abi(const vs_draft_model *m);
/* From now on its forwards go through `gate` (the job has entered it), or alone with NULL. */
void vs_draft_model_set_gate(vs_draft_model *m, struct vs_forward_gate *gate);

/* Drafts drawn on the device (ABI 1.8): while set, forward k of the drafter (k = 0, 1, ..)
 * draws the token after its last node on the device, as spec says with u[k] (u NULL: the
 * distribution's first maximum) and guided[k], into tokens[k] and its distribution into row
 * k of probs; a node fed token -1 - j reads tokens[j]. Nothing comes to the host and the
 * plugin's distribution call does nothing. */
typedef struct vs_draft_draw {
  vspec_sample_spec spec; /* rows, vocab, top_k, cfg_scale, temperature (> 0), top_p */
  const double *u;        /* host [forwards], or NULL */
  const uint8_t *guided;  /* host [forwards] */
  int32_t *tokens;        /* device [forwards] */
  float *probs;           /* device [forwards, vocab] */
  int forwards;
} vs_draft_draw;
/* Whether the model's backend can draw on the device (its info's device_tokens). */
int vs_draft_model_draws(const vs_draft_model *m);
/* Draws as `d` says from the next forward on (forward 0 first), or on the host with NULL. */
void vs_draft_model_set_draw(vs_draft_model *m, const vs_draft_draw *d);

#endif /* VS_DRAFT_MODEL_H */
