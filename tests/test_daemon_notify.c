/*
 * systemd's readiness protocol (daemon/sd_notify.h): a vspecd started with $NOTIFY_SOCKET
 * sends STATUS lines while it loads, READY=1 once it answers, RELOADING=1 then READY=1
 * around a SIGHUP rescan and STOPPING=1 when it drains; the abstract-namespace form of the
 * variable ('@') and its absence work too.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/sd_notify.h"
#include "support/daemon_harness.h"

/* A datagram socket bound at `path` ('@' first: abstract). */
static int bind_dgram(const char *path) {
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  size_t len = strlen(path);
  memcpy(sa.sun_path, path, len);
  socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + 1);
  if (path[0] == '@') {
    sa.sun_path[0] = 0;
    salen--;
  }
  assert_int_equal(bind(fd, (struct sockaddr *)&sa, salen), 0);
  return fd;
}

/* Reads datagrams until one contains `want` (as a whole line); fails after timeout_ms.
 * Every message read is appended to seen. */
static void expect(int fd, const char *want, int timeout_ms, char *seen, size_t cap) {
  double end = vs_harness_now() + timeout_ms / 1000.0;
  for (;;) {
    int left = (int)((end - vs_harness_now()) * 1000);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (left <= 0 || poll(&p, 1, left) <= 0) fail_msg("no '%s' within %d ms; got: %s", want,
                                                      timeout_ms, seen);
    char buf[600];
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    assert_true(n > 0);
    buf[n] = 0;
    size_t o = strlen(seen);
    snprintf(seen + o, cap - o, "[%s] ", buf);
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
      if (!strcmp(line, want)) return;
  }
}

static void test_daemon_notifies(void **state) {
  (void)state;
  vs_fixture f;
  vs_fixture_make(&f);
  char path[300], seen[4096] = "";
  snprintf(path, sizeof path, "%s/notify.sock", f.dir);
  int fd = bind_dgram(path);
  setenv("NOTIFY_SOCKET", path, 1);
  vs_daemon d;
  vs_daemon_start(&d, &f, "notify", NULL);
  unsetenv("NOTIFY_SOCKET");
  expect(fd, "READY=1", 5000, seen, sizeof seen);
  assert_non_null(strstr(seen, "STATUS=loading model micro"));
  /* a reload (systemctl reload sends SIGHUP): RELOADING=1, then READY=1 again */
  seen[0] = 0;
  assert_int_equal(kill(d.pid, SIGHUP), 0);
  expect(fd, "RELOADING=1", 5000, seen, sizeof seen);
  assert_non_null(strstr(seen, "MONOTONIC_USEC="));
  expect(fd, "READY=1", 10000, seen, sizeof seen);
  seen[0] = 0;
  assert_int_equal(kill(d.pid, SIGTERM), 0);
  expect(fd, "STOPPING=1", 5000, seen, sizeof seen);
  if (vs_daemon_stop(&d, SIGTERM, 10000) != 0) {
    vs_daemon_dump_log(&d);
    fail_msg("vspecd did not exit cleanly");
  }
  close(fd);
  vs_fixture_remove(&f);
}

static void test_abstract_and_absent(void **state) {
  (void)state;
  char name[64];
  snprintf(name, sizeof name, "@vspec-notify-test-%ld", (long)getpid());
  int fd = bind_dgram(name);
  setenv("NOTIFY_SOCKET", name, 1);
  assert_int_equal(vs_sd_notify("READY=1"), 1);
  assert_int_equal(vs_sd_notifyf("loading %s", "x"), 1);
  char seen[512] = "";
  expect(fd, "READY=1", 1000, seen, sizeof seen);
  expect(fd, "STATUS=loading x", 1000, seen, sizeof seen);
  /* a relative path is no socket systemd would give: refused, not sent somewhere */
  setenv("NOTIFY_SOCKET", "notify.sock", 1);
  assert_true(vs_sd_notify("READY=1") < 0);
  unsetenv("NOTIFY_SOCKET");
  assert_int_equal(vs_sd_notify("READY=1"), 0);
  close(fd);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_abstract_and_absent),
      cmocka_unit_test(test_daemon_notifies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
