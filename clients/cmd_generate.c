/*
 * clients/cmd_generate.c - vspec generate: its command line, parsed and checked here into a
 * vs_gen_opts; clients/cmd_generate_run.c submits the job and follows it.
 */
#include "clients/generate.h"

#include <dirent.h>

static void usage_generate(FILE *f) {
  fprintf(f,
          "usage: vspec generate [options]\n"
          "\n"
          "Submits one image job to vspecd, shows its progress, writes the PNG.\n"
          "\n"
          "  --class C            class label (default 0); `vspec status` names each\n"
          "                       model's classes (models/fmnist: 7 is Sneaker)\n"
          "  --prompt TEXT        the class in words, matched by the daemon: a class number,\n"
          "                       a class name in any case, or a text holding one (\"a\n"
          "                       photo of an ankle boot\"); not with --class\n"
          "  --seed S             seed (default: a random one the daemon draws; printed, and\n"
          "                       stored in the PNG); the same seed gives the same image\n"
          "  --model NAME         a model the daemon serves (default: the daemon's default)\n"
          "  --method M           complete method: ar | sd:RULE[:PARAMS][@SCHED[:PARAMS]]\n"
          "  --accept RULE        speculative decoding with acceptance rule RULE (exact,\n"
          "                       lantern, lanternpp, uniform_rsd, coolsd, gsd, ...;\n"
          "                       continuous for continuous-token (MAR) models, with\n"
          "                       --sched-param shape=chain,depth=L: L draft steps per\n"
          "                       verification)\n"
          "  --param K=V          a parameter of the rule (repeatable), e.g. delta=0.2\n"
          "  --sched SCHED        scheduler (default standard; vvs)\n"
          "  --sched-param K=V    a parameter of the scheduler (repeatable); without a draft\n"
          "                       size (depth, total_tokens, tree) the daemon uses size=auto:\n"
          "                       the drafter, shape and size tuned for the model on its\n"
          "                       machine (or AR for an exact rule where none pays; cached)\n"
          "  --draft D            drafter: auto | model | head | jacobi (no draft model:\n"
          "                       Speculative Jacobi Decoding)\n"
          "  --temperature T, --top-k K, --top-p P, --cfg S, --cfg-interval I\n"
          "                       sampling (default: the model's; MAR models take --cfg\n"
          "                       but not --top-k, --top-p or --cfg-interval)\n"
          "  --num-iter N         MAR models: generation steps (default: the model's)\n"
          "  --cfg-schedule S     MAR models: linear (guidance grows as the image fills in;\n"
          "                       MAR's default) | constant\n"
          "  --out FILE           output PNG (default out.png)\n"
          "  --upscale K          enlarge the output PNG K times (1-64), nearest neighbour,\n"
          "                       here on the client; previews keep the daemon's size\n"
          "  --previews DIR       write progressive previews into DIR (preview-NNN.png; the\n"
          "                       preview-NNN.png files of an earlier job are removed first)\n"
          "  --preview-kind K     lut (default) | decode (the daemon's tokens kind makes no\n"
          "                       images: it is refused here)\n"
          "  --preview-every N    a preview every N tokens (default: the daemon's, 1/8 image)\n"
          "  --deadline MS        cancel the job if not done MS ms after acceptance\n"
          "  --priority P         -10..10, higher first (default 0)\n"
          "  --tag TEXT           a label for the daemon's log\n"
          "  --job-id N           fleet mode (a vspec-gateway): this job's id, 1 to 2^63-1; the\n"
          "                       same command again follows that job instead of starting\n"
          "                       another (after a lost connection, say); vspecd ignores it\n"
          "  --json               JSON lines on stdout: one per event, the last is always the\n"
          "                       result (with stats and tokens) or an error object, also for\n"
          "                       a bad command line, no daemon, a timeout or an interrupt\n"
          "  --quiet              no progress output\n"
          VS_NET_OPTIONS_HELP
          "\n"
          "The progress line: accept = the share of the draft tokens the target verified that\n"
          "the rule accepted (accept -: nothing is drafted, as in AR); unverified = the share\n"
          "of the tokens VVS took without verification; the ETA counts generation only (a\n"
          "phase such as size=auto tuning is shown instead while it lasts).\n"
          "\n"
          "Ctrl-C cancels the job. Exit status: 0 image written, 1 job failed or output not\n"
          "written, 2 usage, 3 daemon unreachable, 4 request refused as invalid, 5 busy or\n"
          "shutting down (retry later), 6 cancelled or deadline passed, 130 interrupted.\n");
}

static int cg_append_param(char *buf, size_t cap, const char *kv, char *err, size_t errlen) {
  if (!strchr(kv, '=')) {
    snprintf(err, errlen, "parameter '%s' is not KEY=VALUE", kv);
    return -1;
  }
  size_t n = strlen(buf);
  if (n + strlen(kv) + 2 > cap) {
    snprintf(err, errlen, "too many parameters (at most %zu characters)", cap - 1);
    return -1;
  }
  snprintf(buf + n, cap - n, "%s%s", n ? "," : "", kv);
  return 0;
}

enum { O_CLASS = 1, O_PROMPT, O_SEED, O_MODEL, O_METHOD, O_ACCEPT, O_PARAM, O_SCHED, O_SPARAM, O_DRAFT,
       O_TEMP, O_TOPK, O_TOPP, O_CFG, O_CFGI, O_NITER, O_CFGS, O_OUT, O_PREV, O_PKIND,
       O_PEVERY, O_DEADLINE, O_PRIO, O_TAG, O_JOBID, O_JSON, O_QUIET, O_UPSCALE, O_HELP };

static const struct option vs__gen_longopts[] = {
    {"class", required_argument, 0, O_CLASS},   {"seed", required_argument, 0, O_SEED},
    {"prompt", required_argument, 0, O_PROMPT},
    {"model", required_argument, 0, O_MODEL},   {"method", required_argument, 0, O_METHOD},
    {"accept", required_argument, 0, O_ACCEPT}, {"param", required_argument, 0, O_PARAM},
    {"sched", required_argument, 0, O_SCHED},   {"sched-param", required_argument, 0, O_SPARAM},
    {"draft", required_argument, 0, O_DRAFT},   {"temperature", required_argument, 0, O_TEMP},
    {"top-k", required_argument, 0, O_TOPK},    {"top-p", required_argument, 0, O_TOPP},
    {"cfg", required_argument, 0, O_CFG},       {"cfg-interval", required_argument, 0, O_CFGI},
    {"num-iter", required_argument, 0, O_NITER},
    {"cfg-schedule", required_argument, 0, O_CFGS},
    {"out", required_argument, 0, O_OUT},       {"previews", required_argument, 0, O_PREV},
    {"preview-kind", required_argument, 0, O_PKIND},
    {"preview-every", required_argument, 0, O_PEVERY},
    {"deadline", required_argument, 0, O_DEADLINE},
    {"priority", required_argument, 0, O_PRIO}, {"tag", required_argument, 0, O_TAG},
    {"job-id", required_argument, 0, O_JOBID},
    {"json", no_argument, 0, O_JSON},           {"quiet", no_argument, 0, O_QUIET},
    {"upscale", required_argument, 0, O_UPSCALE},
    {"help", no_argument, 0, O_HELP},           VS_NET_LONGOPTS,
    {0, 0, 0, 0}};

/* An integer option into a Submit field with its presence flag. */
#define VS_SET_LONG(name, lo, hi, has, field)                                \
  do {                                                                       \
    long v_;                                                                 \
    if (!vs_cli_long(name, arg, lo, hi, &v_)) return 0;                      \
    g->sub.has = 1;                                                          \
    g->sub.field = v_;                                                       \
  } while (0)
#define VS_SET_DOUBLE(name, lo, hi, has, field)                              \
  do {                                                                       \
    double d_;                                                               \
    if (!vs_cli_double(name, arg, lo, hi, &d_)) return 0;                    \
    g->sub.has = 1;                                                          \
    g->sub.field = (float)d_;                                                \
  } while (0)

/* The sampling options: 1 when c was one and its value is good, 0 bad, -1 not one of them. */
static int cg_sampling_opt(vs_gen_opts *g, int c, const char *arg) {
  switch (c) {
    case O_TEMP: VS_SET_DOUBLE("--temperature", 0, 100, has_temperature, temperature); return 1;
    case O_TOPK: VS_SET_LONG("--top-k", 0, 1 << 30, has_top_k, top_k); return 1;
    case O_TOPP: VS_SET_DOUBLE("--top-p", 1e-9, 1, has_top_p, top_p); return 1;
    case O_CFG: VS_SET_DOUBLE("--cfg", 0, 100, has_cfg_scale, cfg_scale); return 1;
    case O_CFGI: VS_SET_LONG("--cfg-interval", -1, 1 << 30, has_cfg_interval, cfg_interval);
      return 1;
    case O_NITER: VS_SET_LONG("--num-iter", 0, 1 << 20, has_num_iter, num_iter); return 1;
    case O_CFGS:
      /* checked here too, so a typo is a usage error before anything is sent */
      if (strcmp(arg, "linear") && strcmp(arg, "constant")) {
        fprintf(stderr, "--cfg-schedule: '%s' is not linear or constant\n", arg);
        return 0;
      }
      g->sub.cfg_schedule = (char *)arg;
      return 1;
    default: return -1;
  }
}

static int cg_preview_kind(vs_gen_opts *g, const char *arg) {
  if (!strcmp(arg, "lut")) g->sub.preview = VSPEC__PREVIEW_KIND__PREVIEW_LUT;
  else if (!strcmp(arg, "decode")) g->sub.preview = VSPEC__PREVIEW_KIND__PREVIEW_DECODE;
  else if (!strcmp(arg, "tokens")) {
    /* The daemon's tokens kind sends the token map in progress events and no image, so
     * --previews would stay empty: refused rather than silently writing nothing. */
    fprintf(stderr, "--preview-kind tokens makes no preview images (the daemon sends the "
            "token map in its progress events, e.g. the Python client's Progress.tokens): use "
            "--preview-kind lut or decode\n");
    return 0;
  } else {
    fprintf(stderr, "--preview-kind: '%s' is not lut or decode\n", arg);
    return 0;
  }
  g->sub.has_preview = 1;
  return 1;
}

/* The job's own options: 1 good, 0 bad value (said on stderr). */
static int cg_job_opt(vs_gen_opts *g, int c, const char *arg) {
  unsigned long long u;
  char err[600];
  switch (c) {
    case O_CLASS: VS_SET_LONG("--class", 0, 1 << 30, has_class_label, class_label); return 1;
    case O_SEED:
      if (!vs_cli_u64("--seed", arg, &u)) return 0;
      g->sub.has_seed = 1;
      g->sub.seed = u;
      return 1;
    case O_MODEL: g->sub.model = (char *)arg; return 1;
    case O_PROMPT: g->sub.prompt = (char *)arg; return 1;
    case O_METHOD: g->sub.method = (char *)arg; return 1;
    case O_ACCEPT: g->sub.accept = (char *)arg; return 1;
    case O_SCHED: g->sub.sched = (char *)arg; return 1;
    case O_DRAFT: g->sub.draft = (char *)arg; return 1;
    case O_PARAM:
    case O_SPARAM:
      if (!cg_append_param(c == O_PARAM ? g->accept_params : g->sched_params,
                            sizeof g->accept_params, arg, err, sizeof err))
        return 1;
      fprintf(stderr, "vspec generate: %s\n", err);
      return 0;
    case O_PEVERY:
      VS_SET_LONG("--preview-every", 1, 1 << 20, has_preview_every_tokens, preview_every_tokens);
      return 1;
    case O_DEADLINE:
      VS_SET_LONG("--deadline", 1, 7l * 24 * 3600 * 1000, has_deadline_ms, deadline_ms);
      return 1;
    case O_PRIO: VS_SET_LONG("--priority", -10, 10, has_priority, priority); return 1;
    case O_TAG: g->sub.tag = (char *)arg; return 1;
    case O_JOBID:
      if (!vs_cli_u64("--job-id", arg, &u)) return 0;
      if (u == 0 || u >> 63) {
        fprintf(stderr, "vspec generate: --job-id %llu is not 1 to 2^63-1\n", u);
        return 0;
      }
      g->sub.has_job_id = 1;
      g->sub.job_id = u;
      return 1;
    default: return cg_sampling_opt(g, c, arg);
  }
}

/* The client's own options: 1 good, 0 bad value, -1 not one of them. */
static int cg_client_opt(vs_gen_opts *g, int c, const char *arg) {
  switch (c) {
    case O_OUT: g->out = arg; return 1;
    case O_PREV: g->previews = arg; return 1;
    case O_PKIND: return cg_preview_kind(g, arg);
    case O_JSON: g->json = 1; return 1;
    case O_QUIET: g->quiet = 1; return 1;
    case O_UPSCALE: return vs_cli_long("--upscale", arg, 1, 64, &g->upscale);
    default: return -1;
  }
}

/* 1 when the command line asks for --json (or an unambiguous prefix of it), looked for
 * before parsing so that a usage error anywhere on it is still reported as JSON. */
static int cg_json_wanted(int argc, char **argv) {
  for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
    if (strlen(argv[i]) >= 4 && !strncmp("--json", argv[i], strlen(argv[i]))) return 1;
  return 0;
}

static int cg_usage_error(vs_gen_view *v, const char *fmt, const char *what) {
  return vs_gen_fail(v, EXIT_USAGE, VS_GEN_USAGE, fmt, what);
}

/* A usage error getopt or a value parser has already explained on stderr: without --json
 * there is nothing to add; with it, the error object names the option. */
static int cg_usage_said(vs_gen_view *v, const char *fmt, const char *what) {
  return v->json ? cg_usage_error(v, fmt, what) : EXIT_USAGE;
}

/* Options into g: -1 to go on, else the exit status (0 after --help). */
static int cg_gen_options(vs_gen_opts *g, int argc, char **argv, vs_gen_view *v) {
  optind = 1;
  for (int c, at = 0; (c = getopt_long(argc, argv, "h", vs__gen_longopts, &at)) != -1; at = 0) {
    const char *name = vs__gen_longopts[at].name;
    if (c == O_HELP || c == 'h') {
      usage_generate(stdout);
      return EXIT_OK;
    }
    if (c == '?' || c == ':') /* getopt said which on stderr */
      return cg_usage_said(v, "unknown option or missing value at '%s' (see vspec generate "
                            "--help)", argv[optind - 1]);
    int ok = vs__net_opt(&g->net, c, optarg); /* 1 taken, 0 not a network option, -1 bad */
    if (ok == 0 && (ok = cg_client_opt(g, c, optarg)) < 0) ok = cg_job_opt(g, c, optarg);
    if (ok <= 0) {
      char what[300];
      snprintf(what, sizeof what, "--%s '%s'", name, optarg ? optarg : "");
      return cg_usage_said(v, "%s is refused (stderr says why; see vspec generate --help)",
                            what);
    }
  }
  if (optind < argc)
    return cg_usage_error(v, "vspec generate: unexpected argument '%s' (see --help)",
                           argv[optind]);
  return -1;
}

/* What the options mean together: -1 to go on, else the exit status. */
static int cg_gen_check(vs_gen_opts *g, vs_gen_view *v) {
  Vspec__Submit *s = &g->sub;
  char err[1024];
  if (vs__net_env_check(&g->net, err, sizeof err))
    return cg_usage_error(v, "%s", err);
  if (s->method && (s->accept || s->sched || *g->accept_params || *g->sched_params || s->draft))
    return cg_usage_error(v, "%s", "vspec generate: give --method or "
                           "--accept/--sched/--param/--draft, not both");
  if (s->prompt && s->has_class_label)
    return cg_usage_error(v, "%s", "vspec generate: give --class or --prompt, not both");
  if (!s->accept && (s->sched || *g->accept_params || *g->sched_params || s->draft))
    return cg_usage_error(v, "%s", "vspec generate: --sched, --param and --draft need "
                           "--accept RULE");
  if (*g->accept_params) s->accept_params = g->accept_params;
  if (*g->sched_params) s->sched_params = g->sched_params;
  if (g->previews && !s->has_preview) {
    s->has_preview = 1;
    s->preview = VSPEC__PREVIEW_KIND__PREVIEW_LUT;
  }
  return -1;
}

/* The folder --out names must exist (and be writable, for those permissions bind): checked
 * before submitting, so that a typo does not cost a generation whose image is then lost. */
static int cg_check_out_dir(const vs_gen_opts *g, vs_gen_view *v) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", g->out);
  char *slash = strrchr(dir, '/');
  if (!slash) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) dir[1] = 0;
  else *slash = 0;
  if (access(dir, W_OK) == 0) return -1;
  return vs_gen_fail(v, EXIT_FAIL, VS_GEN_OUTPUT, "cannot write --out %s: folder %s: %s",
                     g->out, dir, strerror(errno));
}

/* 1 for the names vspec generate writes previews under: preview-NNN.png. */
static int cg_is_preview_file(const char *name) {
  size_t n = strlen(name);
  if (n < 13 || strncmp(name, "preview-", 8) || strcmp(name + n - 4, ".png")) return 0;
  for (size_t i = 8; i < n - 4; i++)
    if (name[i] < '0' || name[i] > '9') return 0;
  return 1;
}

/* Creates the previews folder, or empties a reused one of an earlier job's preview-NNN.png
 * (only those: nothing else in it is touched), so that it holds this job's previews only. */
static int cg_prepare_previews(const vs_gen_opts *g, vs_gen_view *v) {
  if (!g->previews) return -1;
  if (mkdir(g->previews, 0755) && errno != EEXIST)
    return vs_gen_fail(v, EXIT_FAIL, VS_GEN_OUTPUT, "cannot create --previews %s: %s",
                       g->previews, strerror(errno));
  DIR *d = opendir(g->previews);
  if (!d)
    return vs_gen_fail(v, EXIT_FAIL, VS_GEN_OUTPUT, "cannot read --previews %s: %s",
                       g->previews, strerror(errno));
  char path[4400];
  for (struct dirent *e; (e = readdir(d));) {
    if (!cg_is_preview_file(e->d_name)) continue;
    snprintf(path, sizeof path, "%s/%s", g->previews, e->d_name);
    if (unlink(path) && errno != ENOENT) {
      closedir(d);
      return vs_gen_fail(v, EXIT_FAIL, VS_GEN_OUTPUT, "cannot remove the earlier job's %s: %s",
                         path, strerror(errno));
    }
  }
  closedir(d);
  return -1;
}

int vs_cmd_generate(int argc, char **argv) {
  vs_gen_opts g = {.sub = VSPEC__SUBMIT__INIT, .out = "out.png", .upscale = 1};
  vs__net_defaults(&g.net);
  /* No seed unless --seed: the daemon draws one (as for HTTP and the Python client) and
   * reports it in Accepted.seed and Result.seed, which the output shows. */
  g.sub.has_credit = 1;
  g.sub.credit = 8;
  vs_gen_view v;
  vs_gen_view_init(&v, stdout, stderr, cg_json_wanted(argc, argv), 0, VS_PL_AUTO, vs_now());
  int rc = cg_gen_options(&g, argc, argv, &v);
  if (rc < 0) {
    v.json = g.json;
    v.quiet = g.quiet;
    rc = cg_gen_check(&g, &v);
  }
  if (rc < 0) rc = cg_check_out_dir(&g, &v);
  if (rc < 0) rc = cg_prepare_previews(&g, &v);
  if (rc < 0) rc = vs__gen_run(&g, &v);
  vs_gen_view_free(&v);
  return rc;
}
