/*
 * bench/eval_report.c - eval's markdown tables, JSON and plot (see eval_report.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/eval_report.h"
#include "bench/plot.h"

static void json_num(FILE *f, double v) {
  if (isfinite(v)) fprintf(f, "%.6g", v);
  else fputs("null", f);
}

static void json_interval(FILE *f, vs_interval v) {
  if (!isfinite(v.lo) || !isfinite(v.hi)) {
    fputs("null", f);
    return;
  }
  fprintf(f, "[%.6g, %.6g]", v.lo, v.hi);
}

/* The acceptance columns of the first table. A continuous-token model has no acceptance by
 * depth (each drafted token is judged on its own, not along a path), so it shows what its
 * speed is made of instead: the forwards of draft and target, and the residual sampler's
 * proposals and budget exhaustions (totals over the images). */
static void table_header(FILE *f, int continuous) {
  if (continuous) {
    fprintf(f, "| method | TPF | MAL | accept | walk accept | draft forwards | target forwards | "
               "residual rounds | residual fallbacks | speed-up vs AR (median, total) "
               "| FID | KID | class acc | precision | recall |\n");
    fprintf(f, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    return;
  }
  fprintf(f, "| method | TPF | MAL | accept | walk accept | accept by depth 1/2/3/4 "
             "| speed-up vs AR (median, total) | FID | KID | class acc | precision | recall |\n");
  fprintf(f, "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|\n");
}

static void table_accept_cells(FILE *f, const vs_metrics *t, int continuous) {
  if (continuous) {
    fprintf(f, "%lld | %lld | %lld | %lld | ", (long long)t->draft_forwards,
            (long long)t->target_forwards, (long long)t->residual_rounds,
            (long long)t->residual_fallbacks);
    return;
  }
  for (int d = 1; d <= 4; d++)
    fprintf(f, "%s%.2f", d > 1 ? "/" : "", vs_metrics_accept_at(t, d));
  fprintf(f, " | ");
}

/* The interval eval shows of a figure: the kind whose coverage holds (VS_EVAL_CI_FID,
 * VS_EVAL_CI_ACC, VS_EVAL_CI_SPEEDUP). The normal interval contains its estimate by
 * construction, the shifted one unless the resamples' mean lies outside their own 95 %
 * range, the percentile interval of a median all but always; the hull with the estimate
 * guards the rest, so a printed interval never excludes the figure it is printed next to. */
static vs_interval shown(const vs_interval *v, vs_ci_kind kind, double estimate) {
  vs_interval r = v[kind];
  if (!isfinite(r.lo) || !isfinite(r.hi) || !isfinite(estimate)) return r;
  if (estimate < r.lo) r.lo = estimate;
  if (estimate > r.hi) r.hi = estimate;
  return r;
}

/* KID's interval: -/+ z standard errors (kid.h). */
static vs_interval kid_interval(double kid, double se) {
  if (!isfinite(kid) || !isfinite(se)) return (vs_interval){NAN, NAN};
  double z = vs_normal_quantile(0.975);
  return (vs_interval){kid - z * se, kid + z * se};
}

/* " [lo, hi]" after a figure, when the bootstrap gave an interval. */
static void interval_cell(FILE *f, vs_interval v, const char *fmt) {
  if (!isfinite(v.lo) || !isfinite(v.hi)) return;
  char lo[32], hi[32];
  snprintf(lo, sizeof lo, fmt, v.lo);
  snprintf(hi, sizeof hi, fmt, v.hi);
  fprintf(f, " [%s, %s]", lo, hi);
}

/* Each method against AR on the same images: the paired intervals a claim is read from. */
static void write_paired_table(FILE *f, const vs_eval_method *em, int n) {
  int any = 0;
  for (int i = 0; i < n; i++) any |= isfinite(em[i].ci.fid_ratio_ar[VS_EVAL_CI_FID].lo);
  if (!any) return;
  fprintf(f, "\n| method | FID / AR [95 %% CI] | KID - AR [95 %% CI] | class acc - AR [95 %% CI] "
             "| speed-up vs AR [95 %% CI] |\n|---|---:|---:|---:|---:|\n");
  for (int i = 0; i < n; i++) {
    fprintf(f, "| `%s` | %.3f", em[i].label, em[i].fid_ratio_ar);
    const vs_interval *ci_ratio = em[i].ci.fid_ratio_ar, *ci_acc = em[i].ci.acc_diff_ar;
    interval_cell(f, shown(ci_ratio, VS_EVAL_CI_FID, em[i].fid_ratio_ar), "%.3f");
    if (isfinite(em[i].kid_diff_ar)) fprintf(f, " | %+.3g", em[i].kid_diff_ar);
    else fprintf(f, " | -"); /* fewer images than KID's jackknife needs */
    interval_cell(f, kid_interval(em[i].kid_diff_ar, em[i].kid_diff_se), "%+.3g");
    fprintf(f, " | %+.3f", em[i].acc_diff_ar);
    interval_cell(f, shown(ci_acc, VS_EVAL_CI_ACC, em[i].acc_diff_ar), "%+.3f");
    fprintf(f, " | %.2fx", em[i].speedup_median);
    interval_cell(f, shown(em[i].ci.speedup, VS_EVAL_CI_SPEEDUP, em[i].speedup_median),
                  "%.2f");
    fprintf(f, " |\n");
  }
}

void vs_eval_write_table(FILE *f, vs_eval_method *em, int n, int images, vs_eval_floor floor,
                        const vs_eval_tokens *tk, const vs_bench_machine *mc, int resamples) {
  table_header(f, tk->continuous);
  for (int i = 0; i < n; i++) {
    const vs_metrics *t = &em[i].total;
    fprintf(f, "| `%s` | %.3f | %.3f | ", em[i].label, vs_metrics_tpf(t), vs_metrics_mal(t));
    /* Nothing drafted (AR): no acceptance to speak of. */
    if (t->draft_tokens == 0 && !tk->continuous)
      fprintf(f, "- | - | - | ");
    else {
      fprintf(f, "%.3f | %.3f | ", vs_metrics_accept_rate(t), vs_metrics_walk_accept_rate(t));
      table_accept_cells(f, t, tk->continuous);
    }
    if (isfinite(em[i].speedup_median)) {
      fprintf(f, "%.2fx", em[i].speedup_median);
      interval_cell(f, shown(em[i].ci.speedup, VS_EVAL_CI_SPEEDUP, em[i].speedup_median),
                    "%.2f");
      fprintf(f, " (%.2fx)", em[i].speedup_total);
    } else {
      fprintf(f, "n/a");
    }
    if (em[i].has_quality) {
      fprintf(f, " | %.4g", em[i].q.fid);
      interval_cell(f, shown(em[i].ci.fid, VS_EVAL_CI_FID, em[i].q.fid), "%.3g");
      if (isfinite(em[i].kid.kid)) fprintf(f, " | %.3g", em[i].kid.kid);
      else fprintf(f, " | -");
      interval_cell(f, kid_interval(em[i].kid.kid, em[i].kid.se), "%.3g");
      fprintf(f, " | %.3f", em[i].q.class_acc);
      interval_cell(f, shown(em[i].ci.class_acc, VS_EVAL_CI_ACC, em[i].q.class_acc),
                    "%.3f");
      fprintf(f, " | %.3f | %.3f |\n", em[i].q.precision, em[i].q.recall);
    } else {
      fprintf(f, " | - | - | - | - | - |\n");
    }
  }
  write_paired_table(f, em, n);
  /* Where a method's time goes: the walk (rules, residuals, sampling; sorting and neighbour
   * sums for LANTERN) must stay small next to the forwards (issue 4). VVS's skipped rounds
   * and the tokens they emitted without a target check are counted here too. */
  fprintf(f, "\n| method | drafting | target forwards | walk | other | skipped rounds | "
             "unverified tokens |\n|---|---:|---:|---:|---:|---:|---:|\n");
  for (int i = 0; i < n; i++) {
    const vs_metrics *t = &em[i].total;
    double w = t->wall_s > 0 ? t->wall_s : 1;
    double other = t->wall_s - t->draft_s - t->verify_s - t->accept_s;
    fprintf(f, "| `%s` | %.1f %% | %.1f %% | %.1f %% | %.1f %% | %.1f %% | %.1f %% |\n",
            em[i].label, 100 * t->draft_s / w, 100 * t->verify_s / w, 100 * t->accept_s / w,
            100 * (other > 0 ? other : 0) / w,
            t->rounds + t->skipped_rounds
                ? 100.0 * t->skipped_rounds / (double)(t->rounds + t->skipped_rounds) : 0.0,
            t->tokens ? 100.0 * t->unverified_tokens / t->tokens : 0.0);
  }
  fprintf(f, "\n%d images per method, CFG %g, temperature %g.", images, tk->cfg_scale,
          tk->temperature);
  if (tk->continuous)
    fprintf(f, " Continuous tokens: %d generation steps per image, %s CFG schedule; forwards "
               "and residual counts are totals over the images.", tk->num_iter,
            tk->cfg_schedule == VS_CFG_CONSTANT ? "constant" : "linear");
  if (isfinite(floor.fid_10k))
    fprintf(f, " Real-data floor: FID of 10k training images against the test set = %.4g",
            floor.fid_10k);
  if (isfinite(floor.fid_at_n))
    fprintf(f, "; of %d class-balanced training images (the floor at this table's size) = %.4g",
            images, floor.fid_at_n);
  if (isfinite(floor.fid_10k)) fprintf(f, ".");
  if (resamples > 0)
    fprintf(f, " Intervals (95 %%, the kinds whose coverage holds: docs/BENCHMARKS.md): %s "
               "bootstrap for FID and FID / AR, %s for class accuracy, %s for speed-up (%d "
               "resamples of the images); KID (arXiv 1801.01401) -/+ 1.96 jackknife standard "
               "errors.", vs_ci_kind_name(VS_EVAL_CI_FID), vs_ci_kind_name(VS_EVAL_CI_ACC),
            vs_ci_kind_name(VS_EVAL_CI_SPEEDUP), resamples);
  char machine[600];
  vs_bench_machine_describe(mc, machine, sizeof machine);
  fprintf(f, "\nMachine: %s.\n", machine);
  for (int i = 0; i < n; i++)
    if (*em[i].note) fprintf(f, "- `%s`: %s\n", em[i].m.text, em[i].note);
}

/* Every kind's interval of one figure: {"percentile": [lo, hi], "basic": ..., ...}. */
static void json_kinds(FILE *f, const vs_interval *v) {
  fputc('{', f);
  for (int k = 0; k < VS_CI_KINDS; k++) {
    fprintf(f, "%s\"%s\": ", k ? ", " : "", vs_ci_kind_name(k));
    json_interval(f, v[k]);
  }
  fputc('}', f);
}

/* The KID and KID - AR fields of a method, and every kind of FID interval. */
static void json_kid(FILE *f, const vs_eval_method *m) {
  fprintf(f, ",\n     \"kid\": ");
  json_num(f, m->kid.kid);
  fprintf(f, ", \"kid_se\": ");
  json_num(f, m->kid.se);
  fprintf(f, ", \"kid_ci\": ");
  json_interval(f, kid_interval(m->kid.kid, m->kid.se));
  fprintf(f, ", \"kid_diff_ar\": ");
  json_num(f, m->kid_diff_ar);
  fprintf(f, ", \"kid_diff_ar_se\": ");
  json_num(f, m->kid_diff_se);
  fprintf(f, ", \"kid_diff_ar_ci\": ");
  json_interval(f, kid_interval(m->kid_diff_ar, m->kid_diff_se));
  fprintf(f, ",\n     \"fid_ci_by_kind\": ");
  json_kinds(f, m->ci.fid);
  fprintf(f, ",\n     \"fid_ratio_ar_ci_by_kind\": ");
  json_kinds(f, m->ci.fid_ratio_ar);
}

/* One method's object of the JSON's "methods" list. */
static void json_method(FILE *f, const vs_eval_method *e, int is_last) {
  const vs_metrics *t = &e->total;
  fprintf(f, "    {\"method\": ");
  vs_bench_json_str(f, e->run.text);
  fprintf(f, ", \"requested\": ");
  vs_bench_json_str(f, e->m.text);
  fprintf(f, ",\n     \"tokens\": %lld, \"target_forwards\": %lld, \"rounds\": %lld, "
             "\"draft_forwards\": %lld, \"tpf\": ", (long long)t->tokens,
          (long long)t->target_forwards, (long long)t->rounds, (long long)t->draft_forwards);
  json_num(f, vs_metrics_tpf(t));
  fprintf(f, ", \"mal\": ");
  json_num(f, vs_metrics_mal(t));
  fprintf(f, ", \"accept_rate\": ");
  json_num(f, vs_metrics_accept_rate(t));
  fprintf(f, ", \"walk_accept_rate\": ");
  json_num(f, vs_metrics_walk_accept_rate(t));
  fprintf(f, ", \"draft_tokens\": %lld, \"accepted\": %lld", (long long)t->draft_tokens,
          (long long)t->accepted);
  fprintf(f, ",\n     \"accept_by_depth\": [");
  int last = 0;
  for (int d = 1; d <= VS_MAX_DEPTH; d++)
    if (t->reached[d]) last = d;
  for (int d = 1; d <= last; d++) {
    fprintf(f, "%s", d > 1 ? ", " : "");
    json_num(f, vs_metrics_accept_at(t, d));
  }
  fprintf(f, "], \"residual_fallbacks\": %lld, \"residual_rounds\": %lld,\n     "
             "\"skipped_rounds\": %lld, \"unverified_tokens\": %lld, \"skipped_round_frac\": ",
          (long long)t->residual_fallbacks, (long long)t->residual_rounds,
          (long long)t->skipped_rounds, (long long)t->unverified_tokens);
  /* rounds counts verified rounds only (MAL's denominator); skipped ones come on top */
  json_num(f, t->rounds + t->skipped_rounds
                  ? (double)t->skipped_rounds / (double)(t->rounds + t->skipped_rounds) : 0.0);
  fprintf(f, ", \"unverified_token_frac\": ");
  json_num(f, t->tokens ? (double)t->unverified_tokens / t->tokens : 0.0);
  fprintf(f, ",\n     \"draft_s\": ");
  json_num(f, t->draft_s);
  fprintf(f, ", \"verify_s\": ");
  json_num(f, t->verify_s);
  fprintf(f, ", \"walk_s\": ");
  json_num(f, t->accept_s);
  fprintf(f, ", \"wall_s\": ");
  json_num(f, t->wall_s);
  fprintf(f, ", \"speedup_vs_ar\": ");
  json_num(f, e->speedup_median);
  fprintf(f, ", \"speedup_vs_ar_total\": ");
  json_num(f, e->speedup_total);
  fprintf(f, ",\n     \"fid\": ");
  json_num(f, e->has_quality ? e->q.fid : NAN);
  fprintf(f, ", \"class_acc\": ");
  json_num(f, e->has_quality ? e->q.class_acc : NAN);
  fprintf(f, ", \"precision\": ");
  json_num(f, e->has_quality ? e->q.precision : NAN);
  fprintf(f, ", \"recall\": ");
  json_num(f, e->has_quality ? e->q.recall : NAN);
  /* bootstrap intervals (null when not computed), and the paired figures against AR */
    fprintf(f, ",\n     \"fid_ci\": ");
  json_interval(f, shown(e->ci.fid, VS_EVAL_CI_FID, e->has_quality ? e->q.fid : NAN));
  fprintf(f, ", \"class_acc_ci\": ");
  json_interval(f, shown(e->ci.class_acc, VS_EVAL_CI_ACC,
                         e->has_quality ? e->q.class_acc : NAN));
  fprintf(f, ", \"speedup_vs_ar_ci\": ");
  json_interval(f, shown(e->ci.speedup, VS_EVAL_CI_SPEEDUP, e->speedup_median));
  fprintf(f, ",\n     \"fid_ratio_ar\": ");
  json_num(f, e->fid_ratio_ar);
  fprintf(f, ", \"fid_ratio_ar_ci\": ");
  json_interval(f, shown(e->ci.fid_ratio_ar, VS_EVAL_CI_FID, e->fid_ratio_ar));
  fprintf(f, ", \"class_acc_diff_ar\": ");
  json_num(f, e->acc_diff_ar);
  fprintf(f, ", \"class_acc_diff_ar_ci\": ");
  json_interval(f, shown(e->ci.acc_diff_ar, VS_EVAL_CI_ACC, e->acc_diff_ar));
  json_kid(f, e);
  fprintf(f, ", \"note\": ");
  vs_bench_json_str(f, e->note);
  fprintf(f, "}%s\n", is_last ? "" : ",");
}

int vs_eval_write_json(const char *path, const char *model, const char *device, vs_eval_method *em,
                      int n, int images, unsigned long long seed, int threads, vs_eval_floor floor,
                      const vs_eval_tokens *tk, int resamples, const vs_bench_machine *mc,
                      char *err, size_t errlen) {
  FILE *f = fopen(path, "w");
  if (!f) {
    snprintf(err, errlen, "%s: cannot write", path);
    return VSPEC_EIO;
  }
  fprintf(f, "{\n  \"model\": ");
  vs_bench_json_str(f, model);
  fprintf(f, ",\n  \"images\": %d,\n  \"seed\": %llu,\n  \"device\": ", images, seed);
  vs_bench_json_str(f, device);
  fprintf(f, ",\n  \"threads\": %d,\n  \"machine\": ", threads);
  vs_bench_machine_json(f, mc);
  fprintf(f, ",\n  \"real_data_fid_floor\": ");
  json_num(f, floor.fid_10k);
  fprintf(f, ",\n  \"real_data_fid_floor_at_n\": ");
  json_num(f, floor.fid_at_n);
  /* additive: the token kind, and the MAR sampler's settings (null for discrete models) */
  fprintf(f, ",\n  \"cfg_scale\": %g, \"temperature\": %g", tk->cfg_scale, tk->temperature);
  fprintf(f, ",\n  \"token_kind\": \"%s\", \"num_iter\": ",
          tk->continuous ? "continuous" : "discrete");
  if (tk->continuous)
    fprintf(f, "%d, \"cfg_schedule\": \"%s\"", tk->num_iter,
            tk->cfg_schedule == VS_CFG_CONSTANT ? "constant" : "linear");
  else
    fprintf(f, "null, \"cfg_schedule\": null");
  fprintf(f, ",\n  \"bootstrap\": ");
  if (resamples > 0)
    fprintf(f, "{\"resamples\": %d, \"level\": 0.95, \"seed\": %u, \"interval\": \"%s\", "
               "\"fid_interval\": \"%s\", \"class_acc_interval\": \"%s\", "
               "\"kid_interval\": \"normal, jackknife standard error\"}",
            resamples, VS_EVAL_BOOT_SEED, vs_ci_kind_name(VS_EVAL_CI_SPEEDUP),
            vs_ci_kind_name(VS_EVAL_CI_FID), vs_ci_kind_name(VS_EVAL_CI_ACC));
  else
    fputs("null", f);
  fprintf(f, ",\n  \"methods\": [\n");
  for (int i = 0; i < n; i++) json_method(f, &em[i], i + 1 == n);
  fprintf(f, "  ]\n}\n");
  if (fclose(f) != 0) {
    snprintf(err, errlen, "%s: write failed", path);
    return VSPEC_EIO;
  }
  return VSPEC_OK;
}

/* A point's label: AR, else the rule's parameters; chains of a continuous rule differ only
 * in their schedule, so those name the draft length and pre-fill (L=8 p=0.15 tau=42). */
static void point_label(const vs_method *m, char *out, size_t len) {
  if (m->kind == VS_METHOD_AR) {
    snprintf(out, len, "AR");
    return;
  }
  if (strcmp(m->rule, "continuous") != 0) {
    snprintf(out, len, "%s", m->rule_params);
    return;
  }
  const char *depth = vs_param_string(&m->sched_set, "depth"),
             *prefill = vs_param_string(&m->sched_set, "prefill");
  snprintf(out, len, "L=%.15s%s%.15s%s%s", depth && *depth ? depth : "?",
           prefill && *prefill ? " p=" : "", prefill ? prefill : "", m->rule_params[0] ? " " : "",
           m->rule_params);
}

int vs_eval_write_plot(const char *path, vs_eval_method *em, int n, const vs_bench_machine *mc,
                      char *err, size_t errlen) {
  vs_plot_point pts[VS_EVAL_MAX_METHODS];
  const char *names[VS_EVAL_MAX_METHODS];
  char rules[VS_EVAL_MAX_METHODS][64], labels[VS_EVAL_MAX_METHODS][96];
  int n_series = 0, np = 0;
  for (int i = 0; i < n; i++) {
    if (!em[i].has_quality) continue;
    /* one series per acceptance rule (AR on its own) */
    const char *series = em[i].m.kind == VS_METHOD_AR ? "ar" : em[i].m.rule;
    int s = -1;
    for (int j = 0; j < n_series; j++)
      if (strcmp(rules[j], series) == 0) s = j;
    if (s < 0) {
      s = n_series++;
      snprintf(rules[s], sizeof rules[s], "%s", series);
      names[s] = rules[s];
    }
    point_label(&em[i].m, labels[np], sizeof labels[np]);
    vs_interval bar = shown(em[i].ci.fid, VS_EVAL_CI_FID, em[i].q.fid);
    pts[np] = (vs_plot_point){.x = vs_metrics_tpf(&em[i].total), .y = em[i].q.fid,
                              .label = labels[np], .series = s, .has_bar = isfinite(bar.lo),
                              .y_lo = bar.lo, .y_hi = bar.hi};
    np++;
  }
  if (np == 0) {
    snprintf(err, errlen, "no method has quality metrics to plot");
    return VSPEC_EINVAL;
  }
  char title[160], x_label[700], machine[600];
  snprintf(title, sizeof title, "FID against tokens per target forward (bars: 95 %% %s "
           "bootstrap interval)", vs_ci_kind_name(VS_EVAL_CI_FID));
  vs_bench_machine_describe(mc, machine, sizeof machine);
  /* the machine under the axis: a speed-up read off the plot names where it was measured */
  snprintf(x_label, sizeof x_label, "TPF  (%s)", machine);
  vs_plot p = {.title = title, .x_label = x_label,
               .y_label = "FID (lower is better)", .series_names = names, .n_series = n_series,
               .points = pts, .n_points = np, .connect_series = 0, .mark_pareto = 1};
  return vs_plot_write_png(&p, 960, 640, path, err, errlen);
}
