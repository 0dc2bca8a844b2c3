/*
 * vspec-gateway (fleet/gateway.h) against a real redis-server, with the test playing the
 * daemon's part through the fleet queue (fleet/fleet_queue.h, consumer "fake-daemon"): it
 * reads the jobs the gateway enqueues and writes their events, and the test's clients check
 * what the gateway relays. Each test starts its own redis-server on a unix socket in a fresh
 * temporary directory and its gateway(s) from $VSPEC_BUILD on ipc endpoints there; both die
 * with the test process (PR_SET_PDEATHSIG) and are stopped by pid in the teardown. Without
 * redis-server ($VSPEC_REDIS_SERVER may name one) those tests are skipped; the usage test
 * runs anyway. Every wait is bounded; the file takes a few seconds.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fleet/fleet_event.h"
#include "fleet/fleet_queue.h"
#include "tests/support/daemon_harness.h"
#include "tests/support/redis_fixture.h"

#define HEARTBEAT_MS 200
#define MAX_GW 2

typedef struct gw_proc {
  pid_t pid;
  char ep[160];
  char log[160];
} gw_proc;

typedef struct fx {
  vs_redis_fx *redis; /* its directory holds the gateways' sockets and logs too */
  gw_proc gw[MAX_GW];
  vs_fleet_queue *d;  /* the fake daemon */
} fx;

static void dump_file(const char *path, const char *who) {
  FILE *in = fopen(path, "r");
  if (!in) return;
  char line[600];
  while (fgets(line, sizeof line, in)) print_message("%s: %s", who, line);
  fclose(in);
}

/* Forks a child that dies with the test, however the test dies (the check after prctl closes
 * the race with a parent already gone), its stdout and stderr into `log`. */
static pid_t spawn(const char *path, char *const *argv, const char *log) {
  pid_t parent = getpid();
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execv(path, argv);
    _exit(127);
  }
  return pid;
}

/* ---- gateways ---------------------------------------------------------------------------- */

static void gw_path(char *out, size_t cap) {
  snprintf(out, cap, "%s/vspec-gateway", vs_harness_build());
}

static int ping(const char *ep, int timeout_ms, char *node, size_t cap) {
  vs_conn c;
  vs_client_open(&c, ep);
  int ok = vs_client_ping(&c, timeout_ms, node, cap);
  vs_conn_close(&c);
  return ok;
}

/* Starts gateway i ("gw-<i>") on this test's Redis, with a short heartbeat and the extra
 * arguments; returns once it answers a ping. */
static void gw_start(fx *f, int i, const char *const *extra) {
  gw_proc *g = &f->gw[i];
  char path[600], node[16], hb[16];
  gw_path(path, sizeof path);
  snprintf(g->ep, sizeof g->ep, "ipc://%s/gw%d.sock", f->redis->dir, i);
  snprintf(g->log, sizeof g->log, "%s/gw%d.log", f->redis->dir, i);
  snprintf(node, sizeof node, "gw-%d", i);
  snprintf(hb, sizeof hb, "%d", HEARTBEAT_MS);
  const char *argv[32] = {path,   "--front", g->ep,  "--redis",     f->redis->url,
                          "--node", node,    "--heartbeat-ms", hb, "--log-level", "debug"};
  int n = 11;
  for (int k = 0; extra && extra[k] && n < 31; k++) argv[n++] = extra[k];
  argv[n] = NULL;
  g->pid = spawn(path, (char *const *)argv, g->log);
  double end = vs_harness_now() + 5.0;
  while (!ping(g->ep, 100, NULL, 0)) {
    int st;
    int gone = waitpid(g->pid, &st, WNOHANG) == g->pid;
    if (gone || vs_harness_now() > end) {
      if (!gone) vs_wait_pid(g->pid, 0); /* kills and reaps it */
      g->pid = 0;
      dump_file(g->log, node);
      fail_msg("vspec-gateway %s did not come up (is %s built?)", node, path);
    }
  }
}

/* SIGTERM: a clean stop is exit 0 (under ASan: without leaks). */
static void gw_stop(fx *f, int i) {
  gw_proc *g = &f->gw[i];
  kill(g->pid, SIGTERM);
  int rc = vs_wait_pid(g->pid, 5000);
  g->pid = 0;
  if (rc != 0) {
    dump_file(g->log, "gateway");
    fail_msg("vspec-gateway %d exited with %d on SIGTERM", i, rc);
  }
}

/* ---- fixture ----------------------------------------------------------------------------- */

/* The fake daemon's queue, keeping `events` events per job. */
static void open_daemon(fx *f, long long events) {
  vs_fleet_queue_destroy(&f->d);
  vs_fleet_opts o;
  vs_fleet_opts_defaults(&o);
  o.url = f->redis->sock;
  o.consumer = "fake-daemon";
  o.events_max_len = events;
  o.connect_timeout_ms = o.command_timeout_ms = 500;
  char err[VSPEC_ERRLEN];
  if (vs_fleet_queue_open(&o, &f->d, err, sizeof err)) fail_msg("open: %s", err);
  if (vs_fleet_ensure_group(f->d, err, sizeof err)) fail_msg("group: %s", err);
}

static int setup(void **state) {
  fx *f = calloc(1, sizeof *f);
  if (!f) return -1;
  *state = f;
  if (!(f->redis = vs_redis_fx_open(0))) return 0;
  open_daemon(f, 1024);
  return 0;
}

static int teardown(void **state) {
  fx *f = *state;
  vs_fleet_queue_destroy(&f->d);
  for (int i = 0; i < MAX_GW; i++)
    if (f->gw[i].pid > 0) { /* a test that failed midway */
      kill(f->gw[i].pid, SIGKILL);
      waitpid(f->gw[i].pid, NULL, 0);
    }
  vs_redis_fx_close(&f->redis);
  free(f);
  *state = NULL;
  return 0;
}

#define NEED_REDIS(state) VS_NEED_REDIS(((fx *)*(state))->redis)

/* ---- the client's side ------------------------------------------------------------------- */

static uint64_t send_req(vs_conn *c, Vspec__Request *r, vs_wire_blob *blobs, int nb) {
  char err[512];
  if (vs_conn_send(c, r, blobs, nb, err, sizeof err)) fail_msg("send: %s", err);
  return r->request_id;
}

static uint64_t submit(vs_conn *c, Vspec__Submit *s, vs_wire_blob *blobs, int nb) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  r.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  r.submit = s;
  return send_req(c, &r, blobs, nb);
}

static uint64_t submit_plain(vs_conn *c) {
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = "micro";
  return submit(c, &s, NULL, 0);
}

static uint64_t cancel(vs_conn *c, uint64_t job) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Cancel cc = VSPEC__CANCEL__INIT;
  cc.job_id = job;
  r.body_case = VSPEC__REQUEST__BODY_CANCEL;
  r.cancel = &cc;
  return send_req(c, &r, NULL, 0);
}

/* after NULL: from the first event; credit < 0: unset. */
static uint64_t resume(vs_conn *c, uint64_t job, const char *after, int credit) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Resume rs = VSPEC__RESUME__INIT;
  rs.job_id = job;
  rs.after = (char *)after;
  rs.has_credit = credit >= 0;
  rs.credit = credit >= 0 ? (uint32_t)credit : 0;
  r.body_case = VSPEC__REQUEST__BODY_RESUME;
  r.resume = &rs;
  return send_req(c, &r, NULL, 0);
}

/* The next event that is not a heartbeat: of `job` (0: any), numbered `seq`, answering
 * `rid`, a `body`, at `cursor` (NULL: any, but one). Left in *e. */
static void expect(vs_conn *c, uint64_t job, uint64_t seq, uint64_t rid, int body,
                   const char *cursor, vs_conn_event *e) {
  vs_client_next(c, 3000, e);
  const Vspec__Event *ev = e->ev;
  if ((int)ev->body_case != body)
    fail_msg("event seq %llu: body %d (%s), expected %d", (unsigned long long)ev->seq,
             (int)ev->body_case,
             ev->body_case == VSPEC__EVENT__BODY_ERROR ? ev->error->message : "", body);
  assert_true(ev->has_job_id);
  if (job) assert_int_equal(ev->job_id, job);
  assert_true(ev->has_seq);
  assert_int_equal(ev->seq, seq);
  assert_true(ev->has_request_id);
  assert_int_equal(ev->request_id, rid);
  assert_non_null(ev->cursor);
  if (cursor) assert_string_equal(ev->cursor, cursor);
}

/* The answer to request rid: an error with `code` whose message has `needle`. */
static void expect_error(vs_conn *c, uint64_t rid, int code, const char *needle,
                         uint32_t *retry_ms) {
  vs_conn_event e;
  vs_client_next(c, 3000, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  assert_true(e.ev->has_request_id);
  assert_int_equal(e.ev->request_id, rid);
  if ((int)e.ev->error->code != code || !strstr(e.ev->error->message, needle))
    fail_msg("error %d '%s', expected %d with '%s'", (int)e.ev->error->code,
             e.ev->error->message, code, needle);
  assert_false(e.ev->has_job_id);
  if (retry_ms) *retry_ms = e.ev->error->has_retry_after_ms ? e.ev->error->retry_after_ms : 0;
  vs_conn_event_free(&e);
}

/* Nothing but heartbeats for ms; returns how many heartbeats came. */
static int expect_quiet(vs_conn *c, int ms) {
  double end = vs_harness_now() + ms / 1000.0;
  int beats = 0;
  for (;;) {
    int left = (int)((end - vs_harness_now()) * 1000);
    if (left <= 0) return beats;
    vs_conn_event e;
    char err[512];
    int rc = vs_conn_recv(c, left, &e, err, sizeof err);
    if (rc < 0) fail_msg("receive: %s", err);
    if (rc == 0) continue;
    int body = (int)e.ev->body_case;
    unsigned long long seq = e.ev->seq;
    vs_conn_event_free(&e);
    if (body != VSPEC__EVENT__BODY_HEARTBEAT)
      fail_msg("unexpected event (body %d, seq %llu)", body, seq);
    beats++;
  }
}

/* Submits and returns the job id from the gateway's Accepted (seq 0). */
static uint64_t submit_accepted(vs_conn *c, uint64_t *rid_out) {
  uint64_t rid = submit_plain(c);
  vs_conn_event e;
  expect(c, 0, 0, rid, VSPEC__EVENT__BODY_ACCEPTED, NULL, &e);
  uint64_t job = e.ev->job_id;
  vs_conn_event_free(&e);
  if (rid_out) *rid_out = rid;
  return job;
}

/* ---- the daemon's side ------------------------------------------------------------------- */

enum { EV_ACCEPTED, EV_PROGRESS, EV_PREVIEW, EV_RESULT, EV_ERROR, EV_RESTARTED };

/* Writes an event of `kind` to the job's stream as a daemon would; its id into id. `n`: the
 * progress's tokens_done, or the error's code; blob (may be NULL): a PNG. */
static void put(fx *f, uint64_t job, int kind, uint32_t n, const void *blob, size_t blob_len,
                char *id) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Accepted acc = VSPEC__ACCEPTED__INIT;
  Vspec__Progress pr = VSPEC__PROGRESS__INIT;
  Vspec__Preview pv = VSPEC__PREVIEW__INIT;
  Vspec__Result res = VSPEC__RESULT__INIT;
  Vspec__Error er = VSPEC__ERROR__INIT;
  Vspec__Restarted rs = VSPEC__RESTARTED__INIT;
  switch (kind) {
    case EV_ACCEPTED:
      acc.model = "micro";
      acc.method = "ar";
      acc.node = "fake-daemon";
      acc.has_tokens_total = 1;
      acc.tokens_total = 16;
      ev.body_case = VSPEC__EVENT__BODY_ACCEPTED;
      ev.accepted = &acc;
      break;
    case EV_PROGRESS:
      pr.has_tokens_done = 1;
      pr.tokens_done = n;
      ev.body_case = VSPEC__EVENT__BODY_PROGRESS;
      ev.progress = &pr;
      break;
    case EV_PREVIEW:
      pv.has_tokens_done = 1;
      pv.tokens_done = n;
      ev.body_case = VSPEC__EVENT__BODY_PREVIEW;
      ev.preview = &pv;
      break;
    case EV_RESULT:
      res.node = "fake-daemon";
      ev.body_case = VSPEC__EVENT__BODY_RESULT;
      ev.result = &res;
      break;
    case EV_ERROR:
      er.code = n;
      er.message = "the fake daemon says no";
      ev.body_case = VSPEC__EVENT__BODY_ERROR;
      ev.error = &er;
      break;
    default:
      rs.has_delivery = 1;
      rs.delivery = 2;
      rs.node = "fake-daemon-2";
      ev.body_case = VSPEC__EVENT__BODY_RESTARTED;
      ev.restarted = &rs;
  }
  ev.version = VSPEC__PROTOCOL_VERSION__PROTOCOL_V1;
  ev.has_job_id = 1;
  ev.job_id = job;
  Vspec__Blob d = VSPEC__BLOB__INIT, *dp = &d;
  const void *bd[1] = {blob};
  size_t bs[1] = {blob_len};
  if (blob) {
    d.kind = VSPEC__BLOB_KIND__BLOB_PNG;
    d.size = blob_len;
    ev.n_blobs = 1;
    ev.blobs = &dp;
  }
  unsigned char *data;
  size_t len;
  assert_int_equal(vs_fleet_event_encode(&ev, bd, bs, blob ? 1 : 0, &data, &len), 0);
  char jt[24], err[VSPEC_ERRLEN];
  snprintf(jt, sizeof jt, "%llu", (unsigned long long)job);
  int rc = vs_fleet_event_append(f->d, jt, data, len, id, err, sizeof err);
  free(data);
  if (rc) fail_msg("append: %s", err);
}

/* The next job in the queue, which must be `job`. */
static void take(fx *f, uint64_t job, vs_fleet_job *j) {
  char err[VSPEC_ERRLEN], jt[24];
  int rc = vs_fleet_read(f->d, 2000, j, err, sizeof err);
  if (rc != 1) fail_msg("no job in the queue: %d %s", rc, rc < 0 ? err : "");
  snprintf(jt, sizeof jt, "%llu", (unsigned long long)job);
  assert_string_equal(j->job_id, jt);
  assert_int_equal(j->malformed, 0);
}

static void done(fx *f, vs_fleet_job *j) {
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_fleet_ack(f->d, j->entry_id, err, sizeof err), 1);
  vs_fleet_job_clear(j);
}

/* ---- tests ------------------------------------------------------------------------------- */

static int count_lines(const char *path, const char *needle) {
  FILE *in = fopen(path, "r");
  assert_non_null(in);
  char line[2048];
  int n = 0;
  while (fgets(line, sizeof line, in)) n += strstr(line, needle) != NULL;
  fclose(in);
  return n;
}

/* Runs the gateway with args; its stderr into out; returns its exit status. */
static int run_gw(const char *const *args, char *out, size_t cap) {
  char path[600];
  gw_path(path, sizeof path);
  int p[2];
  assert_int_equal(pipe(p), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(p[1], 2);
    dup2(p[1], 1);
    close(p[0]);
    close(p[1]);
    const char *argv[16] = {path};
    for (int i = 0; args[i] && i < 14; i++) argv[i + 1] = args[i];
    execv(path, (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  size_t used = 0;
  ssize_t r;
  char buf[4096];
  while ((r = read(p[0], buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < r && used + 1 < cap; i++) out[used++] = buf[i];
  out[used] = 0;
  close(p[0]);
  return vs_wait_pid(pid, 5000);
}

static void test_usage(void **state) {
  (void)state;
  char out[8192];
  const char *no_redis[] = {"--front", "ipc:///tmp/vspec-gw-none.sock", NULL};
  assert_int_equal(run_gw(no_redis, out, sizeof out), 2);
  assert_non_null(strstr(out, "--redis is required"));
  const char *bad_len[] = {"--front", "ipc:///tmp/x", "--redis", "/tmp/x.sock", "--max-len", "0",
                           NULL};
  assert_int_equal(run_gw(bad_len, out, sizeof out), 2);
  assert_non_null(strstr(out, "--max-len"));
  const char *bad_stream[] = {"--front", "ipc:///tmp/x", "--redis", "/tmp/x.sock", "--stream",
                              "a b", NULL};
  assert_int_equal(run_gw(bad_stream, out, sizeof out), 2);
  assert_non_null(strstr(out, "--stream"));
  const char *bad_url[] = {"--front", "ipc:///tmp/x", "--redis", "redis://u:hunter2@h:0", NULL};
  assert_int_equal(run_gw(bad_url, out, sizeof out), 2);
  assert_non_null(strstr(out, "--redis"));
  assert_null(strstr(out, "hunter2"));
  const char *help[] = {"--help", NULL};
  assert_int_equal(run_gw(help, out, sizeof out), 0);
  assert_non_null(strstr(out, "--per-client"));
}

/* A submit becomes a job whose payload is the request and its blobs as sent; the client gets
 * the gateway's Accepted, heartbeats while the job waits, then the daemon's events with
 * consecutive numbers and their cursors, and nothing after the first terminal event. */
static void test_submit_relay(void **state) {
  NEED_REDIS(state);
  fx *f = *state;
  gw_start(f, 0, NULL);
  vs_conn a;
  vs_client_open(&a, f->gw[0].ep);
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = "micro";
  s.method = "ar";
  s.has_class_label = s.has_seed = s.has_caption_len = s.has_caption_dim = 1;
  s.class_label = 7;
  s.seed = 1234;
  s.caption_len = 2;
  s.caption_dim = 3;
  s.tag = "gw-test";
  float caption[6] = {1, 2, 3, 4, 5, 6};
  unsigned char mask[2] = {1, 0};
  vs_wire_blob blobs[2] = {
      {.kind = VSPEC__BLOB_KIND__BLOB_CAPTION_F32LE, .data = caption, .size = sizeof caption},
      {.kind = VSPEC__BLOB_KIND__BLOB_CAPTION_MASK_U8, .data = mask, .size = sizeof mask}};
  uint64_t rid = submit(&a, &s, blobs, 2);

  vs_conn_event e;
  expect(&a, 0, 0, rid, VSPEC__EVENT__BODY_ACCEPTED, NULL, &e);
  uint64_t job = e.ev->job_id;
  assert_true(job != 0 && job < (1ull << 63));
  assert_string_equal(e.ev->accepted->node, "gw-0");
  assert_true(e.ev->accepted->has_queue_position);
  assert_int_equal(e.ev->accepted->queue_position, 0);
  vs_conn_event_free(&e);

  /* The job as the daemon reads it: the request frame and the blobs as the client sent them. */
  vs_fleet_job j;
  take(f, job, &j);
  const unsigned char *frame[VS_FLEET_MAX_FRAMES];
  size_t size[VS_FLEET_MAX_FRAMES];
  int n;
  char err[VSPEC_ERRLEN];
  if (vs_fleet_frames_decode("VSR1", j.payload, j.payload_len, frame, size, &n, err, sizeof err))
    fail_msg("payload: %s", err);
  assert_int_equal(n, 3);
  Vspec__Request *r = vspec__request__unpack(NULL, size[0], frame[0]);
  assert_non_null(r);
  assert_int_equal(r->request_id, rid);
  assert_int_equal(r->body_case, VSPEC__REQUEST__BODY_SUBMIT);
  assert_string_equal(r->submit->model, "micro");
  assert_string_equal(r->submit->method, "ar");
  assert_string_equal(r->submit->tag, "gw-test");
  assert_int_equal(r->submit->class_label, 7);
  assert_int_equal(r->submit->seed, 1234);
  assert_int_equal(r->submit->caption_dim, 3);
  assert_int_equal(r->n_blobs, 2);
  assert_int_equal(r->blobs[1]->kind, VSPEC__BLOB_KIND__BLOB_CAPTION_MASK_U8);
  vspec__request__free_unpacked(r, NULL);
  assert_int_equal(size[1], sizeof caption);
  assert_memory_equal(frame[1], caption, sizeof caption);
  assert_int_equal(size[2], sizeof mask);
  assert_memory_equal(frame[2], mask, sizeof mask);

  /* The fleet as the gateway reports it: one job, running. */
  vs_client_status(f->gw[0].ep, &e);
  const Vspec__StatusReply *st = e.ev->status;
  assert_string_equal(st->node, "gw-0");
  assert_int_equal(st->clients, 1);
  assert_string_equal(st->fleet->redis, f->redis->sock);
  assert_string_equal(st->fleet->stream, "vspec:jobs");
  assert_null(st->fleet->error);
  assert_true(st->fleet->has_length && st->fleet->has_pending);
  assert_int_equal(st->fleet->length, 1);
  assert_int_equal(st->fleet->pending, 1);
  assert_int_equal(st->fleet->max_length, 1024);
  vs_conn_event_free(&e);

  /* A job that waits: heartbeats, nothing else. */
  assert_true(expect_quiet(&a, 3 * HEARTBEAT_MS) >= 1);

  char id[5][VS_FLEET_ID_MAX];
  unsigned char png[5000];
  for (size_t i = 0; i < sizeof png; i++) png[i] = (unsigned char)(i * 31 + 7);
  put(f, job, EV_ACCEPTED, 0, NULL, 0, id[0]);
  put(f, job, EV_PROGRESS, 8, NULL, 0, id[1]);
  put(f, job, EV_RESULT, 0, png, sizeof png, id[2]);
  put(f, job, EV_ERROR, VSPEC__ERROR_CODE__ERR_INTERNAL, NULL, 0, id[3]); /* never sent */
  done(f, &j);

  expect(&a, job, 1, rid, VSPEC__EVENT__BODY_ACCEPTED, id[0], &e);
  assert_string_equal(e.ev->accepted->node, "fake-daemon");
  assert_int_equal(e.ev->accepted->tokens_total, 16);
  vs_conn_event_free(&e);
  expect(&a, job, 2, rid, VSPEC__EVENT__BODY_PROGRESS, id[1], &e);
  assert_int_equal(e.ev->progress->tokens_done, 8);
  vs_conn_event_free(&e);
  expect(&a, job, 3, rid, VSPEC__EVENT__BODY_RESULT, id[2], &e);
  size_t got = 0;
  const void *bytes = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_PNG, &got);
  assert_non_null(bytes);
  assert_int_equal(got, sizeof png);
  assert_memory_equal(bytes, png, sizeof png);
  vs_conn_event_free(&e);
  /* Followed no more: no second terminal event, and no heartbeats either. */
  assert_int_equal(expect_quiet(&a, 2 * HEARTBEAT_MS), 0);

  vs_client_status(f->gw[0].ep, &e);
  assert_int_equal(e.ev->status->clients, 0);
  assert_int_equal(e.ev->status->fleet->length, 0);
  assert_int_equal(e.ev->status->fleet->pending, 0);
  vs_conn_event_free(&e);
  vs_conn_close(&a);
  gw_stop(f, 0);
}

/* Progress and previews cost credit; without it they are skipped, everything else still
 * goes out, and a Credit request lets them through again. A resume with credit 0 gets only
 * the events that cost nothing. */
static void test_credit(void **state) {
  NEED_REDIS(state);
  fx *f = *state;
  gw_start(f, 0, NULL);
  vs_conn a;
  vs_client_open(&a, f->gw[0].ep);
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = "micro";
  s.has_credit = 1;
  s.credit = 1;
  uint64_t rid = submit(&a, &s, NULL, 0);
  vs_conn_event e;
  expect(&a, 0, 0, rid, VSPEC__EVENT__BODY_ACCEPTED, NULL, &e);
  uint64_t job = e.ev->job_id;
  vs_conn_event_free(&e);
  vs_fleet_job j;
  take(f, job, &j);

  char id[8][VS_FLEET_ID_MAX];
  put(f, job, EV_ACCEPTED, 0, NULL, 0, id[0]);
  put(f, job, EV_PROGRESS, 1, NULL, 0, id[1]);
  put(f, job, EV_PREVIEW, 2, "png", 3, id[2]);  /* no credit left: skipped */
  put(f, job, EV_RESTARTED, 0, NULL, 0, id[3]); /* costs nothing: sent */
  expect(&a, job, 1, rid, VSPEC__EVENT__BODY_ACCEPTED, id[0], &e);
  vs_conn_event_free(&e);
  expect(&a, job, 2, rid, VSPEC__EVENT__BODY_PROGRESS, id[1], &e);
  vs_conn_event_free(&e);
  expect(&a, job, 3, rid, VSPEC__EVENT__BODY_RESTARTED, id[3], &e);
  assert_int_equal(e.ev->restarted->delivery, 2);
  assert_string_equal(e.ev->restarted->node, "fake-daemon-2");
  vs_conn_event_free(&e);

  /* One more: the ping after it is answered once the credit is in. */
  vs_client_credit(&a, job, 1);
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Ping p = VSPEC__PING__INIT;
  r.body_case = VSPEC__REQUEST__BODY_PING;
  r.ping = &p;
  char err[512];
  assert_int_equal(vs_conn_call(&a, &r, 3000, &e, err, sizeof err), 1);
  assert_string_equal(e.ev->pong->node, "gw-0");
  vs_conn_event_free(&e);
  put(f, job, EV_PROGRESS, 3, NULL, 0, id[4]);
  put(f, job, EV_PROGRESS, 4, NULL, 0, id[5]); /* skipped */
  put(f, job, EV_RESULT, 0, NULL, 0, id[6]);
  done(f, &j);
  expect(&a, job, 4, rid, VSPEC__EVENT__BODY_PROGRESS, id[4], &e);
  assert_int_equal(e.ev->progress->tokens_done, 3);
  vs_conn_event_free(&e);
  expect(&a, job, 5, rid, VSPEC__EVENT__BODY_RESULT, id[6], &e);
  vs_conn_event_free(&e);

  /* Again from the start with no credit: numbered anew, no progress, no preview. */
  uint64_t rid2 = resume(&a, job, NULL, 0);
  expect(&a, job, 0, rid2, VSPEC__EVENT__BODY_ACCEPTED, NULL, &e);
  assert_string_equal(e.ev->accepted->node, "gw-0");
  vs_conn_event_free(&e);
  expect(&a, job, 1, rid2, VSPEC__EVENT__BODY_ACCEPTED, id[0], &e);
  vs_conn_event_free(&e);
  expect(&a, job, 2, rid2, VSPEC__EVENT__BODY_RESTARTED, id[3], &e);
  vs_conn_event_free(&e);
  expect(&a, job, 3, rid2, VSPEC__EVENT__BODY_RESULT, id[6], &e);
  vs_conn_event_free(&e);
  assert_int_equal(expect_quiet(&a, HEARTBEAT_MS), 0);
  vs_conn_close(&a);
  gw_stop(f, 0);
}

/* Cancel sets the job's flag for its daemon and is acknowledged; only the connection that
 * follows the job may cancel it. */
static void test_cancel(void **state) {
  NEED_REDIS(state);
  fx *f = *state;
  gw_start(f, 0, NULL);
  vs_conn a, b;
  vs_client_open(&a, f->gw[0].ep);
  vs_client_open(&b, f->gw[0].ep);
  uint64_t rid;
  uint64_t job = submit_accepted(&a, &rid);
  char msg[128], jt[24], err[VSPEC_ERRLEN];
  snprintf(jt, sizeof jt, "%llu", (unsigned long long)job);

  uint64_t r1 = cancel(&b, job); /* not b's */
  snprintf(msg, sizeof msg, "no job %llu followed on this connection", (unsigned long long)job);
  expect_error(&b, r1, VSPEC__ERROR_CODE__ERR_NOT_FOUND, msg, NULL);
  uint64_t r2 = cancel(&a, 12345);
  expect_error(&a, r2, VSPEC__ERROR_CODE__ERR_NOT_FOUND, "no job 12345 followed", NULL);
  const char *ids[2] = {jt, "12345"};
  int flag[2] = {-1, -1};
  assert_int_equal(vs_fleet_cancel_check(f->d, ids, 2, flag, err, sizeof err), 0);
  assert_int_equal(flag[0], 0);

  uint64_t r3 = cancel(&a, job);
  vs_conn_event e;
  vs_client_next(&a, 3000, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ACK);
  assert_int_equal(e.ev->request_id, r3);
  vs_conn_event_free(&e);
  assert_int_equal(vs_fleet_cancel_check(f->d, ids, 2, flag, err, sizeof err), 1);
  assert_int_equal(flag[0], 1);
  assert_int_equal(flag[1], 0);

  /* The daemon ends the job: the cancelled error is its terminal event. */
  vs_fleet_job j;
  take(f, job, &j);
  char id[VS_FLEET_ID_MAX];
  put(f, job, EV_ERROR, VSPEC__ERROR_CODE__ERR_CANCELLED, NULL, 0, id);
  done(f, &j);
  expect(&a, job, 1, rid, VSPEC__EVENT__BODY_ERROR, id, &e);
  assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_CANCELLED);
  vs_conn_event_free(&e);
  uint64_t r4 = cancel(&a, job); /* ended: followed no more */
  expect_error(&a, r4, VSPEC__ERROR_CODE__ERR_NOT_FOUND, "followed on this connection", NULL);
  vs_conn_close(&a);
  vs_conn_close(&b);
  gw_stop(f, 0);
}

/* A client that left resumes through another gateway from the cursor it last saw: exactly
 * the events after it. */
static void test_resume_elsewhere(void **state) {
  NEED_REDIS(state);
  fx *f = *state;
  gw_start(f, 0, NULL);
  gw_start(f, 1, NULL);
  vs_conn a, b;
  vs_client_open(&a, f->gw[0].ep);
  uint64_t rid;
  uint64_t job = submit_accepted(&a, &rid);
  vs_fleet_job j;
  take(f, job, &j);
  char id[5][VS_FLEET_ID_MAX];
  put(f, job, EV_ACCEPTED, 0, NULL, 0, id[0]);
  put(f, job, EV_PROGRESS, 4, NULL, 0, id[1]);
  put(f, job, EV_PROGRESS, 8, NULL, 0, id[2]);
  vs_conn_event e;
  for (int i = 0; i < 3; i++) {
    expect(&a, job, 1 + (uint64_t)i, rid,
           i ? VSPEC__EVENT__BODY_PROGRESS : VSPEC__EVENT__BODY_ACCEPTED, id[i], &e);
    vs_conn_event_free(&e);
  }
  vs_conn_close(&a);

  put(f, job, EV_PROGRESS, 12, NULL, 0, id[3]);
  unsigned char png[700];
  for (size_t i = 0; i < sizeof png; i++) png[i] = (unsigned char)(255 - i);
  put(f, job, EV_RESULT, 0, png, sizeof png, id[4]);
  done(f, &j);

  vs_client_open(&b, f->gw[1].ep);
  uint64_t r2 = resume(&b, job, id[1], -1);
  expect(&b, job, 0, r2, VSPEC__EVENT__BODY_PROGRESS, id[2], &e);
  assert_int_equal(e.ev->progress->tokens_done, 8);
  vs_conn_event_free(&e);
  expect(&b, job, 1, r2, VSPEC__EVENT__BODY_PROGRESS, id[3], &e);
  assert_int_equal(e.ev->progress->tokens_done, 12);
  vs_conn_event_free(&e);
  expect(&b, job, 2, r2, VSPEC__EVENT__BODY_RESULT, id[4], &e);
  size_t got = 0;
  const void *bytes = vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_PNG, &got);
  assert_int_equal(got, sizeof png);
  assert_memory_equal(bytes, png, sizeof png);
  vs_conn_event_free(&e);
  assert_int_equal(expect_quiet(&b, HEARTBEAT_MS), 0);

  uint64_t r3 = resume(&b, 777, NULL, -1);
  expect_error(&b, r3, VSPEC__ERROR_CODE__ERR_NOT_FOUND, "no job 777 in the fleet", NULL);
  uint64_t r4 = resume(&b, job, "12-x", -1);
  expect_error(&b, r4, VSPEC__ERROR_CODE__ERR_INVALID, "resume.after", NULL);
  vs_conn_close(&b);
  gw_stop(f, 0);
  gw_stop(f, 1);
}

/* The fleet's bound and the per-connection bound answer busy with a retry time; the
 * gateway's own refusals. */
static void test_limits(void **state) {
  NEED_REDIS(state);
  fx *f = *state;
  const char *extra[] = {"--max-len", "3", "--per-client", "2", NULL};
  gw_start(f, 0, extra);
  vs_conn a, b;
  vs_client_open(&a, f->gw[0].ep);
  vs_client_open(&b, f->gw[0].ep);
  submit_accepted(&a, NULL);
  submit_accepted(&a, NULL);
  uint32_t retry = 0;
  uint64_t rid = submit_plain(&a);
  expect_error(&a, rid, VSPEC__ERROR_CODE__ERR_BUSY, "--per-client", &retry);
  assert_true(retry > 0);
  submit_accepted(&b, NULL); /* the fleet's third job */
  retry = 0;
  rid = submit_plain(&b);
  expect_error(&b, rid, VSPEC__ERROR_CODE__ERR_BUSY, "the fleet queue holds 3 jobs", &retry);
  assert_true(retry > 0);
  long long len = -1;
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_fleet_depth(f->d, &len, NULL, err, sizeof err), 0);
  assert_int_equal(len, 3);

  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__PluginsRequest pl = VSPEC__PLUGINS_REQUEST__INIT;
  r.body_case = VSPEC__REQUEST__BODY_PLUGINS;
  r.plugins = &pl;
  rid = send_req(&b, &r, NULL, 0);
  expect_error(&b, rid, VSPEC__ERROR_CODE__ERR_FORBIDDEN, "admin endpoint", NULL);
  /* Not a request at all. */
  assert_int_equal(zmq_send(b.sock, "", 0, ZMQ_SNDMORE), 0);
  assert_int_equal(zmq_send(b.sock, "\xff\xff\xff", 3, 0), 3);
  vs_conn_event e;
  vs_client_next(&b, 3000, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_MALFORMED);
  vs_conn_event_free(&e);
  vs_conn_close(&a);
  vs_conn_close(&b);
  gw_stop(f, 0);
}


/* A client connection that takes one message at a time into its queue, with a small socket
 * buffer: a client that stops reading fills the gateway's queue for it soon. */
static void open_slow(vs_conn *c, const char *ep) {
  memset(c, 0, sizeof *c);
  snprintf(c->endpoint, sizeof c->endpoint, "%s", ep);
  c->max_blob = (size_t)1 << 30;
  c->next_request_id = 1;
  c->own_ctx = 1;
  c->ctx = zmq_ctx_new();
  assert_non_null(c->ctx);
  c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
  assert_non_null(c->sock);
  int one = 1, small = 4096, linger = 0;
  assert_int_equal(zmq_setsockopt(c->sock, ZMQ_RCVHWM, &one, sizeof one), 0);
  assert_int_equal(zmq_setsockopt(c->sock, ZMQ_RCVBUF, &small, sizeof small), 0);
  assert_int_equal(zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger), 0);
  assert_int_equal(zmq_connect(c->sock, ep), 0);
}

/* Reads the follow's events numbered from seq while they come: each must be the next of
 * ids[] from *k on (*k advances), a restarted event with its blob or the result. Returns
 * when none came for 300 ms, or ids[n - 1] did. */
static void read_run(vs_conn *c, uint64_t job, uint64_t rid, uint64_t seq,
                     char (*ids)[VS_FLEET_ID_MAX], int n, int *k) {
  for (;;) {
    vs_conn_event e;
    char err[512];
    int rc = vs_conn_recv(c, 300, &e, err, sizeof err);
    if (rc < 0) fail_msg("receive: %s", err);
    if (rc == 0) return;
    if (e.ev->body_case == VSPEC__EVENT__BODY_HEARTBEAT) {
      vs_conn_event_free(&e);
      continue;
    }
    if (*k >= n) fail_msg("an event after the last one (body %d)", (int)e.ev->body_case);
    assert_int_equal(e.ev->job_id, job);
    assert_int_equal(e.ev->request_id, rid);
    assert_int_equal(e.ev->seq, seq);
    if (strcmp(e.ev->cursor, ids[*k]))
      fail_msg("event %d: cursor %s, expected %s", *k, e.ev->cursor, ids[*k]);
    assert_int_equal(e.ev->n_blobs, e.ev->body_case == VSPEC__EVENT__BODY_RESTARTED);
    seq++;
    ++*k;
    vs_conn_event_free(&e);
    if (*k == n) return;
  }
}

/* Waits (bounded) until the gateway's log has `needle` on at least n lines. */
static void wait_log(const char *log, const char *needle, int n) {
  double end = vs_harness_now() + 5.0;
  while (count_lines(log, needle) < n) {
    if (vs_harness_now() > end) fail_msg("no '%s' in %s within 5 s", needle, log);
    vs_harness_sleep_ms(10);
  }
}

/* A client that stops reading: what the gateway could not send waits in Redis, its cursor
 * where it was, and goes out once the client reads again, every event once and in order; a
 * client that takes nothing for 5 heartbeats is given up (its job runs on) and resumes from
 * the last cursor it saw. */
static void test_slow_client(void **state) {
  NEED_REDIS(state);
  fx *f = *state;
  gw_start(f, 0, NULL);
  open_daemon(f, 4096);
  vs_conn a;
  open_slow(&a, f->gw[0].ep);
  uint64_t rid;
  uint64_t job = submit_accepted(&a, &rid);
  vs_fleet_job j;
  take(f, job, &j);
  /* Events that cost no credit, each with 8 KB: more than the gateway's queue for a client
   * (1000 messages) and the socket buffers hold together. */
  enum { N = 1100 };
  static char ids[2 * N + 1][VS_FLEET_ID_MAX];
  static unsigned char blob[8192];
  for (size_t i = 0; i < sizeof blob; i++) blob[i] = (unsigned char)i;
  for (int i = 0; i < N; i++) put(f, job, EV_RESTARTED, 0, blob, sizeof blob, ids[i]);
  wait_log(f->gw[0].log, "is full", 1);
  int k = 0;
  read_run(&a, job, rid, 1, ids, N, &k);
  assert_int_equal(k, N);
  assert_int_equal(count_lines(f->gw[0].log, "took nothing"), 0);

  for (int i = N; i < 2 * N; i++) put(f, job, EV_RESTARTED, 0, blob, sizeof blob, ids[i]);
  put(f, job, EV_RESULT, 0, NULL, 0, ids[2 * N]);
  done(f, &j);
  wait_log(f->gw[0].log, "took nothing for 5 heartbeats", 1);
  assert_int_equal(count_lines(f->gw[0].log, "is full"), 2);
  read_run(&a, job, rid, 1 + (uint64_t)N, ids, 2 * N + 1, &k);
  print_message("%d of %d events came before the gateway gave up\n", k, 2 * N + 1);
  assert_true(k > N && k < 2 * N);
  uint64_t rid2 = resume(&a, job, ids[k - 1], -1);
  read_run(&a, job, rid2, 0, ids, 2 * N + 1, &k);
  assert_int_equal(k, 2 * N + 1);
  vs_conn_close(&a);
  gw_stop(f, 0);
}

/* Redis killed: submits are answered unavailable, the gateway stays up and answers, and
 * once Redis is back (empty) submits work again, and a follow whose job's events are gone
 * ends with an error instead of heartbeats forever. */
static void test_redis_down(void **state) {
  NEED_REDIS(state);
  fx *f = *state;
  gw_start(f, 0, NULL);
  vs_conn a, b;
  vs_client_open(&a, f->gw[0].ep);
  vs_client_open(&b, f->gw[0].ep);
  uint64_t rid_a;
  uint64_t job = submit_accepted(&a, &rid_a);
  vs_redis_kill(f->redis);

  uint32_t retry = 0;
  uint64_t rid = submit_plain(&b);
  expect_error(&b, rid, VSPEC__ERROR_CODE__ERR_UNAVAILABLE, "unreachable", &retry);
  assert_true(retry > 0);
  rid = submit_plain(&b); /* within the backoff: answered at once */
  expect_error(&b, rid, VSPEC__ERROR_CODE__ERR_UNAVAILABLE, f->redis->sock, NULL);
  char node[64];
  assert_true(ping(f->gw[0].ep, 1000, node, sizeof node));
  assert_string_equal(node, "gw-0");
  vs_conn_event e;
  vs_client_status(f->gw[0].ep, &e);
  assert_non_null(e.ev->status->fleet->error);
  assert_non_null(strstr(e.ev->status->fleet->error, "unreachable"));
  assert_false(e.ev->status->fleet->has_length);
  vs_conn_event_free(&e);
  int st;
  assert_int_equal(waitpid(f->gw[0].pid, &st, WNOHANG), 0);

  vs_redis_start(f->redis); /* empty: it kept nothing */
  double end = vs_harness_now() + 5.0;
  uint64_t job2 = 0;
  while (!job2) {
    if (vs_harness_now() > end) fail_msg("no submit went through within 5 s of Redis's return");
    rid = submit_plain(&b);
    vs_client_next(&b, 3000, &e);
    if (e.ev->body_case == VSPEC__EVENT__BODY_ACCEPTED) job2 = e.ev->job_id;
    else assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_UNAVAILABLE);
    vs_conn_event_free(&e);
    if (!job2) vs_harness_sleep_ms(100);
  }
  /* The first job's events went with the old Redis: its follow ends. */
  vs_client_next(&a, 5000 + 10 * HEARTBEAT_MS, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  assert_int_equal(e.ev->job_id, job);
  assert_int_equal(e.ev->seq, 1);
  assert_int_equal(e.ev->request_id, rid_a);
  assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_NOT_FOUND);
  vs_conn_event_free(&e);
  vs_conn_close(&a);
  vs_conn_close(&b);
  gw_stop(f, 0);
  /* One line when Redis went, one when it came back. */
  assert_int_equal(count_lines(f->gw[0].log, "submits are refused meanwhile"), 1);
  assert_int_equal(count_lines(f->gw[0].log, "is back"), 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_usage),
      cmocka_unit_test_setup_teardown(test_submit_relay, setup, teardown),
      cmocka_unit_test_setup_teardown(test_credit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
      cmocka_unit_test_setup_teardown(test_resume_elsewhere, setup, teardown),
      cmocka_unit_test_setup_teardown(test_limits, setup, teardown),
      cmocka_unit_test_setup_teardown(test_slow_client, setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_down, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
