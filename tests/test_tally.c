/*
 * tests/test_tally.c - make test's closing line, "N passed, N failed, N skipped".
 *
 * tests/tally.sh counts the test cases of each program the check rule runs (cmocka's lines,
 * Python unittest's, the fuzz pass's, else the exit status) and make test sums them over the
 * plain run, the ASan run and the fuzz pass. Here: the counting on outputs of each kind, and
 * the Makefile's test rule itself, run with a stand-in for the recursive make.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

typedef struct {
  char dir[64];
} tmp_dir;

static int setup(void **state) {
  tmp_dir *t = calloc(1, sizeof *t);
  snprintf(t->dir, sizeof t->dir, "/tmp/vspec-tally.XXXXXX");
  if (!t || !mkdtemp(t->dir)) return -1;
  *state = t;
  return 0;
}

static int teardown(void **state) {
  tmp_dir *t = *state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->dir);
  int rc = system(cmd);
  free(t);
  return rc == 0 ? 0 : -1;
}

/* Runs `cmd` with sh; its output's last line (without the newline) into last, its exit
 * status returned (-1 when it did not exit). */
static int run_last_line(const char *cmd, char *last, size_t cap) {
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char line[512];
  last[0] = '\0';
  while (fgets(line, sizeof line, p)) {
    line[strcspn(line, "\n")] = '\0';
    snprintf(last, cap, "%s", line);
  }
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
}

/* `tally.sh run` on a program that prints `out` and exits `status`: exit status kept, the
 * line it appends to RESULTS is "passed failed skipped NAME". */
static void check_run(const tmp_dir *t, const char *out, int status, const char *expect) {
  char script[128], results[128], cmd[512], last[512], line[256];
  snprintf(script, sizeof script, "%s/out.txt", t->dir);
  snprintf(results, sizeof results, "%s/one.txt", t->dir);
  write_file(script, out);
  unlink(results);
  snprintf(cmd, sizeof cmd, "tests/tally.sh run '%s' prog sh -c 'cat \"%s\"; exit %d' 2>&1",
           results, script, status);
  assert_int_equal(run_last_line(cmd, last, sizeof last), status);
  FILE *f = fopen(results, "r");
  assert_non_null(f);
  assert_non_null(fgets(line, sizeof line, f));
  fclose(f);
  line[strcspn(line, "\n")] = '\0';
  if (strcmp(line, expect) != 0)
    fail_msg("counted '%s', expected '%s' for:\n%s", line, expect, out);
}

static void test_counts_each_kind_of_output(void **state) {
  const tmp_dir *t = *state;
  /* cmocka: two groups, skipped cases apart from the passed ones */
  check_run(t,
            "[==========] 4 test(s) run.\n[  PASSED  ] 2 test(s).\n"
            "[  SKIPPED ] 2 test(s), listed below:\n[  SKIPPED ] test_a\n[  SKIPPED ] test_b\n"
            "[==========] 3 test(s) run.\n[  PASSED  ] 2 test(s).\n"
            "[  FAILED  ] 1 test(s), listed below:\n[  FAILED  ] test_c\n",
            1, "4 1 2 prog");
  /* cmocka cases all passed, then a sanitizer report at exit: one failure more */
  check_run(t, "[==========] 3 test(s) run.\n[  PASSED  ] 3 test(s).\n==1==ERROR: LeakSanitizer\n",
            23, "3 1 0 prog");
  /* Python unittest */
  check_run(t, "Ran 7 tests in 3.1s\n\nFAILED (failures=1, errors=1, skipped=2)\n", 1,
            "3 2 2 prog");
  check_run(t, "Ran 1 test in 0.1s\n\nOK\n", 0, "1 0 0 prog");
  /* the fuzz pass: one case per target; a failed replay fails the target */
  check_run(t,
            "fuzz_config: 9 committed inputs replayed\nfuzz_config: ok, 4 s: x\n"
            "fuzz_request: FAILED replaying the committed inputs; log l:\n"
            "fuzz_request: ok, 4 s: x\nfuzz_manifest: ok, 4 s: x\n",
            1, "2 1 0 prog");
  /* anything else: its exit status */
  check_run(t, "PASSED: install\n", 0, "1 0 0 prog");
  check_run(t, "no CUDA device\n", 77, "0 0 1 prog");
  check_run(t, "FAILED: install: x\n", 1, "0 1 0 prog");
}

static void test_summary_line(void **state) {
  const tmp_dir *t = *state;
  char a[128], cmd[512], last[512];
  snprintf(a, sizeof a, "%s/a.txt", t->dir);
  write_file(a, "4 0 2 x\n1 1 0 y\n");
  snprintf(cmd, sizeof cmd, "tests/tally.sh skip '%s' 4 fuzz-check && "
           "tests/tally.sh summary 0 '%s' '%s/missing.txt'", a, a, t->dir);
  assert_int_equal(run_last_line(cmd, last, sizeof last), 0);
  assert_string_equal(last, "5 passed, 1 failed, 6 skipped");
  /* a failure that no case shows (a build error) is one failed case */
  snprintf(cmd, sizeof cmd, "tests/tally.sh summary 2 '%s/missing.txt'", t->dir);
  assert_int_equal(run_last_line(cmd, last, sizeof last), 0);
  assert_string_equal(last, "0 passed, 1 failed, 0 skipped");
}

/* make test with a stand-in for its three recursive makes: each adds a results line; the one
 * named FAIL_AT fails, which ends the run, as before, with a failing status. */
static void run_make_test(const tmp_dir *t, const char *fail_at, int *status, char *last,
                          size_t cap) {
  char fake[128], cmd[1024];
  snprintf(fake, sizeof fake, "%s/fake-make", t->dir);
  write_file(fake, "#!/bin/sh\n"
                   "echo \"make $*\"\n"
                   "case \"$*\" in \"$FAIL_AT\") echo \"0 2 0 $*\" >> \"$RES\"; exit 1 ;; esac\n"
                   "echo \"3 0 1 $*\" >> \"$RES\"\n");
  assert_int_equal(chmod(fake, 0700), 0);
  snprintf(cmd, sizeof cmd,
           "FAIL_AT='%s' RES='%s/res.txt' make -s --no-print-directory test MAKE='%s' "
           "TEST_TALLIES='%s/res.txt' 2>/dev/null",
           fail_at, t->dir, fake, t->dir);
  *status = run_last_line(cmd, last, cap);
}

static void test_make_test_ends_with_the_line(void **state) {
  const tmp_dir *t = *state;
  char last[512];
  int status;
  run_make_test(t, "none", &status, last, sizeof last);
  assert_int_equal(status, 0);
  assert_string_equal(last, "9 passed, 0 failed, 3 skipped");
  /* the ASan run fails: the fuzz pass does not run, the status says so */
  run_make_test(t, "check SAN=1", &status, last, sizeof last);
  assert_int_not_equal(status, 0);
  assert_string_equal(last, "3 passed, 2 failed, 1 skipped");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_counts_each_kind_of_output, setup, teardown),
      cmocka_unit_test_setup_teardown(test_summary_line, setup, teardown),
      cmocka_unit_test_setup_teardown(test_make_test_ends_with_the_line, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
