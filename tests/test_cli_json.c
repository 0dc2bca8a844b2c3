/*
 * `vspec generate --json` promises that the last line of stdout is the result or an error
 * object. It used to print no JSON at all when no daemon ran (or on a bad command line, a
 * timeout, an interrupt), and to end with a progress event when --out could not be written.
 * Each way of ending is produced here against a fake daemon (tests/support/fake_daemon.h):
 * the last line must be {"event": "error", "code": ..., "exit": N} with N the exit status.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/support/cli_run.h"
#include "tests/support/daemon_harness.h"
#include "tests/support/fake_daemon.h"

#define WAIT_MS 30000

/* The last line of r's stdout is an error object with code and exit status `status`. */
static void expect_error(const char *what, const vs_cli_result *r, const char *code,
                         int status) {
  char last[4096], want[200];
  vs_cli_last_line(r->out, last, sizeof last);
  printf("  %s: exit %d, last line: %s\n", what, r->status, last);
  snprintf(want, sizeof want, "\"code\": \"%s\"", code);
  if (r->status != status || strncmp(last, "{\"event\": \"error\"", 17) || !strstr(last, want))
    fail_msg("%s: want exit %d and a last line {\"event\": \"error\", ... %s}; stderr: %s",
             what, status, want, r->err);
  snprintf(want, sizeof want, "\"exit\": %d}", status);
  assert_non_null(strstr(last, want));
}

static void test_no_daemon(void **state) {
  (void)state;
  static vs_cli_result r;
  const char *args[] = {"generate", "--json", "--server", "ipc:///nonexistent/vspecd.sock",
                        "--out", "/tmp/vspec-json-never.png", NULL};
  vs_cli_run(&r, args, "/nonexistent-state", NULL, WAIT_MS);
  expect_error("no daemon (ipc)", &r, "unreachable", 3);
  const char *tcp[] = {"generate", "--json", "--server", "tcp://127.0.0.1:1", "--out",
                       "/tmp/vspec-json-never.png", NULL};
  vs_cli_run(&r, tcp, "/nonexistent-state", NULL, WAIT_MS);
  expect_error("no daemon (tcp)", &r, "unreachable", 3);
}

/* Usage errors once --json is on the command line, before or after the bad part. */
static void test_usage(void **state) {
  (void)state;
  static vs_cli_result r;
  const char *cases[][6] = {{"--json", "--seed", "x", NULL},
                            {"--seed", "x", "--json", NULL},
                            {"--json", "--no-such-option", NULL},
                            {"--json", "--server", "127.0.0.1:5555", NULL},
                            {"--json", "--preview-kind", "tokens", NULL},
                            {"--json", "--method", "ar", "--accept", "exact", NULL},
                            {"--json", "stray", NULL}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *args[8] = {"generate"};
    char what[200] = "generate";
    for (int k = 0; cases[i][k]; k++) {
      args[k + 1] = cases[i][k];
      snprintf(what + strlen(what), sizeof what - strlen(what), " %s", cases[i][k]);
    }
    vs_cli_run(&r, args, "/nonexistent-state", NULL, WAIT_MS);
    expect_error(what, &r, "usage", 2);
  }
}

/* --out in a folder that does not exist: refused before anything is submitted. */
static void test_out_folder_missing(void **state) {
  (void)state;
  vs_fake f;
  vs_fake_open(&f);
  static vs_cli_result r;
  char out[300];
  snprintf(out, sizeof out, "%s/no/such/folder/img.png", f.dir);
  const char *args[] = {"generate", "--json", "--server", f.ep, "--out", out, NULL};
  vs_cli_run(&r, args, f.dir, NULL, WAIT_MS);
  expect_error("--out in a missing folder", &r, "output", 1);
  vs_wire_msg m;
  vs_wire_alloc a;
  assert_null(vs_fake_recv(&f, 100, &m, &a)); /* nothing was submitted */
  vs_fake_close(&f);
}

/* --out that cannot be written when the result comes (a folder by that name): the job ran
 * and its progress was printed; the last line is still the error. */
static void test_out_unwritable_at_the_end(void **state) {
  (void)state;
  vs_fake f;
  vs_fake_open(&f);
  static vs_cli_result r;
  char out[300];
  snprintf(out, sizeof out, "%s/taken", f.dir);
  assert_int_equal(mkdir(out, 0755), 0);
  const char *args[] = {"generate", "--json", "--server", f.ep, "--out", out, NULL};
  vs_cli_proc p;
  vs_cli_start(&p, args, f.dir, NULL);
  int has_seed;
  vs_fake_accepted(&f, vs_fake_submit(&f, WAIT_MS, &has_seed));
  vs_fake_progress(&f);
  vs_fake_result(&f, NULL, 0);
  vs_cli_finish(&p, &r, WAIT_MS);
  vs_fake_drain(&f, 200);
  assert_non_null(strstr(r.out, "{\"event\": \"progress\""));
  expect_error("--out is a folder", &r, "output", 1);
  assert_non_null(strstr(r.out, "image is lost"));
  vs_fake_close(&f);
}

/* A daemon that never answers: --timeout's error object. */
static void test_timeout(void **state) {
  (void)state;
  vs_fake f;
  vs_fake_open(&f);
  static vs_cli_result r;
  const char *args[] = {"generate", "--json", "--server", f.ep, "--timeout", "1", "--out",
                        "/tmp/vspec-json-never.png", NULL};
  vs_cli_run(&r, args, f.dir, NULL, WAIT_MS);
  expect_error("silent daemon, --timeout 1", &r, "timeout", 3);
  vs_fake_drain(&f, 100); /* that client's submit */
  /* accepted, then silence */
  vs_cli_proc p;
  vs_cli_start(&p, args, f.dir, NULL);
  int has_seed;
  vs_fake_accepted(&f, vs_fake_submit(&f, WAIT_MS, &has_seed));
  vs_cli_finish(&p, &r, WAIT_MS);
  expect_error("accepted, then silence", &r, "timeout", 3);
  assert_non_null(strstr(r.out, "\"event\": \"accepted\""));
  assert_non_null(strstr(r.out, "said nothing about job 77"));
  vs_fake_close(&f);
}

/* Ctrl-C before the daemon answered, and while it is silent about a cancel. */
static void test_interrupt(void **state) {
  (void)state;
  vs_fake f;
  vs_fake_open(&f);
  static vs_cli_result r;
  const char *args[] = {"generate", "--json", "--server", f.ep, "--timeout", "30", "--out",
                        "/tmp/vspec-json-never.png", NULL};
  vs_cli_proc p;
  vs_cli_start(&p, args, f.dir, NULL);
  int has_seed;
  vs_fake_submit(&f, WAIT_MS, &has_seed);
  kill(p.pid, SIGINT);
  vs_cli_finish(&p, &r, WAIT_MS);
  expect_error("SIGINT before acceptance", &r, "interrupted", 130);
  vs_cli_start(&p, args, f.dir, NULL);
  vs_fake_accepted(&f, vs_fake_submit(&f, WAIT_MS, &has_seed));
  vs_harness_sleep_ms(300);
  kill(p.pid, SIGTERM);
  vs_cli_finish(&p, &r, WAIT_MS); /* the cancel goes unanswered: 5 s */
  vs_fake_drain(&f, 200);
  assert_true(f.cancels >= 1);
  expect_error("SIGTERM after acceptance, no word on the cancel", &r, "interrupted", 130);
  vs_fake_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_daemon),          cmocka_unit_test(test_usage),
      cmocka_unit_test(test_out_folder_missing), cmocka_unit_test(test_out_unwritable_at_the_end),
      cmocka_unit_test(test_timeout),            cmocka_unit_test(test_interrupt)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
