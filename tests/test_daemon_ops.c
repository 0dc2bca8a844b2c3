/*
 * Operating vspecd: hot-swapping plugins under load (two builds of the test rule that differ
 * observably, and the llamagen backend itself), SIGTERM drains (finish, cancel, and under a flood of requests), CURVE
 * with an allow-list; jobs use only plugins loaded at start or by an admin reload unless
 * plugins.on_demand. Review fixes: CURVE job ownership, and vspecd's Accepted retried when the
 * client's queue is full. (Several daemons behind one endpoint: tests/test_fleet_gateway.c.)
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto/curve_keys.h"
#include "tests/support/daemon_harness.h"
#include "tests/support/proc_mem.h"

typedef struct fixture {
  vs_fixture fx;
  vs_daemon d[2];
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  vs_fixture_make(&f->fx);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  for (int i = 0; i < 2; i++)
    if (f->d[i].pid > 0) vs_daemon_stop(&f->d[i], SIGKILL, 5000);
  vs_fixture_remove(&f->fx);
  free(f);
  return 0;
}

static void stop_ok(vs_daemon *d) {
  int rc = vs_daemon_stop(d, SIGTERM, 30000);
  if (rc != 0) {
    vs_daemon_dump_log(d);
    fail_msg("vspecd '%s' exited with %d", d->name, rc);
  }
}

static uint64_t submit(vs_conn *c, const char *model, const char *accept, const char *ap,
                       const char *sched, const char *sp, uint64_t seed) {
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = (char *)model;
  s.accept = (char *)accept;
  s.accept_params = (char *)ap;
  s.sched = (char *)sched;
  s.sched_params = (char *)sp;
  s.has_seed = 1;
  s.seed = seed;
  s.has_credit = 1;
  s.credit = 64;
  return vs_client_submit(c, &s);
}

/* Collects the terminal events of jobs[0..n): results get their stats copied. */
typedef struct outcome {
  int code; /* 0 = result, else the error code */
  double accept_rate;
  char rule[96];
  unsigned model_generation;
  char node[32];
} outcome;

/* Terminal events read while waiting for something else, kept for finish_all. */
static struct {
  uint64_t job;
  outcome o;
} stash[64];
static int n_stash;

static void record(const Vspec__Event *ev, outcome *o) {
  if (ev->body_case == VSPEC__EVENT__BODY_RESULT) {
    o->code = 0;
    o->accept_rate = ev->result->stats->accept_rate;
    snprintf(o->rule, sizeof o->rule, "%s",
             ev->result->stats->rule_version ? ev->result->stats->rule_version : "");
    o->model_generation = ev->result->stats->model_generation;
    snprintf(o->node, sizeof o->node, "%s", ev->result->node ? ev->result->node : "");
  } else {
    o->code = ev->error->code;
  }
}

static void keep(const Vspec__Event *ev) {
  if (!ev->has_job_id || (ev->body_case != VSPEC__EVENT__BODY_RESULT &&
                          ev->body_case != VSPEC__EVENT__BODY_ERROR))
    return;
  assert_true(n_stash < 64);
  stash[n_stash].job = ev->job_id;
  record(ev, &stash[n_stash].o);
  n_stash++;
}

/* Reads until the request's Accepted; returns the job id. */
static uint64_t accepted(vs_conn *c, uint64_t rid) {
  for (;;) {
    vs_conn_event e;
    vs_client_next(c, 20000, &e);
    if (e.ev->has_request_id && e.ev->request_id == rid) {
      if (e.ev->body_case != VSPEC__EVENT__BODY_ACCEPTED)
        fail_msg("refused: %s", e.ev->body_case == VSPEC__EVENT__BODY_ERROR
                                    ? e.ev->error->message : "?");
      uint64_t id = e.ev->job_id;
      vs_conn_event_free(&e);
      return id;
    }
    keep(e.ev);
    vs_conn_event_free(&e);
  }
}

/* Waits for the first progress event of a running job. */
static void running(vs_conn *c, uint64_t job) {
  for (;;) {
    vs_conn_event e;
    vs_client_next(c, 20000, &e);
    int p = e.ev->has_job_id && e.ev->job_id == job &&
            e.ev->body_case == VSPEC__EVENT__BODY_PROGRESS && e.ev->progress->round >= 0;
    keep(e.ev);
    vs_conn_event_free(&e);
    if (p) return;
  }
}

static void finish_all(vs_conn *c, const uint64_t *jobs, int n, outcome *out) {
  int left = n;
  for (int i = 0; i < n; i++) {
    out[i].code = -1;
    for (int k = 0; k < n_stash; k++)
      if (stash[k].job == jobs[i]) {
        out[i] = stash[k].o;
        stash[k] = stash[--n_stash];
        left--;
        break;
      }
  }
  while (left) {
    vs_conn_event e;
    vs_client_next(c, 30000, &e);
    Vspec__Event *ev = e.ev;
    for (int i = 0; i < n; i++) {
      if (!ev->has_job_id || ev->job_id != jobs[i]) continue;
      if (ev->body_case == VSPEC__EVENT__BODY_RESULT ||
          ev->body_case == VSPEC__EVENT__BODY_ERROR) {
        assert_int_equal(out[i].code, -1); /* exactly one terminal event */
        record(ev, &out[i]);
        left--;
      }
    }
    vs_conn_event_free(&e);
  }
}

static int plugin_field(const char *admin, const char *name, const char *field) {
  char out[16384];
  const char *args[] = {"plugins", "list", "--json", "--admin", admin, NULL};
  assert_int_equal(vs_run_tool("vspec", args, out, sizeof out), 0);
  char key[80];
  snprintf(key, sizeof key, "\"name\": \"%s\"", name);
  char *p = strstr(out, key);
  assert_non_null(p);
  char fk[64];
  snprintf(fk, sizeof fk, "\"%s\": ", field);
  char *q = strstr(p, fk);
  assert_non_null(q);
  return atoi(q + strlen(fk));
}

/* Polls the plugin's field until it equals `want` (SIGHUP is handled on the loop). */
static int plugin_field_becomes(const char *admin, const char *name, const char *field, int want) {
  int v = -1;
  for (int i = 0; i < 100 && (v = plugin_field(admin, name, field)) != want; i++)
    vs_harness_sleep_ms(50);
  return v;
}

/* SIGHUP (systemctl reload) rescans the plugin directory: a changed rule is reloaded, a new
 * plugin is loaded, an unchanged one is left alone, and a job runs on the new generation. */
static void test_sighup_refresh(void **state) {
  fixture *f = *state;
  vs_daemon_start(&f->d[0], &f->fx, "hup", NULL);
  vs_daemon *d = &f->d[0];
  assert_int_equal(plugin_field(d->admin_ep, "testrule", "generation"), 1);
  assert_int_equal(plugin_field(d->admin_ep, "slow", "generation"), 1);
  /* A signal with nothing changed reloads nothing. */
  assert_int_equal(kill(d->pid, SIGHUP), 0);
  vs_harness_sleep_ms(200);
  assert_int_equal(plugin_field(d->admin_ep, "testrule", "generation"), 1);
  vs_fixture_install(&f->fx, "testrule_v2.so", "accept_testrule.so");
  vs_fixture_install(&f->fx, "slowload.so", "sched_slowload.so");
  assert_int_equal(kill(d->pid, SIGHUP), 0);
  assert_int_equal(plugin_field_becomes(d->admin_ep, "testrule", "generation", 2), 2);
  assert_int_equal(plugin_field_becomes(d->admin_ep, "slowload", "generation", 1), 1);
  assert_int_equal(plugin_field(d->admin_ep, "slow", "generation"), 1);
  vs_conn c;
  vs_client_open(&c, d->job_ep);
  uint64_t job = accepted(&c, submit(&c, "self", "testrule", "scale=5", "slow", "ms=1,depth=2", 3));
  outcome o[1];
  finish_all(&c, &job, 1, o);
  assert_int_equal(o[0].code, 0);
  assert_non_null(strstr(o[0].rule, "test-2 (generation 2)"));
  vs_conn_close(&c);
  /* A rebuilt backend is reloaded with the models it serves. */
  char path[400];
  snprintf(path, sizeof path, "%s/backend_llamagen.so", f->fx.plugins);
  assert_int_equal(utimensat(AT_FDCWD, path, NULL, 0), 0);
  assert_int_equal(kill(d->pid, SIGHUP), 0);
  assert_int_equal(plugin_field_becomes(d->admin_ep, "llamagen", "generation", 2), 2);
}

static void test_hot_swap_under_load(void **state) {
  fixture *f = *state;
  const char *extra[] = {"--workers", "2", NULL};
  vs_daemon_start(&f->d[0], &f->fx, "swap", extra);
  vs_daemon *d = &f->d[0];
  vs_conn c;
  vs_client_open(&c, d->job_ep);
  /* generation 1 of the rule accepts with probability 0.1 * 5 = 0.5, generation 2 with 1.0 */
  uint64_t old_job = accepted(&c, submit(&c, "self", "testrule", "scale=5", "slow",
                                         "ms=40,depth=2", 3));
  running(&c, old_job);
  /* load beside it: a stream of short jobs from another client keeps the other worker busy */
  vs_conn other;
  vs_client_open(&other, d->job_ep);
  uint64_t bg[4];
  for (int i = 0; i < 4; i++) {
    Vspec__Submit s = VSPEC__SUBMIT__INIT;
    s.model = "micro";
    s.has_seed = 1;
    s.seed = (uint64_t)i;
    bg[i] = accepted(&other, vs_client_submit(&other, &s));
  }
  vs_fixture_install(&f->fx, "testrule_v2.so", "accept_testrule.so");
  char out[4096];
  const char *reload[] = {"plugins", "reload", "testrule", "--admin", d->admin_ep, NULL};
  assert_int_equal(vs_run_tool("vspec", reload, out, sizeof out), 0);
  assert_non_null(strstr(out, "generation 2"));
  assert_int_equal(plugin_field(d->admin_ep, "testrule", "generation"), 2);
  /* the running job still holds generation 1 */
  assert_int_equal(plugin_field(d->admin_ep, "testrule", "retired_alive"), 1);
  uint64_t new_job = accepted(&c, submit(&c, "self", "testrule", "scale=5", "slow",
                                         "ms=5,depth=2", 3));
  uint64_t jobs[2] = {old_job, new_job};
  outcome o[2];
  finish_all(&c, jobs, 2, o);
  outcome ob[4];
  finish_all(&other, bg, 4, ob);
  for (int i = 0; i < 4; i++) assert_int_equal(ob[i].code, 0);
  assert_int_equal(o[0].code, 0);
  assert_int_equal(o[1].code, 0);
  printf("  old job: %s, acceptance %.3f; new job: %s, acceptance %.3f\n", o[0].rule,
         o[0].accept_rate, o[1].rule, o[1].accept_rate);
  assert_non_null(strstr(o[0].rule, "test-1 (generation 1)"));
  assert_non_null(strstr(o[1].rule, "test-2 (generation 2)"));
  assert_true(o[0].accept_rate < 0.99); /* p = 0.5 per drafted token */
  assert_true(o[1].accept_rate == 1.0);  /* p = 1 */
  /* the old generation was released with its last job */
  assert_int_equal(plugin_field(d->admin_ep, "testrule", "retired_alive"), 0);

  /* the backend: reload llamagen while a job runs on the model it serves */
  old_job = accepted(&c, submit(&c, "self", "exact", NULL, "slow", "ms=40,depth=1", 4));
  running(&c, old_job);
  const char *rb[] = {"plugins", "reload", "backend/llamagen", "--admin", d->admin_ep, NULL};
  assert_int_equal(vs_run_tool("vspec", rb, out, sizeof out), 0);
  assert_non_null(strstr(out, "model self reopened"));
  assert_non_null(strstr(out, "model micro reopened"));
  new_job = accepted(&c, submit(&c, "self", "exact", NULL, "slow", "ms=1,depth=1", 4));
  jobs[0] = old_job;
  jobs[1] = new_job;
  finish_all(&c, jobs, 2, o);
  assert_int_equal(o[0].code, 0);
  assert_int_equal(o[1].code, 0);
  assert_int_equal(o[0].model_generation, 1);
  assert_int_equal(o[1].model_generation, 2);
  assert_int_equal(plugin_field(d->admin_ep, "llamagen", "generation"), 2);
  assert_int_equal(plugin_field(d->admin_ep, "llamagen", "retired_alive"), 0);
  /* a reload that fails keeps the current generation */
  const char *bad[] = {"plugins", "reload", "nosuchplugin", "--admin", d->admin_ep, NULL};
  assert_int_equal(vs_run_tool("vspec", bad, NULL, 0), 4);
  vs_conn_close(&other);
  vs_conn_close(&c);
  stop_ok(d);
}

/* Submits the test rule on model self and returns the terminal event's error message ("" for
 * a result). */
static void submit_testrule(vs_conn *c, char *msg, size_t n) {
  uint64_t rid = submit(c, "self", "testrule", NULL, "standard", NULL, 5), job = 0;
  vs_conn_event e;
  vs_client_until_end(c, rid, &job, 30000, &e);
  snprintf(msg, n, "%s", e.ev->body_case == VSPEC__EVENT__BODY_ERROR ? e.ev->error->message : "");
  if (e.ev->body_case == VSPEC__EVENT__BODY_ERROR)
    assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_INVALID);
  vs_conn_event_free(&e);
}

/* A job naming a plugin that was not loaded at start does not load it (a client must not be
 * able to make vspecd open a file) unless plugins.on_demand; an admin reload does. */
static void test_plugins_on_demand(void **state) {
  fixture *f = *state;
  char path[400], msg[1024], out[4096];
  snprintf(path, sizeof path, "%s/accept_testrule.so", f->fx.plugins);
  assert_int_equal(unlink(path), 0);
  vs_daemon_start(&f->d[0], &f->fx, "nodemand", NULL);
  vs_daemon *d = &f->d[0];
  vs_fixture_install(&f->fx, "testrule_v1.so", "accept_testrule.so");
  vs_conn c;
  vs_client_open(&c, d->job_ep);
  submit_testrule(&c, msg, sizeof msg);
  printf("  on_demand off: %s\n", msg);
  assert_non_null(strstr(msg, "accept plugin 'testrule' is not loaded"));
  const char *reload[] = {"plugins", "reload", "accept/testrule", "--admin", d->admin_ep, NULL};
  assert_int_equal(vs_run_tool("vspec", reload, out, sizeof out), 0);
  submit_testrule(&c, msg, sizeof msg);
  assert_string_equal(msg, "");
  vs_conn_close(&c);
  stop_ok(d);

  assert_int_equal(unlink(path), 0);
  const char *extra[] = {"--set", "plugins.on_demand=true", NULL};
  vs_daemon_start(&f->d[1], &f->fx, "ondemand", extra);
  d = &f->d[1];
  vs_fixture_install(&f->fx, "testrule_v1.so", "accept_testrule.so");
  vs_client_open(&c, d->job_ep);
  submit_testrule(&c, msg, sizeof msg);
  assert_string_equal(msg, "");
  vs_conn_close(&c);
  stop_ok(d);
}

/* Issue 32, finding 1: a plugin whose init fails, reloaded by an admin and loaded by jobs
 * (plugins.on_demand) again and again, mapped a new copy each time (300 reloads: 1500
 * mappings, RSS +21 MB). An unchanged failed build is refused before it is copied: the
 * daemon's mappings of it and its resident size stay as after the failure at start. */
static void test_failed_plugin_retried_flat(void **state) {
  fixture *f = *state;
  vs_fixture_install(&f->fx, "testrule_initfail.so", "accept_testrule.so");
  const char *extra[] = {"--set", "plugins.on_demand=true", NULL};
  vs_daemon_start(&f->d[0], &f->fx, "initfail", extra);
  vs_daemon *d = &f->d[0];
  /* the copies of plugin files are named g<gen>.<n>-<file> */
  int maps0 = vs_proc_maps_count(d->pid, "-accept_testrule.so");
  long rss0 = vs_proc_rss_kb(d->pid);
  assert_true(maps0 > 0); /* the scan at start tried it once */
  vs_conn adm, c;
  vs_client_open(&adm, d->admin_ep);
  vs_client_open(&c, d->job_ep);
  char err[512], msg[1024] = "";
  for (int i = 0; i < 150; i++) {
    Vspec__Request r = VSPEC__REQUEST__INIT;
    Vspec__ReloadRequest rl = VSPEC__RELOAD_REQUEST__INIT;
    rl.name = "accept/testrule";
    r.body_case = VSPEC__REQUEST__BODY_RELOAD;
    r.reload = &rl;
    vs_conn_event e;
    if (vs_conn_call(&adm, &r, 10000, &e, err, sizeof err) != 1) fail_msg("reload: %s", err);
    assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
    snprintf(msg, sizeof msg, "%s", e.ev->error->message);
    vs_conn_event_free(&e);
    uint64_t rid = submit(&c, "self", "testrule", NULL, "standard", NULL, 5), job = 0;
    vs_client_until_end(&c, rid, &job, 10000, &e);
    assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
    assert_non_null(strstr(e.ev->error->message, "is unchanged"));
    vs_conn_event_free(&e);
  }
  int maps1 = vs_proc_maps_count(d->pid, "-accept_testrule.so");
  long rss1 = vs_proc_rss_kb(d->pid);
  printf("  150 reloads and 150 on-demand jobs: %d -> %d mappings, RSS %ld -> %ld KiB\n  %s\n",
         maps0, maps1, rss0, rss1, msg);
  assert_non_null(strstr(msg, "failed to initialise before and is unchanged"));
  assert_int_equal(maps1, maps0);
  assert_true(rss1 - rss0 < 2048);
  vs_conn_close(&c);
  vs_conn_close(&adm);
  stop_ok(d);
}

static void test_sigterm_drain_finish(void **state) {
  fixture *f = *state;
  const char *extra[] = {"--workers", "1", NULL};
  vs_daemon_start(&f->d[0], &f->fx, "drain", extra);
  vs_daemon *d = &f->d[0];
  vs_conn c;
  vs_client_open(&c, d->job_ep);
  uint64_t run = accepted(&c, submit(&c, "self", "exact", NULL, "slow", "ms=30,depth=1", 1));
  uint64_t waiting = accepted(&c, submit(&c, "self", "exact", NULL, "slow", "ms=30,depth=1", 2));
  running(&c, run);
  kill(d->pid, SIGTERM);
  /* the waiting job is refused with a retry hint; the running one finishes */
  uint64_t jobs[2] = {run, waiting};
  outcome o[2];
  finish_all(&c, jobs, 2, o);
  assert_int_equal(o[0].code, 0);
  assert_int_equal(o[1].code, VSPEC__ERROR_CODE__ERR_SHUTTING_DOWN);
  int rc = vs_wait_pid(d->pid, 30000);
  d->pid = 0;
  if (rc != 0) vs_daemon_dump_log(d);
  assert_int_equal(rc, 0);
  vs_conn_close(&c);
  /* a clean exit leaves no socket file behind */
  assert_int_equal(strncmp(d->job_ep, "ipc://", 6), 0);
  assert_int_not_equal(access(d->job_ep + 6, F_OK), 0);
  assert_int_not_equal(access(d->admin_ep + 6, F_OK), 0);
}

static void test_sigterm_drain_cancel(void **state) {
  fixture *f = *state;
  const char *extra[] = {"--workers", "1", "--set", "shutdown.drain=cancel", NULL};
  vs_daemon_start(&f->d[0], &f->fx, "drainc", extra);
  vs_daemon *d = &f->d[0];
  vs_conn c;
  vs_client_open(&c, d->job_ep);
  uint64_t run = accepted(&c, submit(&c, "self", "exact", NULL, "slow", "ms=200,depth=1", 1));
  running(&c, run);
  double t0 = vs_harness_now();
  kill(d->pid, SIGTERM);
  outcome o;
  finish_all(&c, &run, 1, &o);
  assert_int_equal(o.code, VSPEC__ERROR_CODE__ERR_SHUTTING_DOWN);
  int rc = vs_wait_pid(d->pid, 30000);
  d->pid = 0;
  assert_int_equal(rc, 0);
  /* 16 rounds of 200 ms were not waited for */
  assert_true(vs_harness_now() - t0 < 1.5);
  vs_conn_close(&c);
}

/* Packs a request for raw sends (delimiter, protobuf). */
static size_t pack_rq(Vspec__Request *r, uint64_t rid, uint8_t *buf, size_t cap) {
  r->version = 1;
  r->has_request_id = 1;
  r->request_id = rid;
  size_t n = vspec__request__get_packed_size(r);
  assert_true(n <= cap);
  vspec__request__pack(r, buf);
  return n;
}

/* Reads whatever is there without waiting; returns the number of messages. */
static int drain_now(void *sock) {
  int got = 0;
  for (;;) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&m);
      return got;
    }
    got += !zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
}

/* One daemon drained under a flood of [Credit, Status] pairs: the Credit that reaches the
 * job after its worker has finished (before the worker's wake-up is handled) sends the
 * terminal event inside a read, so the daemon stops while more requests wait on the socket.
 * Nothing read after that may be handled (a Status would look at workers already joined).
 * Returns the daemon's exit status and, in *pairs, the number of pairs sent. */
static int flood_round(fixture *f, const char *name, int *pairs) {
  const char *extra[] = {"--workers", "1", NULL};
  vs_daemon_start(&f->d[0], &f->fx, name, extra);
  vs_daemon *d = &f->d[0];
  /* No receive limit: the replies never fill this client's queue, so the result is not held
   * in the daemon's outbox (which would end the drain from the timer instead). A deep send
   * queue keeps the daemon's socket readable the whole time. */
  vs_conn c = {.ctx = zmq_ctx_new(), .own_ctx = 1, .next_request_id = 1, .max_blob = 1 << 30};
  c.sock = zmq_socket(c.ctx, ZMQ_DEALER);
  int zero = 0, hwm = 20000;
  assert_int_equal(zmq_setsockopt(c.sock, ZMQ_RCVHWM, &zero, sizeof zero), 0);
  assert_int_equal(zmq_setsockopt(c.sock, ZMQ_SNDHWM, &hwm, sizeof hwm), 0);
  assert_int_equal(zmq_setsockopt(c.sock, ZMQ_LINGER, &zero, sizeof zero), 0);
  assert_int_equal(zmq_connect(c.sock, d->job_ep), 0);
  uint64_t job = accepted(&c, submit(&c, "self", "exact", NULL, "slow", "ms=20,depth=1", 1));
  running(&c, job);
  kill(d->pid, SIGTERM);
  uint8_t credit[64], status[64];
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Credit cr = VSPEC__CREDIT__INIT;
  cr.job_id = job;
  cr.grant = 1;
  r.body_case = VSPEC__REQUEST__BODY_CREDIT;
  r.credit = &cr;
  size_t nc = pack_rq(&r, 1000, credit, sizeof credit);
  Vspec__Request q = VSPEC__REQUEST__INIT;
  Vspec__StatusRequest sr = VSPEC__STATUS_REQUEST__INIT;
  q.body_case = VSPEC__REQUEST__BODY_STATUS;
  q.status = &sr;
  size_t ns = pack_rq(&q, 1001, status, sizeof status);
  int st = -3, sent = 0;
  double end = vs_harness_now() + 20;
  while (vs_harness_now() < end) {
    int full = 0;
    for (int k = 0; k < 2000 && !full; k++) {
      int is_status = k % 2;
      /* Only a message's first frame can meet a full queue. */
      if (zmq_send(c.sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) full = 1;
      else zmq_send(c.sock, is_status ? status : credit, is_status ? ns : nc, 0);
      sent += is_status && !full;
    }
    drain_now(c.sock);
    int w;
    pid_t pr = waitpid(d->pid, &w, WNOHANG);
    if (pr == d->pid) {
      st = WIFEXITED(w) ? WEXITSTATUS(w) : 128 + WTERMSIG(w);
      break;
    }
    if (full) usleep(500); /* the daemon has plenty to read: leave it the CPU */
  }
  if (st == -3) st = vs_daemon_stop(d, SIGKILL, 5000);
  d->pid = 0;
  if (st != 0) vs_daemon_dump_log(d);
  vs_conn_close(&c);
  *pairs = sent;
  return st;
}

/* Whether the drain ends inside a read depends on thread timing: a few rounds make it likely
 * that at least one does (each takes about half a second). */
static void test_sigterm_flood(void **state) {
  fixture *f = *state;
  for (int round = 0; round < 3; round++) {
    char name[16];
    snprintf(name, sizeof name, "flood%d", round);
    int pairs = 0, st = flood_round(f, name, &pairs);
    printf("  round %d: %d [Credit, Status] pairs sent while draining, exit %d\n", round, pairs,
           st);
    assert_int_equal(st, 0);
  }
}

static void test_curve_allow_list(void **state) {
  fixture *f = *state;
  char server[300], allowed[300], stranger[300], list[300], out[512];
  snprintf(server, sizeof server, "%s/server", f->fx.dir);
  snprintf(allowed, sizeof allowed, "%s/alice", f->fx.dir);
  snprintf(stranger, sizeof stranger, "%s/mallory", f->fx.dir);
  snprintf(list, sizeof list, "%s/clients.allow", f->fx.dir);
  const char *k1[] = {"keygen", server, NULL};
  assert_int_equal(vs_run_tool("vspec", k1, out, sizeof out), 0);
  const char *k2[] = {"keygen", allowed, NULL};
  assert_int_equal(vs_run_tool("vspec", k2, out, sizeof out), 0);
  char alice_pub[64];
  snprintf(alice_pub, sizeof alice_pub, "%.40s", out);
  const char *k3[] = {"keygen", stranger, NULL};
  assert_int_equal(vs_run_tool("vspec", k3, out, sizeof out), 0);
  FILE *l = fopen(list, "w");
  assert_non_null(l);
  fprintf(l, "# who may submit jobs\n%s alice\n", alice_pub);
  fclose(l);
  char skey[320], ckey[320], mkey[320], spub[320], sarg[400], larg[400];
  snprintf(skey, sizeof skey, "%s.key", server);
  snprintf(spub, sizeof spub, "%s.pub", server);
  snprintf(ckey, sizeof ckey, "%s.key", allowed);
  snprintf(mkey, sizeof mkey, "%s.key", stranger);
  snprintf(sarg, sizeof sarg, "curve.secret_key_file=%s", skey);
  snprintf(larg, sizeof larg, "curve.allowed_clients=%s", list);
  const char *extra[] = {"--set", "curve.enabled=true", "--set", sarg, "--set", larg, NULL};
  vs_daemon_start(&f->d[0], &f->fx, "curve", extra);
  vs_daemon *d = &f->d[0];
  const char *ok[] = {"ping", "--server", d->job_ep, "--curve-server-key", spub, "--curve-key",
                      ckey, "--timeout", "10", NULL};
  assert_int_equal(vs_run_tool("vspec", ok, out, sizeof out), 0);
  assert_non_null(strstr(out, "pong from curve"));
  char img[300];
  snprintf(img, sizeof img, "%s/curve.png", f->fx.dir);
  const char *gen[] = {"generate", "--server", d->job_ep, "--curve-server-key", spub,
                       "--curve-key", ckey, "--out", img, "--quiet", NULL};
  assert_int_equal(vs_run_tool("vspec", gen, NULL, 0), 0);
  /* a key that is not on the list, and no CURVE at all, get nothing */
  const char *no[] = {"ping", "--server", d->job_ep, "--curve-server-key", spub, "--curve-key",
                      mkey, "--timeout", "1", NULL};
  assert_int_equal(vs_run_tool("vspec", no, NULL, 0), 3);
  const char *plain[] = {"ping", "--server", d->job_ep, "--timeout", "1", NULL};
  assert_int_equal(vs_run_tool("vspec", plain, NULL, 0), 3);
  /* the admin endpoint stays local and plain */
  const char *adm[] = {"ping", "--via-admin", "--admin", d->admin_ep, NULL};
  assert_int_equal(vs_run_tool("vspec", adm, NULL, 0), 0);
  stop_ok(d);
}

/* A raw CURVE client with its own key file and a chosen routing id (ZMQ_ROUTING_ID): a peer
 * may pick any routing id, so it can take over another's envelope once that one has left. */
static void curve_open(vs_conn *c, const char *ep, const char *server_pub, const char *key,
                       const char *routing_id) {
  memset(c, 0, sizeof *c);
  snprintf(c->endpoint, sizeof c->endpoint, "%s", ep);
  c->ctx = zmq_ctx_new();
  c->own_ctx = 1;
  c->next_request_id = 1;
  c->max_blob = (size_t)1 << 30;
  c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
  assert_non_null(c->sock);
  char server[41], pub[41], sec[41], err[512];
  if (vs_curve_key_arg(server_pub, "public", server, err, sizeof err) ||
      vs_curve_read_key(key, "public", pub, err, sizeof err) ||
      vs_curve_read_key(key, "secret", sec, err, sizeof err))
    fail_msg("%s", err);
  int zero = 0;
  assert_int_equal(zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero), 0);
  assert_int_equal(zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, server, 40), 0);
  assert_int_equal(zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, pub, 40), 0);
  assert_int_equal(zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, sec, 40), 0);
  assert_int_equal(
      zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, routing_id, strlen(routing_id)), 0);
  assert_int_equal(zmq_connect(c->sock, ep), 0);
  /* Connected when a ping comes back: the ROUTER refuses a routing id still in use, and the
   * DEALER reconnects until the old peer's pipe is gone. */
  double end = vs_harness_now() + 10;
  for (;;) {
    Vspec__Request r = VSPEC__REQUEST__INIT;
    Vspec__Ping pg = VSPEC__PING__INIT;
    r.body_case = VSPEC__REQUEST__BODY_PING;
    r.ping = &pg;
    vs_conn_event e;
    int rc = vs_conn_call(c, &r, 200, &e, err, sizeof err);
    if (rc < 0) fail_msg("ping: %s", err);
    if (rc == 1) {
      vs_conn_event_free(&e);
      return;
    }
    if (vs_harness_now() > end) fail_msg("no pong on %s as '%s'", ep, routing_id);
  }
}

/* Sends a Cancel and returns the answer to it (an Error or Ack with its request id) or, if
 * the job ends first, the job's terminal event. */
static void cancel_answer(vs_conn *c, uint64_t job, vs_conn_event *e) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Cancel cc = VSPEC__CANCEL__INIT;
  cc.job_id = job;
  r.body_case = VSPEC__REQUEST__BODY_CANCEL;
  r.cancel = &cc;
  char err[512];
  if (vs_conn_send(c, &r, NULL, 0, err, sizeof err)) fail_msg("%s", err);
  for (;;) {
    vs_client_next(c, 10000, e);
    Vspec__Event *ev = e->ev;
    if (ev->has_request_id && ev->request_id == r.request_id) return;
    if (ev->has_job_id && ev->job_id == job && (ev->body_case == VSPEC__EVENT__BODY_RESULT ||
                                                ev->body_case == VSPEC__EVENT__BODY_ERROR))
      return;
    vs_conn_event_free(e);
  }
}

/* Key files for the ownership tests: a server key and two client keys, both on the
 * allow-list under one name (names are for the log only). */
typedef struct curve_keys {
  char spub[320], skey[320], akey[320], bkey[320], list[300];
} curve_keys;

static void curve_keys_make(const fixture *f, curve_keys *k) {
  char server[300], alice[300], bob[300], out[512], pub[2][64];
  snprintf(server, sizeof server, "%s/server", f->fx.dir);
  snprintf(alice, sizeof alice, "%s/alice", f->fx.dir);
  snprintf(bob, sizeof bob, "%s/bob", f->fx.dir);
  snprintf(k->list, sizeof k->list, "%s/clients.allow", f->fx.dir);
  const char *k1[] = {"keygen", server, NULL};
  assert_int_equal(vs_run_tool("vspec", k1, out, sizeof out), 0);
  const char *k2[] = {"keygen", alice, NULL};
  assert_int_equal(vs_run_tool("vspec", k2, out, sizeof out), 0);
  snprintf(pub[0], sizeof pub[0], "%.40s", out);
  const char *k3[] = {"keygen", bob, NULL};
  assert_int_equal(vs_run_tool("vspec", k3, out, sizeof out), 0);
  snprintf(pub[1], sizeof pub[1], "%.40s", out);
  FILE *l = fopen(k->list, "w");
  assert_non_null(l);
  fprintf(l, "%s team\n%s team\n", pub[0], pub[1]);
  fclose(l);
  snprintf(k->spub, sizeof k->spub, "%s.pub", server);
  snprintf(k->skey, sizeof k->skey, "%s.key", server);
  snprintf(k->akey, sizeof k->akey, "%s.key", alice);
  snprintf(k->bkey, sizeof k->bkey, "%s.key", bob);
}

/* With CURVE a client is its envelope and its key: alice submits a job and leaves; bob (an
 * allowed key) connects with alice's routing id and can neither credit nor cancel the job;
 * alice, back with her key, cancels it. No heartbeats or progress go out while alice is
 * away, so her job is not dropped as its client's. */
static void ownership_case(const char *ep, const curve_keys *k) {
  vs_conn a;
  curve_open(&a, ep, k->spub, k->akey, "owner");
  /* about 16 rounds of 500 ms, cancelled long before; no progress events */
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = "self";
  s.accept = "exact";
  s.sched = "slow";
  s.sched_params = "ms=500,depth=1";
  s.has_seed = 1;
  s.seed = 1;
  s.has_progress = 1;
  s.progress = 0;
  uint64_t job = accepted(&a, vs_client_submit(&a, &s));
  vs_conn_close(&a);
  /* bob, with alice's routing id */
  vs_conn b;
  curve_open(&b, ep, k->spub, k->bkey, "owner");
  vs_client_credit(&b, job, 8);
  vs_conn_event e;
  cancel_answer(&b, job, &e);
  if (e.ev->body_case != VSPEC__EVENT__BODY_ERROR || e.ev->has_job_id)
    fail_msg("another key's cancel was not refused (event %d: %s)", (int)e.ev->body_case,
             e.ev->body_case == VSPEC__EVENT__BODY_ERROR ? e.ev->error->message : "");
  assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_NOT_FOUND);
  vs_conn_event_free(&e);
  vs_conn_close(&b);
  /* alice is back: her job still runs, and she may cancel it */
  curve_open(&a, ep, k->spub, k->akey, "owner");
  cancel_answer(&a, job, &e);
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_ERROR);
  assert_true(e.ev->has_job_id && e.ev->job_id == job);
  assert_int_equal(e.ev->error->code, VSPEC__ERROR_CODE__ERR_CANCELLED);
  vs_conn_event_free(&e);
  vs_conn_close(&a);
}

static void test_curve_ownership(void **state) {
  fixture *f = *state;
  curve_keys k;
  curve_keys_make(f, &k);
  char sarg[400], larg[400];
  snprintf(sarg, sizeof sarg, "curve.secret_key_file=%s", k.skey);
  snprintf(larg, sizeof larg, "curve.allowed_clients=%s", k.list);
  const char *extra[] = {"--workers", "1", "--set", "curve.enabled=true", "--set", sarg,
                         "--set", larg, "--set", "limits.heartbeat_ivl_ms=60000", "--set",
                         "limits.heartbeat_timeout_ms=300000", NULL};
  vs_daemon_start(&f->d[0], &f->fx, "own", extra);
  ownership_case(f->d[0].job_ep, &k);
  stop_ok(&f->d[0]);
}

/* A client that reads nothing for a while: a DEALER whose receive queue holds one message. */
static void slow_client_open(vs_conn *c, const char *ep) {
  memset(c, 0, sizeof *c);
  c->ctx = zmq_ctx_new();
  c->own_ctx = 1;
  c->next_request_id = 1;
  c->max_blob = (size_t)1 << 30;
  snprintf(c->endpoint, sizeof c->endpoint, "%s", ep);
  c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
  int one = 1, zero = 0;
  assert_int_equal(zmq_setsockopt(c->sock, ZMQ_RCVHWM, &one, sizeof one), 0);
  assert_int_equal(zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero), 0);
  assert_int_equal(zmq_connect(c->sock, ep), 0);
}

/* A micro-model job that streams as much as it can: a lut preview after every token, progress
 * events unthrottled. */
static uint64_t submit_chatty(vs_conn *c, uint64_t seed, uint32_t credit) {
  Vspec__Submit sub = VSPEC__SUBMIT__INIT;
  sub.model = "micro";
  sub.has_seed = 1;
  sub.seed = seed;
  sub.has_preview = 1;
  sub.preview = VSPEC__PREVIEW_KIND__PREVIEW_LUT;
  sub.has_preview_every_tokens = 1;
  sub.preview_every_tokens = 1;
  sub.has_progress_interval_ms = 1;
  sub.progress_interval_ms = 0;
  sub.has_credit = 1;
  sub.credit = credit;
  return vs_client_submit(c, &sub);
}

/* Sends n Status requests (their answers fill the server's queue towards a client that does
 * not read); returns the first request id (the others follow it). */
static uint64_t status_flood(vs_conn *c, int n) {
  uint64_t first = c->next_request_id;
  for (int i = 0; i < n; i++) {
    Vspec__Request r = VSPEC__REQUEST__INIT;
    Vspec__StatusRequest sr = VSPEC__STATUS_REQUEST__INIT;
    r.body_case = VSPEC__REQUEST__BODY_STATUS;
    r.status = &sr;
    char err[512];
    if (vs_conn_send(c, &r, NULL, 0, err, sizeof err)) fail_msg("%s", err);
  }
  return first;
}

/* Waits until the daemon has finished n jobs (any outcome). */
static void wait_done(const char *admin_ep, int n) {
  double end = vs_harness_now() + 30;
  for (;;) {
    vs_conn_event e;
    vs_client_status(admin_ep, &e);
    uint64_t done = e.ev->status->totals->completed + e.ev->status->totals->failed +
                    e.ev->status->totals->cancelled;
    vs_conn_event_free(&e);
    if (done >= (uint64_t)n) return;
    if (vs_harness_now() > end) fail_msg("only %llu of %d jobs done", (unsigned long long)done, n);
    vs_harness_sleep_ms(50);
  }
}

/* vspecd itself: an Accepted that meets a full client queue is kept and retried, before
 * anything else of its job. The client asks for many Status answers (those that do not fit
 * are dropped: they are not job events), then submits and reads nothing until the jobs are
 * done; each job's first event must then be its Accepted (seq 0), its last the Result. */
static void test_accepted_retry(void **state) {
  fixture *f = *state;
  const char *extra[] = {"--workers", "1", "--set", "limits.heartbeat_ivl_ms=3000", "--set",
                         "limits.heartbeat_timeout_ms=15000", NULL};
  vs_daemon_start(&f->d[0], &f->fx, "acc", extra);
  vs_conn c;
  slow_client_open(&c, f->d[0].job_ep);
  status_flood(&c, 3000);
  enum { N = 4 };
  uint64_t rid[N], job[N] = {0}, next_seq[N] = {0};
  for (int i = 0; i < N; i++) {
    Vspec__Submit sub = VSPEC__SUBMIT__INIT;
    sub.model = "micro";
    sub.has_seed = 1;
    sub.seed = (uint64_t)i;
    rid[i] = vs_client_submit(&c, &sub);
  }
  wait_done(f->d[0].admin_ep, N);
  int results = 0, answers = 0;
  while (results < N) {
    vs_conn_event e;
    char err[512];
    int rc = vs_conn_recv(&c, 10000, &e, err, sizeof err);
    if (rc < 0) fail_msg("receive: %s", err);
    if (rc == 0) fail_msg("%d of %d results arrived", results, N);
    Vspec__Event *ev = e.ev;
    if (ev->body_case == VSPEC__EVENT__BODY_STATUS ||
        ev->body_case == VSPEC__EVENT__BODY_HEARTBEAT) {
      answers += ev->body_case == VSPEC__EVENT__BODY_STATUS;
      vs_conn_event_free(&e);
      continue;
    }
    int k = -1;
    for (int i = 0; i < N && k < 0; i++)
      if (ev->has_request_id && ev->request_id == rid[i]) k = i;
    if (k < 0) fail_msg("an event of no job of ours (body %d)", (int)ev->body_case);
    if (!job[k] && ev->body_case != VSPEC__EVENT__BODY_ACCEPTED)
      fail_msg("job %d: event %d (seq %llu) before its Accepted", k, (int)ev->body_case,
               (unsigned long long)ev->seq);
    if (ev->body_case == VSPEC__EVENT__BODY_ERROR) fail_msg("job %d: %s", k, ev->error->message);
    if (ev->body_case == VSPEC__EVENT__BODY_ACCEPTED) job[k] = ev->job_id;
    assert_true(ev->has_job_id && ev->job_id == job[k]);
    assert_true(next_seq[k] != UINT64_MAX);
    assert_int_equal(ev->seq, next_seq[k]);
    next_seq[k]++;
    if (ev->body_case == VSPEC__EVENT__BODY_RESULT) {
      next_seq[k] = UINT64_MAX;
      results++;
    }
    vs_conn_event_free(&e);
  }
  printf("  %d of 3000 status answers fitted; every job: Accepted first, Result last\n",
         answers);
  assert_true(answers < 3000); /* the queue was full when the Accepted went out */
  vs_conn_close(&c);
  stop_ok(&f->d[0]);
}

/* Many short jobs in flight on two workers, every round streamed: the mailbox between the
 * workers and the loop is busiest here (a job posted again while the loop works through the
 * list it took must not be lost or released twice; the ASan run checks). */
static void test_many_concurrent_jobs(void **state) {
  fixture *f = *state;
  const char *extra[] = {"--workers", "2", NULL};
  vs_daemon_start(&f->d[0], &f->fx, "many", extra);
  vs_daemon *d = &f->d[0];
  vs_conn c;
  vs_client_open(&c, d->job_ep);
  enum { TOTAL = 60, INFLIGHT = 12 };
  uint64_t rid[INFLIGHT] = {0}, job[INFLIGHT] = {0}, next_seq[INFLIGHT] = {0};
  int submitted = 0, done = 0, events = 0;
  while (done < TOTAL) {
    for (int i = 0; i < INFLIGHT && submitted < TOTAL; i++) {
      if (rid[i]) continue;
      rid[i] = submit_chatty(&c, (uint64_t)submitted, 4);
      job[i] = 0;
      next_seq[i] = 0;
      submitted++;
    }
    vs_conn_event e;
    vs_client_next(&c, 20000, &e);
    Vspec__Event *ev = e.ev;
    int k = -1;
    for (int i = 0; i < INFLIGHT; i++)
      if (rid[i] && ((job[i] && ev->has_job_id && ev->job_id == job[i]) ||
                     (!job[i] && ev->has_request_id && ev->request_id == rid[i])))
        k = i;
    assert_true(k >= 0);
    if (ev->body_case == VSPEC__EVENT__BODY_ERROR) fail_msg("%s", ev->error->message);
    assert_int_equal(ev->seq, next_seq[k]);
    next_seq[k]++;
    events++;
    if (ev->body_case == VSPEC__EVENT__BODY_ACCEPTED) job[k] = ev->job_id;
    if (ev->body_case == VSPEC__EVENT__BODY_PROGRESS || ev->body_case == VSPEC__EVENT__BODY_PREVIEW)
      vs_client_credit(&c, job[k], 1);
    if (ev->body_case == VSPEC__EVENT__BODY_RESULT) {
      rid[k] = 0;
      done++;
    }
    vs_conn_event_free(&e);
  }
  printf("  %d jobs, %d events\n", TOTAL, events);
  /* a worker finishes its bookkeeping just after the result is out */
  for (int tries = 0;; tries++) {
    vs_conn_event e;
    vs_client_status(d->admin_ep, &e);
    assert_int_equal(e.ev->status->totals->completed, TOTAL);
    int idle = e.ev->status->running == 0;
    vs_conn_event_free(&e);
    if (idle) break;
    assert_true(tries < 100);
    vs_harness_sleep_ms(10);
  }
  vs_conn_close(&c);
  stop_ok(d);
}

/* A second vspecd given the same ipc paths refuses to start, before loading anything, and
 * leaves the first one serving; a client of an endpoint nobody serves is told so at once
 * instead of waiting out its timeout. */
static void test_endpoint_in_use_and_nobody_there(void **state) {
  fixture *f = *state;
  vs_daemon_start(&f->d[0], &f->fx, "first", NULL);
  char log[300], job_ep[300];
  snprintf(log, sizeof log, "%s/second.log", f->fx.dir);
  snprintf(job_ep, sizeof job_ep, "ipc://%s/second-job.sock", f->fx.dir);
  char micro[1200];
  snprintf(micro, sizeof micro, "micro=%s", f->fx.micro_model);
  const char *args[] = {"--endpoint", job_ep, "--admin", f->d[0].admin_ep, "--plugins",
                        f->fx.plugins, "--model", micro, "--set", "models.fmnist=",
                        "--default-model", "micro", NULL};
  pid_t pid = vs_spawn_tool("vspecd", args, log);
  assert_int_equal(vs_wait_pid(pid, 10000), 1);
  char text[4096] = "";
  FILE *in = fopen(log, "r");
  assert_non_null(in);
  size_t n = fread(text, 1, sizeof text - 1, in);
  text[n] = '\0';
  fclose(in);
  assert_non_null(strstr(text, "another process serves"));
  assert_null(strstr(text, "[models]")); /* refused before any model was loaded */
  vs_conn_event e;
  vs_client_status(f->d[0].admin_ep, &e); /* the first one still answers */
  assert_int_equal(e.ev->body_case, VSPEC__EVENT__BODY_STATUS);
  vs_conn_event_free(&e);

  char none[300];
  snprintf(none, sizeof none, "ipc://%s/nobody.sock", f->fx.dir);
  const char *st[] = {"status", "--admin", none, "--timeout", "30", NULL};
  double t0 = vs_harness_now();
  assert_int_equal(vs_run_tool("vspec", st, NULL, 0), 3); /* EXIT_UNREACHABLE */
  assert_true(vs_harness_now() - t0 < 15); /* told at once, not after its 30 s */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_many_concurrent_jobs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_endpoint_in_use_and_nobody_there, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hot_swap_under_load, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sighup_refresh, setup, teardown),
      cmocka_unit_test_setup_teardown(test_plugins_on_demand, setup, teardown),
      cmocka_unit_test_setup_teardown(test_failed_plugin_retried_flat, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sigterm_drain_finish, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sigterm_drain_cancel, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sigterm_flood, setup, teardown),
      cmocka_unit_test_setup_teardown(test_curve_allow_list, setup, teardown),
      cmocka_unit_test_setup_teardown(test_curve_ownership, setup, teardown),
      cmocka_unit_test_setup_teardown(test_accepted_retry, setup, teardown),
  };
  /* VSPEC_TEST_FILTER=test_curve_* runs only the matching tests */
  if (getenv("VSPEC_TEST_FILTER")) cmocka_set_test_filter(getenv("VSPEC_TEST_FILTER"));
  return cmocka_run_group_tests(tests, NULL, NULL);
}
