/*
 * vspec-bench linear: the linear layers of one GPT-B forward (12 x wqkv, wo, w1, w3, w2 and
 * the output head, distinct weights, 390 MB) through the skinny kernel and through BLIS,
 * for a list of row counts m. This is how the skinny/BLIS threshold in
 * kernels/cpu/cpu_linear_skinny.c was chosen; run it on a new machine to check it.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/cli_args.h"
#include "kernels/cpu/cpu_linear_skinny.h"

static void cl_usage(FILE *f) {
  fprintf(f,
          "cl_usage: vspec-bench linear [options]\n"
          "\n"
          "  --sizes LIST       row counts m (default 1,2,4,8,16,32,64,128,256)\n"
          "  --min-time S       seconds measured per point and path (default 0.3)\n"
          "  --threads N        compute threads (default: all cores)\n"
          "  --isa NAME         scalar, avx2 or avx512 (default: the best this CPU has)\n"
          "  --cpu-time         time with the calling thread's CPU clock instead of the\n"
          "                     wall clock (steadier on a loaded machine; --threads 1 only)\n");
}

#define VS_LIN_COUNT 61

typedef struct lin_layer {
  int n, k;
  float *w;
} lin_layer;

static int cl_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double clock_s(int cpu) { return cpu ? vs_bench_cpu_now() : vs_bench_now(); }

static void forward(vspec_dev *dev, const lin_layer *l, int m, const float *x, float *y) {
  for (int i = 0; i < VS_LIN_COUNT; i++)
    vs_dev_ops(dev)->linear(dev, x, m, l[i].k, l[i].w, l[i].n, NULL, y);
}

/* Median milliseconds of one forward's linears with the threshold set to max_m. */
static double time_path(vspec_dev *dev, int max_m, const lin_layer *l, int m, const float *x,
                        float *y, double min_time, int cpu) {
  dev->skinny_max_m = max_m;
  double samples[256];
  int k = 0;
  forward(dev, l, m, x, y); /* warm-up */
  double start = clock_s(0);
  while (k < 256 && (k < 3 || clock_s(0) - start < min_time)) {
    double t0 = clock_s(cpu);
    forward(dev, l, m, x, y);
    samples[k++] = clock_s(cpu) - t0;
  }
  qsort(samples, (size_t)k, sizeof samples[0], cl_cmp_double);
  return 1e3 * (k % 2 ? samples[k / 2] : 0.5 * (samples[k / 2 - 1] + samples[k / 2]));
}

int vs_bench_cmd_linear(int argc, char **argv) {
  const char *sizes_text = "1,2,4,8,16,32,64,128,256", *isa_name = NULL;
  double min_time = 0.3;
  long threads = 0;
  int cpu = 0;
  enum { O_SIZES = 256, O_MIN, O_THREADS, O_ISA, O_CPU };
  static const struct option opts[] = {
      {"sizes", required_argument, 0, O_SIZES},     {"min-time", required_argument, 0, O_MIN},
      {"threads", required_argument, 0, O_THREADS}, {"isa", required_argument, 0, O_ISA},
      {"cpu-time", no_argument, 0, O_CPU},          {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    int ok = 1;
    switch (c) {
      case O_SIZES: sizes_text = optarg; break;
      case O_MIN: ok = vs_cli_double("--min-time", optarg, 0.01, 600, &min_time); break;
      case O_THREADS: ok = vs_cli_long("--threads", optarg, 0, 1024, &threads); break;
      case O_ISA: isa_name = optarg; break;
      case O_CPU: cpu = 1; break;
      case 'h': cl_usage(stdout); return 0;
      default: cl_usage(stderr); return 2;
    }
    if (!ok) return 2;
  }
  int sizes[32], max_size = 0;
  int n_sizes = vs_bench_parse_sizes("linear", "--sizes", sizes_text, 1, 4096, sizes, 32);
  if (n_sizes < 0) return 2;
  for (int i = 0; i < n_sizes; i++)
    if (sizes[i] > max_size) max_size = sizes[i];
  vspec_dev *dev = NULL;
  char err[VSPEC_ERRLEN];
  if (vs_dev_create(vs_cpu_ops(), (int)threads, &dev, err, sizeof err)) {
    fprintf(stderr, "vspec-bench linear: %s\n", err);
    return 1;
  }
  if (isa_name && !vs_bench_set_isa(dev, "linear", isa_name)) {
    vs_dev_destroy(dev);
    return 2;
  }
  int default_max_m = dev->skinny_max_m;
  /* GPT-B: width 768, FFN hidden 2048, vocab 16384 */
  static const int shape[5][2] = {{2304, 768}, {768, 768}, {2048, 768}, {2048, 768}, {768, 2048}};
  lin_layer layers[VS_LIN_COUNT];
  double bytes = 0;
  int status = 1;
  float *x = NULL, *y = NULL;
  memset(layers, 0, sizeof layers);
  for (int i = 0; i < VS_LIN_COUNT; i++) {
    layers[i].n = i == VS_LIN_COUNT - 1 ? 16384 : shape[i % 5][0];
    layers[i].k = i == VS_LIN_COUNT - 1 ? 768 : shape[i % 5][1];
    size_t n = (size_t)layers[i].n * layers[i].k;
    layers[i].w = vs_cpu_ops()->alloc(dev, n * sizeof(float));
    if (!layers[i].w) goto done;
    for (size_t e = 0; e < n; e++) layers[i].w[e] = (float)((e * 2654435761u) % 1000) * 1e-3f - 0.5f;
    bytes += (double)n * sizeof(float);
  }
  x = vs_cpu_ops()->alloc(dev, (size_t)max_size * 2048 * sizeof(float));
  y = vs_cpu_ops()->alloc(dev, (size_t)max_size * 16384 * sizeof(float));
  if (!x || !y) goto done;
  for (size_t e = 0; e < (size_t)max_size * 2048; e++) x[e] = (float)(e % 17) * 0.1f - 0.8f;
  printf("\nGPT-B linear layers (61 products, %.1f MB of weights), %d thread(s), %s kernels, "
         "BLIS %s, %s time\n",
         bytes / 1e6, dev->threads, vs_isa_name(dev->isa),
         vs_blis_tuned() ? "tuned" : "generic (reference kernels)", cpu ? "CPU" : "wall");
  printf("default threshold: m <= %d takes the skinny kernel\n\n", default_max_m);
  printf("|    m | skinny ms | BLIS ms | BLIS / skinny | skinny GFLOP/s |\n");
  printf("|-----:|----------:|--------:|--------------:|---------------:|\n");
  for (int i = 0; i < n_sizes; i++) {
    int m = sizes[i];
    double ts = time_path(dev, m, layers, m, x, y, min_time, cpu);
    double tb = time_path(dev, 0, layers, m, x, y, min_time, cpu);
    printf("| %4d | %9.2f | %7.2f | %13.2f | %14.1f |\n", m, ts, tb, tb / ts,
           2.0 * m * (bytes / sizeof(float)) / (ts * 1e6));
    fflush(stdout);
  }
  status = 0;
done:
  for (int i = 0; i < VS_LIN_COUNT; i++) vs_cpu_ops()->free(dev, layers[i].w);
  vs_cpu_ops()->free(dev, x);
  vs_cpu_ops()->free(dev, y);
  vs_dev_destroy(dev);
  if (status) fprintf(stderr, "vspec-bench linear: out of memory\n");
  return status;
}
