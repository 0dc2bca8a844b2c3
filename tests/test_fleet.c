/*
 * Fleet mode end to end (issue 13; DESIGN.md "Fleet mode"): a private redis-server, vspecd
 * daemons with [fleet] redis set, and vspec-gateway processes in front; clients speak to a
 * gateway exactly as to vspecd.
 *
 * Long jobs come from the test scheduler sched_slow (tests/plugins/slowsched.c) on the micro
 * model, so that a daemon can be killed in the middle of one. Every wait is bounded. Without
 * redis-server every test is skipped (tests/support/redis_fixture.h).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include <hiredis/hiredis.h>

#include "daemon/config.h"
#include "fleet/fleet_config.h"
#include "fleet/fleet_event.h"
#include "fleet/fleet_queue.h"
#include "tests/support/daemon_harness.h"
#include "tests/support/redis_fixture.h"

typedef struct fleet_fx {
  vs_redis_fx *redis;
  vs_fixture fx;
  vs_daemon d[3];
  int n_daemons;
  pid_t gw[2];
  char gw_ep[2][256];
  char gw_log[2][256];
} fleet_fx;

/* Every daemon of these tests: heartbeats every 250 ms, so that a job is taken over after
 * 1 s of silence (the least claim time three heartbeats allow), poison after 2 deliveries,
 * and a drain that cancels running jobs (a fleet daemon hands them over). */
#define HEARTBEAT_MS 250
#define CLAIM_MS 1000

static void start_daemon(fleet_fx *t, int i, const char *name) {
  char redis[300], hb[64], claim[64];
  snprintf(redis, sizeof redis, "fleet.redis=%s", t->redis->url);
  snprintf(hb, sizeof hb, "fleet.heartbeat_ms=%d", HEARTBEAT_MS);
  snprintf(claim, sizeof claim, "fleet.claim_idle_ms=%d", CLAIM_MS);
  const char *extra[] = {"--set", redis, "--set", hb, "--set", claim,
                         "--set", "fleet.max_deliveries=2", "--set", "fleet.cancel_poll_ms=50",
                         "--set", "shutdown.drain=cancel", NULL};
  vs_daemon_start(&t->d[i], &t->fx, name, extra);
  if (i >= t->n_daemons) t->n_daemons = i + 1;
}

static void ping_until_up(const char *ep, pid_t pid, const char *log) {
  vs_conn c;
  vs_client_open(&c, ep);
  double end = vs_harness_now() + 10;
  for (;;) {
    if (vs_client_ping(&c, 200, NULL, 0)) break;
    if (vs_harness_now() > end || kill(pid, 0)) {
      vs_conn_close(&c);
      char cmd[400];
      snprintf(cmd, sizeof cmd, "cat '%s' >&2", log);
      if (system(cmd)) {
      }
      fail_msg("vspec-gateway on %s did not come up", ep);
    }
  }
  vs_conn_close(&c);
}

static void start_gateway(fleet_fx *t, int i) {
  snprintf(t->gw_ep[i], sizeof t->gw_ep[i], "ipc://%s/gw%d.sock", t->fx.dir, i);
  snprintf(t->gw_log[i], sizeof t->gw_log[i], "%s/gw%d.log", t->fx.dir, i);
  char name[16];
  snprintf(name, sizeof name, "gw%d", i);
  const char *args[] = {"--front", t->gw_ep[i], "--redis", t->redis->url, "--node", name,
                        "--log-level", "debug", NULL};
  t->gw[i] = vs_spawn_tool("vspec-gateway", args, t->gw_log[i]);
  ping_until_up(t->gw_ep[i], t->gw[i], t->gw_log[i]);
}

static int setup(void **state) {
  fleet_fx *t = calloc(1, sizeof *t);
  if (!t) return -1;
  t->redis = vs_redis_fx_open(1);
  if (t->redis) vs_fixture_make(&t->fx);
  *state = t;
  return 0;
}

static int teardown(void **state) {
  fleet_fx *t = *state;
  for (int i = 0; i < 2; i++)
    if (t->gw[i] > 0) {
      kill(t->gw[i], SIGTERM);
      vs_wait_pid(t->gw[i], 3000);
    }
  for (int i = 0; i < t->n_daemons; i++)
    if (t->d[i].pid > 0) vs_daemon_stop(&t->d[i], SIGTERM, 5000);
  if (t->redis) vs_fixture_remove(&t->fx);
  vs_redis_fx_close(&t->redis);
  free(t);
  return 0;
}

#define NEED(t) VS_NEED_REDIS((t)->redis)

/* Under ASan (make check SAN=1) only the core paths run: a job through a gateway, a daemon's
 * death, an idempotent retry. The rest (poison, drain, cancel, resume, Redis restart, load)
 * drives the same agent and gateway code for longer, which the plain build covers; skipping
 * them keeps make test near its time budget. */
#ifdef VSPEC_SANITIZED
#define SKIP_UNDER_SANITIZERS()                                  \
  do {                                                           \
    print_message("skipped under the sanitizers (see above)\n"); \
    skip();                                                      \
  } while (0)
#else
#define SKIP_UNDER_SANITIZERS() \
  do {                          \
  } while (0)
#endif

static int ev_is_terminal_of(const Vspec__Event *ev, uint64_t job) {
  return job && ev->job_id == job &&
         (ev->body_case == VSPEC__EVENT__BODY_RESULT || ev->body_case == VSPEC__EVENT__BODY_ERROR);
}

/* A job of the micro model through sched_slow: ms per round, a fixed seed (0: none), the
 * client's own job id (0: none). */
static uint64_t submit_as(vs_conn *c, int slow_ms, uint64_t seed, uint64_t job_id) {
  char sp[64];
  snprintf(sp, sizeof sp, "ms=%d,depth=1", slow_ms);
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = "self";
  s.accept = "exact";
  s.sched = "slow";
  s.sched_params = sp;
  s.has_seed = seed != 0; /* 0: none, the daemon (or the fleet agent) draws one */
  s.seed = seed;
  s.has_credit = 1;
  s.credit = 64;
  s.has_job_id = job_id != 0;
  s.job_id = job_id;
  return vs_client_submit(c, &s);
}

static uint64_t submit(vs_conn *c, int slow_ms, uint64_t seed) {
  return submit_as(c, slow_ms, seed, 0);
}

/* The result's PNG, copied (the event is freed). */
static unsigned char *result_png(vs_conn_event *e, size_t *len) {
  assert_int_equal(e->ev->body_case, VSPEC__EVENT__BODY_RESULT);
  const void *p = vs_conn_blob(e, VSPEC__BLOB_KIND__BLOB_PNG, len);
  assert_non_null(p);
  unsigned char *copy = malloc(*len);
  assert_non_null(copy);
  memcpy(copy, p, *len);
  return copy;
}

static void dump_all(const fleet_fx *t) {
  for (int i = 0; i < t->n_daemons; i++) vs_daemon_dump_log(&t->d[i]);
  for (int i = 0; i < 2; i++)
    if (t->gw[i] > 0) {
      char cmd[400];
      snprintf(cmd, sizeof cmd, "cat '%s' >&2", t->gw_log[i]);
      if (system(cmd)) {
      }
    }
}

/* A job submitted through a gateway finishes on one of two daemons, and the same job with the
 * same seed gives the same bytes whichever daemon runs it. */
static void test_job_through_gateway(void **state) {
  fleet_fx *t = *state;
  NEED(t);
  start_daemon(t, 0, "d0");
  start_daemon(t, 1, "d1");
  start_gateway(t, 0);
  vs_conn c;
  vs_client_open(&c, t->gw_ep[0]);
  size_t len[2];
  unsigned char *png[2];
  for (int k = 0; k < 2; k++) {
    uint64_t job = 0, rid = submit(&c, 0, 11);
    vs_conn_event e;
    vs_client_until_end(&c, rid, &job, 30000, &e);
    if (e.ev->body_case != VSPEC__EVENT__BODY_RESULT) {
      dump_all(t);
      fail_msg("job ended with: %s", e.ev->error ? e.ev->error->message : "?");
    }
    const char *node = e.ev->result->node;
    assert_true(!strcmp(node, "d0") || !strcmp(node, "d1"));
    png[k] = result_png(&e, &len[k]);
    vs_conn_event_free(&e);
  }
  assert_int_equal(len[0], len[1]);
  assert_memory_equal(png[0], png[1], len[0]);
  free(png[0]);
  free(png[1]);
  vs_conn_close(&c);
}

/* Reads the job's events until the daemon's Accepted (node set to a daemon's name); returns
 * the index of that daemon. */
static int wait_running_on(fleet_fx *t, vs_conn *c, uint64_t rid, uint64_t *job,
                           uint64_t *seed) {
  double end = vs_harness_now() + 20;
  while (vs_harness_now() < end) {
    vs_conn_event e;
    vs_client_next(c, 20000, &e);
    Vspec__Event *ev = e.ev;
    int ours = (*job && ev->job_id == *job) || (!*job && ev->request_id == rid);
    if (ours && ev->body_case == VSPEC__EVENT__BODY_ACCEPTED) {
      *job = ev->job_id;
      for (int i = 0; i < t->n_daemons; i++)
        if (ev->accepted->node && !strcmp(ev->accepted->node, t->d[i].name)) {
          if (seed) *seed = ev->accepted->seed;
          vs_conn_event_free(&e);
          return i;
        }
    }
    if (ours && (ev->body_case == VSPEC__EVENT__BODY_RESULT ||
                 ev->body_case == VSPEC__EVENT__BODY_ERROR))
      fail_msg("the job ended before it ran");
    vs_conn_event_free(&e);
  }
  fail_msg("no daemon took the job within 20 s");
  return -1;
}

/* The Phase "waiting" a lost run's client gets: naming the lost daemon and when the job runs
 * again (at a free daemon's next sweep, a heartbeat). */
static void check_waiting(const Vspec__Event *ev, const char *lost_node) {
  assert_int_equal(ev->body_case, VSPEC__EVENT__BODY_PHASE);
  print_message("waiting: %s\n", ev->phase->message);
  assert_string_equal(ev->phase->name, "waiting");
  char want[64];
  snprintf(want, sizeof want, "daemon %s lost", lost_node);
  assert_non_null(strstr(ev->phase->message, want));
  assert_non_null(strstr(ev->phase->message, "the job restarts on another daemon within 1 s"));
  assert_true(ev->phase->has_eta_s);
  assert_true(ev->phase->eta_s > HEARTBEAT_MS / 1000.0 - 1e-6 &&
              ev->phase->eta_s < HEARTBEAT_MS / 1000.0 + 1e-6);
}

/* SIGKILL of the daemon running a job: once the job has been idle for the claim time, the
 * client is told that its daemon is lost and when the job runs again (a Phase "waiting",
 * once), then the other daemon takes the job over, within the claim time and a heartbeat
 * (plus a margin) of the kill, runs it again from the start, and the client gets a restarted
 * event and the same bytes as an undisturbed run. The job names no seed: every
 * delivery must draw the same one (the agent derives it from the job id), or the bytes could
 * not be the same. */
static void test_daemon_killed(void **state) {
  fleet_fx *t = *state;
  NEED(t);
  const double bound = (CLAIM_MS + HEARTBEAT_MS) / 1000.0 + 1.5;
  start_daemon(t, 0, "d0");
  start_daemon(t, 1, "d1");
  start_gateway(t, 0);
  vs_conn c;
  vs_client_open(&c, t->gw_ep[0]);
  uint64_t job = 0, seed = 0, rid = submit(&c, 150, 0);
  int victim = wait_running_on(t, &c, rid, &job, &seed);
  vs_harness_sleep_ms(300);
  kill(t->d[victim].pid, SIGKILL);
  double killed_at = vs_harness_now();
  vs_wait_pid(t->d[victim].pid, 3000);
  t->d[victim].pid = 0;
  int restarted = 0, waiting = 0;
  vs_conn_event e;
  for (;;) {
    assert_true(vs_harness_now() < killed_at + 40);
    vs_client_next(&c, 40000, &e);
    if (e.ev->job_id != job) {
      vs_conn_event_free(&e);
      continue;
    }
    if (e.ev->body_case == VSPEC__EVENT__BODY_PHASE) {
      assert_int_equal(restarted, 0); /* before the new run, and once */
      assert_int_equal(waiting, 0);
      check_waiting(e.ev, t->d[victim].name);
      waiting = 1;
    }
    if (e.ev->body_case == VSPEC__EVENT__BODY_RESTARTED) {
      double after = vs_harness_now() - killed_at;
      print_message("restarted %.2f s after the kill (bound %.2f s)\n", after, bound);
      assert_true(waiting);
      assert_true(after < bound);
      restarted = 1;
      assert_int_equal(e.ev->restarted->delivery, 2);
      assert_string_equal(e.ev->restarted->node, t->d[1 - victim].name);
    }
    if (e.ev->body_case == VSPEC__EVENT__BODY_RESULT || e.ev->body_case == VSPEC__EVENT__BODY_ERROR)
      break;
    vs_conn_event_free(&e);
  }
  if (e.ev->body_case != VSPEC__EVENT__BODY_RESULT) {
    dump_all(t);
    fail_msg("the job ended with: %s", e.ev->error->message);
  }
  assert_true(restarted);
  assert_string_equal(e.ev->result->node, t->d[1 - victim].name);
  assert_int_equal(e.ev->result->seed, seed);
  size_t ref_len, len;
  unsigned char *png = result_png(&e, &len);
  vs_conn_event_free(&e);

  /* the reference: the same submit with that seed, undisturbed */
  job = 0;
  rid = submit(&c, 150, seed);
  vs_client_until_end(&c, rid, &job, 30000, &e);
  unsigned char *ref = result_png(&e, &ref_len);
  vs_conn_event_free(&e);
  assert_int_equal(len, ref_len);
  assert_memory_equal(png, ref, len);
  free(png);
  free(ref);
  vs_conn_close(&c);
}

/* A job that takes every daemon that runs it down is failed after max_deliveries (2) with a
 * poison-job error instead of being run forever. */
static void test_poison_job(void **state) {
  fleet_fx *t = *state;
  NEED(t);
  SKIP_UNDER_SANITIZERS();
  start_daemon(t, 0, "d0");
  start_gateway(t, 0);
  vs_conn c;
  vs_client_open(&c, t->gw_ep[0]);
  uint64_t job = 0, rid = submit(&c, 200, 3);
  for (int round = 0; round < 2; round++) {
    int i = wait_running_on(t, &c, rid, &job, NULL);
    kill(t->d[i].pid, SIGKILL);
    vs_wait_pid(t->d[i].pid, 3000);
    t->d[i].pid = 0;
    start_daemon(t, round + 1, round ? "d2" : "d1");
  }
  vs_conn_event e;
  double end = vs_harness_now() + 30;
  for (;;) {
    assert_true(vs_harness_now() < end);
    vs_client_next(&c, 30000, &e);
    if (e.ev->job_id == job && (e.ev->body_case == VSPEC__EVENT__BODY_RESULT ||
                                e.ev->body_case == VSPEC__EVENT__BODY_ERROR))
      break;
    vs_conn_event_free(&e);
  }
  if (e.ev->body_case != VSPEC__EVENT__BODY_ERROR) dump_all(t);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  print_message("poison: %s\n", e.ev->error->message);
  assert_non_null(strstr(e.ev->error->message, "poison job: delivered 3 times"));
  vs_conn_event_free(&e);
  vs_conn_close(&c);
}

/* Cancel through the gateway reaches the daemon running the job (a flag it polls). */
static void test_cancel(void **state) {
  fleet_fx *t = *state;
  NEED(t);
  SKIP_UNDER_SANITIZERS();
  start_daemon(t, 0, "d0");
  start_gateway(t, 0);
  vs_conn c;
  vs_client_open(&c, t->gw_ep[0]);
  uint64_t job = 0, rid = submit(&c, 200, 4);
  wait_running_on(t, &c, rid, &job, NULL);
  vs_client_cancel(&c, job);
  vs_conn_event e;
  double end = vs_harness_now() + 10;
  for (;;) {
    assert_true(vs_harness_now() < end);
    vs_client_next(&c, 10000, &e);
    if (e.ev->job_id == job && (e.ev->body_case == VSPEC__EVENT__BODY_RESULT ||
                                e.ev->body_case == VSPEC__EVENT__BODY_ERROR))
      break;
    vs_conn_event_free(&e);
  }
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_CANCELLED);
  vs_conn_event_free(&e);
  vs_conn_close(&c);
}

/* A gateway killed in the middle of a job: the client resumes the job's events through
 * another gateway from the last cursor it saw, and gets exactly the events after it. */
static void test_gateway_restart_resume(void **state) {
  fleet_fx *t = *state;
  NEED(t);
  SKIP_UNDER_SANITIZERS();
  start_daemon(t, 0, "d0");
  start_gateway(t, 0);
  start_gateway(t, 1);
  vs_conn c;
  vs_client_open(&c, t->gw_ep[0]);
  uint64_t job = 0, rid = submit(&c, 100, 8);
  wait_running_on(t, &c, rid, &job, NULL);
  /* a progress event or two, then the gateway goes */
  char cursor[64] = "";
  for (int got = 0; got < 2;) {
    vs_conn_event e;
    vs_client_next(&c, 10000, &e);
    if (e.ev->job_id == job) {
      assert_non_null(e.ev->cursor);
      snprintf(cursor, sizeof cursor, "%s", e.ev->cursor);
      assert_true(e.ev->body_case == VSPEC__EVENT__BODY_PROGRESS);
      got++;
    }
    vs_conn_event_free(&e);
  }
  kill(t->gw[0], SIGKILL);
  vs_wait_pid(t->gw[0], 3000);
  t->gw[0] = 0;
  vs_conn_close(&c);

  vs_client_open(&c, t->gw_ep[1]);
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Resume rs = VSPEC__RESUME__INIT;
  rs.job_id = job;
  rs.after = cursor;
  rs.has_credit = 1;
  rs.credit = 64;
  r.body_case = VSPEC__REQUEST__BODY_RESUME;
  r.resume = &rs;
  char err[512];
  if (vs_conn_send(&c, &r, NULL, 0, err, sizeof err)) fail_msg("%s", err);
  /* Every event after the cursor, in order, none before it, then the result. */
  vs_conn_event e;
  int n = 0;
  double end = vs_harness_now() + 30;
  for (;;) {
    assert_true(vs_harness_now() < end);
    vs_client_next(&c, 30000, &e);
    if (e.ev->job_id == job) {
      assert_non_null(e.ev->cursor);
      /* stream ids grow: "<ms>-<seq>" compared as numbers */
      unsigned long long ms0, s0, ms1, s1;
      assert_int_equal(sscanf(cursor, "%llu-%llu", &ms0, &s0), 2);
      assert_int_equal(sscanf(e.ev->cursor, "%llu-%llu", &ms1, &s1), 2);
      assert_true(ms1 > ms0 || (ms1 == ms0 && s1 > s0));
      snprintf(cursor, sizeof cursor, "%s", e.ev->cursor);
      n++;
      if (e.ev->body_case == VSPEC__EVENT__BODY_RESULT) break;
      assert_int_not_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
    }
    vs_conn_event_free(&e);
  }
  assert_true(n >= 2); /* at least one progress event and the result */
  vs_conn_event_free(&e);
  vs_conn_close(&c);
}

/* Redis killed (SIGKILL) and restarted from its append-only file in the middle of a batch:
 * no job is lost and each ends exactly once at its client. */
static void test_redis_restart_aof(void **state) {
  fleet_fx *t = *state;
  NEED(t);
  SKIP_UNDER_SANITIZERS();
  start_daemon(t, 0, "d0");
  start_gateway(t, 0);
  vs_conn c;
  vs_client_open(&c, t->gw_ep[0]);
  enum { N = 6 };
  uint64_t job[N] = {0};
  for (int i = 0; i < N; i++) {
    uint64_t rid = submit(&c, 30, 100 + (uint64_t)i);
    /* the gateway's own Accepted carries the job id */
    for (;;) {
      vs_conn_event e;
      vs_client_next(&c, 10000, &e);
      int mine = e.ev->request_id == rid && e.ev->body_case == VSPEC__EVENT__BODY_ACCEPTED;
      if (mine) job[i] = e.ev->job_id;
      vs_conn_event_free(&e);
      if (mine) break;
    }
  }
  vs_harness_sleep_ms(300);
  vs_redis_kill(t->redis);
  vs_harness_sleep_ms(700);
  vs_redis_start(t->redis);
  int ended[N] = {0}, results = 0;
  double end = vs_harness_now() + 60;
  while (results < N) {
    assert_true(vs_harness_now() < end);
    vs_conn_event e;
    vs_client_next(&c, 60000, &e);
    for (int i = 0; i < N; i++)
      if (e.ev->job_id == job[i] && (e.ev->body_case == VSPEC__EVENT__BODY_RESULT ||
                                     e.ev->body_case == VSPEC__EVENT__BODY_ERROR)) {
        if (e.ev->body_case == VSPEC__EVENT__BODY_ERROR) {
          dump_all(t);
          fail_msg("job %d: %s", i, e.ev->error->message);
        }
        ended[i]++;
        results++;
      }
    vs_conn_event_free(&e);
  }
  for (int i = 0; i < N; i++) assert_int_equal(ended[i], 1);
  /* nothing left behind in the stream: every job was acked */
  vs_harness_sleep_ms(200);
  vs_conn_close(&c);
}

/* A queue handle on the test's Redis, to look at what the fleet left there. */
static vs_fleet_queue *open_fleet_queue(const fleet_fx *t) {
  vs_fleet_opts o;
  vs_fleet_opts_defaults(&o);
  o.url = t->redis->url;
  vs_fleet_queue *q;
  char err[512];
  if (vs_fleet_queue_open(&o, &q, err, sizeof err)) fail_msg("%s", err);
  return q;
}

static void until_result_of(vs_conn *c, uint64_t job, vs_conn_event *e) {
  double end = vs_harness_now() + 30;
  for (;;) {
    assert_true(vs_harness_now() < end);
    vs_client_next(c, 30000, e);
    if (ev_is_terminal_of(e->ev, job)) return;
    vs_conn_event_free(e);
  }
}

/* Counts the events of a job's stream in Redis by kind: daemons' Accepted (node not a
 * gateway's), results, restarted, and (phases may be NULL) phases. */
static void count_in_redis(vs_fleet_queue *q, uint64_t job, int *accepted, int *results,
                           int *restarts, int *phases) {
  char id[32], after[VS_FLEET_ID_MAX] = "0-0", err[512];
  snprintf(id, sizeof id, "%llu", (unsigned long long)job);
  *accepted = *results = *restarts = 0;
  if (phases) *phases = 0;
  for (;;) {
    vs_fleet_event ev[64];
    int n = vs_fleet_events_read(q, id, after, 0, ev, 64, err, sizeof err);
    if (n < 0) fail_msg("events of %s: %s", id, err);
    for (int i = 0; i < n; i++) {
      vs_wire_alloc a;
      vs_wire_alloc_init(&a, 1 << 20);
      Vspec__Event *e;
      vs_wire_blob blobs[VS_WIRE_MAX_BLOBS];
      int nb;
      if (vs_fleet_event_decode(ev[i].data, ev[i].len, &a, &e, blobs, &nb, err, sizeof err))
        fail_msg("event of %s: %s", id, err);
      if (e->body_case == VSPEC__EVENT__BODY_ACCEPTED && e->accepted->node &&
          strncmp(e->accepted->node, "gw", 2))
        (*accepted)++;
      *results += e->body_case == VSPEC__EVENT__BODY_RESULT;
      *restarts += e->body_case == VSPEC__EVENT__BODY_RESTARTED;
      if (phases) *phases += e->body_case == VSPEC__EVENT__BODY_PHASE;
      vs_wire_event_free(e, &a);
      snprintf(after, sizeof after, "%s", ev[i].id);
      vs_fleet_event_clear(&ev[i]);
    }
    if (n < 64) return;
  }
}

/* 200 jobs from two clients through two gateways onto three daemons, one of which is killed
 * part way: every job ends exactly once at its client with a result, none is left in the
 * stream, and none ran twice to completion except after a death (a restarted event). */
static void test_many_jobs(void **state) {
  fleet_fx *t = *state;
  NEED(t);
  SKIP_UNDER_SANITIZERS();
  start_daemon(t, 0, "d0");
  start_daemon(t, 1, "d1");
  start_daemon(t, 2, "d2");
  start_gateway(t, 0);
  start_gateway(t, 1);
  enum { N = 200, IN_FLIGHT = 12 };
  vs_conn c[2];
  vs_client_open(&c[0], t->gw_ep[0]);
  vs_client_open(&c[1], t->gw_ep[1]);
  static uint64_t rid[N], job[N];
  static int ended[N], who[N];
  int submitted = 0, done = 0, inflight[2] = {0, 0}, killed = 0;
  memset(ended, 0, sizeof ended);
  double end = vs_harness_now() + 120;
  while (done < N) {
    if (vs_harness_now() > end) {
      dump_all(t);
      fail_msg("%d of %d jobs ended within 120 s", done, N);
    }
    for (int k = 0; k < 2; k++)
      while (submitted < N && inflight[k] < IN_FLIGHT) {
        who[submitted] = k;
        rid[submitted] = submit(&c[k], 0, 1000 + (uint64_t)submitted);
        submitted++;
        inflight[k]++;
      }
    if (!killed && done >= N / 3) {
      kill(t->d[2].pid, SIGKILL);
      vs_wait_pid(t->d[2].pid, 3000);
      t->d[2].pid = 0;
      killed = 1;
    }
    for (int k = 0; k < 2; k++) {
      vs_conn_event e;
      char err[512];
      int rc = vs_conn_recv(&c[k], 5, &e, err, sizeof err);
      if (rc < 0) fail_msg("receive: %s", err);
      if (rc == 0) continue;
      Vspec__Event *ev = e.ev;
      for (int i = 0; i < submitted; i++) {
        if (who[i] != k) continue;
        if (!job[i] && ev->has_request_id && ev->request_id == rid[i] && ev->has_job_id)
          job[i] = ev->job_id;
        if (job[i] && ev->job_id == job[i] && (ev->body_case == VSPEC__EVENT__BODY_RESULT ||
                                              ev->body_case == VSPEC__EVENT__BODY_ERROR)) {
          if (ev->body_case == VSPEC__EVENT__BODY_ERROR) {
            dump_all(t);
            fail_msg("job %d: %s", i, ev->error->message);
          }
          ended[i]++;
          done++;
          inflight[k]--;
          break;
        }
      }
      vs_conn_event_free(&e);
    }
  }
  /* A second terminal event would come right after the first: give it the chance. */
  for (int k = 0; k < 2; k++) {
    vs_conn_event e;
    char err[512];
    while (vs_conn_recv(&c[k], 300, &e, err, sizeof err) == 1) {
      for (int i = 0; i < N; i++)
        if (ev_is_terminal_of(e.ev, job[i])) ended[i]++;
      vs_conn_event_free(&e);
    }
  }
  /* The queue drains, though not always by the time the last terminal event arrives: a
   * daemon writes a job's terminal event before it acks the job, and an entry the killed
   * daemon left pending goes only with the surviving daemons' next claim sweep (claims after
   * 1 s idle here). Bounded wait, then the same assertions. */
  vs_fleet_queue *q = open_fleet_queue(t);
  char err[512];
  long long length = -1, pending = -1;
  for (double drain_end = vs_harness_now() + 10;;) {
    if (vs_fleet_depth(q, &length, &pending, err, sizeof err)) fail_msg("%s", err);
    if ((length == 0 && pending == 0) || vs_harness_now() > drain_end) break;
    vs_harness_sleep_ms(100);
  }
  if (length != 0 || pending != 0) dump_all(t);
  assert_int_equal(length, 0);
  assert_int_equal(pending, 0);
  int restarted_jobs = 0;
  for (int i = 0; i < N; i++) {
    assert_int_equal(ended[i], 1);
    int accepted, results, restarts, phases;
    count_in_redis(q, job[i], &accepted, &results, &restarts, &phases);
    restarted_jobs += restarts > 0;
    /* each lost run announced to its client once, before its next run */
    assert_int_equal(phases, restarts);
    /* a run can die before its daemon accepted the job: no Accepted of its own */
    assert_true(accepted >= 1 && accepted <= 1 + restarts);
    assert_true(results == 1 || (results == 2 && restarts > 0));
  }
  print_message("200 jobs: %d run again after the kill of d2\n", restarted_jobs);
  vs_fleet_queue_destroy(&q);
  vs_conn_close(&c[0]);
  vs_conn_close(&c[1]);
}

/* A client-chosen job id makes a submit idempotent: the same submit sent again (here through
 * another gateway, as after losing the first) follows the job already in the fleet, which
 * runs once; the same id with another request is refused. */
static void test_retry_same_job_id(void **state) {
  fleet_fx *t = *state;
  NEED(t);
  start_daemon(t, 0, "d0");
  start_gateway(t, 0);
  start_gateway(t, 1);
  const uint64_t id = 0x1234567890abcdeull;
  vs_conn a, b;
  vs_client_open(&a, t->gw_ep[0]);
  vs_client_open(&b, t->gw_ep[1]);
  uint64_t job = 0, rid = submit_as(&a, 100, 77, id);
  wait_running_on(t, &a, rid, &job, NULL);
  assert_int_equal(job, id);
  uint64_t job_b = 0, rid_b = submit_as(&b, 100, 77, id);
  vs_conn_event ea, eb;
  vs_client_until_end(&b, rid_b, &job_b, 30000, &eb);
  assert_int_equal(job_b, id);
  until_result_of(&a, job, &ea);
  size_t la, lb;
  unsigned char *pa = result_png(&ea, &la), *pb = result_png(&eb, &lb);
  vs_conn_event_free(&ea);
  vs_conn_event_free(&eb);
  assert_int_equal(la, lb);
  assert_memory_equal(pa, pb, la);
  free(pa);
  free(pb);

  /* ran once: one daemon Accepted, one result in the job's events */
  vs_fleet_queue *q = open_fleet_queue(t);
  int accepted, results, restarts;
  count_in_redis(q, id, &accepted, &results, &restarts, NULL);
  assert_int_equal(accepted, 1);
  assert_int_equal(results, 1);
  vs_fleet_queue_destroy(&q);

  /* the same id for another request (another seed): refused */
  uint64_t none = 0;
  rid = submit_as(&b, 100, 78, id);
  vs_client_until_end(&b, rid, &none, 10000, &eb);
  assert_int_equal(eb.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  assert_int_equal(eb.ev->error->code, VSPEC__ERROR_CODE__ERR_INVALID);
  assert_non_null(strstr(eb.ev->error->message, "taken by a different request"));
  vs_conn_event_free(&eb);
  vs_conn_close(&a);
  vs_conn_close(&b);
}

/* A daemon running a long job with its claim time at three heartbeats: another daemon, free
 * and sweeping for lost jobs every heartbeat all along, neither takes the job over nor tells
 * its client it was lost; the job ends where it started, run once. */
static void test_live_daemon_keeps_job(void **state) {
  fleet_fx *t = *state;
  NEED(t);
  SKIP_UNDER_SANITIZERS();
  start_daemon(t, 0, "d0");
  start_gateway(t, 0);
  vs_conn c;
  vs_client_open(&c, t->gw_ep[0]);
  uint64_t job = 0, rid = submit(&c, 400, 21);
  assert_int_equal(wait_running_on(t, &c, rid, &job, NULL), 0);
  double t0 = vs_harness_now();
  start_daemon(t, 1, "d1"); /* free from now on: it would take a job left idle for 1 s */
  vs_conn_event e;
  for (;;) {
    assert_true(vs_harness_now() < t0 + 30);
    vs_client_next(&c, 30000, &e);
    if (e.ev->job_id == job) {
      assert_int_not_equal(e.ev->body_case, VSPEC__EVENT__BODY_PHASE);
      assert_int_not_equal(e.ev->body_case, VSPEC__EVENT__BODY_RESTARTED);
      if (ev_is_terminal_of(e.ev, job)) break;
    }
    vs_conn_event_free(&e);
  }
  double ran = vs_harness_now() - t0;
  print_message("the job ran %.1f s on d0 with d1 sweeping (claims after %d ms)\n", ran,
                CLAIM_MS);
  if (e.ev->body_case != VSPEC__EVENT__BODY_RESULT) {
    dump_all(t);
    fail_msg("the job ended with: %s", e.ev->error->message);
  }
  assert_string_equal(e.ev->result->node, "d0");
  vs_conn_event_free(&e);
  assert_true(ran > 2.5 * CLAIM_MS / 1000.0); /* a few claim times: a test of something */
  vs_fleet_queue *q = open_fleet_queue(t);
  int accepted, results, restarts, phases;
  count_in_redis(q, job, &accepted, &results, &restarts, &phases);
  assert_int_equal(accepted, 1);
  assert_int_equal(restarts, 0);
  assert_int_equal(phases, 0);
  vs_fleet_queue_destroy(&q);
  vs_client_status(t->d[1].admin_ep, &e);
  assert_int_equal(e.ev->status->totals->submitted, 0);
  vs_conn_event_free(&e);
  vs_conn_close(&c);
}

/* A daemon stopped with SIGTERM (drain = cancel) in the middle of a job hands it over: the
 * job is left pending, not failed, its client is told (a Phase "waiting" naming the stopping
 * daemon, once), and the other daemon takes it at its next sweep, without waiting out the
 * claim time, and runs it to its result. */
static void test_daemon_drained(void **state) {
  fleet_fx *t = *state;
  NEED(t);
  SKIP_UNDER_SANITIZERS();
  start_daemon(t, 0, "d0");
  start_daemon(t, 1, "d1");
  start_gateway(t, 0);
  vs_conn c;
  vs_client_open(&c, t->gw_ep[0]);
  uint64_t job = 0, rid = submit(&c, 150, 31);
  int i = wait_running_on(t, &c, rid, &job, NULL);
  vs_harness_sleep_ms(200);
  double stopped_at = vs_harness_now();
  assert_int_equal(vs_daemon_stop(&t->d[i], SIGTERM, 10000), 0);
  vs_conn_event e;
  int waiting = 0, restarted = 0;
  for (;;) {
    assert_true(vs_harness_now() < stopped_at + 30);
    vs_client_next(&c, 30000, &e);
    if (ev_is_terminal_of(e.ev, job)) break;
    if (e.ev->job_id == job && e.ev->body_case == VSPEC__EVENT__BODY_PHASE) {
      char want[64];
      snprintf(want, sizeof want, "daemon %s is stopping", t->d[i].name);
      print_message("waiting: %s\n", e.ev->phase->message);
      assert_non_null(strstr(e.ev->phase->message, want));
      assert_int_equal(restarted + waiting++, 0);
    }
    if (e.ev->job_id == job && e.ev->body_case == VSPEC__EVENT__BODY_RESTARTED) {
      /* a free daemon's next sweep (a heartbeat), not the claim time: the stop itself takes
       * most of this (the daemon cancels its job and exits) */
      print_message("restarted %.2f s after SIGTERM\n", vs_harness_now() - stopped_at);
      assert_true(vs_harness_now() - stopped_at < 0.9 * CLAIM_MS / 1000.0);
      assert_int_equal(waiting, 1);
      restarted = 1;
    }
    vs_conn_event_free(&e);
  }
  assert_int_equal(restarted, 1);
  if (e.ev->body_case != VSPEC__EVENT__BODY_RESULT) {
    dump_all(t);
    fail_msg("the job ended with: %s", e.ev->error->message);
  }
  assert_string_equal(e.ev->result->node, t->d[1 - i].name);
  vs_conn_event_free(&e);
  vs_conn_close(&c);
}

/* A submit the gateway takes but the daemon would refuse unread (over its request limit once
 * the agent adds a seed, so without a request id to answer with) ends with an error; it
 * does not wait for ever holding a worker and its claim. */
static void test_oversized_submit(void **state) {
  fleet_fx *t = *state;
  NEED(t);
  SKIP_UNDER_SANITIZERS();
  start_daemon(t, 0, "d0");
  start_gateway(t, 0);
  vs_conn c;
  vs_client_open(&c, t->gw_ep[0]);
  static char tag[65536];
  Vspec__Submit sub = VSPEC__SUBMIT__INIT;
  sub.model = "self";
  Vspec__Request r = VSPEC__REQUEST__INIT;
  r.version = 1;
  r.has_request_id = 1;
  r.request_id = 1;
  r.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  r.submit = &sub;
  size_t len = 65500;
  for (;;) { /* a request of 65530 bytes: under the gateway's 65536, over it with a seed */
    memset(tag, 'a', len);
    tag[len] = '\0';
    sub.tag = tag;
    size_t n = vspec__request__get_packed_size(&r);
    if (n == 65530) break;
    len += 65530 - (long)n;
  }
  uint64_t job = 0, rid = vs_client_submit(&c, &sub);
  vs_conn_event e;
  vs_client_until_end(&c, rid, &job, 40000, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  print_message("oversized: %s\n", e.ev->error->message);
  assert_true(e.ev->error->code == VSPEC__ERROR_CODE__ERR_TOO_LARGE ||
              e.ev->error->code == VSPEC__ERROR_CODE__ERR_INVALID);
  vs_conn_event_free(&e);
  vs_conn_close(&c);
}

/* Redis refusing writes (out of memory) while a job finishes: the agent keeps the job and
 * tries again, and the client gets the result once Redis takes writes again, not a poison
 * error and not nothing. */
static void test_redis_refuses_writes(void **state) {
  fleet_fx *t = *state;
  NEED(t);
  SKIP_UNDER_SANITIZERS();
  start_daemon(t, 0, "d0");
  start_gateway(t, 0);
  vs_conn c;
  vs_client_open(&c, t->gw_ep[0]);
  uint64_t job = 0, rid = submit(&c, 100, 5);
  wait_running_on(t, &c, rid, &job, NULL);
  redisContext *rc = redisConnectUnix(t->redis->sock);
  assert_true(rc && !rc->err);
  freeReplyObject(redisCommand(rc, "CONFIG SET maxmemory 1"));
  vs_harness_sleep_ms(3000); /* the job ends meanwhile: its result cannot be written */
  freeReplyObject(redisCommand(rc, "CONFIG SET maxmemory 0"));
  redisFree(rc);
  vs_conn_event e;
  until_result_of(&c, job, &e);
  if (e.ev->body_case != VSPEC__EVENT__BODY_RESULT) {
    dump_all(t);
    fail_msg("the job ended with: %s", e.ev->error->message);
  }
  vs_conn_event_free(&e);
  /* and it ran once: kept, not dropped and claimed again */
  vs_fleet_queue *q = open_fleet_queue(t);
  int accepted, results, restarts;
  count_in_redis(q, job, &accepted, &results, &restarts, NULL);
  assert_int_equal(restarts, 0);
  assert_int_equal(results, 1);
  vs_fleet_queue_destroy(&q);
  /* (events written while Redis refused writes are lost, a restart's included: the daemon's
   * own count tells a second run) */
  vs_client_status(t->d[0].admin_ep, &e);
  assert_int_equal(e.ev->status->totals->submitted, 1);
  vs_conn_event_free(&e);
  vs_conn_close(&c);
}

/* vspecd's check of its configuration: the service's keys, then [fleet]'s. */
static int config_check(const vs_daemon_config *c, char *err, size_t errlen) {
  int rc = vs_config_check(c, err, errlen);
  return rc ? rc : vs_fleet_config_check(c, err, errlen);
}

/* claim_idle_ms must be at least three heartbeats, and the default is that least value: a
 * config that breaks the rule is refused with both keys named. No Redis needed. */
static void test_claim_rule(void **state) {
  (void)state;
  vs_daemon_config c;
  char err[1024];
  vs_config_defaults(&c);
  assert_int_equal(c.fleet_claim_idle_ms, VS_FLEET_CLAIM_HEARTBEATS * c.fleet_heartbeat_ms);
  assert_true(c.fleet_claim_idle_ms <= 5000); /* was 30000: 44 s before a job ran again */
  assert_int_equal(vs_config_set_arg(&c, "fleet.redis=unix:///tmp/redis.sock", err, sizeof err),
                   0);
  assert_int_equal(config_check(&c, err, sizeof err), 0);
  assert_int_equal(vs_config_set_arg(&c, "fleet.claim_idle_ms=2999", err, sizeof err), 0);
  assert_int_equal(config_check(&c, err, sizeof err), VSPEC_EINVAL);
  print_message("refused: %s\n", err);
  assert_non_null(strstr(err, "fleet.claim_idle_ms = 2999"));
  assert_non_null(strstr(err, "fleet.heartbeat_ms (1000)"));
  assert_non_null(strstr(err, "at least 3000"));
  assert_int_equal(vs_config_set_arg(&c, "fleet.heartbeat_ms=999", err, sizeof err), 0);
  assert_int_equal(config_check(&c, err, sizeof err), 0);
  /* fleet mode off: the keys are not used, nothing to refuse */
  assert_int_equal(vs_config_set_arg(&c, "fleet.redis=", err, sizeof err), 0);
  assert_int_equal(vs_config_set_arg(&c, "fleet.heartbeat_ms=2000", err, sizeof err), 0);
  assert_int_equal(config_check(&c, err, sizeof err), 0);
  assert_int_not_equal(vs_config_set_arg(&c, "fleet.heartbeat_ms=10", err, sizeof err), 0);
}

/* Redis emptied under a running fleet (a restart without persistence): the idle daemon makes
 * the consumer group again by itself (its sweep, which comes before its read, must not fail
 * on the missing group for ever; a gateway's submit would make it too, so the group is looked
 * for before any), and the next job runs. */
static void test_redis_emptied(void **state) {
  fleet_fx *t = *state;
  NEED(t);
  SKIP_UNDER_SANITIZERS();
  start_daemon(t, 0, "d0");
  start_gateway(t, 0);
  vs_conn c;
  vs_client_open(&c, t->gw_ep[0]);
  vs_conn_event e;
  for (int k = 0; k < 2; k++) {
    if (k == 1) {
      redisContext *rc = redisConnectUnix(t->redis->sock);
      assert_true(rc && !rc->err);
      freeReplyObject(redisCommand(rc, "FLUSHALL"));
      long long groups = 0;
      for (double end = vs_harness_now() + 2; !groups && vs_harness_now() < end;) {
        vs_harness_sleep_ms(50);
        redisReply *r = redisCommand(rc, "EXISTS vspec:jobs"); /* XGROUP CREATE MKSTREAM */
        assert_true(r && r->type == REDIS_REPLY_INTEGER);
        groups = r->integer;
        freeReplyObject(r);
      }
      redisFree(rc);
      if (!groups) dump_all(t);
      assert_true(groups);
    }
    uint64_t job = 0, rid = submit(&c, 0, 60 + (uint64_t)k);
    vs_client_until_end(&c, rid, &job, 10000, &e);
    if (e.ev->body_case != VSPEC__EVENT__BODY_RESULT) {
      dump_all(t);
      fail_msg("job %d ended with: %s", k, e.ev->error->message);
    }
    vs_conn_event_free(&e);
  }
  vs_conn_close(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_claim_rule),
      cmocka_unit_test_setup_teardown(test_job_through_gateway, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_killed, setup, teardown),
      cmocka_unit_test_setup_teardown(test_live_daemon_keeps_job, setup, teardown),
      cmocka_unit_test_setup_teardown(test_daemon_drained, setup, teardown),
      cmocka_unit_test_setup_teardown(test_poison_job, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
      cmocka_unit_test_setup_teardown(test_gateway_restart_resume, setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_restart_aof, setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_emptied, setup, teardown),
      cmocka_unit_test_setup_teardown(test_many_jobs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_retry_same_job_id, setup, teardown),
      cmocka_unit_test_setup_teardown(test_oversized_submit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_refuses_writes, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
