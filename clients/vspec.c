/*
 * vspec - the command-line client of vspecd.
 *
 *   vspec generate   submit a job, stream its progress and previews, write the image
 *   vspec status     queue, workers, models, plugins with generations, totals
 *   vspec plugins    list | reload NAME
 *   vspec cancel     cancel a job by id
 *   vspec ping       round trip to a daemon
 *   vspec keygen     a CURVE key pair for an allow-listed client (or a server)
 *
 * Exit codes (for scripts): see usage() and vs__exit_for().
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/metrics.h" /* vs_now */
#include "clients/conn.h"
#include "clients/progress_line.h"
#include "core/cli_args.h"
#include "proto/curve_keys.h"
#include "proto/endpoint_probe.h"
#include "core/version.h"

enum {
  EXIT_OK = 0,
  EXIT_FAIL = 1,        /* the job failed in the daemon, or the output could not be written */
  EXIT_USAGE = 2,       /* bad command line */
  EXIT_UNREACHABLE = 3, /* no answer from the daemon, or a protocol error */
  EXIT_REJECTED = 4,    /* the daemon refused the request as invalid */
  EXIT_BUSY = 5,        /* busy or shutting down: retry later */
  EXIT_CANCELLED = 6,   /* cancelled or past its deadline */
  EXIT_INTERRUPTED = 130
};

static const char *vs__default_server(void) {
  const char *e = getenv("VSPEC_SERVER");
  return e && *e ? e : "tcp://127.0.0.1:5555";
}

/* The systemd unit (etc/vspecd.service) puts the admin socket in vspecd's runtime
 * directory; a daemon started by hand uses /tmp's. The CLI takes the unit's when it exists,
 * so that `vspec plugins` works against either without options. */
#define VS_UNIT_ADMIN_SOCK "/run/vspecd/admin.sock"

static const char *vs__default_admin(void) {
  const char *e = getenv("VSPEC_ADMIN");
  if (e && *e) return e;
  return access(VS_UNIT_ADMIN_SOCK, F_OK) == 0 ? "ipc://" VS_UNIT_ADMIN_SOCK
                                                : "ipc:///tmp/vspecd-admin.sock";
}

static volatile sig_atomic_t vs__interrupted;
static void vs__on_sigint(int sig) {
  (void)sig;
  vs__interrupted = 1;
}

static int vs__exit_for(int code) {
  switch (code) {
    case VSPEC__ERROR_CODE__ERR_BUSY:
    case VSPEC__ERROR_CODE__ERR_SHUTTING_DOWN:
    case VSPEC__ERROR_CODE__ERR_UNAVAILABLE: return EXIT_BUSY;
    case VSPEC__ERROR_CODE__ERR_CANCELLED:
    case VSPEC__ERROR_CODE__ERR_DEADLINE: return EXIT_CANCELLED;
    case VSPEC__ERROR_CODE__ERR_INTERNAL: return EXIT_FAIL;
    default: return EXIT_REJECTED;
  }
}

/* JSON string (the caller prints the quotes' surroundings). */
static void vs__json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; s && *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

/* Common connection options of every command. */
typedef struct vs_net_opts {
  const char *server, *admin;
  int server_given, admin_given;
  const char *server_key, *client_key;
  double timeout_s;
} vs_net_opts;

static void vs__net_defaults(vs_net_opts *n) {
  n->server = vs__default_server();
  n->admin = vs__default_admin();
  n->server_given = n->admin_given = 0;
  n->server_key = getenv("VSPEC_CURVE_SERVER_KEY");
  n->client_key = getenv("VSPEC_CURVE_KEY");
  if (n->server_key && !*n->server_key) n->server_key = NULL;
  if (n->client_key && !*n->client_key) n->client_key = NULL;
  n->timeout_s = 30;
}

#define VS_NET_OPTIONS_HELP                                                                     \
  "  --server EP          job endpoint (default $VSPEC_SERVER or tcp://127.0.0.1:5555)\n"     \
  "  --admin EP           admin endpoint (default $VSPEC_ADMIN, else\n"                        \
  "                       ipc:///run/vspecd/admin.sock when it exists (the systemd unit's),\n" \
  "                       else ipc:///tmp/vspecd-admin.sock)\n"                                \
  "  --curve-server-key K the server's CURVE public key, or a file holding it\n"              \
  "                       (default $VSPEC_CURVE_SERVER_KEY)\n"                                 \
  "  --curve-key FILE     this client's key pair from `vspec keygen` ($VSPEC_CURVE_KEY)\n"    \
  "  --timeout S          give up after S seconds without a word from the daemon (default 30)\n"

enum { O_SERVER = 1000, O_ADMIN, O_SKEY, O_CKEY, O_TIMEOUT };
#define VS_NET_LONGOPTS                                                                 \
  {"server", required_argument, 0, O_SERVER}, {"admin", required_argument, 0, O_ADMIN}, \
      {"curve-server-key", required_argument, 0, O_SKEY},                               \
      {"curve-key", required_argument, 0, O_CKEY}, {"timeout", required_argument, 0, O_TIMEOUT}

/* 1 if c was a network option (consumed), 0 if not, -1 on a bad value. */
static int vs__net_opt(vs_net_opts *n, int c, const char *arg) {
  switch (c) {
    case O_SERVER: n->server = arg; n->server_given = 1; return 1;
    case O_ADMIN: n->admin = arg; n->admin_given = 1; return 1;
    case O_SKEY: n->server_key = arg; return 1;
    case O_CKEY: n->client_key = arg; return 1;
    case O_TIMEOUT: return vs_cli_double("--timeout", arg, 0.1, 86400, &n->timeout_s) ? 1 : -1;
    default: return 0;
  }
}

static int vs__connect(vs_conn *c, const vs_net_opts *n, const char *endpoint, int curve) {
  char err[1024];
  /* ZeroMQ would retry quietly until our timeout: say now that nobody is there. */
  if (vs_endpoint_probe(endpoint, 2000, err, sizeof err) == 0) {
    fprintf(stderr, "vspec: cannot reach %s: %s; is vspecd (or vspec-gateway) running there?\n",
            endpoint, err);
    return -1;
  }
  vs_conn_opts o = {.server_key = curve ? n->server_key : NULL, .client_key = n->client_key};
  if (vs_conn_open(c, endpoint, &o, err, sizeof err)) {
    fprintf(stderr, "vspec: %s\n", err);
    return -1;
  }
  return 0;
}

/* Status, plugins, cancel and reload go to the admin endpoint unless only --server was given
 * (e.g. a daemon on another machine, whose admin endpoint is local to it). */
static int vs__connect_admin(vs_conn *c, const vs_net_opts *n) {
  if (n->server_given && !n->admin_given) return vs__connect(c, n, n->server, 1);
  return vs__connect(c, n, n->admin, 0);
}

static int vs__write_file(const char *path, const void *data, size_t len) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    fprintf(stderr, "vspec: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  int ok = fwrite(data, 1, len, f) == len;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path)) {
    fprintf(stderr, "vspec: cannot write %s: %s\n", path, strerror(errno));
    unlink(tmp);
    return -1;
  }
  return 0;
}

/* ---- generate -------------------------------------------------------------------------- */

static void usage_generate(FILE *f) {
  fprintf(f,
          "usage: vspec generate [options]\n"
          "\n"
          "Submits one image job to vspecd, shows its progress, writes the PNG.\n"
          "\n"
          "  --class C            class label (default 0)\n"
          "  --seed S             seed (default 0); the same seed gives the same image\n"
          "  --model NAME         a model the daemon serves (default: the daemon's default)\n"
          "  --method M           complete method: ar | sd:RULE[:PARAMS][@SCHED[:PARAMS]]\n"
          "  --accept RULE        speculative decoding with acceptance rule RULE (exact,\n"
          "                       lantern, lanternpp, uniform_rsd, coolsd, ...; continuous\n"
          "                       for continuous-token (MAR) models, with --sched-param\n"
          "                       shape=chain,depth=L: L draft steps per verification)\n"
          "  --param K=V          a parameter of the rule (repeatable), e.g. delta=0.2\n"
          "  --sched SCHED        scheduler (default standard; vvs)\n"
          "  --sched-param K=V    a parameter of the scheduler (repeatable)\n"
          "  --draft D            drafter: auto | model | head\n"
          "  --temperature T, --top-k K, --top-p P, --cfg S, --cfg-interval I\n"
          "                       sampling (default: the model's; MAR models take --cfg\n"
          "                       but not --top-k, --top-p or --cfg-interval)\n"
          "  --num-iter N         MAR models: generation steps (default: the model's)\n"
          "  --cfg-schedule S     MAR models: linear (guidance grows as the image fills in;\n"
          "                       MAR's default) | constant\n"
          "  --out FILE           output PNG (default out.png)\n"
          "  --previews DIR       write progressive previews into DIR (preview-NNN.png)\n"
          "  --preview-kind K     lut (default) | decode | tokens\n"
          "  --preview-every N    a preview every N tokens (default: the daemon's, 1/8 image)\n"
          "  --deadline MS        cancel the job if not done MS ms after acceptance\n"
          "  --priority P         -10..10, higher first (default 0)\n"
          "  --tag TEXT           a label for the daemon's log\n"
          "  --job-id N           fleet mode (a vspec-gateway): this job's id, 1 to 2^63-1; the\n"
          "                       same command again follows that job instead of starting\n"
          "                       another (after a lost connection, say); vspecd ignores it\n"
          "  --json               JSON lines on stdout: one per event, the last is the\n"
          "                       result (with stats and tokens) or the error\n"
          "  --quiet              no progress output\n"
          VS_NET_OPTIONS_HELP
          "\n"
          "Ctrl-C cancels the job. Exit status: 0 image written, 1 job failed or output not\n"
          "written, 2 usage, 3 daemon unreachable, 4 request refused as invalid, 5 busy or\n"
          "shutting down (retry later), 6 cancelled or deadline passed, 130 interrupted.\n");
}

static int vs__append_param(char *buf, size_t cap, const char *kv) {
  if (!strchr(kv, '=')) {
    fprintf(stderr, "vspec: parameter '%s' is not KEY=VALUE\n", kv);
    return -1;
  }
  size_t n = strlen(buf);
  if (n + strlen(kv) + 2 > cap) {
    fprintf(stderr, "vspec: too many parameters\n");
    return -1;
  }
  snprintf(buf + n, cap - n, "%s%s", n ? "," : "", kv);
  return 0;
}

static int cmd_generate(int argc, char **argv) {
  vs_net_opts net;
  vs__net_defaults(&net);
  Vspec__Submit sub = VSPEC__SUBMIT__INIT;
  /* The CLI's default seed is 0 (the same command, the same image); a submit without a
   * seed would get a random one from the daemon. */
  sub.has_seed = 1;
  sub.seed = 0;
  const char *out = "out.png", *previews = NULL;
  char accept_params[512] = "", sched_params[512] = "";
  int json = 0, quiet = 0, preview_kind = -1;
  long v;
  double d;
  unsigned long long u;
  enum { O_CLASS = 1, O_SEED, O_MODEL, O_METHOD, O_ACCEPT, O_PARAM, O_SCHED, O_SPARAM, O_DRAFT,
         O_TEMP, O_TOPK, O_TOPP, O_CFG, O_CFGI, O_NITER, O_CFGS, O_OUT, O_PREV, O_PKIND,
         O_PEVERY, O_DEADLINE, O_PRIO, O_TAG, O_JOBID, O_JSON, O_QUIET, O_HELP };
  static const struct option opts[] = {
      {"class", required_argument, 0, O_CLASS},   {"seed", required_argument, 0, O_SEED},
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
      {"help", no_argument, 0, O_HELP},           VS_NET_LONGOPTS,
      {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    int ok = 1, r = vs__net_opt(&net, c, optarg);
    if (r < 0) return EXIT_USAGE;
    if (r > 0) continue;
    switch (c) {
      case O_CLASS:
        if ((ok = vs_cli_long("--class", optarg, 0, 1 << 30, &v))) {
          sub.has_class_label = 1;
          sub.class_label = (int32_t)v;
        }
        break;
      case O_SEED:
        if ((ok = vs_cli_u64("--seed", optarg, &u))) {
          sub.has_seed = 1;
          sub.seed = u;
        }
        break;
      case O_MODEL: sub.model = optarg; break;
      case O_METHOD: sub.method = optarg; break;
      case O_ACCEPT: sub.accept = optarg; break;
      case O_PARAM: ok = !vs__append_param(accept_params, sizeof accept_params, optarg); break;
      case O_SCHED: sub.sched = optarg; break;
      case O_SPARAM: ok = !vs__append_param(sched_params, sizeof sched_params, optarg); break;
      case O_DRAFT: sub.draft = optarg; break;
      case O_TEMP:
        if ((ok = vs_cli_double("--temperature", optarg, 0, 100, &d))) {
          sub.has_temperature = 1;
          sub.temperature = (float)d;
        }
        break;
      case O_TOPK:
        if ((ok = vs_cli_long("--top-k", optarg, 0, 1 << 30, &v))) {
          sub.has_top_k = 1;
          sub.top_k = (int32_t)v;
        }
        break;
      case O_TOPP:
        if ((ok = vs_cli_double("--top-p", optarg, 1e-9, 1, &d))) {
          sub.has_top_p = 1;
          sub.top_p = (float)d;
        }
        break;
      case O_CFG:
        if ((ok = vs_cli_double("--cfg", optarg, 0, 100, &d))) {
          sub.has_cfg_scale = 1;
          sub.cfg_scale = (float)d;
        }
        break;
      case O_CFGI:
        if ((ok = vs_cli_long("--cfg-interval", optarg, -1, 1 << 30, &v))) {
          sub.has_cfg_interval = 1;
          sub.cfg_interval = (int32_t)v;
        }
        break;
      case O_NITER:
        if ((ok = vs_cli_long("--num-iter", optarg, 0, 1 << 20, &v))) {
          sub.has_num_iter = 1;
          sub.num_iter = (int32_t)v;
        }
        break;
      case O_CFGS:
        /* checked here too, so a typo is a usage error before anything is sent */
        if (strcmp(optarg, "linear") && strcmp(optarg, "constant")) {
          fprintf(stderr, "--cfg-schedule: '%s' is not linear or constant\n", optarg);
          ok = 0;
        }
        sub.cfg_schedule = optarg;
        break;
      case O_OUT: out = optarg; break;
      case O_PREV: previews = optarg; break;
      case O_PKIND:
        if (!strcmp(optarg, "lut")) preview_kind = VSPEC__PREVIEW_KIND__PREVIEW_LUT;
        else if (!strcmp(optarg, "decode")) preview_kind = VSPEC__PREVIEW_KIND__PREVIEW_DECODE;
        else if (!strcmp(optarg, "tokens")) preview_kind = VSPEC__PREVIEW_KIND__PREVIEW_TOKENS;
        else {
          fprintf(stderr, "--preview-kind: '%s' is not lut, decode or tokens\n", optarg);
          ok = 0;
        }
        break;
      case O_PEVERY:
        if ((ok = vs_cli_long("--preview-every", optarg, 1, 1 << 20, &v))) {
          sub.has_preview_every_tokens = 1;
          sub.preview_every_tokens = (uint32_t)v;
        }
        break;
      case O_DEADLINE:
        if ((ok = vs_cli_long("--deadline", optarg, 1, 7l * 24 * 3600 * 1000, &v))) {
          sub.has_deadline_ms = 1;
          sub.deadline_ms = (uint32_t)v;
        }
        break;
      case O_PRIO:
        if ((ok = vs_cli_long("--priority", optarg, -10, 10, &v))) {
          sub.has_priority = 1;
          sub.priority = (int32_t)v;
        }
        break;
      case O_TAG: sub.tag = optarg; break;
      case O_JOBID:
        if ((ok = vs_cli_u64("--job-id", optarg, &u)) && (u == 0 || u >> 63)) {
          fprintf(stderr, "vspec generate: --job-id %llu is not 1 to 2^63-1\n", u);
          ok = 0;
        }
        if (ok) {
          sub.has_job_id = 1;
          sub.job_id = u;
        }
        break;
      case O_JSON: json = 1; break;
      case O_QUIET: quiet = 1; break;
      case O_HELP:
      case 'h': usage_generate(stdout); return EXIT_OK;
      default: fprintf(stderr, "see vspec generate --help\n"); return EXIT_USAGE;
    }
    if (!ok) return EXIT_USAGE;
  }
  if (optind < argc) {
    fprintf(stderr, "vspec generate: unexpected argument '%s' (see --help)\n", argv[optind]);
    return EXIT_USAGE;
  }
  if (sub.method && (sub.accept || sub.sched || *accept_params || *sched_params || sub.draft)) {
    fprintf(stderr, "vspec generate: give --method or --accept/--sched/--param/--draft, not both\n");
    return EXIT_USAGE;
  }
  if (!sub.accept && (sub.sched || *accept_params || *sched_params || sub.draft)) {
    fprintf(stderr, "vspec generate: --sched, --param and --draft need --accept RULE\n");
    return EXIT_USAGE;
  }
  if (*accept_params) sub.accept_params = accept_params;
  if (*sched_params) sub.sched_params = sched_params;
  if (previews) {
    if (mkdir(previews, 0755) && errno != EEXIST) {
      fprintf(stderr, "vspec generate: cannot create %s: %s\n", previews, strerror(errno));
      return EXIT_FAIL;
    }
    if (preview_kind < 0) preview_kind = VSPEC__PREVIEW_KIND__PREVIEW_LUT;
  }
  if (preview_kind >= 0) {
    sub.has_preview = 1;
    sub.preview = preview_kind;
  }
  sub.has_credit = 1;
  sub.credit = 8;

  vs_conn conn;
  if (vs__connect(&conn, &net, net.server, 1)) return EXIT_UNREACHABLE;
  struct sigaction sa = {.sa_handler = vs__on_sigint};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  vs_progress_line pl;
  vs_progress_line_init(&pl, stderr, 0);
  Vspec__Request rq = VSPEC__REQUEST__INIT;
  rq.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  rq.submit = &sub;
  char err[1024];
  int status = EXIT_UNREACHABLE;
  double t0 = vs_now(), last = t0;
  if (vs_conn_send(&conn, &rq, NULL, 0, err, sizeof err)) {
    fprintf(stderr, "vspec: %s\n", err);
    goto done;
  }
  uint64_t job = 0, rid = rq.request_id;
  int cancel_sent = 0, n_previews = 0;
  double cancel_at = 0;
  for (;;) {
    if (vs__interrupted && job && !cancel_sent) {
      Vspec__Request cr = VSPEC__REQUEST__INIT;
      Vspec__Cancel cc = VSPEC__CANCEL__INIT;
      cc.job_id = job;
      cr.body_case = VSPEC__REQUEST__BODY_CANCEL;
      cr.cancel = &cc;
      vs_conn_send(&conn, &cr, NULL, 0, err, sizeof err);
      cancel_sent = 1;
      last = cancel_at = vs_now();
      if (!quiet && !json) vs_progress_line_note(&pl, "cancelling job %llu ...",
                                                 (unsigned long long)job);
    }
    if (vs__interrupted && !job) {
      status = EXIT_INTERRUPTED;
      goto done;
    }
    /* Heartbeats (a queued fleet job) must not keep an interrupted client waiting forever. */
    if (cancel_sent && vs_now() - cancel_at > 5.0) {
      vs_progress_line_end(&pl);
      fprintf(stderr, "vspec: no word on cancelling job %llu within 5 s; it may still run\n",
              (unsigned long long)job);
      status = EXIT_INTERRUPTED;
      goto done;
    }
    vs_conn_event e;
    int rc = vs_conn_recv(&conn, 200, &e, err, sizeof err);
    if (rc < 0) {
      vs_progress_line_end(&pl);
      fprintf(stderr, "vspec: %s\n", err);
      goto done;
    }
    double now = vs_now();
    if (rc == 0) {
      double limit = cancel_sent ? 5.0 : net.timeout_s;
      if (now - last > limit) {
        vs_progress_line_end(&pl);
        if (!job)
          fprintf(stderr, "vspec: no answer from %s within %.1f s: is vspecd running there?\n",
                  net.server, limit);
        else
          fprintf(stderr, "vspec: the daemon said nothing about job %llu for %.0f s\n",
                  (unsigned long long)job, limit);
        status = cancel_sent ? EXIT_INTERRUPTED : EXIT_UNREACHABLE;
        goto done;
      }
      continue;
    }
    last = now;
    Vspec__Event *ev = e.ev;
    int mine = (job && ev->has_job_id && ev->job_id == job) ||
               (!job && ev->has_request_id && ev->request_id == rid);
    if (!mine || ev->body_case == VSPEC__EVENT__BODY_HEARTBEAT) {
      vs_conn_event_free(&e);
      continue;
    }
    int credit = 0, finished = 0;
    switch (ev->body_case) {
      case VSPEC__EVENT__BODY_ACCEPTED: {
        const Vspec__Accepted *a = ev->accepted;
        job = ev->job_id;
        pl.job = job;
        if (json) {
          printf("{\"event\": \"accepted\", \"job\": %llu, \"queue_position\": %u, \"model\": ",
                 (unsigned long long)job, a->queue_position);
          vs__json_str(stdout, a->model);
          printf(", \"method\": ");
          vs__json_str(stdout, a->method);
          printf(", \"node\": ");
          vs__json_str(stdout, a->node);
          printf("}\n");
          fflush(stdout);
        } else if (!quiet && !a->model) {
          /* fleet mode: a gateway put the job in the queue; a daemon's Accepted follows */
          vs_progress_line_note(&pl, "job %llu queued by %s (%u job(s) waiting before it)",
                                (unsigned long long)job, a->node ? a->node : "?",
                                a->queue_position);
        } else if (!quiet) {
          vs_progress_line_note(&pl, "job %llu accepted by %s: model %s, method %s, %u tokens%s",
                                (unsigned long long)job, a->node ? a->node : "?",
                                a->model ? a->model : "?", a->method ? a->method : "?",
                                a->tokens_total, a->queue_position ? ", queued" : "");
        }
        break;
      }
      case VSPEC__EVENT__BODY_PROGRESS: {
        const Vspec__Progress *p = ev->progress;
        credit = 1;
        if (json) {
          printf("{\"event\": \"progress\", \"job\": %llu, \"seq\": %llu, \"round\": %lld, "
                 "\"tokens_done\": %u, \"tokens_total\": %u, \"tpf\": %.4f, \"mal\": %.4f, "
                 "\"elapsed_s\": %.4f, \"changed\": %zu}\n",
                 (unsigned long long)job, (unsigned long long)ev->seq, (long long)p->round,
                 p->tokens_done, p->tokens_total, p->tpf, p->mal, p->elapsed_s, p->n_positions);
          fflush(stdout);
        } else if (!quiet && p->round >= 0) {
          vs_progress_line_update(&pl, p->tokens_done, p->tokens_total, p->tpf, p->mal,
                                  now - t0);
        } else if (!quiet) {
          vs_progress_line_note(&pl, "job %llu: position %u in the queue",
                                (unsigned long long)job, p->queue_position);
        }
        break;
      }
      case VSPEC__EVENT__BODY_PREVIEW: {
        const Vspec__Preview *p = ev->preview;
        size_t len;
        const void *png = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_PNG, &len);
        credit = 1;
        char path[4200] = "";
        if (previews && png) {
          snprintf(path, sizeof path, "%s/preview-%03d.png", previews, n_previews);
          if (vs__write_file(path, png, len)) *path = 0;
        }
        n_previews++;
        if (json) {
          printf("{\"event\": \"preview\", \"job\": %llu, \"seq\": %llu, \"tokens_done\": %u, "
                 "\"tokens_total\": %u, \"file\": ",
                 (unsigned long long)job, (unsigned long long)ev->seq, p->tokens_done,
                 p->tokens_total);
          vs__json_str(stdout, path);
          printf("}\n");
          fflush(stdout);
        }
        break;
      }
      case VSPEC__EVENT__BODY_RESULT: {
        const Vspec__Result *r = ev->result;
        const Vspec__Stats *st = r->stats;
        size_t len = 0, tlen = 0;
        const void *png = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_PNG, &len);
        const uint8_t *tok = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_TOKENS_I32LE, &tlen);
        finished = 1;
        vs_progress_line_end(&pl);
        if (!png || vs__write_file(out, png, len)) {
          if (!png) fprintf(stderr, "vspec: the result carries no PNG\n");
          status = EXIT_FAIL;
          break;
        }
        status = EXIT_OK;
        double wall = now - t0;
        if (json) {
          printf("{\"event\": \"result\", \"job\": %llu, \"out\": ", (unsigned long long)job);
          vs__json_str(stdout, out);
          printf(", \"width\": %u, \"height\": %u, \"latency_s\": %.6f, \"previews\": %d",
                 r->width, r->height, wall, n_previews);
          if (st)
            printf(", \"tokens\": %llu, \"target_forwards\": %llu, \"tpf\": %.4f, \"mal\": %.4f, "
                   "\"accept_rate\": %.4f, \"generate_s\": %.6f, \"decode_s\": %.6f, "
                   "\"queue_s\": %.6f, \"preview_s\": %.6f, \"rule\": ",
                   (unsigned long long)st->tokens, (unsigned long long)st->target_forwards,
                   st->tpf, st->mal, st->accept_rate, st->generate_s, st->decode_s, st->queue_s,
                   st->preview_s);
          if (st) vs__json_str(stdout, st->rule_version);
          printf(", \"describe\": ");
          vs__json_str(stdout, r->describe);
          printf(", \"grid\": [");
          for (size_t i = 0; tok && i + 4 <= tlen; i += 4)
            printf("%s%d", i ? ", " : "",
                   (int32_t)((uint32_t)tok[i] | (uint32_t)tok[i + 1] << 8 |
                             (uint32_t)tok[i + 2] << 16 | (uint32_t)tok[i + 3] << 24));
          printf("]}\n");
          fflush(stdout);
        } else if (!quiet) {
          fprintf(stderr, "wrote %s (%ux%u): job %llu, %llu tokens, %llu target forwards, TPF "
                  "%.2f, MAL %.2f, %.3f s end to end (%.3f s generating)\n",
                  out, r->width, r->height, (unsigned long long)job,
                  st ? (unsigned long long)st->tokens : 0ull,
                  st ? (unsigned long long)st->target_forwards : 0ull, st ? st->tpf : 0,
                  st ? st->mal : 0, wall, st ? st->generate_s : 0);
        }
        break;
      }
      case VSPEC__EVENT__BODY_ERROR: {
        const Vspec__Error *x = ev->error;
        finished = 1;
        vs_progress_line_end(&pl);
        status = vs__exit_for(x->code);
        if (cancel_sent && x->code == VSPEC__ERROR_CODE__ERR_CANCELLED) status = EXIT_INTERRUPTED;
        if (json) {
          printf("{\"event\": \"error\", \"job\": %llu, \"code\": ", (unsigned long long)job);
          vs__json_str(stdout, vs_wire_error_name(x->code));
          printf(", \"message\": ");
          vs__json_str(stdout, x->message);
          if (x->has_retry_after_ms) printf(", \"retry_after_ms\": %u", x->retry_after_ms);
          printf("}\n");
          fflush(stdout);
        }
        if (!json || !quiet) {
          fprintf(stderr, "vspec: %s: %s", vs_wire_error_name(x->code), x->message);
          if (x->has_retry_after_ms) fprintf(stderr, " (retry after %u ms)", x->retry_after_ms);
          fputc('\n', stderr);
        }
        break;
      }
      case VSPEC__EVENT__BODY_RESTARTED: {
        /* Fleet mode: the daemon that had the job died; another one runs it from the start. */
        const Vspec__Restarted *x = ev->restarted;
        vs_progress_line_end(&pl);
        if (json) {
          printf("{\"event\": \"restarted\", \"job\": %llu, \"delivery\": %u, \"node\": ",
                 (unsigned long long)job, x->delivery);
          vs__json_str(stdout, x->node);
          printf("}\n");
          fflush(stdout);
        } else if (!quiet) {
          fprintf(stderr, "vspec: job %llu restarted on %s (its daemon stopped answering; run %u)\n",
                  (unsigned long long)job, x->node ? x->node : "?", x->delivery);
        }
        break;
      }
      default: break;
    }
    vs_conn_event_free(&e);
    if (finished) goto done;
    if (credit) {
      /* Flow control: one more event may come now that this one is handled. */
      Vspec__Request cr = VSPEC__REQUEST__INIT;
      Vspec__Credit cc = VSPEC__CREDIT__INIT;
      cc.job_id = job;
      cc.grant = 1;
      cr.body_case = VSPEC__REQUEST__BODY_CREDIT;
      cr.credit = &cc;
      vs_conn_send(&conn, &cr, NULL, 0, err, sizeof err);
    }
  }
done:
  vs_conn_close(&conn);
  return status;
}

/* ---- status, plugins, cancel, ping --------------------------------------------------------- */

static int vs__call(const vs_net_opts *net, int admin, Vspec__Request *rq, vs_conn_event *e,
                    vs_conn *conn) {
  char err[1024];
  if (admin ? vs__connect_admin(conn, net) : vs__connect(conn, net, net->server, 1))
    return EXIT_UNREACHABLE;
  int rc = vs_conn_call(conn, rq, (int)(net->timeout_s * 1000), e, err, sizeof err);
  if (rc <= 0) {
    if (rc == 0)
      fprintf(stderr, "vspec: no answer from %s within %.1f s: is vspecd running there?\n",
              conn->endpoint, net->timeout_s);
    else
      fprintf(stderr, "vspec: %s\n", err);
    vs_conn_close(conn);
    return EXIT_UNREACHABLE;
  }
  if (e->ev->body_case == VSPEC__EVENT__BODY_ERROR) {
    fprintf(stderr, "vspec: %s: %s\n", vs_wire_error_name(e->ev->error->code),
            e->ev->error->message);
    int code = vs__exit_for(e->ev->error->code);
    vs_conn_event_free(e);
    vs_conn_close(conn);
    return code;
  }
  return EXIT_OK;
}

static void vs__print_plugin_json(const Vspec__PluginInfo *p) {
  printf("{\"kind\": ");
  vs__json_str(stdout, p->kind);
  printf(", \"name\": ");
  vs__json_str(stdout, p->name);
  printf(", \"version\": ");
  vs__json_str(stdout, p->version);
  printf(", \"generation\": %u, \"users\": %d, \"retired_alive\": %d}", p->generation, p->users,
         p->retired_alive);
}

static void vs__print_plugin(const Vspec__PluginInfo *p) {
  printf("  %-8s %-14s %-10s generation %u, %d job(s)%s", p->kind ? p->kind : "?",
         p->name ? p->name : "?", p->version ? p->version : "?", p->generation, p->users,
         p->retired_alive ? "," : "\n");
  if (p->retired_alive) printf(" %d older generation(s) still in use\n", p->retired_alive);
}

static void usage_status(FILE *f) {
  fprintf(f,
          "usage: vspec status [options]\n"
          "\n"
          "Shows the daemon's queue, workers, models, loaded plugins with their generations,\n"
          "and totals since it started.\n"
          "\n"
          "  --json               one JSON object on stdout\n" VS_NET_OPTIONS_HELP
          "\nExit status: 0, 3 daemon unreachable.\n");
}

static int cmd_status(int argc, char **argv) {
  vs_net_opts net;
  vs__net_defaults(&net);
  int json = 0;
  enum { O_JSON = 1, O_HELP };
  static const struct option opts[] = {{"json", no_argument, 0, O_JSON},
                                       {"help", no_argument, 0, O_HELP}, VS_NET_LONGOPTS,
                                       {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    int r = vs__net_opt(&net, c, optarg);
    if (r < 0) return EXIT_USAGE;
    if (r > 0) continue;
    if (c == O_JSON) json = 1;
    else if (c == O_HELP || c == 'h') {
      usage_status(stdout);
      return EXIT_OK;
    } else { /* getopt said which option */
      fprintf(stderr, "see vspec status --help\n");
      return EXIT_USAGE;
    }
  }
  Vspec__Request rq = VSPEC__REQUEST__INIT;
  Vspec__StatusRequest sr = VSPEC__STATUS_REQUEST__INIT;
  rq.body_case = VSPEC__REQUEST__BODY_STATUS;
  rq.status = &sr;
  vs_conn conn;
  vs_conn_event e;
  int rc = vs__call(&net, 1, &rq, &e, &conn);
  if (rc) return rc;
  if (e.ev->body_case != VSPEC__EVENT__BODY_STATUS) {
    fprintf(stderr, "vspec: unexpected reply\n");
    vs_conn_event_free(&e);
    vs_conn_close(&conn);
    return EXIT_UNREACHABLE;
  }
  const Vspec__StatusReply *s = e.ev->status;
  const Vspec__Totals *t = s->totals;
  if (json) {
    printf("{\"node\": ");
    vs__json_str(stdout, s->node);
    printf(", \"queued\": %u, \"queue_capacity\": %u, \"running\": %u, \"clients\": %u, "
           "\"draining\": %s, \"default_model\": ",
           s->queued, s->queue_capacity, s->running, s->clients, s->draining ? "true" : "false");
    vs__json_str(stdout, s->default_model);
    if (s->device) {
      printf(", \"device\": {\"name\": ");
      vs__json_str(stdout, s->device->name);
      printf(", \"kind\": ");
      vs__json_str(stdout, s->device->kind);
      printf(", \"index\": %u, \"memory_used\": %llu, \"memory_total\": %llu, \"precision\": ",
             s->device->index, (unsigned long long)s->device->memory_used,
             (unsigned long long)s->device->memory_total);
      vs__json_str(stdout, s->device->precision);
      printf("}");
    }
    printf(", \"workers\": [");
    for (size_t i = 0; i < s->n_workers; i++)
      printf("%s{\"index\": %u, \"job\": %llu, \"tokens_done\": %u, \"tokens_total\": %u, "
             "\"jobs_done\": %llu}", i ? ", " : "", s->workers[i]->index,
             (unsigned long long)s->workers[i]->job_id, s->workers[i]->tokens_done,
             s->workers[i]->tokens_total, (unsigned long long)s->workers[i]->jobs_done);
    printf("]");
    if (s->fleet) {
      const Vspec__FleetInfo *f = s->fleet;
      printf(", \"fleet\": {\"redis\": ");
      vs__json_str(stdout, f->redis);
      printf(", \"stream\": ");
      vs__json_str(stdout, f->stream);
      printf(", \"length\": %llu, \"pending\": %llu, \"max_length\": %llu, \"error\": ",
             (unsigned long long)f->length, (unsigned long long)f->pending,
             (unsigned long long)f->max_length);
      if (f->error) vs__json_str(stdout, f->error);
      else printf("null");
      printf("}");
    }
    printf(", \"models\": [");
    for (size_t i = 0; i < s->n_models; i++) {
      const Vspec__ModelInfo *m = s->models[i];
      printf("%s{\"name\": ", i ? ", " : "");
      vs__json_str(stdout, m->name);
      printf(", \"dir\": ");
      vs__json_str(stdout, m->dir);
      printf(", \"generation\": %u, \"jobs\": %d, \"retired_alive\": %d, \"loaded\": %s, "
             "\"num_classes\": %u, \"grid_h\": %u, \"grid_w\": %u, \"continuous\": %s}",
             m->generation, m->jobs, m->retired_alive, m->has_grid_h ? "true" : "false",
             m->num_classes, m->grid_h, m->grid_w, m->continuous ? "true" : "false");
    }
    printf("], \"plugins\": [");
    for (size_t i = 0; i < s->n_plugins; i++) {
      if (i) printf(", ");
      vs__print_plugin_json(s->plugins[i]);
    }
    printf("]");
    if (t)
      printf(", \"totals\": {\"submitted\": %llu, \"completed\": %llu, \"failed\": %llu, "
             "\"cancelled\": %llu, \"rejected_busy\": %llu, \"clients_lost\": %llu, "
             "\"malformed\": %llu, \"tokens\": %llu, \"uptime_s\": %.3f}",
             (unsigned long long)t->submitted, (unsigned long long)t->completed,
             (unsigned long long)t->failed, (unsigned long long)t->cancelled,
             (unsigned long long)t->rejected_busy, (unsigned long long)t->clients_lost,
             (unsigned long long)t->malformed, (unsigned long long)t->tokens, t->uptime_s);
    printf("}\n");
  } else {
    printf("%s%s: %u waiting (capacity %u), %u running, %u client(s), up %.0f s\n",
           s->node ? s->node : "vspecd", s->draining ? " (draining)" : "", s->queued,
           s->queue_capacity, s->running, s->clients, t ? t->uptime_s : 0.0);
    if (s->device) {
      const Vspec__DeviceInfo *d = s->device;
      printf("device: %s, %s weights", d->name ? d->name : "?", d->precision ? d->precision : "?");
      if (d->memory_total)
        printf(", %.0f MiB of %.0f MiB in use", (double)d->memory_used / (1 << 20),
               (double)d->memory_total / (1 << 20));
      printf("\n");
    }
    if (s->fleet) {
      const Vspec__FleetInfo *f = s->fleet;
      if (f->error)
        printf("fleet: %s on %s: %s\n", f->stream ? f->stream : "?", f->redis ? f->redis : "?",
               f->error);
      else
        printf("fleet: %llu job(s) in %s (max %llu), %llu of them running, on redis %s\n",
               (unsigned long long)f->length, f->stream ? f->stream : "?",
               (unsigned long long)f->max_length, (unsigned long long)f->pending,
               f->redis ? f->redis : "?");
    }
    if (s->n_workers) printf("workers:\n");
    for (size_t i = 0; i < s->n_workers; i++) {
      const Vspec__WorkerInfo *w = s->workers[i];
      if (w->job_id)
        printf("  %u  job %llu, %u/%u tokens (%llu done before)\n", w->index,
               (unsigned long long)w->job_id, w->tokens_done, w->tokens_total,
               (unsigned long long)w->jobs_done);
      else
        printf("  %u  idle (%llu job(s) done)\n", w->index, (unsigned long long)w->jobs_done);
    }
    if (s->n_models || s->default_model)
      printf("models (default %s):\n", s->default_model ? s->default_model : "?");
    for (size_t i = 0; i < s->n_models; i++) {
      const Vspec__ModelInfo *m = s->models[i];
      if (m->has_grid_h)
        printf("  %-10s generation %u, %ux%u %stokens, %u classes, draft %s, eagle %s, %d job(s)"
               "%s  [%s]\n", m->name, m->generation, m->grid_h, m->grid_w,
               m->continuous ? "continuous " : "", m->num_classes,
               m->has_draft ? "yes" : "no", m->has_eagle ? "yes" : "no", m->jobs,
               m->retired_alive ? ", older generation in use" : "", m->dir);
      else
        printf("  %-10s not loaded  [%s]\n", m->name, m->dir);
    }
    if (s->n_plugins) printf("plugins:\n");
    for (size_t i = 0; i < s->n_plugins; i++) vs__print_plugin(s->plugins[i]);
    if (t)
      printf("totals: %llu submitted, %llu completed, %llu failed, %llu cancelled, %llu busy, "
             "%llu client(s) lost, %llu malformed, %llu tokens\n",
             (unsigned long long)t->submitted, (unsigned long long)t->completed,
             (unsigned long long)t->failed, (unsigned long long)t->cancelled,
             (unsigned long long)t->rejected_busy, (unsigned long long)t->clients_lost,
             (unsigned long long)t->malformed, (unsigned long long)t->tokens);
    /* The work by method (daemon/stats.h): TPF and MAL over all its jobs since the start. */
    if (s->n_methods) printf("methods:\n");
    for (size_t i = 0; i < s->n_methods; i++) {
      const Vspec__MethodStats *m = s->methods[i];
      printf("  %-40s %llu job(s), %llu tokens, TPF %.2f, MAL %.2f, accepted %llu of %llu "
             "drafted\n", m->method ? m->method : "?", (unsigned long long)m->jobs,
             (unsigned long long)m->tokens,
             m->target_forwards ? (double)m->tokens / (double)m->target_forwards : 0.0,
             m->rounds ? (double)m->tokens / (double)m->rounds : 0.0,
             (unsigned long long)m->accepted, (unsigned long long)m->drafted);
    }
  }
  vs_conn_event_free(&e);
  vs_conn_close(&conn);
  return EXIT_OK;
}

static void usage_plugins(FILE *f) {
  fprintf(f,
          "usage: vspec plugins list [options]\n"
          "       vspec plugins reload NAME [options]\n"
          "\n"
          "list:   the loaded plugins, their versions and generations\n"
          "reload: load a new generation of NAME (NAME, KIND/NAME or KIND_NAME; KIND = backend,\n"
          "        accept or sched) from the daemon's plugin directory while jobs run: running\n"
          "        jobs finish on the old generation, new jobs get the new one\n"
          "\n"
          "  --json               JSON on stdout\n" VS_NET_OPTIONS_HELP
          "\nExit status: 0, 2 usage, 3 daemon unreachable, 4 refused (unknown plugin, failed\n"
          "load: the old generation stays).\n");
}

static int cmd_plugins(int argc, char **argv) {
  vs_net_opts net;
  vs__net_defaults(&net);
  int json = 0;
  enum { O_JSON = 1, O_HELP };
  static const struct option opts[] = {{"json", no_argument, 0, O_JSON},
                                       {"help", no_argument, 0, O_HELP}, VS_NET_LONGOPTS,
                                       {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    int r = vs__net_opt(&net, c, optarg);
    if (r < 0) return EXIT_USAGE;
    if (r > 0) continue;
    if (c == O_JSON) json = 1;
    else if (c == O_HELP || c == 'h') {
      usage_plugins(stdout);
      return EXIT_OK;
    } else {
      fprintf(stderr, "see vspec plugins --help\n");
      return EXIT_USAGE;
    }
  }
  const char *what = optind < argc ? argv[optind] : "list";
  Vspec__Request rq = VSPEC__REQUEST__INIT;
  Vspec__PluginsRequest pr = VSPEC__PLUGINS_REQUEST__INIT;
  Vspec__ReloadRequest rr = VSPEC__RELOAD_REQUEST__INIT;
  if (!strcmp(what, "list")) {
    if (optind + 1 < argc) {
      fprintf(stderr, "vspec plugins list: unexpected argument '%s'\n", argv[optind + 1]);
      return EXIT_USAGE;
    }
    rq.body_case = VSPEC__REQUEST__BODY_PLUGINS;
    rq.plugins = &pr;
  } else if (!strcmp(what, "reload")) {
    if (optind + 2 != argc) {
      fprintf(stderr, "vspec plugins reload: give exactly one plugin NAME\n");
      return EXIT_USAGE;
    }
    rr.name = argv[optind + 1];
    rq.body_case = VSPEC__REQUEST__BODY_RELOAD;
    rq.reload = &rr;
  } else {
    fprintf(stderr, "vspec plugins: '%s' is not list or reload\n", what);
    return EXIT_USAGE;
  }
  vs_conn conn;
  vs_conn_event e;
  /* Reloading a backend reopens models: allow it a while. */
  if (rq.body_case == VSPEC__REQUEST__BODY_RELOAD && net.timeout_s < 120) net.timeout_s = 120;
  int rc = vs__call(&net, 1, &rq, &e, &conn);
  if (rc) return rc;
  if (e.ev->body_case == VSPEC__EVENT__BODY_PLUGINS) {
    const Vspec__PluginsReply *p = e.ev->plugins;
    if (json) {
      printf("{\"plugin_dir\": ");
      vs__json_str(stdout, p->plugin_dir);
      printf(", \"plugins\": [");
      for (size_t i = 0; i < p->n_plugins; i++) {
        if (i) printf(", ");
        vs__print_plugin_json(p->plugins[i]);
      }
      printf("]}\n");
    } else {
      printf("plugins in %s:\n", p->plugin_dir ? p->plugin_dir : "?");
      for (size_t i = 0; i < p->n_plugins; i++) vs__print_plugin(p->plugins[i]);
    }
  } else if (e.ev->body_case == VSPEC__EVENT__BODY_RELOAD) {
    const Vspec__ReloadReply *r = e.ev->reload;
    if (json) {
      printf("{\"plugin\": ");
      if (r->plugin) vs__print_plugin_json(r->plugin);
      else printf("null");
      printf(", \"models_reloaded\": [");
      for (size_t i = 0; i < r->n_models_reloaded; i++) {
        if (i) printf(", ");
        vs__json_str(stdout, r->models_reloaded[i]);
      }
      printf("]}\n");
    } else {
      if (r->plugin)
        printf("reloaded %s/%s: version %s, generation %u\n", r->plugin->kind, r->plugin->name,
               r->plugin->version, r->plugin->generation);
      for (size_t i = 0; i < r->n_models_reloaded; i++)
        printf("model %s reopened with it\n", r->models_reloaded[i]);
    }
  }
  vs_conn_event_free(&e);
  vs_conn_close(&conn);
  return EXIT_OK;
}

static void usage_cancel(FILE *f) {
  fprintf(f,
          "usage: vspec cancel JOB [options]\n"
          "\n"
          "Cancels job JOB (its id, as `vspec generate` and `vspec status` print it) through the\n"
          "admin endpoint. Its client gets an error event \"cancelled\".\n"
          "\n" VS_NET_OPTIONS_HELP
          "\nExit status: 0 cancelling, 2 usage, 3 daemon unreachable, 4 no such job.\n");
}

static int cmd_cancel(int argc, char **argv) {
  vs_net_opts net;
  vs__net_defaults(&net);
  enum { O_HELP = 1 };
  static const struct option opts[] = {{"help", no_argument, 0, O_HELP}, VS_NET_LONGOPTS,
                                       {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    int r = vs__net_opt(&net, c, optarg);
    if (r < 0) return EXIT_USAGE;
    if (r > 0) continue;
    if (c == O_HELP || c == 'h') {
      usage_cancel(stdout);
      return EXIT_OK;
    }
    fprintf(stderr, "see vspec cancel --help\n");
    return EXIT_USAGE;
  }
  unsigned long long id;
  if (optind + 1 != argc) {
    fprintf(stderr, "vspec cancel: give exactly one JOB id\n");
    return EXIT_USAGE;
  }
  if (!vs_cli_u64("JOB", argv[optind], &id)) return EXIT_USAGE;
  Vspec__Request rq = VSPEC__REQUEST__INIT;
  Vspec__Cancel cc = VSPEC__CANCEL__INIT;
  cc.job_id = id;
  rq.body_case = VSPEC__REQUEST__BODY_CANCEL;
  rq.cancel = &cc;
  vs_conn conn;
  vs_conn_event e;
  int rc = vs__call(&net, 1, &rq, &e, &conn);
  if (rc) return rc;
  if (e.ev->body_case == VSPEC__EVENT__BODY_ACK)
    printf("%s\n", e.ev->ack->message ? e.ev->ack->message : "ok");
  vs_conn_event_free(&e);
  vs_conn_close(&conn);
  return EXIT_OK;
}

static int cmd_ping(int argc, char **argv) {
  vs_net_opts net;
  vs__net_defaults(&net);
  int admin = 0;
  enum { O_HELP = 1, O_VIA_ADMIN };
  static const struct option opts[] = {{"help", no_argument, 0, O_HELP},
                                       {"via-admin", no_argument, 0, O_VIA_ADMIN},
                                       VS_NET_LONGOPTS, {0, 0, 0, 0}};
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    int r = vs__net_opt(&net, c, optarg);
    if (r < 0) return EXIT_USAGE;
    if (r > 0) continue;
    if (c == O_VIA_ADMIN) admin = 1;
    else if (c == O_HELP || c == 'h') {
      printf("usage: vspec ping [--via-admin] [options]\n\nOne round trip to the job endpoint "
             "(or the admin endpoint).\n\n" VS_NET_OPTIONS_HELP
             "\nExit status: 0, 3 daemon unreachable.\n");
      return EXIT_OK;
    } else {
      return EXIT_USAGE;
    }
  }
  Vspec__Request rq = VSPEC__REQUEST__INIT;
  Vspec__Ping p = VSPEC__PING__INIT;
  rq.body_case = VSPEC__REQUEST__BODY_PING;
  rq.ping = &p;
  vs_conn conn;
  vs_conn_event e;
  double t0 = vs_now();
  int rc = vs__call(&net, admin, &rq, &e, &conn);
  if (rc) return rc;
  printf("pong from %s in %.3f ms\n",
         e.ev->body_case == VSPEC__EVENT__BODY_PONG && e.ev->pong->node ? e.ev->pong->node : "?",
         (vs_now() - t0) * 1000);
  vs_conn_event_free(&e);
  vs_conn_close(&conn);
  return EXIT_OK;
}

static int cmd_keygen(int argc, char **argv) {
  const char *prefix = NULL;
  int force = 0, help = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--force")) force = 1;
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) help = 1;
    else if (argv[i][0] == '-' || prefix) {
      fprintf(stderr, "vspec keygen: unexpected '%s'; see vspec keygen --help\n", argv[i]);
      return EXIT_USAGE;
    } else prefix = argv[i];
  }
  if (help || !prefix) {
    fprintf(help ? stdout : stderr,
            "usage: vspec keygen [--force] PREFIX\n\n"
            "Writes a CURVE key pair: PREFIX.key (public and secret, mode 0600) and PREFIX.pub\n"
            "(public), and prints the public key. Give PREFIX.key to the client (--curve-key)\n"
            "or to vspecd ([curve] secret_key_file); put a client's public key on the daemon's\n"
            "allow-list ([curve] allowed_clients) and the server's public key to clients\n"
            "(--curve-server-key). Existing files are kept unless --force: a replaced key\n"
            "locks out whoever holds the old one.\n");
    return help ? EXIT_OK : EXIT_USAGE;
  }
  char path[2][1100];
  snprintf(path[0], sizeof path[0], "%s.key", prefix);
  snprintf(path[1], sizeof path[1], "%s.pub", prefix);
  for (int i = 0; i < 2 && !force; i++)
    if (access(path[i], F_OK) == 0) {
      fprintf(stderr, "vspec keygen: %s exists; --force replaces it (whoever holds the old key "
              "is locked out)\n", path[i]);
      return EXIT_FAIL;
    }
  char pub[41], err[1024];
  if (vs_curve_keygen(prefix, pub, err, sizeof err)) {
    fprintf(stderr, "vspec keygen: %s\n", err);
    return EXIT_FAIL;
  }
  fprintf(stderr, "vspec keygen: wrote %s (secret, mode 0600) and %s (public)\n", path[0],
          path[1]);
  printf("%s\n", pub);
  return EXIT_OK;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: vspec COMMAND [options]     (vspec COMMAND --help for each)\n"
          "\n"
          "  generate        submit an image job and stream its progress\n"
          "  status          queue, workers, models, plugins, totals\n"
          "  plugins list    loaded plugins with generations\n"
          "  plugins reload  hot-swap a plugin\n"
          "  cancel JOB      cancel a job\n"
          "  ping            round trip to the daemon\n"
          "  keygen PREFIX   make a CURVE key pair\n"
          "  version         the version and plugin ABI (also --version)\n"
          "\n"
          "Examples:\n"
          "  vspec generate --class 7 --accept lantern --param delta=0.2 --seed 1 --out img.png\n"
          "  vspec generate --model micro_mar --accept continuous \\\n"
          "      --sched-param shape=chain,depth=2 --num-iter 8 --out img.png   (a MAR model)\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
    vs_print_version(stdout, "vspec");
    return EXIT_OK;
  }
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    usage(stdout);
    return EXIT_OK;
  }
  if (!strcmp(cmd, "generate")) return cmd_generate(argc - 1, argv + 1);
  if (!strcmp(cmd, "status")) return cmd_status(argc - 1, argv + 1);
  if (!strcmp(cmd, "plugins")) return cmd_plugins(argc - 1, argv + 1);
  if (!strcmp(cmd, "cancel")) return cmd_cancel(argc - 1, argv + 1);
  if (!strcmp(cmd, "ping")) return cmd_ping(argc - 1, argv + 1);
  if (!strcmp(cmd, "keygen")) return cmd_keygen(argc - 1, argv + 1);
  fprintf(stderr, "vspec: unknown command '%s' (generate, status, plugins, cancel, ping, keygen, "
          "version); see vspec --help\n", cmd);
  return EXIT_USAGE;
}
