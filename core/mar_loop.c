/*
 * core/mar_loop.c - MAR generation and continuous speculative decoding (core/mar_loop.h).
 */
#include "core/mar_loop.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/diffusion.h"
#include "core/method_plugins.h"
#include "core/params.h"
#include "core/status.h"
#include "kernels/common/vs_math.h"
#include "kernels/common/vs_philox.h"
#include "kernels/vs_kernels.h"

/* One network (target or draft) and its session. */
typedef struct vs_mar_net {
  const vs_backend_model *bm;
  vspec_session *s;
  int dim; /* condition width */
  int64_t forwards;
} vs_mar_net;

typedef struct vs_mar {
  vs_models *models;
  vspec_dev *dev;
  const vs_job *job;
  vs_metrics *mt;
  int N, C, K, num_iter, rows, final_noise, cfg_schedule;
  float cfg, temperature;
  vs_diffusion diff;
  vs_mar_net tgt, dft;
  /* plugins (speculative methods) */
  vs_plugin *rule_plugin, *sched_plugin;
  const vspec_accept_vtable *rule_vt;
  const vspec_sched_vtable *sched_vt;
  vspec_rule *rule;
  vspec_sched *sched;
  vspec_rng rng_accept, rng_residual;
  /* the job */
  int32_t *order;     /* [N] generation order */
  float *noise;       /* [N, K + 1, C]: initial state, per-step noise k = 1..K-1, final noise */
  float *tok_v, *tok_d; /* [N, C] verified grid, the draft's grid */
  uint8_t *known_v, *known_d, *stay;
  float *cfg_at;      /* [N] guidance scale of the step that revealed each position */
  int32_t *ids;       /* [N] zeros: what round callbacks see as the token ids */
  /* one batch of positions */
  int32_t *pos, *group, *tsteps;
  float *cond, *rows_x, *rows_c, *out, *xb, *mu, *lv, *sls;
  /* the draft's record of its tokens, per position */
  float *x_d, *mu_d, *lv_d, *sls_d;
  float *sig_d, *sig_g, *y; /* [C] */
} vs_mar;

int vs_mar_mask_len(int step, int num_iter, int seq, int n_masked) {
  double ratio = cos(M_PI / 2.0 * (double)(step + 1) / num_iter);
  int ml = (int)floor(seq * ratio);
  if (ml > n_masked - 1) ml = n_masked - 1;
  return ml < 1 ? 1 : ml;
}

/* ---- set-up ----------------------------------------------------------------------------- */

static int ml_net_open(vs_mar *c, vs_mar_net *net, const vs_backend_model *bm, char *err,
                       size_t errlen) {
  net->bm = bm;
  net->dim = bm->info.feature_dim;
  if (!VSPEC_HAS_FIELD(bm->vt, vspec_backend_vtable, decode_latents) || !bm->vt->condition ||
      !bm->vt->denoise) {
    snprintf(err, errlen, "backend '%s' declares continuous tokens but lacks condition/denoise",
             bm->info.arch ? bm->info.arch : "?");
    return VSPEC_EPLUGIN;
  }
  vspec_session_config sc = {.struct_size = sizeof sc, .class_label = c->job->class_label,
                             .rows = c->rows, .max_nodes = c->N};
  char inner[VSPEC_ERRLEN] = "";
  int rc = bm->vt->session_open(bm->model, c->dev, &sc, &net->s, inner, sizeof inner);
  if (rc) {
    const char *why = rc == VSPEC_ENOMEM ? vs_dev_alloc_error(c->dev) : "";
    snprintf(err, errlen, "%s%s%s%s", inner, *why ? " (" : "", why, *why ? ")" : "");
  }
  return rc;
}

static void ml_mar_free(vs_mar *c) {
  if (c->rule) c->rule_vt->destroy(c->rule);
  if (c->sched) c->sched_vt->destroy(c->sched);
  vs_plugin_release(c->rule_plugin);
  vs_plugin_release(c->sched_plugin);
  if (c->tgt.s) c->tgt.bm->vt->session_close(c->tgt.s);
  if (c->dft.s) c->dft.bm->vt->session_close(c->dft.s);
  vs_diffusion_free(&c->diff);
  void *bufs[] = {c->order, c->noise, c->tok_v, c->tok_d, c->known_v, c->known_d, c->stay,
                  c->cfg_at, c->ids, c->pos, c->group, c->tsteps, c->cond, c->rows_x, c->rows_c, c->out,
                  c->xb, c->mu, c->lv, c->sls, c->x_d, c->mu_d, c->lv_d, c->sls_d, c->sig_d,
                  c->sig_g, c->y};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

static int ml_mar_buffers(vs_mar *c) {
  size_t N = (size_t)c->N, C = (size_t)c->C, R = (size_t)c->rows, K = (size_t)c->K;
  size_t D = (size_t)(c->tgt.dim > c->dft.dim ? c->tgt.dim : c->dft.dim);
  size_t f = sizeof(float);
  c->order = malloc(N * sizeof(int32_t));
  c->noise = malloc(N * (K + 1) * C * f);
  c->tok_v = calloc(N * C, f);
  c->tok_d = calloc(N * C, f);
  c->known_v = calloc(N, 1);
  c->known_d = calloc(N, 1);
  c->stay = calloc(N, 1);
  c->cfg_at = malloc(N * f);
  c->ids = calloc(N, sizeof(int32_t));
  c->pos = malloc(N * sizeof(int32_t));
  c->group = malloc(N * sizeof(int32_t));
  c->tsteps = malloc(R * N * sizeof(int32_t));
  c->cond = malloc(N * R * D * f);
  c->rows_x = malloc(R * N * C * f);
  c->rows_c = malloc(R * N * D * f);
  c->out = malloc(R * N * 2 * C * f);
  c->xb = malloc(N * C * f);
  c->mu = malloc(N * C * f);
  c->lv = malloc(N * C * f);
  c->sls = malloc(N * C * f);
  c->x_d = malloc(N * C * f);
  c->mu_d = malloc(N * C * f);
  c->lv_d = malloc(N * C * f);
  c->sls_d = malloc(N * C * f);
  c->sig_d = malloc(C * f);
  c->sig_g = malloc(C * f);
  c->y = malloc(C * f);
  void *bufs[] = {c->order, c->noise, c->tok_v, c->tok_d, c->known_v, c->known_d, c->stay,
                  c->cfg_at, c->ids, c->pos, c->group, c->tsteps, c->cond, c->rows_x, c->rows_c, c->out,
                  c->xb, c->mu, c->lv, c->sls, c->x_d, c->mu_d, c->lv_d, c->sls_d, c->sig_d,
                  c->sig_g, c->y};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (!bufs[i]) return VSPEC_ENOMEM;
  return VSPEC_OK;
}

/* The order (a uniform permutation, Fisher-Yates on its own stream) and every position's
 * noises on the position's own stream: x_{K-1}, then the noise of steps K-1 .. 1, then the
 * final step's (used by the speculative methods only). */
static void ml_mar_draws(vs_mar *c) {
  size_t per = (size_t)(c->K + 1) * c->C;
  if (c->job->mar_order && c->job->mar_noise) {
    memcpy(c->order, c->job->mar_order, (size_t)c->N * sizeof(int32_t));
    memcpy(c->noise, c->job->mar_noise, (size_t)c->N * per * sizeof(float));
    return;
  }
  vspec_rng r;
  vs_rng_init(&r, c->job->seed, VS_STREAM_ORDER);
  for (int i = 0; i < c->N; i++) c->order[i] = i;
  for (int i = c->N - 1; i > 0; i--) {
    int j = (int)(vs_rng_uniform(&r) * (i + 1));
    int32_t t = c->order[i];
    c->order[i] = c->order[j];
    c->order[j] = t;
  }
  for (int p = 0; p < c->N; p++) {
    vs_rng_init(&r, c->job->seed, (uint64_t)VS_STREAM_NOISE + (uint64_t)p);
    float *nz = c->noise + (size_t)p * per;
    /* slot 0: x_{K-1}; slot k (1..K-1): the noise added at step k; slot K: the final step's */
    for (size_t i = 0; i < per; i++) nz[i] = (float)vs_rng_normal(&r);
  }
}

/* ---- one step's positions ------------------------------------------------------------------ */

/* The positions `step` reveals given what is known (ascending), with the guidance scale of
 * that step recorded for each. */
static int ml_mar_reveal(vs_mar *c, int step, const uint8_t *known, int32_t *pos) {
  int n_masked = 0;
  for (int p = 0; p < c->N; p++) n_masked += !known[p];
  int ml = vs_mar_mask_len(step, c->num_iter, c->N, n_masked);
  /* the first ml positions of the order stay masked */
  uint8_t *stay = c->stay;
  memset(stay, 0, (size_t)c->N);
  if (step < c->num_iter - 1)
    for (int i = 0; i < ml; i++) stay[c->order[i]] = 1;
  float g = c->cfg_schedule == VS_CFG_LINEAR
                ? (float)(1.0 + (c->cfg - 1.0) * (double)(c->N - ml) / (double)c->N)
                : c->cfg;
  int n = 0;
  for (int p = 0; p < c->N; p++)
    if (!known[p] && !stay[p]) {
      pos[n++] = p;
      c->cfg_at[p] = g;
    }
  return n;
}

/* Conditions for n positions from one network over a grid. */
static int ml_mar_condition(vs_mar *c, vs_mar_net *net, const float *grid, const uint8_t *known,
                            const int32_t *pos, int n, char *err, size_t errlen) {
  char inner[VSPEC_ERRLEN] = "";
  int rc = net->bm->vt->condition(net->s, grid, known, pos, n, c->cond, inner, sizeof inner);
  net->forwards++;
  if (rc) snprintf(err, errlen, "%s transformer: %s", net == &c->tgt ? "target" : "draft", inner);
  else if ((rc = vs_dev_check(c->dev, inner, sizeof inner)))
    snprintf(err, errlen, "device error in the transformer: %s", inner);
  return rc;
}

/* The diffusion sampler (gaussian_diffusion.py p_sample_loop, DiffLoss.sample) for n
 * positions at once from the conditions in c->cond: every position starts from and adds
 * its own noises. Leaves the tokens in xb, the final step's mean and log variance in mu and
 * lv, and the sum of log sigma over the noisy steps in sls. */
static int ml_mar_sample(vs_mar *c, vs_mar_net *net, const int32_t *pos, int n, char *err,
                         size_t errlen) {
  int C = c->C, R = c->rows, D = net->dim, K = c->K;
  size_t per = (size_t)(K + 1) * C;
  for (int i = 0; i < n; i++) {
    memcpy(c->xb + (size_t)i * C, c->noise + (size_t)pos[i] * per, (size_t)C * sizeof(float));
    memset(c->sls + (size_t)i * C, 0, (size_t)C * sizeof(float));
  }
  /* rows [conditional x n ; unconditional x n], the same x for both (forward_with_cfg) */
  for (int r = 0; r < R; r++)
    for (int i = 0; i < n; i++)
      memcpy(c->rows_c + ((size_t)r * n + i) * D, c->cond + ((size_t)i * R + r) * D,
             (size_t)D * sizeof(float));
  float eps[256], mean[256], logvar[256];
  if (C > 256) {
    snprintf(err, errlen, "tokens of %d values: at most 256", C);
    return VSPEC_ERANGE;
  }
  char inner[VSPEC_ERRLEN] = "";
  for (int k = K - 1; k >= 0; k--) {
    for (int r = 0; r < R; r++) memcpy(c->rows_x + (size_t)r * n * C, c->xb, (size_t)n * C * sizeof(float));
    for (int i = 0; i < R * n; i++) c->tsteps[i] = c->diff.timestep[k];
    int rc = net->bm->vt->denoise(net->s, c->rows_x, c->tsteps, c->rows_c, R * n, c->out, inner,
                                  sizeof inner);
    if (rc) {
      snprintf(err, errlen, "%s diffusion head: %s", net == &c->tgt ? "target" : "draft", inner);
      return rc;
    }
    for (int i = 0; i < n; i++) {
      const float *oc = c->out + (size_t)i * 2 * C, *ou = c->out + ((size_t)n + i) * 2 * C;
      for (int j = 0; j < C; j++) eps[j] = R == 2 ? vs_cfg_mix(oc[j], ou[j], c->cfg_at[pos[i]]) : oc[j];
      float *x = c->xb + (size_t)i * C;
      vs_diffusion_mean_logvar(&c->diff, k, x, eps, oc + C, C, net->bm->info.clip_denoised, mean,
                               logvar);
      const float *nz = c->noise + (size_t)pos[i] * per;
      if (k == 0) {
        memcpy(c->mu + (size_t)i * C, mean, (size_t)C * sizeof(float));
        memcpy(c->lv + (size_t)i * C, logvar, (size_t)C * sizeof(float));
        for (int j = 0; j < C; j++)
          x[j] = c->final_noise ? mean[j] + expf(0.5f * logvar[j]) * c->temperature * nz[K * C + j]
                                : mean[j];
      } else {
        float *s = c->sls + (size_t)i * C;
        for (int j = 0; j < C; j++) {
          s[j] += 0.5f * logvar[j];
          x[j] = mean[j] + expf(0.5f * logvar[j]) * c->temperature * nz[(size_t)k * C + j];
        }
      }
    }
  }
  return VSPEC_OK;
}

static void ml_mar_report(vs_mar *c, int64_t round, int revealed) {
  if (!c->job->on_round) return;
  vs_round_info info = {.round = round, .n_tokens = revealed, .tokens = c->ids,
                        .status = c->job->status, .latents = c->tok_v,
                        .target = &c->models->target,
                        .metrics = c->mt, .rule_plugin = c->rule_plugin,
                        .sched_plugin = c->sched_plugin};
  c->job->on_round(c->job->user, &info);
}

static int ml_count(const uint8_t *known, int n) {
  int k = 0;
  for (int i = 0; i < n; i++) k += known[i] != 0;
  return k;
}

/* The target generates `step` itself (vanilla MAR, or pre-filling). */
static int ml_mar_target_step(vs_mar *c, int step, char *err, size_t errlen) {
  int n = ml_mar_reveal(c, step, c->known_v, c->pos);
  double t0 = vs_now();
  int rc = ml_mar_condition(c, &c->tgt, c->tok_v, c->known_v, c->pos, n, err, errlen);
  if (!rc) rc = ml_mar_sample(c, &c->tgt, c->pos, n, err, errlen);
  c->mt->verify_s += vs_now() - t0;
  if (rc) return rc;
  for (int i = 0; i < n; i++) {
    int p = c->pos[i];
    memcpy(c->tok_v + (size_t)p * c->C, c->xb + (size_t)i * c->C, (size_t)c->C * sizeof(float));
    memcpy(c->tok_d + (size_t)p * c->C, c->xb + (size_t)i * c->C, (size_t)c->C * sizeof(float));
    c->known_v[p] = c->known_d[p] = 1;
    if (c->job->status) c->job->status[p] = VS_TOKEN_TARGET;
  }
  c->mt->rounds++;
  return VSPEC_OK;
}

/* One drafted token: accepted as drafted, or replaced from the rule's residual. The
 * residual sampler is acceptance-rejection, exact however many proposals it takes: when a
 * call runs out of its budget the engine calls again (counted as a fallback), up to a cap
 * of about a million proposals that fails the job rather than return a wrong token. An
 * exact rule's residual keeps a proposal with probability TV(p, q), and is needed with the
 * same probability, so the expected proposals per token are at most 1 and the cap is hit
 * with probability below 1 / (e * 1e6) per token; a relaxed rule whose residual has no mass
 * left (the reference code's sigma factor can make q - p / F vanish) hits it for sure, and
 * says so. */
#define VS_MAR_RESIDUAL_PROPOSALS 1000000L

static int ml_mar_judge(vs_mar *c, int p, int gi, char *err, size_t errlen) {
  int C = c->C;
  size_t o = (size_t)p * C, og = (size_t)gi * C;
  for (int j = 0; j < C; j++) {
    c->sig_d[j] = expf(0.5f * c->lv_d[o + j]) * c->temperature;
    c->sig_g[j] = expf(0.5f * c->lv[og + j]) * c->temperature;
  }
  vspec_continuous_input in = {.struct_size = sizeof in, .dim = C, .x = c->x_d + o,
                               .mu_d = c->mu_d + o, .sigma_d = c->sig_d, .mu_g = c->mu + og,
                               .sigma_g = c->sig_g, .sum_log_sigma_d = c->sls_d + o,
                               .sum_log_sigma_g = c->sls + og};
  c->mt->drafted++;
  c->mt->draft_tokens++; /* judged on its own: every drafted token is examined */
  c->mt->siblings_tried++;
  double a = c->rule_vt->accept_prob_continuous(c->rule, &in);
  const float *res = c->x_d + o;
  int accepted = vs_rng_uniform(&c->rng_accept) < a;
  if (!accepted) {
    int rc = VSPEC_ERANGE;
    long proposals = 0;
    for (int call = 0; proposals < VS_MAR_RESIDUAL_PROPOSALS && rc == VSPEC_ERANGE; call++) {
      int32_t rounds = 0;
      rc = c->rule_vt->residual_continuous(c->rule, &in, &c->rng_residual, c->y, &rounds);
      c->mt->residual_rounds += rounds;
      proposals += rounds > 0 ? rounds : 1;
      if (rc == VSPEC_ERANGE && call == 0) c->mt->residual_fallbacks++;
    }
    if (rc == VSPEC_ERANGE) {
      snprintf(err, errlen, "the continuous rule's residual has no mass left at position %d: "
               "%ld proposals from the target's Gaussian were all refused (a relaxed rule's "
               "residual max(0, q - p / F) can vanish)", p, proposals);
      return VSPEC_EINVAL;
    }
    if (rc) {
      return vs_fail(err, errlen, rc, "the continuous rule failed to sample a residual: %s (%d)",
                     vspec_strerror(rc), rc);
    }
    res = c->y;
  } else {
    c->mt->accepted++;
  }
  memcpy(c->tok_v + o, res, (size_t)C * sizeof(float));
  memcpy(c->tok_d + o, res, (size_t)C * sizeof(float));
  c->known_v[p] = 1;
  if (c->job->status) c->job->status[p] = accepted ? VS_TOKEN_ACCEPTED : VS_TOKEN_TARGET;
  return VSPEC_OK;
}

/* The draft runs up to L steps on its own grid; one target forward verifies them all. */
static int ml_mar_group(vs_mar *c, int *step, int L, char *err, size_t errlen) {
  int C = c->C, ng = 0, rc;
  double t0 = vs_now();
  for (int j = 0; j < L && *step < c->num_iter; j++, (*step)++) {
    int n = ml_mar_reveal(c, *step, c->known_d, c->pos);
    if ((rc = ml_mar_condition(c, &c->dft, c->tok_d, c->known_d, c->pos, n, err, errlen)) ||
        (rc = ml_mar_sample(c, &c->dft, c->pos, n, err, errlen)))
      return rc;
    for (int i = 0; i < n; i++) {
      int p = c->pos[i];
      size_t o = (size_t)p * C, oi = (size_t)i * C, b = (size_t)C * sizeof(float);
      memcpy(c->x_d + o, c->xb + oi, b);
      memcpy(c->mu_d + o, c->mu + oi, b);
      memcpy(c->lv_d + o, c->lv + oi, b);
      memcpy(c->sls_d + o, c->sls + oi, b);
      memcpy(c->tok_d + o, c->xb + oi, b);
      c->known_d[p] = 1;
      c->group[ng++] = p;
    }
  }
  double t1 = vs_now();
  c->mt->draft_s += t1 - t0;
  /* the target, with only the verified tokens as context, along the same noises */
  if ((rc = ml_mar_condition(c, &c->tgt, c->tok_v, c->known_v, c->group, ng, err, errlen)) ||
      (rc = ml_mar_sample(c, &c->tgt, c->group, ng, err, errlen)))
    return rc;
  double t2 = vs_now();
  c->mt->verify_s += t2 - t1;
  c->mt->rounds++;
  for (int g = 0; g < ng; g++)
    if ((rc = ml_mar_judge(c, c->group[g], g, err, errlen))) return rc;
  c->mt->accept_s += vs_now() - t2;
  return VSPEC_OK;
}

/* ---- the job ----------------------------------------------------------------------------- */

static int ml_mar_plugins(vs_mar *c, const vs_method *m, char *err, size_t errlen) {
  int rc = vs_rule_open(c->models->reg, c->models->host, m->rule, &m->rule_set, 1,
                        c->models->name, &c->rule_plugin, &c->rule, err, errlen);
  if (rc) return rc;
  c->rule_vt = vs_plugin_vtable(c->rule_plugin);
  /* A MAR model drafts chains of generation steps: a scheduler told no shape gets a chain
   * (its default, a dynamic tree, has no meaning here). */
  const vspec_params *sp = &m->sched_set;
  vspec_params chain = {0};
  if (!vs_param_string(sp, "shape")) {
    /* shape=chain first, then the method's own, as a method that wrote it would have them */
    rc = vs_params_set(&chain, "shape", "chain", err, errlen);
    for (size_t i = 0; !rc && i < vs_params_count(sp); i++)
      rc = vs_params_set(&chain, vs_params_key(sp, i), vs_params_value(sp, i), err, errlen);
    if (rc) return rc;
    sp = &chain;
  }
  rc = vs_sched_open(c->models->reg, c->models->host, m->sched, sp, &c->sched_plugin,
                     &c->sched, err, errlen);
  if (!rc) c->sched_vt = vs_plugin_vtable(c->sched_plugin);
  return rc;
}

static int ml_mar_open(vs_mar *c, const vs_method *m, char *err, size_t errlen) {
  const vs_backend_model *t = &c->models->target;
  const vs_sampling *s = &c->job->sampling;
  c->N = t->info.grid_h * t->info.grid_w;
  c->C = t->info.token_dim;
  c->rows = s->cfg_scale != 1.0f ? 2 : 1;
  c->cfg = s->cfg_scale;
  c->cfg_schedule = s->cfg_schedule;
  c->temperature = s->temperature;
  c->num_iter = s->num_iter > 0 ? s->num_iter : (t->info.num_iter > 0 ? t->info.num_iter : c->N);
  if (c->num_iter > c->N) {
    snprintf(err, errlen, "num_iter %d is out of range: 1..%d for this model", c->num_iter, c->N);
    return VSPEC_ERANGE;
  }
  if (!c->job->latents) {
    snprintf(err, errlen, "model '%s' has continuous tokens: the job needs a latent buffer",
             c->models->name);
    return VSPEC_EINVAL;
  }
  int rc = vs_diffusion_init(&c->diff, t->info.diffusion_steps > 0 ? t->info.diffusion_steps : 1000,
                             t->info.sampling_steps > 0 ? t->info.sampling_steps : 100);
  if (rc) {
    snprintf(err, errlen, "diffusion schedule: %d steps respaced to %d is not possible",
             t->info.diffusion_steps, t->info.sampling_steps);
    return rc;
  }
  c->K = c->diff.steps;
  if ((rc = ml_net_open(c, &c->tgt, t, err, errlen))) return rc;
  if (m->kind != VS_METHOD_AR) {
    const vs_backend_model *d = &c->models->draft;
    if (!d->model) {
      snprintf(err, errlen, "method '%s' needs a draft model, but model '%s' has none "
               "(vspec-model.json \"draft\")", m->text, c->models->name);
      return VSPEC_EINVAL;
    }
    if (d->info.token_kind != VSPEC_TOKENS_CONTINUOUS || d->info.token_dim != c->C ||
        d->info.grid_h * d->info.grid_w != c->N) {
      snprintf(err, errlen, "the draft model (%dx%d tokens of %d values) does not match the "
               "target (%d tokens of %d values)", d->info.grid_h, d->info.grid_w,
               d->info.token_dim, c->N, c->C);
      return VSPEC_ESHAPE;
    }
    /* trajectory alignment runs both heads along one schedule */
    if (d->info.diffusion_steps != t->info.diffusion_steps ||
        d->info.sampling_steps != t->info.sampling_steps) {
      snprintf(err, errlen, "the draft's diffusion schedule (%d steps respaced to %d) differs "
               "from the target's (%d to %d)", d->info.diffusion_steps, d->info.sampling_steps,
               t->info.diffusion_steps, t->info.sampling_steps);
      return VSPEC_ESHAPE;
    }
    if ((rc = ml_mar_plugins(c, m, err, errlen)) || (rc = ml_net_open(c, &c->dft, d, err, errlen)))
      return rc;
    c->final_noise = 1; /* the speculative methods sample the final step's Gaussian */
  }
  if (ml_mar_buffers(c)) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  vs_rng_init(&c->rng_accept, c->job->seed, VS_STREAM_ACCEPT);
  vs_rng_init(&c->rng_residual, c->job->seed, VS_STREAM_RESIDUAL);
  ml_mar_draws(c);
  return VSPEC_OK;
}

int vs_mar_run(vs_models *models, vspec_dev *dev, const vs_job *job, const vs_method *m,
               vs_metrics *mt, char *err, size_t errlen) {
  vs_mar c;
  memset(&c, 0, sizeof c);
  c.models = models;
  c.dev = dev;
  c.job = job;
  c.mt = mt;
  int rc = ml_mar_open(&c, m, err, errlen);
  int step = 0;
  int64_t round = 0;
  vspec_round_state st = {.struct_size = sizeof st, .tokens_total = c.N, .max_nodes = c.N};
  while (!rc && step < c.num_iter) {
    if (job->cancel && atomic_load(job->cancel)) {
      snprintf(err, errlen, "job cancelled");
      rc = VSPEC_ECANCELED;
      break;
    }
    vspec_round_plan plan = {.struct_size = sizeof plan};
    if (c.sched) {
      st.round = (int32_t)round;
      st.tokens_done = ml_count(c.known_v, c.N);
      st.verified_rounds = (int32_t)mt->rounds;
      if (c.sched_vt->plan(c.sched, &st, &plan)) {
        snprintf(err, errlen, "scheduler '%s' failed to plan round %d", m->sched, st.round);
        rc = VSPEC_EINVAL;
        break;
      }
      if (plan.shape != VSPEC_DRAFT_NONE && plan.shape != VSPEC_DRAFT_CHAIN) {
        snprintf(err, errlen, "a MAR model drafts chains of generation steps: use shape=chain "
                 "with depth = steps per verification (scheduler '%s' planned a tree)", m->sched);
        rc = VSPEC_EINVAL;
        break;
      }
    }
    if (plan.shape == VSPEC_DRAFT_CHAIN && plan.depth >= 1)
      rc = ml_mar_group(&c, &step, plan.depth, err, errlen);
    else
      rc = ml_mar_target_step(&c, step++, err, errlen);
    if (!rc) {
      /* the counts so far, for progress reports (the totals are set below) */
      mt->tokens = ml_count(c.known_v, c.N);
      mt->target_forwards = c.tgt.forwards;
      mt->draft_forwards = c.dft.forwards;
      ml_mar_report(&c, round++, (int)mt->tokens);
    }
  }
  if (!rc) {
    memcpy(job->latents, c.tok_v, (size_t)c.N * c.C * sizeof(float));
    mt->tokens = c.N;
  }
  mt->target_forwards = c.tgt.forwards;
  mt->draft_forwards = c.dft.forwards;
  ml_mar_free(&c);
  return rc;
}
