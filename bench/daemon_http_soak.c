/*
 * vspecd-http-soak: vspecd's HTTP endpoint under a long mixed load with hostile clients in it
 * (make soak-http; issue 32; docs/RELIABILITY.md, "HTTP soak"). What only a long dhs_run shows:
 * a legitimate job that fails among the hostile ones, a malformed request that is not refused,
 * a slow client the request deadline does not cut, memory that creeps (the daemon's RSS after
 * the warm-up, bench/rss_watch.h) or leaks (LeakSanitizer at its exit, in the ASan build).
 *
 * The load, on the micro test model against a vspecd of its own (the one beside this program:
 * build/asan/ for make soak-http) with [http] on a free loopback port:
 *   - C client threads dhs_run N legitimate jobs, one at a time each, every one a POST
 *     /v1/images/generations on a connection of its own (PNG back): every other one AR on
 *     "micro", the rest speculative on "self" (the micro model drafting for itself); every
 *     U-th one through curl, every S-th one trickled in 8 pieces 100 ms apart (slow, but
 *     within the deadline: it must succeed too);
 *   - before every K-th job its client sends one that it abandons mid-job: a raw request
 *     closed (or reset) 5-50 ms after it was sent, or curl with --max-time 0.05, in turn;
 *   - before every M-th job its client sends a malformed request (the list below), which
 *     must get a 4xx;
 *   - T more connections trickle a request head one byte per 100 ms all through the dhs_run:
 *     each must be closed by the daemon's request deadline (set to --deadline-ms) and is
 *     then opened again.
 * A legitimate job fails when its answer is not a 200 with a PNG within 60 s. Every wait is
 * bounded, and the whole dhs_run by --max-seconds. At the end the daemon must be idle and
 * answer /health; its /metrics counts are read, it gets SIGTERM (by pid), and the dhs_report
 * (markdown, stdout) gives the counts, the latency of legitimate jobs, the daemon's RSS, the
 * leaks at its exit. Exit status 0 only when all of it holds.
 */
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/daemon_proc.h"
#include "bench/http_raw.h"
#include "bench/rss_watch.h"
#include "core/cli_args.h"
#include "core/version.h"

#define JOB_S 60.0      /* a legitimate job not answered in this long has failed */
#define REPLY_CAP (4u << 20)
#define MAX_TRICKLERS 8
#define GEN "/v1/images/generations"

typedef struct hs_opts {
  long jobs, clients, disconnect_every, slow_every, malformed_every, curl_every, tricklers,
      deadline_ms, workers, rss_ms, rss_bound_mb, quarantine_mb, max_seconds;
  int keep;
  const char *model_dir, *log_level;
} hs_opts;

/* The malformed requests, sent in turn. Each must be refused with a 4xx; the status each
 * gets is reported (docs/RELIABILITY.md, "Strict request parsing", says which and why). */
typedef struct malformed {
  const char *what, *head; /* head: lines after the request line, each ending in \r\n */
  const char *body;        /* sent after the blank line; NULL: none */
  const char *line;        /* the request line; NULL: a POST of GEN */
  size_t len;              /* of head + body when it holds a NUL, else 0 */
} malformed;

#define OK_BODY "{\"model\":\"micro\",\"class\":1,\"method\":\"ar\",\"response_format\":\"png\"}"
#define CL(n) "Content-Length: " #n "\r\n"
static const malformed bad[] = {
    {"two different Content-Lengths", CL(65) CL(5), OK_BODY, NULL, 0},
    {"Transfer-Encoding with Content-Length", "Transfer-Encoding: chunked\r\n" CL(65), OK_BODY,
     NULL, 0},
    {"JSON cut short", CL(12), "{\"class\": 1,", NULL, 0},
    {"not JSON", CL(9), "class=1&x", NULL, 0},
    {"a JSON array", CL(5), "[1,2]", NULL, 0},
    {"a control character in a header value", "X-A: a\001b\r\n" CL(65), OK_BODY, NULL, 0},
    {"DEL in a header value", "X-A: a\177b\r\n" CL(65), OK_BODY, NULL, 0},
    {"a space before the colon", "X-A : b\r\n" CL(65), OK_BODY, NULL, 0},
    {"Expect: 999-nonsense", "Expect: 999-nonsense\r\n" CL(65), OK_BODY, NULL, 0},
    {"class as a string", CL(13), "{\"class\":\"1\"}", NULL, 0},
    {"an unknown model", CL(16), "{\"model\":\"nope\"}", NULL, 0},
    {"an unknown method", CL(26), "{\"method\":\"sd:nosuchrule\"}", NULL, 0},
    {"a body over max_body_bytes", CL(1000000), "{", NULL, 0},
    {"an unknown path", "", NULL, "GET /v1/nothing HTTP/1.1\r\n", 0},
    {"GET on the generation path", "", NULL, "GET " GEN " HTTP/1.1\r\n", 0},
    {"a NUL in a header name", "X-\0A: b\r\n", NULL, "GET /health HTTP/1.1\r\n", 9},
};
#define N_BAD (int)(sizeof bad / sizeof bad[0])

typedef struct hsoak {
  hs_opts o;
  vs_bench_daemon d;
  int port;
  double t0, until;
  atomic_int next, stop;
  atomic_long done; /* legitimate jobs done, the RSS watch's clock */
  atomic_int ok, failed, slow_ok, curl_ok, vanished, bad_ok, bad_wrong, hostile_lost;
  atomic_int trickles_cut, trickles_late, trickles_early;
  pthread_mutex_t mu; /* everything below */
  double *latency, *latency_slow;
  int n_latency, n_latency_slow;
  double trickle_min, trickle_max; /* how long trickling connections lived, s */
  int bad_status[N_BAD];
  char first_failure[512];
  vs_rss_watch rss;
} hsoak;

static void dhs_note_failure(hsoak *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void dhs_note_failure(hsoak *s, const char *fmt, ...) {
  char m[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&s->mu);
  if (!*s->first_failure) snprintf(s->first_failure, sizeof s->first_failure, "%s", m);
  pthread_mutex_unlock(&s->mu);
  fprintf(stderr, "vspecd-http-soak: %s\n", m);
}

/* ---- legitimate jobs ------------------------------------------------------------------- */

/* Job i's body: AR on micro or speculative on self; one image as a raw PNG, or n of them as
 * JSON (a PNG answer holds one image). */
static void job_body(int i, int n, char *b, size_t len) {
  int sd = i % 2 == 1;
  snprintf(b, len, "{\"model\":\"%s\",\"class\":%d,\"method\":\"%s\",\"seed\":%d,\"n\":%d%s}",
           sd ? "self" : "micro", i % 10, sd ? "sd:exact@standard:shape=chain,depth=3" : "ar", i,
           n, n == 1 ? ",\"response_format\":\"png\"" : "");
}

static int job_request(int port, const char *body, char *req, size_t len) {
  return snprintf(req, len, "POST " GEN " HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close"
                  "\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", port,
                  strlen(body), body);
}

static int is_png(const char *p, const char *end) {
  static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  return p && end - p > 8 && !memcmp(p, sig, 8);
}

/* A legitimate job over a raw socket, its request sent in `pieces` 100 ms apart. Returns 0
 * (latency in *lat) or -1 (the reason in why). */
static int raw_job(hsoak *s, int i, int pieces, double *lat, char *why, size_t wlen) {
  char body[256], req[600];
  job_body(i, 1, body, sizeof body);
  size_t n = (size_t)job_request(s->port, body, req, sizeof req);
  double t0 = vs_bench_now();
  int fd = vs_raw_connect(s->port);
  if (fd < 0) return snprintf(why, wlen, "cannot connect"), -1;
  for (int k = 0; k < pieces; k++) {
    size_t a = n * (size_t)k / (size_t)pieces, b = n * (size_t)(k + 1) / (size_t)pieces;
    if (k) usleep(100000);
    if (vs_raw_send(fd, req + a, b - a, 5)) {
      close(fd);
      return snprintf(why, wlen, "send failed after %zu of %zu bytes", a, n), -1;
    }
  }
  size_t len = 0;
  int closed;
  char *r = vs_raw_read_all(fd, JOB_S, REPLY_CAP, &len, &closed);
  close(fd);
  int st = r ? vs_raw_final_status(r, len) : 0;
  int png = r && is_png(vs_raw_body(r, len), r + len);
  if (st != 200 || !png) {
    const char *b = r ? vs_raw_body(r, len) : NULL;
    snprintf(why, wlen, "status %d%s after %.1f s: %.200s", st, png ? "" : ", no PNG",
             vs_bench_now() - t0, b ? b : "(nothing)");
  }
  free(r);
  *lat = vs_bench_now() - t0;
  return st == 200 && png ? 0 : -1;
}

/* Runs a shell command line; its first line of output in out. Returns the exit status. */
static int run_cmd(const char *cmd, char *out, size_t len) {
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  if (!fgets(out, (int)len, p)) *out = 0;
  char sink[256];
  while (fgets(sink, sizeof sink, p)) {}
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A legitimate job through curl (a real client: its own framing, Expect, timing). */
static int curl_job(hsoak *s, int i, double *lat, char *why, size_t wlen) {
  char body[256], cmd[800], out[128];
  job_body(i, 1, body, sizeof body);
  snprintf(cmd, sizeof cmd, "curl -sS -o /dev/null --max-time %.0f -H 'Content-Type: "
           "application/json' --data-binary '%s' -w '%%{http_code} %%{size_download} "
           "%%{content_type}' http://127.0.0.1:%d" GEN " 2>&1", JOB_S, body, s->port);
  double t0 = vs_bench_now();
  int rc = run_cmd(cmd, out, sizeof out);
  *lat = vs_bench_now() - t0;
  long size = 0;
  int code = 0;
  if (rc == 0 && sscanf(out, "%d %ld", &code, &size) == 2 && code == 200 && size > 8 &&
      strstr(out, "image/png"))
    return 0;
  snprintf(why, wlen, "curl exit %d: %s", rc, out);
  return -1;
}

/* A job's end; the latency of a trickled one (its 0.7 s of sending) is kept apart. */
static void job_done(hsoak *s, int i, int rc, double lat, const char *how, const char *why,
                     int trickled) {
  if (rc) {
    atomic_fetch_add(&s->failed, 1);
    dhs_note_failure(s, "job %d (%s): %s", i, how, why);
    return;
  }
  atomic_fetch_add(&s->ok, 1);
  pthread_mutex_lock(&s->mu);
  if (trickled) s->latency_slow[s->n_latency_slow++] = lat;
  else s->latency[s->n_latency++] = lat;
  pthread_mutex_unlock(&s->mu);
}

/* ---- hostile clients ------------------------------------------------------------------- */

/* A client that gives up mid-job: raw (closed or reset 5-50 ms after its request) or curl
 * timing out, in turn. Its job is cancelled by the daemon; only a failed connect counts
 * against the dhs_run (the daemon is gone or refused a legitimate connection). */
static void vanish(hsoak *s, int i) {
  char body[256], req[600], cmd[800], out[128];
  job_body(i, 4, body, sizeof body);
  int turn = i / (int)s->o.disconnect_every;
  if (turn % 3 == 2) {
    snprintf(cmd, sizeof cmd, "curl -s -o /dev/null --max-time 0.05 -H 'Content-Type: "
             "application/json' --data-binary '%s' http://127.0.0.1:%d" GEN, body, s->port);
    int rc = run_cmd(cmd, out, sizeof out);
    if (rc == 28 || rc == 0) atomic_fetch_add(&s->vanished, 1); /* 28: timed out */
    else atomic_fetch_add(&s->hostile_lost, 1), dhs_note_failure(s, "vanishing curl: exit %d", rc);
    return;
  }
  size_t n = (size_t)job_request(s->port, body, req, sizeof req);
  int fd = vs_raw_connect(s->port);
  if (fd < 0 || vs_raw_send(fd, req, n, 5)) {
    if (fd >= 0) close(fd);
    atomic_fetch_add(&s->hostile_lost, 1);
    dhs_note_failure(s, "vanishing client %d: cannot connect or send", i);
    return;
  }
  usleep((useconds_t)(5 + (turn * 15) % 46) * 1000);
  if (turn % 3 == 0) vs_raw_reset(fd);
  else close(fd);
  atomic_fetch_add(&s->vanished, 1);
}

static void send_malformed(hsoak *s, int i) {
  int k = (i / (int)s->o.malformed_every) % N_BAD;
  const malformed *m = &bad[k];
  char req[1024];
  int n = snprintf(req, sizeof req, "%sHost: x\r\nConnection: close\r\n%s%s",
                   m->line ? m->line : "POST " GEN " HTTP/1.1\r\n",
                   m->body ? "Content-Type: application/json\r\n" : "", m->len ? "" : m->head);
  if (m->len) memcpy(req + n, m->head, m->len), n += (int)m->len; /* holds a NUL */
  n += snprintf(req + n, sizeof req - (size_t)n, "\r\n%s", m->body ? m->body : "");
  int fd = vs_raw_connect(s->port), st = 0, closed;
  size_t len = 0;
  if (fd >= 0 && !vs_raw_send(fd, req, (size_t)n, 5)) {
    char *r = vs_raw_read_all(fd, 10, 65536, &len, &closed);
    st = r ? vs_raw_final_status(r, len) : 0;
    free(r);
  }
  if (fd >= 0) close(fd);
  pthread_mutex_lock(&s->mu);
  s->bad_status[k] = st;
  pthread_mutex_unlock(&s->mu);
  if (st >= 400 && st < 500) {
    atomic_fetch_add(&s->bad_ok, 1);
  } else {
    atomic_fetch_add(&s->bad_wrong, 1);
    dhs_note_failure(s, "malformed request (%s): status %d, expected a 4xx", m->what, st);
  }
}

static void *dhs_client_main(void *arg) {
  hsoak *s = arg;
  for (;;) {
    int i = atomic_fetch_add(&s->next, 1);
    if (i >= s->o.jobs || atomic_load(&s->stop)) break;
    if (vs_bench_now() > s->until) {
      dhs_note_failure(s, "--max-seconds %ld passed with %d jobs not dhs_run", s->o.max_seconds,
                   (int)s->o.jobs - i);
      atomic_store(&s->stop, 1);
      break;
    }
    if (s->o.disconnect_every && i % s->o.disconnect_every == s->o.disconnect_every / 2)
      vanish(s, i);
    if (s->o.malformed_every && i % s->o.malformed_every == s->o.malformed_every - 1)
      send_malformed(s, i);
    char why[512] = "";
    double lat = 0;
    int rc;
    if (s->o.curl_every && i % s->o.curl_every == 5 % s->o.curl_every) {
      rc = curl_job(s, i, &lat, why, sizeof why);
      job_done(s, i, rc, lat, "curl", why, 0);
      if (!rc) atomic_fetch_add(&s->curl_ok, 1);
    } else if (s->o.slow_every && i % s->o.slow_every == 3 % s->o.slow_every) {
      rc = raw_job(s, i, 8, &lat, why, sizeof why);
      job_done(s, i, rc, lat, "slow, 8 pieces", why, 1);
      if (!rc) atomic_fetch_add(&s->slow_ok, 1);
    } else {
      rc = raw_job(s, i, 1, &lat, why, sizeof why);
      job_done(s, i, rc, lat, "raw", why, 0);
    }
    atomic_fetch_add(&s->done, 1);
  }
  return NULL;
}

/* ---- connections that trickle past the deadline ---------------------------------------- */

static const char trickle[] = "POST " GEN " HTTP/1.1\r\nHost: x\r\nX-Padding: "
                              "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";

/* Connection k is gone: how long it lived, against the deadline. */
static void trickle_ended(hsoak *s, double life) {
  double d = s->o.deadline_ms / 1000.0;
  pthread_mutex_lock(&s->mu);
  if (s->trickle_min == 0 || life < s->trickle_min) s->trickle_min = life;
  if (life > s->trickle_max) s->trickle_max = life;
  pthread_mutex_unlock(&s->mu);
  if (life > d + 1.5) {
    atomic_fetch_add(&s->trickles_late, 1);
    dhs_note_failure(s, "a trickling connection lived %.2f s, past the deadline of %.1f s", life, d);
  } else if (life < d - 0.2) {
    atomic_fetch_add(&s->trickles_early, 1); /* displaced by a newcomer: allowed, counted */
  } else {
    atomic_fetch_add(&s->trickles_cut, 1);
  }
}

static void *trickler_main(void *arg) {
  hsoak *s = arg;
  int n = (int)s->o.tricklers, fd[MAX_TRICKLERS];
  size_t sent[MAX_TRICKLERS];
  double born[MAX_TRICKLERS];
  for (int k = 0; k < n; k++) fd[k] = -1;
  while (!atomic_load(&s->stop) && vs_bench_now() < s->until) {
    for (int k = 0; k < n; k++) {
      if (fd[k] < 0) {
        fd[k] = vs_raw_connect(s->port), sent[k] = 0, born[k] = vs_bench_now();
        if (fd[k] < 0) {
          atomic_fetch_add(&s->hostile_lost, 1);
          dhs_note_failure(s, "a trickling client cannot connect");
          continue;
        }
      }
      const char *c = trickle + sent[k] % (sizeof trickle - 1);
      if (vs_raw_send(fd[k], c, 1, 0.05) || vs_raw_closed_within(fd[k], 0)) {
        trickle_ended(s, vs_bench_now() - born[k]);
        close(fd[k]);
        fd[k] = -1;
        continue;
      }
      sent[k]++;
    }
    usleep(100000);
  }
  for (int k = 0; k < n; k++)
    if (fd[k] >= 0) close(fd[k]);
  return NULL;
}

/* ---- the end of the dhs_run: idle, /health, /metrics, the daemon's exit -------------------- */

typedef struct hs_end {
  int health;       /* /health's status at the end */
  int idle;         /* nothing running or queued */
  double submitted, completed, failed, cancelled, rejected;
  double cut_deadline, displaced, refused_per_address, refused_busy;
  int exit_status;
  long leaked_bytes, leaked_allocs;
  int sanitizer_reports;
} hs_end;

/* A GET over a fresh connection: the status, the whole answer in *out (malloc'd). */
static int http_get(int port, const char *path, char **out) {
  char req[256];
  int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                   path);
  int fd = vs_raw_connect(port), st = 0, closed;
  size_t len = 0;
  *out = NULL;
  if (fd < 0) return 0;
  if (!vs_raw_send(fd, req, (size_t)n, 5)) {
    *out = vs_raw_read_all(fd, 10, REPLY_CAP, &len, &closed);
    st = *out ? vs_raw_final_status(*out, len) : 0;
  }
  close(fd);
  return st;
}

/* One sample of /metrics text, or -1. */
static double metric(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text ? strstr(text, series) : NULL; p; p = strstr(p + 1, series))
    if ((p == text || p[-1] == '\n') && p[n] == ' ') return strtod(p + n + 1, NULL);
  return -1;
}

/* Waits (at most 30 s) until the daemon runs and queues nothing (abandoned jobs are
 * cancelled as their connections are found gone), then reads its counts. */
static void read_end(hsoak *s, hs_end *e) {
  char *m = NULL;
  double until = vs_bench_now() + 30;
  for (;;) {
    free(m);
    if (http_get(s->port, "/metrics", &m) == 200 && metric(m, "vspec_jobs_running") == 0 &&
        metric(m, "vspec_jobs_queued") == 0) {
      e->idle = 1;
      break;
    }
    if (vs_bench_now() > until) break;
    usleep(100000);
  }
  e->submitted = metric(m, "vspec_jobs_total{state=\"submitted\"}");
  e->completed = metric(m, "vspec_jobs_total{state=\"completed\"}");
  e->failed = metric(m, "vspec_jobs_total{state=\"failed\"}");
  e->cancelled = metric(m, "vspec_jobs_total{state=\"cancelled\"}");
  e->rejected = metric(m, "vspec_jobs_total{state=\"rejected\"}");
  e->cut_deadline = metric(m, "vspec_http_connections_closed_total{reason=\"deadline\"}");
  e->displaced = metric(m, "vspec_http_connections_closed_total{reason=\"displaced\"}");
  e->refused_per_address =
      metric(m, "vspec_http_connections_refused_total{reason=\"per_address\"}");
  e->refused_busy = metric(m, "vspec_http_connections_refused_total{reason=\"busy\"}");
  free(m);
  char *h = NULL;
  e->health = http_get(s->port, "/health", &h);
  free(h);
}

/* ---- the dhs_report ------------------------------------------------------------------------ */

static void report_load(const hsoak *s) {
  printf("## vspecd HTTP soak\n\n%ld legitimate jobs from %ld clients (every other one AR on "
         "micro, the rest sd:exact@standard:shape=chain,depth=3 on it drafting for itself; every "
         "%ld-th through curl, every %ld-th trickled in 8 pieces over 0.7 s), with before every "
         "%ld-th a client that abandons its job mid-way and before every %ld-th a malformed "
         "request; %ld connections trickling a byte per 100 ms all along; [http] "
         "request_deadline_ms %ld, max_connections 16; %ld worker(s); %s\n\n",
         s->o.jobs, s->o.clients, s->o.curl_every, s->o.slow_every, s->o.disconnect_every,
         s->o.malformed_every, s->o.tricklers, s->o.deadline_ms, s->o.workers,
#ifdef VSPEC_SANITIZED
         "vspecd built with ASan+UBSan, LeakSanitizer at its exit"
#else
         "vspecd without sanitizers: leaks are not checked"
#endif
  );
}

static void report_malformed(const hsoak *s) {
  printf("| malformed requests | %d refused with a 4xx, **%d not** (", atomic_load(&s->bad_ok),
         atomic_load(&s->bad_wrong));
  for (int k = 0; k < N_BAD; k++)
    printf("%s%s %d", k ? ", " : "", bad[k].what, s->bad_status[k]);
  printf(") |\n");
}

static int dhs_report(hsoak *s, const hs_end *e, double wall) {
  report_load(s);
  int failed = atomic_load(&s->failed), ok = atomic_load(&s->ok);
  printf("| | |\n|---|---|\n");
  printf("| legitimate jobs | %d ok (%d through curl, %d trickled within the deadline), **%d "
         "failed**, %ld not dhs_run |\n", ok, atomic_load(&s->curl_ok), atomic_load(&s->slow_ok),
         failed, s->o.jobs - ok - failed);
  if (*s->first_failure) printf("| first failure | %s |\n", s->first_failure);
  printf("| abandoned jobs | %d (clients gone mid-job; not failures) |\n",
         atomic_load(&s->vanished));
  report_malformed(s);
  printf("| trickling connections | %d cut by the deadline (lived %.2f to %.2f s), %d closed "
         "earlier (displaced), **%d past the deadline** |\n", atomic_load(&s->trickles_cut),
         s->trickle_min, s->trickle_max, atomic_load(&s->trickles_early),
         atomic_load(&s->trickles_late));
  printf("| refused or closed by the daemon (/metrics) | deadline %.0f, displaced %.0f, "
         "per-address %.0f, busy %.0f |\n", e->cut_deadline, e->displaced,
         e->refused_per_address, e->refused_busy);
  printf("| daemon jobs (/metrics) | submitted %.0f = completed %.0f + failed %.0f + cancelled "
         "%.0f%s; rejected %.0f |\n", e->submitted, e->completed, e->failed, e->cancelled,
         e->submitted == e->completed + e->failed + e->cancelled ? "" : " (MISMATCH)",
         e->rejected);
  printf("| latency of legitimate jobs (connect to the last byte) | p50 %.1f ms, p99 %.1f ms, "
         "max %.1f ms; the %d trickled ones: p50 %.1f ms, max %.1f ms |\n",
         vs_bench_quantile(s->latency, s->n_latency, 0.5) * 1e3,
         vs_bench_quantile(s->latency, s->n_latency, 0.99) * 1e3,
         vs_bench_quantile(s->latency, s->n_latency, 1) * 1e3, s->n_latency_slow,
         vs_bench_quantile(s->latency_slow, s->n_latency_slow, 0.5) * 1e3,
         vs_bench_quantile(s->latency_slow, s->n_latency_slow, 1) * 1e3);
  int rss_over = vs_rss_report(stdout, &s->rss, s->o.jobs / 10, s->o.rss_bound_mb * 1024, "jobs");
  printf("| at the end | %s, /health %d |\n", e->idle ? "idle" : "**still busy after 30 s**",
         e->health);
#ifdef VSPEC_SANITIZED
  printf("| leaks at exit (LeakSanitizer) | %ld bytes in %ld allocations |\n", e->leaked_bytes,
         e->leaked_allocs);
#endif
  printf("| other sanitizer reports | %d |\n", e->sanitizer_reports);
  printf("| daemon exit status (SIGTERM by pid) | %d |\n", e->exit_status);
  printf("| wall time | %.0f s |\n", wall);
  return failed || ok != s->o.jobs || atomic_load(&s->bad_wrong) ||
                 atomic_load(&s->trickles_late) || atomic_load(&s->hostile_lost) || rss_over ||
                 !e->idle || e->health != 200 || e->exit_status || e->leaked_bytes ||
                 e->sanitizer_reports || e->failed != 0
             ? 1
             : 0;
}

/* ---- main ------------------------------------------------------------------------------ */

static void dhs_usage(FILE *f) {
  fprintf(f,
          "dhs_usage: vspecd-http-soak [options]   (make soak-http: the ASan build, SOAK_HTTP_JOBS=N)\n"
          "\n"
          "  --jobs N              legitimate jobs in all (default 2000)\n"
          "  --clients C           concurrent clients, one job at a time each (default 6)\n"
          "  --disconnect-every K  before every K-th job, one abandoned mid-job (default 20; 0: none)\n"
          "  --malformed-every M   before every M-th job, a malformed request (default 10; 0: none)\n"
          "  --slow-every S        every S-th job trickled in 8 pieces over 0.7 s (default 20)\n"
          "  --curl-every U        every U-th job through curl (default 10; 0: none)\n"
          "  --tricklers T         connections trickling past the deadline all along (default 3,\n"
          "                        at most %d)\n"
          "  --deadline-ms MS      the daemon's [http] request_deadline_ms (default 2000)\n"
          "  --workers W           daemon workers (default 2)\n"
          "  --model-dir DIR       the model (default tests/golden/micro_c2i)\n"
          "  --rss-ms MS           RSS sampling period (default 250)\n"
          "  --rss-bound-mb M      fail when the daemon's RSS grows more than M MB after the\n"
          "                        warm-up (the first tenth of the jobs; default 8)\n"
          "  --quarantine-mb M     ASan's quarantine in the daemon (default 32)\n"
          "  --max-seconds S       the whole dhs_run at most (default 900)\n"
          "  --log-level L         the daemon's (default warn)\n"
          "  --keep                keep the daemon's directory (log) also when all is well\n"
          "  --version             version and plugin ABI\n", MAX_TRICKLERS);
}

static int dhs_parse_args(int argc, char **argv, hs_opts *o) {
  *o = (hs_opts){.jobs = 2000, .clients = 6, .disconnect_every = 20, .malformed_every = 10,
                 .slow_every = 20, .curl_every = 10, .tricklers = 3, .deadline_ms = 2000,
                 .workers = 2, .rss_ms = 250, .rss_bound_mb = 8, .quarantine_mb = 32,
                 .max_seconds = 900, .model_dir = "tests/golden/micro_c2i", .log_level = "warn"};
  static const struct {
    const char *name;
    long lo, hi;
    size_t off;
  } nums[] = {{"jobs", 1, 10000000, offsetof(hs_opts, jobs)},
              {"clients", 1, 12, offsetof(hs_opts, clients)},
              {"disconnect-every", 0, 1000000, offsetof(hs_opts, disconnect_every)},
              {"malformed-every", 0, 1000000, offsetof(hs_opts, malformed_every)},
              {"slow-every", 0, 1000000, offsetof(hs_opts, slow_every)},
              {"curl-every", 0, 1000000, offsetof(hs_opts, curl_every)},
              {"tricklers", 0, MAX_TRICKLERS, offsetof(hs_opts, tricklers)},
              {"deadline-ms", 500, 60000, offsetof(hs_opts, deadline_ms)},
              {"workers", 1, 64, offsetof(hs_opts, workers)},
              {"rss-ms", 10, 60000, offsetof(hs_opts, rss_ms)},
              {"rss-bound-mb", 0, 100000, offsetof(hs_opts, rss_bound_mb)},
              {"quarantine-mb", 0, 4096, offsetof(hs_opts, quarantine_mb)},
              {"max-seconds", 10, 86400, offsetof(hs_opts, max_seconds)}};
  enum { N_NUMS = sizeof nums / sizeof nums[0], O_MODEL = 256, O_LOG, O_KEEP, O_VERSION };
  struct option opts[N_NUMS + 6] = {{0}};
  for (int k = 0; k < N_NUMS; k++) opts[k] = (struct option){nums[k].name, required_argument, 0, k};
  opts[N_NUMS] = (struct option){"model-dir", required_argument, 0, O_MODEL};
  opts[N_NUMS + 1] = (struct option){"log-level", required_argument, 0, O_LOG};
  opts[N_NUMS + 2] = (struct option){"keep", no_argument, 0, O_KEEP};
  opts[N_NUMS + 3] = (struct option){"version", no_argument, 0, O_VERSION};
  opts[N_NUMS + 4] = (struct option){"help", no_argument, 0, 'h'};
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    char flag[64];
    if (c >= 0 && c < N_NUMS) {
      snprintf(flag, sizeof flag, "--%s", nums[c].name);
      if (!vs_cli_long(flag, optarg, nums[c].lo, nums[c].hi,
                       (long *)((char *)o + nums[c].off)))
        return -1;
      continue;
    }
    switch (c) {
      case O_MODEL: o->model_dir = optarg; break;
      case O_LOG: o->log_level = optarg; break;
      case O_KEEP: o->keep = 1; break;
      case 'h': dhs_usage(stdout); return 1;
      case O_VERSION: vs_print_version(stdout, "vspecd-http-soak"); return 1;
      default: dhs_usage(stderr); return -1;
    }
  }
  /* the clients, two hostile connections of theirs at most, the tricklers and curl stay
   * under max_connections (16), so that displacing never hits a legitimate client */
  if (o->clients * 2 + o->tricklers > 16) {
    fprintf(stderr, "vspecd-http-soak: --clients x 2 + --tricklers must be at most 16 "
            "(the daemon's max_connections)\n");
    return -1;
  }
  return 0;
}

static int dhs_start(hsoak *s) {
  static char model_dir[1100], self_dir[1300], micro[1200], self[1400], workers[16], asan[256],
      listen[64], deadline[64];
  if (!realpath(s->o.model_dir, model_dir)) {
    fprintf(stderr, "vspecd-http-soak: no model directory %s\n", s->o.model_dir);
    return -1;
  }
  if (vs_bench_self_model(&s->d, model_dir, self_dir, sizeof self_dir)) {
    fprintf(stderr, "vspecd-http-soak: cannot make the self-drafting model in %s\n", s->d.tmp);
    return -1;
  }
  s->port = vs_raw_free_port();
  if (!s->port) {
    fprintf(stderr, "vspecd-http-soak: no free loopback port\n");
    return -1;
  }
  snprintf(micro, sizeof micro, "micro=%s", model_dir);
  snprintf(self, sizeof self, "self=%s", self_dir);
  snprintf(workers, sizeof workers, "%ld", s->o.workers);
  snprintf(listen, sizeof listen, "http.listen=127.0.0.1:%d", s->port);
  snprintf(deadline, sizeof deadline, "http.request_deadline_ms=%ld", s->o.deadline_ms);
  const char *user = getenv("ASAN_OPTIONS");
  snprintf(asan, sizeof asan, "ASAN_OPTIONS=detect_leaks=1:quarantine_size_mb=%ld%s%s",
           s->o.quarantine_mb, user ? ":" : "", user ? user : "");
  const char *args[] = {"--model", micro, "--model", self, "--set", "models.fmnist=",
                        "--default-model", "micro", "--workers", workers, "--threads", "1",
                        "--set", listen, "--set", deadline, "--set", "http.max_connections=16",
                        "--set", "http.timeout_ms=60000", "--log-level", s->o.log_level, NULL};
  const char *env[] = {asan, NULL};
  s->d.die_with_parent = 1;
  return vs_bench_daemon_start(&s->d, args, env);
}

/* Clients, tricklers and the RSS watch against the started daemon, then its end. */
static int dhs_run(hsoak *s) {
  double t0 = s->t0 = vs_bench_now();
  s->until = t0 + (double)s->o.max_seconds;
  pthread_t *cl = calloc((size_t)s->o.clients, sizeof *cl), trickler;
  if (!cl || vs_rss_watch_start(&s->rss, s->d.pid, s->o.rss_ms, &s->done)) return 1;
  pthread_create(&trickler, NULL, trickler_main, s);
  for (long i = 0; i < s->o.clients; i++) pthread_create(&cl[i], NULL, dhs_client_main, s);
  for (long i = 0; i < s->o.clients; i++) pthread_join(cl[i], NULL);
  free(cl);
  atomic_store(&s->stop, 1);
  pthread_join(trickler, NULL);
  hs_end e = {0};
  read_end(s, &e);
  vs_rss_watch_stop(&s->rss);
  double wall = vs_bench_now() - t0;
  e.exit_status = vs_bench_daemon_stop(&s->d, 60000);
  vs_bench_daemon_scan_log(&s->d, &e.leaked_bytes, &e.leaked_allocs, &e.sanitizer_reports);
  return dhs_report(s, &e, wall);
}

int main(int argc, char **argv) {
  static hsoak s;
  int rc = dhs_parse_args(argc, argv, &s.o);
  if (rc) return rc > 0 ? 0 : 2;
  signal(SIGPIPE, SIG_IGN);
  if (vs_bench_daemon_init(&s.d, "vspecd-http-soak")) return 1;
  pthread_mutex_init(&s.mu, NULL);
  s.latency = calloc((size_t)s.o.jobs, sizeof *s.latency);
  s.latency_slow = calloc((size_t)s.o.jobs, sizeof *s.latency_slow);
  int status = !s.latency || !s.latency_slow || dhs_start(&s) ? 1 : dhs_run(&s);
  if (status) {
    fprintf(stderr, "vspecd-http-soak: the daemon's log (%s) ends:\n", s.d.log);
    vs_bench_daemon_dump_log(&s.d, 40);
    vs_bench_daemon_stop(&s.d, 30000);
    fprintf(stderr, "vspecd-http-soak: kept %s for a look\n", s.d.tmp);
  } else if (s.o.keep) {
    fprintf(stderr, "vspecd-http-soak: kept %s\n", s.d.tmp);
  } else {
    vs_bench_daemon_cleanup(&s.d);
  }
  free(s.latency);
  free(s.latency_slow);
  vs_rss_watch_free(&s.rss);
  return status;
}
