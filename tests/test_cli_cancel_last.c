/*
 * `vspec cancel --last` (clients/last_job.c, clients/cmd_jobs.c): job ids such as
 * 8808317955088799277 are not for typing, so the CLI remembers the last job submitted to each
 * job endpoint in $XDG_STATE_HOME/vspec/last-jobs. The state file keeps one line per endpoint
 * (the newest first, bounded) and is replaced atomically; `cancel --last` cancels the job
 * recorded for --server and says which (`vspec generate` records each job the daemon
 * accepts); with nothing recorded it is a usage error naming the file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clients/last_job.h"
#include "tests/support/cli_run.h"
#include "tests/support/daemon_harness.h"

#define WAIT_MS 30000

typedef struct fixture {
  vs_fixture fx;
  vs_daemon d;
  char state[300];
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  *state = f;
  vs_fixture_make(&f->fx);
  snprintf(f->state, sizeof f->state, "%s/state", f->fx.dir);
  setenv("XDG_STATE_HOME", f->state, 1); /* for the unit tests in this process */
  vs_daemon_start(&f->d, &f->fx, "cancellast", NULL);
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  vs_daemon_finish(&f->d, &f->fx);
  free(f);
  return 0;
}

static int count_files(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* One line per endpoint, the newest first, at most VS_LAST_JOB_MAX; no temporary file left. */
static void test_state_file(void **state) {
  fixture *f = *state;
  unsigned long long id = 0;
  char err[600], ep[64], dir[400];
  assert_int_equal(vs_last_job_load("tcp://a:1", &id, err, sizeof err), 0);
  assert_int_equal(vs_last_job_save("tcp://a:1", 11, err, sizeof err), 0);
  assert_int_equal(vs_last_job_save("tcp://b:2", 22, err, sizeof err), 0);
  assert_int_equal(vs_last_job_save("tcp://a:1", 33, err, sizeof err), 0);
  assert_int_equal(vs_last_job_load("tcp://a:1", &id, err, sizeof err), 1);
  assert_int_equal(id, 33);
  assert_int_equal(vs_last_job_load("tcp://b:2", &id, err, sizeof err), 1);
  assert_int_equal(id, 22);
  assert_int_equal(vs_last_job_load("tcp://c:3", &id, err, sizeof err), 0);
  for (int i = 0; i < 2 * VS_LAST_JOB_MAX; i++) {
    snprintf(ep, sizeof ep, "ipc:///tmp/many-%d.sock", i);
    assert_int_equal(vs_last_job_save(ep, 1000 + (unsigned)i, err, sizeof err), 0);
  }
  assert_int_equal(vs_last_job_load(ep, &id, err, sizeof err), 1);
  assert_int_equal(id, 999 + 2 * VS_LAST_JOB_MAX);
  assert_int_equal(vs_last_job_load("tcp://a:1", &id, err, sizeof err), 0); /* pushed out */
  char path[400], line[600];
  assert_int_equal(vs_last_job_path(path, sizeof path, err, sizeof err), 0);
  FILE *fp = fopen(path, "r");
  assert_non_null(fp);
  int lines = 0;
  while (fgets(line, sizeof line, fp)) lines++;
  fclose(fp);
  assert_int_equal(lines, VS_LAST_JOB_MAX);
  snprintf(dir, sizeof dir, "%s/vspec", f->state);
  assert_int_equal(count_files(dir), 1); /* last-jobs alone: no .tmp left behind */
  assert_int_equal(unlink(path), 0);
}

/* --last against the daemon, with a recorded id the daemon does not have: its not-found
 * answer names that id, so the id went from the file to the request. */
static void test_cancel_last_recorded(void **state) {
  fixture *f = *state;
  static vs_cli_result r;
  char err[600];
  assert_int_equal(vs_last_job_save(f->d.job_ep, 4242424242ull, err, sizeof err), 0);
  const char *args[] = {"cancel", "--last", "--server", f->d.job_ep, "--admin", f->d.admin_ep,
                        NULL};
  vs_cli_run(&r, args, f->state, NULL, WAIT_MS);
  printf("  cancel --last: exit %d: %s", r.status, r.err);
  assert_int_equal(r.status, 4);
  assert_non_null(strstr(r.err, "job 4242424242, the last one submitted to"));
  assert_non_null(strstr(r.err, "not-found"));
  assert_non_null(strstr(r.err, "4242424242"));
}

static void test_cancel_last_usage(void **state) {
  fixture *f = *state;
  static vs_cli_result r;
  char other[400];
  snprintf(other, sizeof other, "ipc://%s/other.sock", f->fx.dir);
  const char *none[] = {"cancel", "--last", "--server", other, "--admin", f->d.admin_ep, NULL};
  vs_cli_run(&r, none, f->state, NULL, WAIT_MS);
  printf("  nothing recorded: exit %d: %s", r.status, r.err);
  assert_int_equal(r.status, 2);
  assert_non_null(strstr(r.err, "no job submitted to"));
  assert_non_null(strstr(r.err, "last-jobs"));
  const char *both[] = {"cancel", "--last", "12", NULL};
  vs_cli_run(&r, both, f->state, NULL, WAIT_MS);
  assert_int_equal(r.status, 2);
  assert_non_null(strstr(r.err, "not both"));
  const char *neither[] = {"cancel", NULL};
  vs_cli_run(&r, neither, f->state, NULL, WAIT_MS);
  assert_int_equal(r.status, 2);
}

/* The whole way: `vspec generate` records the job it submitted, `vspec cancel --last` cancels
 * it while it runs, and the generating client ends with "cancelled" (exit 6). */
static void test_generate_then_cancel_last(void **state) {
  fixture *f = *state;
  char out[300], err[600];
  snprintf(out, sizeof out, "%s/slow.png", f->fx.dir);
  /* the test scheduler sleeps 300 ms per round: seconds for the whole image */
  const char *gen[] = {"generate", "--server", f->d.job_ep, "--model", "self", "--accept",
                       "exact", "--sched", "slow", "--sched-param", "ms=300,depth=1", "--out",
                       out, NULL};
  char path[400];
  assert_int_equal(vs_last_job_path(path, sizeof path, err, sizeof err), 0);
  unlink(path); /* what the other tests recorded */
  vs_cli_proc p;
  vs_cli_start(&p, gen, f->state, NULL);
  unsigned long long id = 0;
  for (int i = 0; i < 200 && vs_last_job_load(f->d.job_ep, &id, err, sizeof err) != 1; i++)
    vs_harness_sleep_ms(50);
  assert_true(id > 0);
  static vs_cli_result c, g;
  const char *cancel[] = {"cancel", "--last", "--server", f->d.job_ep, "--admin",
                          f->d.admin_ep, NULL};
  vs_cli_run(&c, cancel, f->state, NULL, WAIT_MS);
  printf("  cancel --last: exit %d: %s%s", c.status, c.err, c.out);
  assert_int_equal(c.status, 0);
  vs_cli_finish(&p, &g, WAIT_MS);
  printf("  generate: exit %d: %s", g.status, g.err);
  assert_int_equal(g.status, 6);
  assert_non_null(strstr(g.err, "cancelled"));
  char want[64];
  snprintf(want, sizeof want, "job %llu", id);
  assert_non_null(strstr(g.err, want));
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_state_file),
                                     cmocka_unit_test(test_cancel_last_recorded),
                                     cmocka_unit_test(test_cancel_last_usage),
                                     cmocka_unit_test(test_generate_then_cancel_last)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
