/*
 * bench/bench_opts.c - the options vspec-bench's commands share (bench/bench_opts.h).
 */
#include <math.h>
#include <stdio.h>

#include "bench/bench_opts.h"
#include "core/cli_args.h"

void vs_bench_opts_init(vs_bench_opts *o, const char *model_dir) {
  *o = (vs_bench_opts){.model_dir = model_dir, .method = "ar",
                       .mar = VS_BENCH_MAR_OPTS_INIT, .temperature = NAN, .top_p = NAN,
                       .cfg = NAN, .top_k = -1, .cfg_interval = -2};
}

int vs_bench_opt(vs_bench_opts *o, int c, const char *arg) {
  long threads;
  switch (c) {
    case 'm': o->model_dir = arg; return 1;
    case 'M': o->method = arg; return 1;
    case 's': return vs_cli_u64("--seed", arg, &o->seed);
    case VS_BENCH_O_PLUGINS: o->plugin_dir = arg; return 1;
    case VS_BENCH_O_THREADS:
      if (!vs_cli_long("--threads", arg, 0, 1024, &threads)) return 0;
      o->dv.threads = (int)threads;
      return 1;
    case VS_BENCH_O_DEVICE: o->dv.spec = arg; return 1;
    case VS_BENCH_O_PRECISION: return vs_bench_parse_precision("--precision", arg, &o->dv.precision);
    case VS_BENCH_O_TEMP: return vs_cli_double("--temperature", arg, 0, 100, &o->temperature);
    case VS_BENCH_O_TOPK: return vs_cli_long("--top-k", arg, 0, 1 << 30, &o->top_k);
    case VS_BENCH_O_TOPP: return vs_cli_double("--top-p", arg, 1e-9, 1, &o->top_p);
    case VS_BENCH_O_CFG: return vs_cli_double("--cfg", arg, 0, 100, &o->cfg);
    case VS_BENCH_O_CFGI: return vs_cli_long("--cfg-interval", arg, -1, 1 << 30, &o->cfg_interval);
    case VS_BENCH_O_NUM_ITER: return vs_cli_long("--num-iter", arg, 1, 1 << 20, &o->mar.num_iter);
    case VS_BENCH_O_CFG_SCHED:
      return vs_bench_parse_cfg_schedule("--cfg-schedule", arg, &o->mar.cfg_schedule);
    default: return -1;
  }
}

int vs_bench_no_operands(const char *cmd, int argc, char **argv) {
  if (optind >= argc) return 1;
  fprintf(stderr, "vspec-bench %s: unexpected argument '%s'\n", cmd, argv[optind]);
  return 0;
}

int vs_bench_opts_env(const char *cmd, const vs_bench_opts *o, const char *argv0,
                      vs_bench_env *env) {
  char err[VSPEC_ERRLEN];
  if (!vs_bench_env_open(env, argv0, o->plugin_dir, &o->dv, err, sizeof err)) return 1;
  fprintf(stderr, "vspec-bench %s: %s\n", cmd, err);
  return 0;
}

int vs_bench_opts_sampling(const char *cmd, const vs_bench_opts *o, const vs_models *m,
                           vs_sampling *s) {
  *s = m->defaults;
  if (!isnan(o->temperature)) s->temperature = (float)o->temperature;
  if (o->top_k >= 0) s->top_k = (int)o->top_k;
  if (!isnan(o->top_p)) s->top_p = (float)o->top_p;
  if (!isnan(o->cfg)) s->cfg_scale = (float)o->cfg;
  if (o->cfg_interval >= -1) s->cfg_interval = (int)o->cfg_interval;
  return vs_bench_apply_mar_opts(cmd, m, &o->mar, s);
}
