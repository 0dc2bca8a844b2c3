/*
 * vspecd-startup-bench - how long vspecd takes to answer from its process start, and how
 * close the fitted preview colour table is to the exact one (docs/BENCHMARKS.md, "Start").
 *
 *   vspecd-startup-bench [--runs N] [--model DIR] [--random-gptb DIR]
 *   vspecd-startup-bench --lut-error DIR [--samples N] [--tiles K] [--linear]
 *   vspecd-startup-bench --neighbours DIR
 *
 * Startup: for each model, N starts with a cold cache (an empty VSPEC_CACHE_DIR) and N with
 * a warm one (the first start's), each timed from fork to the first answered ping on the
 * admin endpoint; prints the median and the range. --random-gptb writes (once) a random
 * model of LlamaGen's GPT-B shape with a VQ-16-shaped decoder into DIR and times it too.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench/bench.h"
#include "bench/daemon_proc.h"
#include "core/version.h"
#include "daemon/preview_fit.h"

static int ds_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* One timed start: fork to first ping answered; the daemon is stopped after. */
static int ds_start_once(const char *prog, const char *dir, const char *cache, double *s) {
  vs_bench_daemon d;
  (void)prog;
  if (vs_bench_daemon_init(&d, "vspecd-startup")) return -1;
  char model[1200], env[1200];
  snprintf(model, sizeof model, "bench=%s", dir);
  snprintf(env, sizeof env, "VSPEC_CACHE_DIR=%s", cache);
  const char *args[] = {"--model", model, "--set", "models.fmnist=", "--default-model", "bench",
                        NULL};
  const char *envs[] = {env, NULL};
  double t0 = vs_bench_now();
  int rc = vs_bench_daemon_spawn(&d, args, envs);
  if (!rc) rc = vs_bench_daemon_wait_up(&d, 600);
  *s = vs_bench_now() - t0;
  if (rc) vs_bench_daemon_dump_log(&d, 20);
  vs_bench_daemon_cleanup(&d);
  return rc;
}

static int ds_bench_model(const char *prog, const char *label, const char *dir, int runs) {
  char cache[] = "/tmp/vspec-startup-XXXXXX";
  if (!mkdtemp(cache)) {
    perror("mkdtemp");
    return -1;
  }
  double cold[32], warm[32];
  int rc = 0;
  for (int i = 0; i < runs && !rc; i++) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'/*", cache);
    if (system(cmd)) rc = -1;
    if (!rc) rc = ds_start_once(prog, dir, cache, &cold[i]);
    if (!rc) rc = ds_start_once(prog, dir, cache, &warm[i]);
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", cache);
  if (rc) {
    fprintf(stderr, "%s: vspecd did not start\n", label);
    return rc;
  }
  qsort(cold, (size_t)runs, sizeof *cold, ds_cmp);
  qsort(warm, (size_t)runs, sizeof *warm, ds_cmp);
  printf("%-40s cold cache: median %6.2f s (%.2f-%.2f)   warm cache: median %6.2f s "
         "(%.2f-%.2f)   %d runs\n",
         label, cold[runs / 2], cold[0], cold[runs - 1], warm[runs / 2], warm[0],
         warm[runs - 1], runs);
  fflush(stdout);
  return 0;
}

/* GPT-B (LlamaGen: 12 layers, width 768, 12 heads) over 16x16 tokens of a 16384 x 8
 * codebook, and VQ-16's decoder (ch 128, ch_mult 1,1,2,2,4, z 256, 256 x 256 pixels). */
static int ds_write_gptb(const char *dir) {
  char gpt[1100], vq[1100], mf[1100], err[512];
  snprintf(gpt, sizeof gpt, "%s/gpt.safetensors", dir);
  snprintf(vq, sizeof vq, "%s/vq.safetensors", dir);
  snprintf(mf, sizeof mf, "%s/vspec-model.json", dir);
  struct stat st;
  if (!stat(gpt, &st) && !stat(vq, &st)) return 0;
  mkdir(dir, 0755);
  printf("writing a random GPT-B / VQ-16 model into %s\n", dir);
  fflush(stdout);
  static const int mult[] = {1, 1, 2, 2, 4};
  if (vs_bench_write_random_gpt(gpt, 12, 768, 12, 12, 16384, 16, 1000, 1, err, sizeof err) ||
      vs_bench_write_random_vq(vq, 16384, 8, 128, mult, 5, 256, 256, 2, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return -1;
  }
  return 0;
}

static int ds_lut_error(const char *prog, const char *dir, const vs_preview_fit_opts *o) {
  (void)prog;
  vs_bench_env env;
  char err[VSPEC_ERRLEN];
  vs_models *m = NULL;
  if (vs_bench_env_open(&env, prog, NULL, NULL, err, sizeof err) ||
      vs_models_open(env.reg, &env.host, env.dev, dir, VS_ROLE_TARGET, &m, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  vs_preview_lut exact, fit;
  double t0 = vs_bench_now();
  if (vs_preview_lut_build(&m->target, env.dev, &exact, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  double t1 = vs_bench_now();
  if (vs_preview_lut_fit(&m->target, env.dev, o, &fit, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  double t2 = vs_bench_now(), mean;
  int mx;
  vs_preview_lut_diff(&fit, &exact, &mean, &mx);
  printf("%s: exact table %.2f s; fitted (%d samples, %dx%d per decode, %s) %.2f s: "
         "|RGB difference| mean %.2f, max %d; neutral code %d (exact %d)\n",
         dir, t1 - t0, o->samples, o->tiles_per_side, o->tiles_per_side,
         o->quadratic ? "quadratic" : "linear", t2 - t1, mean, mx, fit.neutral, exact.neutral);
  vs_preview_lut_free(&exact);
  vs_preview_lut_free(&fit);
  vs_models_close(m);
  vs_bench_env_close(&env);
  return 0;
}

/* The lazy neighbour table of model `dir`: built (an empty cache), then read back. */
static int ds_neighbours(const char *prog, const char *dir) {
  char cache[] = "/tmp/vspec-startup-nbr-XXXXXX";
  if (!mkdtemp(cache)) {
    perror("mkdtemp");
    return 1;
  }
  setenv("VSPEC_CACHE_DIR", cache, 1);
  vs_bench_env env;
  char err[VSPEC_ERRLEN];
  if (vs_bench_env_open(&env, prog, NULL, NULL, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  int rc = 0;
  for (int pass = 0; pass < 2 && !rc; pass++) {
    vs_models *m = NULL;
    const int32_t *t;
    int k;
    if (vs_models_open(env.reg, &env.host, env.dev, dir, VS_ROLE_TARGET, &m, err, sizeof err)) {
      fprintf(stderr, "%s\n", err);
      rc = 1;
      break;
    }
    double t0 = vs_bench_now();
    rc = vs_models_neighbours(m, &t, &k, err, sizeof err);
    printf("%s: neighbour table (%d codes, k %d) %s in %.2f s\n", dir, m->target.info.vocab, k,
           pass ? "read from the cache" : "built", vs_bench_now() - t0);
    if (rc) fprintf(stderr, "%s\n", err);
    vs_models_close(m);
  }
  vs_bench_env_close(&env);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", cache);
  return rc ? 1 : 0;
}

static void ds_usage(FILE *f) {
  fprintf(f, "usage: vspecd-startup-bench [--runs N] [--model DIR] [--random-gptb DIR]\n"
             "       vspecd-startup-bench --lut-error DIR [--samples N] [--tiles K] "
             "[--linear]\n"
             "       vspecd-startup-bench --neighbours DIR\n"
             "       vspecd-startup-bench --version\n");
}

int main(int argc, char **argv) {
  enum { O_RUNS = 256, O_MODEL, O_GPTB, O_LUT, O_SAMPLES, O_TILES, O_LINEAR, O_NBR, O_VERSION };
  static const struct option opts[] = {
      {"runs", required_argument, 0, O_RUNS},    {"model", required_argument, 0, O_MODEL},
      {"random-gptb", required_argument, 0, O_GPTB}, {"lut-error", required_argument, 0, O_LUT},
      {"samples", required_argument, 0, O_SAMPLES}, {"tiles", required_argument, 0, O_TILES},
      {"linear", no_argument, 0, O_LINEAR},      {"neighbours", required_argument, 0, O_NBR},
      {"help", no_argument, 0, 'h'},             {"version", no_argument, 0, O_VERSION},
      {0, 0, 0, 0}};
  int runs = 3, c;
  const char *model = NULL, *gptb = NULL, *lut = NULL, *nbr = NULL;
  vs_preview_fit_opts fo = {.samples = 128, .tiles_per_side = 1, .quadratic = 1};
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
      case O_RUNS: runs = atoi(optarg); break;
      case O_MODEL: model = optarg; break;
      case O_GPTB: gptb = optarg; break;
      case O_LUT: lut = optarg; break;
      case O_SAMPLES: fo.samples = atoi(optarg); break;
      case O_TILES: fo.tiles_per_side = atoi(optarg); break;
      case O_LINEAR: fo.quadratic = 0; break;
      case O_NBR: nbr = optarg; break;
      case 'h': ds_usage(stdout); return 0;
      case O_VERSION: vs_print_version(stdout, "vspecd-startup-bench"); return 0;
      default: ds_usage(stderr); return 2;
    }
  }
  if (runs < 1 || runs > 32) {
    fprintf(stderr, "--runs: 1 to 32\n");
    return 2;
  }
  if (lut) return ds_lut_error(argv[0], lut, &fo);
  if (nbr) return ds_neighbours(argv[0], nbr);
  if (!model && !gptb) model = "models/fmnist";
  if (model && ds_bench_model(argv[0], model, model, runs)) return 1;
  if (gptb && (ds_write_gptb(gptb) ||
               ds_bench_model(argv[0], "random GPT-B / VQ-16", gptb, runs)))
    return 1;
  return 0;
}
