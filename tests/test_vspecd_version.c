/*
 * `vspecd --version` prints the build's release and the plugin ABI it hosts
 * (core/version.h) and exits 0 at once: before the configuration is read (a bug report can
 * name the build even when the config is what is broken) and without starting a daemon.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "core/version.h"
#include "tests/support/daemon_harness.h"
#include "tests/support/cli_run.h"

static void test_version(void **state) {
  (void)state;
  char want[128], out[1024];
  snprintf(want, sizeof want, "vspecd (vspec) %s, plugin ABI %d.%d\n", VSPEC_VERSION,
           VSPEC_ABI_MAJOR, VSPEC_ABI_MINOR);
  const char *args[] = {"--version", NULL};
  double t0 = vs_harness_now();
  assert_int_equal(vs_run_tool_all("vspecd", args, 10, out, sizeof out), 0);
  assert_string_equal(out, want);
  /* a config that is not there, and an endpoint nobody could bind, change nothing */
  const char *broken[] = {"-c", "/nonexistent/vspecd.conf", "--endpoint", "bogus",
                          "--version", NULL};
  assert_int_equal(vs_run_tool_all("vspecd", broken, 10, out, sizeof out), 0);
  assert_string_equal(out, want);
  assert_true(vs_harness_now() - t0 < 5.0); /* no models were loaded */
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_version)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
