/*
 * vspecd's exit status at start (issue 32, finding 7): every configuration it refuses exits 2,
 * as `vspecd --help` says, whether the refusal comes while parsing or while starting (a world-
 * writable plugin directory exited 1, "runtime failure", before); a failure of the moment (the
 * port in use) still exits 1. Each start fails before it serves, in well under a second.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/support/cli_run.h"
#include "tests/support/daemon_harness.h"

static vs_fixture fx;

/* Runs vspecd on the fixture with `extra` (NULL-ended) after the usual arguments, and
 * returns its exit status; its stderr (the log) into out. */
static int start(const char *const *extra, char *out, size_t n) {
  char micro[1200], job[300], admin[300];
  snprintf(micro, sizeof micro, "micro=%s", fx.micro_model);
  snprintf(job, sizeof job, "ipc://%s/exit-job.sock", fx.dir);
  snprintf(admin, sizeof admin, "ipc://%s/exit-admin.sock", fx.dir);
  const char *args[40] = {"--endpoint", job, "--admin", admin, "--plugins", fx.plugins,
                          "--model", micro, "--set", "models.fmnist=", "--default-model",
                          "micro", "--threads", "1"};
  int k = 14;
  for (int i = 0; extra[i] && k < 39; i++) args[k++] = extra[i];
  args[k] = NULL;
  return vs_run_tool_all("vspecd", args, 30, out, n);
}

static void expect(const char *const *extra, int status, const char *words) {
  static char out[1 << 16];
  int rc = start(extra, out, sizeof out);
  const char *last = strstr(out, "error [vspecd]");
  printf("  %s %s -> %d: %.*s\n", extra[0], extra[1] ? extra[1] : "", rc,
         last ? (int)strcspn(last, "\n") : 0, last ? last : "");
  if (rc != status || !strstr(out, words)) fail_msg("exit %d (want %d), output:\n%s", rc, status, out);
}

static void test_refusals_exit_2(void **state) {
  (void)state;
  /* the plugin directory: writable by everyone, then missing */
  assert_int_equal(chmod(fx.plugins, 0777), 0);
  const char *none[] = {"--log-level", "warn", NULL};
  expect(none, 2, "writable by everyone");
  assert_int_equal(chmod(fx.plugins, 0755), 0);
  char gone[400];
  snprintf(gone, sizeof gone, "%s/no-such-dir", fx.dir);
  const char *nodir[] = {"--plugins", gone, NULL};
  expect(nodir, 2, "does not exist or is not a directory");
  /* no configured model loads */
  const char *nomodel[] = {"--set", "models.micro=/nonexistent/model", NULL};
  expect(nomodel, 2, "none of the 1 configured models could be loaded");
  /* CURVE with a key file that is not there */
  char sk[500], al[500];
  snprintf(sk, sizeof sk, "curve.secret_key_file=%s/absent.key", fx.dir);
  snprintf(al, sizeof al, "curve.allowed_clients=%s/absent.allow", fx.dir);
  const char *nokey[] = {"--set", "curve.enabled=true", "--set", sk, "--set", al, NULL};
  expect(nokey, 2, "absent.key");
  /* an address this host does not have (TEST-NET-1) */
  const char *addr[] = {"--endpoint", "tcp://192.0.2.1:5555", NULL};
  expect(addr, 2, "cannot bind tcp://192.0.2.1:5555");
  /* a bad value, refused while parsing (as before) */
  const char *value[] = {"--set", "queue.size=lots", NULL};
  expect(value, 2, "queue.size");
}

/* The port taken by someone else: the moment's fault, not the configuration's. */
static void test_port_in_use_exits_1(void **state) {
  (void)state;
  chmod(fx.plugins, 0755); /* as it was, even after a failure of the test above */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(fd, 1), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  char ep[64];
  snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", ntohs(a.sin_port));
  const char *busy[] = {"--endpoint", ep, NULL};
  expect(busy, 1, "Address already in use");
  close(fd);
}

static void test_help_documents_it(void **state) {
  (void)state;
  char out[8192];
  const char *args[] = {"--help", NULL};
  assert_int_equal(vs_run_tool_all("vspecd", args, 10, out, sizeof out), 0);
  assert_non_null(strstr(out, "2  usage, or a configuration refused"));
  assert_non_null(strstr(out, "a plugin directory missing or writable by others"));
}

static int setup(void **state) {
  (void)state;
  vs_fixture_make(&fx);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  vs_fixture_remove(&fx);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals_exit_2),
      cmocka_unit_test(test_port_in_use_exits_1),
      cmocka_unit_test(test_help_documents_it),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
