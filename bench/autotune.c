#include "bench/autotune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/params.h"

#define AT_CALIBRATION_IMAGES 6
#define AT_MAX_CAND 16

static const int at_curve_nodes[] = {1, 2, 4, 8, 16, 32, 64};
#define AT_CURVE_N ((int)(sizeof at_curve_nodes / sizeof at_curve_nodes[0]))

/* Linear interpolation of the cost curve at `nodes` (extrapolated past 64). */
static double at_cost(const double *ms, double nodes) {
  if (nodes <= at_curve_nodes[0]) return ms[0];
  for (int i = 1; i < AT_CURVE_N; i++)
    if (nodes <= at_curve_nodes[i]) {
      double f = (nodes - at_curve_nodes[i - 1]) / (at_curve_nodes[i] - at_curve_nodes[i - 1]);
      return ms[i - 1] + f * (ms[i] - ms[i - 1]);
    }
  int a = AT_CURVE_N - 2, b = AT_CURVE_N - 1;
  return ms[b] + (nodes - at_curve_nodes[b]) * (ms[b] - ms[a]) / (at_curve_nodes[b] - at_curve_nodes[a]);
}

int vs_autotune_resolve(vs_bench_env *env, vs_models *models, const vs_method *m, uint64_t seed,
                        char *spec, size_t spec_len, char *note, size_t note_len, char *err,
                        size_t errlen) {
  snprintf(spec, spec_len, "%s", m->text);
  note[0] = 0;
  vspec_params *p;
  int rc = vs_params_parse(m->sched_params, &p, err, errlen);
  if (rc) return rc;
  const char *size = vs_param_string(p, "size");
  if (!size) {
    vs_params_free(p);
    return VSPEC_OK;
  }
  if (strcmp(size, "auto") != 0) {
    snprintf(err, errlen, "size=%s: only size=auto is understood (set the size itself with "
             "depth, total_tokens or tree)", size);
    vs_params_free(p);
    return VSPEC_EINVAL;
  }
  /* size=auto weighs acceptance against the target's cost of verifying a token tree; a MAR
   * target verifies a group of generation steps with a bidirectional pass and a diffusion head
   * per token, a cost that curve does not describe. */
  if (models->target.info.token_kind == VSPEC_TOKENS_CONTINUOUS) {
    snprintf(err, errlen, "size=auto is not supported for continuous-token (MAR) models "
             "(model '%s'); use depth=L explicitly", models->name);
    vs_params_free(p);
    return VSPEC_ENOTSUP;
  }
  /* Base parameters: everything but size and the parameter being tuned. */
  const char *shape = vs_param_string(p, "shape");
  if (!shape) shape = "dynamic";
  const char *tuned = strcmp(shape, "chain") == 0 ? "depth"
                      : strcmp(shape, "static") == 0 ? "tree" : "total_tokens";
  char base[512] = "";
  size_t used = 0;
  for (size_t i = 0; i < vs_params_count(p); i++) {
    const char *k = vs_params_key(p, i);
    if (strcmp(k, "size") == 0 || strcmp(k, tuned) == 0) continue;
    used += (size_t)snprintf(base + used, sizeof base - used, "%s%s=%s", used ? "," : "", k,
                             vs_params_value(p, i));
  }
  vs_params_free(p);
  char cands[AT_MAX_CAND][64];
  int nc = 0;
  if (strcmp(tuned, "depth") == 0) {
    for (int d = 1; d <= 8; d++) snprintf(cands[nc++], 64, "depth=%d", d);
  } else if (strcmp(tuned, "tree") == 0) {
    const char *trees[] = {"chain1", "chain2", "chain3", "chain4", "fmnist", "mc_sim_7b_63"};
    for (int i = 0; i < 6; i++) snprintf(cands[nc++], 64, "tree=%s", trees[i]);
  } else {
    const int sizes[] = {2, 4, 8, 12, 16, 24, 32, 48, 58};
    for (int i = 0; i < 9; i++) snprintf(cands[nc++], 64, "total_tokens=%d", sizes[i]);
  }

  /* The cost curve, with the CFG rows the jobs will use. */
  int rows = models->defaults.cfg_scale > 1.0f ? 2 : 1;
  double curve[AT_CURVE_N];
  for (int i = 0; i < AT_CURVE_N; i++)
    if ((rc = vs_bench_time_forward(env->dev, &models->target, rows, at_curve_nodes[i], 0.2,
                                    &curve[i], err, errlen)))
      return rc;

  int n_img = AT_CALIBRATION_IMAGES;
  int classes = models->target.info.num_classes > 0 ? models->target.info.num_classes : 1;
  int32_t *tokens = malloc((size_t)(models->target.info.grid_h * models->target.info.grid_w) *
                           sizeof *tokens);
  if (!tokens) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  double best = -1.0;
  int best_i = -1;
  char summary[1024] = "";
  size_t su = 0;
  double tpr_best = 0, target_best = 0, draft_best = 0;
  for (int c = 0; c < nc; c++) {
    char cand[1100];
    snprintf(cand, sizeof cand, "sd:%s%s%s@%s:%s%s%s", m->rule, *m->rule_params ? ":" : "",
             m->rule_params, m->sched, base, *base ? "," : "", cands[c]);
    vs_metrics total;
    memset(&total, 0, sizeof total);
    for (int i = 0; i < n_img; i++) {
      vs_job job = {.method = cand, .class_label = i % classes, .seed = seed + (uint64_t)i,
                    .sampling = models->defaults};
      vs_metrics mt;
      if ((rc = vs_generate(models, env->dev, &job, tokens, &mt, err, errlen))) {
        free(tokens);
        return rc;
      }
      vs_metrics_add(&total, &mt);
    }
    /* Steady-state rounds: leave out each image's prefill round. */
    double rounds = (double)(total.rounds - n_img);
    if (rounds <= 0) continue;
    double tpr = (double)(total.tokens - n_img) / rounds;
    double nodes = (double)(total.tree_nodes - n_img) / rounds;
    /* The verification walk (rules, residuals) is part of a round's cost too. */
    double target_ms = at_cost(curve, nodes),
           draft_ms = 1e3 * (total.draft_s + total.accept_s) / rounds;
    double score = tpr / (target_ms + draft_ms);
    su += (size_t)snprintf(summary + su, su < sizeof summary ? sizeof summary - su : 0,
                           "%s%s %.2f tok/round %.1f ms", su ? "; " : "", cands[c], tpr,
                           target_ms + draft_ms);
    if (score > best) {
      best = score;
      best_i = c;
      tpr_best = tpr;
      target_best = target_ms;
      draft_best = draft_ms;
    }
  }
  free(tokens);
  if (best_i < 0) {
    snprintf(err, errlen, "size=auto: no candidate completed a round");
    return VSPEC_EINVAL;
  }
  snprintf(spec, spec_len, "sd:%s%s%s@%s:%s%s%s", m->rule, *m->rule_params ? ":" : "",
           m->rule_params, m->sched, base, *base ? "," : "", cands[best_i]);
  snprintf(note, note_len,
           "size=auto chose %s: %.2f tokens/round in %.1f ms (target %.1f + draft and walk %.1f), "
           "%.0f tokens/s expected; candidates: %s",
           cands[best_i], tpr_best, target_best + draft_best, target_best, draft_best, 1e3 * best,
           summary);
  return VSPEC_OK;
}
