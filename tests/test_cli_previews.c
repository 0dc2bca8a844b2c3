/*
 * `vspec generate --previews DIR`: every preview kind writes files or is refused, and a
 * reused folder holds one job's previews. `--preview-kind tokens` used to write nothing
 * without a word (the daemon sends that kind as progress deltas, no images): it is a usage
 * error now. A folder reused from an earlier job kept that job's preview-NNN.png files beside
 * the new ones: they are removed first (only files named preview-NNN.png; anything else in
 * the folder stays).
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
#include <sys/stat.h>
#include <unistd.h>

#include "tests/support/cli_run.h"
#include "tests/support/daemon_harness.h"

#define WAIT_MS 60000

typedef vs_daemon_fixture fixture;

static int setup(void **state) {
  *state = vs_daemon_fixture_start("previews");
  return 0;
}

static int teardown(void **state) {
  vs_daemon_fixture_stop(*state);
  return 0;
}

static void put(const char *dir, const char *name, const char *text) {
  char path[400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  fputs(text, fp);
  fclose(fp);
}

static int exists(const char *dir, const char *name) {
  char path[400];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return access(path, F_OK) == 0;
}

/* Files named preview-*.png in dir; each must be a PNG. */
static int count_previews(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (strncmp(e->d_name, "preview-", 8) || !strstr(e->d_name, ".png")) continue;
    char path[400], sig[8];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    int png = fread(sig, 1, 8, fp) == 8 && !memcmp(sig, "\x89PNG\r\n\x1a\n", 8);
    fclose(fp);
    if (!png && strcmp(e->d_name, "preview-notes.png")) fail_msg("%s is not a PNG", path);
    n += png;
  }
  closedir(d);
  return n;
}

static void test_reused_folder(void **state) {
  fixture *f = *state;
  char dir[300], out[300];
  snprintf(dir, sizeof dir, "%s/previews", f->fx.dir);
  snprintf(out, sizeof out, "%s/img.png", f->fx.dir);
  assert_int_equal(mkdir(dir, 0755), 0);
  put(dir, "preview-099.png", "an earlier job's");
  put(dir, "preview-000.png", "an earlier job's");
  put(dir, "preview-notes.png", "not ours: kept");
  put(dir, "keep.txt", "kept");
  static vs_cli_result r;
  /* the test scheduler sleeps 20 ms per round: a micro job is over before a preview is due */
  const char *args[] = {"generate", "--server", f->d.job_ep, "--model", "self", "--accept",
                        "exact", "--sched", "slow", "--sched-param", "ms=20,depth=1", "--out",
                        out, "--previews", dir, "--preview-every", "1", "--json", NULL};
  vs_cli_run(&r, args, f->fx.dir, NULL, WAIT_MS);
  if (r.status) fail_msg("exit %d: %s", r.status, r.err);
  const char *res = strstr(r.out, "\"previews\": ");
  assert_non_null(res);
  int n = atoi(res + 12);
  printf("  %d previews\n", n);
  assert_true(n >= 1);
  assert_false(exists(dir, "preview-099.png"));
  assert_true(exists(dir, "preview-notes.png"));
  assert_true(exists(dir, "keep.txt"));
  assert_int_equal(count_previews(dir), n); /* this job's, and each one a PNG */
}

static void test_tokens_refused(void **state) {
  fixture *f = *state;
  static vs_cli_result r;
  char dir[300], out[300];
  snprintf(dir, sizeof dir, "%s/tok", f->fx.dir);
  snprintf(out, sizeof out, "%s/tok.png", f->fx.dir);
  const char *args[] = {"generate", "--server", f->d.job_ep, "--model", "micro", "--previews",
                        dir, "--preview-kind", "tokens", "--out", out, NULL};
  vs_cli_run(&r, args, f->fx.dir, NULL, WAIT_MS);
  printf("  --preview-kind tokens: exit %d: %s", r.status, r.err);
  assert_int_equal(r.status, 2);
  assert_non_null(strstr(r.err, "--preview-kind lut or decode"));
  assert_false(exists(f->fx.dir, "tok"));
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_reused_folder),
                                     cmocka_unit_test(test_tokens_refused)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
