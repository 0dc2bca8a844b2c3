/*
 * bench/bench_opts.h - the options vspec-bench's commands share (--model, --method, --seed,
 * --plugins, --threads, --device, --precision, --cfg, --temperature, --top-k, --top-p,
 * --cfg-interval, --num-iter, --cfg-schedule): parsed once, at the command line, into one
 * typed set that the command carries. Each command's getopt table lists the shared options
 * it takes (the VS_BENCH_OPT* entries) next to its own, and hands every option to
 * vs_bench_opt first.
 */
#ifndef VS_BENCH_OPTS_H
#define VS_BENCH_OPTS_H

#include <getopt.h>

#include "bench/bench.h"

typedef struct vs_bench_opts {
  const char *model_dir;   /* --model DIR (-m); the command's default, NULL for none */
  const char *method;      /* --method M (-M); "ar" */
  const char *plugin_dir;  /* --plugins DIR; NULL: next to the program */
  unsigned long long seed; /* --seed S (-s); 0 */
  vs_bench_device dv;      /* --device, --precision, --threads */
  vs_bench_mar_opts mar;   /* --num-iter, --cfg-schedule */
  /* Sampling overrides; NAN, -1 (top_k) and -2 (cfg_interval): the model's default. */
  double temperature, top_p, cfg;
  long top_k, cfg_interval;
} vs_bench_opts;

/* getopt codes of the shared long options without a short form. */
enum {
  VS_BENCH_O_PLUGINS = 0x1000,
  VS_BENCH_O_THREADS,
  VS_BENCH_O_DEVICE,
  VS_BENCH_O_PRECISION,
  VS_BENCH_O_TEMP,
  VS_BENCH_O_TOPK,
  VS_BENCH_O_TOPP,
  VS_BENCH_O_CFG,
  VS_BENCH_O_CFGI,
  VS_BENCH_O_NUM_ITER,
  VS_BENCH_O_CFG_SCHED,
};

/* The shared entries of a command's getopt_long table. */
#define VS_BENCH_OPT_MODEL {"model", required_argument, 0, 'm'}
#define VS_BENCH_OPT_METHOD {"method", required_argument, 0, 'M'}
#define VS_BENCH_OPT_SEED {"seed", required_argument, 0, 's'}
#define VS_BENCH_OPT_PLUGINS {"plugins", required_argument, 0, VS_BENCH_O_PLUGINS}
#define VS_BENCH_OPTS_DEVICE                                        \
  {"threads", required_argument, 0, VS_BENCH_O_THREADS},            \
      {"device", required_argument, 0, VS_BENCH_O_DEVICE},          \
      {"precision", required_argument, 0, VS_BENCH_O_PRECISION}
#define VS_BENCH_OPTS_GUIDANCE                             \
  {"cfg", required_argument, 0, VS_BENCH_O_CFG},           \
      {"temperature", required_argument, 0, VS_BENCH_O_TEMP}
#define VS_BENCH_OPTS_FILTERS                              \
  {"top-k", required_argument, 0, VS_BENCH_O_TOPK},        \
      {"top-p", required_argument, 0, VS_BENCH_O_TOPP},    \
      {"cfg-interval", required_argument, 0, VS_BENCH_O_CFGI}
#define VS_BENCH_OPTS_MAR                                  \
  {"num-iter", required_argument, 0, VS_BENCH_O_NUM_ITER}, \
      {"cfg-schedule", required_argument, 0, VS_BENCH_O_CFG_SCHED}

/* Every option unset; model_dir is the command's default. */
void vs_bench_opts_init(vs_bench_opts *o, const char *model_dir);
/* Option c (getopt_long's return) with its argument: 1 when it is a shared option, parsed;
 * 0 when its value is bad (the error is printed); -1 when it is not a shared option. */
int vs_bench_opt(vs_bench_opts *o, int c, const char *arg);
/* 1 when argv has no operand left after the options, else prints
 * "vspec-bench CMD: unexpected argument 'X'" and returns 0. */
int vs_bench_no_operands(const char *cmd, int argc, char **argv);
/* vs_bench_env_open on the options' plugins and device; prints "vspec-bench CMD: error" and
 * returns 0 on failure. */
int vs_bench_opts_env(const char *cmd, const vs_bench_opts *o, const char *argv0,
                      vs_bench_env *env);
/* The sampling of a job: the model's defaults with the options' overrides, --num-iter and
 * --cfg-schedule included; prints why and returns 0 when those do not fit the model
 * (vs_bench_apply_mar_opts). */
int vs_bench_opts_sampling(const char *cmd, const vs_bench_opts *o, const vs_models *m,
                           vs_sampling *s);

#endif /* VS_BENCH_OPTS_H */
