/* Parameter sets: parsing, typed getters and the messages users see. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "core/params.h"

static void test_parse_and_get(void **state) {
  (void)state;
  vspec_params *p;
  char err[256];
  assert_int_equal(vs_params_parse(" k = 100 , delta=0.2,schedule=exp", &p, err, sizeof err), 0);
  assert_int_equal(vs_params_count(p), 3);
  long k;
  double d;
  int choice;
  assert_int_equal(vs_param_int(p, "k", 5, 1, 1000, &k, err, sizeof err), 0);
  assert_int_equal(k, 100);
  assert_int_equal(vs_param_double(p, "delta", 0.1, 0, 1, &d, err, sizeof err), 0);
  assert_float_equal(d, 0.2, 1e-12);
  assert_int_equal(vs_param_double(p, "absent", 0.7, 0, 1, &d, err, sizeof err), 0);
  assert_float_equal(d, 0.7, 1e-12);
  const char *const sched[] = {"exp", "linear", NULL};
  assert_int_equal(vs_param_choice(p, "schedule", sched, 1, &choice, err, sizeof err), 0);
  assert_int_equal(choice, 0);
  char buf[64];
  vs_params_format(p, buf, sizeof buf);
  assert_string_equal(buf, "k=100,delta=0.2,schedule=exp");
  vs_params_free(p);
}

static void test_errors_name_the_parameter(void **state) {
  (void)state;
  vspec_params *p;
  char err[256];
  assert_int_equal(vs_params_parse("delta=1.5,k=x,schedule=cubic,d=nan", &p, err, sizeof err), 0);
  double d;
  long k;
  int c;
  assert_int_equal(vs_param_double(p, "delta", 0.1, 0, 1, &d, err, sizeof err), VSPEC_ERANGE);
  assert_non_null(strstr(err, "'delta'"));
  assert_non_null(strstr(err, "[0, 1]"));
  assert_int_equal(vs_param_int(p, "k", 1, 1, 10, &k, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "'k'"));
  const char *const sched[] = {"exp", "linear", NULL};
  assert_int_equal(vs_param_choice(p, "schedule", sched, 0, &c, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "exp|linear"));
  assert_int_equal(vs_param_double(p, "d", 0, 0, 1, &d, err, sizeof err), VSPEC_EINVAL);
  const char *const known[] = {"delta", "k", NULL};
  assert_int_equal(vs_param_check_known(p, known, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "'schedule'"));
  vs_params_free(p);
}

static void test_malformed_text(void **state) {
  (void)state;
  vspec_params *p;
  char err[256];
  assert_int_equal(vs_params_parse("k", &p, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "'k'"));
  assert_int_equal(vs_params_parse("k=1,k=2", &p, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "twice"));
  assert_int_equal(vs_params_parse("a b=1", &p, err, sizeof err), VSPEC_EINVAL);
  assert_int_equal(vs_params_parse("a=1=2", &p, err, sizeof err), VSPEC_EINVAL);
  assert_int_equal(vs_params_parse("", &p, err, sizeof err), 0);
  assert_int_equal(vs_params_count(p), 0);
  vs_params_free(p);
  assert_int_equal(vs_params_parse(NULL, &p, err, sizeof err), 0);
  vs_params_free(p);
}

/* A set the caller holds: read in place, copied by assigning it, bounded in bytes. */
static void test_held_set(void **state) {
  (void)state;
  vspec_params a, b;
  char err[256], buf[64];
  assert_int_equal(vs_params_read("x=1, y = two", &a, err, sizeof err), 0);
  b = a;
  assert_int_equal(vs_params_read("z=3", &a, err, sizeof err), 0); /* emptied first */
  vs_params_format(&a, buf, sizeof buf);
  assert_string_equal(buf, "z=3");
  vs_params_format(&b, buf, sizeof buf);
  assert_string_equal(buf, "x=1,y=two");
  assert_string_equal(vs_params_key(&b, 1), "y");
  assert_string_equal(vs_params_value(&b, 1), "two");
  assert_null(vs_params_key(&b, 2));
  vspec_params z = {0};
  assert_int_equal(vs_params_count(&z), 0);
  assert_null(vs_param_string(&z, "x"));
  char value[200], key[16];
  memset(value, 'v', sizeof value - 1);
  value[sizeof value - 1] = 0;
  int rc = 0, n = 0;
  while (!rc) {
    snprintf(key, sizeof key, "k%d", n++);
    rc = vs_params_set(&z, key, value, err, sizeof err);
  }
  assert_int_equal(rc, VSPEC_ERANGE);
  assert_non_null(strstr(err, "too long"));
  assert_true(vs_params_count(&z) * (sizeof value + 4) <= VS_PARAMS_BYTES);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_and_get),
      cmocka_unit_test(test_errors_name_the_parameter),
      cmocka_unit_test(test_malformed_text),
      cmocka_unit_test(test_held_set),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
