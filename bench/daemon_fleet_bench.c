/*
 * vspecd-fleet-bench: what fleet mode (vspec-gateway, a Redis stream, vspecd in fleet mode)
 * costs against a direct vspecd, and whether it loses a job when its members die.
 *
 *   1. added latency: one image at a time, the same seeds and classes straight to a daemon's
 *      job endpoint and through a gateway, interleaved; end-to-end latency of each path and
 *      their paired difference;
 *   2. throughput: `jobs` jobs from two clients, one per gateway, in_flight each, first calm,
 *      then with a daemon SIGKILLed, a gateway SIGKILLed and Redis SIGKILLed and restarted
 *      from its append-only file (bench/daemon_fleet_load.h); every job must end exactly
 *      once at its client, with a result, and nothing may be left in the jobs stream.
 *
 * It starts its own redis-server, 3 daemons and 2 gateways (bench/daemon_fleet.h) on unix
 * sockets in private temporary directories and stops them all at the end, also on failure.
 * Numbers are printed as markdown; --json writes them too. Exit status 1 on any failure.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>

#include "bench/bench.h"
#include "bench/daemon_fleet.h"
#include "bench/daemon_fleet_load.h"
#include "client/conn.h"
#include "core/cli_args.h"
#include "core/version.h"

#define VS__JOB_TIMEOUT_S 60.0 /* one image of phase 1, submit to result */
#define VS__GOAL_PCT 5.0       /* the goal for the added p50 latency */

static volatile sig_atomic_t dfb_stop;
static void fb_on_signal(int sig) {
  (void)sig;
  dfb_stop = 1;
}

typedef struct dfb_opts {
  vs_bench_fleet_opts fleet;
  char model_dir[1100];
  const char *model_label, *method, *json;
  int keep;
  long images, jobs, in_flight, redis_down_ms;
} dfb_opts;

/* ---- phase 1: one image at a time ------------------------------------------------------- */

typedef struct dfb_lat {
  int n;
  double *direct, *gateway, *diff;     /* end to end, s */
  double *direct_acc, *gateway_acc;    /* submit to the daemon's Accepted, s */
} dfb_lat;

static uint64_t dfb_random_id(void) {
  uint64_t v = 0;
  while (!v)
    if (getrandom(&v, sizeof v, 0) == (ssize_t)sizeof v) v &= (1ull << 63) - 1;
  return v;
}

static int dfb_send_one(vs_conn *c, uint64_t seed, int cls, uint64_t job_id, const char *method,
                        uint64_t *rid, char *err, size_t errlen) {
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.method = (char *)method;
  s.has_seed = s.has_class_label = s.has_credit = 1;
  s.seed = seed;
  s.class_label = cls;
  s.credit = 8;
  s.has_job_id = job_id != 0; /* through a gateway: as the chaos run's clients send it */
  s.job_id = job_id;
  Vspec__Request r = VSPEC__REQUEST__INIT;
  r.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  r.submit = &s;
  if (vs_conn_send(c, &r, NULL, 0, err, errlen)) return -1;
  *rid = r.request_id;
  return 0;
}

/* One job on c until its result: latency, and the time to the daemon's Accepted (the first
 * Accepted not from a gateway). job_id 0: a direct job, whose id the daemon gives. */
static int fb_one(const vs_bench_fleet *f, vs_conn *c, uint64_t seed, int cls, uint64_t job_id,
                  const char *method, double *lat, double *to_acc, char *err, size_t errlen) {
  uint64_t rid, job = job_id;
  double t0 = vs_bench_now();
  if (dfb_send_one(c, seed, cls, job_id, method, &rid, err, errlen)) return -1;
  *to_acc = -1;
  for (;;) {
    if (dfb_stop || vs_bench_now() - t0 > VS__JOB_TIMEOUT_S) {
      snprintf(err, errlen, dfb_stop ? "interrupted" : "no result within %.0f s",
               VS__JOB_TIMEOUT_S);
      return -1;
    }
    vs_conn_event e;
    int rc = vs_conn_recv(c, 1000, &e, err, errlen);
    if (rc < 0) return -1;
    if (rc == 0) continue;
    const Vspec__Event *ev = e.ev;
    double now = vs_bench_now();
    int ours = (job && ev->has_job_id && ev->job_id == job) ||
               (ev->has_request_id && ev->request_id == rid);
    int done = 0;
    if (ours) switch (ev->body_case) {
        case VSPEC__EVENT__BODY_ACCEPTED:
          if (!job) job = ev->job_id;
          if (*to_acc < 0 && !vs_bench_fleet_is_gateway(f, ev->accepted->node))
            *to_acc = now - t0;
          break;
        case VSPEC__EVENT__BODY_PROGRESS:
        case VSPEC__EVENT__BODY_PREVIEW: vs_bench_daemon_grant(c, job); break;
        case VSPEC__EVENT__BODY_RESULT:
          *lat = now - t0;
          done = 1;
          break;
        case VSPEC__EVENT__BODY_ERROR:
          snprintf(err, errlen, "job failed: %s", ev->error->message);
          done = -1;
          break;
        default: break;
      }
    vs_conn_event_free(&e);
    if (done) return done > 0 ? 0 : -1;
  }
}

typedef struct dfb_conns {
  vs_conn d[VS_BENCH_FLEET_DAEMONS], gw[VS_BENCH_FLEET_GATEWAYS];
  int n_d, n_gw;
} dfb_conns;

static void dfb_conns_close(dfb_conns *c) {
  for (int i = 0; i < c->n_d; i++) vs_conn_close(&c->d[i]);
  for (int i = 0; i < c->n_gw; i++) vs_conn_close(&c->gw[i]);
}

static int dfb_conns_open(dfb_conns *c, const vs_bench_fleet *f, char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  for (; c->n_d < VS_BENCH_FLEET_DAEMONS; c->n_d++)
    if (vs_conn_open(&c->d[c->n_d], f->d[c->n_d].job_ep, NULL, err, errlen)) return -1;
  for (; c->n_gw < VS_BENCH_FLEET_GATEWAYS; c->n_gw++)
    if (vs_conn_open(&c->gw[c->n_gw], f->gw_ep[c->n_gw], NULL, err, errlen)) return -1;
  return 0;
}

/* Weights paged in on every daemon, the gateways' and the agents' first Redis commands. */
static int dfb_warm_up(const vs_bench_fleet *f, dfb_conns *c, const char *method, char *err,
                       size_t errlen) {
  double lat, acc;
  for (int i = 0; i < VS_BENCH_FLEET_DAEMONS; i++)
    if (fb_one(f, &c->d[i], 900 + (uint64_t)i, 1, 0, method, &lat, &acc, err, errlen))
      return -1;
  for (int i = 0; i < 2 * VS_BENCH_FLEET_GATEWAYS; i++)
    if (fb_one(f, &c->gw[i % VS_BENCH_FLEET_GATEWAYS], 910 + (uint64_t)i, 1, dfb_random_id(),
               method, &lat, &acc, err, errlen))
      return -1;
  return 0;
}

/* Image i: seed i, class i mod 10, straight to daemon i mod 3 and through gateway i mod 2,
 * the two in alternating order so that drift spreads over both paths alike. */
static int dfb_latency(const vs_bench_fleet *f, const dfb_opts *o, dfb_lat *l, char *err,
                       size_t errlen) {
  dfb_conns c;
  int rc = dfb_conns_open(&c, f, err, errlen);
  if (!rc) rc = dfb_warm_up(f, &c, o->method, err, errlen);
  for (int i = 0; !rc && i < l->n; i++) {
    int cls = i % 10;
    vs_conn *direct = &c.d[i % VS_BENCH_FLEET_DAEMONS], *gw = &c.gw[i % VS_BENCH_FLEET_GATEWAYS];
    for (int k = 0; !rc && k < 2; k++) {
      if ((k + i) % 2 == 0)
        rc = fb_one(f, direct, (uint64_t)i, cls, 0, o->method, &l->direct[i], &l->direct_acc[i],
                    err, errlen);
      else
        rc = fb_one(f, gw, (uint64_t)i, cls, dfb_random_id(), o->method, &l->gateway[i],
                    &l->gateway_acc[i], err, errlen);
    }
    l->diff[i] = l->gateway[i] - l->direct[i];
  }
  dfb_conns_close(&c);
  return rc;
}

/* ---- the report ------------------------------------------------------------------------- */

static double dfb_q(const double *v, int n, double q) { return vs_bench_quantile(v, n, q); }

static double dfb_added_pct(const dfb_lat *l) {
  double d = dfb_q(l->direct, l->n, 0.5);
  return d > 0 ? dfb_q(l->diff, l->n, 0.5) / d * 100 : 0;
}

static void dfb_print_latency(const dfb_lat *l) {
  int n = l->n;
  printf("### 1. latency added by the queue (%d images, one at a time, direct and through a "
         "gateway interleaved, same seeds and classes)\n\n", n);
  printf("| path | p50 | p99 | submit to the daemon's Accepted, p50 | p99 |\n"
         "|---|---|---|---|---|\n");
  printf("| direct to a vspecd (its job endpoint) | %.2f ms | %.2f ms | %.2f ms | %.2f ms |\n",
         dfb_q(l->direct, n, 0.5) * 1e3, dfb_q(l->direct, n, 0.99) * 1e3,
         dfb_q(l->direct_acc, n, 0.5) * 1e3, dfb_q(l->direct_acc, n, 0.99) * 1e3);
  printf("| through vspec-gateway and Redis | %.2f ms | %.2f ms | %.2f ms | %.2f ms |\n",
         dfb_q(l->gateway, n, 0.5) * 1e3, dfb_q(l->gateway, n, 0.99) * 1e3,
         dfb_q(l->gateway_acc, n, 0.5) * 1e3, dfb_q(l->gateway_acc, n, 0.99) * 1e3);
  printf("| paired difference (gateway - direct, same image) | %+.2f ms | %+.2f ms | | |\n",
         dfb_q(l->diff, n, 0.5) * 1e3, dfb_q(l->diff, n, 0.99) * 1e3);
  double pct = dfb_added_pct(l);
  printf("\nadded latency at p50: %+.2f ms, %+.1f %% of the direct p50 image time (goal under "
         "%.0f %%: %s)\n\n", dfb_q(l->diff, n, 0.5) * 1e3, pct, VS__GOAL_PCT,
         pct < VS__GOAL_PCT ? "met" : "missed");
}

static void dfb_print_run_row(const char *name, const vs_bench_load_result *r) {
  printf("| %s | %.2f | %.1f ms | %.1f ms | %d | %d | %d | %d | %lld / %lld | %d | %d | %d |\n",
         name, r->jobs_per_s, r->p50_s * 1e3, r->p99_s * 1e3, r->results, r->errors, r->lost,
         r->duplicated, r->left, r->pending, r->restarted, r->resubmitted, r->retried_jobs);
}

static void dfb_print_chaos(const vs_bench_load_result *r) {
  const vs_bench_chaos_log *c = &r->chaos;
  printf("\nchaos: vspecd %s (holding %d job(s) in Redis) SIGKILLed after %d jobs ended (t = "
         "%.2f s) and started again; vspec-gateway gw0 SIGKILLed after %d (t = %.2f s) and "
         "started again, its client sent its %d unfinished jobs again through gw1; redis-server "
         "SIGKILLed after %d (t = %.2f s), started again from its append-only file at t = %.2f "
         "s, accepting connections at t = %.2f s; %d submits answered unavailable and %d busy "
         "meanwhile, each sent again after %d ms.\n", c->daemon, c->daemon_jobs, c->daemon_at,
         c->daemon_t, c->gateway_at, c->gateway_t, c->gateway_jobs, c->redis_at, c->redis_t,
         c->redis_restart_t, c->redis_up_t, r->unavailable, r->busy, VS_BENCH_LOAD_RETRY_MS);
  if (r->left >= 0)
    printf("The jobs stream was seen %s %.2f s after the last result.\n",
           r->left || r->pending ? "still holding jobs" : "empty", r->drain_s);
}

static void dfb_print_runs(const dfb_opts *o, const vs_bench_load_result *calm,
                           const vs_bench_load_result *chaos) {
  printf("### 2. throughput, and no job lost (%ld jobs from 2 clients, one per gateway, %ld in "
         "flight each, client-chosen job ids)\n\n", o->jobs, o->in_flight);
  printf("| run | jobs/s | p50 latency | p99 latency | results | errors | lost | duplicated | "
         "left in the stream / pending | restarted | resubmitted | retried after unavailable |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  dfb_print_run_row("calm", calm);
  if (chaos) dfb_print_run_row("chaos", chaos);
  if (chaos) dfb_print_chaos(chaos);
  /* A restarted job whose first daemon died before writing its Accepted shows one run. */
  printf("\nfrom each job's events in Redis: runs (a daemon's Accepted) calm %d, chaos %d; jobs "
         "run by a second daemon: %d, %d; of those, without a Restarted event before the second "
         "run: %d, %d\n\n", calm->runs, chaos ? chaos->runs : 0, calm->ran_again,
         chaos ? chaos->ran_again : 0, calm->ran_again_unexplained,
         chaos ? chaos->ran_again_unexplained : 0);
}

static json_t *dfb_json_chaos(const vs_bench_chaos_log *c) {
  return json_pack("{s:s, s:i, s:i, s:f, s:i, s:f, s:i, s:i, s:f, s:f, s:f}", "daemon", c->daemon,
                   "daemon_jobs", c->daemon_jobs, "daemon_at", c->daemon_at, "daemon_t",
                   c->daemon_t, "gateway_at", c->gateway_at, "gateway_t", c->gateway_t,
                   "gateway_jobs", c->gateway_jobs, "redis_at", c->redis_at, "redis_t",
                   c->redis_t, "redis_restart_t", c->redis_restart_t, "redis_up_t",
                   c->redis_up_t);
}

static json_t *dfb_json_run(const vs_bench_load_result *r) {
  json_t *o = json_pack("{s:i, s:f, s:f, s:f, s:f, s:I, s:I, s:f, s:b, s:b, s:s}", "jobs",
                        r->jobs, "wall_s", r->wall_s, "jobs_per_s", r->jobs_per_s, "p50_ms",
                        r->p50_s * 1e3, "p99_ms", r->p99_s * 1e3, "left_in_stream",
                        (json_int_t)r->left, "pending", (json_int_t)r->pending, "drain_s",
                        r->drain_s, "stalled", r->stalled, "interrupted", r->interrupted,
                        "first_error", r->first_error);
  const struct {
    const char *name;
    int v;
  } counts[] = {{"results", r->results},     {"errors", r->errors},
                {"lost", r->lost},           {"duplicated", r->duplicated},
                {"restarted", r->restarted}, {"resubmitted", r->resubmitted},
                {"retried_jobs", r->retried_jobs}, {"unavailable", r->unavailable},
                {"busy", r->busy},           {"runs", r->runs},
                {"ran_again", r->ran_again}, {"ran_again_unexplained", r->ran_again_unexplained}};
  for (size_t i = 0; o && i < sizeof counts / sizeof *counts; i++)
    json_object_set_new(o, counts[i].name, json_integer(counts[i].v));
  if (o) json_object_set_new(o, "chaos", dfb_json_chaos(&r->chaos));
  return o;
}

static json_t *dfb_json_latency(const dfb_lat *l) {
  int n = l->n;
  json_t *o = json_pack("{s:i, s:f}", "images", n, "diff_p50_pct_of_direct", dfb_added_pct(l));
  const struct {
    const char *name;
    const double *v;
  } series[] = {{"direct", l->direct},           {"gateway", l->gateway},
                {"diff", l->diff},               {"direct_accepted", l->direct_acc},
                {"gateway_accepted", l->gateway_acc}};
  for (size_t i = 0; o && i < sizeof series / sizeof *series; i++) {
    char key[64];
    snprintf(key, sizeof key, "%s_p50_ms", series[i].name);
    json_object_set_new(o, key, json_real(dfb_q(series[i].v, n, 0.5) * 1e3));
    snprintf(key, sizeof key, "%s_p99_ms", series[i].name);
    json_object_set_new(o, key, json_real(dfb_q(series[i].v, n, 0.99) * 1e3));
  }
  return o;
}

static int dfb_write_json(const dfb_opts *o, const vs_bench_fleet *f, const dfb_lat *l,
                          const vs_bench_load_result *calm, const vs_bench_load_result *chaos,
                          int pass, const char *why) {
  json_t *root = json_pack(
      "{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:i, s:i, s:b, s:s}", "model",
      o->model_label, "method", o->method, "daemons", VS_BENCH_FLEET_DAEMONS, "gateways",
      VS_BENCH_FLEET_GATEWAYS, "workers", o->fleet.workers, "threads", o->fleet.threads,
      "claim_idle_ms", o->fleet.claim_idle_ms, "redis_version", f->redis.version, "appendfsync",
      o->fleet.appendfsync, "in_flight", (int)o->in_flight, "redis_down_ms",
      (int)o->redis_down_ms, "pass", pass, "fail_reasons", why);
  if (!root) return -1;
  if (l) json_object_set_new(root, "latency", dfb_json_latency(l));
  if (calm) json_object_set_new(root, "calm", dfb_json_run(calm));
  if (chaos) json_object_set_new(root, "chaos", dfb_json_run(chaos));
  int rc = json_dump_file(root, o->json, JSON_INDENT(2)) ? -1 : 0;
  json_decref(root);
  if (rc) fprintf(stderr, "vspecd-fleet-bench: cannot write %s\n", o->json);
  return rc;
}

/* ---- options ---------------------------------------------------------------------------- */

static void fb_usage(FILE *f) {
  fprintf(f,
          "usage: vspecd-fleet-bench [options]\n"
          "\n"
          "Starts its own redis-server (append-only file on), 3 vspecd in fleet mode and 2\n"
          "vspec-gateway, all on unix sockets in private temporary directories, and measures\n"
          "(1) the latency fleet mode adds to one image against a direct vspecd and (2) jobs/s\n"
          "with 2 clients, calm, then while a daemon, a gateway and Redis are SIGKILLed and\n"
          "started again: every job must end once, with a result (else FAIL, exit status 1).\n"
          "redis-server comes from $VSPEC_REDIS_SERVER or PATH.\n"
          "\n"
          "  --model DIR          model directory (default models/fmnist)\n"
          "  --method M           decoding method (default ar)\n"
          "  --threads N          compute threads per daemon worker (default 1)\n"
          "  --workers N          workers per daemon (default 1)\n"
          "  --images N           images of the latency phase, per path (default 40)\n"
          "  --jobs M             jobs per throughput run (default 300)\n"
          "  --in-flight K        jobs in flight per client (default 4)\n"
          "  --claim-idle-ms N    [fleet] claim_idle_ms of the daemons (default 2000); their\n"
          "                       heartbeat_ms is a third of it\n"
          "  --appendfsync P      redis-server's appendfsync: always (default) or everysec\n"
          "  --redis-down-ms N    how long Redis stays down in the chaos run (default 1000)\n"
          "  --json FILE          also write the figures as JSON\n"
          "  --keep               leave the temporary directories (logs, the append-only\n"
          "                       file) and name them on stderr\n"
          "  --quick              a smoke run: 6 images, 40 jobs (unless given)\n"
          "  --version            version and plugin ABI\n");
}

static int dfb_model_dir(dfb_opts *o, const char *model) {
  char cwd[900], probe[1200];
  if (!getcwd(cwd, sizeof cwd)) return -1;
  snprintf(o->model_dir, sizeof o->model_dir, "%s%s%s", model[0] == '/' ? "" : cwd,
           model[0] == '/' ? "" : "/", model);
  snprintf(probe, sizeof probe, "%s/vspec-model.json", o->model_dir);
  struct stat sb;
  if (stat(probe, &sb)) {
    fprintf(stderr, "vspecd-fleet-bench: %s is not a model directory (no vspec-model.json)\n",
            model);
    return -1;
  }
  o->model_label = model;
  o->fleet.model_dir = o->model_dir;
  return 0;
}

/* What the options set before they are checked together. */
typedef struct dfb_raw {
  long threads, workers, claim;
  int quick, have_images, have_jobs;
  const char *model;
} dfb_raw;

enum { O_MODEL = 256, O_METHOD, O_THREADS, O_WORKERS, O_IMAGES, O_JOBS, O_INFLIGHT, O_CLAIM,
       O_FSYNC, O_DOWN, O_JSON, O_QUICK, O_KEEP, O_VERSION };

/* One option; 0 when its value is refused (message printed). */
static int dfb_option(int c, const char *arg, dfb_opts *o, dfb_raw *w) {
  switch (c) {
    case O_MODEL: w->model = arg; return 1;
    case O_METHOD: o->method = arg; return 1;
    case O_THREADS: return vs_cli_long("--threads", arg, 1, 256, &w->threads);
    case O_WORKERS: return vs_cli_long("--workers", arg, 1, 64, &w->workers);
    case O_IMAGES: w->have_images = 1; return vs_cli_long("--images", arg, 1, 100000, &o->images);
    case O_JOBS: w->have_jobs = 1; return vs_cli_long("--jobs", arg, 8, 100000, &o->jobs);
    case O_INFLIGHT: return vs_cli_long("--in-flight", arg, 1, 16, &o->in_flight);
    case O_CLAIM: return vs_cli_long("--claim-idle-ms", arg, 300, 3600000, &w->claim);
    case O_DOWN: return vs_cli_long("--redis-down-ms", arg, 0, 600000, &o->redis_down_ms);
    case O_FSYNC:
      o->fleet.appendfsync = arg;
      if (!strcmp(arg, "always") || !strcmp(arg, "everysec")) return 1;
      fprintf(stderr, "--appendfsync: always or everysec\n");
      return 0;
    case O_JSON: o->json = arg; return 1;
    case O_QUICK: w->quick = 1; return 1;
    case O_KEEP: o->keep = 1; return 1;
    default: return 0;
  }
}

/* Returns 0, 1 (--help or --version: done) or 2 (usage error). */
static int fb_parse(int argc, char **argv, dfb_opts *o) {
  static const struct option opts[] = {
      {"model", required_argument, 0, O_MODEL},
      {"method", required_argument, 0, O_METHOD},
      {"threads", required_argument, 0, O_THREADS},
      {"workers", required_argument, 0, O_WORKERS},
      {"images", required_argument, 0, O_IMAGES},
      {"jobs", required_argument, 0, O_JOBS},
      {"in-flight", required_argument, 0, O_INFLIGHT},
      {"claim-idle-ms", required_argument, 0, O_CLAIM},
      {"appendfsync", required_argument, 0, O_FSYNC},
      {"redis-down-ms", required_argument, 0, O_DOWN},
      {"json", required_argument, 0, O_JSON},
      {"quick", no_argument, 0, O_QUICK},
      {"keep", no_argument, 0, O_KEEP},
      {"help", no_argument, 0, 'h'},
      {"version", no_argument, 0, O_VERSION},
      {0, 0, 0, 0}};
  dfb_raw w = {.threads = 1, .workers = 1, .claim = 2000, .model = "models/fmnist"};
  o->images = 40, o->jobs = 300, o->in_flight = 4, o->redis_down_ms = 1000;
  o->method = "ar";
  o->fleet.appendfsync = "always";
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    if (c == 'h' || c == O_VERSION) {
      if (c == 'h') fb_usage(stdout);
      else vs_print_version(stdout, "vspecd-fleet-bench");
      return 1;
    }
    if (c == '?') {
      fprintf(stderr, "see vspecd-fleet-bench --help\n"); /* getopt said which */
      return 2;
    }
    if (!dfb_option(c, optarg, o, &w)) return 2;
  }
  if (optind < argc) {
    fprintf(stderr, "vspecd-fleet-bench: unexpected argument '%s' (see --help)\n", argv[optind]);
    return 2;
  }
  if (w.quick && !w.have_images) o->images = 6;
  if (w.quick && !w.have_jobs) o->jobs = 40;
  o->fleet.threads = (int)w.threads;
  o->fleet.workers = (int)w.workers;
  o->fleet.claim_idle_ms = (int)w.claim;
  return dfb_model_dir(o, w.model) ? 2 : 0;
}

/* ---- main ------------------------------------------------------------------------------- */

static void fb_header(const dfb_opts *o, const vs_bench_fleet *f) {
  double load = -1;
  FILE *la = fopen("/proc/loadavg", "r");
  if (la) {
    if (fscanf(la, "%lf", &load) != 1) load = -1;
    fclose(la);
  }
  printf("## vspecd fleet benchmark\n\nmodel: %s; method %s; fleet: %d vspecd (%d worker(s) x "
         "%d compute thread(s) each, [fleet] claim_idle_ms = %d), %d vspec-gateway, "
         "redis-server %s (append-only file, appendfsync %s), all on unix sockets; progress "
         "streamed and acknowledged as the CLI does; %ld cores, load average %.2f at the "
         "start\n\n", o->model_label, o->method, VS_BENCH_FLEET_DAEMONS, o->fleet.workers,
         o->fleet.threads, o->fleet.claim_idle_ms, VS_BENCH_FLEET_GATEWAYS, f->redis.version,
         o->fleet.appendfsync, sysconf(_SC_NPROCESSORS_ONLN), load);
  fflush(stdout);
}

static int dfb_lat_alloc(dfb_lat *l, int n) {
  l->n = n;
  double **v[] = {&l->direct, &l->gateway, &l->diff, &l->direct_acc, &l->gateway_acc};
  for (int i = 0; i < 5; i++)
    if (!(*v[i] = calloc((size_t)n, sizeof(double)))) return -1;
  return 0;
}

static void dfb_lat_free(dfb_lat *l) {
  free(l->direct);
  free(l->gateway);
  free(l->diff);
  free(l->direct_acc);
  free(l->gateway_acc);
}

/* One throughput run; 0 when it ran to its end (passed or not: *pass). */
static int dfb_throughput(vs_bench_fleet *f, const dfb_opts *o, int chaos,
                          vs_bench_load_result *res, int *pass, char *why, size_t whylen) {
  vs_bench_load_opts lo = {.jobs = (int)o->jobs, .in_flight = (int)o->in_flight,
                           .chaos = chaos, .redis_down_s = o->redis_down_ms / 1000.0,
                           .stall_s = 60, .seed0 = 10000, .method = o->method, .stop = &dfb_stop};
  char err[VSPEC_ERRLEN];
  if (vs_bench_load_run(f, &lo, res, err, sizeof err)) {
    snprintf(why, whylen, "%s run: %s", chaos ? "chaos" : "calm", err);
    *pass = 0;
    return -1;
  }
  char w[1024];
  if (!vs_bench_load_passed(res, w, sizeof w)) {
    size_t n = strlen(why);
    snprintf(why + n, whylen - n, "%s%s run: %s", n ? "; " : "", chaos ? "chaos" : "calm", w);
    *pass = 0;
  }
  return 0;
}

int main(int argc, char **argv) {
  dfb_opts o;
  memset(&o, 0, sizeof o);
  int prc = fb_parse(argc, argv, &o);
  if (prc) return prc == 1 ? 0 : 2;
  struct sigaction sa = {.sa_handler = fb_on_signal};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  static vs_bench_fleet f;
  static vs_bench_load_result calm, chaos;
  dfb_lat lat = {0};
  char err[VSPEC_ERRLEN], why[2048] = "";
  int pass = 1, have_lat = 0, have_calm = 0, have_chaos = 0;
  if (dfb_lat_alloc(&lat, (int)o.images)) {
    snprintf(why, sizeof why, "out of memory");
    pass = 0;
    goto done;
  }
  if (vs_bench_fleet_start(&f, &o.fleet, err, sizeof err)) {
    snprintf(why, sizeof why, "setup: %s", err);
    pass = 0;
    goto done;
  }
  fb_header(&o, &f);
  if (dfb_latency(&f, &o, &lat, err, sizeof err)) {
    snprintf(why, sizeof why, "latency phase: %s", err);
    pass = 0;
    goto done;
  }
  have_lat = 1;
  dfb_print_latency(&lat);
  fflush(stdout);
  have_calm = !dfb_throughput(&f, &o, 0, &calm, &pass, why, sizeof why);
  if (have_calm && !dfb_stop)
    have_chaos = !dfb_throughput(&f, &o, 1, &chaos, &pass, why, sizeof why);
  if (have_calm) dfb_print_runs(&o, &calm, have_chaos ? &chaos : NULL);
  if (have_calm && !have_chaos && pass) {
    snprintf(why, sizeof why, "the chaos run did not run");
    pass = 0;
  }
done:
  if (!pass) vs_bench_fleet_dump_logs(&f);
  if (o.json && dfb_write_json(&o, &f, have_lat ? &lat : NULL, have_calm ? &calm : NULL,
                               have_chaos ? &chaos : NULL, pass, why))
    pass = 0;
  if (pass)
    printf("PASS: every job ended exactly once at its client, with a result; nothing left in "
           "the jobs stream\n");
  else {
    printf("FAIL: %s\n", why);
    fprintf(stderr, "vspecd-fleet-bench: FAIL: %s\n", why);
  }
  if (vs_bench_fleet_stop(&f, o.keep)) fprintf(stderr, "vspecd-fleet-bench: cleanup incomplete\n");
  dfb_lat_free(&lat);
  return pass ? 0 : 1;
}
