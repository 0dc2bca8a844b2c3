/*
 * A rule, scheduler or backend name that matches no plugin is answered with the names there
 * are and, when one is close, "did you mean ...?" (core/suggest.h): by vspecd (the loaded
 * plugins; `--method sd:lantrn` used to get only "accept plugin 'lantrn' is not loaded ...
 * (vspec plugins reload accept/lantrn)", a reload that cannot help) and by vspec-bench (the
 * plugin directory's). The reload hint stays where a reload helps: a plugin file that is in
 * the directory but not loaded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/host.h"
#include "core/registry.h"
#include "core/suggest.h"
#include "kernels/vs_kernels.h"
#include "tests/support/daemon_harness.h"
#include "tests/support/cli_run.h"
#include "vspec/types.h"

static void test_edit_distance(void **state) {
  (void)state;
  assert_int_equal(vs_edit_distance("lantrn", "lantern"), 1);
  assert_int_equal(vs_edit_distance("lnatern", "lantern"), 1); /* a swap counts once */
  assert_int_equal(vs_edit_distance("Lantern", "lantern"), 0);
  assert_int_equal(vs_edit_distance("", "vvs"), 3);
  assert_int_equal(vs_edit_distance("exact", "coolsd"), 6);
  const char *rules[] = {"continuous", "coolsd", "exact", "lantern", "lanternpp", "uniform_rsd"};
  assert_int_equal(vs_suggest_nearest("lantrn", rules, 6), 3);
  assert_int_equal(vs_suggest_nearest("lanternp", rules, 6), 3); /* first of equals */
  assert_int_equal(vs_suggest_nearest("exat", rules, 6), 2);
  assert_int_equal(vs_suggest_nearest("cool_sd", rules, 6), 1);
  assert_int_equal(vs_suggest_nearest("xyz", rules, 6), -1);      /* nothing close */
  assert_int_equal(vs_suggest_nearest("exxxt", rules, 6), 2);     /* 2 of 5 is close */
  assert_int_equal(vs_suggest_nearest("qqqct", rules, 6), -1);    /* 3 of 5 is not */
  assert_int_equal(vs_suggest_nearest("x", rules, 6), -1);
  const char *scheds[] = {"standard", "vvs"};
  assert_int_equal(vs_suggest_nearest("standrd", scheds, 2), 0);
  assert_int_equal(vs_suggest_nearest("vs", scheds, 2), 1);
  assert_int_equal(vs_suggest_nearest("ab", scheds, 2), -1);
  char msg[200] = "no rule 'q'";
  vs_suggest_append(msg, sizeof msg, "loaded", "q", rules, 0);
  assert_string_equal(msg, "no rule 'q' (loaded: none)");
  /* cut to fit, never past the buffer */
  char small[24] = "no rule 'lantrn'";
  vs_suggest_append(small, sizeof small, "loaded", "lantrn", rules, 6);
  assert_int_equal(strlen(small), sizeof small - 1);
}

/* The registry's own messages: loaded names for job clients (no reload hint for a name with
 * no file), the directory's for in-process callers, the hint for a file not loaded. */
static void test_registry_messages(void **state) {
  (void)state;
  vs_fixture fx;
  vs_fixture_make(&fx);
  static vspec_host host;
  vs_host_init(&host, vs_cpu_ops());
  vs_registry *reg = NULL;
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_registry_open(fx.plugins, &host, &reg, err, sizeof err), 0);
  vs_plugin *p = NULL;
  const char *loaded[] = {"exact", "lantern"};
  for (int i = 0; i < 2; i++) {
    assert_int_equal(
        vs_registry_acquire(reg, VSPEC_PLUGIN_ACCEPT, loaded[i], &p, err, sizeof err), 0);
    vs_plugin_release(p);
  }
  assert_int_equal(vs_registry_acquire_loaded(reg, VSPEC_PLUGIN_ACCEPT, "lantrn", &p, err,
                                              sizeof err), VSPEC_ENOENT);
  printf("  job, typo: %s\n", err);
  assert_string_equal(err, "there is no accept plugin 'lantrn' (loaded: exact, lantern); did "
                           "you mean 'lantern'?");
  /* in the directory, not loaded: a reload would help, so it is what the message says */
  assert_int_equal(vs_registry_acquire_loaded(reg, VSPEC_PLUGIN_ACCEPT, "coolsd", &p, err,
                                              sizeof err), VSPEC_ENOENT);
  printf("  job, not loaded: %s\n", err);
  assert_non_null(strstr(err, "accept plugin 'coolsd' is not loaded"));
  assert_non_null(strstr(err, "vspec plugins reload accept/coolsd"));
  assert_int_equal(vs_registry_acquire_loaded(reg, VSPEC_PLUGIN_SCHED, "zzz", &p, err,
                                              sizeof err), VSPEC_ENOENT);
  assert_string_equal(err, "there is no sched plugin 'zzz' (loaded: none)");
  /* in-process callers load on first use: the directory's names */
  assert_int_equal(vs_registry_acquire(reg, VSPEC_PLUGIN_SCHED, "standrd", &p, err, sizeof err),
                   VSPEC_ENOENT);
  printf("  bench: %s\n", err);
  char want[600];
  snprintf(want, sizeof want, "there is no sched plugin 'standrd': no file %s/sched_standrd.so "
           "(the directory has: slow, standard, vvs); did you mean 'standard'?", fx.plugins);
  assert_string_equal(err, want);
  assert_int_equal(vs_registry_acquire(reg, VSPEC_PLUGIN_BACKEND, "llamgen", &p, err, sizeof err),
                   VSPEC_ENOENT);
  assert_non_null(strstr(err, "eagle, llamagen, mar); did you mean 'llamagen'?"));
  assert_null(strstr(err, "reload"));
  vs_registry_close(reg);
  vs_fixture_remove(&fx);
}

/* End to end: vspec against vspecd, and vspec-bench, on the fixture's speculative model. */
static void test_daemon_and_bench(void **state) {
  (void)state;
  vs_fixture fx;
  vs_fixture_make(&fx);
  vs_daemon d;
  vs_daemon_start(&d, &fx, "names", NULL);
  char img[300], out[4096];
  snprintf(img, sizeof img, "%s/x.png", fx.dir);
  const char *rule[] = {"generate", "--server", d.job_ep, "--model", "self", "--method",
                        "sd:lantrn", "--out", img, "--timeout", "30", NULL};
  int rc = vs_run_tool_all("vspec", rule, 60, out, sizeof out);
  printf("  vspec: exit %d: %s", rc, out);
  assert_int_equal(rc, 4);
  assert_non_null(strstr(out, "there is no accept plugin 'lantrn' (loaded: continuous, coolsd, "
                              "exact, gsd, lantern, lanternpp, testrule, uniform_rsd); did you mean "
                              "'lantern'?"));
  assert_null(strstr(out, "reload"));
  const char *sched[] = {"generate", "--server", d.job_ep, "--model", "self", "--method",
                         "sd:exact@vss", "--out", img, "--timeout", "30", NULL};
  rc = vs_run_tool_all("vspec", sched, 60, out, sizeof out);
  printf("  vspec: exit %d: %s", rc, out);
  assert_int_equal(rc, 4);
  assert_non_null(strstr(out, "(loaded: slow, standard, vvs); did you mean 'vvs'?"));
  assert_int_equal(vs_daemon_stop(&d, SIGTERM, 30000), 0);

  const char *bench[] = {"generate", "--model", fx.self_model, "--plugins", fx.plugins,
                         "--method", "sd:lantrn", "--out", img, NULL};
  rc = vs_run_tool_all("vspec-bench", bench, 120, out, sizeof out);
  printf("  vspec-bench: exit %d: %s", rc, out);
  assert_int_not_equal(rc, 0);
  assert_non_null(strstr(out, "there is no accept plugin 'lantrn': no file "));
  assert_non_null(strstr(out, "lantern, lanternpp, testrule, uniform_rsd); did you mean "
                              "'lantern'?"));
  vs_fixture_remove(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_edit_distance),
                                     cmocka_unit_test(test_registry_messages),
                                     cmocka_unit_test(test_daemon_and_bench)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
