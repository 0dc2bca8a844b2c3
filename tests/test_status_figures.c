/*
 * `vspec status` says what its figures count. A backend plugin's reference count is the
 * loaded model roles that use it (a target and a draft are two), not jobs: an idle daemon
 * serving etc/vspecd.conf's models showed `backend mar ... 4 job(s)`. Status now names the
 * models that hold each backend and the jobs on those models; `vspec plugins` calls the
 * count model roles; rules and schedulers, which jobs hold, keep their job count.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/daemon_harness.h"
#include "tests/support/cli_run.h"

/* The line of `out` that contains `key`, into line. */
static void line_of(const char *out, const char *key, char *line, size_t cap) {
  const char *p = strstr(out, key);
  if (!p) fail_msg("no line with '%s' in:\n%s", key, out);
  while (p > out && p[-1] != '\n') p--;
  size_t n = strcspn(p, "\n");
  snprintf(line, cap, "%.*s", (int)(n < cap - 1 ? n : cap - 1), p);
}

static void expect_line(const char *out, const char *key, const char *want) {
  char line[512];
  line_of(out, key, line, sizeof line);
  printf("  %s\n", line);
  if (!strstr(line, want)) fail_msg("'%s' lacks '%s'", line, want);
}

static void status(const vs_daemon *d, const char *cmd, char *out, size_t cap) {
  const char *args[] = {cmd, "--admin", d->admin_ep, NULL, NULL};
  if (!strcmp(cmd, "plugins")) {
    args[1] = "list";
    args[2] = "--admin";
    args[3] = d->admin_ep;
  }
  assert_int_equal(vs_run_tool_all("vspec", args, 30, out, cap), 0);
}

static void test_backend_figures(void **state) {
  (void)state;
  vs_fixture fx;
  vs_fixture_make(&fx);
  char mar[PATH_MAX], mar_arg[PATH_MAX + 16];
  assert_non_null(realpath("tests/golden/micro_mar", mar));
  snprintf(mar_arg, sizeof mar_arg, "micro_mar=%s", mar);
  const char *extra[] = {"--model", mar_arg, NULL};
  vs_daemon d;
  vs_daemon_start(&d, &fx, "figures", extra);
  static char out[16384];
  status(&d, "status", out, sizeof out);
  /* idle: micro's target and self's target and draft are llamagen, micro_mar's two mar */
  expect_line(out, "backend  llamagen", "held by 2 model(s) (");
  expect_line(out, "backend  llamagen", "micro");
  expect_line(out, "backend  llamagen", "self"); /* in the table's order */
  expect_line(out, "backend  llamagen", "), 0 job(s) on them");
  expect_line(out, "backend  mar", "held by 1 model(s) (micro_mar), 0 job(s) on them");
  expect_line(out, "backend  eagle", "held by no model");
  expect_line(out, "accept   exact", "0 job(s)");
  status(&d, "plugins", out, sizeof out);
  expect_line(out, "backend  llamagen", "held by 3 model role(s)");
  expect_line(out, "backend  mar", "held by 2 model role(s)");
  expect_line(out, "accept   exact", "0 job(s)");
  const char *json[] = {"status", "--json", "--admin", d.admin_ep, NULL};
  assert_int_equal(vs_run_tool_all("vspec", json, 30, out, sizeof out), 0);
  assert_non_null(strstr(out, "\"name\": \"micro_mar\""));
  assert_non_null(strstr(out, "\"backends\": [\"mar\"]"));

  /* a running job: one job on the llamagen models, one holding the rule */
  vs_conn c;
  vs_client_open(&c, d.job_ep);
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = "self";
  s.accept = "exact";
  s.sched = "slow";
  s.sched_params = "ms=400,depth=1";
  s.has_credit = 1;
  s.credit = 64;
  uint64_t rid = vs_client_submit(&c, &s), job = 0;
  for (int i = 0; i < 50; i++) { /* Accepted, then the first progress: it runs */
    vs_conn_event e;
    vs_client_next(&c, 20000, &e);
    int body = e.ev->body_case;
    if (e.ev->has_request_id && e.ev->request_id == rid) job = e.ev->job_id;
    vs_conn_event_free(&e);
    if (body == VSPEC__EVENT__BODY_ERROR || body == VSPEC__EVENT__BODY_RESULT)
      fail_msg("the job ended before it could be seen running");
    if (body == VSPEC__EVENT__BODY_PROGRESS) break;
  }
  assert_true(job != 0);
  status(&d, "status", out, sizeof out);
  expect_line(out, "backend  llamagen", "), 1 job(s) on them");
  expect_line(out, "backend  mar", "0 job(s) on them");
  expect_line(out, "accept   exact", "1 job(s)");
  vs_client_cancel(&c, job);
  vs_conn_event e;
  vs_client_until_end(&c, 0, &job, 30000, &e);
  vs_conn_event_free(&e);
  vs_conn_close(&c);
  assert_int_equal(vs_daemon_stop(&d, SIGTERM, 30000), 0);
  vs_fixture_remove(&fx);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_backend_figures)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
