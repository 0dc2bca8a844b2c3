/*
 * core/draft_model.c - the engine's side of vspec_draft_model: sessions, forwards through
 * the forward gate, commits and the processed draft distribution (core/draft_model.h).
 */
#include "core/draft_model.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/forward_gate.h"
#include "core/sampling.h"

struct vs_draft_model {
  vspec_draft_model abi;
  const vs_backend_model *bm;
  vspec_dev *dev;
  const vs_job *job;
  int rows, max_nodes;
  vs_forward_gate *gate; /* batched with other jobs' forwards, or NULL */
  vs_sampler sampler;
  float *prefill_logits; /* [rows, vocab]: the prefill's output, which no drafter reads */
};

static int dm_open(void *ctx, vspec_session **out, char *err, size_t errlen) {
  vs_draft_model *m = ctx;
  const vs_job *job = m->job;
  vspec_session_config sc = {.struct_size = sizeof sc, .class_label = job->class_label,
                             .caption = job->caption, .caption_mask = job->caption_mask,
                             .rows = m->rows, .max_nodes = m->max_nodes};
  char inner[VSPEC_ERRLEN] = "";
  vspec_session *s = NULL;
  int rc = m->bm->vt->session_open(m->bm->model, m->dev, &sc, &s, inner, sizeof inner);
  if (!rc) {
    /* Condition positions (a plain draft GPT); a feature head may have none. */
    vspec_forward_out o = {.struct_size = sizeof o, .logits = m->prefill_logits};
    rc = m->bm->vt->prefill(s, &o, inner, sizeof inner);
  }
  if (rc) {
    snprintf(err, errlen, "drafter: %s", inner);
    if (s) m->bm->vt->session_close(s);
    return rc;
  }
  *out = s;
  return VSPEC_OK;
}

static void dm_close(void *ctx, vspec_session *s) {
  vs_draft_model *m = ctx;
  if (s) m->bm->vt->session_close(s);
}

static int dm_forward(void *ctx, vspec_session *s, const vspec_forward_batch *b,
                      vspec_forward_out *o, char *err, size_t errlen) {
  vs_draft_model *m = ctx;
  char inner[VSPEC_ERRLEN] = "";
  int rc = vs_forward_gate_forward(m->gate, m->bm, s, m->dev, b, o, inner, sizeof inner);
  if (rc) snprintf(err, errlen, "drafter forward: %s", inner);
  return rc;
}

static int dm_commit(void *ctx, vspec_session *s, const int32_t *path, int32_t n, char *err,
                     size_t errlen) {
  vs_draft_model *m = ctx;
  char inner[VSPEC_ERRLEN] = "";
  int rc = m->bm->vt->commit(s, path, n, inner, sizeof inner);
  if (rc) snprintf(err, errlen, "drafter commit: %s", inner);
  return rc;
}

static void dm_distribution(void *ctx, const float *logits, int32_t image_index, float *probs) {
  vs_draft_model *m = ctx;
  vs_sampling s = m->job->sampling;
  if (!(s.temperature > 0.0f)) s.temperature = 1.0f;
  vs_node_distribution(&m->sampler, logits, m->rows, image_index, &s, probs);
}

int vs_draft_model_new(const vs_backend_model *bm, vspec_dev *dev, const vs_job *job, int rows,
                       int max_nodes, vs_draft_model **out, char *err, size_t errlen) {
  vs_draft_model *m = calloc(1, sizeof *m);
  if (!m || vs_sampler_init(&m->sampler, bm->info.vocab) ||
      !(m->prefill_logits = malloc((size_t)rows * bm->info.vocab * sizeof(float)))) {
    vs_draft_model_free(&m);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  m->bm = bm;
  m->dev = dev;
  m->job = job;
  m->rows = rows;
  m->max_nodes = max_nodes;
  m->abi = (vspec_draft_model){.struct_size = sizeof m->abi, .info = &bm->info, .ctx = m,
                               .open = dm_open, .close = dm_close, .forward = dm_forward,
                               .commit = dm_commit, .distribution = dm_distribution};
  *out = m;
  return VSPEC_OK;
}

void vs_draft_model_free(vs_draft_model **pm) {
  vs_draft_model *m = *pm;
  if (!m) return;
  vs_sampler_free(&m->sampler);
  free(m->prefill_logits);
  free(m);
  *pm = NULL;
}

const vspec_draft_model *vs_draft_model_abi(const vs_draft_model *m) { return &m->abi; }

void vs_draft_model_set_gate(vs_draft_model *m, struct vs_forward_gate *gate) { m->gate = gate; }
