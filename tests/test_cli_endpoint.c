/*
 * Endpoint syntax is a usage error (exit 2) that shows the right forms, in every command and
 * from every source (--server, --admin, $VSPEC_SERVER, $VSPEC_ADMIN): `--server
 * 127.0.0.1:5555` (no transport) and `--server http://...` (the HTTP port) used to reach
 * zmq_connect and end with its errno text and exit 3. Well-formed endpoints still pass the
 * check (and then find nobody listening: exit 3). No daemon is started.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "tests/support/cli_run.h"

#define WAIT_MS 20000

static const char *const bad[][2] = {
    {"127.0.0.1:5555", "did you mean tcp://127.0.0.1:5555?"},
    {"http://127.0.0.1:8080", "is an HTTP URL"},
    {"tcp://127.0.0.1", "needs HOST:PORT"},
    {"tcp://127.0.0.1:99999", "needs HOST:PORT"},
    {"udp://127.0.0.1:5555", "tcp or ipc only"},
    {"localhost", "is not an endpoint"},
};
#define N_BAD (sizeof bad / sizeof bad[0])

/* Every command that talks to a daemon, as run without an endpoint option. */
static const char *const commands[][3] = {
    {"generate", NULL}, {"status", NULL}, {"plugins", "list"}, {"cancel", "12"}, {"ping", NULL}};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void expect_usage(const char *what, const vs_cli_result *r, const char *hint) {
  printf("  %s: exit %d: %s", what, r->status, r->err);
  if (r->status != 2 || !strstr(r->err, hint) || !strstr(r->err, "tcp://HOST:PORT") ||
      !strstr(r->err, "ipc://PATH"))
    fail_msg("%s: want exit 2 saying '%s' and showing tcp://HOST:PORT and ipc://PATH", what,
             hint);
}

/* argv: the command, then `opt value` when opt is given. */
static void run(vs_cli_result *r, size_t cmd, const char *opt, const char *value,
                const char *const *env) {
  const char *args[8] = {commands[cmd][0]};
  int n = 1;
  if (commands[cmd][1]) args[n++] = commands[cmd][1];
  if (opt) {
    args[n++] = opt;
    args[n++] = value;
  }
  args[n++] = "--timeout";
  args[n++] = "2";
  vs_cli_run(r, args, "/nonexistent-state", env, WAIT_MS);
}

static void test_options(void **state) {
  (void)state;
  static vs_cli_result r;
  char what[200];
  for (size_t c = 0; c < N_COMMANDS; c++)
    for (size_t b = 0; b < N_BAD; b++)
      for (int admin = 0; admin < 2; admin++) {
        const char *opt = admin ? "--admin" : "--server";
        run(&r, c, opt, bad[b][0], NULL);
        snprintf(what, sizeof what, "vspec %s %s %s", commands[c][0], opt, bad[b][0]);
        expect_usage(what, &r, bad[b][1]);
        assert_non_null(strstr(r.err, opt));
      }
}

static void test_environment(void **state) {
  (void)state;
  static vs_cli_result r;
  char what[200], var[200];
  for (size_t c = 0; c < N_COMMANDS; c++)
    for (int admin = 0; admin < 2; admin++) {
      const char *name = admin ? "VSPEC_ADMIN" : "VSPEC_SERVER";
      snprintf(var, sizeof var, "%s=%s", name, bad[0][0]);
      const char *env[] = {var, NULL};
      run(&r, c, NULL, NULL, env);
      snprintf(what, sizeof what, "%s vspec %s", var, commands[c][0]);
      expect_usage(what, &r, bad[0][1]);
      assert_non_null(strstr(r.err, name));
    }
}

/* The forms the check must let through: nobody listens there, so exit 3. */
static void test_good_forms_pass(void **state) {
  (void)state;
  static vs_cli_result r;
  const char *good[] = {"ipc:///nonexistent/vspec-test.sock", "tcp://127.0.0.1:1",
                        "tcp://[::1]:1"};
  for (size_t g = 0; g < sizeof good / sizeof good[0]; g++) {
    run(&r, 4, "--server", good[g], NULL);
    printf("  ping --server %s: exit %d: %s", good[g], r.status, r.err);
    assert_int_equal(r.status, 3);
    assert_null(strstr(r.err, "tcp://HOST:PORT"));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_options),
                                     cmocka_unit_test(test_environment),
                                     cmocka_unit_test(test_good_forms_pass)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
