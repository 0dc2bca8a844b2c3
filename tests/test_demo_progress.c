/*
 * `vspec-bench demo` says on stderr what it is doing, for every model: the load, then one
 * line per image with its class, its time, the time elapsed and an estimate of what is
 * left; `vspec-bench demo --model models/fmnist-mar --per-class 4` used to run 4 minutes
 * without a word. stdout keeps only the summary; --quiet drops the progress.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/daemon_harness.h"
#include "tests/support/cli_run.h"

static void expect_progress(const char *model, const char *per_class) {
  char png[64] = "/tmp/vspec-demo-progress-XXXXXX";
  int fd = mkstemp(png);
  assert_true(fd >= 0);
  close(fd);
  const char *args[] = {"demo", "--model", model, "--upscale", "1", "--per-class", per_class,
                        "--out", png, NULL};
  static char out[65536], both[65536];
  assert_int_equal(vs_run_tool("vspec-bench", args, out, sizeof out), 0);
  assert_int_equal(vs_run_tool_all("vspec-bench", args, 120, both, sizeof both), 0);
  printf("%s", both);
  int n = 10 * atoi(per_class);
  char line[96];
  assert_non_null(strstr(both, "vspec-bench demo: loading "));
  for (int k = 1; k <= n; k++) {
    snprintf(line, sizeof line, "vspec-bench demo: image %d/%d (class %d) in ", k, n,
             (k - 1) % 10);
    const char *p = strstr(both, line);
    if (!p) fail_msg("no progress line for image %d of %s", k, model);
    const char *end = strchr(p, '\n');
    assert_non_null(end);
    const char *tail = k < n ? " left\n" : " elapsed, done\n";
    assert_true(strstr(p, " elapsed, ") < end);
    assert_memory_equal(end + 1 - strlen(tail), tail, strlen(tail));
    if (k < n) assert_true(strstr(p, "elapsed, about ") < end);
  }
  assert_null(strstr(out, "vspec-bench demo: image")); /* on stderr, not stdout */
  assert_non_null(strstr(out, "vspec demo: "));
  const char *quiet[] = {"demo", "--model", model, "--upscale", "1", "--quiet", "--out", png,
                         NULL};
  assert_int_equal(vs_run_tool_all("vspec-bench", quiet, 120, both, sizeof both), 0);
  assert_null(strstr(both, "vspec-bench demo: image"));
  unlink(png);
}

static void test_discrete_model(void **state) {
  (void)state;
  expect_progress("tests/golden/micro_c2i", "1");
}

static void test_continuous_model(void **state) {
  (void)state;
  expect_progress("tests/golden/micro_mar", "2");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_discrete_model),
                                     cmocka_unit_test(test_continuous_model)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
