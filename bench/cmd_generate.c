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
#include "bench/classes.h"
#include "core/cli_args.h"
#include "core/png_meta.h"
#include "core/png_write.h"

/* The class names listed are those of the model directory named so far (the default's, or
 * --model's when it comes before --help). */
static void usage(FILE *f, const char *model_dir) {
  fprintf(f,
          "usage: vspec-bench generate [options]\n"
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

int vs_bench_cmd_generate(int argc, char **argv) {
  const char *model_dir = "models/fmnist", *method = "ar", *out_path = "out.png";
  const char *plugin_dir = NULL, *class_name = NULL;
  long class_label = 0, threads = 0, upscale = 1;
  unsigned long long seed = 0;
  int json = 0;
  /* NAN / INT_MIN mean "use the model's default". */
  double temperature = NAN, top_p = NAN, cfg = NAN;
  long top_k = -1, cfg_interval = -2;
  vs_bench_device dv = {0};
  vs_bench_mar_opts mo = VS_BENCH_MAR_OPTS_INIT;
  enum { O_TEMP = 256, O_TOPK, O_TOPP, O_CFG, O_CFGI, O_UP, O_THREADS, O_PLUGINS, O_JSON,
         O_DEVICE, O_PRECISION, O_NUM_ITER, O_CFG_SCHED };
  static const struct option opts[] = {
      {"model", required_argument, 0, 'm'},   {"class", required_argument, 0, 'c'},
      {"seed", required_argument, 0, 's'},    {"method", required_argument, 0, 'M'},
      {"out", required_argument, 0, 'o'},     {"temperature", required_argument, 0, O_TEMP},
      {"top-k", required_argument, 0, O_TOPK}, {"top-p", required_argument, 0, O_TOPP},
      {"cfg", required_argument, 0, O_CFG},   {"cfg-interval", required_argument, 0, O_CFGI},
      {"upscale", required_argument, 0, O_UP}, {"threads", required_argument, 0, O_THREADS},
      {"plugins", required_argument, 0, O_PLUGINS}, {"json", no_argument, 0, O_JSON},
      {"device", required_argument, 0, O_DEVICE}, {"precision", required_argument, 0, O_PRECISION},
      {"num-iter", required_argument, 0, O_NUM_ITER},
      {"cfg-schedule", required_argument, 0, O_CFG_SCHED},
      {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "m:c:s:M:o:h", opts, NULL)) != -1) {
    int ok = 1;
    switch (c) {
      case 'm': model_dir = optarg; break;
      case 'c': /* a number now, a name once the model is loaded */
        class_name = strspn(optarg, "0123456789") == strlen(optarg) ? NULL : optarg;
        ok = class_name || vs_cli_long("--class", optarg, 0, 1 << 30, &class_label);
        break;
      case 's': ok = vs_cli_u64("--seed", optarg, &seed); break;
      case 'M': method = optarg; break;
      case 'o': out_path = optarg; break;
      case O_TEMP: ok = vs_cli_double("--temperature", optarg, 0, 100, &temperature); break;
      case O_TOPK: ok = vs_cli_long("--top-k", optarg, 0, 1 << 30, &top_k); break;
      case O_TOPP: ok = vs_cli_double("--top-p", optarg, 1e-9, 1, &top_p); break;
      case O_CFG: ok = vs_cli_double("--cfg", optarg, 0, 100, &cfg); break;
      case O_CFGI: ok = vs_cli_long("--cfg-interval", optarg, -1, 1 << 30, &cfg_interval); break;
      case O_UP: ok = vs_cli_long("--upscale", optarg, 1, 64, &upscale); break;
      case O_THREADS: ok = vs_cli_long("--threads", optarg, 0, 1024, &threads); break;
      case O_PLUGINS: plugin_dir = optarg; break;
      case O_JSON: json = 1; break;
      case O_DEVICE: dv.spec = optarg; break;
      case O_PRECISION: ok = vs_bench_parse_precision("--precision", optarg, &dv.precision); break;
      case O_NUM_ITER: ok = vs_cli_long("--num-iter", optarg, 1, 1 << 20, &mo.num_iter); break;
      case O_CFG_SCHED:
        ok = vs_bench_parse_cfg_schedule("--cfg-schedule", optarg, &mo.cfg_schedule);
        break;
      case 'h': usage(stdout, model_dir); return 0;
      default: usage(stderr, model_dir); return 2;
    }
    if (!ok) return 2;
  }
  if (optind < argc) {
    fprintf(stderr, "vspec-bench generate: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }

  model_dir = vs_bench_model_dir(model_dir); /* an installed model when not here */
  char err[VSPEC_ERRLEN];
  vs_bench_env env;
  dv.threads = (int)threads;
  if (vs_bench_env_open(&env, argv[0], plugin_dir, &dv, err, sizeof err)) {
    fprintf(stderr, "vspec-bench generate: %s\n", err);
    return 1;
  }
  int status = 1;
  vs_models *models = NULL;
  vs_bench_grid grid = {0};
  uint8_t *rgb = NULL, *big = NULL;
  if (vs_models_open(env.reg, &env.host, env.dev, model_dir, VS_ROLE_ALL, &models, err,
                     sizeof err)) {
    fprintf(stderr, "vspec-bench generate: %s\n", err);
    goto done;
  }
  const vs_backend_model *t = &models->target;
  if (!t->info.image_h) {
    fprintf(stderr, "vspec-bench generate: model '%s' has no image decoder\n", model_dir);
    goto done;
  }
  /* size=auto, asked for or by default: the stored choice for this model and machine, so
   * that the same seed gives the same image. */
  int named_label;
  if (class_name) {
    if (!vs_bench_class_arg("generate", models, class_name, &named_label)) {
      status = 2;
      goto done;
    }
    class_label = named_label;
  }
  char spec[1100];
  if (!vs_bench_resolve_method("generate", &env, models, method, spec, sizeof spec)) goto done;
  vs_job job = {.method = spec, .class_label = (int32_t)class_label, .seed = seed,
                .sampling = models->defaults};
  if (!isnan(temperature)) job.sampling.temperature = (float)temperature;
  if (top_k >= 0) job.sampling.top_k = (int)top_k;
  if (!isnan(top_p)) job.sampling.top_p = (float)top_p;
  if (!isnan(cfg)) job.sampling.cfg_scale = (float)cfg;
  if (cfg_interval >= -1) job.sampling.cfg_interval = (int)cfg_interval;
  if (!vs_bench_apply_mar_opts("generate", models, &mo, &job.sampling)) {
    status = 2;
    goto done;
  }

  rgb = malloc((size_t)t->info.image_h * t->info.image_w * 3);
  if (!rgb || vs_bench_grid_alloc(&grid, models, err, sizeof err)) {
    fprintf(stderr, "vspec-bench generate: out of memory\n");
    goto done;
  }
  vs_metrics mt;
  if (vs_bench_generate(models, env.dev, &job, &grid, &mt, err, sizeof err)) {
    fprintf(stderr, "vspec-bench generate: %s\n", err);
    goto done;
  }
  if (vs_models_decode(models, env.dev, grid.tokens, grid.latents, rgb, err, sizeof err)) {
    fprintf(stderr, "vspec-bench generate: decode: %s\n", err);
    goto done;
  }
  vs_png_meta meta; /* the vspec and parameters chunks (core/png_meta.h) */
  int n_texts = vs_png_meta_init(&meta, &job, models, "vspec-bench");
  const char *desc = meta.describe;
  int w = t->info.image_w, h = t->info.image_h;
  const uint8_t *pixels = rgb;
  if (upscale > 1) {
    if (vs_rgb_upscale(rgb, w, h, (int)upscale, &big)) {
      fprintf(stderr, "vspec-bench generate: out of memory\n");
      goto done;
    }
    pixels = big;
    w *= (int)upscale;
    h *= (int)upscale;
  }
  if (vs_png_write_file(out_path, pixels, w, h, meta.texts, n_texts, err, sizeof err)) {
    fprintf(stderr, "vspec-bench generate: %s\n", err);
    goto done;
  }
  if (json) {
    printf("{\"out\": \"%s\", \"tokens\": %lld, \"target_forwards\": %lld, \"tpf\": %.4f, "
           "\"mal\": %.4f, \"wall_s\": %.6f, \"rounds\": %lld, \"draft_forwards\": %lld, "
           "\"accept_rate\": %.4f, \"walk_accept_rate\": %.4f, \"draft_tokens\": %lld, "
           "\"accepted\": %lld, \"residual_rounds\": %lld, \"residual_fallbacks\": %lld, "
           "\"token_kind\": \"%s\"}\n",
           out_path, (long long)mt.tokens, (long long)mt.target_forwards, vs_metrics_tpf(&mt),
           vs_metrics_mal(&mt), mt.wall_s, (long long)mt.rounds, (long long)mt.draft_forwards,
           vs_metrics_accept_rate(&mt), vs_metrics_walk_accept_rate(&mt),
           (long long)mt.draft_tokens, (long long)mt.accepted, (long long)mt.residual_rounds,
           (long long)mt.residual_fallbacks,
           vs_bench_is_continuous(models) ? "continuous" : "discrete");
  } else {
    fprintf(stderr, "wrote %s (%dx%d): %lld tokens, %lld target forwards, %.3f s [%s]\n",
            out_path, w, h, (long long)mt.tokens, (long long)mt.target_forwards, mt.wall_s, desc);
  }
  status = 0;
done:
  vs_bench_grid_free(&grid);
  free(rgb);
  free(big);
  vs_models_close(models);
  vs_bench_env_close(&env);
  return status;
}
