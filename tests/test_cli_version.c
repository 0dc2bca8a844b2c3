/*
 * `vspec --version` and `vspec version` print the version the build knows (core/version.h)
 * and the plugin ABI, for bug reports: "vspec (vspec) X.Y.Z, plugin ABI M.N".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "core/version.h"
#include "tests/support/cli_run.h"

static void test_version(void **state) {
  (void)state;
  static vs_cli_result r;
  char want[100];
  snprintf(want, sizeof want, "vspec (vspec) %s, plugin ABI %d.%d\n", VSPEC_VERSION,
           VSPEC_ABI_MAJOR, VSPEC_ABI_MINOR);
  const char *const forms[][2] = {{"--version", NULL}, {"version", NULL}};
  for (size_t i = 0; i < 2; i++) {
    vs_cli_run(&r, forms[i], "/nonexistent-state", NULL, 10000);
    printf("  vspec %s: exit %d: %s", forms[i][0], r.status, r.out);
    assert_int_equal(r.status, 0);
    assert_string_equal(r.out, want);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_version)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
