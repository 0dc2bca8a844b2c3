/*
 * bench/bench.h - vspec-bench: in-process generation, benchmarks and evaluation.
 */
#ifndef VS_BENCH_H
#define VS_BENCH_H

#include <stdio.h>

#include "core/engine.h"
#include "core/host.h"
#include "core/registry.h"
#include "kernels/vs_kernels.h"

/* What every subcommand needs: a device, the host services and the plugin registry. */
typedef struct vs_bench_env {
  vspec_dev *dev;
  vspec_host host;
  vs_registry *reg;
  char plugin_dir[1024];
} vs_bench_env;

/* Where a subcommand computes (--device, --precision, --threads). */
typedef struct vs_bench_device {
  const char *spec; /* "cpu" (NULL too), "cuda", "cuda:N" */
  int threads;      /* CPU compute threads, 0 = all cores */
  int precision;    /* VS_PRECISION_*: fp32 parity or bf16 weights on a GPU */
} vs_bench_device;

/* The model directory a subcommand opens for --model `dir`: `dir` itself when it exists here
 * (models/fmnist from the checkout), else the one installed with this program when it is
 * there (PREFIX/share/vspec/`dir`, core/paths.h), as vspecd finds its default model; else
 * `dir`, so that the error names what the user gave. The result lives until the next call
 * (one per subcommand, after its options are parsed). */
const char *vs_bench_model_dir(const char *dir);

/* dv NULL: the CPU with all cores. */
int vs_bench_env_open(vs_bench_env *env, const char *argv0, const char *plugin_dir,
                      const vs_bench_device *dv, char *err, size_t errlen);
/* "fp32" or "bf16" (the --precision option); prints the error and returns 0 if neither. */
int vs_bench_parse_precision(const char *option, const char *text, int *out);
/* The device line every table prints: "device: cpu (avx512, 2 threads), fp32". */
void vs_bench_print_device(FILE *f, vspec_dev *dev);
void vs_bench_env_close(vs_bench_env *env);
double vs_bench_now(void);
/* s as a JSON string, quotes and escapes included (eval's JSON, the machine record). */
void vs_bench_json_str(FILE *f, const char *s);
/* The calling thread's CPU clock in seconds (steadier than the wall on a shared machine). */
double vs_bench_cpu_now(void);
/* A list option of `cmd` (opt: its name, for the message, e.g. --sizes): a comma-separated
 * list of lo..hi, at most max values (the rest are ignored). Returns how many (at least one), or -1 after printing the error. */
int vs_bench_parse_sizes(const char *cmd, const char *opt, const char *text, int lo, int hi,
                         int *sizes, int max);
/* The --isa option (scalar, avx2, avx512) on a CPU device; prints the error and returns 0 when
 * the name is unknown or this CPU lacks it. */
int vs_bench_set_isa(vspec_dev *dev, const char *cmd, const char *name);
/* The q-quantile (0..1) of n values by nearest rank, v unchanged; 0 when n is 0
 * (quantile.c). */
double vs_bench_quantile(const double *v, int n, double q);

/* ---- one job, either token kind (bench_job.c) ------------------------------------------ */

/* 1 when the target has continuous tokens (MAR): no vocabulary, no codebook, latents out. */
int vs_bench_is_continuous(const vs_models *m);

/* A job's output: token ids [grid] (zeros for a continuous-token model) and, for a
 * continuous-token model, its latents [vs_models_latent_count] (NULL otherwise). Decode
 * either with vs_models_decode(models, dev, g.tokens, g.latents, ...). */
typedef struct vs_bench_grid {
  int32_t *tokens;
  float *latents;
} vs_bench_grid;

int vs_bench_grid_alloc(vs_bench_grid *g, const vs_models *m, char *err, size_t errlen);
void vs_bench_grid_free(vs_bench_grid *g);
/* vs_generate into g (sets job->latents to g->latents). */
int vs_bench_generate(vs_models *m, vspec_dev *dev, vs_job *job, vs_bench_grid *g,
                      vs_metrics *mt, char *err, size_t errlen);

/* The method a subcommand runs for `text`: size=auto, asked for or by default, replaced by
 * the choice tuned for this model and machine (core/autotune.h; a cached choice when there is
 * one), which is printed on stderr. Prints the error as "vspec-bench CMD: ..." and returns 0
 * on failure. The method in `run` outlives no one: jobs point at it. */
int vs_bench_resolve_method(const char *cmd, vs_bench_env *env, vs_models *m, const char *text,
                            vs_method *run);
/* size=auto's progress on stderr (a vs_autotune_progress_fn; `user` unused): one line that
 * redraws itself on a terminal, else a line every few seconds. */
void vs_bench_tune_progress(void *user, double done, const char *message);
/* Clears that line on a terminal (call when the tuning ended). */
void vs_bench_tune_progress_end(void);

/* --num-iter and --cfg-schedule (generate, eval, demo): continuous-token models only. */
typedef struct vs_bench_mar_opts {
  long num_iter;    /* 0: not given (the model's default) */
  int cfg_schedule; /* VS_CFG_*, -1: not given */
} vs_bench_mar_opts;
#define VS_BENCH_MAR_OPTS_INIT {0, -1}

/* "linear" or "constant"; prints the error and returns 0 if neither. */
int vs_bench_parse_cfg_schedule(const char *option, const char *text, int *out);
/* Applies the given options to s. Prints why and returns 0 when they do not fit the model:
 * given for a discrete-token model (whose sampler would ignore them), or more steps than
 * tokens. */
int vs_bench_apply_mar_opts(const char *cmd, const vs_models *m, const vs_bench_mar_opts *o,
                            vs_sampling *s);
/* The generation steps a continuous-token job with sampling s runs; 0 for a discrete model. */
int vs_bench_num_iter(const vs_models *m, const vs_sampling *s);

/* Subcommands; argv[0] is the subcommand name. Return a process exit code. */
int vs_bench_cmd_generate(int argc, char **argv);
int vs_bench_cmd_costcurve(int argc, char **argv);
int vs_bench_cmd_demo(int argc, char **argv);
int vs_bench_cmd_quality(int argc, char **argv);

int vs_bench_cmd_eval(int argc, char **argv);
int vs_bench_cmd_tune(int argc, char **argv);

int vs_bench_cmd_linear(int argc, char **argv);
int vs_bench_cmd_attention(int argc, char **argv);

/* Writes a random-weight LlamaGen GPT (c2i) with the given shape to `path`; n_kv_head <
 * n_head gives grouped-query attention (n_head a multiple of n_kv_head). */
int vs_bench_write_random_gpt(const char *path, int n_layer, int dim, int n_head, int n_kv_head,
                              int vocab,
                              int grid, int num_classes, uint64_t seed, char *err, size_t errlen);

/* Writes a random-weight LlamaGen VQ (codebook and decoder, vq_model.py's layout) with a
 * codebook of `codebook` x `embed_dim`, base width `ch`, widths ch * ch_mult[i], z_channels
 * and image_size pixels (bench/random_vq.c). */
int vs_bench_write_random_vq(const char *path, int codebook, int embed_dim, int ch,
                             const int *ch_mult, int n_mult, int z_channels, int image_size,
                             uint64_t seed, char *err, size_t errlen);

#endif /* VS_BENCH_H */
