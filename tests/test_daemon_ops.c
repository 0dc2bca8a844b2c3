/*
 * Operating vspecd: hot-swapping plugins under load (two builds of the test rule that differ
 * observably, and the llamagen backend itself), SIGTERM drains (finish, cancel, and under a flood of requests), CURVE
 * with an allow-list, and two daemons behind vspec-broker on one front endpoint.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/daemon_harness.h"

typedef struct fixture {
  vs_fixture fx;
  vs_daemon d[2];
  pid_t broker;
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
  if (f->broker > 0) {
    kill(f->broker, SIGKILL);
    vs_wait_pid(f->broker, 5000);
  }
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

static void test_two_daemons_behind_broker(void **state) {
  fixture *f = *state;
  const char *e1[] = {"--workers", "1", "--node-id", "1", NULL};
  const char *e2[] = {"--workers", "1", "--node-id", "2", NULL};
  vs_daemon_start(&f->d[0], &f->fx, "d1", e1);
  vs_daemon_start(&f->d[1], &f->fx, "d2", e2);
  char front[300], log[300];
  snprintf(front, sizeof front, "ipc://%s/front.sock", f->fx.dir);
  snprintf(log, sizeof log, "%s/broker.log", f->fx.dir);
  const char *args[] = {"--front", front, "--backend", f->d[0].job_ep, "--backend",
                        f->d[1].job_ep, "--heartbeat-ms", "100", NULL};
  f->broker = vs_spawn_tool("vspec-broker", args, log);
  /* the broker is up when it answers, and has seen both daemons when status says so */
  double end = vs_harness_now() + 20;
  for (;;) {
    char out[4096];
    const char *st[] = {"status", "--server", front, "--timeout", "1", NULL};
    if (vs_run_tool("vspec", st, out, sizeof out) == 0 && strstr(out, "2 of 2 daemons alive"))
      break;
    if (vs_harness_now() > end) fail_msg("broker not ready: %s", out);
    vs_harness_sleep_ms(50);
  }
  vs_conn c;
  vs_client_open(&c, front);
  enum { N = 6 };
  uint64_t jobs[N];
  for (int i = 0; i < N; i++)
    jobs[i] = accepted(&c, submit(&c, "self", "exact", NULL, "slow", "ms=15,depth=1",
                                  (uint64_t)i));
  outcome o[N];
  finish_all(&c, jobs, N, o);
  int on[2] = {0, 0};
  for (int i = 0; i < N; i++) {
    assert_int_equal(o[i].code, 0);
    on[!strcmp(o[i].node, "d2")]++;
  }
  printf("  %d jobs on d1, %d on d2\n", on[0], on[1]);
  assert_true(on[0] >= 1 && on[1] >= 1);
  /* job ids carry the node id, so they never collide */
  for (int i = 0; i < N; i++) assert_true((jobs[i] >> 40) == 1 || (jobs[i] >> 40) == 2);
  /* the CLI works through the broker */
  char img[300];
  snprintf(img, sizeof img, "%s/broker.png", f->fx.dir);
  const char *gen[] = {"generate", "--server", front, "--model", "micro", "--out", img,
                       "--quiet", NULL};
  assert_int_equal(vs_run_tool("vspec", gen, NULL, 0), 0);
  /* cancel through the broker reaches the right daemon */
  uint64_t job = accepted(&c, submit(&c, "self", "exact", NULL, "slow", "ms=50,depth=1", 9));
  running(&c, job);
  vs_client_cancel(&c, job);
  outcome oc;
  finish_all(&c, &job, 1, &oc);
  assert_int_equal(oc.code, VSPEC__ERROR_CODE__ERR_CANCELLED);
  /* one daemon dies mid-job: its job ends with "unavailable", the next job goes to the other */
  uint64_t j2[2];
  j2[0] = accepted(&c, submit(&c, "self", "exact", NULL, "slow", "ms=60,depth=1", 10));
  j2[1] = accepted(&c, submit(&c, "self", "exact", NULL, "slow", "ms=60,depth=1", 11));
  running(&c, j2[0]);
  int victim = (j2[0] >> 40) == 1 ? 0 : 1;
  vs_daemon_stop(&f->d[victim], SIGKILL, 5000);
  outcome od[2];
  finish_all(&c, j2, 2, od);
  assert_int_equal(od[0].code, VSPEC__ERROR_CODE__ERR_UNAVAILABLE);
  job = accepted(&c, submit(&c, "self", "exact", NULL, "slow", "ms=1,depth=1", 12));
  finish_all(&c, &job, 1, &oc);
  assert_int_equal(oc.code, 0);
  assert_string_equal(oc.node, victim ? "d1" : "d2");
  vs_conn_close(&c);
  kill(f->broker, SIGTERM);
  assert_int_equal(vs_wait_pid(f->broker, 10000), 0);
  f->broker = 0;
  stop_ok(&f->d[1 - victim]);
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
      Vspec__Submit sub = VSPEC__SUBMIT__INIT;
      sub.model = "micro";
      sub.has_seed = 1;
      sub.seed = (uint64_t)submitted;
      sub.has_preview = 1;
      sub.preview = VSPEC__PREVIEW_KIND__PREVIEW_LUT;
      sub.has_preview_every_tokens = 1;
      sub.preview_every_tokens = 1;
      sub.has_progress_interval_ms = 1;
      sub.progress_interval_ms = 0;
      sub.has_credit = 1;
      sub.credit = 4;
      rid[i] = vs_client_submit(&c, &sub);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_many_concurrent_jobs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_hot_swap_under_load, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sigterm_drain_finish, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sigterm_drain_cancel, setup, teardown),
      cmocka_unit_test_setup_teardown(test_sigterm_flood, setup, teardown),
      cmocka_unit_test_setup_teardown(test_curve_allow_list, setup, teardown),
      cmocka_unit_test_setup_teardown(test_two_daemons_behind_broker, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
