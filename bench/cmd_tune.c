/*
 * vspec-bench tune: tunes size=auto for one model and method on this machine, on purpose,
 * and overwrites the stored choice (core/autotune.h). Everything else (generate, eval, demo,
 * vspecd) reads that choice back, so the same seed keeps giving the same image until the
 * next `vspec-bench tune`.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_opts.h"
#include "core/autotune.h"
#include "core/cli_args.h"

static void ct_usage(FILE *f) {
  fprintf(f,
          "ct_usage: vspec-bench tune --method M [options]\n"
          "\n"
          "Measures the target's forward cost and, for every drafter, shape and size the\n"
          "method leaves open, the acceptance on calibration images; prints the table and the\n"
          "choice (most expected tokens/s, or AR for an exact rule when nothing beats it by\n"
          "10 %%), and stores it in the cache ($VSPEC_CACHE_DIR, else $XDG_CACHE_HOME/vspec,\n"
          "else ~/.cache/vspec) under the model's files, the method and this machine (CPU\n"
          "model, kernel ISA and threads; the GPU's name). size=auto then uses it everywhere.\n"
          "\n"
          "  --model DIR        model directory (default models/fmnist)\n"
          "  --method M         speculative method, e.g. sd:exact or\n"
          "                     sd:lantern:k=100,delta=0.2@standard:shape=chain,drafter=model;\n"
          "                     size=auto is added when the method names no size (a method\n"
          "                     that names depth, total_tokens or tree has nothing to tune)\n"
          "  --threads N        compute threads (default: all cores; part of the key)\n"
          "  --images N         calibration images of the final candidates (default 4;\n"
          "                     more take longer and choose more surely)\n"
          "  --device D         cpu (default), cuda or cuda:N\n"
          "  --precision P      weights: fp32 or bf16 (bf16 is the GPU's default;\n"
          "                     on the CPU: AMX tiles, else AVX2 for decode steps)\n"
          "  --plugins DIR      plugin directory (default: plugins/ next to this program)\n");
}

/* Adds size=auto to a method that names no size, whatever its scheduler defaults. */
static int tune_method(const char *text, const vs_models *models, vs_method *me, char *err,
                       size_t errlen) {
  int rc = vs_method_parse(text, me, err, errlen);
  if (rc) return rc;
  if (me->kind != VS_METHOD_SD) {
    snprintf(err, errlen, "method %s: only a speculative method (sd:...) has a draft size to "
             "tune", me->text);
    return VSPEC_EINVAL;
  }
  vs_autotune_default(me, vs_bench_is_continuous(models));
  if (!vs_autotune_wanted(me)) {
    snprintf(err, errlen, "method %s names its draft size: drop depth, total_tokens or tree "
             "(or add size=auto) to tune it", me->text);
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

int vs_bench_cmd_tune(int argc, char **argv) {
  vs_bench_opts o;
  vs_bench_opts_init(&o, "models/fmnist");
  o.method = NULL; /* required */
  long images = 0;
  enum { O_IMAGES = 256 };
  static const struct option opts[] = {
      VS_BENCH_OPT_MODEL,   VS_BENCH_OPT_METHOD, VS_BENCH_OPTS_DEVICE, VS_BENCH_OPT_PLUGINS,
      {"images", required_argument, 0, O_IMAGES},
      {"help", no_argument, 0, 'h'},                {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "m:M:h", opts, NULL)) != -1) {
    int ok = 1;
    switch (c) {
      case O_IMAGES: ok = vs_cli_long("--images", optarg, 1, 1000, &images); break;
      case 'h': ct_usage(stdout); return 0;
      default:
        ok = vs_bench_opt(&o, c, optarg);
        if (ok < 0) {
          ct_usage(stderr);
          return 2;
        }
    }
    if (!ok) return 2;
  }
  if (optind < argc || !o.method) {
    if (optind < argc) fprintf(stderr, "vspec-bench tune: unexpected argument '%s'\n", argv[optind]);
    else fprintf(stderr, "vspec-bench tune: --method is required\n");
    ct_usage(stderr);
    return 2;
  }
  const char *model_dir = vs_bench_model_dir(o.model_dir); /* installed when not here */
  char err[VSPEC_ERRLEN];
  vs_bench_env env;
  if (!vs_bench_opts_env("tune", &o, argv[0], &env)) return 1;
  int status = 1;
  vs_models *models = NULL;
  vs_method me;
  vs_autotune_result res;
  if (vs_models_open(env.reg, &env.host, env.dev, model_dir, VS_ROLE_ALL, &models, err,
                     sizeof err) ||
      tune_method(o.method, models, &me, err, sizeof err) ||
      vs_autotune_resolve(models, env.dev, &me,
                          &(vs_autotune_opts){.flags = VS_AUTOTUNE_REFRESH, .images = (int)images,
                                              .progress = vs_bench_tune_progress},
                          &res, err, sizeof err)) {
    fprintf(stderr, "vspec-bench tune: %s\n", err);
    goto done;
  }
  vs_bench_tune_progress_end();
  char note[1024];
  vs_bench_print_device(stdout, env.dev);
  printf("model: %s (%s)\nmethod: %s\n", models->name, model_dir, me.text);
  vs_autotune_print_table(&res, stdout);
  vs_autotune_describe(&res, note, sizeof note);
  printf("%s\nruns as: %s\n", note, res.method.text);
  if (!res.stored) fprintf(stderr, "vspec-bench tune: warning: the choice could not be stored "
                           "(no writable cache directory); size=auto will tune again\n");
  status = res.stored ? 0 : 1;
done:
  if (models) vs_models_close(models);
  vs_bench_env_close(&env);
  return status;
}
