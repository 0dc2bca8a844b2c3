/*
 * tests/test_http_slow.c - slow and crowding HTTP clients (issue 32, finding 2): requests
 * trickled a byte at a time are cut by [http] request_deadline_ms however steadily they
 * trickle, a crowd of them never keeps /health out, an address past
 * max_connections_per_address is refused, and each is counted in /metrics. Raw loopback
 * sockets; the deadline is 1 s and max_connections 4 here, so that it takes seconds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/support/daemon_harness.h"
#include "tests/support/raw_http.h"

static vs_fixture fx;

static int read_port(const char *log) {
  static const char tag[] = "[http] listening on http://127.0.0.1:";
  for (int i = 0; i < 100; i++) {
    FILE *f = fopen(log, "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
      const char *p = strstr(line, tag);
      if (p) {
        fclose(f);
        return atoi(p + strlen(tag));
      }
    }
    if (f) fclose(f);
    vs_harness_sleep_ms(50);
  }
  return 0;
}

static void start(vs_daemon *d, const char *name, const char *per_address, int *port) {
  const char *extra[] = {"--set", "http.listen=127.0.0.1:0", "--set",
                         "http.request_deadline_ms=1000", "--set", "http.max_connections=4",
                         "--set", per_address, NULL};
  vs_daemon_start(d, &fx, name, extra);
  *port = read_port(d->log);
  if (!*port) {
    vs_daemon_dump_log(d);
    fail_msg("no HTTP port in the log");
  }
}

static void stop(vs_daemon *d) {
  int rc = vs_daemon_stop(d, 15, 10000);
  if (rc) vs_daemon_dump_log(d);
  assert_int_equal(rc, 0);
}

/* One sample of /metrics, or -1. */
static double metric(int port, const char *series) {
  static const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  int fd = raw_connect(port);
  assert_int_equal(raw_send(fd, req, sizeof req - 1), 0);
  char *r = raw_read_all(fd, 5, NULL);
  close(fd);
  const char *p = strstr(r, series);
  double v = p && p[strlen(series)] == ' ' ? strtod(p + strlen(series) + 1, NULL) : -1;
  free(r);
  return v;
}

static int count_lines(const char *log, const char *needle) {
  FILE *f = fopen(log, "r");
  char line[2048];
  int n = 0;
  while (f && fgets(line, sizeof line, f)) n += strstr(line, needle) != NULL;
  if (f) fclose(f);
  return n;
}

static const char health[] = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
static const char trickle[] = "POST /v1/images/generations HTTP/1.1\r\nHost: x\r\n"
                              "X-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";

/* n connections each sending one more byte of `trickle` every 100 ms for `seconds`, while
 * /health is asked from a fresh connection every 300 ms: the slowest health answer (s), and
 * in closed[i] when connection i was seen closed (0 = never). */
static double trickle_for(int port, int n, double seconds, double *closed) {
  int fd[32];
  size_t sent[32] = {0};
  double t0 = vs_harness_now(), worst = 0, next_health = t0 + 0.2;
  for (int i = 0; i < n; i++) {
    fd[i] = raw_connect(port);
    closed[i] = 0;
  }
  while (vs_harness_now() < t0 + seconds) {
    for (int i = 0; i < n; i++) {
      if (closed[i]) continue;
      if (raw_send(fd[i], trickle + sent[i] % (sizeof trickle - 1), 1) ||
          raw_closed_within(fd[i], 0)) {
        closed[i] = vs_harness_now() - t0;
        continue;
      }
      sent[i]++;
    }
    if (vs_harness_now() >= next_health) {
      double s;
      int st = raw_request(port, health, sizeof health - 1, 5, &s);
      if (st != 200) fail_msg("/health: status %d after %.2f s", st, s);
      if (s > worst) worst = s;
      next_health = vs_harness_now() + 0.3;
    }
    vs_harness_sleep_ms(100);
  }
  for (int i = 0; i < n; i++) close(fd[i]);
  return worst;
}

/* Fewer trickling clients than max_connections: each is cut at the deadline (1 s), though it
 * sent a byte every 100 ms; then more of them than max_connections + the reserve: /health
 * still answers at once (the oldest trickling one is closed for each newcomer). */
static void test_deadline_and_crowd(void **state) {
  vs_daemon d;
  int port;
  start(&d, "slow", "http.max_connections_per_address=0", &port);
  double closed[32];
  double worst = trickle_for(port, 3, 1.8, closed);
  for (int i = 0; i < 3; i++)
    if (closed[i] < 0.9 || closed[i] > 1.5)
      fail_msg("trickling connection %d closed at %.2f s (deadline 1 s)", i, closed[i]);
  assert_true(worst < 0.5);
  assert_int_equal(metric(port, "vspec_http_connections_closed_total{reason=\"deadline\"}"), 3);
  worst = trickle_for(port, 16, 2.5, closed);
  if (worst > 0.5) fail_msg("/health took %.2f s among 16 trickling clients", worst);
  for (int i = 0; i < 16; i++)
    if (!closed[i]) fail_msg("trickling connection %d was never closed", i);
  assert_true(metric(port, "vspec_http_connections_closed_total{reason=\"displaced\"}") >= 8);
  /* logged, once per address and kind per 10 s */
  assert_int_equal(count_lines(d.log, "no complete request within 1000 ms"), 1);
  assert_int_equal(count_lines(d.log, "that had not sent its request, for a new one"), 1);
  stop(&d);
}

/* An address past max_connections_per_address is refused at once, and counted. */
static void test_per_address(void **state) {
  vs_daemon d;
  int port;
  start(&d, "peraddr", "http.max_connections_per_address=2", &port);
  int a = raw_connect(port), b = raw_connect(port);
  vs_harness_sleep_ms(100);
  int c = raw_connect(port);
  assert_true(raw_closed_within(c, 1.0));
  assert_false(raw_closed_within(a, 0.1));
  close(a);
  close(b);
  close(c);
  vs_harness_sleep_ms(100);
  assert_int_equal(metric(port, "vspec_http_connections_refused_total{reason=\"per_address\"}"), 1);
  assert_int_equal(count_lines(d.log, "max_connections_per_address"), 1);
  stop(&d);
}

static int setup(void **state) {
  vs_fixture_make(&fx);
  return 0;
}

static int teardown(void **state) {
  vs_fixture_remove(&fx);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deadline_and_crowd),
      cmocka_unit_test(test_per_address),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
