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
 * draws the distributions of its last nodes on the device, as spec says with guided[] by
 * row, into rows of probs: a chain's forward k its one node into row k, whose token it draws
 * at u[k] (u NULL: the distribution's first maximum) into tokens[k]; a static tree's forward k
 * its nodes into rows fwd[k] .. fwd[k + 1] - 1, whose children draw_children (ABI 1.10) then
 * draws into tokens as `children` says. A node fed token -1 - j reads tokens[j]. Nothing comes
 * to the host and the plugin's distribution call does nothing. */
typedef struct vs_draft_draw {
  vspec_sample_spec spec; /* rows, vocab, top_k, cfg_scale, temperature (> 0), top_p */
  const double *u;        /* chains: host [forwards], or NULL */
  const uint8_t *guided;  /* host [rows] */
  int32_t *tokens;        /* device: the drafts */
  float *probs;           /* device [rows, vocab] */
  int forwards;
  /* static trees (NULL for a chain) */
  const int32_t *fwd;                  /* host [forwards + 1] */
  const vspec_children_spec *children; /* device counts, first and u, over all the rows */
  int32_t *row_tokens;                 /* device [rows]: draw_probs' own tokens (unused) */
} vs_draft_draw;
/* Whether the model's backend can draw on the device (its info's device_tokens). */
int vs_draft_model_draws(const vs_draft_model *m);
/* Draws as `d` says from the next forward on (forward 0 first), or on the host with NULL. */
void vs_draft_model_set_draw(vs_draft_model *m, const vs_draft_draw *d);

#endif /* VS_DRAFT_MODEL_H */
