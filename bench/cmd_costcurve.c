/*
 * vspec-bench costcurve: how the cost of one target forward grows with the number of
 * tree nodes it verifies, and how close batch-1 decoding gets to the memory-bandwidth
 * bound. Tree sizes for speculative decoding follow from this curve (DESIGN.md,
 * "Performance notes").
 */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/bench_opts.h"
#include "core/cli_args.h"
#include "core/forward_timing.h"
#include "kernels/cpu/cpu_dev.h"

static void cc_usage(FILE *f) {
  fprintf(f,
          "cc_usage: vspec-bench costcurve (--model DIR | --random gpt-b|micro) [options]\n"
          "\n"
          "  --model DIR        model directory whose target GPT is measured\n"
          "  --random SHAPE     a random-weight GPT: gpt-b (12 layers, width 768, vocab 16384,\n"
          "                     16x16 grid), micro (2 layers, width 64, vocab 64, 4x4 grid) or\n"
          "                     LAYERSxDIMxHEADSxVOCABxGRID\n"
          "  --weight-format F  with --random: default (the device's precision) or int8\n"
          "                     (llamagen's weight_format: int8 linear weights where the CPU\n"
          "                     has AMX-INT8 and runs bf16)\n"
          "  --label TEXT       name printed in the table\n"
          "  --sizes LIST       node counts (default 1,2,4,8,16,32,64)\n"
          "  --min-time S       seconds measured per point (default 0.5)\n"
          "  --threads N        compute threads (default: all cores)\n"
          "  --device D         cpu (default), cuda or cuda:N\n"
          "  --precision P      weights: fp32 or bf16 (bf16 is the GPU's default;\n"
          "                     on the CPU: AMX tiles, else AVX2 for decode steps)\n"
          "  --plugins DIR      plugin directory\n"
          "  --image            also time one whole image by AR with CFG (median of 5)\n"
          "  --sessions LIST    also time cross-job batches (the backend's forward_multi, as\n"
          "                     [workers] batch runs them): LIST session counts (1..16), each\n"
          "                     session a one-token step with CFG, against lone forwards\n"
          "  --cpu-time         time forwards and the bandwidth probe with the thread's CPU\n"
          "                     clock instead of the wall clock (steadier on a loaded\n"
          "                     machine; --threads 1 on the CPU only)\n"
          "  --counters         also count what one forward issues on the device at each\n"
          "                     size: ops (kernel launches on a GPU), host<->device\n"
          "                     transfers and waits\n");
}

/* ---- memory bandwidth ------------------------------------------------------------ */

#include <immintrin.h>

typedef struct bw_arg {
  const float *p;
  size_t n;
  float sum;
  double cpu_s; /* the thread's CPU time for the sum */
} bw_arg;

/* Wide vector loads with independent accumulators, so the loop is limited by memory and not
 * by a floating-point dependency chain (a scalar loop underestimates bandwidth). */
__attribute__((target("avx2"))) static float bw_sum_avx2(const float *p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0;
  for (int j = 0; j < 8; j++) s += out[j];
  for (; i < n; i++) s += p[i];
  return s;
}

static float bw_sum(const float *p, size_t n) {
  if (__builtin_cpu_supports("avx2")) return bw_sum_avx2(p, n);
  float acc[16] = {0};
  for (size_t i = 0; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; j++) acc[j] += p[i + j];
  float s = 0;
  for (int j = 0; j < 16; j++) s += acc[j];
  return s;
}

static void *bw_read(void *arg) {
  bw_arg *a = arg;
  double t0 = vs_bench_cpu_now();
  a->sum = bw_sum(a->p, a->n);
  a->cpu_s = vs_bench_cpu_now() - t0;
  return NULL;
}

/* Read bandwidth in bytes/s over a buffer far larger than the caches; best of 3. With cpu,
 * over the reading thread's CPU time (one thread). The buffer is on huge pages where the
 * kernel gives them, as the CPU device's weights are (kernels/cpu/cpu_dev.c): on 4 KiB pages
 * the probe read 20-27 GB/s on the Zen 4 development machine, on 2 MiB pages 30-33, and the
 * decode's weight stream beat the smaller figure (docs/BENCHMARKS.md, issue 33 item 4). */
static double measure_read_bandwidth(int threads, int cpu) {
  size_t n = (size_t)256 << 20; /* floats: 1 GiB */
  float *buf = vs_cpu_weight_alloc(n * sizeof(float));
  if (!buf) return 0;
  for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 7);
  double best = 0;
  for (int rep = 0; rep < 3; rep++) {
    pthread_t tid[64];
    bw_arg args[64];
    double t0 = vs_bench_now();
    for (int t = 0; t < threads; t++) {
      args[t] = (bw_arg){buf + n / threads * t, n / threads, 0, 0};
      pthread_create(&tid[t], NULL, bw_read, &args[t]);
    }
    float total = 0;
    for (int t = 0; t < threads; t++) {
      pthread_join(tid[t], NULL);
      total += args[t].sum;
    }
    double dt = cpu ? args[0].cpu_s : vs_bench_now() - t0;
    double bw = (double)n * sizeof(float) / dt;
    if (bw > best && total != -1.0f) best = bw;
  }
  free(buf);
  return best;
}

/* Device memory bandwidth for a device with its own memory (a GPU): device-to-device copies
 * of 512 MiB read and write every byte once; best of 5. */
static double measure_device_bandwidth(vspec_dev *dev) {
  const vspec_ops *o = vs_dev_ops(dev);
  size_t bytes = (size_t)512 << 20;
  void *a = o->alloc(dev, bytes), *b = o->alloc(dev, bytes);
  double best = 0;
  float probe;
  if (a && b) {
    for (int rep = 0; rep < 5; rep++) {
      double t0 = vs_bench_now();
      o->copy(dev, b, a, bytes);
      o->download(dev, &probe, b, sizeof probe); /* waits for the copy */
      double bw = 2.0 * (double)bytes / (vs_bench_now() - t0);
      if (bw > best) best = bw;
    }
  }
  if (a) o->free(dev, a);
  if (b) o->free(dev, b);
  return best;
}

/* One image by vanilla AR with CFG (two rows), temperature 1: end-to-end seconds, median of
 * `reps` (the decode loop as a user runs it, sampling included, no VQ decode). */
static int time_image(vs_bench_env *env, const vs_backend_model *t, int reps, double *median_s,
                      char *err, size_t errlen) {
  vs_models m;
  memset(&m, 0, sizeof m);
  m.target = *t;
  m.reg = env->reg;
  m.host = &env->host;
  snprintf(m.name, sizeof m.name, "costcurve");
  int n = t->info.grid_h * t->info.grid_w;
  int32_t *tokens = malloc((size_t)n * sizeof *tokens);
  double s[16];
  if (!tokens) return VSPEC_ENOMEM;
  if (reps > 16) reps = 16;
  for (int r = 0; r <= reps; r++) { /* r = 0 warms up (bf16 weight copies, caches) */
    vs_job job = {.method = NULL /* ar */, .class_label = 1, .seed = (uint64_t)r + 1,
                  .sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f,
                               .cfg_scale = 4.0f, .cfg_interval = -1}};
    double t0 = vs_bench_now();
    int rc = vs_generate(&m, env->dev, &job, tokens, NULL, err, errlen);
    if (rc) {
      free(tokens);
      return rc;
    }
    if (r > 0) s[r - 1] = vs_bench_now() - t0;
  }
  free(tokens);
  for (int i = 1; i < reps; i++) /* insertion sort for the median */
    for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
      double x = s[j];
      s[j] = s[j - 1];
      s[j - 1] = x;
    }
  *median_s = reps % 2 ? s[reps / 2] : 0.5 * (s[reps / 2 - 1] + s[reps / 2]);
  return VSPEC_OK;
}

/* What one forward issues at each size, 1 and 2 rows (core/forward_timing.h). */
static int print_counters(vs_bench_env *env, const vs_backend_model *t, const int *sizes,
                          int n_sizes, char *err, size_t errlen) {
  printf("\nwhat one forward issues on the device (ops: kernel launches on a GPU)\n\n");
  printf("| nodes | rows | ops | uploads | bytes up | downloads | bytes down | waits |\n");
  printf("|------:|-----:|----:|--------:|---------:|----------:|-----------:|------:|\n");
  for (int i = 0; i < n_sizes; i++)
    for (int rows = 1; rows <= 2; rows++) {
      vs_dev_counters c;
      int rc = vs_count_forward(env->dev, t, rows, sizes[i], &c, err, errlen);
      if (rc) return rc;
      printf("| %5d | %4d | %llu | %llu | %llu | %llu | %llu | %llu |\n", sizes[i], rows,
             (unsigned long long)c.ops, (unsigned long long)c.uploads,
             (unsigned long long)c.upload_bytes, (unsigned long long)c.downloads,
             (unsigned long long)c.download_bytes, (unsigned long long)c.syncs);
    }
  return VSPEC_OK;
}

/* costcurve's options: the shared ones (bench/bench_opts.h) and its own. */
typedef struct curve_args {
  vs_bench_opts o; /* o.model_dir: NULL unless --model */
  const char *random, *label, *weight_format;
  int sizes[16], n_sizes;
  int sessions[16], n_sessions; /* --sessions; 0 counts: no batch table */
  double min_time;
  int image, counters, cpu_time;
} curve_args;

/* The checks between options, after parsing. 1 when they fit, else 0 (printed). */
static int curve_check(curve_args *a, const char *sizes_text, const char *sessions_text) {
  if (!a->o.model_dir == !a->random) {
    fprintf(stderr, "vspec-bench costcurve: give exactly one of --model and --random\n");
    return 0;
  }
  if (a->weight_format && strcmp(a->weight_format, "default") != 0 &&
      strcmp(a->weight_format, "int8") != 0) {
    fprintf(stderr, "vspec-bench costcurve: --weight-format '%s': use default or int8\n",
            a->weight_format);
    return 0;
  }
  if (a->weight_format && !a->random) {
    fprintf(stderr, "vspec-bench costcurve: --weight-format goes with --random (a model "
            "directory's manifest sets weight_format per role)\n");
    return 0;
  }
  if (a->cpu_time && (a->o.dv.threads != 1 || a->image)) {
    fprintf(stderr, "vspec-bench costcurve: --cpu-time needs --threads 1 (and no --image)\n");
    return 0;
  }
  a->n_sizes = vs_bench_parse_sizes("costcurve", "--sizes", sizes_text, 1, 64, a->sizes, 16);
  if (a->n_sizes >= 0 && sessions_text)
    a->n_sessions = vs_bench_parse_sizes("costcurve", "--sessions", sessions_text, 1,
                                         VS_TIME_MULTI_MAX, a->sessions, 16);
  return a->n_sizes >= 0 && a->n_sessions >= 0;
}

/* -1 to go on, else the exit code (--help, a bad option). */
static int curve_parse(int argc, char **argv, curve_args *a) {
  const char *sizes_text = "1,2,4,8,16,32,64", *sessions_text = NULL;
  *a = (curve_args){.min_time = 0.5};
  vs_bench_opts_init(&a->o, NULL);
  enum { O_RANDOM = 256, O_LABEL, O_SIZES, O_MIN, O_IMAGE, O_WFORMAT, O_COUNTERS, O_CPU,
         O_SESSIONS };
  static const struct option opts[] = {
      VS_BENCH_OPT_MODEL,                        {"random", required_argument, 0, O_RANDOM},
      {"label", required_argument, 0, O_LABEL},  {"sizes", required_argument, 0, O_SIZES},
      {"min-time", required_argument, 0, O_MIN}, VS_BENCH_OPTS_DEVICE,
      VS_BENCH_OPT_PLUGINS,                      {"help", no_argument, 0, 'h'},
      {"image", no_argument, 0, O_IMAGE}, {"weight-format", required_argument, 0, O_WFORMAT},
      {"counters", no_argument, 0, O_COUNTERS}, {"cpu-time", no_argument, 0, O_CPU},
      {"sessions", required_argument, 0, O_SESSIONS}, {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
    int ok = 1;
    switch (c) {
      case O_RANDOM: a->random = optarg; break;
      case O_LABEL: a->label = optarg; break;
      case O_SIZES: sizes_text = optarg; break;
      case O_MIN: ok = vs_cli_double("--min-time", optarg, 0.01, 600, &a->min_time); break;
      case O_IMAGE: a->image = 1; break;
      case O_COUNTERS: a->counters = 1; break;
      case O_CPU: a->cpu_time = 1; break;
      case O_SESSIONS: sessions_text = optarg; break;
      case O_WFORMAT: a->weight_format = optarg; break;
      case 'h': cc_usage(stdout); return 0;
      default:
        ok = vs_bench_opt(&a->o, c, optarg);
        if (ok < 0) {
          cc_usage(stderr);
          return 2;
        }
    }
    if (!ok) return 2;
  }
  return curve_check(a, sizes_text, sessions_text) ? -1 : 2;
}

/* The target measured: --random's random-weight GPT (written to tmp_path and loaded into
 * rnd) or --model's target (in *models). 0 or an exit code. */
static int curve_target(const curve_args *a, vs_bench_env *env, vs_backend_model *rnd,
                        vs_models **models, char *tmp_path, size_t tmp_cap,
                        const vs_backend_model **t) {
  char err[VSPEC_ERRLEN];
  const char *random = a->random;
  if (!random) {
    if (vs_models_open(env->reg, &env->host, env->dev, a->o.model_dir, VS_ROLE_TARGET, models,
                       err, sizeof err)) {
      fprintf(stderr, "vspec-bench costcurve: %s\n", err);
      return 1;
    }
    *t = &(*models)->target;
    /* The curve times forwards over token trees (ids in, logits out); a MAR target has
     * neither, and verifies drafted generation steps in a way the curve does not model. */
    if (vs_bench_is_continuous(*models)) {
      fprintf(stderr, "vspec-bench costcurve: model '%s': the cost curve of tree verification is "
              "not supported for continuous-token (MAR) models; use depth=L explicitly in "
              "their methods and compare speed with vspec-bench eval\n", a->o.model_dir);
      return 1;
    }
    return 0;
  }
  int layers, dim, heads, vocab, grid;
  if (strcmp(random, "gpt-b") == 0) {
    layers = 12, dim = 768, heads = 12, vocab = 16384, grid = 16;
  } else if (strcmp(random, "micro") == 0) {
    layers = 2, dim = 64, heads = 4, vocab = 64, grid = 4;
  } else if (sscanf(random, "%dx%dx%dx%dx%d", &layers, &dim, &heads, &vocab, &grid) == 5 &&
             layers > 0 && layers <= 128 && dim > 0 && heads > 0 && dim % heads == 0 &&
             (dim / heads) % 4 == 0 && vocab > 1 && grid > 0 && grid <= 64) {
    /* a custom shape: LAYERSxDIMxHEADSxVOCABxGRID */
  } else {
    fprintf(stderr, "vspec-bench costcurve: --random '%s': use gpt-b, micro or "
            "LAYERSxDIMxHEADSxVOCABxGRID (e.g. 8x256x4x1024x8)\n", random);
    return 2;
  }
  char load_params[128] = "max_nodes=64";
  if (a->weight_format)
    snprintf(load_params, sizeof load_params, "max_nodes=64,weight_format=%s", a->weight_format);
  const char *td = getenv("TMPDIR");
  snprintf(tmp_path, tmp_cap, "%s/vspec-random-%s-%ld.safetensors", td && *td ? td : "/tmp",
           random, (long)getpid());
  fprintf(stderr, "writing a random-weight %s checkpoint to %s ...\n", random, tmp_path);
  if (vs_bench_write_random_gpt(tmp_path, layers, dim, heads, heads, vocab, grid, 1000, 1, err,
                                sizeof err) ||
      vs_backend_model_load(env->reg, &env->host, env->dev, "llamagen", tmp_path, load_params,
                            rnd, err, sizeof err)) {
    fprintf(stderr, "vspec-bench costcurve: %s\n", err);
    return 1;
  }
  *t = rnd;
  return 0;
}

/* The table: forward latency at each size, 1 and 2 rows. */
static int curve_table(const curve_args *a, vs_bench_env *env, const vs_backend_model *t,
                       char *err, size_t errlen) {
  const char *name = a->label ? a->label : (a->random ? a->random : a->o.model_dir);
  printf("\ncost curve: %s (width %d, vocab %d, grid %dx%d)\n", name, t->info.feature_dim,
         t->info.vocab, t->info.grid_h, t->info.grid_w);
  vs_bench_print_device(stdout, env->dev);
  printf("median forward latency over a half-image prefix; nodes form a binary tree\n\n");
  printf("| nodes | 1 row: ms | ms/node | x 1 node | 2 rows (CFG): ms | ms/node | x 1 node |\n");
  printf("|------:|----------:|--------:|---------:|-----------------:|--------:|---------:|\n");
  double base[3] = {0, 0, 0};
  for (int i = 0; i < a->n_sizes; i++) {
    int n = a->sizes[i];
    double ms[3];
    for (int rows = 1; rows <= 2; rows++) {
      int rc = vs_time_forward_clock(env->dev, t, rows, n, a->min_time,
                                     a->cpu_time ? vs_bench_cpu_now : NULL, &ms[rows], err, errlen);
      if (rc) return rc;
    }
    if (i == 0) base[1] = ms[1], base[2] = ms[2];
    printf("| %5d | %9.3f | %7.3f | %8.2f | %16.3f | %7.3f | %8.2f |\n", n, ms[1], ms[1] / n,
           ms[1] / base[1], ms[2], ms[2] / n, ms[2] / base[2]);
    fflush(stdout);
  }
  return VSPEC_OK;
}

/* Batch-1 decode against the memory-bandwidth bound: it reads every weight once per token
 * except the embedding tables (one row each), so weight bytes / bandwidth bounds its speed
 * from above. */
static int curve_bound(const curve_args *a, vs_bench_env *env, const vs_backend_model *t,
                       char *err, size_t errlen) {
  double one_ms[3];
  for (int rows = 1; rows <= 2; rows++) {
    int rc = vs_time_forward_clock(env->dev, t, rows, 1, a->min_time,
                                   a->cpu_time ? vs_bench_cpu_now : NULL, &one_ms[rows], err, errlen);
    if (rc) return rc;
  }
  int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
  int bw_threads = a->o.dv.threads > 0 ? a->o.dv.threads : ncpu;
  int on_cpu = vs_dev_ops(env->dev)->device == VSPEC_DEVICE_CPU;
  if (a->cpu_time && !on_cpu) {
    snprintf(err, errlen, "--cpu-time: the device is not the CPU");
    return VSPEC_EINVAL;
  }
  double bw = on_cpu ? measure_read_bandwidth(bw_threads, a->cpu_time)
                     : measure_device_bandwidth(env->dev);
  printf("\nbatch-1 decode: %.1f tokens/s (1 row), %.1f tokens/s (2 rows, CFG)\n", 1e3 / one_ms[1],
         1e3 / one_ms[2]);
  if (on_cpu)
    printf("memory read bandwidth: %.2f GB/s (%d threads%s)\n", bw / 1e9, bw_threads,
           a->cpu_time ? ", CPU time" : "");
  else
    printf("device memory bandwidth: %.2f GB/s (device-to-device copy)\n", bw / 1e9);
  /* bf16 weights: linear layers read half the bytes (they are nearly all of stream_bytes) */
  vs_device_info di;
  int bf16 = vs_dev_info(env->dev, &di) == VSPEC_OK && di.precision == VS_PRECISION_BF16;
  double bytes = (double)t->info.stream_bytes * (bf16 ? 0.5 : 1.0);
  printf("weights read per token: %.1f MB%s (%.2f M parameters in all)\n", bytes / 1e6,
         bf16 ? " in bf16" : "", (double)t->info.params / 1e6);
  printf("bandwidth bound: %.1f tokens/s (%.3f ms per forward); measured 1-row decode reaches "
         "%.0f%% of it\n", bw / bytes, 1e3 * bytes / bw, 100.0 * (1e3 / one_ms[1]) / (bw / bytes));
  return VSPEC_OK;
}

/* Cross-job batches (--sessions): the batched forward of S sessions, each a one-token step
 * with CFG over its own half-image prefix, against S lone forwards of one session; the last
 * column bounds what batching can give a server's images/s over one job (the host's share of
 * a step left out). Timed last, so that tools/gpu/kernels.sh finds the batched forwards at
 * the end of the run. */
static int curve_sessions(const curve_args *a, vs_bench_env *env, const vs_backend_model *t,
                          char *err, size_t errlen) {
  double lone;
  int rc = vs_time_forward(env->dev, t, 2, 1, a->min_time, &lone, err, errlen);
  if (rc) return rc;
  printf("\ncross-job batches (forward_multi, as [workers] batch runs them): sessions of one "
         "token step with CFG, each over its own half-image prefix\n\n");
  printf("| sessions | batched: ms | ms a session | x one session alone | S lone / batched |\n");
  printf("|---------:|------------:|-------------:|--------------------:|-----------------:|\n");
  for (int i = 0; i < a->n_sessions; i++) {
    int S = a->sessions[i];
    double ms;
    rc = vs_time_forward_multi(env->dev, t, S, 2, a->min_time, &ms, err, errlen);
    if (rc) return rc;
    printf("| %8d | %11.3f | %12.3f | %19.2f | %15.2fx |\n", S, ms, ms / S, ms / lone,
           S * lone / ms);
    fflush(stdout);
  }
  printf("(one session alone: %.3f ms)\n", lone);
  return VSPEC_OK;
}

/* Everything measured on the target t. 0 or an exit code. */
static int curve_measure(const curve_args *a, vs_bench_env *env, const vs_backend_model *t) {
  char err[VSPEC_ERRLEN];
  int rc = curve_table(a, env, t, err, sizeof err);
  if (!rc && a->counters) rc = print_counters(env, t, a->sizes, a->n_sizes, err, sizeof err);
  if (!rc) rc = curve_bound(a, env, t, err, sizeof err);
  double img_s;
  if (!rc && a->image) {
    rc = time_image(env, t, 5, &img_s, err, sizeof err);
    if (!rc)
      printf("one image by AR with CFG (%d tokens, 2 rows, sampling included, no VQ decode): "
             "%.4f s (median of 5)\n", t->info.grid_h * t->info.grid_w, img_s);
  }
  if (!rc && a->n_sessions) rc = curve_sessions(a, env, t, err, sizeof err);
  if (!rc) return 0;
  fprintf(stderr, "vspec-bench costcurve: %s\n", err);
  return 1;
}

int vs_bench_cmd_costcurve(int argc, char **argv) {
  curve_args a;
  int status = curve_parse(argc, argv, &a);
  if (status >= 0) return status;
  vs_bench_env env;
  if (!vs_bench_opts_env("costcurve", &a.o, argv[0], &env)) return 1;
  vs_models *models = NULL;
  vs_backend_model rnd = {0};
  const vs_backend_model *t = NULL;
  char tmp_path[256] = "";
  status = curve_target(&a, &env, &rnd, &models, tmp_path, sizeof tmp_path, &t);
  if (!status) status = curve_measure(&a, &env, t);
  vs_backend_model_unload(&rnd);
  vs_models_close(models);
  if (*tmp_path) unlink(tmp_path);
  vs_bench_env_close(&env);
  return status;
}
