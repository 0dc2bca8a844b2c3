#include "core/autotune.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/engine.h"
#include "core/forward_timing.h"
#include "core/params.h"

#define AT_CALIBRATION_IMAGES 6
/* The calibration images' first seed: fixed, so that a tuning does not depend on the job
 * that triggered it (only timings vary between tunings). */
#define AT_CALIBRATION_SEED 1000000u
#define AT_CURVE_MIN_TIME 0.2 /* seconds per cost-curve point */

static const int at_curve_nodes[] = {1, 2, 4, 8, 16, 32, 64};
#define AT_CURVE_N ((int)(sizeof at_curve_nodes / sizeof at_curve_nodes[0]))

/* The scheduler parameters that set a draft size: a method naming one is not defaulted. */
static const char *const at_size_keys[] = {"size", "depth", "total_tokens", "tree"};

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

/* The scheduler parameters of m without `size` and `skip` (NULL: none), as "k=v,...". */
static void at_params_without(const vspec_params *p, const char *skip, char *out, size_t cap) {
  size_t used = 0;
  out[0] = 0;
  for (size_t i = 0; i < vs_params_count(p); i++) {
    const char *k = vs_params_key(p, i);
    if (strcmp(k, "size") == 0 || (skip && strcmp(k, skip) == 0)) continue;
    used += (size_t)snprintf(out + used, used < cap ? cap - used : 0, "%s%s=%s",
                             used ? "," : "", k, vs_params_value(p, i));
  }
}

int vs_autotune_wanted(const vs_method *m, char *base, size_t base_len, char *err,
                       size_t errlen) {
  if (base && base_len) snprintf(base, base_len, "%s", m->sched_params);
  if (m->kind != VS_METHOD_SD) return 0;
  vspec_params *p;
  int rc = vs_params_parse(m->sched_params, &p, err, errlen);
  if (rc) return rc;
  const char *size = vs_param_string(p, "size");
  if (size && strcmp(size, "auto") != 0) {
    snprintf(err, errlen, "size=%s: only size=auto is understood (set the size itself with "
             "depth, total_tokens or tree)", size);
    vs_params_free(p);
    return VSPEC_EINVAL;
  }
  if (size && base && base_len) at_params_without(p, NULL, base, base_len);
  vs_params_free(p);
  return size != NULL;
}

int vs_autotune_default(vs_method *m, int continuous) {
  if (m->kind != VS_METHOD_SD || continuous || strcmp(m->sched, "standard") != 0) return 0;
  vspec_params *p;
  char err[VSPEC_ERRLEN];
  if (vs_params_parse(m->sched_params, &p, err, sizeof err)) return 0; /* the plugin says why */
  int named = 0;
  for (size_t i = 0; i < sizeof at_size_keys / sizeof at_size_keys[0]; i++)
    named |= vs_param_string(p, at_size_keys[i]) != NULL;
  vs_params_free(p);
  if (named) return 0;
  char sp[sizeof m->sched_params];
  if ((size_t)snprintf(sp, sizeof sp, "%s%ssize=auto", m->sched_params,
                       *m->sched_params ? "," : "") >= sizeof sp)
    return 0;
  vs_method d;
  char text[sizeof m->text];
  snprintf(text, sizeof text, "sd:%s%s%s@%s:%s", m->rule, *m->rule_params ? ":" : "",
           m->rule_params, m->sched, sp);
  if (vs_method_parse(text, &d, err, sizeof err)) return 0;
  *m = d;
  return 1;
}

/* The parameter a shape tunes and its candidates. */
int vs__autotune_candidates(const char *shape, const char **tuned, char cands[][48]) {
  int nc = 0;
  if (strcmp(shape, "chain") == 0) {
    *tuned = "depth";
    for (int d = 1; d <= 8; d++) snprintf(cands[nc++], 48, "depth=%d", d);
  } else if (strcmp(shape, "static") == 0) {
    static const char *const trees[] = {"chain1", "chain2", "chain3", "chain4", "fmnist",
                                        "mc_sim_7b_63"};
    *tuned = "tree";
    for (int i = 0; i < 6; i++) snprintf(cands[nc++], 48, "tree=%s", trees[i]);
  } else {
    static const int sizes[] = {2, 4, 8, 12, 16, 24, 32, 48, 58};
    *tuned = "total_tokens";
    for (int i = 0; i < 9; i++) snprintf(cands[nc++], 48, "total_tokens=%d", sizes[i]);
  }
  return nc;
}

/* One candidate's acceptance and per-round cost on the calibration images. */
static int at_measure_one(vs_models *models, vspec_dev *dev, const char *spec, const double *curve,
                          int32_t *tokens, vs_autotune_cand *c, char *err, size_t errlen) {
  int classes = models->target.info.num_classes > 0 ? models->target.info.num_classes : 1;
  vs_metrics total;
  memset(&total, 0, sizeof total);
  for (int i = 0; i < AT_CALIBRATION_IMAGES; i++) {
    vs_job job = {.method = spec, .class_label = i % classes,
                  .seed = AT_CALIBRATION_SEED + (uint64_t)i, .sampling = models->defaults};
    vs_metrics mt;
    int rc = vs_generate(models, dev, &job, tokens, &mt, err, errlen);
    if (rc) return rc;
    vs_metrics_add(&total, &mt);
  }
  /* Steady-state rounds: leave out each image's prefill round. */
  double rounds = (double)(total.rounds - AT_CALIBRATION_IMAGES);
  if (rounds <= 0) return 1;
  c->tokens_per_round = (double)(total.tokens - AT_CALIBRATION_IMAGES) / rounds;
  c->target_ms = at_cost(curve, (double)(total.tree_nodes - AT_CALIBRATION_IMAGES) / rounds);
  /* The verification walk (rules, residuals) is part of a round's cost too. */
  c->draft_ms = 1e3 * (total.draft_s + total.accept_s) / rounds;
  return 0;
}

int vs_autotune_measure(vs_models *models, vspec_dev *dev, const vs_method *m,
                        vs_autotune_result *res, char *err, size_t errlen) {
  /* size=auto weighs acceptance against the target's cost of verifying a token tree; a MAR
   * target verifies a group of generation steps with a bidirectional pass and a diffusion head
   * per token, a cost that curve does not describe. */
  if (models->target.info.token_kind == VSPEC_TOKENS_CONTINUOUS) {
    snprintf(err, errlen, "size=auto is not supported for continuous-token (MAR) models "
             "(model '%s'); use depth=L explicitly", models->name);
    return VSPEC_ENOTSUP;
  }
  vspec_params *p;
  int rc = vs_params_parse(m->sched_params, &p, err, errlen);
  if (rc) return rc;
  const char *shape = vs_param_string(p, "shape"), *tuned;
  char cands[VS_AUTOTUNE_MAX_CAND][48], base[512];
  int nc = vs__autotune_candidates(shape ? shape : "dynamic", &tuned, cands);
  at_params_without(p, tuned, base, sizeof base);
  vs_params_free(p);

  /* The cost curve, with the CFG rows the jobs will use. */
  int rows = models->defaults.cfg_scale > 1.0f ? 2 : 1;
  double curve[AT_CURVE_N];
  for (int i = 0; i < AT_CURVE_N; i++, res->timed++)
    if ((rc = vs_time_forward(dev, &models->target, rows, at_curve_nodes[i], AT_CURVE_MIN_TIME,
                              &curve[i], err, errlen)))
      return rc;
  res->ar_ms = curve[0];
  int32_t *tokens = malloc((size_t)(models->target.info.grid_h * models->target.info.grid_w) *
                           sizeof *tokens);
  if (!tokens) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  double best = -1.0;
  res->n_cand = 0;
  res->best = -1;
  for (int c = 0; c < nc; c++) {
    char spec[1100];
    snprintf(spec, sizeof spec, "sd:%s%s%s@%s:%s%s%s", m->rule, *m->rule_params ? ":" : "",
             m->rule_params, m->sched, base, *base ? "," : "", cands[c]);
    vs_autotune_cand *k = &res->cand[res->n_cand];
    memset(k, 0, sizeof *k);
    snprintf(k->param, sizeof k->param, "%s", cands[c]);
    rc = at_measure_one(models, dev, spec, curve, tokens, k, err, errlen);
    res->timed += AT_CALIBRATION_IMAGES;
    if (rc < 0) break;
    if (rc > 0) { /* no steady-state round: nothing to weigh */
      rc = 0;
      continue;
    }
    double score = k->tokens_per_round / (k->target_ms + k->draft_ms);
    if (score > best) {
      best = score;
      res->best = res->n_cand;
      snprintf(res->spec, sizeof res->spec, "%s", spec);
      snprintf(res->choice, sizeof res->choice, "%s", cands[c]);
    }
    res->n_cand++;
  }
  free(tokens);
  if (rc) return rc;
  if (res->best < 0) {
    snprintf(err, errlen, "size=auto: no candidate completed a round");
    return VSPEC_EINVAL;
  }
  res->tuned_at = (int64_t)time(NULL);
  return VSPEC_OK;
}

void vs_autotune_describe(const vs_autotune_result *res, char *buf, size_t len) {
  if (!res->choice[0]) {
    snprintf(buf, len, "%s", res->spec);
    return;
  }
  char day[32] = "?";
  time_t t = (time_t)res->tuned_at;
  struct tm tm;
  if (gmtime_r(&t, &tm)) strftime(day, sizeof day, "%Y-%m-%d %H:%M UTC", &tm);
  size_t n = res->from_cache
                 ? (size_t)snprintf(buf, len, "size=auto: chose %s (cached, tuned %s on %s)",
                                    res->choice, day, res->machine)
                 : (size_t)snprintf(buf, len, "size=auto: chose %s (tuned now on %s, %s)",
                                    res->choice, res->machine,
                                    res->stored ? "cached" : "not cached");
  if (res->best >= 0 && n < len) {
    const vs_autotune_cand *c = &res->cand[res->best];
    double ms = c->target_ms + c->draft_ms;
    n += (size_t)snprintf(buf + n, len - n, ": %.2f tokens/round in %.2f ms (target %.2f + "
                          "draft and walk %.2f), %.0f tokens/s expected", c->tokens_per_round,
                          ms, c->target_ms, c->draft_ms,
                          ms > 0 ? 1e3 * c->tokens_per_round / ms : 0.0);
  }
  if (vs_autotune_slower_than_ar(res) && n < len)
    snprintf(buf + n, len - n, "; slower than AR here (about %.0f tokens/s, one target forward "
             "per token): this drafter and shape do not pay on this machine (docs/BENCHMARKS.md "
             "lists the methods that do)", 1e3 / res->ar_ms);
}

int vs_autotune_slower_than_ar(const vs_autotune_result *res) {
  if (res->best < 0 || res->best >= res->n_cand || !(res->ar_ms > 0)) return 0;
  const vs_autotune_cand *c = &res->cand[res->best];
  double ms = c->target_ms + c->draft_ms;
  return ms > 0 && c->tokens_per_round / ms < 1.0 / res->ar_ms;
}

void vs_autotune_print_table(const vs_autotune_result *res, FILE *f) {
  if (res->n_cand == 0) return;
  fprintf(f, "  %-22s %12s %10s %10s %10s %10s\n", "candidate", "tok/round", "target ms",
          "draft ms", "round ms", "tok/s");
  for (int i = 0; i < res->n_cand; i++) {
    const vs_autotune_cand *c = &res->cand[i];
    double ms = c->target_ms + c->draft_ms;
    fprintf(f, "%s %-22s %12.2f %10.3f %10.3f %10.3f %10.0f\n", i == res->best ? "*" : " ",
            c->param, c->tokens_per_round, c->target_ms, c->draft_ms, ms,
            ms > 0 ? 1e3 * c->tokens_per_round / ms : 0.0);
  }
  if (res->ar_ms > 0)
    fprintf(f, "  %-22s %12.2f %10.3f %10s %10.3f %10.0f\n", "(ar: no draft)", 1.0, res->ar_ms,
            "-", res->ar_ms, 1e3 / res->ar_ms);
}
