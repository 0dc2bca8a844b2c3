/*
 * What generate, eval, demo and vspecd-bench share around one job: output buffers for either
 * token kind, the sampling options of continuous-token (MAR) models, and the method as it
 * runs (size=auto resolved).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "core/autotune.h"

int vs_bench_is_continuous(const vs_models *m) {
  return m->target.info.token_kind == VSPEC_TOKENS_CONTINUOUS;
}

int vs_bench_grid_alloc(vs_bench_grid *g, const vs_models *m, char *err, size_t errlen) {
  memset(g, 0, sizeof *g);
  size_t n = (size_t)m->target.info.grid_h * m->target.info.grid_w;
  size_t nl = vs_models_latent_count(m);
  /* tokens too for a continuous model: vs_generate writes its zeros, and the describe /
   * decode calls take the pair whatever the kind */
  g->tokens = calloc(n ? n : 1, sizeof *g->tokens);
  if (nl) g->latents = calloc(nl, sizeof *g->latents);
  if (!g->tokens || (nl && !g->latents)) {
    vs_bench_grid_free(g);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  return VSPEC_OK;
}

void vs_bench_grid_free(vs_bench_grid *g) {
  free(g->tokens);
  free(g->latents);
  memset(g, 0, sizeof *g);
}

int vs_bench_generate(vs_models *m, vspec_dev *dev, vs_job *job, vs_bench_grid *g,
                      vs_metrics *mt, char *err, size_t errlen) {
  job->latents = g->latents;
  return vs_generate(m, dev, job, g->tokens, mt, err, errlen);
}

int vs_bench_parse_cfg_schedule(const char *option, const char *text, int *out) {
  if (strcmp(text, "linear") == 0) *out = VS_CFG_LINEAR;
  else if (strcmp(text, "constant") == 0) *out = VS_CFG_CONSTANT;
  else {
    fprintf(stderr, "%s: '%s' is not a CFG schedule: use linear or constant\n", option, text);
    return 0;
  }
  return 1;
}

/* A discrete model's sampler never reads num_iter or cfg_schedule: accepting them there would
 * make a run look configured when it is not, so they are refused instead. */
int vs_bench_apply_mar_opts(const char *cmd, const vs_models *m, const vs_bench_mar_opts *o,
                            vs_sampling *s) {
  int given = o->num_iter > 0 || o->cfg_schedule >= 0;
  if (!given) return 1;
  if (!vs_bench_is_continuous(m)) {
    fprintf(stderr, "vspec-bench %s: %s applies only to continuous-token (MAR) models; "
            "model '%s' has discrete tokens\n", cmd,
            o->num_iter > 0 ? "--num-iter" : "--cfg-schedule", m->name);
    return 0;
  }
  int grid = m->target.info.grid_h * m->target.info.grid_w;
  if (o->num_iter > grid) {
    fprintf(stderr, "vspec-bench %s: --num-iter %ld is out of range for model '%s': 1..%d "
            "(one step reveals at least one of its %d tokens)\n", cmd, o->num_iter, m->name,
            grid, grid);
    return 0;
  }
  if (o->num_iter > 0) s->num_iter = (int)o->num_iter;
  if (o->cfg_schedule >= 0) s->cfg_schedule = o->cfg_schedule;
  return 1;
}

int vs_bench_num_iter(const vs_models *m, const vs_sampling *s) {
  if (!vs_bench_is_continuous(m)) return 0;
  const vspec_model_info *in = &m->target.info;
  /* the MAR loop's choice (core/mar_loop.c): the job's, else the model's, else one per token */
  if (s->num_iter > 0) return s->num_iter;
  return in->num_iter > 0 ? in->num_iter : in->grid_h * in->grid_w;
}

void vs_bench_tune_progress(void *user, double done, const char *message) {
  (void)user;
  static double last;
  double now = vs_now();
  int tty = isatty(2);
  if (now - last < (tty ? 0.1 : 2.0) && done > 0) return;
  last = now;
  if (tty)
    fprintf(stderr, "\r\033[K%3.0f%% %.*s", 100.0 * done, 110, message);
  else
    fprintf(stderr, "%3.0f%% %s\n", 100.0 * done, message);
  if (tty && done >= 1.0) fputc('\n', stderr);
}

void vs_bench_tune_progress_end(void) {
  if (isatty(2)) fprintf(stderr, "\r\033[K");
}

int vs_bench_resolve_method(const char *cmd, vs_bench_env *env, vs_models *m, const char *text,
                            vs_method *run) {
  char err[VSPEC_ERRLEN];
  vs_method me;
  vs_autotune_result tune;
  if (vs_method_parse(text, &me, err, sizeof err)) {
    fprintf(stderr, "vspec-bench %s: %s\n", cmd, err);
    return 0;
  }
  vs_autotune_default(&me, vs_bench_is_continuous(m));
  vs_autotune_opts o = {.progress = vs_bench_tune_progress};
  if (vs_autotune_resolve(m, env->dev, &me, &o, &tune, err, sizeof err)) {
    vs_bench_tune_progress_end();
    fprintf(stderr, "vspec-bench %s: %s: %s\n", cmd, me.text, err);
    return 0;
  }
  if (!tune.from_cache) vs_bench_tune_progress_end();
  if (tune.choice[0]) {
    char note[1024];
    vs_autotune_describe(&tune, note, sizeof note);
    fprintf(stderr, "%s\n", note);
  }
  *run = tune.method;
  return 1;
}
