/*
 * vspec-bench generate: one image, in-process, written as PNG.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_opts.h"
#include "bench/classes.h"
#include "core/cli_args.h"
#include "core/png_meta.h"
#include "core/png_write.h"

/* The class names listed are those of the model directory named so far (the default's, or
 * --model's when it comes before --help). */
static void cg_usage(FILE *f, const char *model_dir) {
  fprintf(f,
          "cg_usage: vspec-bench generate [options]\n"
          "\n"
          "  --model DIR         model directory (default models/fmnist); a relative DIR that\n"
          "                      is not here is taken from the installed models\n"
          "                      (PREFIX/share/vspec/DIR), as vspecd does\n"
          "  --class C           class label, or its name in the model's class_names\n"
          "                      (default 0)\n");
  vs_bench_print_classes(f, model_dir, "                      ");
  fprintf(f,
          "  --seed S            job seed (default 0); the same seed gives the same bytes\n"
          "  --method M          decoding method: ar or sd:RULE[:PARAMS][@SCHED[:PARAMS]]\n"
          "                      (default ar); a rule named without a size (depth,\n"
          "                      total_tokens, tree) gets size=auto: the drafter, shape and\n"
          "                      size tuned for this model and machine (or AR, for an exact\n"
          "                      rule where no drafter pays), from the cache\n"
          "  --out FILE          output PNG (default out.png)\n"
          "  --temperature T     sampling temperature, 0 = greedy (default: the model's)\n"
          "  --top-k K           top-k filter, 0 = off (default: the model's)\n"
          "  --top-p P           top-p filter, 1 = off (default: the model's)\n"
          "  --cfg S             classifier-free guidance scale, <= 1 = off (default: the model's)\n"
          "  --cfg-interval I    guide only decode steps <= I, -1 = always (default: the model's)\n"
          "  --num-iter N        continuous-token (MAR) models: generation steps, 1..tokens\n"
          "                      (default: the model's); an error on a discrete model\n"
          "  --cfg-schedule S    continuous-token (MAR) models: CFG scale over the steps,\n"
          "                      linear (MAR's) or constant (default: the model's)\n"
          "  --upscale K         enlarge the PNG K times, nearest neighbour (default 1)\n"
          "  --threads N         compute threads (default: all cores)\n"
          "  --device D          cpu (default), cuda or cuda:N\n"
          "  --precision P       weights: fp32 or bf16 (bf16 is the GPU's default;\n"
          "                      on the CPU: AMX tiles, else AVX2 for decode steps)\n"
          "  --plugins DIR       plugin directory (default: plugins/ next to this program)\n"
          "  --json              print the job's metrics as JSON on stdout\n");
}

/* generate's options: the shared ones (bench/bench_opts.h) and its own. */
typedef struct gen_args {
  vs_bench_opts o;
  const char *out_path, *class_name; /* class_name: a class given by name */
  long class_label, upscale;
  int json;
} gen_args;

/* -1 to go on, else the exit code (--help, a bad option). */
static int gen_parse(int argc, char **argv, gen_args *a) {
  *a = (gen_args){.out_path = "out.png", .upscale = 1};
  vs_bench_opts_init(&a->o, "models/fmnist");
  enum { O_UP = 256, O_JSON };
  static const struct option opts[] = {
      VS_BENCH_OPT_MODEL,                      {"class", required_argument, 0, 'c'},
      VS_BENCH_OPT_SEED,                       VS_BENCH_OPT_METHOD,
      {"out", required_argument, 0, 'o'},      VS_BENCH_OPTS_GUIDANCE,
      VS_BENCH_OPTS_FILTERS,                   {"upscale", required_argument, 0, O_UP},
      VS_BENCH_OPTS_DEVICE,                    VS_BENCH_OPT_PLUGINS,
      {"json", no_argument, 0, O_JSON},        VS_BENCH_OPTS_MAR,
      {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "m:c:s:M:o:h", opts, NULL)) != -1) {
    int ok = 1;
    switch (c) {
      case 'c': /* a number now, a name once the model is loaded */
        a->class_name = strspn(optarg, "0123456789") == strlen(optarg) ? NULL : optarg;
        ok = a->class_name || vs_cli_long("--class", optarg, 0, 1 << 30, &a->class_label);
        break;
      case 'o': a->out_path = optarg; break;
      case O_UP: ok = vs_cli_long("--upscale", optarg, 1, 64, &a->upscale); break;
      case O_JSON: a->json = 1; break;
      case 'h': cg_usage(stdout, a->o.model_dir); return 0;
      default:
        ok = vs_bench_opt(&a->o, c, optarg);
        if (ok < 0) {
          cg_usage(stderr, a->o.model_dir);
          return 2;
        }
    }
    if (!ok) return 2;
  }
  if (!vs_bench_no_operands("generate", argc, argv)) return 2;
  a->o.model_dir = vs_bench_model_dir(a->o.model_dir); /* an installed model when not here */
  return -1;
}

/* The job: its class (a name looked up in the model), the method resolved (size=auto, asked
 * for or by default: the stored choice for this model and machine, so that the same seed
 * gives the same image) and the sampling. 0 or an exit code. */
static int gen_job(gen_args *a, vs_bench_env *env, vs_models *models, vs_method *run,
                   vs_job *job) {
  int named_label;
  if (a->class_name) {
    if (!vs_bench_class_arg("generate", models, a->class_name, &named_label)) return 2;
    a->class_label = named_label;
  }
  if (!vs_bench_resolve_method("generate", env, models, a->o.method, run)) return 1;
  *job = (vs_job){.method = run, .class_label = (int32_t)a->class_label, .seed = a->o.seed};
  return vs_bench_opts_sampling("generate", &a->o, models, &job->sampling) ? 0 : 2;
}

/* The image as a PNG with the job's description, enlarged --upscale times. */
static int gen_write(const gen_args *a, const vs_job *job, const vs_models *models,
                     const uint8_t *rgb, vs_png_meta *meta, int *w, int *h) {
  char err[VSPEC_ERRLEN];
  uint8_t *big = NULL;
  int n_texts = vs_png_meta_init(meta, job, models, "vspec-bench");
  const uint8_t *pixels = rgb;
  if (a->upscale > 1) {
    if (vs_rgb_upscale(rgb, *w, *h, (int)a->upscale, &big)) {
      fprintf(stderr, "vspec-bench generate: out of memory\n");
      return 1;
    }
    pixels = big;
    *w *= (int)a->upscale;
    *h *= (int)a->upscale;
  }
  int rc = vs_png_write_file(a->out_path, pixels, *w, *h, meta->texts, n_texts, err, sizeof err);
  free(big);
  if (rc) fprintf(stderr, "vspec-bench generate: %s\n", err);
  return rc ? 1 : 0;
}

static void gen_print(const gen_args *a, const vs_metrics *mt, const vs_models *models, int w,
                      int h, const char *desc) {
  if (a->json) {
    printf("{\"out\": \"%s\", \"tokens\": %lld, \"target_forwards\": %lld, \"tpf\": %.4f, "
           "\"mal\": %.4f, \"wall_s\": %.6f, \"rounds\": %lld, \"draft_forwards\": %lld, "
           "\"accept_rate\": %.4f, \"walk_accept_rate\": %.4f, \"draft_tokens\": %lld, "
           "\"accepted\": %lld, \"residual_rounds\": %lld, \"residual_fallbacks\": %lld, "
           "\"token_kind\": \"%s\"}\n",
           a->out_path, (long long)mt->tokens, (long long)mt->target_forwards,
           vs_metrics_tpf(mt), vs_metrics_mal(mt), mt->wall_s, (long long)mt->rounds,
           (long long)mt->draft_forwards, vs_metrics_accept_rate(mt),
           vs_metrics_walk_accept_rate(mt), (long long)mt->draft_tokens,
           (long long)mt->accepted, (long long)mt->residual_rounds,
           (long long)mt->residual_fallbacks,
           vs_bench_is_continuous(models) ? "continuous" : "discrete");
  } else {
    fprintf(stderr, "wrote %s (%dx%d): %lld tokens, %lld target forwards, %.3f s [%s]\n",
            a->out_path, w, h, (long long)mt->tokens, (long long)mt->target_forwards,
            mt->wall_s, desc);
  }
}

/* Generates, decodes, writes and reports the image. 0 or an exit code. */
static int gen_run(gen_args *a, vs_bench_env *env, vs_models *models) {
  char err[VSPEC_ERRLEN];
  vs_method run; /* the job's method, size=auto resolved */
  const vs_backend_model *t = &models->target;
  if (!t->info.image_h) {
    fprintf(stderr, "vspec-bench generate: model '%s' has no image decoder\n", a->o.model_dir);
    return 1;
  }
  vs_job job;
  int status = gen_job(a, env, models, &run, &job);
  if (status) return status;
  vs_bench_grid grid = {0};
  uint8_t *rgb = malloc((size_t)t->info.image_h * t->info.image_w * 3);
  vs_metrics mt;
  vs_png_meta meta; /* the vspec and parameters chunks (core/png_meta.h) */
  int w = t->info.image_w, h = t->info.image_h;
  status = 1;
  if (!rgb || vs_bench_grid_alloc(&grid, models, err, sizeof err))
    fprintf(stderr, "vspec-bench generate: out of memory\n");
  else if (vs_bench_generate(models, env->dev, &job, &grid, &mt, err, sizeof err))
    fprintf(stderr, "vspec-bench generate: %s\n", err);
  else if (vs_models_decode(models, env->dev, grid.tokens, grid.latents, rgb, err, sizeof err))
    fprintf(stderr, "vspec-bench generate: decode: %s\n", err);
  else if (!gen_write(a, &job, models, rgb, &meta, &w, &h)) {
    gen_print(a, &mt, models, w, h, meta.describe);
    status = 0;
  }
  vs_bench_grid_free(&grid);
  free(rgb);
  return status;
}

int vs_bench_cmd_generate(int argc, char **argv) {
  gen_args a;
  int status = gen_parse(argc, argv, &a);
  if (status >= 0) return status;
  char err[VSPEC_ERRLEN];
  vs_bench_env env;
  if (!vs_bench_opts_env("generate", &a.o, argv[0], &env)) return 1;
  vs_models *models = NULL;
  if (vs_models_open(env.reg, &env.host, env.dev, a.o.model_dir, VS_ROLE_ALL, &models, err,
                     sizeof err)) {
    fprintf(stderr, "vspec-bench generate: %s\n", err);
    status = 1;
  } else {
    status = gen_run(&a, &env, models);
  }
  vs_models_close(models);
  vs_bench_env_close(&env);
  return status;
}
