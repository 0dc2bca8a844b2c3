/*
 * tests/test_status.c - vspec_strerror and vs_fail (core/status.h).
 *
 * Every status code of include/vspec/types.h has a message of its own, so a log line that
 * names it tells the codes apart; a code outside the enum still reads as what it is.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/status.h"

/* Every vspec_status; a code added to the enum and to core/status.c belongs here too. */
static const int codes[] = {VSPEC_OK,        VSPEC_ENOENT,    VSPEC_EIO,     VSPEC_ENOMEM,
                            VSPEC_EBUSY,     VSPEC_EINVAL,    VSPEC_ERANGE,  VSPEC_ENOTSUP,
                            VSPEC_ECANCELED, VSPEC_EABI,      VSPEC_EFORMAT, VSPEC_ESHAPE,
                            VSPEC_EPLUGIN,   VSPEC_EDEVICE};
enum { N_CODES = sizeof codes / sizeof *codes };

static void test_every_code_has_its_own_message(void **state) {
  (void)state;
  for (int i = 0; i < N_CODES; i++) {
    const char *m = vspec_strerror(codes[i]);
    assert_non_null(m);
    assert_true(m[0] != '\0');
    assert_null(strstr(m, "unknown"));
    for (int k = 0; k < i; k++) assert_string_not_equal(m, vspec_strerror(codes[k]));
  }
  assert_string_equal(vspec_strerror(VSPEC_OK), "success");
  assert_string_equal(vspec_strerror(VSPEC_ENOENT), "not found");
}

static void test_unknown_code_named(void **state) {
  (void)state;
  assert_string_equal(vspec_strerror(-7), "unknown status -7");
  assert_string_equal(vspec_strerror(1), "unknown status 1");
  assert_string_equal(vspec_strerror(INT32_MIN), "unknown status -2147483648");
}

static void test_fail_fills_and_returns(void **state) {
  (void)state;
  char err[16];
  assert_int_equal(vs_fail(err, sizeof err, VSPEC_EFORMAT, "%s: %d", "bad", 42), VSPEC_EFORMAT);
  assert_string_equal(err, "bad: 42");
  /* truncated as snprintf truncates, always terminated */
  assert_int_equal(vs_fail(err, sizeof err, VSPEC_EIO, "%s", "0123456789abcdefghij"), VSPEC_EIO);
  assert_string_equal(err, "0123456789abcde");
  /* no buffer: the status alone */
  assert_int_equal(vs_fail(NULL, 0, VSPEC_ENOMEM, "x"), VSPEC_ENOMEM);
  err[0] = 'z';
  assert_int_equal(vs_fail(err, 0, VSPEC_EINVAL, "y"), VSPEC_EINVAL);
  assert_int_equal(err[0], 'z');
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_code_has_its_own_message),
      cmocka_unit_test(test_unknown_code_named),
      cmocka_unit_test(test_fail_fills_and_returns),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
