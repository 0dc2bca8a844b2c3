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
          "Generates one image per class with vanilla AR decoding and writes them as one PNG\n"
          "grid, enlarged with nearest-neighbour scaling.\n"
          "\n"
          "  --model DIR      model directory (default models/fmnist)\n"
          "  --out FILE       output PNG (default build/demo.png)\n"
          "  --seed S         seed of the first image; image c uses S + c (default 0)\n"
          "  --upscale K      enlargement factor (default 4)\n"
          "  --method M       decoding method (default ar)\n"
          "  --plugins DIR    plugin directory\n");
}

int vs_bench_cmd_demo(int argc, char **argv) {
  const char *model_dir = "models/fmnist", *out_path = "build/demo.png", *plugin_dir = NULL;
  const char *method = "ar";
  unsigned long long seed = 0;
  long upscale = 4;
  enum { O_UP = 256, O_PLUGINS };
  static const struct option opts[] = {
      {"model", required_argument, 0, 'm'}, {"out", required_argument, 0, 'o'},
      {"seed", required_argument, 0, 's'},  {"upscale", required_argument, 0, O_UP},
      {"method", required_argument, 0, 'M'}, {"plugins", required_argument, 0, O_PLUGINS},
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
      case 'h': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
    if (!ok) return 2;
  }
  char err[VSPEC_ERRLEN];
  vs_bench_env env;
  if (vs_bench_env_open(&env, argv[0], plugin_dir, NULL, err, sizeof err)) {
    fprintf(stderr, "vspec-bench demo: %s\n", err);
    return 1;
  }
  int status = 1;
  vs_models *models = NULL;
  int32_t *tokens = NULL;
  uint8_t *grid = NULL, *rgb = NULL, *big = NULL;
  if (vs_models_open(env.reg, &env.host, env.dev, model_dir, VS_ROLE_TARGET, &models, err,
                     sizeof err)) {
    fprintf(stderr, "vspec-bench demo: %s\n", err);
    goto done;
  }
  const vs_backend_model *t = &models->target;
  int classes = t->info.num_classes;
  if (classes <= 0 || !t->info.image_h) {
    fprintf(stderr, "vspec-bench demo: '%s' is not a class-conditional model with a decoder\n",
            model_dir);
    goto done;
  }
  int h = t->info.image_h, w = t->info.image_w, n = t->info.grid_h * t->info.grid_w;
  int cols = classes < 5 ? classes : 5, rows = (classes + cols - 1) / cols, gap = 2;
  int gw = cols * w + (cols + 1) * gap, gh = rows * h + (rows + 1) * gap;
  tokens = malloc((size_t)n * sizeof *tokens);
  rgb = malloc((size_t)h * w * 3);
  grid = malloc((size_t)gw * gh * 3);
  if (!tokens || !rgb || !grid) {
    fprintf(stderr, "vspec-bench demo: out of memory\n");
    goto done;
  }
  memset(grid, 255, (size_t)gw * gh * 3);
  double total = 0;
  for (int k = 0; k < classes; k++) {
    vs_job job = {.method = method, .class_label = k, .seed = seed + (uint64_t)k,
                  .sampling = models->defaults};
    vs_metrics mt;
    if (vs_generate(models, env.dev, &job, tokens, &mt, err, sizeof err) ||
        t->vt->decode(t->model, env.dev, tokens, rgb, err, sizeof err)) {
      fprintf(stderr, "vspec-bench demo: class %d: %s\n", k, err);
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
  vs_job demo_job = {.method = method, .class_label = -1, .seed = seed,
                     .sampling = models->defaults};
  vs_job_describe(&demo_job, models->name, desc, sizeof desc);
  vs_png_text text[] = {{"vspec", desc}, {"Software", "vspec-bench demo"}};
  if (vs_png_write_file(out_path, big, gw * (int)upscale, gh * (int)upscale, text, 2, err,
                        sizeof err)) {
    fprintf(stderr, "vspec-bench demo: %s\n", err);
    goto done;
  }
  printf("vspec demo: %d classes of '%s' generated in %.2f s (%s)\n", classes, models->name, total,
         method);
  printf("wrote %s: one image per class, classes 0..%d left to right, top to bottom\n", out_path,
         classes - 1);
  status = 0;
done:
  free(tokens);
  free(rgb);
  free(grid);
  free(big);
  vs_models_close(models);
  vs_bench_env_close(&env);
  return status;
}
