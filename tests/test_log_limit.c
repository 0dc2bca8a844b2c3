/*
 * Rate-limited logging (core/log_limit.h) and its use for refused CURVE clients in vspecd
 * (daemon/zap.c; issue 32, finding 5): one peer that retries without end got one log line
 * per refusal (241 lines in 11 s); now one line per peer per 10 s and the count of the rest.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "core/log_limit.h"
#include "proto/curve_keys.h"
#include "tests/support/daemon_harness.h"

static void test_one_line_per_key_per_interval(void **state) {
  (void)state;
  vs_log_limit l;
  vs_log_limit_init(&l, 10);
  uint64_t n = 99;
  assert_int_equal(vs_log_limit_allow(&l, "10.0.0.1", 100.0, &n), 1);
  assert_int_equal(n, 0);
  for (int i = 0; i < 240; i++) assert_int_equal(vs_log_limit_allow(&l, "10.0.0.1", 100.0 + i * 0.04, &n), 0);
  /* another peer is not held back by the first */
  assert_int_equal(vs_log_limit_allow(&l, "10.0.0.2", 101.0, &n), 1);
  assert_int_equal(n, 0);
  /* the interval over: a line again, with the count of what was not logged */
  assert_int_equal(vs_log_limit_allow(&l, "10.0.0.1", 110.0, &n), 1);
  assert_int_equal(n, 240);
  assert_int_equal(vs_log_limit_allow(&l, "10.0.0.1", 110.5, &n), 0);
  assert_int_equal(vs_log_limit_allow(&l, "10.0.0.1", 111.0, &n), 0);
  /* a peer that went quiet: its count is taken once its interval passed, then forgotten */
  char key[64];
  assert_int_equal(vs_log_limit_take_quiet(&l, 119.0, key, sizeof key, &n), 0);
  assert_int_equal(vs_log_limit_take_quiet(&l, 120.0, key, sizeof key, &n), 1);
  assert_string_equal(key, "10.0.0.1");
  assert_int_equal(n, 2);
  assert_int_equal(vs_log_limit_take_quiet(&l, 1e9, key, sizeof key, &n), 0); /* .2: nothing */
  assert_int_equal(vs_log_limit_allow(&l, "10.0.0.1", 120.1, &n), 1);
  assert_int_equal(n, 0);
  vs_log_limit_destroy(&l);
}

/* More peers than slots: the rest share one, so a crowd is limited as one peer. */
static void test_crowd_shares_a_slot(void **state) {
  (void)state;
  vs_log_limit l;
  vs_log_limit_init(&l, 10);
  uint64_t n;
  char key[64];
  int lines = 0;
  for (int round = 0; round < 5; round++)
    for (int p = 0; p < 1000; p++) {
      snprintf(key, sizeof key, "10.1.%d.%d", p / 256, p % 256);
      lines += vs_log_limit_allow(&l, key, 50.0 + round, &n);
    }
  assert_int_equal(lines, VS_LOG_LIMIT_KEYS + 1);
  /* at exit every count is said: the shared slot holds all the others' */
  uint64_t total = 0;
  int keys = 0, others = 0;
  while (vs_log_limit_take_quiet(&l, INFINITY, key, sizeof key, &n)) {
    total += n;
    keys++;
    others += !strcmp(key, VS_LOG_LIMIT_OTHERS);
  }
  assert_int_equal(others, 1);
  assert_int_equal(keys, VS_LOG_LIMIT_KEYS + 1);
  assert_int_equal(total + (uint64_t)lines, 5000);
  vs_log_limit_destroy(&l);
}

/* Lines of the file that contain `needle`; the number after `after` in the last such line
 * into *num (when after is not NULL). */
static int count_lines(const char *path, const char *needle, const char *after, long *num) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[2048];
  int n = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, needle)) {
      n++;
      if (after && strstr(line, after)) *num = strtol(strstr(line, after) + strlen(after), NULL, 10);
    }
  fclose(f);
  return n;
}

static void keygen(const char *prefix, char pub[41]) {
  char out[512];
  const char *args[] = {"keygen", prefix, NULL};
  assert_int_equal(vs_run_tool("vspec", args, out, sizeof out), 0);
  if (pub) snprintf(pub, 41, "%.40s", out);
}

/* One connection with a key not on the allow-list: 1 when its monitor saw the refusal
 * (HANDSHAKE_FAILED_AUTH) within a second. libzmq does not retry after it, so a peer that
 * keeps trying makes new connections, as this does. */
static int refused_once(void *ctx, const char *ep, const char *keys[3], int i) {
  int zero = 0;
  void *s = zmq_socket(ctx, ZMQ_DEALER), *mon = zmq_socket(ctx, ZMQ_PAIR);
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(mon, ZMQ_LINGER, &zero, sizeof zero);
  zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, keys[0], 40);
  zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, keys[1], 40);
  zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, keys[2], 40);
  char mep[64];
  snprintf(mep, sizeof mep, "inproc://refused-%d", i);
  assert_int_equal(zmq_socket_monitor(s, mep, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH), 0);
  assert_int_equal(zmq_connect(mon, mep), 0);
  assert_int_equal(zmq_connect(s, ep), 0);
  zmq_pollitem_t it = {.socket = mon, .events = ZMQ_POLLIN};
  int refused = zmq_poll(&it, 1, 1000) == 1;
  zmq_socket_monitor(s, NULL, 0);
  zmq_close(s);
  zmq_close(mon);
  return refused;
}

/* Connections refused one after the other, for a second (at most 300): the refusals the
 * clients saw. */
static int refused_storm(const char *ep, const char *spub, const char *key) {
  char server[41], pub[41], sec[41], err[512];
  if (vs_curve_key_arg(spub, "public", server, err, sizeof err) ||
      vs_curve_read_key(key, "public", pub, err, sizeof err) ||
      vs_curve_read_key(key, "secret", sec, err, sizeof err))
    fail_msg("%s", err);
  const char *keys[3] = {server, pub, sec};
  void *ctx = zmq_ctx_new();
  int refused = 0;
  double end = vs_harness_now() + 1.0;
  for (int i = 0; i < 300 && vs_harness_now() < end; i++) refused += refused_once(ctx, ep, keys, i);
  zmq_ctx_term(ctx);
  return refused;
}

static void test_daemon_refusals_rate_limited(void **state) {
  (void)state;
  vs_fixture fx;
  vs_fixture_make(&fx);
  char server[300], alice[300], mallory[300], list[300], pub[41];
  snprintf(server, sizeof server, "%s/server", fx.dir);
  snprintf(alice, sizeof alice, "%s/alice", fx.dir);
  snprintf(mallory, sizeof mallory, "%s/mallory", fx.dir);
  snprintf(list, sizeof list, "%s/clients.allow", fx.dir);
  keygen(server, NULL);
  keygen(alice, pub);
  keygen(mallory, NULL);
  FILE *l = fopen(list, "w");
  assert_non_null(l);
  fprintf(l, "%s alice\n", pub);
  fclose(l);
  char sarg[400], larg[400], spub[320], mkey[320];
  snprintf(sarg, sizeof sarg, "curve.secret_key_file=%s.key", server);
  snprintf(larg, sizeof larg, "curve.allowed_clients=%s", list);
  snprintf(spub, sizeof spub, "%s.pub", server);
  snprintf(mkey, sizeof mkey, "%s.key", mallory);
  const char *extra[] = {"--set", "curve.enabled=true", "--set", sarg, "--set", larg, NULL};
  vs_daemon d;
  vs_daemon_start(&d, &fx, "refusals", extra);
  int refused = refused_storm(d.job_ep, spub, mkey);
  vs_harness_sleep_ms(100); /* the last refusals reach the log */
  int lines = count_lines(d.log, "refused a CURVE client", NULL, NULL);
  printf("  %d refusals seen by the clients in 1 s, %d line(s) logged\n", refused, lines);
  assert_true(refused >= 20);
  assert_int_equal(lines, 1);
  int rc = vs_daemon_stop(&d, SIGTERM, 10000);
  if (rc) vs_daemon_dump_log(&d);
  assert_int_equal(rc, 0);
  /* at exit the count of the rest: every refusal is accounted for */
  long rest = -1;
  assert_int_equal(count_lines(d.log, "not logged one by one", "[zap] ", &rest), 1);
  printf("  at exit: %ld more refusal(s) reported\n", rest);
  assert_true(rest + 1 >= refused);
  vs_fixture_remove(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_line_per_key_per_interval),
      cmocka_unit_test(test_crowd_shares_a_slot),
      cmocka_unit_test(test_daemon_refusals_rate_limited),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
