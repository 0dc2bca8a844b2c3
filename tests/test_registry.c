/*
 * Plugin registry: ABI refusal, hot reload with generations, clear load errors.
 * The test plugins come from tests/plugins/ (built into $VSPEC_BUILD/tests/plugins).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/host.h"
#include "core/params.h"
#include "core/registry.h"
#include "kernels/vs_kernels.h"

static vspec_host host;
static char built[1024]; /* where the test plugins were built */

typedef struct fixture {
  char dir[256];
  vs_registry *reg;
} fixture;

static void copy_file(const char *src, const char *dst) {
  FILE *in = fopen(src, "rb");
  assert_non_null(in);
  /* Write a new inode, as `make` would: rename over the old file. */
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp", dst);
  FILE *out = fopen(tmp, "wb");
  assert_non_null(out);
  char buf[8192];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) assert_int_equal(fwrite(buf, 1, n, out), n);
  fclose(in);
  assert_int_equal(fclose(out), 0);
  assert_int_equal(rename(tmp, dst), 0);
}

static void install(fixture *f, const char *built_name, const char *as) {
  char src[1200], dst[600];
  snprintf(src, sizeof src, "%s/%s", built, built_name);
  snprintf(dst, sizeof dst, "%s/%s", f->dir, as);
  copy_file(src, dst);
}

static void write_bytes(fixture *f, const char *as, const void *data, size_t n) {
  char dst[600];
  snprintf(dst, sizeof dst, "%s/%s", f->dir, as);
  FILE *out = fopen(dst, "wb");
  assert_non_null(out);
  assert_int_equal(fwrite(data, 1, n, out), n);
  fclose(out);
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/vspec-test-registry-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_registry_open(f->dir, &host, &f->reg, err, sizeof err), 0);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  vs_registry_close(f->reg);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
  assert_int_equal(system(cmd), 0);
  free(f);
  return 0;
}

/* Acceptance probability the rule of generation `p` gives (its build's TEST_VALUE / 10). */
static double rule_value(vs_plugin *p) {
  const vspec_accept_vtable *vt = vs_plugin_vtable(p);
  vspec_rule *r;
  char err[VSPEC_ERRLEN];
  assert_int_equal(vt->create(&host, NULL, &r, err, sizeof err), 0);
  vspec_accept_input in = {.struct_size = sizeof in};
  double v = vt->accept_prob(r, &in);
  vt->destroy(r);
  return v;
}

static void test_abi_major_refused(void **state) {
  fixture *f = *state;
  install(f, "testrule_abi2.so", "accept_testrule.so");
  vs_plugin *p = NULL;
  char err[VSPEC_ERRLEN] = "";
  int rc = vs_registry_acquire(f->reg, VSPEC_PLUGIN_ACCEPT, "testrule", &p, err, sizeof err);
  assert_int_equal(rc, VSPEC_EABI);
  assert_null(p);
  /* The message names both versions (the test plugin differs in the major only). */
  char plugin_abi[32], host_abi[32];
  snprintf(plugin_abi, sizeof plugin_abi, "ABI 2.%d", VSPEC_ABI_MINOR);
  snprintf(host_abi, sizeof host_abi, "ABI %d.%d", VSPEC_ABI_MAJOR, VSPEC_ABI_MINOR);
  assert_non_null(strstr(err, plugin_abi));
  assert_non_null(strstr(err, host_abi));
  assert_non_null(strstr(err, "accept_testrule.so"));
}

static void test_reload_keeps_old_generation_working(void **state) {
  fixture *f = *state;
  char err[VSPEC_ERRLEN];
  install(f, "testrule_v1.so", "accept_testrule.so");
  vs_plugin *old = NULL, *cur = NULL;
  assert_int_equal(vs_registry_acquire(f->reg, VSPEC_PLUGIN_ACCEPT, "testrule", &old, err,
                                       sizeof err), 0);
  assert_int_equal(vs_plugin_generation(old), 1);
  assert_float_equal(rule_value(old), 0.1, 1e-12);

  /* A running job keeps a rule made by generation 1 across the reload. */
  const vspec_accept_vtable *old_vt = vs_plugin_vtable(old);
  vspec_rule *live;
  assert_int_equal(old_vt->create(&host, NULL, &live, err, sizeof err), 0);

  install(f, "testrule_v2.so", "accept_testrule.so");
  assert_int_equal(vs_registry_reload(f->reg, VSPEC_PLUGIN_ACCEPT, "testrule", err, sizeof err), 0);
  assert_int_equal(vs_registry_acquire(f->reg, VSPEC_PLUGIN_ACCEPT, "testrule", &cur, err,
                                       sizeof err), 0);
  assert_int_equal(vs_plugin_generation(cur), 2);
  assert_float_equal(rule_value(cur), 0.2, 1e-12);

  /* Old code still runs, both for the live object and for new objects of generation 1. */
  vspec_accept_input in = {.struct_size = sizeof in};
  assert_float_equal(old_vt->accept_prob(live, &in), 0.1, 1e-12);
  assert_float_equal(rule_value(old), 0.1, 1e-12);

  vs_plugin_status st[4];
  assert_int_equal(vs_registry_list(f->reg, st, 4), 1);
  assert_int_equal(st[0].generation, 2);
  assert_int_equal(st[0].retired_alive, 1);
  assert_string_equal(st[0].version, "test-2");

  old_vt->destroy(live);
  vs_plugin_release(old); /* the last user of generation 1: it is closed now */
  assert_int_equal(vs_registry_list(f->reg, st, 4), 1);
  assert_int_equal(st[0].retired_alive, 0);
  assert_int_equal(st[0].users, 1);
  vs_plugin_release(cur);
}

static void test_failed_reload_keeps_current(void **state) {
  fixture *f = *state;
  char err[VSPEC_ERRLEN];
  install(f, "testrule_v1.so", "accept_testrule.so");
  vs_plugin *p;
  assert_int_equal(vs_registry_acquire(f->reg, VSPEC_PLUGIN_ACCEPT, "testrule", &p, err,
                                       sizeof err), 0);
  vs_plugin_release(p);
  write_bytes(f, "accept_testrule.so", "garbage", 7);
  assert_int_equal(vs_registry_reload(f->reg, VSPEC_PLUGIN_ACCEPT, "testrule", err, sizeof err),
                   VSPEC_EPLUGIN);
  assert_int_equal(vs_registry_acquire(f->reg, VSPEC_PLUGIN_ACCEPT, "testrule", &p, err,
                                       sizeof err), 0);
  assert_int_equal(vs_plugin_generation(p), 1);
  assert_float_equal(rule_value(p), 0.1, 1e-12);
  vs_plugin_release(p);
}

static void test_missing_file(void **state) {
  fixture *f = *state;
  vs_plugin *p = NULL;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_registry_acquire(f->reg, VSPEC_PLUGIN_ACCEPT, "nosuchrule", &p, err,
                                       sizeof err), VSPEC_ENOENT);
  assert_non_null(strstr(err, "nosuchrule"));
  assert_non_null(strstr(err, "accept_nosuchrule.so"));
}

static void test_missing_symbol(void **state) {
  fixture *f = *state;
  install(f, "nosym.so", "accept_nosym.so");
  vs_plugin *p = NULL;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_registry_acquire(f->reg, VSPEC_PLUGIN_ACCEPT, "nosym", &p, err, sizeof err),
                   VSPEC_EPLUGIN);
  assert_non_null(strstr(err, "vspec_plugin_entry"));
  assert_non_null(strstr(err, "accept_nosym.so"));
}

static void test_garbage_file(void **state) {
  fixture *f = *state;
  unsigned char junk[4096];
  unsigned s = 12345;
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)((s = s * 1103515245u + 12345u) >> 16);
  /* Starts like an ELF file, so dlopen has to look further before refusing it. */
  memcpy(junk, "\177ELF", 4);
  write_bytes(f, "accept_junk.so", junk, sizeof junk);
  vs_plugin *p = NULL;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_registry_acquire(f->reg, VSPEC_PLUGIN_ACCEPT, "junk", &p, err, sizeof err),
                   VSPEC_EPLUGIN);
  assert_non_null(strstr(err, "accept_junk.so"));
  assert_non_null(strstr(err, "not a loadable shared object"));
}

static void test_wrong_kind_refused(void **state) {
  fixture *f = *state;
  install(f, "testrule_v1.so", "backend_testrule.so");
  vs_plugin *p = NULL;
  char err[VSPEC_ERRLEN] = "";
  assert_int_equal(vs_registry_acquire(f->reg, VSPEC_PLUGIN_BACKEND, "testrule", &p, err,
                                       sizeof err), VSPEC_EABI);
  assert_non_null(strstr(err, "kind is 'accept', expected 'backend'"));
}

static void test_bad_names_refused(void **state) {
  fixture *f = *state;
  vs_plugin *p = NULL;
  char err[VSPEC_ERRLEN] = "";
  const char *bad[] = {"../evil", "a/b", "", "Upper", "x.so"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_equal(vs_registry_acquire(f->reg, VSPEC_PLUGIN_ACCEPT, bad[i], &p, err,
                                         sizeof err), VSPEC_EINVAL);
}

static void test_descriptor_checks(void **state) {
  (void)state;
  static const vspec_accept_vtable vt = {.struct_size = sizeof vt};
  vspec_plugin_desc d = {VSPEC_PLUGIN_HEAD(VSPEC_PLUGIN_ACCEPT, "x", "1", 0), .vtable = &vt};
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_plugin_check_desc(&d, "f.so", VSPEC_PLUGIN_ACCEPT, "x", err, sizeof err), 0);
  vspec_plugin_desc newer = d;
  newer.abi_minor = VSPEC_ABI_MINOR + 1;
  assert_int_equal(vs_plugin_check_desc(&newer, "f.so", 0, NULL, err, sizeof err), VSPEC_EABI);
  assert_non_null(strstr(err, "minor"));
  vspec_plugin_desc small = d;
  small.struct_size = 8;
  assert_int_equal(vs_plugin_check_desc(&small, "f.so", 0, NULL, err, sizeof err), VSPEC_EABI);
  static const uint32_t tiny_vtable = 4;
  vspec_plugin_desc tiny = d;
  tiny.vtable = &tiny_vtable;
  assert_int_equal(vs_plugin_check_desc(&tiny, "f.so", 0, NULL, err, sizeof err), VSPEC_EABI);
  assert_non_null(strstr(err, "vtable"));
  vspec_plugin_desc unnamed = d;
  unnamed.name = "Bad Name";
  assert_int_equal(vs_plugin_check_desc(&unnamed, "f.so", 0, NULL, err, sizeof err), VSPEC_EABI);
}

static void test_plugin_params_errors(void **state) {
  fixture *f = *state;
  char err[VSPEC_ERRLEN];
  install(f, "testrule_v1.so", "accept_testrule.so");
  vs_plugin *p;
  assert_int_equal(vs_registry_acquire(f->reg, VSPEC_PLUGIN_ACCEPT, "testrule", &p, err,
                                       sizeof err), 0);
  const vspec_accept_vtable *vt = vs_plugin_vtable(p);
  vspec_params *params;
  vspec_rule *r;
  assert_int_equal(vs_params_parse("scale=42", &params, err, sizeof err), 0);
  assert_int_equal(vt->create(&host, params, &r, err, sizeof err), VSPEC_ERANGE);
  assert_non_null(strstr(err, "'scale'"));
  assert_non_null(strstr(err, "[0, 10]"));
  vs_params_free(params);
  assert_int_equal(vs_params_parse("sclae=1", &params, err, sizeof err), 0);
  assert_int_equal(vt->create(&host, params, &r, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "unknown parameter 'sclae'"));
  vs_params_free(params);
  vs_plugin_release(p);
}

int main(void) {
  const char *b = getenv("VSPEC_BUILD");
  snprintf(built, sizeof built, "%s/tests/plugins", b ? b : "build");
  vs_host_init(&host, vs_cpu_ops());
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_abi_major_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reload_keeps_old_generation_working, setup, teardown),
      cmocka_unit_test_setup_teardown(test_failed_reload_keeps_current, setup, teardown),
      cmocka_unit_test_setup_teardown(test_missing_file, setup, teardown),
      cmocka_unit_test_setup_teardown(test_missing_symbol, setup, teardown),
      cmocka_unit_test_setup_teardown(test_garbage_file, setup, teardown),
      cmocka_unit_test_setup_teardown(test_wrong_kind_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bad_names_refused, setup, teardown),
      cmocka_unit_test(test_descriptor_checks),
      cmocka_unit_test_setup_teardown(test_plugin_params_errors, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
