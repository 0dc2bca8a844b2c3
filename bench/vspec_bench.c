/*
 * vspec-bench: generation, benchmarks and quality evaluation, all in-process.
 */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "core/version.h"

static void vb_usage(FILE *f) {
  fprintf(f,
          "vb_usage: vspec-bench COMMAND [options]\n"
          "       vspec-bench --version\n"
          "\n"
          "commands:\n"
          "  generate    generate one image and write it as PNG\n"
          "  costcurve   forward latency against batch size, decode throughput vs the\n"
          "              memory-bandwidth bound\n"
          "  demo        one image per class as a PNG grid\n"
          "  eval        speed and quality of decoding methods, side by side\n"
          "  quality     real-data reference values of the quality metrics: classifier\n"
          "              accuracy, FID floor, precision/recall of real vs real\n"
          "  linear      GPT-B linear layers: skinny kernel vs BLIS by row count\n"
          "  attention   attention of one GPT-B forward by tree size (CPU kernel)\n"
          "  tune        tune size=auto for a model and method on this machine and store\n"
          "              the choice in the cache\n"
          "\n"
          "A relative --model DIR (default models/fmnist) that does not exist here is taken\n"
          "from the models installed with this program (PREFIX/share/vspec/DIR).\n"
          "\n"
          "Run 'vspec-bench COMMAND --help' for the options of a command.\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    vb_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--version") == 0) {
    vs_print_version(stdout, "vspec-bench");
    return 0;
  }
  if (strcmp(cmd, "generate") == 0) return vs_bench_cmd_generate(argc - 1, argv + 1);
  if (strcmp(cmd, "costcurve") == 0) return vs_bench_cmd_costcurve(argc - 1, argv + 1);
  if (strcmp(cmd, "demo") == 0) return vs_bench_cmd_demo(argc - 1, argv + 1);
  if (strcmp(cmd, "eval") == 0) return vs_bench_cmd_eval(argc - 1, argv + 1);
  if (strcmp(cmd, "quality") == 0) return vs_bench_cmd_quality(argc - 1, argv + 1);
  if (strcmp(cmd, "tune") == 0) return vs_bench_cmd_tune(argc - 1, argv + 1);
  if (strcmp(cmd, "linear") == 0) return vs_bench_cmd_linear(argc - 1, argv + 1);
  if (strcmp(cmd, "attention") == 0) return vs_bench_cmd_attention(argc - 1, argv + 1);
  fprintf(stderr, "vspec-bench: unknown command '%s'\n\n", cmd);
  vb_usage(stderr);
  return 2;
}
