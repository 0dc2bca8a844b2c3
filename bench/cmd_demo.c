/*
 * vspec-bench demo: one image per class in a grid, enlarged so a person can see it.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/cli_args.h"
#include "core/png_write.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: vspec-bench demo [options]\n"
          "\n"
          "Generates one image per class (vanilla AR decoding unless --method says otherwise)\n"
          "and writes them as one PNG grid, enlarged with nearest-neighbour scaling.\n"
          "\n"
          "  --model DIR      model directory (default models/fmnist)\n"
          "  --out FILE       output PNG (default build/demo.png)\n"
          "  --seed S         seed of the first image; image c uses S + c (default 0)\n"
          "  --upscale K      enlargement factor (default 4)\n"
          "  --per-class N    N images per class: one column per class, N rows; image\n"
          "                   (row r, class c) uses seed S + r * classes + c (default 1:\n"
          "                   the classes in rows of 5)\n"
          "  --method M       decoding method (default ar)\n"
          "  --num-iter N     continuous-token (MAR) models: generation steps, 1..tokens\n"
          "                   (default: the model's); an error on a discrete model\n"
          "  --cfg-schedule S continuous-token (MAR) models: CFG scale over the steps,\n"
          "                   linear (MAR's) or constant (default: the model's)\n"
          "  --plugins DIR    plugin directory\n");
}

int vs_bench_cmd_demo(int argc, char **argv) {
  const char *model_dir = "models/fmnist", *out_path = "build/demo.png", *plugin_dir = NULL;
  const char *method = "ar";
  unsigned long long seed = 0;
  long upscale = 4, per_class = 1;
  vs_bench_mar_opts mo = VS_BENCH_MAR_OPTS_INIT;
  enum { O_UP = 256, O_PLUGINS, O_NUM_ITER, O_CFG_SCHED, O_PER_CLASS };
  static const struct option opts[] = {
      {"model", required_argument, 0, 'm'}, {"out", required_argument, 0, 'o'},
      {"seed", required_argument, 0, 's'},  {"upscale", required_argument, 0, O_UP},
      {"method", required_argument, 0, 'M'}, {"plugins", required_argument, 0, O_PLUGINS},
      {"num-iter", required_argument, 0, O_NUM_ITER},
      {"cfg-schedule", required_argument, 0, O_CFG_SCHED},
      {"per-class", required_argument, 0, O_PER_CLASS},
      {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "m:o:s:M:h", opts, NULL)) != -1) {
    int ok = 1;
    switch (c) {
      case 'm': model_dir = optarg; break;
      case 'o': out_path = optarg; break;
      case 's': ok = vs_cli_u64("--seed", optarg, &seed); break;
      case 'M': method = optarg; break;
      case O_UP: ok = vs_cli_long("--upscale", optarg, 1, 64, &upscale); break;
      case O_PLUGINS: plugin_dir = optarg; break;
      case O_PER_CLASS: ok = vs_cli_long("--per-class", optarg, 1, 100, &per_class); break;
      case O_NUM_ITER: ok = vs_cli_long("--num-iter", optarg, 1, 1 << 20, &mo.num_iter); break;
      case O_CFG_SCHED:
        ok = vs_bench_parse_cfg_schedule("--cfg-schedule", optarg, &mo.cfg_schedule);
        break;
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
    if (!ok) return 2;
  }
  model_dir = vs_bench_model_dir(model_dir); /* an installed model when not here */
  char err[VSPEC_ERRLEN];
  vs_bench_env env;
  if (vs_bench_env_open(&env, argv[0], plugin_dir, NULL, err, sizeof err)) {
    fprintf(stderr, "vspec-bench demo: %s\n", err);
    return 1;
  }
  int status = 1;
  vs_models *models = NULL;
  vs_bench_grid out = {0};
  uint8_t *grid = NULL, *rgb = NULL, *big = NULL;
  /* a speculative method needs the drafters; plain AR loads the target alone */
  unsigned roles = strcmp(method, "ar") == 0 ? VS_ROLE_TARGET : VS_ROLE_ALL;
  if (vs_models_open(env.reg, &env.host, env.dev, model_dir, roles, &models, err, sizeof err)) {
    fprintf(stderr, "vspec-bench demo: %s\n", err);
    goto done;
  }
  char spec[1100];
  if (!vs_bench_resolve_method("demo", &env, models, method, spec, sizeof spec)) goto done;
  const vs_backend_model *t = &models->target;
  int classes = t->info.num_classes;
  if (classes <= 0 || !t->info.image_h) {
    fprintf(stderr, "vspec-bench demo: '%s' is not a class-conditional model with a decoder\n",
            model_dir);
    goto done;
  }
  vs_sampling sampling = models->defaults;
  if (!vs_bench_apply_mar_opts("demo", models, &mo, &sampling)) {
    status = 2;
    goto done;
  }
  int h = t->info.image_h, w = t->info.image_w;
  /* one image per class: rows of 5; several: a column per class, a row per sample */
  int n_images = classes * (int)per_class;
  int cols = per_class > 1 ? classes : classes < 5 ? classes : 5;
  int rows = (n_images + cols - 1) / cols, gap = 2;
  int gw = cols * w + (cols + 1) * gap, gh = rows * h + (rows + 1) * gap;
  rgb = malloc((size_t)h * w * 3);
  grid = malloc((size_t)gw * gh * 3);
  if (!rgb || !grid || vs_bench_grid_alloc(&out, models, err, sizeof err)) {
    fprintf(stderr, "vspec-bench demo: out of memory\n");
    goto done;
  }
  memset(grid, 255, (size_t)gw * gh * 3);
  double total = 0;
  for (int k = 0; k < n_images; k++) {
    vs_job job = {.method = spec, .class_label = k % classes, .seed = seed + (uint64_t)k,
                  .sampling = sampling};
    vs_metrics mt;
    if (vs_bench_generate(models, env.dev, &job, &out, &mt, err, sizeof err) ||
        vs_models_decode(models, env.dev, out.tokens, out.latents, rgb, err, sizeof err)) {
      fprintf(stderr, "vspec-bench demo: class %d: %s\n", k % classes, err);
      goto done;
    }
    total += mt.wall_s;
    int x0 = gap + (k % cols) * (w + gap), y0 = gap + (k / cols) * (h + gap);
    for (int y = 0; y < h; y++)
      memcpy(grid + ((size_t)(y0 + y) * gw + x0) * 3, rgb + (size_t)y * w * 3, (size_t)w * 3);
  }
  if (vs_rgb_upscale(grid, gw, gh, (int)upscale, &big)) {
    fprintf(stderr, "vspec-bench demo: out of memory\n");
    goto done;
  }
  char desc[512];
  /* latents set: the description names a MAR job's steps and CFG schedule */
  vs_job demo_job = {.method = spec, .class_label = -1, .seed = seed, .sampling = sampling,
                     .latents = out.latents};
  vs_job_describe(&demo_job, models->name, desc, sizeof desc);
  vs_png_text text[] = {{"vspec", desc}, {"Software", "vspec-bench demo"}};
  if (vs_png_write_file(out_path, big, gw * (int)upscale, gh * (int)upscale, text, 2, err,
                        sizeof err)) {
    fprintf(stderr, "vspec-bench demo: %s\n", err);
    goto done;
  }
  printf("vspec demo: %d images of '%s' generated in %.2f s (%s)\n", n_images, models->name,
         total, spec);
  if (per_class > 1)
    printf("wrote %s: %ld images per class, one column per class (0..%d left to right)\n",
           out_path, per_class, classes - 1);
  else
    printf("wrote %s: one image per class, classes 0..%d left to right, top to bottom\n",
           out_path, classes - 1);
  status = 0;
done:
  vs_bench_grid_free(&out);
  free(rgb);
  free(grid);
  free(big);
  vs_models_close(models);
  vs_bench_env_close(&env);
  return status;
}
