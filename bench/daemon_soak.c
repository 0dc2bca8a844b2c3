/*
 * vspecd-soak: vspecd under a long mixed load, for what only a long ds_run shows (make soak;
 * docs/RELIABILITY.md, "Soak"): jobs that fail, memory that leaks (LeakSanitizer when the
 * daemon exits, in the ASan build) or creeps (the daemon's RSS sampled through the ds_run), and
 * the latency of it all.
 *
 * The load, on the micro test model (tests/golden/micro_c2i) against a vspecd of its own (the
 * one beside this program: build/asan/ for make soak):
 *   - C clients, one thread and one connection each, ds_run N jobs in all, one at a time each:
 *     every other job AR on "micro", the rest speculative (sd:RULE@standard, a chain of 3) on
 *     "self", the micro model drafting for itself;
 *   - every K-th job's client vanishes: it closes its connection without cancelling, after the
 *     job's Accepted (the job may still be queued) or after its first progress event (it
 *     runs), alternately, and goes on with a new connection. Such a job is not a failure;
 *   - every P-th job asks for a preview (lut and decode alternately) with credit 1 and never
 *     grants more: it must still end with its result;
 *   - the admin reloads accept/RULE R times, evenly over the ds_run, while jobs hold older
 *     generations of it.
 * A job fails when it ends with an error or its client hears nothing of it for 60 s.
 *
 * When the jobs are done and the daemon idle, its status totals are read and it gets SIGTERM;
 * the ds_report (markdown, on stdout) gives the failures, the leaks LeakSanitizer found at its
 * exit, its RSS over the ds_run (first sample, after the warm-up, last, the growth after the
 * warm-up and its slope against jobs done; bench/rss_watch.h) and the latency of completed
 * jobs. Exit status 0 only with no failed job, no failed reload, no leak, no sanitizer ds_report
 * and RSS growth after the warm-up (the first tenth of the jobs) within --rss-bound-mb.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "bench/bench.h"
#include "bench/daemon_proc.h"
#include "bench/rss_watch.h"
#include "client/conn.h"
#include "core/cli_args.h"
#include "core/version.h"

#define SILENCE_MS 60000 /* a job its client hears nothing of for this long has failed */
#define SLOW_S 5.0        /* a job that takes this long is named on stderr */

typedef struct soak_opts {
  long jobs, clients, reloads, vanish_every, preview_every, workers, batch, rss_ms,
      quarantine_mb, rss_bound_mb;
  int keep;
  const char *model_dir, *rule, *rss_csv, *log_level;
} soak_opts;

typedef struct soak {
  soak_opts o;
  vs_bench_daemon d;
  double t0;
  char method_sd[128];
  void *zctx;
  atomic_int next, stop;
  atomic_long done;
  atomic_int completed, failed, vanished, previews_unpaid, preview_events_unpaid;
  atomic_int reloads_ok, reloads_failed;
  pthread_mutex_t mu; /* everything below */
  double *latency;    /* completed jobs of clients that stayed */
  int n_latency;
  char first_failure[512];
  int slowest;          /* the job with the longest latency, and it */
  double slowest_s;
  vs_rss_watch rss;
} soak;

enum { JOB_OK, JOB_FAILED, JOB_VANISHED };

static void ds_note_failure(soak *s, const char *fmt, const char *a, const char *b) {
  pthread_mutex_lock(&s->mu);
  if (!*s->first_failure) snprintf(s->first_failure, sizeof s->first_failure, fmt, a, b);
  pthread_mutex_unlock(&s->mu);
  fprintf(stderr, "vspecd-soak: ");
  fprintf(stderr, fmt, a, b);
  fputc('\n', stderr);
}

/* Job i's shape: speculative or AR, whether its client vanishes (and when), whether it is a
 * preview job that never grants credit. */
typedef struct job_shape {
  int sd, vanish, vanish_running, unpaid_preview, preview_kind;
} job_shape;

static job_shape shape_of(const soak *s, int i) {
  job_shape j = {.sd = i % 2 == 0};
  if (s->o.vanish_every > 0 && i % s->o.vanish_every == s->o.vanish_every - 1) {
    j.vanish = 1;
    j.vanish_running = (i / s->o.vanish_every) % 2;
  }
  if (s->o.preview_every > 0 && i % s->o.preview_every == 1) {
    j.unpaid_preview = 1;
    j.preview_kind = (i / s->o.preview_every) % 2 ? VSPEC__PREVIEW_KIND__PREVIEW_DECODE
                                                   : VSPEC__PREVIEW_KIND__PREVIEW_LUT;
  }
  return j;
}

/* Runs job i on c until it ends. *latency is set for JOB_OK. */
static int run_job(soak *s, vs_conn *c, int i, double *latency) {
  job_shape js = shape_of(s, i);
  Vspec__Submit sub = VSPEC__SUBMIT__INIT;
  sub.model = js.sd ? "self" : "micro";
  sub.method = js.sd ? s->method_sd : "ar";
  sub.has_seed = 1, sub.seed = (uint64_t)i;
  sub.has_class_label = 1, sub.class_label = i % 10;
  sub.has_credit = 1, sub.credit = js.unpaid_preview ? 1 : 8;
  if (js.unpaid_preview) sub.has_preview = 1, sub.preview = js.preview_kind;
  Vspec__Request r = VSPEC__REQUEST__INIT;
  r.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  r.submit = &sub;
  char err[512], what[64];
  snprintf(what, sizeof what, "job %d", i);
  double t0 = vs_bench_now();
  if (vs_conn_send(c, &r, NULL, 0, err, sizeof err)) {
    ds_note_failure(s, "%s: submit: %s", what, err);
    return JOB_FAILED;
  }
  uint64_t job = 0;
  for (;;) {
    vs_conn_event e;
    int rc = vs_conn_recv(c, SILENCE_MS, &e, err, sizeof err);
    if (rc == 0) snprintf(err, sizeof err, "no event for %d s", SILENCE_MS / 1000);
    if (rc <= 0) {
      ds_note_failure(s, "%s: %s", what, err);
      return JOB_FAILED;
    }
    Vspec__Event *ev = e.ev;
    int mine = (job && ev->has_job_id && ev->job_id == job) ||
               (!job && ev->has_request_id && ev->request_id == r.request_id);
    int outcome = -1;
    if (mine) switch (ev->body_case) {
        case VSPEC__EVENT__BODY_ACCEPTED:
          job = ev->job_id;
          if (js.vanish && !js.vanish_running) outcome = JOB_VANISHED;
          break;
        case VSPEC__EVENT__BODY_PROGRESS:
        case VSPEC__EVENT__BODY_PREVIEW:
          if (js.vanish) outcome = JOB_VANISHED;
          else if (js.unpaid_preview) atomic_fetch_add(&s->preview_events_unpaid, 1);
          else vs_bench_daemon_grant(c, job);
          break;
        case VSPEC__EVENT__BODY_RESULT:
          *latency = vs_bench_now() - t0;
          outcome = JOB_OK;
          if (*latency > SLOW_S)
            fprintf(stderr, "vspecd-soak: %s (daemon job %llu) took %.1f s, from %.1f s into "
                    "the ds_run\n", what, (unsigned long long)job, *latency, t0 - s->t0);
          break;
        case VSPEC__EVENT__BODY_ERROR:
          ds_note_failure(s, "%s failed: %s", what, ev->error->message ? ev->error->message : "?");
          outcome = JOB_FAILED;
          break;
        default: break;
      }
    vs_conn_event_free(&e);
    if (outcome >= 0) return outcome;
  }
}

static void *ds_client_main(void *arg) {
  soak *s = arg;
  vs_conn c;
  vs_conn_opts co = {.ctx = s->zctx};
  char err[512];
  if (vs_conn_open(&c, s->d.job_ep, &co, err, sizeof err)) {
    ds_note_failure(s, "client: %s%s", err, "");
    atomic_store(&s->stop, 1);
    return NULL;
  }
  for (;;) {
    int i = atomic_fetch_add(&s->next, 1);
    if (i >= s->o.jobs || atomic_load(&s->stop)) break;
    double lat = 0;
    int out = run_job(s, &c, i, &lat);
    if (out == JOB_OK) {
      atomic_fetch_add(&s->completed, 1);
      if (shape_of(s, i).unpaid_preview) atomic_fetch_add(&s->previews_unpaid, 1);
      pthread_mutex_lock(&s->mu);
      s->latency[s->n_latency++] = lat;
      if (lat > s->slowest_s) s->slowest_s = lat, s->slowest = i;
      pthread_mutex_unlock(&s->mu);
    } else if (out == JOB_FAILED) {
      atomic_fetch_add(&s->failed, 1);
    }
    if (out == JOB_VANISHED) atomic_fetch_add(&s->vanished, 1);
    atomic_fetch_add(&s->done, 1);
    /* A vanished client goes without a word, and so does one whose job failed: the next
     * job comes from a new connection either way. */
    if (out != JOB_OK) {
      vs_conn_close(&c);
      if (vs_conn_open(&c, s->d.job_ep, &co, err, sizeof err)) {
        ds_note_failure(s, "client: %s%s", err, "");
        atomic_store(&s->stop, 1);
        return NULL;
      }
    }
  }
  vs_conn_close(&c);
  return NULL;
}

/* Reload i happens once (i + 1) / (R + 1) of the jobs are done. */
static void *reloader_main(void *arg) {
  soak *s = arg;
  vs_conn c;
  vs_conn_opts co = {.ctx = s->zctx};
  char err[512], name[96];
  snprintf(name, sizeof name, "accept/%s", s->o.rule);
  if (vs_conn_open(&c, s->d.admin_ep, &co, err, sizeof err)) {
    ds_note_failure(s, "reloader: %s%s", err, "");
    return NULL;
  }
  for (long i = 0; i < s->o.reloads && !atomic_load(&s->stop); i++) {
    long at = (i + 1) * s->o.jobs / (s->o.reloads + 1);
    while (atomic_load(&s->done) < at && !atomic_load(&s->stop)) usleep(2000);
    Vspec__Request r = VSPEC__REQUEST__INIT;
    Vspec__ReloadRequest rl = VSPEC__RELOAD_REQUEST__INIT;
    rl.name = name;
    r.body_case = VSPEC__REQUEST__BODY_RELOAD;
    r.reload = &rl;
    vs_conn_event e;
    int rc = vs_conn_call(&c, &r, 30000, &e, err, sizeof err);
    if (rc == 1 && e.ev->body_case == VSPEC__EVENT__BODY_RELOAD) {
      atomic_fetch_add(&s->reloads_ok, 1);
    } else {
      atomic_fetch_add(&s->reloads_failed, 1);
      ds_note_failure(s, "reload %s: %s", name,
                   rc == 1 && e.ev->body_case == VSPEC__EVENT__BODY_ERROR ? e.ev->error->message
                   : rc == 0 ? "no reply in 30 s" : err);
    }
    if (rc == 1) vs_conn_event_free(&e);
  }
  vs_conn_close(&c);
  return NULL;
}

/* ---- the end of the ds_run: totals, the daemon's exit, its log ------------------------------ */

typedef struct soak_end {
  int have_totals;
  uint64_t submitted, completed, failed, cancelled, clients_lost;
  unsigned generation;
  int retired_alive;
  int exit_status;
  long leaked_bytes, leaked_allocs;
  int sanitizer_reports; /* ASan/UBSan errors other than leaks */
} soak_end;

/* Waits until nothing runs or waits (vanished clients' jobs are cancelled at the next round
 * or heartbeat), then reads the totals and the rule's generations. */
static void read_status(soak *s, soak_end *end) {
  vs_conn c;
  vs_conn_opts co = {.ctx = s->zctx};
  char err[512];
  if (vs_conn_open(&c, s->d.admin_ep, &co, err, sizeof err)) return;
  double until = vs_bench_now() + 30;
  for (;;) {
    Vspec__Request r = VSPEC__REQUEST__INIT;
    Vspec__StatusRequest st = VSPEC__STATUS_REQUEST__INIT;
    r.body_case = VSPEC__REQUEST__BODY_STATUS;
    r.status = &st;
    vs_conn_event e;
    if (vs_conn_call(&c, &r, 5000, &e, err, sizeof err) != 1) break;
    const Vspec__StatusReply *sr = e.ev->status;
    int idle = sr && sr->running == 0 && sr->queued == 0;
    if (sr && (idle || vs_bench_now() > until)) {
      const Vspec__Totals *t = sr->totals;
      end->have_totals = t != NULL;
      if (t) {
        end->submitted = t->submitted, end->completed = t->completed, end->failed = t->failed;
        end->cancelled = t->cancelled, end->clients_lost = t->clients_lost;
      }
      for (size_t i = 0; i < sr->n_plugins; i++) {
        const Vspec__PluginInfo *p = sr->plugins[i];
        if (p->kind && p->name && !strcmp(p->kind, "accept") && !strcmp(p->name, s->o.rule)) {
          end->generation = p->generation;
          end->retired_alive = p->retired_alive;
        }
      }
      vs_conn_event_free(&e);
      break;
    }
    vs_conn_event_free(&e);
    usleep(100000);
  }
  vs_conn_close(&c);
}

/* ---- the ds_report ------------------------------------------------------------------------ */

static int ds_report(soak *s, const soak_end *end, double wall) {
#ifdef VSPEC_SANITIZED
  const int sanitized = 1;
#else
  const int sanitized = 0;
#endif
  int failed = atomic_load(&s->failed), rfail = atomic_load(&s->reloads_failed);
  printf("## vspecd soak\n\n%ld jobs from %ld clients, %ld reloads of accept/%s; %ld worker(s), "
         "batch %ld; model %s (ar on it, %s on it drafting for itself); %s\n\n", s->o.jobs,
         s->o.clients, s->o.reloads, s->o.rule, s->o.workers, s->o.batch, s->o.model_dir,
         s->method_sd,
         sanitized ? "vspecd built with ASan+UBSan, LeakSanitizer at its exit"
                   : "vspecd without sanitizers: leaks are not checked");
  printf("| | |\n|---|---|\n");
  printf("| jobs | %d completed (%d of them previews with credit 1, never granted more: %d "
         "preview/progress events), %d vanished (client gone mid-job; not failures), **%d "
         "failed** |\n", atomic_load(&s->completed), atomic_load(&s->previews_unpaid),
         atomic_load(&s->preview_events_unpaid), atomic_load(&s->vanished), failed);
  if (*s->first_failure) printf("| first failure | %s |\n", s->first_failure);
  if (end->have_totals)
    printf("| daemon totals | submitted %llu = completed %llu + failed %llu + cancelled %llu%s; "
           "clients lost %llu |\n", (unsigned long long)end->submitted,
           (unsigned long long)end->completed, (unsigned long long)end->failed,
           (unsigned long long)end->cancelled,
           end->submitted == end->completed + end->failed + end->cancelled ? "" : " (MISMATCH)",
           (unsigned long long)end->clients_lost);
  printf("| reloads | %d ok, %d failed; accept/%s at generation %u, %d retired generation(s) still "
         "held |\n", atomic_load(&s->reloads_ok), rfail, s->o.rule, end->generation,
         end->retired_alive);
  job_shape slow = shape_of(s, s->slowest);
  printf("| latency of completed jobs | p50 %.1f ms, p99 %.1f ms, max %.1f ms (job %d: %s%s) |\n",
         vs_bench_quantile(s->latency, s->n_latency, 0.5) * 1e3,
         vs_bench_quantile(s->latency, s->n_latency, 0.99) * 1e3, s->slowest_s * 1e3, s->slowest,
         slow.sd ? "speculative" : "ar", slow.unpaid_preview ? ", preview without credit" :
         slow.vanish ? ", its client meant to vanish" : "");
  int rss_over = vs_rss_report(stdout, &s->rss, s->o.jobs / 10, s->o.rss_bound_mb * 1024, "jobs");
  if (sanitized)
    printf("| leaks at exit (LeakSanitizer) | %ld bytes in %ld allocations |\n",
           end->leaked_bytes, end->leaked_allocs);
  printf("| other sanitizer reports | %d |\n", end->sanitizer_reports);
  printf("| daemon exit status (SIGTERM, drain) | %d |\n", end->exit_status);
  printf("| wall time | %.0f s |\n", wall);
  int bad_totals = end->have_totals && (end->failed ||
                   end->submitted != end->completed + end->failed + end->cancelled);
  return failed || rfail || end->leaked_bytes || end->sanitizer_reports || end->exit_status ||
                 bad_totals || !end->have_totals || rss_over
             ? 1
             : 0;
}

/* ---- main ------------------------------------------------------------------------------ */

static void soak_usage(FILE *f) {
  fprintf(f,
          "usage: vspecd-soak [options]   (make soak: the ASan build, SOAK_JOBS=N)\n"
          "\n"
          "  --jobs N            jobs in all (default 2000)\n"
          "  --clients C         concurrent clients, one job at a time each (default 8)\n"
          "  --reloads R         admin reloads of the acceptance rule over the ds_run (default 100)\n"
          "  --rule NAME         the rule the speculative jobs use and the reloads reload\n"
          "                      (default exact)\n"
          "  --vanish-every K    every K-th job's client vanishes mid-job (default 25; 0: none)\n"
          "  --preview-every P   every P-th job asks for a preview and grants no credit\n"
          "                      (default 5; 0: none)\n"
          "  --workers W         daemon workers (default 2)\n"
          "  --batch B           the daemon's [workers] batch: cross-job batching (default 1,\n"
          "                     off; at most --workers)\n"
          "  --model-dir DIR     the model (default tests/golden/micro_c2i)\n"
          "  --rss-ms MS         RSS sampling period (default 250)\n"
          "  --rss-csv FILE      the RSS samples as CSV\n"
          "  --rss-bound-mb M    fail when the daemon's RSS grows more than M MB after the\n"
          "                      warm-up (the first tenth of the jobs; default 8)\n"
          "  --log-level L       the daemon's (default warn)\n"
          "  --keep              keep the daemon's directory (log, sockets) also when all is well\n"
          "  --quarantine-mb M   ASan's quarantine in the daemon (default 32; ASan's own 256\n"
          "                      would make the first 256 MB of freed memory look like growth)\n"
          "  --version           version and plugin ABI\n");
}

static int ds_parse_args(int argc, char **argv, soak_opts *o) {
  *o = (soak_opts){.jobs = 2000, .clients = 8, .reloads = 100, .vanish_every = 25,
                   .preview_every = 5, .workers = 2, .batch = 1, .rss_ms = 250,
                   .quarantine_mb = 32, .rss_bound_mb = 8,
                   .model_dir = "tests/golden/micro_c2i", .rule = "exact", .log_level = "warn"};
  enum { O_JOBS = 256, O_CLIENTS, O_RELOADS, O_RULE, O_VANISH, O_PREVIEW, O_WORKERS, O_MODEL,
         O_RSS, O_CSV, O_BOUND, O_QUAR, O_LOG, O_KEEP, O_BATCH, O_VERSION };
  static const struct option opts[] = {
      {"jobs", required_argument, 0, O_JOBS},          {"clients", required_argument, 0, O_CLIENTS},
      {"reloads", required_argument, 0, O_RELOADS},    {"rule", required_argument, 0, O_RULE},
      {"vanish-every", required_argument, 0, O_VANISH}, {"preview-every", required_argument, 0, O_PREVIEW},
      {"workers", required_argument, 0, O_WORKERS},    {"model-dir", required_argument, 0, O_MODEL},
      {"rss-ms", required_argument, 0, O_RSS},         {"rss-csv", required_argument, 0, O_CSV},
      {"rss-bound-mb", required_argument, 0, O_BOUND},
      {"quarantine-mb", required_argument, 0, O_QUAR}, {"log-level", required_argument, 0, O_LOG},
      {"keep", no_argument, 0, O_KEEP},                {"help", no_argument, 0, 'h'},
      {"batch", required_argument, 0, O_BATCH},        {"version", no_argument, 0, O_VERSION},
      {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    int ok = 1;
    switch (c) {
      case O_JOBS: ok = vs_cli_long("--jobs", optarg, 1, 10000000, &o->jobs); break;
      case O_CLIENTS: ok = vs_cli_long("--clients", optarg, 1, 256, &o->clients); break;
      case O_RELOADS: ok = vs_cli_long("--reloads", optarg, 0, 100000, &o->reloads); break;
      case O_RULE: o->rule = optarg; break;
      case O_VANISH: ok = vs_cli_long("--vanish-every", optarg, 0, 1000000, &o->vanish_every); break;
      case O_PREVIEW: ok = vs_cli_long("--preview-every", optarg, 0, 1000000, &o->preview_every); break;
      case O_WORKERS: ok = vs_cli_long("--workers", optarg, 1, 64, &o->workers); break;
      case O_BATCH: ok = vs_cli_long("--batch", optarg, 1, 64, &o->batch); break;
      case O_MODEL: o->model_dir = optarg; break;
      case O_RSS: ok = vs_cli_long("--rss-ms", optarg, 10, 60000, &o->rss_ms); break;
      case O_CSV: o->rss_csv = optarg; break;
      case O_BOUND: ok = vs_cli_long("--rss-bound-mb", optarg, 0, 100000, &o->rss_bound_mb); break;
      case O_QUAR: ok = vs_cli_long("--quarantine-mb", optarg, 0, 4096, &o->quarantine_mb); break;
      case O_LOG: o->log_level = optarg; break;
      case O_KEEP: o->keep = 1; break;
      case 'h': soak_usage(stdout); exit(0);
      case O_VERSION: vs_print_version(stdout, "vspecd-soak"); exit(0);
      default: soak_usage(stderr); return -1;
    }
    if (!ok) return -1;
  }
  return 0;
}

static int ds_start(soak *s) {
  static char model_dir[1100], self_dir[1300], micro[1200], self[1400], workers[16], asan[256],
      batch[48];
  if (!realpath(s->o.model_dir, model_dir)) {
    fprintf(stderr, "vspecd-soak: no model directory %s\n", s->o.model_dir);
    return -1;
  }
  s->o.model_dir = model_dir;
  if (vs_bench_self_model(&s->d, model_dir, self_dir, sizeof self_dir)) {
    fprintf(stderr, "vspecd-soak: cannot make the self-drafting model in %s\n", s->d.tmp);
    return -1;
  }
  snprintf(micro, sizeof micro, "micro=%s", model_dir);
  snprintf(self, sizeof self, "self=%s", self_dir);
  snprintf(workers, sizeof workers, "%ld", s->o.workers);
  snprintf(batch, sizeof batch, "workers.batch=%ld", s->o.batch);
  /* Ours first, so that ASAN_OPTIONS from the environment can still override them. */
  const char *user = getenv("ASAN_OPTIONS");
  snprintf(asan, sizeof asan, "ASAN_OPTIONS=detect_leaks=1:quarantine_size_mb=%ld%s%s",
           s->o.quarantine_mb, user ? ":" : "", user ? user : "");
  const char *args[] = {"--model", micro, "--model", self, "--set", "models.fmnist=",
                        "--default-model", "micro", "--workers", workers, "--threads", "1",
                        "--set", batch, "--log-level", s->o.log_level, NULL};
  const char *env[] = {asan, NULL};
  return vs_bench_daemon_start(&s->d, args, env);
}

/* Clients, the reloader and the RSS sampler against the started daemon, then its end. */
static int ds_run(soak *s) {
  s->zctx = zmq_ctx_new();
  double t0 = s->t0 = vs_bench_now();
  pthread_t *cl = calloc((size_t)s->o.clients, sizeof *cl);
  pthread_t reloader;
  if (!s->zctx || !cl || vs_rss_watch_start(&s->rss, s->d.pid, s->o.rss_ms, &s->done)) return 1;
  pthread_create(&reloader, NULL, reloader_main, s);
  for (long i = 0; i < s->o.clients; i++) pthread_create(&cl[i], NULL, ds_client_main, s);
  for (long i = 0; i < s->o.clients; i++) pthread_join(cl[i], NULL);
  free(cl);
  atomic_store(&s->done, s->o.jobs); /* the reloader's last waits end if clients stopped */
  pthread_join(reloader, NULL);
  soak_end end = {0};
  read_status(s, &end);
  atomic_store(&s->stop, 1);
  vs_rss_watch_stop(&s->rss);
  double wall = vs_bench_now() - t0;
  end.exit_status = vs_bench_daemon_stop(&s->d, 60000);
  vs_bench_daemon_scan_log(&s->d, &end.leaked_bytes, &end.leaked_allocs,
                           &end.sanitizer_reports);
  zmq_ctx_term(s->zctx);
  if (s->o.rss_csv && vs_rss_write_csv(&s->rss, s->o.rss_csv))
    fprintf(stderr, "vspecd-soak: cannot write %s\n", s->o.rss_csv);
  return ds_report(s, &end, wall);
}

int main(int argc, char **argv) {
  static soak s;
  if (ds_parse_args(argc, argv, &s.o)) return 2;
  if (vs_bench_daemon_init(&s.d, "vspecd-soak")) return 1;
  snprintf(s.method_sd, sizeof s.method_sd, "sd:%s@standard:shape=chain,depth=3", s.o.rule);
  pthread_mutex_init(&s.mu, NULL);
  s.latency = calloc((size_t)s.o.jobs, sizeof *s.latency);
  int status = !s.latency || ds_start(&s) ? 1 : ds_run(&s);
  if (status) {
    fprintf(stderr, "vspecd-soak: the daemon's log (%s) ends:\n", s.d.log);
    vs_bench_daemon_dump_log(&s.d, 40);
    vs_bench_daemon_stop(&s.d, 30000);
    fprintf(stderr, "vspecd-soak: kept %s for a look\n", s.d.tmp);
  } else if (s.o.keep) {
    fprintf(stderr, "vspecd-soak: kept %s\n", s.d.tmp);
  } else {
    vs_bench_daemon_cleanup(&s.d);
  }
  free(s.latency);
  vs_rss_watch_free(&s.rss);
  return status;
}
