/*
 * vspecd-bench: what the daemon costs on top of the engine.
 *
 *   1. latency of one image end to end through vspecd (submit -> result, progress streamed
 *      and acknowledged as the CLI does) against the same image in-process (generate +
 *      decode + PNG, what vspec-bench generate does), interleaved, same seeds, same threads;
 *   2. the cost of previews at the default cadence (an eighth of the image): the time the
 *      workers spent rendering them over the generation time, for lut and decode previews;
 *   3. throughput with 1, 2, 4 and 8 jobs in flight;
 *   4. with --batch B, only: cross-job batching against the daemon without it
 *      (bench/daemon_batch.c).
 *
 * It starts its own vspecd (next to this program) on private ipc endpoints, so nothing else
 * is needed; numbers are printed as a markdown table.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/daemon_batch.h"
#include "bench/daemon_jobs.h"
#include "bench/daemon_proc.h"
#include "client/conn.h"
#include "core/cli_args.h"
#include "core/png_write.h"
#include "core/version.h"

typedef struct vs__bd {
  vs_bench_daemon d;
  char model_dir[1100];
  int threads;
} vs__bd;

static double now_s(void) { return vs_bench_now(); }

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double dbench_median(double *v, int n) {
  double *c = malloc((size_t)n * sizeof *c);
  memcpy(c, v, (size_t)n * sizeof *c);
  qsort(c, (size_t)n, sizeof *c, cmp_d);
  double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
  free(c);
  return m;
}

static double pct(double *v, int n, double q) { return vs_bench_quantile(v, n, q); }

static int start_daemon(vs__bd *b, int workers) {
  char w[16], t[16], model[1200];
  snprintf(w, sizeof w, "%d", workers);
  snprintf(t, sizeof t, "%d", b->threads);
  snprintf(model, sizeof model, "bench=%s", b->model_dir);
  const char *args[] = {"--model", model, "--set", "models.fmnist=", "--default-model", "bench",
                        "--workers", w, "--threads", t, "--log-level", "warn", NULL};
  return vs_bench_daemon_start(&b->d, args, NULL);
}

static void db_usage(FILE *f) {
  fprintf(f,
          "db_usage: vspecd-bench [options]\n"
          "\n"
          "  --model-dir DIR    model (default models/fmnist if present, else\n"
          "                     tests/golden/micro_c2i)\n"
          "  --synthetic L,D,G  a random-weight GPT with L layers, width D and a GxG grid over the\n"
          "                     micro model's VQ decoder, for a heavier per-image cost\n"
          "  --gpt-b            a random-weight LlamaGen GPT-B (12 layers, width 768, 16x16 tokens\n"
          "                     of a 16384-entry codebook) and VQ-16 decoder\n"
          "  --method M         decoding method (default ar)\n"
          "  --images N         images per latency/preview measurement (default 20)\n"
          "  --threads T        compute threads, in-process and per daemon worker (default 1)\n"
          "  --workers W        daemon workers for the throughput runs (default: online cores)\n"
          "  --jobs K           jobs per throughput level (default 16)\n"
          "  --batch B          instead of 1-3: throughput with [workers] batch = B and B jobs in\n"
          "                     flight against one job alone and against a worker per core\n"
          "                     (three daemons, interleaved rounds)\n"
          "  --rounds R         rounds of --batch (default 5)\n"
          "  --precision P      with --batch: the daemons' [device] precision (fp32, bf16)\n"
          "  --lanes L          with --batch: [workers] batch_lanes (batches at once, default\n"
          "                     1); B x L jobs in flight\n"
          "  --device D         with --batch: the daemons' device, cpu (default) or cuda[:N]; on\n"
          "                     a GPU the unbatched daemon has B x L workers (a stream each)\n"
          "  --no-progress      submit jobs without progress events\n"
          "  --version          version and plugin ABI\n");
}

/* vspecd-bench's options. */
typedef struct bd_args {
  long images, workers, jobs, threads, batch, rounds, lanes;
  const char *precision, *model_dir, *method, *synthetic, *device;
  int gpt_b;
} bd_args;

/* -1 to go on, else the exit code (--help, --version, a bad option). */
static int bd_parse(int argc, char **argv, bd_args *a) {
  *a = (bd_args){.images = 20, .workers = sysconf(_SC_NPROCESSORS_ONLN), .jobs = 16,
                 .threads = 1, .rounds = 5, .lanes = 1, .method = "ar"};
  enum {
    O_MODEL = 256, O_SYN, O_METHOD, O_IMAGES, O_THREADS, O_WORKERS, O_JOBS, O_NOPROG, O_BATCH,
    O_ROUNDS, O_PRECISION, O_LANES, O_VERSION, O_GPTB, O_DEVICE
  };
  static const struct option opts[] = {
      {"model-dir", required_argument, 0, O_MODEL}, {"synthetic", required_argument, 0, O_SYN},
      {"method", required_argument, 0, O_METHOD},   {"images", required_argument, 0, O_IMAGES},
      {"threads", required_argument, 0, O_THREADS}, {"workers", required_argument, 0, O_WORKERS},
      {"jobs", required_argument, 0, O_JOBS},       {"no-progress", no_argument, 0, O_NOPROG},
      {"batch", required_argument, 0, O_BATCH},     {"rounds", required_argument, 0, O_ROUNDS},
      {"precision", required_argument, 0, O_PRECISION}, {"lanes", required_argument, 0, O_LANES},
      {"gpt-b", no_argument, 0, O_GPTB},            {"device", required_argument, 0, O_DEVICE},
      {"help", no_argument, 0, 'h'},                {"version", no_argument, 0, O_VERSION},
      {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    int ok = 1;
    switch (c) {
      case O_MODEL: a->model_dir = optarg; break;
      case O_SYN: a->synthetic = optarg; break;
      case O_METHOD: a->method = optarg; break;
      case O_IMAGES: ok = vs_cli_long("--images", optarg, 2, 100000, &a->images); break;
      case O_THREADS: ok = vs_cli_long("--threads", optarg, 1, 256, &a->threads); break;
      case O_WORKERS: ok = vs_cli_long("--workers", optarg, 1, 256, &a->workers); break;
      case O_JOBS: ok = vs_cli_long("--jobs", optarg, 1, 100000, &a->jobs); break;
      case O_NOPROG: vs_bench_jobs_no_progress = 1; break;
      case O_BATCH: ok = vs_cli_long("--batch", optarg, 2, 64, &a->batch); break;
      case O_ROUNDS: ok = vs_cli_long("--rounds", optarg, 1, 64, &a->rounds); break;
      case O_PRECISION: a->precision = optarg; break;
      case O_LANES: ok = vs_cli_long("--lanes", optarg, 1, 16, &a->lanes); break;
      case O_GPTB: a->gpt_b = 1; break;
      case O_DEVICE: a->device = optarg; break;
      case 'h': db_usage(stdout); return 0;
      case O_VERSION: vs_print_version(stdout, "vspecd-bench"); return 0;
      default: db_usage(stderr); return 2;
    }
    if (!ok) return 2;
  }
  return -1;
}

/* --synthetic L,D,G: a random-weight GPT over the micro model's VQ decoder, in the daemon's
 * scratch directory. 0 or an exit code. */
static int bd_synthetic(vs__bd *b, const char *synthetic, const char *cwd, const char **label) {
  char err[VSPEC_ERRLEN];
  int L, D, G;
  if (sscanf(synthetic, "%d,%d,%d", &L, &D, &G) != 3 || L < 1 || D < 16 || G < 2 || G > 64) {
    fprintf(stderr, "--synthetic: expected L,D,G\n");
    return 2;
  }
  snprintf(b->model_dir, sizeof b->model_dir, "%s/synthetic", b->d.tmp);
  mkdir(b->model_dir, 0755);
  char gpt[1200], vq[1200], src[1200];
  snprintf(gpt, sizeof gpt, "%s/gpt.safetensors", b->model_dir);
  snprintf(vq, sizeof vq, "%s/vq.safetensors", b->model_dir);
  snprintf(src, sizeof src, "%s/tests/golden/micro_c2i/vq.safetensors", cwd);
  int heads = D / 64 > 0 ? D / 64 : 1;
  if (vs_bench_write_random_gpt(gpt, L, D, heads, heads, 64, G, 10, 1, err, sizeof err) ||
      symlink(src, vq)) {
    fprintf(stderr, "vspecd-bench: %s\n", err);
    return 1;
  }
  static char lab[128];
  snprintf(lab, sizeof lab, "synthetic GPT (random weights, %d layers, width %d, %dx%d tokens, "
           "micro VQ decoder)", L, D, G, G);
  *label = lab;
  return 0;
}

/* --gpt-b: LlamaGen GPT-B over 16x16 tokens of a 16384 x 8 codebook and VQ-16's decoder
 * (ch 128, ch_mult 1,1,2,2,4, z 256, 256 x 256 pixels), random weights, in the daemon's
 * scratch directory: the shape of the concurrency goal. 0 or an exit code. */
static int bd_gptb(vs__bd *b, const char **label) {
  char gpt[1200], vq[1200], err[VSPEC_ERRLEN];
  snprintf(b->model_dir, sizeof b->model_dir, "%s/gpt-b", b->d.tmp);
  mkdir(b->model_dir, 0755);
  snprintf(gpt, sizeof gpt, "%s/gpt.safetensors", b->model_dir);
  snprintf(vq, sizeof vq, "%s/vq.safetensors", b->model_dir);
  static const int mult[] = {1, 1, 2, 2, 4};
  if (vs_bench_write_random_gpt(gpt, 12, 768, 12, 12, 16384, 16, 1000, 1, err, sizeof err) ||
      vs_bench_write_random_vq(vq, 16384, 8, 128, mult, 5, 256, 256, 2, err, sizeof err)) {
    fprintf(stderr, "vspecd-bench: %s\n", err);
    return 1;
  }
  *label = "GPT-B (random weights, 12 layers, width 768, 16x16 tokens of 16384, VQ-16 decoder)";
  return 0;
}

/* The model the daemon and the in-process side load, as an absolute path in b->model_dir,
 * and its name in the tables. 0 or an exit code. */
static int bd_model(vs__bd *b, const bd_args *a, const char **label) {
  char cwd[900];
  if (!getcwd(cwd, sizeof cwd)) return 1;
  if (a->gpt_b) return bd_gptb(b, label);
  if (a->synthetic) return bd_synthetic(b, a->synthetic, cwd, label);
  struct stat sb;
  const char *model_dir = a->model_dir;
  if (!model_dir) model_dir = stat("models/fmnist", &sb) == 0 ? "models/fmnist"
                                                              : "tests/golden/micro_c2i";
  snprintf(b->model_dir, sizeof b->model_dir, "%s%s%s", model_dir[0] == '/' ? "" : cwd,
           model_dir[0] == '/' ? "" : "/", model_dir);
  *label = model_dir;
  return 0;
}

/* --batch: cross-job batching against the daemon without it (bench/daemon_batch.c). */
static int bd_batch(vs__bd *b, const bd_args *a, const char *label) {
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  printf("## vspecd benchmark\n\nmodel: %s; method %s\n\n", label, a->method);
  vs_batch_bench_opts bo = {.prog = "vspecd-bench", .model_dir = b->model_dir,
                            .method = a->method, .batch = (int)a->batch, .jobs = (int)a->jobs,
                            .rounds = (int)a->rounds, .cores = cores > 0 ? (int)cores : 1,
                            .precision = a->precision, .lanes = (int)a->lanes,
                            .device = a->device};
  int status = vs_daemon_batch_bench(&bo);
  if (vs_bench_daemon_cleanup(&b->d)) status = 1;
  return status;
}

/* Sections 1-3: the in-process side, the daemon and what they measured. */
typedef struct bd_run {
  vs__bd *b;
  const bd_args *a;
  vs_bench_env env;
  vs_models *models;
  vs_bench_grid grid;
  uint8_t *rgb;
  double *inproc, *daemon, *service, *paired;
  vs_bench_jobres *res;
  vs_conn conn;
  int have_conn;
  int N; /* tokens per image */
  vs_method method; /* the in-process side's, parsed once */
  char err[VSPEC_ERRLEN];
} bd_run;

/* The in-process side: the models and the buffers. 1 or 0 (printed). */
static int bd_open(bd_run *r, const char *argv0) {
  vs_bench_device dv = {.threads = r->b->threads};
  if (vs_bench_env_open(&r->env, argv0, r->b->d.plugins, &dv, r->err, sizeof r->err)) {
    fprintf(stderr, "vspecd-bench: %s\n", r->err);
    return 0;
  }
  if (vs_method_parse(r->a->method, &r->method, r->err, sizeof r->err)) {
    fprintf(stderr, "vspecd-bench: --method: %s\n", r->err);
    vs_bench_env_close(&r->env);
    return 0;
  }
  if (vs_models_open(r->env.reg, &r->env.host, r->env.dev, r->b->model_dir, VS_ROLE_ALL,
                     &r->models, r->err, sizeof r->err) ||
      vs_bench_grid_alloc(&r->grid, r->models, r->err, sizeof r->err)) {
    fprintf(stderr, "vspecd-bench: %s\n", r->err);
    vs_models_close(r->models);
    vs_bench_env_close(&r->env);
    return 0;
  }
  const vspec_model_info *in = &r->models->target.info;
  long images = r->a->images, jobs = r->a->jobs;
  r->N = in->grid_h * in->grid_w;
  r->rgb = malloc((size_t)in->image_h * in->image_w * 3);
  r->inproc = calloc((size_t)images, sizeof(double));
  r->daemon = calloc((size_t)images, sizeof(double));
  r->service = calloc((size_t)images, sizeof(double));
  r->paired = calloc((size_t)images, sizeof(double));
  r->res = calloc((size_t)(images > jobs ? images : jobs) * 3, sizeof *r->res);
  return 1;
}

/* Image i in-process, exactly as vspec-bench generate: generate, decode, PNG. */
static int bd_inproc_image(bd_run *r, int i) {
  const vspec_model_info *in = &r->models->target.info;
  vs_job job = {.method = &r->method, .class_label = 1, .seed = (uint64_t)i,
                .sampling = r->models->defaults};
  vs_metrics mt;
  if (vs_bench_generate(r->models, r->env.dev, &job, &r->grid, &mt, r->err, sizeof r->err) ||
      vs_models_decode(r->models, r->env.dev, r->grid.tokens, r->grid.latents, r->rgb, r->err,
                       sizeof r->err)) {
    fprintf(stderr, "vspecd-bench: %s\n", r->err);
    return 0;
  }
  char desc[512];
  vs_job_describe(&job, r->models->name, desc, sizeof desc);
  vs_png_text text[] = {{"vspec", desc}, {"Software", "vspec-bench"}};
  uint8_t *png;
  size_t len;
  if (vs_png_encode(r->rgb, in->image_w, in->image_h, text, 2, &png, &len, r->err,
                    sizeof r->err))
    return 0;
  free(png);
  return 1;
}

/* 1. End-to-end latency of one image, in-process and through vspecd, interleaved. */
static int bd_latency(bd_run *r) {
  const char *method = r->a->method;
  /* warm-up: page in weights, let both sides allocate */
  for (int i = 0; i < 2; i++) {
    vs_bench_jobres j;
    if (vs_bench_run_jobs(&r->conn, 1, 1, 1000 + (uint64_t)i, 1, method, 0, &j) < 0) return 0;
  }
  int ni = (int)r->a->images;
  for (int i = 0; i < ni; i++) {
    double t0 = now_s();
    if (!bd_inproc_image(r, i)) return 0;
    r->inproc[i] = now_s() - t0;
    /* the same image through the daemon */
    vs_bench_jobres j;
    if (vs_bench_run_jobs(&r->conn, 1, 1, (uint64_t)i, 1, method, 0, &j) < 0) return 0;
    r->daemon[i] = j.latency;
    /* what the service adds around the worker's own generate + decode + PNG */
    r->service[i] = j.latency - j.generate_s - j.decode_s;
    r->paired[i] = r->daemon[i] - r->inproc[i];
  }
  double mi = dbench_median(r->inproc, ni), md = dbench_median(r->daemon, ni), ms = dbench_median(r->service, ni);
  printf("### 1. end-to-end latency of one image (%d images, interleaved)\n\n", ni);
  printf("| path | dbench_median | p10 | p90 |\n|---|---|---|---|\n");
  printf("| in-process (generate + decode + PNG) | %.3f ms | %.3f ms | %.3f ms |\n", mi * 1e3,
         pct(r->inproc, ni, 0.1) * 1e3, pct(r->inproc, ni, 0.9) * 1e3);
  printf("| through vspecd (submit -> result, progress streamed) | %.3f ms | %.3f ms | %.3f ms "
         "|\n", md * 1e3, pct(r->daemon, ni, 0.1) * 1e3, pct(r->daemon, ni, 0.9) * 1e3);
  printf("| of which the service itself (end to end - worker's generate, decode, PNG) | %.3f ms "
         "| %.3f ms | %.3f ms |\n", ms * 1e3, pct(r->service, ni, 0.1) * 1e3,
         pct(r->service, ni, 0.9) * 1e3);
  printf("\noverhead of the daemon: %+.1f %% (medians), %+.3f ms dbench_median of paired differences; "
         "the service's own time is %.1f %% of the in-process latency\n\n",
         (md / mi - 1) * 100, dbench_median(r->paired, ni) * 1e3, ms / mi * 100);
  return 1;
}

/* 2. The cost of previews at the default cadence (an eighth of the image). */
static int bd_previews(bd_run *r) {
  printf("### 2. cost of previews at the default cadence (every %d tokens)\n\n",
         r->N / 8 > 0 ? r->N / 8 : 1);
  printf("| previews | previews/image | rendering time / generation time | dbench_median latency |\n"
         "|---|---|---|---|\n");
  const int kinds[] = {0, VSPEC__PREVIEW_KIND__PREVIEW_LUT, VSPEC__PREVIEW_KIND__PREVIEW_DECODE};
  const char *names[] = {"none", "lut", "decode"};
  double lat[3][1024];
  double frac[3] = {0}, cnt[3] = {0};
  int m = r->a->images < 1024 ? (int)r->a->images : 1024;
  for (int i = 0; i < m; i++)
    for (int k = 0; k < 3; k++) {
      vs_bench_jobres j;
      if (vs_bench_run_jobs(&r->conn, 1, 1, (uint64_t)i, 1, r->a->method, kinds[k], &j) < 0)
        return 0;
      lat[k][i] = j.latency;
      frac[k] += j.generate_s > 0 ? j.preview_s / j.generate_s : 0;
      cnt[k] += j.previews;
    }
  for (int k = 0; k < 3; k++)
    printf("| %s | %.1f | %.2f %% | %.3f ms |\n", names[k], cnt[k] / m, frac[k] / m * 100,
           dbench_median(lat[k], m) * 1e3);
  return 1;
}

/* 3. Throughput with 1, 2, 4 and 8 jobs in flight, on a daemon with --workers workers. */
static int bd_throughput(bd_run *r) {
  long jobs = r->a->jobs;
  printf("\n### 3. throughput (%ld worker(s) x %d thread(s), %ld jobs per level)\n\n",
         r->a->workers, r->b->threads, jobs);
  if (start_daemon(r->b, (int)r->a->workers) ||
      vs_conn_open(&r->conn, r->b->d.job_ep, NULL, r->err, sizeof r->err))
    return 0;
  r->have_conn = 1;
  printf("| jobs in flight | images/s | dbench_median latency |\n|---|---|---|\n");
  int levels[] = {1, 2, 4, 8};
  for (int l = 0; l < 4; l++) {
    double wall = vs_bench_run_jobs(&r->conn, (int)jobs, levels[l], 500, 1, r->a->method, 0,
                                    r->res);
    if (wall < 0) return 0;
    double *lv = malloc((size_t)jobs * sizeof *lv);
    for (int i = 0; i < jobs; i++) lv[i] = r->res[i].latency;
    printf("| %d | %.2f | %.3f ms |\n", levels[l], jobs / wall, dbench_median(lv, (int)jobs) * 1e3);
    free(lv);
  }
  return 1;
}

/* Sections 1 and 2 on a one-worker daemon, then 3. 1 when all went through. */
static int bd_sections(bd_run *r, const char *label) {
  vs__bd *b = r->b;
  const vspec_model_info *in = &r->models->target.info;
  if (start_daemon(b, 1) || vs_conn_open(&r->conn, b->d.job_ep, NULL, r->err, sizeof r->err))
    return 0;
  r->have_conn = 1;
  printf("## vspecd benchmark\n\nmodel: %s; method %s; %d token(s) per image, %dx%d pixels; "
         "%d compute thread(s); daemon on ipc\n\n", label, r->a->method, r->N, in->image_w,
         in->image_h, b->threads);
  if (!bd_latency(r) || !bd_previews(r)) return 0;
  vs_conn_close(&r->conn);
  r->have_conn = 0;
  vs_bench_daemon_stop(&b->d, 30000);
  return bd_throughput(r);
}

int main(int argc, char **argv) {
  vs__bd b;
  memset(&b, 0, sizeof b);
  bd_args a;
  int status = bd_parse(argc, argv, &a);
  if (status >= 0) return status;
  b.threads = (int)a.threads;
  if (vs_bench_daemon_init(&b.d, "vspecd-bench")) return 1;
  const char *label;
  status = bd_model(&b, &a, &label);
  if (status) return status;
  if (a.batch) return bd_batch(&b, &a, label);
  bd_run r = {.b = &b, .a = &a};
  if (!bd_open(&r, argv[0])) return 1;
  status = bd_sections(&r, label) ? 0 : 1;
  if (status) vs_bench_daemon_dump_log(&b.d, 30);
  if (r.have_conn) vs_conn_close(&r.conn);
  vs_bench_daemon_stop(&b.d, 30000);
  vs_bench_grid_free(&r.grid);
  free(r.rgb);
  free(r.inproc);
  free(r.daemon);
  free(r.service);
  free(r.paired);
  free(r.res);
  vs_models_close(r.models);
  vs_bench_env_close(&r.env);
  if (vs_bench_daemon_cleanup(&b.d)) status = 1;
  return status;
}
