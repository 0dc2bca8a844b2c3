/*
 * The daemon's parts without a daemon: configuration parsing and its error messages, the job
 * queue's order (priority, fairness between clients, arrival), capacity and removal, the wire
 * framing over a real ROUTER/DEALER pair (envelopes, delimiters, limits, blobs), the bounded
 * unpacking allocator, CURVE key files, the preview colour table, and a socket watch closed
 * from its own read callback.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/host.h"
#include "daemon/preview_cache.h"
#include "daemon/config.h"
#include "daemon/job_queue.h"
#include "daemon/plugin_ref.h"
#include "daemon/preview.h"
#include "daemon/server.h"
#include "daemon/zsock_watch.h"
#include "kernels/vs_kernels.h"
#include "proto/curve_keys.h"
#include "proto/wire.h"
#include "proto/wire_text.h"
#include "tests/support/daemon_harness.h"

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void test_config(void **state) {
  (void)state;
  vs_daemon_config c;
  char err[1024], path[64] = "/tmp/vspec-conf-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  vs_config_defaults(&c);
  assert_int_equal(vs_config_check(&c, err, sizeof err), 0);
  assert_string_equal(c.endpoint, "tcp://127.0.0.1:5555");
  write_text(path,
             "# comment\n[server]\nendpoint = ipc:///tmp/x.sock\nnode = gpu-1\nlog_level = debug\n"
             "[workers]\ncount = 3\n[queue]\nsize = 7\n[models]\ndefault = micro\n"
             "micro = tests/golden/micro_c2i\nfmnist =\n[defaults]\nmethod = sd:lantern:delta=0.2\n"
             "[shutdown]\ndrain = cancel\n[curve]\nenabled = no\n");
  assert_int_equal(vs_config_load(&c, path, err, sizeof err), 0);
  assert_string_equal(c.endpoint, "ipc:///tmp/x.sock");
  assert_string_equal(c.node, "gpu-1");
  assert_int_equal(c.log_level, 3);
  assert_int_equal(c.workers, 3);
  assert_int_equal(c.queue_size, 7);
  assert_int_equal(c.n_models, 1);
  assert_string_equal(c.models[0].name, "micro");
  assert_string_equal(c.method, "sd:lantern:delta=0.2");
  assert_int_equal(c.drain, VS_DRAIN_CANCEL);
  assert_int_equal(vs_config_check(&c, err, sizeof err), 0);
  /* --set goes through the same parser */
  assert_int_equal(vs_config_set_arg(&c, "queue.size=9", err, sizeof err), 0);
  assert_int_equal(c.queue_size, 9);
  assert_int_not_equal(vs_config_set_arg(&c, "queue.size", err, sizeof err), 0);
  assert_non_null(strstr(err, "section.key=value"));
  /* errors name the file, the key and what is allowed */
  const char *bad[][2] = {{"[workers]\ncount = 0\n", "workers.count"},
                          {"[workers]\ncount = many\n", "not an integer"},
                          {"[server]\nendpoint = http://x\n", "not a ZeroMQ endpoint"},
                          {"[server]\nlog_level = loud\n", "log_level"},
                          {"[nosuch]\nx = 1\n", "unknown section"},
                          {"[queue]\nsizes = 1\n", "unknown key 'sizes'"},
                          {"[defaults]\nmethod = sd:\n", "acceptance rule"},
                          {"[shutdown]\ndrain = maybe\n", "finish"},
                          {"[curve]\nenabled = perhaps\n", "boolean"},
                          {"[device]\nkind = gpu\n", "cpu, cuda"},
                          {"[device]\nprecision = fp8\n", "default, fp32, bf16"},
                          {"[device]\nmemory_limit_mb = -1\n", "device.memory_limit_mb"},
                          {"[workers]\nbatch = 0\n", "workers.batch"},
                          {"[workers]\nbatch_wait_ms = 0\n", "workers.batch_wait_ms"},
                          {"[workers]\nbatch_lanes = 17\n", "workers.batch_lanes"},
                          {"not an ini line\n", "line 1"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    vs_config_defaults(&c);
    write_text(path, bad[i][0]);
    assert_int_not_equal(vs_config_load(&c, path, err, sizeof err), 0);
    if (!strstr(err, bad[i][1])) fail_msg("case %zu: '%s' lacks '%s'", i, err, bad[i][1]);
    assert_non_null(strstr(err, path));
  }
  /* cross-key checks */
  vs_config_defaults(&c);
  assert_int_equal(vs_config_set(&c, "models", "default", "nope", err, sizeof err), 0);
  assert_int_not_equal(vs_config_check(&c, err, sizeof err), 0);
  assert_non_null(strstr(err, "nope"));
  vs_config_defaults(&c);
  vs_config_set(&c, "curve", "enabled", "true", err, sizeof err);
  assert_int_not_equal(vs_config_check(&c, err, sizeof err), 0);
  assert_non_null(strstr(err, "secret_key_file"));
  vs_config_defaults(&c);
  vs_config_set(&c, "server", "admin_endpoint", c.endpoint, err, sizeof err);
  assert_int_not_equal(vs_config_check(&c, err, sizeof err), 0);
  /* the admin endpoint: only this machine, unless server.admin_allow_remote */
  static const struct {
    const char *ep;
    int ok;
  } admin[] = {{"tcp://127.0.0.1:5599", 1}, {"tcp://localhost:5599", 1}, {"tcp://[::1]:5599", 1},
               {"ipc:///tmp/vspec-admin.sock", 1}, {"tcp://0.0.0.0:5599", 0},
               {"tcp://*:5599", 0}, {"tcp://10.1.2.3:5599", 0}, {"tcp://eth0:5599", 0},
               {"ipc://@vspec-admin", 0}};
  for (size_t i = 0; i < sizeof admin / sizeof *admin; i++) {
    for (int allow = 0; allow < 2; allow++) {
      vs_config_defaults(&c);
      vs_config_set(&c, "models", "m", "tests/golden/micro_c2i", err, sizeof err);
      assert_int_equal(vs_config_set(&c, "server", "admin_endpoint", admin[i].ep, err, sizeof err), 0);
      if (allow) vs_config_set(&c, "server", "admin_allow_remote", "true", err, sizeof err);
      int rc = vs_config_check(&c, err, sizeof err);
      if ((rc == 0) != (admin[i].ok || allow)) fail_msg("%s (allow %d): %d %s", admin[i].ep, allow, rc, err);
      if (rc) assert_non_null(strstr(err, "admin_allow_remote"));
    }
  }
  unlink(path);
  assert_int_not_equal(vs_config_load(&c, path, err, sizeof err), 0);
  /* [device]: cuda:N from kind and index; GPU-only keys are refused for the CPU */
  vs_config_defaults(&c);
  char spec[32];
  vs_config_device_spec(&c, spec, sizeof spec);
  assert_string_equal(spec, "cpu");
  assert_int_equal(vs_config_set_arg(&c, "device.kind=cuda", err, sizeof err), 0);
  assert_int_equal(vs_config_set_arg(&c, "device.index=2", err, sizeof err), 0);
  assert_int_equal(vs_config_set_arg(&c, "device.precision=fp32", err, sizeof err), 0);
  vs_config_device_spec(&c, spec, sizeof spec);
  assert_string_equal(spec, "cuda:2");
  assert_int_equal(vs_config_check(&c, err, sizeof err), 0);
  assert_int_equal(vs_config_set_arg(&c, "device.kind=cpu", err, sizeof err), 0);
  assert_int_not_equal(vs_config_check(&c, err, sizeof err), 0);
  assert_non_null(strstr(err, "kind = cpu"));
  /* cross-job batching: one job per worker in a batch, on the CPU or a GPU (the gate orders
   * the workers' streams around a batch: core/forward_gate.c) */
  vs_config_defaults(&c);
  assert_int_equal(vs_config_set_arg(&c, "workers.batch=4", err, sizeof err), 0);
  assert_int_not_equal(vs_config_check(&c, err, sizeof err), 0);
  assert_non_null(strstr(err, "count >= 4"));
  assert_int_equal(vs_config_set_arg(&c, "workers.count=4", err, sizeof err), 0);
  assert_int_equal(vs_config_check(&c, err, sizeof err), 0);
  assert_int_equal(vs_config_set_arg(&c, "device.kind=cuda", err, sizeof err), 0);
  assert_int_equal(vs_config_check(&c, err, sizeof err), 0);
  /* the shipped example configuration is valid */
  vs_config_defaults(&c);
  if (vs_config_load(&c, "etc/vspecd.conf", err, sizeof err)) fail_msg("%s", err);
  assert_int_equal(vs_config_check(&c, err, sizeof err), 0);
}

/* vspecd configured for a GPU on a machine without one refuses to start and says why (with
 * a GPU it starts, and the status names the device). */
static void test_server_device(void **state) {
  (void)state;
  vs_daemon_config c;
  char err[1024] = "";
  vs_config_defaults(&c);
  vs_config_set(&c, "server", "endpoint", "ipc:///tmp/vspec-units-dev.sock", err, sizeof err);
  vs_config_set(&c, "server", "admin_endpoint", "ipc:///tmp/vspec-units-dev-admin.sock", err,
                sizeof err);
  vs_config_set(&c, "models", "micro", "tests/golden/micro_c2i", err, sizeof err);
  vs_config_set(&c, "models", "default", "micro", err, sizeof err);
  char plugins[512];
  snprintf(plugins, sizeof plugins, "%s/plugins", getenv("VSPEC_BUILD") ? getenv("VSPEC_BUILD") : "build");
  vs_config_set(&c, "plugins", "dir", plugins, err, sizeof err);
  assert_int_equal(vs_config_set_arg(&c, "device.kind=cuda", err, sizeof err), 0);
  vs_server *s = NULL;
  int refused = 0;
  int rc = vs_server_open(&c, NULL, 0, &s, &refused, err, sizeof err);
  if (rc == 0) { /* a GPU is here */
    vs_server_close(s);
    return;
  }
  assert_null(s);
  assert_true(refused); /* vspecd exits 2: a device this host does not have */
  printf("  vspecd with [device] kind = cuda: %s\n", err);
  assert_non_null(strstr(err, "[device] cuda:0:"));
  assert_true(strstr(err, "no CUDA device") || strstr(err, "no CUDA support") ||
              strstr(err, "cannot load the CUDA module"));
}

static vs_djob *job(uint64_t id, int priority, uint64_t client) {
  vs_djob *j = vs_djob_new(id, 4);
  assert_non_null(j);
  j->priority = priority;
  j->client_key = client;
  return j;
}

static void test_job_queue(void **state) {
  (void)state;
  vs_job_queue *q;
  assert_int_equal(vs_job_queue_open(4, 2, &q), 0);
  /* client A floods, client B comes later, one urgent job */
  vs_djob *a1 = job(1, 0, 0xA), *a2 = job(2, 0, 0xA), *a3 = job(3, 0, 0xA), *b1 = job(4, 0, 0xB);
  vs_djob *urgent = job(5, 5, 0xA), *extra = job(6, 0, 0xC);
  assert_int_equal(vs_job_queue_push(q, a1), 0);
  assert_int_equal(vs_job_queue_push(q, a2), 0);
  assert_int_equal(vs_job_queue_push(q, a3), 0);
  assert_int_equal(vs_job_queue_push(q, b1), 0);
  assert_int_equal(vs_job_queue_push(q, extra), VSPEC_EBUSY); /* bounded: 4 waiting */
  assert_int_equal(vs_job_queue_waiting(q), 4);
  assert_int_equal(vs_job_queue_position(q, a1), 0);
  /* clients take turns: B's first job comes right after A's first, not after all of A's */
  assert_int_equal(vs_job_queue_position(q, b1), 1);
  assert_int_equal(vs_job_queue_position(q, a2), 2);
  vs_djob *p = vs_job_queue_pop(q);
  assert_ptr_equal(p, a1);
  assert_int_equal(p->state, VS_JOB_RUNNING);
  assert_int_equal(vs_job_queue_position(q, b1), 0);
  assert_int_equal(vs_job_queue_push(q, urgent), 0);
  vs_djob *p2 = vs_job_queue_pop(q);
  assert_ptr_equal(p2, urgent); /* priority beats fairness */
  vs_job_queue_done(q, p);
  vs_job_queue_done(q, p2);
  assert_int_equal(p->state, VS_JOB_DONE);
  vs_djob_release(p);
  vs_djob_release(p2);
  /* removal of a waiting job; a popped job cannot be removed */
  assert_int_equal(vs_job_queue_remove(q, a3), 1);
  assert_int_equal(vs_job_queue_position(q, a3), -1);
  /* nothing of A's runs now, but B has not had its turn: b1 before a2 */
  vs_djob *p3 = vs_job_queue_pop(q);
  assert_ptr_equal(p3, b1);
  assert_int_equal(vs_job_queue_remove(q, b1), 0);
  assert_int_equal(vs_job_queue_running(q), 1);
  vs_job_queue_done(q, p3);
  vs_djob_release(p3);
  vs_djob *all[4];
  assert_int_equal(vs_job_queue_take_all(q, all, 4), 1);
  assert_ptr_equal(all[0], a2);
  vs_djob_release(all[0]);
  vs_job_queue_stop(q);
  assert_null(vs_job_queue_pop(q));
  assert_int_equal(vs_job_queue_push(q, extra), VSPEC_ECANCELED);
  vs_job_queue_close(q);
  vs_djob *mine[] = {a1, a2, a3, b1, urgent, extra};
  for (int i = 0; i < 6; i++) vs_djob_release(mine[i]);
}

/* Defect 6 (docs/RELIABILITY.md): one worker, one client's backlog, a newcomer. Only running
 * jobs counted, and with one worker none of the backlog's is running when the next job is
 * picked, so the newcomer waited behind all of it. Now each client gets its turn: the
 * newcomer's job is taken right after the one running, and clients that keep submitting
 * alternate. */
static void test_job_queue_newcomer(void **state) {
  (void)state;
  enum { BACKLOG = 10 };
  vs_job_queue *q;
  assert_int_equal(vs_job_queue_open(64, 1, &q), 0);
  vs_djob *a[BACKLOG];
  for (int i = 0; i < BACKLOG; i++) {
    a[i] = job((uint64_t)i + 1, 0, 0xA);
    assert_int_equal(vs_job_queue_push(q, a[i]), 0);
  }
  vs_djob *run = vs_job_queue_pop(q);
  assert_ptr_equal(run, a[0]);
  vs_djob *b1 = job(100, 0, 0xB), *b2 = job(101, 0, 0xB), *c1 = job(200, 0, 0xC);
  assert_int_equal(vs_job_queue_push(q, b1), 0);
  assert_int_equal(vs_job_queue_push(q, b2), 0);
  assert_int_equal(vs_job_queue_position(q, b1), 0);
  /* the order the single worker takes them in: A, B and (later) C in rotation */
  vs_djob *want[] = {b1, a[1], b2, c1, a[2], a[3]};
  for (int k = 0; k < 6; k++) {
    vs_job_queue_done(q, run);
    vs_djob_release(run);
    if (k == 2) assert_int_equal(vs_job_queue_push(q, c1), 0); /* comes while b2 waits */
    run = vs_job_queue_pop(q);
    if (run != want[k])
      fail_msg("pick %d: job %llu, wanted %llu", k, (unsigned long long)run->id,
               (unsigned long long)want[k]->id);
  }
  vs_job_queue_done(q, run);
  vs_djob_release(run);
  vs_djob *left[BACKLOG];
  int n = vs_job_queue_take_all(q, left, BACKLOG);
  assert_int_equal(n, BACKLOG - 4);
  for (int i = 0; i < n; i++) vs_djob_release(left[i]);
  vs_job_queue_close(q);
  for (int i = 0; i < BACKLOG; i++) vs_djob_release(a[i]);
  vs_djob_release(b1);
  vs_djob_release(b2);
  vs_djob_release(c1);
}

/* Clients that submit one job at a time, each as soon as its last one is done, must not keep
 * the job of a client whose previous job was still running when it submitted (it got the
 * next turn) waiting: in the soak (make soak) such a job waited 10 and 21 s behind 7 clients.
 * Before the fix B and C got the turn being served every time and A's second job never ran
 * here ("A's job still waits after 20 picks"). */
static void test_job_queue_one_at_a_time(void **state) {
  (void)state;
  vs_job_queue *q;
  assert_int_equal(vs_job_queue_open(64, 1, &q), 0);
  vs_djob *a1 = job(1, 0, 0xA), *b = job(2, 0, 0xB), *c = job(3, 0, 0xC);
  assert_int_equal(vs_job_queue_push(q, a1), 0);
  assert_int_equal(vs_job_queue_push(q, b), 0);
  assert_int_equal(vs_job_queue_push(q, c), 0);
  vs_djob *run = vs_job_queue_pop(q);
  assert_ptr_equal(run, a1);
  /* A has its result and submits again before the worker is done cleaning up */
  vs_djob *a2 = job(4, 0, 0xA);
  assert_int_equal(vs_job_queue_push(q, a2), 0);
  int picks = 0;
  uint64_t next_id = 10;
  while (run != a2) {
    vs_job_queue_done(q, run);
    uint64_t client = run->client_key;
    vs_djob_release(run);
    if (client != 0xA) { /* B or C: the next job right away */
      vs_djob *again = job(next_id++, 0, client);
      assert_int_equal(vs_job_queue_push(q, again), 0);
      vs_djob_release(again); /* the queue holds it */
    }
    if (++picks > 20) fail_msg("A's job still waits after 20 picks");
    run = vs_job_queue_pop(q);
  }
  /* one job of each other client at most, then A's */
  assert_true(picks <= 3);
  vs_job_queue_done(q, run);
  vs_djob_release(run);
  vs_djob *left[8];
  int n = vs_job_queue_take_all(q, left, 8);
  for (int i = 0; i < n; i++) vs_djob_release(left[i]);
  vs_job_queue_close(q);
  vs_djob_release(a1);
  vs_djob_release(a2);
  vs_djob_release(b);
  vs_djob_release(c);
}

static void free2(void *data, void *hint) {
  (void)hint;
  free(data);
}

/* A packed Request whose body is `body`; returns its length. */
static size_t pack_body(Vspec__Request *r, uint8_t *buf, size_t cap) {
  r->version = 1;
  size_t n = vspec__request__get_packed_size(r);
  assert_true(n <= cap);
  return vspec__request__pack(r, buf);
}

static int unpack_code(const uint8_t *buf, size_t n, char *err, size_t errlen) {
  vs_wire_msg m;
  memset(&m, 0, sizeof m);
  assert_int_equal(zmq_msg_init_size(&m.body, n), 0);
  memcpy(zmq_msg_data(&m.body), buf, n);
  m.has_body = 1;
  vs_wire_alloc a;
  vs_wire_alloc_init(&a, 65536);
  int code = 0;
  Vspec__Request *r = vs_wire_unpack_request(&m, &a, &code, err, errlen);
  vs_wire_request_free(r, &a);
  assert_int_equal(a.used, 0);
  vs_wire_msg_close(&m);
  return r ? 0 : code;
}

/* String fields on the wire (proto/wire_text.c; issue 12, item 7). protobuf-c takes a NUL
 * inside a string field for the end of the value, so only the packed bytes can show it; and
 * what goes out is made valid, leaving the caller's strings as they were. */
static void test_wire_strings(void **state) {
  (void)state;
  char err[512];
  uint8_t buf[512];
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Submit sub = VSPEC__SUBMIT__INIT;
  sub.model = "micro\x01junk";
  sub.method = "ar";
  r.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  r.submit = &sub;
  size_t n = pack_body(&r, buf, sizeof buf);
  uint8_t *at = memmem(buf, n, "micro\x01", 6);
  assert_non_null(at);
  at[5] = 0;
  Vspec__Request *u = vspec__request__unpack(NULL, n, buf);
  assert_non_null(u);
  assert_string_equal(u->submit->model, "micro"); /* what protobuf-c makes of it */
  vspec__request__free_unpacked(u, NULL);
  assert_int_equal(vs_wire_text_check(&vspec__request__descriptor, buf, n, err, sizeof err),
                   VSPEC_EFORMAT);
  assert_non_null(strstr(err, "submit.model: 'micro\\x00junk' has \\x00 at offset 5: a string "
                              "field must not hold NUL bytes"));
  assert_int_equal(unpack_code(buf, n, err, sizeof err), VSPEC__ERROR_CODE__ERR_MALFORMED);
  assert_non_null(strstr(err, "submit.model"));
  /* bytes that are not UTF-8, in another message */
  Vspec__ReloadRequest rr = VSPEC__RELOAD_REQUEST__INIT;
  rr.name = "accept/x\xed\xa0\x80";
  r.body_case = VSPEC__REQUEST__BODY_RELOAD;
  r.reload = &rr;
  n = pack_body(&r, buf, sizeof buf);
  assert_int_equal(unpack_code(buf, n, err, sizeof err), VSPEC__ERROR_CODE__ERR_MALFORMED);
  assert_non_null(strstr(err, "reload.name: 'accept/x\\xed\\xa0\\x80' has \\xed at offset 8: "
                              "a string field must be UTF-8"));
  /* clean strings pass; an unknown field is not read (its bytes are nobody's text) */
  sub.model = "micro";
  r.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  r.submit = &sub; /* the body is a union */
  n = pack_body(&r, buf, sizeof buf);
  memcpy(buf + n, "\xa2\x06\x03\x00\xff\x1b", 6); /* field 100, length 3 */
  n += 6;
  if (vs_wire_text_check(&vspec__request__descriptor, buf, n, err, sizeof err))
    fail_msg("%s", err);
  assert_int_equal(unpack_code(buf, n, err, sizeof err), 0);

  /* Outgoing: an error message with raw bytes in it goes out escaped. */
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Error e = VSPEC__ERROR__INIT;
  char msg[] = "model: 'a\xff\x1b[2J' \xc2\x9b caf\xc3\xa9";
  e.code = VSPEC__ERROR_CODE__ERR_INVALID;
  e.message = msg;
  ev.version = 1;
  ev.body_case = VSPEC__EVENT__BODY_ERROR;
  ev.error = &e;
  zmq_msg_t out;
  assert_int_equal(vs_wire_pack(&ev.base, &out), 0);
  assert_ptr_equal(e.message, msg); /* the caller's string, untouched */
  assert_string_equal(msg, "model: 'a\xff\x1b[2J' \xc2\x9b caf\xc3\xa9");
  Vspec__Event *got = vspec__event__unpack(NULL, zmq_msg_size(&out), zmq_msg_data(&out));
  assert_non_null(got);
  assert_string_equal(got->error->message, "model: 'a\\xff\\x1b[2J' \\xc2\\x9b caf\xc3\xa9");
  vspec__event__free_unpacked(got, NULL);
  zmq_msg_close(&out);
  /* strings in repeated messages, repeated strings, the length bound */
  static char big[3 * VS_WIRE_TEXT_MAX];
  memset(big, 'a', sizeof big - 1);
  Vspec__PluginInfo pi[2], *pip[2] = {&pi[0], &pi[1]};
  vspec__plugin_info__init(&pi[0]);
  vspec__plugin_info__init(&pi[1]);
  pi[0].name = "exact";
  char v0[] = "1.0\xff";
  pi[0].version = v0;
  pi[1].name = big;
  Vspec__PluginsReply pr = VSPEC__PLUGINS_REPLY__INIT;
  pr.n_plugins = 2;
  pr.plugins = pip;
  pr.plugin_dir = "/srv/mod\xe8les";
  ev.body_case = VSPEC__EVENT__BODY_PLUGINS;
  ev.plugins = &pr;
  assert_int_equal(vs_wire_pack(&ev.base, &out), 0);
  assert_ptr_equal(pi[1].name, big);
  assert_ptr_equal(pi[0].version, v0);
  got = vspec__event__unpack(NULL, zmq_msg_size(&out), zmq_msg_data(&out));
  assert_non_null(got);
  assert_string_equal(got->plugins->plugins[0]->name, "exact");
  assert_string_equal(got->plugins->plugins[0]->version, "1.0\\xff");
  assert_int_equal(strlen(got->plugins->plugins[1]->name), VS_WIRE_TEXT_MAX);
  assert_memory_equal(got->plugins->plugins[1]->name + VS_WIRE_TEXT_MAX - 4, "a...", 4);
  assert_string_equal(got->plugins->plugin_dir, "/srv/mod\\xe8les");
  vspec__event__free_unpacked(got, NULL);
  zmq_msg_close(&out);
  Vspec__ReloadReply rp = VSPEC__RELOAD_REPLY__INIT;
  char *names[] = {"micro", "b\x1b"};
  rp.n_models_reloaded = 2;
  rp.models_reloaded = names;
  ev.body_case = VSPEC__EVENT__BODY_RELOAD;
  ev.reload = &rp;
  assert_int_equal(vs_wire_pack(&ev.base, &out), 0);
  assert_string_equal(names[1], "b\x1b");
  got = vspec__event__unpack(NULL, zmq_msg_size(&out), zmq_msg_data(&out));
  assert_non_null(got);
  assert_string_equal(got->reload->models_reloaded[0], "micro");
  assert_string_equal(got->reload->models_reloaded[1], "b\\x1b");
  vspec__event__free_unpacked(got, NULL);
  zmq_msg_close(&out);
}

static void test_wire_framing(void **state) {
  (void)state;
  void *ctx = zmq_ctx_new();
  void *router = zmq_socket(ctx, ZMQ_ROUTER), *dealer = zmq_socket(ctx, ZMQ_DEALER);
  assert_int_equal(zmq_bind(router, "inproc://wire-test"), 0);
  assert_int_equal(zmq_connect(dealer, "inproc://wire-test"), 0);
  char err[512];
  /* a request with a caption blob, DEALER -> ROUTER */
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Ping p = VSPEC__PING__INIT;
  r.body_case = VSPEC__REQUEST__BODY_PING;
  r.ping = &p;
  r.has_request_id = 1;
  r.request_id = 42;
  float caption[6] = {1, 2, 3, 4, 5, 6};
  vs_wire_blob b = {.kind = VSPEC__BLOB_KIND__BLOB_CAPTION_F32LE, .data = caption,
                    .size = sizeof caption};
  assert_int_equal(vs_wire_send_request(dealer, NULL, &r, &b, 1, 0), 0);
  zmq_pollitem_t it = {.socket = router, .events = ZMQ_POLLIN};
  assert_int_equal(zmq_poll(&it, 1, 2000), 1);
  vs_wire_msg m;
  assert_int_equal(vs_wire_recv(router, 1, &m, 1024, 1024, err, sizeof err), 1);
  assert_int_equal(m.env.n, 1); /* the ROUTER's routing id */
  assert_int_equal(m.n_blobs, 1);
  vs_wire_alloc a;
  vs_wire_alloc_init(&a, 65536);
  int code;
  Vspec__Request *got = vs_wire_unpack_request(&m, &a, &code, err, sizeof err);
  assert_non_null(got);
  assert_int_equal(got->request_id, 42);
  assert_int_equal(got->blobs[0]->size, sizeof caption);
  assert_int_equal(vs_wire_find_blob(got->blobs, got->n_blobs, VSPEC__BLOB_KIND__BLOB_CAPTION_F32LE), 0);
  assert_true(a.used > 0);
  vs_wire_request_free(got, &a);
  assert_int_equal(a.used, 0); /* every byte given back */
  /* an event back with the same envelope */
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Pong pong = VSPEC__PONG__INIT;
  pong.node = "unit";
  ev.body_case = VSPEC__EVENT__BODY_PONG;
  ev.pong = &pong;
  uint8_t *png = malloc(10);
  memcpy(png, "\x89PNG-ish\0", 10);
  vs_wire_blob pb = {.kind = VSPEC__BLOB_KIND__BLOB_PNG, .data = png, .size = 10,
                     .free_fn = free2};
  assert_int_equal(vs_wire_send_event(router, &m.env, &ev, &pb, 1, ZMQ_DONTWAIT), 0);
  vs_wire_msg_close(&m);
  vs_conn c = {.sock = dealer, .max_blob = 1 << 20};
  vs_conn_event e;
  assert_int_equal(vs_conn_recv(&c, 2000, &e, err, sizeof err), 1);
  assert_string_equal(e.ev->pong->node, "unit");
  size_t len;
  assert_non_null(vs_conn_blob(&e, VSPEC__BLOB_KIND__BLOB_PNG, &len));
  assert_int_equal(len, 10);
  vs_conn_event_free(&e);
  /* an unknown peer: ROUTER_MANDATORY turns the silent drop into EHOSTUNREACH */
  int one = 1;
  zmq_setsockopt(router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
  vs_wire_envelope ghost = {.n = 1, .len = {5}, .id = {"ghost"}};
  assert_int_equal(vs_wire_send_event(router, &ghost, &ev, NULL, 0, ZMQ_DONTWAIT), -EHOSTUNREACH);
  /* limits: a body over max_body, a blob over max_blob, too deep an envelope */
  uint8_t big[2048] = {0};
  zmq_send(dealer, "", 0, ZMQ_SNDMORE);
  zmq_send(dealer, big, sizeof big, 0);
  assert_int_equal(zmq_poll(&it, 1, 2000), 1);
  assert_int_equal(vs_wire_recv(router, 1, &m, 1024, 1024, err, sizeof err), VSPEC_ERANGE);
  assert_non_null(strstr(err, "over the limit of 1024"));
  assert_int_equal(m.env.n, 1); /* still routable for the error reply */
  zmq_send(dealer, "", 0, ZMQ_SNDMORE);
  zmq_send(dealer, "x", 1, ZMQ_SNDMORE);
  zmq_send(dealer, big, sizeof big, 0);
  assert_int_equal(zmq_poll(&it, 1, 2000), 1);
  assert_int_equal(vs_wire_recv(router, 1, &m, 1024, 1024, err, sizeof err), VSPEC_ERANGE);
  for (int i = 0; i < 5; i++) zmq_send(dealer, "hop", 3, ZMQ_SNDMORE);
  zmq_send(dealer, "", 0, ZMQ_SNDMORE);
  zmq_send(dealer, "x", 1, 0);
  assert_int_equal(zmq_poll(&it, 1, 2000), 1);
  assert_int_equal(vs_wire_recv(router, 1, &m, 1024, 1024, err, sizeof err), VSPEC_EFORMAT);
  /* requests carry at most VS_WIRE_REQUEST_BLOBS blob frames */
  for (int nb = VS_WIRE_REQUEST_BLOBS; nb <= VS_WIRE_REQUEST_BLOBS + 1; nb++) {
    zmq_send(dealer, "", 0, ZMQ_SNDMORE);
    zmq_send(dealer, "x", 1, ZMQ_SNDMORE);
    for (int i = 0; i < nb; i++) zmq_send(dealer, "b", 1, i + 1 < nb ? ZMQ_SNDMORE : 0);
    assert_int_equal(zmq_poll(&it, 1, 2000), 1);
    int got_rc = vs_wire_recv_request(router, 1, &m, 1024, 1024, err, sizeof err);
    if (nb == VS_WIRE_REQUEST_BLOBS) {
      assert_int_equal(got_rc, 1);
      assert_int_equal(m.n_blobs, nb);
      /* a head the ROUTER refuses (unknown peer) leaves the message to the caller, whole */
      assert_int_equal(vs_wire_forward(router, &ghost, &m, ZMQ_DONTWAIT), -EHOSTUNREACH);
      assert_int_equal(m.has_body, 1);
      assert_int_equal(m.n_blobs, nb);
      vs_wire_msg_close(&m);
    } else {
      assert_int_equal(got_rc, VSPEC_ERANGE);
      assert_non_null(strstr(err, "blob frames"));
    }
  }
  /* after all that, the next message still reads cleanly */
  assert_int_equal(vs_wire_send_request(dealer, NULL, &r, NULL, 0, 0), 0);
  assert_int_equal(zmq_poll(&it, 1, 2000), 1);
  assert_int_equal(vs_wire_recv(router, 1, &m, 1024, 1024, err, sizeof err), 1);
  vs_wire_msg_close(&m);
  assert_int_equal(vs_wire_recv(router, 1, &m, 1024, 1024, err, sizeof err), 0);
  /* the allocator's budget */
  vs_wire_alloc small;
  vs_wire_alloc_init(&small, 16);
  assert_null(small.base.alloc(&small, 17));
  assert_int_equal(small.refused, 1);
  void *x = small.base.alloc(&small, 16);
  assert_non_null(x);
  assert_null(small.base.alloc(&small, 1));
  small.base.free(&small, x);
  assert_int_equal(small.used, 0);
  assert_string_equal(vs_wire_error_name(VSPEC__ERROR_CODE__ERR_BUSY), "busy");
  zmq_close(dealer);
  zmq_close(router);
  zmq_ctx_term(ctx);
}

static void test_curve_key_files(void **state) {
  (void)state;
  char dir[64] = "/tmp/vspec-keys-XXXXXX", prefix[128], path[160], key[41], pub[41], err[512];
  assert_non_null(mkdtemp(dir));
  snprintf(prefix, sizeof prefix, "%s/node", dir);
  assert_int_equal(vs_curve_keygen(prefix, pub, err, sizeof err), 0);
  snprintf(path, sizeof path, "%s.key", prefix);
  assert_int_equal(vs_curve_read_key(path, "public", key, err, sizeof err), 0);
  assert_string_equal(key, pub);
  assert_int_equal(vs_curve_read_key(path, "secret", key, err, sizeof err), 0);
  assert_string_not_equal(key, pub);
  char derived[41];
  assert_int_equal(zmq_curve_public(derived, key), 0);
  assert_string_equal(derived, pub);
  snprintf(path, sizeof path, "%s.pub", prefix);
  assert_int_not_equal(vs_curve_read_key(path, "secret", key, err, sizeof err), 0);
  assert_int_equal(vs_curve_key_arg(pub, "public", key, err, sizeof err), 0);
  assert_int_equal(vs_curve_key_arg(path, "public", key, err, sizeof err), 0);
  assert_string_equal(key, pub);
  assert_int_not_equal(vs_curve_key_arg("short", "public", key, err, sizeof err), 0);
  /* keygen over an existing world-readable file: the secret key still ends up 0600 */
  snprintf(path, sizeof path, "%s.key", prefix);
  assert_int_equal(chmod(path, 0644), 0);
  assert_int_equal(vs_curve_keygen(prefix, pub, err, sizeof err), 0);
  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0600);
  snprintf(path, sizeof path, "%s.pub", prefix);
  assert_int_equal(stat(path, &sb), 0);
  assert_int_equal(sb.st_mode & 0777, 0644);
  /* short lines and a name without '=' are no keys (and read nothing past the line) */
  snprintf(path, sizeof path, "%s/odd.key", dir);
  write_text(path, "p\npublic\nsecret\n  sec = x\n");
  assert_int_not_equal(vs_curve_read_key(path, "public", key, err, sizeof err), 0);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_preview_lut(void **state) {
  (void)state;
  char plugins[600], err[VSPEC_ERRLEN];
  snprintf(plugins, sizeof plugins, "%s/plugins", vs_harness_build());
  vspec_host host;
  vs_host_init(&host, vs_cpu_ops());
  vspec_dev *dev;
  vs_registry *reg;
  vs_models *models;
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err), 0);
  assert_int_equal(vs_registry_open(plugins, &host, &reg, err, sizeof err), 0);
  if (vs_models_open(reg, &host, dev, "tests/golden/micro_c2i", VS_ROLE_TARGET, &models, err,
                     sizeof err))
    fail_msg("%s", err);
  const vs_backend_model *t = &models->target;
  vs_preview_lut lut;
  assert_int_equal(vs_preview_lut_build(t, dev, &lut, err, sizeof err), 0);
  assert_int_equal(lut.vocab, 64);
  /* the table is each code's mean colour: decode a uniform grid and compare */
  int32_t grid[16];
  uint8_t rgb[8 * 8 * 3], prev[8 * 8 * 3];
  for (int c = 0; c < 64; c += 21) {
    for (int i = 0; i < 16; i++) grid[i] = c;
    assert_int_equal(t->vt->decode(t->model, dev, grid, rgb, err, sizeof err), 0);
    for (int ch = 0; ch < 3; ch++) {
      int s = 0;
      for (int p = 0; p < 64; p++) s += rgb[p * 3 + ch];
      assert_int_equal(lut.rgb[c * 3 + ch], (s + 32) / 64);
    }
  }
  /* the neutral code is the one nearest the mean of all mean colours */
  double mean[3] = {0};
  for (int c = 0; c < 64; c++)
    for (int ch = 0; ch < 3; ch++) mean[ch] += lut.rgb[c * 3 + ch] / 64.0;
  double best = 1e9;
  int want = -1;
  for (int c = 0; c < 64; c++) {
    double d = 0;
    for (int ch = 0; ch < 3; ch++) d += (lut.rgb[c * 3 + ch] - mean[ch]) * (lut.rgb[c * 3 + ch] - mean[ch]);
    if (d < best) best = d, want = c;
  }
  assert_int_equal(lut.neutral, want);
  /* lut preview: generated cells take their code's colour (2x2 pixels per token here), the
   * rest the neutral colour */
  int32_t tokens[16];
  for (int i = 0; i < 16; i++) tokens[i] = (i * 7) % 64;
  vs_preview_render_lut(&lut, &t->info, tokens, 5, prev);
  for (int y = 0; y < 8; y++)
    for (int x = 0; x < 8; x++) {
      int cell = (y / 2) * 4 + x / 2, code = cell < 5 ? tokens[cell] : lut.neutral;
      assert_memory_equal(prev + (y * 8 + x) * 3, lut.rgb + code * 3, 3);
    }
  /* decode preview of a full grid is the image itself */
  int32_t scratch[16];
  assert_int_equal(vs_preview_render_decode(&lut, t, dev, tokens, 16, scratch, prev, err,
                                            sizeof err), 0);
  assert_int_equal(t->vt->decode(t->model, dev, tokens, rgb, err, sizeof err), 0);
  assert_memory_equal(prev, rgb, sizeof rgb);
  /* and of an empty one, the neutral code everywhere */
  assert_int_equal(vs_preview_render_decode(&lut, t, dev, tokens, 0, scratch, prev, err,
                                            sizeof err), 0);
  for (int i = 0; i < 16; i++) assert_int_equal(scratch[i], lut.neutral);
  vs_preview_lut_free(&lut);
  vs_models_close(models);
  vs_registry_close(reg);
  vs_dev_destroy(dev);
}

/* A watch closed from its read callback (the daemon stops once drained, inside a read) reads
 * nothing more, though messages are still waiting: the state behind it may be gone. */
typedef struct zw_state {
  int reads, closed;
} zw_state;

static void zw_closed(vs_zwatch *w, void *user) {
  (void)w;
  ((zw_state *)user)->closed++;
}

static int zw_read(vs_zwatch *w, void *user) {
  zw_state *st = user;
  char buf[16];
  if (zmq_recv(w->sock, buf, sizeof buf, ZMQ_DONTWAIT) < 0) return 0;
  if (++st->reads == 2) vs_zwatch_close(w, zw_closed);
  return 1;
}

static void test_zwatch_close_in_read(void **state) {
  (void)state;
  void *ctx = zmq_ctx_new();
  void *rx = zmq_socket(ctx, ZMQ_PULL), *tx = zmq_socket(ctx, ZMQ_PUSH);
  assert_int_equal(zmq_bind(rx, "inproc://zwatch-test"), 0);
  assert_int_equal(zmq_connect(tx, "inproc://zwatch-test"), 0);
  for (int i = 0; i < 5; i++) assert_int_equal(zmq_send(tx, "x", 1, 0), 1);
  zmq_pollitem_t it = {.socket = rx, .events = ZMQ_POLLIN};
  assert_int_equal(zmq_poll(&it, 1, 2000), 1);
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  vs_zwatch w;
  memset(&w, 0, sizeof w);
  zw_state st = {0, 0};
  assert_int_equal(vs_zwatch_start(&loop, &w, rx, zw_read, &st), 0);
  /* All five are there: one drain would read them all, but the close stops it at two. */
  uv_run(&loop, UV_RUN_DEFAULT); /* ends once the watch's handles are closed */
  assert_int_equal(st.reads, 2);
  assert_int_equal(st.closed, 1);
  vs_zwatch_kick(&w); /* after the close: reads nothing */
  assert_int_equal(st.reads, 2);
  assert_int_equal(uv_loop_close(&loop), 0);
  zmq_close(tx);
  zmq_close(rx);
  zmq_ctx_term(ctx);
}

/* The config text without a file (the fuzz target's entry point): the same parser and
 * messages naming the given name and the line. */
static void test_config_text(void **state) {
  (void)state;
  vs_daemon_config c;
  char err[VSPEC_ERRLEN];
  vs_config_defaults(&c);
  assert_int_equal(vs_config_load_text(&c, "[queue]\nsize = 5\n", "t.conf", err, sizeof err), 0);
  assert_int_equal(c.queue_size, 5);
  assert_int_not_equal(vs_config_load_text(&c, "[queue]\n\nsize = 0\n", "t.conf", err,
                                           sizeof err), 0);
  assert_non_null(strstr(err, "t.conf"));
  assert_non_null(strstr(err, "line 3"));
  assert_int_equal(vs_config_load_text(&c, "[queue\n", "t.conf", err, sizeof err),
                   VSPEC_EFORMAT);
  assert_non_null(strstr(err, "t.conf: syntax error on line 1"));
}

/* How an admin names a plugin to reload (daemon/plugin_ref.c). */
static void test_plugin_ref(void **state) {
  (void)state;
  static const struct {
    const char *text;
    int kind;
    const char *name;
  } ok[] = {{"accept/exact", VSPEC_PLUGIN_ACCEPT, "exact"},
            {"sched_standard", VSPEC_PLUGIN_SCHED, "standard"},
            {"backend/llamagen", VSPEC_PLUGIN_BACKEND, "llamagen"},
            {"lantern", -1, "lantern"},
            {"my_rule", -1, "my_rule"}, /* "my" is no kind: all of it is the name */
            {"accept_uniform_rsd", VSPEC_PLUGIN_ACCEPT, "uniform_rsd"}};
  char name[64], err[VSPEC_ERRLEN];
  int kind;
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    assert_int_equal(vs_plugin_ref_parse(ok[i].text, &kind, name, err, sizeof err), 0);
    assert_int_equal(kind, ok[i].kind);
    assert_string_equal(name, ok[i].name);
  }
  const char *bad[] = {"", "accept/", "accept/Exact", "x/../y", "accept/a b",
                       "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(vs_plugin_ref_parse(bad[i], &kind, name, err, sizeof err), VSPEC_EINVAL);
    assert_int_equal(kind, -1);
    assert_non_null(strstr(err, "not a plugin name"));
  }
}

/* The preview colour table's disk cache (daemon/preview_cache.c): a table reads back as
 * written; the key follows every file of the model and the device; a file that is short,
 * long, of another vocabulary or with a neutral code out of range is not used. */
static void test_preview_cache(void **state) {
  (void)state;
  char dir[] = "/tmp/vspec-lutcache-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char model[300], cache[300], file[400];
  snprintf(model, sizeof model, "%s/model", dir);
  snprintf(cache, sizeof cache, "%s/c/d", dir); /* made on the first store */
  assert_int_equal(mkdir(model, 0755), 0);
  snprintf(file, sizeof file, "%s/vq.safetensors", model);
  FILE *f = fopen(file, "wb");
  fputs("weights", f);
  fclose(f);
  char k1[VS_LUT_KEY_LEN + 1], k2[VS_LUT_KEY_LEN + 1], k3[VS_LUT_KEY_LEN + 1];
  assert_int_equal(vs_preview_cache_key(model, "cpu (avx2)", k1), 0);
  assert_int_equal(vs_preview_cache_key(model, "cuda bf16", k2), 0);
  assert_string_not_equal(k1, k2);
  f = fopen(file, "ab");
  fputs("!", f);
  fclose(f);
  assert_int_equal(vs_preview_cache_key(model, "cpu (avx2)", k3), 0);
  assert_string_not_equal(k1, k3);

  uint8_t rgb[4 * 3] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  vs_preview_lut lut = {.vocab = 4, .rgb = rgb, .neutral = 2}, back;
  assert_int_equal(vs_preview_cache_load(cache, k1, 4, &back), 0); /* nothing yet */
  assert_int_equal(vs_preview_cache_store(cache, k1, &lut), 0);
  assert_int_equal(vs_preview_cache_load(cache, k1, 4, &back), 1);
  assert_int_equal(back.neutral, 2);
  assert_memory_equal(back.rgb, rgb, sizeof rgb);
  vs_preview_lut_free(&back);
  assert_int_equal(vs_preview_cache_load(cache, k1, 5, &back), 0); /* another vocabulary */
  assert_int_equal(vs_preview_cache_load(cache, k3, 4, &back), 0); /* another key */
  char path[600];
  snprintf(path, sizeof path, "%s/lut-%s.bin", cache, k1);
  f = fopen(path, "ab");
  fputc(0, f); /* one byte too many */
  fclose(f);
  assert_int_equal(vs_preview_cache_load(cache, k1, 4, &back), 0);
  assert_int_equal(truncate(path, 10), 0); /* too short */
  assert_int_equal(vs_preview_cache_load(cache, k1, 4, &back), 0);
  lut.neutral = 2;
  assert_int_equal(vs_preview_cache_store(cache, k1, &lut), 0);
  f = fopen(path, "r+b");
  fseek(f, 12, SEEK_SET);
  fputc(9, f); /* neutral code 9 of 4 */
  fclose(f);
  assert_int_equal(vs_preview_cache_load(cache, k1, 4, &back), 0);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_preview_cache),
      cmocka_unit_test(test_config),          cmocka_unit_test(test_server_device),
      cmocka_unit_test(test_config_text),     cmocka_unit_test(test_plugin_ref),
      cmocka_unit_test(test_job_queue),       cmocka_unit_test(test_job_queue_newcomer),
      cmocka_unit_test(test_job_queue_one_at_a_time),
      cmocka_unit_test(test_wire_framing),    cmocka_unit_test(test_wire_strings),
      cmocka_unit_test(test_curve_key_files),
      cmocka_unit_test(test_preview_lut),     cmocka_unit_test(test_zwatch_close_in_read),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
