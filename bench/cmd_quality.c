/*
 * vspec-bench quality: the real-data side of the quality metrics - the classifier's test
 * accuracy, the real-data FID floor and precision/recall of real against real - so a
 * generated set's numbers have something to be read against.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_opts.h"
#include "bench/fmnist_data.h"
#include "bench/quality.h"
#include "bench/quality_eval.h"
#include "core/cli_args.h"

static void cq_usage(FILE *f) {
  fprintf(f,
          "cq_usage: vspec-bench quality [options]\n"
          "\n"
          "Real-data reference values of the quality metrics, in the feature space of the\n"
          "model's Fashion-MNIST classifier: its accuracy on the 10k test images, the FID of\n"
          "the first 10k training images against the test statistics (the floor a perfect\n"
          "generator reaches at 10k images), and precision/recall (k=%d) of those training\n"
          "images against the test images.\n"
          "\n"
          "  --model DIR     model directory with classifier.safetensors, fid_ref.safetensors\n"
          "                  and optionally classifier_golden.safetensors (default models/fmnist)\n"
          "  --data DIR      Fashion-MNIST IDX files (default %s)\n"
          "  --cache DIR     feature cache directory (default build/cache)\n"
          "  --no-cache      neither read nor write the feature cache\n"
          "  --threads N     compute threads (default: BLIS default)\n"
          "  --floor-at N    also the floor at N images: N class-balanced training images\n"
          "                  (N / 10 per class, as vspec-bench eval prints next to its tables)\n",
          VS_PR_K, VS_FMNIST_DIR);
}

int vs_bench_cmd_quality(int argc, char **argv) {
  vs_bench_opts o;
  vs_bench_opts_init(&o, "models/fmnist");
  vs_quality_opts opts = {.verbose = 1};
  long floor_at = 0;
  enum { O_DATA = 256, O_CACHE, O_NOCACHE, O_FLOOR_AT };
  static const struct option lopts[] = {
      VS_BENCH_OPT_MODEL,                         {"data", required_argument, 0, O_DATA},
      {"cache", required_argument, 0, O_CACHE},   {"no-cache", no_argument, 0, O_NOCACHE},
      {"threads", required_argument, 0, VS_BENCH_O_THREADS}, {"help", no_argument, 0, 'h'},
      {"floor-at", required_argument, 0, O_FLOOR_AT},
      {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "m:h", lopts, NULL)) != -1) {
    int ok = 1;
    switch (c) {
      case O_DATA: opts.data_dir = optarg; break;
      case O_CACHE: opts.cache_dir = optarg; break;
      case O_NOCACHE: opts.cache_dir = ""; break;
      case O_FLOOR_AT: ok = vs_cli_long("--floor-at", optarg, 2, 1000000, &floor_at); break;
      case 'h': cq_usage(stdout); return 0;
      default:
        ok = vs_bench_opt(&o, c, optarg);
        if (ok < 0) {
          cq_usage(stderr);
          return 2;
        }
    }
    if (!ok) return 2;
  }
  if (!vs_bench_no_operands("quality", argc, argv)) return 2;

  const char *model_dir = vs_bench_model_dir(o.model_dir); /* an installed model when not here */
  char err[VSPEC_ERRLEN];
  vspec_dev *dev = NULL;
  if (vs_dev_create(vs_cpu_ops(), o.dv.threads, &dev, err, sizeof err)) {
    fprintf(stderr, "vspec-bench quality: %s\n", err);
    return 1;
  }
  int status = 1;
  vs_quality *q = NULL;
  double t0 = vs_bench_now();
  if (vs_quality_open_opts(model_dir, dev, &opts, &q, err, sizeof err)) {
    fprintf(stderr, "vspec-bench quality: %s\n", err);
    goto done;
  }
  double p, r;
  if (vs_quality_floor_pr(q, &p, &r, err, sizeof err)) {
    fprintf(stderr, "vspec-bench quality: %s\n", err);
    goto done;
  }
  const vs_quality_info *in = vs_quality_get_info(q);
  printf("classifier   %s (%llu bytes, fnv1a64 %016llx): %d-d features, %d classes\n",
         in->classifier_path, (unsigned long long)in->classifier_bytes,
         (unsigned long long)in->classifier_hash, in->feature_dim, in->num_classes);
  if (in->golden_images)
    printf("golden       %d images: preprocessing max err %.2g, features %.2g, logits %.2g "
           "(relative)\n",
           in->golden_images, in->golden_input_err, in->golden_feat_err, in->golden_logit_err);
  else
    printf("golden       no classifier_golden.safetensors: C classifier not checked against "
           "PyTorch\n");
  printf("reference    %s\n", in->ref_source);
  if (in->cache_path[0])
    printf("features     %s %s\n", in->from_cache ? "loaded from" : "computed, cached in",
           in->cache_path);
  else
    printf("features     computed (cache off)\n");
  printf("\n");
  printf("%-40s %10.4f   (%d test images)\n", "test accuracy", in->test_acc, in->n_test);
  printf("%-40s %10.4f   (first %d train images vs test stats)\n", "real-data floor FID",
         in->floor_fid, in->n_floor);
  printf("%-40s %10.4f / %.4f   (first %d train vs %d test, k=%d)\n", "precision / recall", p,
         r, in->n_floor, in->n_test, VS_PR_K);
  if (!isnan(in->train_ref_fid))
    printf("%-40s %10.4f   (shipped statistics: %s)\n", "FID train (all) vs test",
           in->train_ref_fid, in->train_ref_note);
  else
    printf("%-40s %10s   (%s)\n", "FID train (all) vs test", "-", in->train_ref_note);
  if (floor_at) {
    double fa;
    if (vs_quality_floor_at(q, (int)floor_at, &fa, err, sizeof err)) {
      fprintf(stderr, "vspec-bench quality: %s\n", err);
      goto done;
    }
    printf("%-40s %10.4f   (%ld class-balanced train images vs test stats)\n",
           "real-data floor FID at n", fa, floor_at);
  }
  if (in->ref_shipped)
    printf("%-40s %10.2e   (C features vs shipped test stats; ~0 when they agree)\n",
           "check: FID C vs shipped", in->ref_check_fid);
  fprintf(stderr, "quality: %.1f s\n", vs_bench_now() - t0);
  status = 0;
done:
  vs_quality_close(q);
  vs_dev_destroy(dev);
  return status;
}
