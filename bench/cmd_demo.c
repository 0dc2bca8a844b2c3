/*
 * vspec-bench demo: one image per class in a grid, enlarged so a person can see it, each
 * class labelled with its number and its name (vspec-model.json "class_names").
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_opts.h"
#include "bench/bitmap_font.h"
#include "core/cli_args.h"
#include "core/png_write.h"

static void cd_usage(FILE *f) {
  fprintf(f,
          "cd_usage: vspec-bench demo [options]\n"
          "\n"
          "Generates one image per class (vanilla AR decoding unless --method says otherwise)\n"
          "and writes them as one PNG grid, enlarged with nearest-neighbour scaling, each\n"
          "class labelled with its number and name.\n"
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
          "  --plugins DIR    plugin directory\n"
          "  --quiet          no progress lines on stderr (one per image, with the time\n"
          "                   elapsed and an estimate of what is left)\n");
}

/* "12.3 s", "3 min 40 s", "1 h 05 min": durations a person reads at a glance. */
static void cd_demo_duration(char *out, size_t cap, double s) {
  if (s < 60) snprintf(out, cap, "%.1f s", s);
  else if (s < 3600) snprintf(out, cap, "%d min %02d s", (int)(s / 60), (int)s % 60);
  else snprintf(out, cap, "%d h %02d min", (int)(s / 3600), (int)(s / 60) % 60);
}

/* One line per image on stderr: a MAR demo takes minutes (4 for models/fmnist-mar with
 * --per-class 4 on 2 cores), and a silent terminal looks hung. What is left is estimated
 * from the mean time of the images so far. */
static void cd_demo_progress(const vs_models *m, int k, int n_images, int label,
                              double image_s, double elapsed_s) {
  const char *name = vs_models_class_name(m, label);
  char took[32], el[32], left[32];
  cd_demo_duration(took, sizeof took, image_s);
  cd_demo_duration(el, sizeof el, elapsed_s);
  if (k + 1 < n_images)
    cd_demo_duration(left, sizeof left, elapsed_s / (k + 1) * (n_images - k - 1));
  fprintf(stderr, "vspec-bench demo: image %d/%d (class %d%s%s) in %s; %s elapsed, %s%s%s\n",
          k + 1, n_images, label, name ? " " : "", name ? name : "", took, el,
          k + 1 < n_images ? "about " : "done", k + 1 < n_images ? left : "",
          k + 1 < n_images ? " left" : "");
}

/* Where the demo's images and labels go: each image K times its size, 2K pixels apart, with
 * a band of label text above every row (one image per class: rows of 5, each image
 * labelled) or above the first row only (--per-class N: a column per class). */
typedef struct vs__demo_layout {
  int cols, rows, cell_w, cell_h, gap;
  int band, scale;    /* label band height and text scale */
  int label_rows;     /* rows with a label band: all, or the first */
  int width, height;
} vs__demo_layout;

/* "7 Sneaker", or "7" for a model without class names, cut to `chars` characters. */
static void cd_demo_label(const vs_models *m, int c, int chars, char *out, size_t cap) {
  const char *name = vs_models_class_name(m, c);
  snprintf(out, cap, "%d%s%s", c, name ? " " : "", name ? name : "");
  if (chars >= 0 && (size_t)chars < strlen(out)) out[chars] = 0;
}

static void cd_demo_layout_make(const vs_models *m, int classes, int per_class, int k,
                                 vs__demo_layout *l) {
  const vspec_model_info *in = &m->target.info;
  int n_images = classes * per_class;
  l->cols = per_class > 1 ? classes : classes < 5 ? classes : 5;
  l->rows = (n_images + l->cols - 1) / l->cols;
  l->cell_w = in->image_w * k;
  l->cell_h = in->image_h * k;
  l->gap = 2 * k;
  /* The text scale the longest label fits a cell at, 1 to 3, and at most a quarter of
   * the image's height: labels name the images, they do not cover the page. */
  int longest = 0;
  for (int c = 0; c < classes; c++) {
    char label[96];
    cd_demo_label(m, c, -1, label, sizeof label);
    int w = vs_text_width(label, 1);
    if (w > longest) longest = w;
  }
  l->scale = 1;
  while (l->scale < 3 && longest * (l->scale + 1) <= l->cell_w &&
         vs_text_height(l->scale + 1) * 4 <= l->cell_h)
    l->scale++;
  l->band = vs_text_height(l->scale) + l->scale;
  l->label_rows = per_class > 1 ? 1 : l->rows;
  l->width = l->cols * l->cell_w + (l->cols + 1) * l->gap;
  l->height = l->rows * l->cell_h + (l->rows + 1) * l->gap + l->label_rows * l->band;
}

/* Top-left corner of image k's cell. */
static void cd_demo_cell(const vs__demo_layout *l, int k, int *x, int *y) {
  int r = k / l->cols, c = k % l->cols;
  *x = l->gap + c * (l->cell_w + l->gap);
  *y = l->gap + r * (l->cell_h + l->gap) + (l->label_rows > 1 ? r + 1 : 1) * l->band;
}

/* Image k (already enlarged to a cell) into the grid, with its label above it where the
 * layout has one: every image of a labelled row, or the first row's columns. */
static void cd_demo_place(const vs__demo_layout *l, const vs_canvas *grid, const vs_models *m,
                           int k, int classes, const uint8_t *cell) {
  int x, y;
  cd_demo_cell(l, k, &x, &y);
  for (int row = 0; row < l->cell_h; row++)
    memcpy(grid->rgb + ((size_t)(y + row) * grid->width + x) * 3,
           cell + (size_t)row * l->cell_w * 3, (size_t)l->cell_w * 3);
  if (l->label_rows == 1 && k >= l->cols) return;
  static const uint8_t ink[3] = {0, 0, 0};
  char label[96];
  int chars = (l->cell_w + l->scale) / (VS_FONT_CELL_W * l->scale);
  cd_demo_label(m, k % classes, chars, label, sizeof label);
  vs_draw_text(grid, x, y - l->band, label, ink, l->scale);
}

/* demo's options: the shared ones (bench/bench_opts.h) and its own. */
typedef struct demo_args {
  vs_bench_opts o;
  const char *out_path;
  long upscale, per_class;
  int quiet;
} demo_args;

/* -1 to go on, else the exit code (--help, a bad option). */
static int demo_parse(int argc, char **argv, demo_args *a) {
  *a = (demo_args){.out_path = "build/demo.png", .upscale = 4, .per_class = 1};
  vs_bench_opts_init(&a->o, "models/fmnist");
  enum { O_UP = 256, O_PER_CLASS, O_QUIET };
  static const struct option opts[] = {
      VS_BENCH_OPT_MODEL,                   {"out", required_argument, 0, 'o'},
      VS_BENCH_OPT_SEED,                    {"upscale", required_argument, 0, O_UP},
      VS_BENCH_OPT_METHOD,                  VS_BENCH_OPT_PLUGINS,
      VS_BENCH_OPTS_MAR,
      {"per-class", required_argument, 0, O_PER_CLASS}, {"quiet", no_argument, 0, O_QUIET},
      {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "m:o:s:M:h", opts, NULL)) != -1) {
    int ok = 1;
    switch (c) {
      case 'o': a->out_path = optarg; break;
      case O_UP: ok = vs_cli_long("--upscale", optarg, 1, 64, &a->upscale); break;
      case O_PER_CLASS: ok = vs_cli_long("--per-class", optarg, 1, 100, &a->per_class); break;
      case O_QUIET: a->quiet = 1; break;
      case 'h': cd_usage(stdout); return 0;
      default:
        ok = vs_bench_opt(&a->o, c, optarg);
        if (ok < 0) {
          cd_usage(stderr);
          return 2;
        }
    }
    if (!ok) return 2;
  }
  a->o.model_dir = vs_bench_model_dir(a->o.model_dir); /* an installed model when not here */
  return -1;
}

/* One run: the models, the method and the page being drawn. */
typedef struct demo_run {
  const demo_args *a;
  vs_bench_env env;
  vs_models *models;
  vs_method run; /* the method, size=auto resolved */
  vs_sampling sampling;
  int classes, n_images;
  vs__demo_layout lay;
  vs_bench_grid out;
  uint8_t *grid, *rgb, *big;
  double total; /* generation seconds */
  char err[VSPEC_ERRLEN];
} demo_run;

/* The models (the target alone for plain AR: a speculative method needs the drafters), the
 * method and the sampling. 0 or an exit code. */
static int demo_open(demo_run *r) {
  const demo_args *a = r->a;
  const char *method = a->o.method;
  unsigned roles = strcmp(method, "ar") == 0 ? VS_ROLE_TARGET : VS_ROLE_ALL;
  if (!a->quiet) fprintf(stderr, "vspec-bench demo: loading %s\n", a->o.model_dir);
  if (vs_models_open(r->env.reg, &r->env.host, r->env.dev, a->o.model_dir, roles, &r->models,
                     r->err, sizeof r->err)) {
    fprintf(stderr, "vspec-bench demo: %s\n", r->err);
    return 1;
  }
  if (!a->quiet && strcmp(method, "ar"))
    fprintf(stderr, "vspec-bench demo: preparing %s (a first size=auto tunes the draft size, "
            "once per model and machine)\n", method);
  if (!vs_bench_resolve_method("demo", &r->env, r->models, method, &r->run))
    return 1;
  const vs_backend_model *t = &r->models->target;
  r->classes = t->info.num_classes;
  if (r->classes <= 0 || !t->info.image_h) {
    fprintf(stderr, "vspec-bench demo: '%s' is not a class-conditional model with a decoder\n",
            a->o.model_dir);
    return 1;
  }
  return vs_bench_opts_sampling("demo", &a->o, r->models, &r->sampling) ? 0 : 2;
}

/* Generates every image into the page. 0 or an exit code. */
static int demo_draw(demo_run *r, double t0) {
  const demo_args *a = r->a;
  const vspec_model_info *in = &r->models->target.info;
  int h = in->image_h, w = in->image_w;
  r->n_images = r->classes * (int)a->per_class;
  cd_demo_layout_make(r->models, r->classes, (int)a->per_class, (int)a->upscale, &r->lay);
  r->rgb = malloc((size_t)h * w * 3);
  r->grid = malloc((size_t)r->lay.width * r->lay.height * 3);
  if (!r->rgb || !r->grid || vs_bench_grid_alloc(&r->out, r->models, r->err, sizeof r->err)) {
    fprintf(stderr, "vspec-bench demo: out of memory\n");
    return 1;
  }
  memset(r->grid, 255, (size_t)r->lay.width * r->lay.height * 3);
  vs_canvas canvas = {r->grid, r->lay.width, r->lay.height};
  double start = vs_bench_now();
  if (!a->quiet)
    fprintf(stderr, "vspec-bench demo: %d images of '%s' (%s), ready in %.1f s\n", r->n_images,
            r->models->name, r->run.text, start - t0);
  for (int k = 0; k < r->n_images; k++) {
    vs_job job = {.method = &r->run, .class_label = k % r->classes,
                  .seed = a->o.seed + (uint64_t)k, .sampling = r->sampling};
    vs_metrics mt;
    if (vs_bench_generate(r->models, r->env.dev, &job, &r->out, &mt, r->err, sizeof r->err) ||
        vs_models_decode(r->models, r->env.dev, r->out.tokens, r->out.latents, r->rgb, r->err,
                         sizeof r->err)) {
      fprintf(stderr, "vspec-bench demo: class %d: %s\n", k % r->classes, r->err);
      return 1;
    }
    r->total += mt.wall_s;
    free(r->big);
    r->big = NULL;
    if (vs_rgb_upscale(r->rgb, w, h, (int)a->upscale, &r->big)) {
      fprintf(stderr, "vspec-bench demo: out of memory\n");
      return 1;
    }
    cd_demo_place(&r->lay, &canvas, r->models, k, r->classes, r->big);
    if (!a->quiet)
      cd_demo_progress(r->models, k, r->n_images, k % r->classes, mt.wall_s,
                        vs_bench_now() - start);
  }
  return 0;
}

/* The page as a PNG, described as the job of its first image, and the summary. */
static int demo_write(demo_run *r) {
  const demo_args *a = r->a;
  char desc[512];
  /* latents set: the description names a MAR job's steps and CFG schedule */
  vs_job demo_job = {.method = &r->run, .class_label = -1, .seed = a->o.seed,
                     .sampling = r->sampling, .latents = r->out.latents};
  vs_job_describe(&demo_job, r->models->name, desc, sizeof desc);
  vs_png_text text[] = {{"vspec", desc}, {"Software", "vspec-bench demo"}};
  if (vs_png_write_file(a->out_path, r->grid, r->lay.width, r->lay.height, text, 2, r->err,
                        sizeof r->err)) {
    fprintf(stderr, "vspec-bench demo: %s\n", r->err);
    return 1;
  }
  printf("vspec demo: %d images of '%s' generated in %.2f s (%s)\n", r->n_images,
         r->models->name, r->total, r->run.text);
  if (a->per_class > 1)
    printf("wrote %s: %ld images per class, one labelled column per class (0..%d left to "
           "right)\n", a->out_path, a->per_class, r->classes - 1);
  else
    printf("wrote %s: one labelled image per class, classes 0..%d left to right, top to "
           "bottom\n", a->out_path, r->classes - 1);
  return 0;
}

int vs_bench_cmd_demo(int argc, char **argv) {
  demo_args a;
  int status = demo_parse(argc, argv, &a);
  if (status >= 0) return status;
  demo_run r = {.a = &a};
  if (!vs_bench_opts_env("demo", &a.o, argv[0], &r.env)) return 1;
  double t0 = vs_bench_now();
  status = demo_open(&r);
  if (!status) status = demo_draw(&r, t0);
  if (!status) status = demo_write(&r);
  vs_bench_grid_free(&r.out);
  free(r.rgb);
  free(r.grid);
  free(r.big);
  vs_models_close(r.models);
  vs_bench_env_close(&r.env);
  return status;
}
