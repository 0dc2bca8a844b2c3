/*
 * size=auto's search (core/autotune.h): screen every (drafter, shape) family size by size on
 * one calibration image, confirm the best few on more images, and weigh the winner against
 * AR.
 */
#include "core/autotune.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/engine.h"
#include "core/metrics.h"

/* The calibration images' first seed: fixed, so that a tuning does not depend on the job
 * that triggered it (only timings vary between tunings). Image i has class 7i mod classes,
 * which spreads the few images over the classes. */
#define AT_CALIBRATION_SEED 1000000u
#define AT_IMAGES_DEFAULT 4 /* images of each final candidate, after the screening one */
#define AT_FINALISTS 3
/* A family stops after this many sizes in a row below its best (acceptance levels off while
 * the cost keeps growing); a size is skipped when even its bound is below this share of the
 * best score so far. */
#define AT_PATIENCE 2
#define AT_BOUND_SHARE 0.9
/* An exact rule's winner whose score is within these factors of AR's is a close call: it and
 * AR run as many images again. On a shared 2-core machine an image's rounds run 10-20 %
 * faster or slower than the next image's (models/fmnist, per-image medians of AR's rounds
 * from 1.35 to 2.0 ms in one tuning), so four images leave the ratio about 8 % uncertain. */
#define AT_CLOSE_LO 0.95
#define AT_CLOSE_HI 1.25

const int vs__at_curve_nodes[VS_AT_CURVE_N] = {1, 2, 4, 8, 16, 32, 64};

/* Linear interpolation of the cost curve at `nodes` (extrapolated past 64). */
static double at_cost(const double *ms, double nodes) {
  const int *x = vs__at_curve_nodes;
  if (nodes <= x[0]) return ms[0];
  for (int i = 1; i < VS_AT_CURVE_N; i++)
    if (nodes <= x[i]) {
      double f = (nodes - x[i - 1]) / (x[i] - x[i - 1]);
      return ms[i - 1] + f * (ms[i] - ms[i - 1]);
    }
  int a = VS_AT_CURVE_N - 2, b = VS_AT_CURVE_N - 1;
  return ms[b] + (nodes - x[b]) * (ms[b] - ms[a]) / (x[b] - x[a]);
}

/* The time of every steady round of the images an entry ran (target forward, drafting and
 * walk), for their trimmed mean. */
typedef struct at_rounds {
  double *ms;
  int n, cap;
  double last; /* the job's verify + draft + walk seconds at the previous round */
} at_rounds;

/* What the search keeps per candidate (and for AR): the metrics summed over the images it ran
 * last, and their rounds. A finalist is scored on its confirmation images alone: the
 * screening image picked it, and would make the winner look better than it is. */
typedef struct at_entry {
  int fam, size; /* fam -1: AR */
  vs_metrics sum;
  int images;
  at_rounds *rounds;
  double score;  /* expected tokens per second, 0 when not measured */
  vs_autotune_cand c; /* its figures, as last scored */
} at_entry;

typedef struct at_search {
  vs_models *models;
  vspec_dev *dev;
  const vs_method *m;
  const vs_at_space *sp;
  const double *curve;
  const vs_autotune_opts *opts;
  vs_autotune_result *res;
  int32_t *tokens;
  at_entry ar, e[VS_AUTOTUNE_MAX_CAND];
  int n;
  at_rounds rounds[AT_FINALISTS + 1]; /* [0] for screening, then one per finalist and AR */
  double best;             /* the best score so far (tokens per second) */
  int done_units, units;   /* images run, images planned (for progress) */
} at_search;

static void at_progress(at_search *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void at_progress(at_search *s, const char *fmt, ...) {
  if (!s->opts || !s->opts->progress) return;
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  double done = s->units > 0 ? (double)s->done_units / s->units : 0.0;
  s->opts->progress(s->opts->user, done < 0.99 ? done : 0.99, msg);
}

static void at_on_round(void *user, const vs_round_info *in) {
  at_rounds *r = user;
  double t = in->metrics->verify_s + in->metrics->draft_s + in->metrics->accept_s;
  if (in->round > 0 && !in->skipped && r->n < r->cap) r->ms[r->n++] = 1e3 * (t - r->last);
  r->last = t;
}

static int at_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Starts (or restarts) an entry's measurement on the rounds buffer r. */
static void at_begin(at_entry *e, at_rounds *r) {
  memset(&e->sum, 0, sizeof e->sum);
  e->images = 0;
  e->rounds = r;
  r->n = 0;
}

/* Runs calibration image i of entry e. */
static int at_image(at_search *s, at_entry *e, int i, char *err, size_t errlen) {
  char param[VS_AUTOTUNE_PARAM_LEN] = VS_AUTOTUNE_AR;
  if (e->fam >= 0) vs__autotune_param(s->sp, e->fam, e->size, param, sizeof param);
  vs_method me;
  int rc = vs__autotune_method(s->m, s->sp, param, &me, err, errlen);
  if (rc) return rc;
  at_progress(s, "size=auto: tuning %s on this machine: %s, image %d", s->m->text, param, i + 1);
  int classes = s->models->target.info.num_classes > 0 ? s->models->target.info.num_classes : 1;
  e->rounds->last = 0;
  vs_job job = {.method = &me, .class_label = (int32_t)((7 * i) % classes),
                .seed = AT_CALIBRATION_SEED + (uint64_t)i, .sampling = s->models->defaults,
                .on_round = at_on_round, .user = e->rounds};
  vs_metrics mt;
  rc = vs_generate(s->models, s->dev, &job, s->tokens, &mt, err, errlen);
  if (rc) return rc;
  vs_metrics_add(&e->sum, &mt);
  e->images++;
  s->res->timed++;
  s->done_units++;
  return VSPEC_OK;
}

/* Scores an entry on what it ran since at_begin: steady-state tokens per round (each image's
 * prefill round left out) over the mean round time without the slowest 2 % of rounds.
 * Rounds are timed as the jobs ran them, so what the drafter does to the target's caches
 * counts (a target forward right after the drafter's is slower than one timed in a loop);
 * the trim keeps a round the machine took away from counting. Not the median: AR's rounds
 * are skewed more than a speculative method's (on models/fmnist their mean is 0-6 % above
 * their median, a chain's within 1 %), and a median would favour AR by that much. */
static void at_score(at_search *s, at_entry *e) {
  vs_autotune_cand *c = &e->c;
  at_rounds *r = e->rounds;
  double rounds = (double)(e->sum.rounds - e->images);
  memset(c, 0, sizeof *c);
  c->images = e->images;
  e->score = 0.0;
  if (rounds <= 0 || r->n == 0) return;
  c->tokens_per_round = (double)(e->sum.tokens - e->images) / rounds;
  c->target_ms = 1e3 * e->sum.verify_s / (double)e->sum.rounds;
  c->draft_ms = 1e3 * (e->sum.draft_s + e->sum.accept_s) / (double)e->sum.rounds;
  qsort(r->ms, (size_t)r->n, sizeof r->ms[0], at_cmp_double);
  int keep = r->n - r->n / 50;
  double sum = 0.0;
  for (int i = 0; i < keep; i++) sum += r->ms[i];
  c->rate = sum > 0 ? 1e3 * c->tokens_per_round * keep / sum : 0.0;
  e->score = c->rate;
  if (e->fam >= 0 && e->score > s->best) s->best = e->score;
}

/* Screens one family: sizes in order, one image each, until AT_PATIENCE sizes in a row fall
 * below the family's best. A size whose bound (every draft accepted, drafting free, the
 * target at its cost-curve latency) cannot come near the best so far is skipped. */
static int at_screen_family(at_search *s, int fam, char *err, size_t errlen) {
  const vs_at_family *f = &s->sp->fam[fam];
  double fam_best = 0.0;
  int worse = 0;
  for (int z = 0; z < f->n_sizes && worse < AT_PATIENCE && s->n < VS_AUTOTUNE_MAX_CAND; z++) {
    at_entry *e = &s->e[s->n++];
    memset(e, 0, sizeof *e);
    e->fam = fam;
    e->size = z;
    double bound = 1e3 * f->max_tokens[z] / at_cost(s->curve, f->nodes[z]);
    if (bound < AT_BOUND_SHARE * s->best) continue;
    at_begin(e, &s->rounds[0]);
    int rc = at_image(s, e, 0, err, errlen);
    if (rc) return rc;
    at_score(s, e);
    if (e->score > fam_best) {
      fam_best = e->score;
      worse = 0;
    } else {
      worse++;
    }
  }
  return VSPEC_OK;
}

static int at_cmp_score(const void *a, const void *b) {
  const at_entry *x = *(const at_entry *const *)a, *y = *(const at_entry *const *)b;
  return (x->score < y->score) - (x->score > y->score);
}

/* Runs the search; the best speculative entry or NULL. AR runs the same images as every
 * candidate: the screening image first; then the finalists and AR take turns, image by
 * image, so that a change in the machine's load hits them alike. */
static int at_search_run(at_search *s, const at_entry **winner, char *err, size_t errlen) {
  int images = s->opts && s->opts->images > 0 ? s->opts->images : AT_IMAGES_DEFAULT;
  /* Chains first: cheap to measure, and the best of them bounds the other shapes. */
  static const int shape_order[] = {0, 2, 1};
  s->units = 1 + (AT_FINALISTS + 1) * images;
  for (int f = 0; f < s->sp->n_fam; f++) s->units += s->sp->fam[f].shape_id == 0 ? 5 : 3;
  s->ar.fam = -1;
  at_begin(&s->ar, &s->rounds[0]);
  int rc = at_image(s, &s->ar, 0, err, errlen);
  if (rc) return rc;
  at_score(s, &s->ar);
  /* AR sets the first bar for an exact rule (which may run as AR); a relaxed rule needs a
   * speculative choice whatever it costs, so its first candidate is always measured. */
  s->best = s->sp->exact ? s->ar.score : 0.0;
  for (int k = 0; k < 3; k++)
    for (int f = 0; f < s->sp->n_fam; f++) {
      if (s->sp->fam[f].shape_id != shape_order[k]) continue;
      if ((rc = at_screen_family(s, f, err, errlen))) return rc;
    }
  at_entry *order[VS_AUTOTUNE_MAX_CAND + 1];
  int n = 0;
  for (int i = 0; i < s->n; i++)
    if (s->e[i].images > 0 && s->e[i].score > 0) order[n++] = &s->e[i];
  qsort(order, (size_t)n, sizeof order[0], at_cmp_score);
  if (n > AT_FINALISTS) n = AT_FINALISTS;
  order[n] = &s->ar;
  s->units = s->done_units + (n + 1) * images;
  for (int k = 0; k <= n; k++) at_begin(order[k], &s->rounds[k]);
  for (int i = 1; i <= images; i++)
    for (int k = 0; k <= n; k++)
      if ((rc = at_image(s, order[k], i, err, errlen))) return rc;
  for (int k = 0; k <= n; k++) at_score(s, order[k]);
  qsort(order, (size_t)n, sizeof order[0], at_cmp_score);
  if (n > 0 && s->sp->exact && order[0]->score > AT_CLOSE_LO * s->ar.score &&
      order[0]->score < AT_CLOSE_HI * s->ar.score) {
    at_entry *pair[2] = {order[0], &s->ar};
    s->units = s->done_units + 2 * images;
    for (int i = 1 + images; i <= 2 * images; i++)
      for (int k = 0; k < 2; k++)
        if ((rc = at_image(s, pair[k], i, err, errlen))) return rc;
    for (int k = 0; k < 2; k++) at_score(s, pair[k]);
  }
  *winner = n > 0 ? order[0] : NULL;
  return VSPEC_OK;
}

int vs__autotune_measure(vs_models *models, vspec_dev *dev, const vs_method *m,
                         const vs_at_space *sp, const double *curve,
                         const vs_autotune_opts *opts, vs_autotune_result *res, char *err,
                         size_t errlen) {
  int grid = models->target.info.grid_h * models->target.info.grid_w;
  int images = opts && opts->images > 0 ? opts->images : AT_IMAGES_DEFAULT;
  /* rounds of 2 x `images` images at most (a close call's confirmation) */
  size_t cap = 2 * (size_t)images * (size_t)grid;
  at_search *s = calloc(1, sizeof *s);
  int32_t *tokens = malloc((size_t)grid * sizeof *tokens);
  double *round_ms = malloc((AT_FINALISTS + 1) * cap * sizeof *round_ms);
  if (!s || !tokens || !round_ms) {
    free(s);
    free(tokens);
    free(round_ms);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  *s = (at_search){.models = models, .dev = dev, .m = m, .sp = sp, .curve = curve,
                   .opts = opts, .res = res, .tokens = tokens};
  for (int k = 0; k <= AT_FINALISTS; k++)
    s->rounds[k] = (at_rounds){.ms = round_ms + (size_t)k * cap, .cap = (int)cap};
  const at_entry *win = NULL;
  int rc = at_search_run(s, &win, err, errlen);
  res->n_cand = 0;
  res->best = -1;
  res->ar_ms = s->ar.score > 0 ? 1e3 / s->ar.score : 0.0;
  for (int i = 0; !rc && i < s->n; i++) {
    vs_autotune_cand *c = &res->cand[res->n_cand];
    *c = s->e[i].c; /* zero when skipped */
    vs__autotune_param(sp, s->e[i].fam, s->e[i].size, c->param, sizeof c->param);
    if (&s->e[i] == win) res->best = res->n_cand;
    res->n_cand++;
  }
  free(round_ms);
  free(tokens);
  free(s);
  if (rc) return rc;
  double ar_rate = res->ar_ms > 0 ? 1e3 / res->ar_ms : 0.0;
  double win_rate = res->best >= 0 ? res->cand[res->best].rate : 0.0;
  if (vs__autotune_prefer_ar(sp->exact, win_rate, ar_rate)) {
    snprintf(res->choice, sizeof res->choice, "%s", VS_AUTOTUNE_AR);
  } else if (res->best >= 0) {
    snprintf(res->choice, sizeof res->choice, "%s", res->cand[res->best].param);
  } else {
    snprintf(err, errlen, "size=auto: no candidate of %s completed a round on model '%s'",
             m->text, models->name);
    return VSPEC_EINVAL;
  }
  res->tuned_at = (int64_t)time(NULL);
  return vs__autotune_method(m, sp, res->choice, &res->method, err, errlen);
}

int vs__autotune_prefer_ar(int exact, double sd_rate, double ar_rate) {
  /* The winner, unless it is not clearly faster than AR and AR samples the same
   * distribution. */
  return exact && !(sd_rate >= VS_AUTOTUNE_AR_MARGIN * ar_rate && sd_rate > 0);
}

int vs_autotune_is_ar(const vs_autotune_result *res) {
  return strcmp(res->choice, VS_AUTOTUNE_AR) == 0;
}

/* The best speculative candidate's tokens per second, 0 when unknown. */
static double at_best_rate(const vs_autotune_result *res) {
  return res->best >= 0 && res->best < res->n_cand ? res->cand[res->best].rate : 0.0;
}

int vs_autotune_slower_than_ar(const vs_autotune_result *res) {
  double rate = at_best_rate(res);
  return !vs_autotune_is_ar(res) && rate > 0 && res->ar_ms > 0 && rate < 1e3 / res->ar_ms;
}

void vs_autotune_describe(const vs_autotune_result *res, char *buf, size_t len) {
  if (!res->choice[0]) {
    snprintf(buf, len, "%s", res->method.text);
    return;
  }
  char day[32] = "?", when[400];
  time_t t = (time_t)res->tuned_at;
  struct tm tm;
  if (gmtime_r(&t, &tm)) strftime(day, sizeof day, "%Y-%m-%d %H:%M UTC", &tm);
  if (res->from_cache)
    snprintf(when, sizeof when, "cached, tuned %s on %s", day, res->machine);
  else
    snprintf(when, sizeof when, "tuned now in %.1f s on %s, %s", res->tune_s, res->machine,
             res->stored ? "cached" : "not cached");
  double rate = at_best_rate(res), ar = res->ar_ms > 0 ? 1e3 / res->ar_ms : 0.0;
  size_t n;
  if (vs_autotune_is_ar(res)) {
    n = (size_t)snprintf(buf, len, "size=auto: runs as AR (%s): no drafter and shape is expected "
                         "to beat AR here by %.0f %%", when, 100.0 * (VS_AUTOTUNE_AR_MARGIN - 1));
    if (rate > 0 && ar > 0 && n < len)
      n += (size_t)snprintf(buf + n, len - n, " (the best, %s, %.0f tokens/s against AR's %.0f)",
                            res->cand[res->best].param, rate, ar);
    if (n < len)
      snprintf(buf + n, len - n, "; the rule is exact, so AR samples the same distribution");
    return;
  }
  n = (size_t)snprintf(buf, len, "size=auto: chose %s (%s)", res->choice, when);
  if (res->best >= 0 && n < len) {
    const vs_autotune_cand *c = &res->cand[res->best];
    n += (size_t)snprintf(buf + n, len - n, ": %.2f tokens/round in %.2f ms (target %.2f + "
                          "draft and walk %.2f), %.0f tokens/s", c->tokens_per_round,
                          c->target_ms + c->draft_ms, c->target_ms, c->draft_ms, rate);
    if (ar > 0 && n < len)
      n += (size_t)snprintf(buf + n, len - n, " against AR's %.0f (%.2fx)", ar, rate / ar);
  }
  if (vs_autotune_slower_than_ar(res) && n < len)
    snprintf(buf + n, len - n, "; slower than AR here (about %.0f tokens/s): no drafter and "
             "shape pays on this machine, and this relaxed rule cannot fall back to AR (its "
             "images differ)", ar);
}

void vs_autotune_print_table(const vs_autotune_result *res, FILE *f) {
  if (res->n_cand == 0) return;
  fprintf(f, "  %-44s %6s %9s %9s %9s %9s %7s\n", "candidate", "images", "tok/round",
          "target ms", "draft ms", "round ms", "tok/s");
  for (int i = 0; i < res->n_cand; i++) {
    const vs_autotune_cand *c = &res->cand[i];
    double ms = c->target_ms + c->draft_ms;
    if (c->images == 0) {
      fprintf(f, "  %-44s %6s  (skipped: cannot beat the best even if every draft is accepted)\n",
              c->param, "-");
      continue;
    }
    fprintf(f, "%s %-44s %6d %9.2f %9.3f %9.3f %9.3f %7.0f\n",
            i == res->best && !vs_autotune_is_ar(res) ? "*" : " ", c->param, c->images,
            c->tokens_per_round, c->target_ms, c->draft_ms, ms, c->rate);
  }
  if (res->ar_ms > 0)
    fprintf(f, "%s %-44s %6s %9.2f %9s %9s %9.3f %7.0f\n", vs_autotune_is_ar(res) ? "*" : " ",
            "ar (no draft)", "-", 1.0, "-", "-", res->ar_ms, 1e3 / res->ar_ms);
}
