/*
 * One default seed policy: `vspec generate` without --seed sends no seed, so the daemon draws
 * one (as the HTTP endpoint and the Python client do); before, the CLI always sent seed 0 and
 * every run made the same image. The seed that ran is printed (the accepted line and the
 * final line; "seed" in the JSON accepted and result events) and stored in the PNG's `vspec`
 * text chunk (also when --upscale rewrites the PNG); --seed N still fixes it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/cli_run.h"
#include "tests/support/daemon_harness.h"

#define WAIT_MS 60000

typedef vs_daemon_fixture fixture;

static int setup(void **state) {
  *state = vs_daemon_fixture_start("seed");
  return 0;
}

static int teardown(void **state) {
  vs_daemon_fixture_stop(*state);
  return 0;
}

/* "seed": N of the JSON line that starts with `event`. */
static unsigned long long json_seed(const char *out, const char *event) {
  const char *line = strstr(out, event);
  assert_non_null(line);
  const char *s = strstr(line, "\"seed\": ");
  assert_non_null(s);
  assert_true(s < strchr(line, '\n'));
  return strtoull(s + 8, NULL, 10);
}

/* The text of the PNG's `vspec` tEXt chunk (keyword, NUL, text) into buf. */
static void png_vspec_text(const char *path, char *buf, size_t n) {
  static char data[1 << 20];
  FILE *fp = fopen(path, "rb");
  assert_non_null(fp);
  size_t len = fread(data, 1, sizeof data, fp);
  fclose(fp);
  for (size_t i = 0; i + 10 < len; i++)
    if (!memcmp(data + i, "tEXtvspec", 10)) {
      const uint8_t *l = (const uint8_t *)data + i - 4; /* the chunk's length, big endian */
      uint32_t clen = (uint32_t)l[0] << 24 | (uint32_t)l[1] << 16 | (uint32_t)l[2] << 8 | l[3];
      assert_true(i + 4 + clen <= len && clen > 6);
      snprintf(buf, n, "%.*s", (int)(clen - 6), data + i + 10);
      return;
    }
  fail_msg("%s has no vspec text chunk", path);
}

static unsigned long long run_json(fixture *f, const char *out, const char *seed,
                                   const char *upscale) {
  static vs_cli_result r;
  const char *args[16] = {"generate", "--server", f->d.job_ep, "--model", "micro", "--out", out,
                          "--json"};
  int n = 8;
  if (seed) {
    args[n++] = "--seed";
    args[n++] = seed;
  }
  if (upscale) {
    args[n++] = "--upscale";
    args[n++] = upscale;
  }
  vs_cli_run(&r, args, f->fx.dir, NULL, WAIT_MS);
  if (r.status) fail_msg("exit %d: %s", r.status, r.err);
  unsigned long long a = json_seed(r.out, "{\"event\": \"accepted\""),
                     s = json_seed(r.out, "{\"event\": \"result\"");
  assert_int_equal(a, s);
  char text[1000], want[64];
  png_vspec_text(out, text, sizeof text);
  snprintf(want, sizeof want, " seed=%llu ", s);
  printf("  seed %llu; PNG vspec chunk: %s\n", s, text);
  assert_non_null(strstr(text, want));
  return s;
}

static void test_random_by_default(void **state) {
  fixture *f = *state;
  char a[300], b[300], c[300];
  snprintf(a, sizeof a, "%s/a.png", f->fx.dir);
  snprintf(b, sizeof b, "%s/b.png", f->fx.dir);
  snprintf(c, sizeof c, "%s/c.png", f->fx.dir);
  unsigned long long s1 = run_json(f, a, NULL, NULL), s2 = run_json(f, b, NULL, NULL);
  assert_true(s1 != s2);
  run_json(f, c, NULL, "2"); /* the upscaled PNG keeps the chunk */
}

static void test_fixed_seed(void **state) {
  fixture *f = *state;
  char a[300];
  snprintf(a, sizeof a, "%s/fixed.png", f->fx.dir);
  assert_int_equal(run_json(f, a, "5", NULL), 5);
}

/* Text output: the seed in the accepted line and in the final line. */
static void test_text_shows_seed(void **state) {
  fixture *f = *state;
  static vs_cli_result r;
  char out[300];
  snprintf(out, sizeof out, "%s/t.png", f->fx.dir);
  const char *args[] = {"generate", "--server", f->d.job_ep, "--model", "micro", "--out", out,
                        NULL};
  vs_cli_run(&r, args, f->fx.dir, NULL, WAIT_MS);
  printf("%s", r.err);
  assert_int_equal(r.status, 0);
  const char *acc = strstr(r.err, ", seed ");
  assert_non_null(acc);
  unsigned long long seed = strtoull(acc + 7, NULL, 10);
  char want[80];
  snprintf(want, sizeof want, ", seed %llu, ", seed);
  const char *wrote = strstr(r.err, "wrote ");
  assert_non_null(wrote);
  assert_non_null(strstr(wrote, want));
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_random_by_default),
                                     cmocka_unit_test(test_fixed_seed),
                                     cmocka_unit_test(test_text_shows_seed)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
