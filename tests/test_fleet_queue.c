/*
 * The fleet queue on Redis Streams (fleet/fleet_queue.c) against a real redis-server: each
 * test starts its own on a unix socket in a fresh temporary directory (no port, no shared
 * instance, nothing saved) and stops it in its teardown, also when the test fails; the
 * server dies with the test process even when that one is SIGKILLed (PR_SET_PDEATHSIG).
 * Without redis-server (make deps installs it; $VSPEC_REDIS_SERVER may name another) those
 * tests are skipped; the address parser's test runs anyway. Every wait is bounded; the whole
 * file takes about a second and a half.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fleet/fleet_queue.h"
#include "tests/support/daemon_harness.h"
#include "tests/support/redis_fixture.h"

static int setup(void **state) {
  *state = vs_redis_fx_open(0);
  return 0;
}

static int teardown(void **state) {
  vs_redis_fx *f = *state;
  vs_redis_fx_close(&f);
  *state = NULL;
  return 0;
}

#define NEED_REDIS(state) VS_NEED_REDIS(*(state))

static vs_fleet_queue *open_queue(const vs_redis_fx *f, const char *consumer, long long max_len) {
  vs_fleet_opts o;
  vs_fleet_opts_defaults(&o);
  o.url = f->sock;
  o.consumer = consumer;
  o.max_len = max_len;
  o.connect_timeout_ms = 500;
  o.command_timeout_ms = 500;
  vs_fleet_queue *q = NULL;
  char err[VSPEC_ERRLEN] = "";
  if (vs_fleet_queue_open(&o, &q, err, sizeof err)) fail_msg("open: %s", err);
  return q;
}

static redisReply *raw(const vs_redis_fx *f, const char *fmt, const char *a, const char *b) {
  redisContext *c = redisConnectUnix(f->sock);
  assert_non_null(c);
  if (c->err) fail_msg("raw connect: %s", c->errstr);
  redisReply *r = redisCommand(c, fmt, a, b);
  assert_non_null(r);
  redisFree(c);
  return r;
}

#define OK(call)                                     \
  do {                                               \
    int rc_ = (call);                                \
    if (rc_ < 0) fail_msg("%s: %d %s", #call, rc_, err); \
  } while (0)

static void test_addr_parse(void **state) {
  (void)state;
  vs_fleet_addr a;
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_fleet_addr_parse("redis://127.0.0.1", &a, err, sizeof err), 0);
  assert_string_equal(a.host, "127.0.0.1");
  assert_int_equal(a.port, 6379);
  assert_int_equal(a.db, 0);
  assert_int_equal(vs_fleet_addr_parse("redis://u:p@w@redis.local:7000/3", &a, err, sizeof err), 0);
  assert_string_equal(a.user, "u");
  assert_string_equal(a.password, "p@w");
  assert_string_equal(a.host, "redis.local");
  assert_int_equal(a.port, 7000);
  assert_int_equal(a.db, 3);
  assert_int_equal(vs_fleet_addr_parse("redis://:s3cret@[::1]:6380/", &a, err, sizeof err), 0);
  assert_string_equal(a.host, "::1");
  assert_string_equal(a.user, "");
  assert_string_equal(a.password, "s3cret");
  assert_int_equal(a.port, 6380);
  assert_int_equal(vs_fleet_addr_parse("unix:///run/redis.sock", &a, err, sizeof err), 0);
  assert_string_equal(a.path, "/run/redis.sock");
  assert_int_equal(vs_fleet_addr_parse("/tmp/r.sock", &a, err, sizeof err), 0);
  assert_string_equal(a.path, "/tmp/r.sock");
  assert_int_equal(vs_fleet_addr_parse("unix://app:p/w@/run/r.sock", &a, err, sizeof err), 0);
  assert_string_equal(a.user, "app");
  assert_string_equal(a.password, "p/w");
  assert_string_equal(a.path, "/run/r.sock");
  const char *bad[] = {"", "redis://", "redis://:6379", "redis://h:0", "redis://h:99999",
                       "redis://h:12x", "redis://h/db", "http://h", "unix://rel/path",
                       "redis://nocolon@h", "redis://[::1"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    err[0] = '\0';
    if (vs_fleet_addr_parse(bad[i], &a, err, sizeof err) >= 0) fail_msg("accepted '%s'", bad[i]);
    assert_true(err[0]);
  }
  assert_int_equal(vs_fleet_addr_parse("rediss://h", &a, err, sizeof err), VSPEC_ENOTSUP);
  /* a password never shows in a message */
  assert_int_not_equal(vs_fleet_addr_parse("redis://u:hunter2@h:0", &a, err, sizeof err), 0);
  assert_null(strstr(err, "hunter2"));
  /* open checks the names too */
  vs_fleet_opts o;
  vs_fleet_opts_defaults(&o);
  vs_fleet_queue *q = NULL;
  o.url = "/tmp/x.sock";
  o.stream = "jobs stream";
  assert_int_equal(vs_fleet_queue_open(&o, &q, err, sizeof err), VSPEC_EINVAL);
  assert_null(q);
  assert_non_null(strstr(err, "fleet stream"));
  o.stream = "vspec:jobs";
  o.consumer = "node/1";
  assert_int_equal(vs_fleet_queue_open(&o, &q, err, sizeof err), VSPEC_EINVAL);
  o.consumer = NULL;
  o.max_len = 0;
  assert_int_equal(vs_fleet_queue_open(&o, &q, err, sizeof err), VSPEC_EINVAL);
  vs_fleet_queue_destroy(&q); /* NULL: nothing */
}

static void test_roundtrip(void **state) {
  NEED_REDIS(state);
  vs_redis_fx *f = *state;
  char err[VSPEC_ERRLEN] = "", id[VS_FLEET_ID_MAX];
  vs_fleet_queue *q = open_queue(f, "node-a", 8);
  vs_fleet_job j;

  /* no group yet: Redis's error, naming the command */
  assert_int_equal(vs_fleet_read(q, 0, &j, err, sizeof err), VS_FLEET_EREDIS);
  assert_non_null(strstr(err, "XREADGROUP"));
  assert_non_null(strstr(err, "NOGROUP"));
  assert_true(vs_fleet_queue_connected(q)); /* an error reply keeps the connection */
  OK(vs_fleet_ensure_group(q, err, sizeof err));
  OK(vs_fleet_ensure_group(q, err, sizeof err)); /* BUSYGROUP is fine */

  assert_int_equal(vs_fleet_read(q, 0, &j, err, sizeof err), 0);
  double t0 = vs_harness_now();
  assert_int_equal(vs_fleet_read(q, 60, &j, err, sizeof err), 0);
  assert_true(vs_harness_now() - t0 >= 0.05);

  unsigned char payload[300];
  /* NUL bytes at 0 and 256 */
  for (size_t i = 0; i < sizeof payload; i++) payload[i] = (unsigned char)(i * 7);
  OK(vs_fleet_enqueue(q, "job-1", payload, sizeof payload, id, err, sizeof err));
  assert_true(id[0] >= '0' && id[0] <= '9' && strchr(id, '-'));
  long long len = -1, pend = -1;
  OK(vs_fleet_depth(q, &len, &pend, err, sizeof err));
  assert_int_equal(len, 1);
  assert_int_equal(pend, 0);

  assert_int_equal(vs_fleet_read(q, 100, &j, err, sizeof err), 1);
  assert_string_equal(j.entry_id, id);
  assert_string_equal(j.job_id, "job-1");
  assert_int_equal(j.payload_len, sizeof payload);
  assert_memory_equal(j.payload, payload, sizeof payload);
  assert_int_equal(j.payload[j.payload_len], 0);
  assert_int_equal(j.deliveries, 1);
  assert_int_equal(j.malformed, 0);
  OK(vs_fleet_depth(q, &len, &pend, err, sizeof err));
  assert_int_equal(len, 1);
  assert_int_equal(pend, 1);
  assert_int_equal(vs_fleet_ack(q, j.entry_id, err, sizeof err), 1);
  assert_int_equal(vs_fleet_ack(q, j.entry_id, err, sizeof err), 0); /* not pending any more */
  OK(vs_fleet_depth(q, &len, &pend, err, sizeof err));
  assert_int_equal(len, 0); /* acked jobs leave the stream */
  assert_int_equal(pend, 0);
  vs_fleet_job_clear(&j);

  /* an empty payload is a payload */
  OK(vs_fleet_enqueue(q, "job-2", NULL, 0, NULL, err, sizeof err));
  assert_int_equal(vs_fleet_read(q, 0, &j, err, sizeof err), 1);
  assert_string_equal(j.job_id, "job-2");
  assert_int_equal(j.payload_len, 0);
  assert_non_null(j.payload);
  assert_int_equal(vs_fleet_ack(q, j.entry_id, err, sizeof err), 1);
  vs_fleet_job_clear(&j);

  /* an entry someone else wrote: delivered, flagged, acked like any other */
  freeReplyObject(raw(f, "XADD vspec:jobs * %s %s", "junk", "x"));
  assert_int_equal(vs_fleet_read(q, 0, &j, err, sizeof err), 1);
  assert_int_equal(j.malformed, 1);
  assert_string_equal(j.job_id, "");
  assert_null(j.payload);
  assert_int_equal(j.deliveries, 1);
  assert_int_equal(vs_fleet_ack(q, j.entry_id, err, sizeof err), 1);
  vs_fleet_job_clear(&j);

  /* arguments checked before anything is sent */
  assert_int_equal(vs_fleet_enqueue(q, "job 3", "x", 1, NULL, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "job id"));
  assert_int_equal(vs_fleet_ack(q, "12-x", err, sizeof err), VSPEC_EINVAL);
  assert_int_equal(vs_fleet_ack(q, "", err, sizeof err), VSPEC_EINVAL);
  vs_fleet_queue_destroy(&q);
  assert_null(q);
}

static void test_busy(void **state) {
  NEED_REDIS(state);
  vs_redis_fx *f = *state;
  char err[VSPEC_ERRLEN] = "", jid[16];
  vs_fleet_queue *q = open_queue(f, "node-a", 3);
  OK(vs_fleet_ensure_group(q, err, sizeof err));
  for (int i = 0; i < 3; i++) {
    snprintf(jid, sizeof jid, "job-%d", i);
    OK(vs_fleet_enqueue(q, jid, "p", 1, NULL, err, sizeof err));
  }
  assert_int_equal(vs_fleet_enqueue(q, "job-3", "p", 1, NULL, err, sizeof err), VSPEC_EBUSY);
  assert_non_null(strstr(err, "busy"));
  long long len = -1;
  OK(vs_fleet_depth(q, &len, NULL, err, sizeof err));
  assert_int_equal(len, 3);
  /* a running job still counts; a finished one makes room */
  vs_fleet_job j;
  assert_int_equal(vs_fleet_read(q, 0, &j, err, sizeof err), 1);
  assert_int_equal(vs_fleet_enqueue(q, "job-3", "p", 1, NULL, err, sizeof err), VSPEC_EBUSY);
  assert_int_equal(vs_fleet_ack(q, j.entry_id, err, sizeof err), 1);
  vs_fleet_job_clear(&j);
  OK(vs_fleet_enqueue(q, "job-3", "p", 1, NULL, err, sizeof err));
  assert_int_equal(vs_fleet_enqueue(q, "job-4", "p", 1, NULL, err, sizeof err), VSPEC_EBUSY);
  vs_fleet_queue_destroy(&q);
}

/* A gateway's submit is one atomic step: the first event, the entry and the id key together;
 * the same id and digest again is a retry (nothing added), another digest a conflict, and the
 * bound is checked before anything is written. */
static void test_submit(void **state) {
  NEED_REDIS(state);
  vs_redis_fx *f = *state;
  char err[VSPEC_ERRLEN] = "", entry[VS_FLEET_ID_MAX];
  vs_fleet_queue *q = open_queue(f, "node-a", 2);
  OK(vs_fleet_ensure_group(q, err, sizeof err));
  assert_int_equal(vs_fleet_submit(q, "11", "pay\0load", 8, "ev1", 3, "d1", entry, err,
                                   sizeof err), VS_FLEET_NEW);
  assert_true(entry[0] != '\0');
  vs_fleet_event ev[4];
  assert_int_equal(vs_fleet_events_read(q, "11", "0", 0, ev, 4, err, sizeof err), 1);
  assert_memory_equal(ev[0].data, "ev1", 3);
  vs_fleet_event_clear(&ev[0]);
  /* a retry: no second entry, no second event */
  assert_int_equal(vs_fleet_submit(q, "11", "pay\0load", 8, "ev2", 3, "d1", NULL, err,
                                   sizeof err), VS_FLEET_SAME);
  assert_int_equal(vs_fleet_submit(q, "11", "other", 5, "ev3", 3, "d2", NULL, err, sizeof err),
                   VS_FLEET_CONFLICT);
  long long len = -1;
  OK(vs_fleet_depth(q, &len, NULL, err, sizeof err));
  assert_int_equal(len, 1);
  assert_int_equal(vs_fleet_events_read(q, "11", "0", 0, ev, 4, err, sizeof err), 1);
  vs_fleet_event_clear(&ev[0]);
  vs_fleet_job j;
  assert_int_equal(vs_fleet_read(q, 0, &j, err, sizeof err), 1);
  assert_string_equal(j.job_id, "11");
  assert_int_equal(j.payload_len, 8);
  assert_memory_equal(j.payload, "pay\0load", 8);
  vs_fleet_job_clear(&j);
  /* without a digest: a fresh job each time, until the bound; busy writes nothing */
  assert_int_equal(vs_fleet_submit(q, "12", "p", 1, "e", 1, NULL, NULL, err, sizeof err),
                   VS_FLEET_NEW);
  assert_int_equal(vs_fleet_submit(q, "13", "p", 1, "e", 1, "d3", NULL, err, sizeof err),
                   VSPEC_EBUSY);
  assert_int_equal(vs_fleet_events_exist(q, "13", err, sizeof err), 0);
  OK(vs_fleet_depth(q, &len, NULL, err, sizeof err));
  assert_int_equal(len, 2);
  /* and the refused id was not taken: once there is room it is a new job */
  assert_int_equal(vs_fleet_read(q, 0, &j, err, sizeof err), 1);
  assert_int_equal(vs_fleet_ack(q, j.entry_id, err, sizeof err), 1);
  vs_fleet_job_clear(&j);
  assert_int_equal(vs_fleet_submit(q, "13", "p", 1, "e", 1, "d3", NULL, err, sizeof err),
                   VS_FLEET_NEW);
  vs_fleet_queue_destroy(&q);
}

static void test_claim(void **state) {
  NEED_REDIS(state);
  vs_redis_fx *f = *state;
  char err[VSPEC_ERRLEN] = "", id[VS_FLEET_ID_MAX];
  vs_fleet_queue *a = open_queue(f, "node-a", 8), *b = open_queue(f, "node-b", 8);
  OK(vs_fleet_ensure_group(a, err, sizeof err));
  OK(vs_fleet_ensure_group(b, err, sizeof err));
  const char payload[] = "req\0uest";
  OK(vs_fleet_enqueue(a, "job-x", payload, sizeof payload, id, err, sizeof err));
  vs_fleet_job j, got;
  vs_fleet_stale_job st[4];
  assert_int_equal(vs_fleet_read(a, 0, &j, err, sizeof err), 1);
  assert_int_equal(j.deliveries, 1);
  vs_fleet_job_clear(&j);
  vs_fleet_queue_destroy(&a); /* node-a dies holding the job, never acks */

  /* b never reads it as new: it is another consumer's, and not idle long enough yet */
  assert_int_equal(vs_fleet_read(b, 0, &j, err, sizeof err), 0);
  assert_int_equal(vs_fleet_stale(b, 200, st, 4, err, sizeof err), 0);
  assert_int_equal(vs_fleet_claim(b, id, 200, &got, err, sizeof err), 0);
  vs_harness_sleep_ms(230);
  int n = vs_fleet_stale(b, 200, st, 4, err, sizeof err);
  if (n < 0) fail_msg("stale: %s", err);
  assert_int_equal(n, 1);
  assert_string_equal(st[0].entry_id, id);
  assert_string_equal(st[0].job_id, "job-x");
  assert_string_equal(st[0].consumer, "node-a");
  assert_true(st[0].idle_ms >= 200);
  assert_int_equal(st[0].deliveries, 1);
  n = vs_fleet_claim(b, id, 200, &got, err, sizeof err);
  if (n < 0) fail_msg("claim: %s", err);
  assert_int_equal(n, 1);
  assert_string_equal(got.entry_id, id);
  assert_string_equal(got.job_id, "job-x");
  assert_int_equal(got.payload_len, sizeof payload);
  assert_memory_equal(got.payload, payload, sizeof payload);
  assert_int_equal(got.deliveries, 2);
  /* claimed: idle again from now, so neither stale nor claimable a second time */
  assert_int_equal(vs_fleet_stale(b, 200, st, 4, err, sizeof err), 0);
  assert_int_equal(vs_fleet_claim(b, id, 200, &j, err, sizeof err), 0);
  long long len = -1, pend = -1;
  OK(vs_fleet_depth(b, &len, &pend, err, sizeof err));
  assert_int_equal(len, 1);
  assert_int_equal(pend, 1);
  assert_int_equal(vs_fleet_ack(b, got.entry_id, err, sizeof err), 1);
  vs_fleet_job_clear(&got);
  OK(vs_fleet_depth(b, &len, &pend, err, sizeof err));
  assert_int_equal(len, 0);
  assert_int_equal(pend, 0);
  assert_int_equal(vs_fleet_stale(b, 0, st, 4, err, sizeof err), 0);
  assert_int_equal(vs_fleet_claim(b, id, 0, &got, err, sizeof err), 0);
  /* a queue without a consumer cannot read or claim */
  vs_fleet_queue *g = open_queue(f, NULL, 8);
  assert_int_equal(vs_fleet_read(g, 0, &j, err, sizeof err), VSPEC_EINVAL);
  assert_int_equal(vs_fleet_claim(g, id, 0, &got, err, sizeof err), VSPEC_EINVAL);
  vs_fleet_queue_destroy(&g);
  vs_fleet_queue_destroy(&b);
}

/* The events of job-id's stream whose data equal `data` (len bytes). */
static int count_events(vs_fleet_queue *q, const char *job_id, const char *data, size_t len) {
  vs_fleet_event ev[16];
  char err[VSPEC_ERRLEN];
  int n = vs_fleet_events_read(q, job_id, "0", 0, ev, 16, err, sizeof err), found = 0;
  if (n < 0) fail_msg("events of %s: %s", job_id, err);
  for (int i = 0; i < n; i++) {
    found += ev[i].len == len && !memcmp(ev[i].data, data, len);
    vs_fleet_event_clear(&ev[i]);
  }
  return found;
}

/* A lost run is announced once, only once it is idle for the claim time, and the mark is a
 * commitment: the daemon that held the job (only slow, here) can no longer refresh it, so it
 * gives the job up instead of racing the daemon that runs it again. */
static void test_announce_loss(void **state) {
  NEED_REDIS(state);
  vs_redis_fx *f = *state;
  char err[VSPEC_ERRLEN] = "", id[VS_FLEET_ID_MAX];
  vs_fleet_queue *a = open_queue(f, "node-a", 8), *b = open_queue(f, "node-b", 8),
                 *c = open_queue(f, "node-c", 8);
  OK(vs_fleet_ensure_group(a, err, sizeof err));
  OK(vs_fleet_enqueue(a, "job-l", "p", 1, id, err, sizeof err));
  vs_fleet_job j;
  assert_int_equal(vs_fleet_read(a, 0, &j, err, sizeof err), 1);
  vs_fleet_stale_job st[2];
  const char *ids[] = {id};
  int ours;
  vs_harness_sleep_ms(120);
  assert_int_equal(vs_fleet_stale(b, 100, st, 2, err, sizeof err), 1);
  /* refreshed in between: no longer idle, not announced */
  assert_int_equal(vs_fleet_touch(a, ids, 1, &ours, err, sizeof err), 1);
  assert_int_equal(vs_fleet_announce_loss(b, &st[0], 100, "lost", 4, err, sizeof err), 0);
  assert_int_equal(count_events(b, "job-l", "lost", 4), 0);
  vs_harness_sleep_ms(120);
  assert_int_equal(vs_fleet_stale(b, 100, st, 2, err, sizeof err), 1);
  /* once, whoever sees it first */
  assert_int_equal(vs_fleet_announce_loss(b, &st[0], 100, "lost", 4, err, sizeof err), 1);
  assert_int_equal(vs_fleet_announce_loss(c, &st[0], 100, "lost", 4, err, sizeof err), 0);
  assert_int_equal(count_events(b, "job-l", "lost", 4), 1);
  /* announced: its holder's refresh keeps it no longer, and it stays claimable */
  assert_int_equal(vs_fleet_touch(a, ids, 1, &ours, err, sizeof err), 0);
  assert_int_equal(ours, 0);
  vs_fleet_job got;
  assert_int_equal(vs_fleet_claim(c, id, 100, &got, err, sizeof err), 1);
  assert_int_equal(got.deliveries, 2);
  /* the next run is another one: its own loss is announced again, once */
  vs_harness_sleep_ms(120);
  assert_int_equal(vs_fleet_stale(b, 100, st, 2, err, sizeof err), 1);
  assert_string_equal(st[0].consumer, "node-c");
  assert_int_equal(st[0].deliveries, 2);
  assert_int_equal(vs_fleet_announce_loss(b, &st[0], 100, "lost", 4, err, sizeof err), 1);
  assert_int_equal(count_events(b, "job-l", "lost", 4), 2);
  vs_fleet_job_clear(&j);
  vs_fleet_job_clear(&got);
  vs_fleet_queue_destroy(&a);
  vs_fleet_queue_destroy(&b);
  vs_fleet_queue_destroy(&c);
}

/* A draining daemon releases a job it will not run: announced, and claimable at once. */
static void test_release(void **state) {
  NEED_REDIS(state);
  vs_redis_fx *f = *state;
  char err[VSPEC_ERRLEN] = "", id[VS_FLEET_ID_MAX];
  vs_fleet_queue *a = open_queue(f, "node-a", 8), *b = open_queue(f, "node-b", 8);
  OK(vs_fleet_ensure_group(a, err, sizeof err));
  OK(vs_fleet_enqueue(a, "job-r", "p", 1, id, err, sizeof err));
  vs_fleet_job j;
  assert_int_equal(vs_fleet_read(a, 0, &j, err, sizeof err), 1);
  /* only its holder releases it, and only the run it holds */
  assert_int_equal(vs_fleet_release(b, id, "job-r", 1, 60000, "bye", 3, err, sizeof err), 0);
  assert_int_equal(vs_fleet_release(a, id, "job-r", 2, 60000, "bye", 3, err, sizeof err), 0);
  assert_int_equal(vs_fleet_release(a, id, "job-r", 1, 60000, "bye", 3, err, sizeof err), 1);
  assert_int_equal(vs_fleet_release(a, id, "job-r", 1, 60000, "bye", 3, err, sizeof err), 0);
  assert_int_equal(count_events(b, "job-r", "bye", 3), 1);
  vs_fleet_stale_job st[2];
  assert_int_equal(vs_fleet_stale(b, 60000, st, 2, err, sizeof err), 1);
  assert_int_equal(vs_fleet_announce_loss(b, &st[0], 60000, "lost", 4, err, sizeof err), 0);
  vs_fleet_job got;
  assert_int_equal(vs_fleet_claim(b, id, 60000, &got, err, sizeof err), 1);
  assert_int_equal(got.deliveries, 2);
  vs_fleet_job_clear(&j);
  vs_fleet_job_clear(&got);
  vs_fleet_queue_destroy(&a);
  vs_fleet_queue_destroy(&b);
}

/* The stale scan pages through a long pending list and starts over after a short page. */
static void test_stale_pages(void **state) {
  NEED_REDIS(state);
  vs_redis_fx *f = *state;
  char err[VSPEC_ERRLEN] = "";
  vs_fleet_queue *a = open_queue(f, "node-a", 8), *b = open_queue(f, "node-b", 8);
  OK(vs_fleet_ensure_group(a, err, sizeof err));
  for (int i = 0; i < 5; i++) {
    char job[16];
    snprintf(job, sizeof job, "job-%d", i);
    OK(vs_fleet_enqueue(a, job, "p", 1, NULL, err, sizeof err));
    vs_fleet_job j;
    assert_int_equal(vs_fleet_read(a, 0, &j, err, sizeof err), 1);
    vs_fleet_job_clear(&j);
  }
  vs_fleet_stale_job st[2];
  const char *want[] = {"job-0", "job-1", "job-2", "job-3", "job-4", "job-0"};
  int k = 0, pages[] = {2, 2, 1, 2};
  for (int p = 0; p < 4; p++) {
    assert_int_equal(vs_fleet_stale(b, 0, st, 2, err, sizeof err), pages[p]);
    for (int i = 0; i < pages[p] && k < 6; i++) assert_string_equal(st[i].job_id, want[k++]);
  }
  vs_fleet_queue_destroy(&a);
  vs_fleet_queue_destroy(&b);
}

static void test_events(void **state) {
  NEED_REDIS(state);
  vs_redis_fx *f = *state;
  char err[VSPEC_ERRLEN] = "";
  vs_fleet_opts o;
  vs_fleet_opts_defaults(&o);
  o.url = f->sock;
  o.events_max_len = 4;
  o.events_ttl_ms = 60000;
  vs_fleet_queue *q = NULL;
  OK(vs_fleet_queue_open(&o, &q, err, sizeof err));

  char ids[6][VS_FLEET_ID_MAX];
  unsigned char data[6][5];
  for (int i = 0; i < 6; i++) {
    unsigned char d[5] = {'e', 0, (unsigned char)i, 0xff, 0};
    memcpy(data[i], d, sizeof d);
  }
  for (int i = 0; i < 3; i++)
    OK(vs_fleet_event_append(q, "job-e", data[i], 5, ids[i], err, sizeof err));
  vs_fleet_event ev[8];
  int n = vs_fleet_events_read(q, "job-e", "0", 0, ev, 8, err, sizeof err);
  if (n < 0) fail_msg("read: %s", err);
  assert_int_equal(n, 3);
  for (int i = 0; i < 3; i++) {
    assert_string_equal(ev[i].id, ids[i]);
    assert_int_equal(ev[i].len, 5);
    assert_memory_equal(ev[i].data, data[i], 5);
    vs_fleet_event_clear(&ev[i]);
  }
  /* resume after an id */
  assert_int_equal(vs_fleet_events_read(q, "job-e", ids[1], 0, ev, 8, err, sizeof err), 1);
  assert_string_equal(ev[0].id, ids[2]);
  vs_fleet_event_clear(&ev[0]);
  /* nothing after the last one: waits block_ms, then 0 */
  double t0 = vs_harness_now();
  assert_int_equal(vs_fleet_events_read(q, "job-e", ids[2], 80, ev, 8, err, sizeof err), 0);
  assert_true(vs_harness_now() - t0 >= 0.07);
  /* the stream expires: PTTL set, within the TTL */
  redisReply *r = raw(f, "PTTL %s%s", "vspec:events:", "job-e");
  assert_int_equal(r->type, REDIS_REPLY_INTEGER);
  assert_true(r->integer > 0 && r->integer <= 60000);
  freeReplyObject(r);
  /* bounded: the oldest go first */
  for (int i = 3; i < 6; i++)
    OK(vs_fleet_event_append(q, "job-e", data[i], 5, ids[i], err, sizeof err));
  assert_int_equal(vs_fleet_events_read(q, "job-e", "0-0", 0, ev, 8, err, sizeof err), 4);
  assert_string_equal(ev[0].id, ids[2]);
  assert_string_equal(ev[3].id, ids[5]);
  for (int i = 0; i < 4; i++) vs_fleet_event_clear(&ev[i]);
  /* max bounds what one call returns */
  assert_int_equal(vs_fleet_events_read(q, "job-e", "0", 0, ev, 2, err, sizeof err), 2);
  vs_fleet_event_clear(&ev[0]);
  vs_fleet_event_clear(&ev[1]);
  /* a job without events; bad ids */
  assert_int_equal(vs_fleet_events_read(q, "job-none", "0", 0, ev, 8, err, sizeof err), 0);
  assert_int_equal(vs_fleet_events_read(q, "job-e", "abc", 0, ev, 8, err, sizeof err),
                   VSPEC_EINVAL);
  assert_int_equal(vs_fleet_event_append(q, "", "x", 1, NULL, err, sizeof err), VSPEC_EINVAL);
  vs_fleet_queue_destroy(&q);
}

static void test_redis_restart(void **state) {
  NEED_REDIS(state);
  vs_redis_fx *f = *state;
  char err[VSPEC_ERRLEN] = "";
  vs_fleet_queue *q = open_queue(f, "node-a", 8);
  OK(vs_fleet_ensure_group(q, err, sizeof err));
  OK(vs_fleet_enqueue(q, "job-1", "p", 1, NULL, err, sizeof err));

  /* a Redis that hangs: the command timeout, not a hang (the connection is dropped) */
  kill(f->pid, SIGSTOP);
  double t0 = vs_harness_now();
  assert_int_equal(vs_fleet_depth(q, NULL, NULL, err, sizeof err), VSPEC_EIO);
  assert_true(vs_harness_now() - t0 < 2.0);
  assert_non_null(strstr(err, "XLEN/XPENDING"));
  assert_non_null(strstr(err, "within 500 ms"));
  assert_false(vs_fleet_queue_connected(q));
  kill(f->pid, SIGCONT);
  long long len = -1;
  OK(vs_fleet_depth(q, &len, NULL, err, sizeof err)); /* connects again by itself */
  assert_int_equal(len, 1);

  /* a Redis that dies: an error naming the command (and no SIGPIPE: this process does not
   * ignore it) */
  vs_redis_kill(f);
  err[0] = '\0';
  assert_int_equal(vs_fleet_enqueue(q, "job-2", "p", 1, NULL, err, sizeof err), VSPEC_EIO);
  print_message("after the kill: %s\n", err);
  assert_non_null(strstr(err, "XLEN"));
  assert_non_null(strstr(err, "lost"));
  assert_false(vs_fleet_queue_connected(q));
  vs_fleet_job j;
  assert_int_equal(vs_fleet_read(q, 100, &j, err, sizeof err), VSPEC_EIO);
  print_message("while down: %s\n", err);
  assert_non_null(strstr(err, "XREADGROUP: cannot connect"));
  assert_int_equal(vs_fleet_ack(q, "1-1", err, sizeof err), VSPEC_EIO);

  /* back (empty: this one keeps nothing): the same queue connects again */
  vs_redis_start(f);
  assert_int_equal(vs_fleet_read(q, 0, &j, err, sizeof err), VS_FLEET_EREDIS); /* NOGROUP */
  OK(vs_fleet_ensure_group(q, err, sizeof err));
  OK(vs_fleet_enqueue(q, "job-3", "again", 5, NULL, err, sizeof err));
  assert_int_equal(vs_fleet_read(q, 100, &j, err, sizeof err), 1);
  assert_string_equal(j.job_id, "job-3");
  assert_int_equal(vs_fleet_ack(q, j.entry_id, err, sizeof err), 1);
  vs_fleet_job_clear(&j);
  vs_fleet_queue_destroy(&q);
}

static vs_fleet_queue *open_url(const char *url) {
  vs_fleet_opts o;
  vs_fleet_opts_defaults(&o);
  o.url = url;
  o.connect_timeout_ms = 500;
  o.command_timeout_ms = 500;
  vs_fleet_queue *q = NULL;
  char err[VSPEC_ERRLEN] = "";
  if (vs_fleet_queue_open(&o, &q, err, sizeof err)) fail_msg("open: %s", err);
  return q;
}

/* A Redis with a password: the right one works, a wrong or missing one is Redis's error,
 * and no message shows the password. */
static void test_auth(void **state) {
  NEED_REDIS(state);
  vs_redis_fx *f = *state;
  char err[VSPEC_ERRLEN] = "", url[300];
  freeReplyObject(raw(f, "CONFIG SET %s %s", "requirepass", "s3cret"));
  snprintf(url, sizeof url, "unix://:s3cret@%s", f->sock);
  vs_fleet_queue *q = open_url(url);
  OK(vs_fleet_ensure_group(q, err, sizeof err));
  vs_fleet_queue_destroy(&q);

  snprintf(url, sizeof url, "unix://default:wr0ng@%s", f->sock);
  q = open_url(url);
  assert_int_equal(vs_fleet_ensure_group(q, err, sizeof err), VS_FLEET_EREDIS);
  print_message("wrong password: %s\n", err);
  assert_non_null(strstr(err, "XGROUP CREATE: AUTH"));
  assert_null(strstr(err, "wr0ng"));
  assert_false(vs_fleet_queue_connected(q)); /* an unauthenticated connection is not kept */
  vs_fleet_queue_destroy(&q);

  q = open_url(f->sock);
  assert_int_equal(vs_fleet_ensure_group(q, err, sizeof err), VS_FLEET_EREDIS);
  assert_non_null(strstr(err, "NOAUTH"));
  vs_fleet_queue_destroy(&q);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_addr_parse),
      cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
      cmocka_unit_test_setup_teardown(test_busy, setup, teardown),
      cmocka_unit_test_setup_teardown(test_submit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_claim, setup, teardown),
      cmocka_unit_test_setup_teardown(test_announce_loss, setup, teardown),
      cmocka_unit_test_setup_teardown(test_release, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stale_pages, setup, teardown),
      cmocka_unit_test_setup_teardown(test_events, setup, teardown),
      cmocka_unit_test_setup_teardown(test_redis_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_auth, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
