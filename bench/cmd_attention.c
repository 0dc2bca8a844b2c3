/*
 * vspec-bench attention: the attention of one target forward (every layer, every CFG row)
 * through the CPU kernel, for a list of query counts, with the shape of a LlamaGen GPT
 * (GPT-B by default: 12 layers, 12 heads of 64) and a cached prefix of L tokens. The queries
 * form a chain, as a tree verify's nodes do: query i sees the prefix and queries 0..i.
 * This is how the vector loops of kernels/cpu/cpu_attention.c were measured; run it in two
 * builds, side by side, to compare them.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench/bench.h"
#include "core/cli_args.h"
#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_isa.h"

static void ca_usage(FILE *f) {
  fprintf(f,
          "ca_usage: vspec-bench attention [options]\n"
          "\n"
          "  --sizes LIST       query counts per row (tree nodes; default 1,2,4,8,16,32)\n"
          "  --prefix L         cached tokens before the queries (default 129: half of a\n"
          "                     16x16 image and the class token)\n"
          "  --layers N         layers (default 12)\n"
          "  --heads H          heads (default 12)\n"
          "  --head-dim D       dimensions per head (default 64; the shipped draft GPT has 32)\n"
          "  --rows R           rows per node: 2 with CFG (default), 1 without\n"
          "  --reps N           timed forwards per size; the median is printed (default 101)\n"
          "  --isa NAME         scalar, avx2 or avx512 (default: the best this CPU has)\n"
          "\n"
          "Times are of the calling thread's CPU clock (one thread).\n");
}

int vs_bench_cmd_attention(int argc, char **argv) {
  const char *sizes_text = "1,2,4,8,16,32", *isa_name = NULL;
  long prefix = 129, layers = 12, heads = 12, rows = 2, reps = 101, head_dim = 64;
  enum { O_SIZES = 256, O_PREFIX, O_LAYERS, O_HEADS, O_ROWS, O_REPS, O_ISA, O_HEAD_DIM };
  static const struct option opts[] = {
      {"sizes", required_argument, 0, O_SIZES},   {"prefix", required_argument, 0, O_PREFIX},
      {"layers", required_argument, 0, O_LAYERS}, {"heads", required_argument, 0, O_HEADS},
      {"rows", required_argument, 0, O_ROWS},     {"reps", required_argument, 0, O_REPS},
      {"isa", required_argument, 0, O_ISA},       {"head-dim", required_argument, 0, O_HEAD_DIM},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    int ok = 1;
    switch (c) {
      case O_SIZES: sizes_text = optarg; break;
      case O_PREFIX: ok = vs_cli_long("--prefix", optarg, 0, 4096, &prefix); break;
      case O_LAYERS: ok = vs_cli_long("--layers", optarg, 1, 128, &layers); break;
      case O_HEADS: ok = vs_cli_long("--heads", optarg, 1, 128, &heads); break;
      case O_HEAD_DIM: ok = vs_cli_long("--head-dim", optarg, 1, 512, &head_dim); break;
      case O_ROWS: ok = vs_cli_long("--rows", optarg, 1, 2, &rows); break;
      case O_REPS: ok = vs_cli_long("--reps", optarg, 1, 100000, &reps); break;
      case O_ISA: isa_name = optarg; break;
      case 'h': ca_usage(stdout); return 0;
      default: ca_usage(stderr); return 2;
    }
    if (!ok) return 2;
  }
  int sizes[32], max_n = 0;
  int n_sizes = vs_bench_parse_sizes("attention", "--sizes", sizes_text, 1, 1024, sizes, 32);
  if (n_sizes < 0) return 2;
  for (int i = 0; i < n_sizes; i++)
    if (sizes[i] > max_n) max_n = sizes[i];
  vspec_dev *dev = NULL;
  char err[VSPEC_ERRLEN];
  if (vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err)) {
    fprintf(stderr, "vspec-bench attention: %s\n", err);
    return 1;
  }
  if (isa_name && !vs_bench_set_isa(dev, "attention", isa_name)) {
    vs_dev_destroy(dev);
    return 2;
  }
  int H = (int)heads, HD = (int)head_dim, slots = (int)prefix + max_n, width = H * HD;
  size_t kv_n = (size_t)H * slots * HD;
  /* q as the qkv rows of a forward: q, k, v of every head side by side */
  float *q = malloc((size_t)max_n * 3 * width * sizeof(float));
  float *k = malloc(kv_n * sizeof(float)), *v = malloc(kv_n * sizeof(float));
  float *out = malloc((size_t)max_n * width * sizeof(float));
  uint8_t *mask = malloc((size_t)max_n * slots);
  double *t = malloc((size_t)reps * sizeof(double));
  int status = 1;
  if (!q || !k || !v || !out || !mask || !t) {
    fprintf(stderr, "vspec-bench attention: out of memory\n");
    goto done;
  }
  for (size_t i = 0; i < (size_t)max_n * 3 * width; i++) q[i] = (float)(i % 13) * 0.05f - 0.3f;
  for (size_t i = 0; i < kv_n; i++) {
    k[i] = (float)(i % 7) * 0.1f - 0.3f;
    v[i] = (float)(i % 11) * 0.1f - 0.5f;
  }
  printf("\nattention of one forward: %ld layers x %ld rows, %d heads of %d, %ld cached tokens, "
         "%s kernels, CPU time, median of %ld\n\n",
         layers, rows, H, HD, prefix, vs_isa_name(dev->isa), reps);
  printf("| nodes | ms per forward | us per node |\n|------:|---------------:|------------:|\n");
  for (int s = 0; s < n_sizes; s++) {
    int n = sizes[s], n_kv = (int)prefix + n;
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n_kv; j++) mask[(size_t)i * n_kv + j] = j < prefix || j - prefix <= i;
    for (long r = 0; r < reps; r++) {
      double t0 = vs_bench_cpu_now();
      for (long call = 0; call < layers * rows; call++)
        vs_dev_ops(dev)->attention(dev, q, n, 3 * width, H, H, HD, k, v, slots, n_kv,
                                   mask, out);
      t[r] = vs_bench_cpu_now() - t0;
    }
    double ms = 1e3 * vs_bench_quantile(t, (int)reps, 0.5);
    printf("| %5d | %14.3f | %11.1f |\n", n, ms, 1e3 * ms / n);
    fflush(stdout);
  }
  status = 0;
done:
  free(q), free(k), free(v), free(out), free(mask), free(t);
  vs_dev_destroy(dev);
  return status;
}
