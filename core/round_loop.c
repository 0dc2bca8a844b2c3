/*
 * core/round_loop.c - one job's rounds, from the target's prefill to the last token, for
 * every method (core/round_loop.h). Vanilla AR runs here too, as rounds with no draft.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/method_plugins.h"
#include "core/params.h"
#include "core/round_loop.h"
#include "core/status.h"
#include "kernels/common/vs_philox.h"
#include "kernels/vs_kernels.h"

static void rl_report(vs_rounds *c, int64_t round, int skipped, const int32_t *tokens, int n,
                       int prepended, int accepted_len, const vs_tree *tree) {
  if (!c->job->on_round) return;
  vs_round_info info = {.round = round, .skipped = skipped, .n_tokens = n, .tokens = tokens,
                        .status = c->job->status, .prepended = prepended,
                        .accepted_len = accepted_len, .tree = tree, .target = c->t,
                        .session = c->sess, .metrics = c->mt, .rule_plugin = c->rule_plugin,
                        .sched_plugin = c->sched_plugin};
  c->job->on_round(c->job->user, &info);
}

/* ---- set-up and tear-down -------------------------------------------------------------- */

static int rl_plugins_open(vs_rounds *c, const vs_method *m, char *err, size_t errlen) {
  int rc = vs_rule_open(c->models->reg, c->models->host, m->rule, &m->rule_set, 0,
                        c->models->name, &c->rule_plugin, &c->rule, err, errlen);
  if (rc) return rc;
  c->rule_vt = vs_plugin_vtable(c->rule_plugin);
  /* Only a rule that reads the neighbour table makes the model build it (once). */
  if ((vs_plugin_desc(c->rule_plugin)->flags & VSPEC_PLUGIN_USES_NEIGHBOURS) &&
      (rc = vs_models_neighbours(c->models, &c->neighbours, &c->neighbours_k, err, errlen)))
    return rc;
  rc = vs_sched_open(c->models->reg, c->models->host, m->sched, &m->sched_set,
                     &c->sched_plugin, &c->sched, err, errlen);
  if (!rc) c->sched_vt = vs_plugin_vtable(c->sched_plugin);
  return rc;
}

static void rl_rounds_free(vs_rounds *c) {
  if (c->gate) vs_forward_gate_leave(c->gate);
  if (c->rule) c->rule_vt->destroy(c->rule);
  if (c->sched) c->sched_vt->destroy(c->sched);
  vs_plugin_release(c->rule_plugin);
  vs_plugin_release(c->sched_plugin);
  vs_drafter_close(c->drafter);
  vs_walk_device_free(c);
  vs_draft_device_free(c);
  if (c->sess) c->t->vt->session_close(c->sess);
  vs_tree_free(&c->tree);
  vs_tree_free(&c->pool);
  void *bufs[] = {c->logits,      c->feats,      c->path_feats, c->unv,       c->fcache,
                  c->view_tokens, c->view_depth, c->view_score, c->parents,   c->order,
                  c->feat_node,   c->pool_cu,    c->q,          c->q_res,     c->q_tmp,
                  c->p_work};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  vs_sampler_free(&c->sampler);
}

/* Nodes the drafter forwards in one round besides the root. */
static int rl_plan_expansions(const vspec_round_plan *p) {
  switch (p->shape) {
    case VSPEC_DRAFT_CHAIN: return p->depth;
    case VSPEC_DRAFT_STATIC: return p->n_static;
    case VSPEC_DRAFT_DYNAMIC: return p->depth * p->top_k;
    default: return 0;
  }
}

static int rl_plan_nodes(const vspec_round_plan *p) {
  switch (p->shape) {
    case VSPEC_DRAFT_NONE: return 1;
    case VSPEC_DRAFT_CHAIN: return 1 + p->depth;
    case VSPEC_DRAFT_STATIC: return 1 + p->n_static;
    case VSPEC_DRAFT_DYNAMIC: return 1 + p->total_tokens;
    default: return -1;
  }
}

/* The drafter the first plan asks for (*kind, resolved), checked against the target; *out
 * is its model (NULL for jacobi, which has none). */
static int rl_pick_drafter(vs_rounds *c, const vs_method *m, const vspec_round_plan *plan,
                            uint32_t *kind, const vs_backend_model **out, char *err,
                            size_t errlen) {
  vs_models *models = c->models;
  uint32_t dk = plan->drafter;
  if (dk == VSPEC_DRAFTER_AUTO) dk = models->eagle.model ? VSPEC_DRAFTER_HEAD : VSPEC_DRAFTER_MODEL;
  *kind = dk;
  *out = NULL;
  if (dk == VSPEC_DRAFTER_PLUGIN) {
    /* A drafter named by the scheduler gets the directory's draft model if it wants one. */
    if (models->draft.model) *out = &models->draft;
    return VSPEC_OK;
  }
  if (dk > VSPEC_DRAFTER_PLUGIN) {
    snprintf(err, errlen, "scheduler '%s' asked for unknown drafter kind %u", m->sched, dk);
    return VSPEC_EINVAL;
  }
  const vs_backend_model *dm = dk == VSPEC_DRAFTER_HEAD ? &models->eagle : &models->draft;
  if (!dm->model) {
    snprintf(err, errlen, "method '%s' needs a %s, but model '%s' has none (vspec-model.json "
             "\"%s\"); drafter=jacobi needs none", m->text,
             dk == VSPEC_DRAFTER_HEAD ? "draft head" : "draft model", models->name,
             dk == VSPEC_DRAFTER_HEAD ? "eagle" : "draft");
    return VSPEC_EINVAL;
  }
  if (dm->info.vocab != c->V || dm->info.grid_h != c->t->info.grid_h ||
      dm->info.grid_w != c->t->info.grid_w) {
    snprintf(err, errlen, "the drafter (vocabulary %d, grid %dx%d) does not match the target "
             "(vocabulary %d, grid %dx%d)", dm->info.vocab, dm->info.grid_h, dm->info.grid_w, c->V,
             c->t->info.grid_h, c->t->info.grid_w);
    return VSPEC_ESHAPE;
  }
  *out = dm;
  return VSPEC_OK;
}

/* Host buffers for trees of up to `cap` nodes; the dynamic tree's candidate pool too when
 * the first plan asks for one (only its frontier nodes are expanded). */
static int rl_buffers(vs_rounds *c, int cap, const vspec_round_plan *plan) {
  size_t V = (size_t)c->V, R = (size_t)c->rows, F = (size_t)c->fdim;
  size_t pool = VS_SD_MAX_POOL > V ? VS_SD_MAX_POOL : V;
  c->logits = malloc((size_t)cap * R * V * sizeof(float));
  c->feats = malloc((size_t)cap * R * F * sizeof(float) + 1);
  c->path_feats = malloc((size_t)(VS_MAX_DEPTH + 2) * R * F * sizeof(float) + 1);
  c->unv = malloc((size_t)c->N * sizeof(int32_t));
  c->fcache = malloc((size_t)(c->N + 1) * R * F * sizeof(float) + 1);
  c->view_tokens = malloc((size_t)cap * sizeof(int32_t));
  c->view_depth = malloc((size_t)cap * sizeof(int32_t));
  c->view_score = malloc((size_t)cap * sizeof(float));
  c->parents = malloc(VS_SD_MAX_POOL * sizeof(int32_t));
  c->order = malloc(VS_SD_MAX_POOL * sizeof(int32_t));
  c->feat_node = malloc((size_t)cap * sizeof(int32_t));
  c->pool_cu = malloc(pool * sizeof(float));
  c->q = malloc(V * sizeof(float));
  c->q_res = malloc(V * sizeof(float));
  c->q_tmp = malloc(V * sizeof(float));
  c->p_work = malloc(V * sizeof(float));
  if (!c->logits || !c->feats || !c->path_feats || !c->unv || !c->fcache || !c->view_tokens ||
      !c->view_depth || !c->view_score || !c->parents || !c->order || !c->feat_node ||
      !c->pool_cu || !c->q || !c->q_res || !c->q_tmp || !c->p_work ||
      vs_sampler_init(&c->sampler, c->V) || vs_tree_init(&c->tree, cap, cap, c->V) ||
      (plan->shape == VSPEC_DRAFT_DYNAMIC &&
       vs_tree_init(&c->pool, VS_SD_MAX_POOL, 1 + plan->depth * plan->top_k, c->V)))
    return VSPEC_ENOMEM;
  return VSPEC_OK;
}

/* ---- one round ----------------------------------------------------------------------- */

/* Asks the scheduler for this round's plan and checks it against what the job allows;
 * *need receives the nodes the target will verify (root included). */
static int rl_plan_round(vs_rounds *c, const vs_method *m, const vspec_round_state *st,
                          vspec_round_plan *plan, int expand_max, int cap, int *need, char *err,
                          size_t errlen) {
  if (!c->sched) { /* ar: a round with no draft */
    memset(plan, 0, sizeof *plan);
    plan->struct_size = sizeof *plan;
    *need = 1;
    return VSPEC_OK;
  }
  if (c->sched_vt->plan(c->sched, st, plan)) {
    snprintf(err, errlen, "scheduler '%s' failed to plan round %d", m->sched, st->round);
    return VSPEC_EINVAL;
  }
  if (plan->shape > VSPEC_DRAFT_DYNAMIC || plan->depth < 0 || plan->depth > VS_MAX_DEPTH ||
      (plan->shape == VSPEC_DRAFT_DYNAMIC &&
       (plan->top_k < 1 || plan->top_k > 64 || plan->total_tokens < 1)) ||
      (plan->shape == VSPEC_DRAFT_STATIC && plan->n_static > 0 && !plan->static_parents)) {
    snprintf(err, errlen, "scheduler '%s' returned an invalid plan", m->sched);
    return VSPEC_EINVAL;
  }
  int n = rl_plan_nodes(plan);
  if (rl_plan_expansions(plan) > expand_max ||
      (plan->shape == VSPEC_DRAFT_DYNAMIC &&
       1 + plan->top_k + plan->depth * plan->top_k * plan->top_k > VS_SD_MAX_POOL)) {
    snprintf(err, errlen, "scheduler '%s' planned more drafting than the job allows (the first "
             "round's plan sizes the drafter; dynamic pools hold %d nodes)", m->sched,
             VS_SD_MAX_POOL);
    return VSPEC_ERANGE;
  }
  if (plan->shape == VSPEC_DRAFT_DYNAMIC && n + c->n_unv > cap && c->n_unv < cap - 1)
    n = cap - c->n_unv; /* the dynamic tree is trimmed to fit */
  if (plan->shape == VSPEC_DRAFT_DYNAMIC && !c->pool.nodes &&
      vs_tree_init(&c->pool, VS_SD_MAX_POOL, 1 + expand_max, c->V)) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  if (n < 1 || n + c->n_unv > cap) {
    snprintf(err, errlen, "scheduler '%s' planned a tree of %d nodes (+%d unverified): allowed "
             "1..%d", m->sched, n, c->n_unv, cap);
    return VSPEC_ERANGE;
  }
  *need = n;
  return VSPEC_OK;
}

static int rl_draft(vs_rounds *c, const vspec_round_plan *plan, int depth_limit,
                     int32_t root_index, char *err, size_t errlen) {
  if (vs_drafter_proposes(c->drafter))
    return vs_drafter_propose(c->drafter, &c->tree,
                              plan->depth < depth_limit ? plan->depth : depth_limit, root_index,
                              err, errlen);
  int chain = plan->depth < depth_limit ? plan->depth : depth_limit;
  vs_draft_device_round(c, plan, plan->shape == VSPEC_DRAFT_CHAIN ? chain : depth_limit,
                        root_index);
  int rc = vs_drafter_begin(c->drafter, &c->tree, root_index, err, errlen);
  if (!rc) switch (plan->shape) {
      case VSPEC_DRAFT_CHAIN: rc = vs_draft_chain(c, chain, root_index, err, errlen); break;
      case VSPEC_DRAFT_STATIC:
        rc = vs_draft_static(c, plan, depth_limit, root_index, err, errlen);
        break;
      case VSPEC_DRAFT_DYNAMIC:
        rc = vs_draft_dynamic(c, plan, depth_limit, root_index, err, errlen);
        break;
      default:
        rc = vs_fail(err, errlen, VSPEC_EINVAL, "scheduler planned unknown draft shape %u",
                     plan->shape);
    }
  vs_draft_device_done(c);
  return rc;
}

/* One target forward: the unverified tokens of skipped rounds first (post-verification:
 * their KV entries and features are filled, they are not judged again), then the tree. */
static int rl_verify_forward(vs_rounds *c, vspec_forward_out *out, char *err, size_t errlen) {
  int u = c->n_unv, nb = u + c->tree.n;
  int32_t *bt = c->order, *bp = c->parents;
  for (int i = 0; i < u; i++) {
    bt[i] = c->unv[i];
    bp[i] = i - 1;
  }
  vs_tree_parents(&c->tree, bp + u);
  for (int i = 0; i < c->tree.n; i++) {
    bt[u + i] = c->tree.nodes[i].token;
    bp[u + i] = i == 0 ? u - 1 : bp[u + i] + u;
  }
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = nb, .tokens = bt, .parents = bp,
                           .token_dev = c->round_dev ? c->draft_tok_dev : NULL};
  /* A feature head reads the target's features on the device (core/draft_device.c) after a
   * drafted round, on the host after one without drafts: the rows a drafter holds are then
   * those of the last drafted round's, never overwritten before its next forward reads them. */
  int feats = c->drafter && vs_drafter_uses_features(c->drafter);
  c->feats_on_dev = c->tfeat_dev && c->tree.n > 1;
  out->features = feats && !c->feats_on_dev ? c->feats : NULL;
  out->features_dev = c->feats_on_dev ? c->tfeat_dev : NULL;
  char inner[VSPEC_ERRLEN] = "";
  int rc = vs_forward_gate_forward(c->gate, c->t, c->sess, c->dev, &b, out, inner,
                                   sizeof inner);
  if (rc) snprintf(err, errlen, "target forward: %s", inner);
  else if ((rc = vs_dev_check(c->dev, inner, sizeof inner)))
    snprintf(err, errlen, "device error during the target forward: %s", inner);
  c->logits_off = (size_t)u;
  return rc;
}

/* After the walk: commits the prepended tokens and the accepted path, caches their
 * features, emits the accepted tokens and `next`, and hands the drafter what it needs. */
static int rl_finish_round(vs_rounds *c, int drafted, int32_t root_index, const int32_t *path,
                            int n_path, int32_t next, int32_t *tokens, int *emitted,
                            int64_t round, char *err, size_t errlen) {
  int u = c->n_unv;
  size_t fs = (size_t)c->rows * c->fdim;
  int feats = c->drafter && vs_drafter_uses_features(c->drafter) && !c->feats_on_dev;
  int32_t commit[VS_SD_MAX_NODES];
  for (int i = 0; i < u; i++) commit[i] = i;
  for (int j = 0; j < n_path; j++) commit[u + j] = u + path[j];
  char inner[VSPEC_ERRLEN] = "";
  int rc = c->t->vt->commit(c->sess, commit, u + n_path, inner, sizeof inner);
  if (rc) {
    snprintf(err, errlen, "target commit: %s", inner);
    return rc;
  }
  c->n_unv = 0;
  if (feats) {
    /* Cache every verified feature: prepended token j sits at index root_index - u + j,
     * path node j at root_index + j; slot = index + 1. */
    for (int i = 0; i < u + n_path; i++)
      memcpy(c->fcache + (size_t)(root_index - u + i + 1) * fs,
             c->feats + (size_t)commit[i] * fs, fs * sizeof(float));
    c->n_fcache = root_index + n_path + 1;
  }
  int32_t acc_tokens[VS_MAX_DEPTH + 1];
  for (int j = 1; j < n_path; j++) {
    acc_tokens[j - 1] = c->tree.nodes[path[j]].token;
    if (c->job->status) c->job->status[*emitted] = VS_TOKEN_ACCEPTED;
    tokens[(*emitted)++] = acc_tokens[j - 1];
  }
  if (c->job->status) c->job->status[*emitted] = VS_TOKEN_TARGET;
  tokens[(*emitted)++] = next;
  c->mt->tokens = *emitted;
  rl_report(c, round, 0, tokens, *emitted, u, n_path - 1, c->drafter ? &c->tree : NULL);
  if (*emitted >= c->N || !c->drafter) return VSPEC_OK;
  /* The drafter needs the target features at the root and every accepted node. */
  float *pf = NULL;
  if (feats) {
    pf = c->path_feats;
    for (int j = 0; j < n_path; j++)
      memcpy(pf + j * fs, c->feats + ((size_t)u + path[j]) * fs, fs * sizeof(float));
  }
  vs_round_outcome o = {.tree = &c->tree, .path = path, .accepted = acc_tokens, .n = n_path - 1,
                        .features = pf, .next_root = next, .root_index = root_index,
                        .logits = c->logits + c->logits_off * c->rows * c->V};
  if (c->feats_on_dev) { /* the features stayed on the device: their rows */
    for (int j = 0; j < n_path; j++) c->feat_rows[j] = u + path[j];
    o.feature_table = c->tfeat_dev;
    o.feature_rows = c->feat_rows;
  }
  return drafted ? vs_drafter_end(c->drafter, &o, err, errlen)
                 : vs_drafter_skip(c->drafter, pf, next, err, errlen);
}

/* An AR step's draw (a round whose tree is the root alone: every round of `ar`, and the last
 * of sd): the backend draws on the device where it can (ABI 1.4, vspec_forward_out.sample),
 * else the host does, from the downloaded logits. The uniform is drawn before the forward,
 * from the same stream in the same order as the walk would, so both give the same token. */
typedef struct vs__ar_draw {
  vspec_sample_spec spec;
  uint8_t guided;
  double u;
  int32_t token;
} vs__ar_draw;

static void rl_ar_draw_ask(vs_rounds *c, int predicted_index, vs__ar_draw *d,
                            vspec_forward_out *out) {
  d->u = c->greedy ? 0.0 : vs_rng_uniform(&c->rng_target);
  d->token = -1;
  vs_sample_spec_one(c->s, c->rows, c->V, predicted_index, &d->guided, &d->u, &d->spec);
  out->sample = &d->spec;
  out->tokens = &d->token;
  out->sampled = 0;
}

/* The token of the step asked for by rl_ar_draw_ask; out's request is withdrawn. */
static int32_t rl_ar_draw_take(vs_rounds *c, int predicted_index, vs__ar_draw *d,
                                vspec_forward_out *out) {
  int sampled = out->sampled;
  out->sample = NULL;
  out->tokens = NULL;
  out->sampled = 0;
  if (sampled) return d->token;
  const float *l = c->logits + c->logits_off * c->rows * c->V;
  vs_node_distribution(&c->sampler, l, c->rows, predicted_index, c->s, c->q);
  return c->greedy ? vs_argmax_first(c->q, c->V) : vs_draw(c->q, c->V, d->u);
}

/* Round 0: the target's prefill gives image token 0 (an AR step). */
static int rl_prefill(vs_rounds *c, vspec_forward_out *out, int32_t *tokens, char *err,
                       size_t errlen) {
  char inner[VSPEC_ERRLEN] = "";
  double t0 = vs_now();
  vs__ar_draw d;
  rl_ar_draw_ask(c, 0, &d, out);
  c->logits_off = 0;
  int rc = c->t->vt->prefill(c->sess, out, inner, sizeof inner);
  if (rc) {
    snprintf(err, errlen, "target prefill: %s", inner);
    return rc;
  }
  if ((rc = vs_dev_check(c->dev, inner, sizeof inner))) {
    snprintf(err, errlen, "device error during the target prefill: %s", inner);
    return rc;
  }
  vs_metrics *mt = c->mt;
  double ts = vs_now();
  mt->verify_s += ts - t0;
  mt->target_forwards++;
  mt->rounds++;
  mt->tree_nodes++;
  tokens[0] = rl_ar_draw_take(c, 0, &d, out);
  mt->accept_s += vs_now() - ts;
  if (tokens[0] < 0) {
    snprintf(err, errlen, "the target distribution is empty (all probabilities zero)");
    return VSPEC_EINVAL;
  }
  mt->tokens = 1;
  if (c->job->status) c->job->status[0] = VS_TOKEN_TARGET;
  if (out->features) {
    memcpy(c->fcache, c->feats, (size_t)c->rows * c->fdim * sizeof(float));
    c->n_fcache = 1;
  }
  rl_report(c, 0, 0, tokens, 1, 0, 0, NULL);
  return VSPEC_OK;
}

/* ---- the loop ---------------------------------------------------------------------------- */

/* Opens the target session (and, for sd, the plugins and the drafter) for `cap`-node
 * trees; *expand_max receives what one round may expand. */
static int rl_open(vs_rounds *c, const vs_method *m, vspec_round_state *st,
                    vspec_round_plan *plan, int *cap, int *expand_max, char *err, size_t errlen) {
  const vs_job *job = c->job;
  const vs_backend_model *dm = NULL;
  uint32_t dk = 0;
  int rc;
  memset(plan, 0, sizeof *plan);
  plan->struct_size = sizeof *plan;
  *cap = 1;
  if (m->kind != VS_METHOD_AR) {
    if ((rc = rl_plugins_open(c, m, err, errlen))) return rc;
    /* The first plan fixes the drafter for the whole job (round -1: the sizing call). */
    st->round = -1;
    if (c->sched_vt->plan(c->sched, st, plan)) {
      snprintf(err, errlen, "scheduler '%s' failed to plan the first round", m->sched);
      return VSPEC_EINVAL;
    }
    if ((rc = rl_pick_drafter(c, m, plan, &dk, &dm, err, errlen))) return rc;
    *cap = VS_SD_MAX_NODES < c->t->info.max_nodes ? VS_SD_MAX_NODES : c->t->info.max_nodes;
  }
  vspec_session_config sc = {.struct_size = sizeof sc, .class_label = job->class_label,
                             .caption = job->caption, .caption_mask = job->caption_mask,
                             .rows = c->rows, .max_nodes = *cap};
  char inner[VSPEC_ERRLEN] = "";
  if ((rc = c->t->vt->session_open(c->t->model, c->dev, &sc, &c->sess, inner, sizeof inner))) {
    const char *why = rc == VSPEC_ENOMEM ? vs_dev_alloc_error(c->dev) : "";
    snprintf(err, errlen, "%s%s%s%s", inner, *why ? " (" : "", why, *why ? ")" : "");
    return rc;
  }
  if (rl_buffers(c, *cap, plan)) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  *expand_max = rl_plan_expansions(plan);
  if (m->kind == VS_METHOD_AR) return VSPEC_OK;
  /* Drafter capacity: the catch-up chain (accepted tokens), the root and the nodes one
   * round expands, which the plan bounds. */
  vs_drafter_config dc = {.kind = dk, .name = m->drafter, .params = &m->drafter_set,
                          .reg = c->models->reg, .host = c->models->host, .model = dm,
                          .dev = c->dev, .job = job, .rows = c->rows,
                          .max_nodes = VS_MAX_DEPTH + 2 + *expand_max,
                          .max_tree_nodes = VS_SD_MAX_POOL, .n_image = c->N,
                          .max_depth = *expand_max < VS_MAX_DEPTH ? *expand_max : VS_MAX_DEPTH,
                          .target_feature_dim = c->fdim, .vocab = c->V,
                          .may_skip = c->sched_vt->decide != NULL};
  if ((rc = vs_drafter_open(&dc, &c->drafter, err, errlen))) return rc;
  if (vs_drafter_proposes(c->drafter) && (c->sched_vt->decide || plan->shape != VSPEC_DRAFT_CHAIN)) {
    snprintf(err, errlen, "method '%s': drafter=%s builds its own drafts, which the target "
             "always verifies (scheduler 'standard', shape=chain)", m->text, m->drafter);
    return VSPEC_EINVAL;
  }
  /* A drafter named by the scheduler may read the target's logits (target_dist): host walk. */
  if ((rc = vs_walk_device_init(c, dk == VSPEC_DRAFTER_PLUGIN, err, errlen))) return rc;
  return vs_draft_device_init(c, dk, err, errlen);
}

/* One verification: the target's forward over the tree and the walk that accepts a path and
 * samples the next token (an AR step draws it with the forward, where the device can). */
static int rl_verify_step(vs_rounds *c, vspec_forward_out *out, int32_t root_index,
                          int32_t *path, int *n_path, int32_t *next, char *err, size_t errlen) {
  vs_metrics *mt = c->mt;
  double tv = vs_now();
  vs__ar_draw ar;
  int ar_step = c->tree.n == 1 && c->n_unv == 0;
  if (ar_step) rl_ar_draw_ask(c, root_index + 1, &ar, out);
  else vs_walk_device_ask(c, root_index, out);
  int rc = rl_verify_forward(c, out, err, errlen);
  if (rc) return rc;
  mt->verify_s += vs_now() - tv;
  mt->target_forwards++;
  mt->rounds++;
  mt->tree_nodes += c->tree.n;
  mt->draft_tokens += c->tree.n - 1; /* the target scores every draft node, walked or not */

  double tw = vs_now();
  if (ar_step) {
    path[0] = 0;
    *n_path = 1;
    if ((*next = rl_ar_draw_take(c, root_index + 1, &ar, out)) < 0) {
      snprintf(err, errlen, "the target distribution is empty (all probabilities zero)");
      return VSPEC_EINVAL;
    }
  } else if ((rc = vs_walk_device_take(c, out, path, n_path, next, err, errlen)) < 0) {
    return rc;
  } else if (rc == 1) {
    /* the draft stream after a tree drawn on the device; its absent drafts were no drafts */
    int tried;
    mt->draft_tokens -= vs_draft_device_settle(c, path[*n_path - 1], &tried);
    mt->siblings_tried -= tried;
  } else if (rc == 0 && (rc = vs_verify_walk(c, root_index, path, n_path, next, err, errlen))) {
    return rc;
  }
  mt->accept_s += vs_now() - tw;
  return VSPEC_OK;
}

int vs_round_loop_run(vs_models *models, vspec_dev *dev, const vs_job *job, const vs_method *m,
                      int32_t *tokens, vs_metrics *mt, char *err, size_t errlen) {
  vs_rounds c;
  memset(&c, 0, sizeof c);
  c.models = models;
  c.t = &models->target;
  c.dev = dev;
  c.job = job;
  c.s = &job->sampling;
  c.mt = mt;
  c.V = c.t->info.vocab;
  c.N = c.t->info.grid_h * c.t->info.grid_w;
  /* LlamaGen doubles the batch when cfg_scale > 1 and keeps it doubled throughout, even
   * for steps past cfg_interval (generate.py). */
  c.rows = c.s->cfg_scale > 1.0f ? 2 : 1;
  c.greedy = c.s->temperature <= 0.0f;
  c.fdim = c.t->info.feature_dim;
  vspec_round_state st = {.struct_size = sizeof st, .tokens_total = c.N,
                          .max_nodes = VS_SD_MAX_NODES};
  vspec_round_plan plan;
  int cap, expand_max;
  int rc = rl_open(&c, m, &st, &plan, &cap, &expand_max, err, errlen);
  if (rc) goto done;
  vs_rng_init(&c.rng_target, job->seed, VS_STREAM_TARGET_SAMPLE);
  vs_rng_init(&c.rng_draft, job->seed, VS_STREAM_DRAFT_SAMPLE);
  vs_rng_init(&c.rng_accept, job->seed, VS_STREAM_ACCEPT);
  vs_rng_init(&c.rng_sched, job->seed, VS_STREAM_SCHED);

  vspec_forward_out out = {.struct_size = sizeof out, .logits = c.logits,
                           .features = c.fdim > 0 && c.drafter ? c.feats : NULL};
  if ((rc = rl_prefill(&c, &out, tokens, err, errlen))) goto done;
  /* Batched with other jobs from here on, drafts and verifies (prefills stay alone: each
   * job's condition runs once). */
  if (job->gate) {
    vs_forward_gate_enter(job->gate);
    c.gate = job->gate;
    if (c.drafter) vs_drafter_set_gate(c.drafter, c.gate);
  }
  if (c.drafter && (rc = vs_drafter_start(c.drafter, tokens[0], c.feats, err, errlen))) goto done;

  int emitted = 1, last_skipped = 0;
  int64_t round = 1;
  int32_t path[VS_MAX_DEPTH + 2];
  while (emitted < c.N) {
    if (job->cancel && atomic_load(job->cancel)) {
      snprintf(err, errlen, "job cancelled");
      rc = VSPEC_ECANCELED;
      goto done;
    }
    int32_t root_index = emitted - 1;
    int remaining = c.N - emitted;
    /* Accepted drafts plus the token sampled after them must fit the image. */
    int depth_limit = remaining - 1 < VS_MAX_DEPTH ? remaining - 1 : VS_MAX_DEPTH;
    st.round = (int32_t)round;
    st.tokens_done = emitted;
    st.unverified = c.n_unv;
    st.last_skipped = last_skipped;
    st.verified_rounds = (int32_t)mt->rounds;
    int need;
    if ((rc = rl_plan_round(&c, m, &st, &plan, expand_max, cap, &need, err, errlen))) goto done;
    vs_tree_reset(&c.tree, tokens[root_index]);
    c.round_dev = 0;
    for (int i = 0; i < cap; i++) c.feat_node[i] = i;
    double td = vs_now();
    int drafted = c.drafter && depth_limit > 0 && plan.shape != VSPEC_DRAFT_NONE;
    if (drafted && (rc = rl_draft(&c, &plan, depth_limit, root_index, err, errlen))) goto done;
    mt->draft_s += vs_now() - td;
    if (c.drafter) { /* live, for round callbacks */
      mt->draft_forwards = vs_drafter_forwards(c.drafter);
      mt->draft_nodes = vs_drafter_nodes(c.drafter);
    }

    /* Verify, or accept a path without the target (VVS). */
    vspec_skip_decision dec = {.struct_size = sizeof dec};
    if (drafted && c.tree.n > 1 && c.sched_vt->decide &&
        (rc = vs_skip_decide(&c, &st, remaining, &dec, err, errlen)))
      goto done;
    if (dec.skip) {
      int gamma;
      if ((rc = vs_skip_accept(&c, &dec, root_index, tokens, &emitted, &gamma, err, errlen)))
        goto done;
      last_skipped = 1;
      rl_report(&c, round++, 1, tokens, emitted, 0, gamma, &c.tree);
      continue;
    }

    int n_path;
    int32_t next;
    if ((rc = rl_verify_step(&c, &out, root_index, path, &n_path, &next, err, errlen))) goto done;
    last_skipped = 0;
    if ((rc = rl_finish_round(&c, drafted, root_index, path, n_path, next, tokens, &emitted,
                               round++, err, errlen)))
      goto done;
  }
  mt->tokens = emitted;
  mt->draft_forwards = c.drafter ? vs_drafter_forwards(c.drafter) : 0;
  mt->draft_nodes = c.drafter ? vs_drafter_nodes(c.drafter) : 0;
done:
  rl_rounds_free(&c);
  return rc;
}
