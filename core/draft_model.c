/*
 * core/draft_model.c - the engine's side of vspec_draft_model: sessions, forwards through
 * the forward gate, commits and the processed draft distribution (core/draft_model.h).
 */
#include "core/draft_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/forward_gate.h"
#include "core/sampling.h"
#include "kernels/vs_kernels.h"

struct vs_draft_model {
  vspec_draft_model abi;
  const vs_backend_model *bm;
  vspec_dev *dev;
  const vs_job *job;
  int rows, max_nodes;
  vs_forward_gate *gate; /* batched with other jobs' forwards, or NULL */
  vs_sampler sampler;
  float *prefill_logits; /* [rows, vocab]: the prefill's output, which no drafter reads */
  vs_draft_draw draw;    /* drafts drawn on the device while draw_on; draw_k forwards so far */
  int draw_on, draw_k;
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

/* A forward of the drafter that draws on the device (vs_draft_draw): the plugin's batch and
 * outputs with ABI 1.8's fields added, then a tree's children (draw_children). */
static int dm_forward_draw(vs_draft_model *m, vspec_session *s, const vspec_forward_batch *b,
                           vspec_forward_out *o, char *inner, size_t len) {
  const vs_draft_draw *d = &m->draw;
  int k = m->draw_k;
  if (k >= d->forwards) {
    snprintf(inner, len, "more forwards (%d) than drafts drawn on the device (%d)", k + 1,
             d->forwards);
    return VSPEC_ERANGE;
  }
  int r0 = d->fwd ? d->fwd[k] : k, nr = d->fwd ? d->fwd[k + 1] - r0 : 1;
  vspec_forward_batch b2 = {0};
  vspec_forward_out o2 = {0};
  memcpy(&b2, b, b->struct_size < sizeof b2 ? b->struct_size : sizeof b2);
  memcpy(&o2, o, o->struct_size < sizeof o2 ? o->struct_size : sizeof o2);
  b2.struct_size = sizeof b2;
  o2.struct_size = sizeof o2;
  b2.token_dev = d->tokens;
  vspec_sample_spec sp = d->spec;
  sp.n = nr;
  sp.u = d->u && !d->children ? d->u + r0 : NULL;
  sp.guided = d->guided + r0;
  o2.logits = NULL;
  o2.draw = &sp;
  o2.draw_probs = d->probs + (size_t)r0 * sp.vocab;
  o2.draw_tokens = d->children ? d->row_tokens + r0 : d->tokens + r0;
  /* alone on the job's device: a batch of several cannot draw drafts on the device */
  int rc = m->bm->vt->forward(s, &b2, &o2, inner, len);
  if (!rc && !o2.drawn) {
    snprintf(inner, len, "the draft model's backend did not draw on the device");
    rc = VSPEC_EABI;
  }
  /* children only where the job's device, which is this one, has draw_children
   * (core/draft_device.c) */
  if (!rc && d->children) {
    vspec_children_spec cs = *d->children;
    cs.n = nr;
    cs.counts += r0;
    cs.first += r0;
    cs.node += r0;
    vs_dev_ops(m->dev)->draw_children(m->dev, o2.draw_probs, &cs, d->tokens);
  }
  m->draw_k += !rc;
  return rc;
}

static int dm_forward(void *ctx, vspec_session *s, const vspec_forward_batch *b,
                      vspec_forward_out *o, char *err, size_t errlen) {
  vs_draft_model *m = ctx;
  char inner[VSPEC_ERRLEN] = "";
  int rc = m->draw_on ? dm_forward_draw(m, s, b, o, inner, sizeof inner)
                      : vs_forward_gate_forward(m->gate, m->bm, s, m->dev, b, o, inner,
                                                sizeof inner);
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
  if (m->draw_on) return; /* the distribution is on the device (vs_draft_draw) */
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

int vs_draft_model_draws(const vs_draft_model *m) {
  return VSPEC_HAS_FIELD(&m->bm->info, vspec_model_info, device_tokens) &&
         m->bm->info.device_tokens;
}

void vs_draft_model_set_draw(vs_draft_model *m, const vs_draft_draw *d) {
  m->draw_on = d != NULL;
  m->draw_k = 0;
  if (d) m->draw = *d;
}
