/*
 * tests/test_readme.c - the README's commands leave nothing in the checkout.
 *
 * A new user pastes the README's command blocks from the checkout; each file they write
 * (--out, -o, --previews, keygen) goes under the scratch folder $OUT or an absolute path
 * (a plugin into pkg-config's plugin directory), and the redis-server they start listens on
 * loopback only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

/* The word after `opt` (an option or a command) in line, if any, into out. */
static int word_after(const char *line, const char *opt, char *out, size_t cap) {
  size_t n = strlen(opt);
  for (const char *p = line; (p = strstr(p, opt)); p += n) {
    if ((p != line && p[-1] != ' ') || p[n] != ' ') continue;
    const char *w = p + n;
    while (*w == ' ') w++;
    size_t k = strcspn(w, " \n\\");
    if (k == 0 || k >= cap) return 0;
    memcpy(out, w, k);
    out[k] = '\0';
    return 1;
  }
  return 0;
}

static void test_commands_write_into_the_scratch_folder(void **state) {
  (void)state;
  FILE *f = fopen("README.md", "r");
  assert_non_null(f);
  static const char *const writers[] = {"--out", "-o", "--previews", "keygen"};
  char line[1024], word[512];
  int lineno = 0, checked = 0, redis = 0, bad = 0;
  while (fgets(line, sizeof line, f)) {
    lineno++;
    if (strncmp(line, "    ", 4) != 0) continue; /* command blocks only */
    char *comment = strstr(line, " # ");
    if (comment) *comment = '\0';
    for (size_t i = 0; i < sizeof writers / sizeof *writers; i++) {
      if (!word_after(line, writers[i], word, sizeof word) || word[0] == '-') continue;
      checked++;
      /* "$(pkg-config --variable=plugindir ...)/...": an installed tree's directory */
      if (strncmp(word, "$OUT/", 5) != 0 && word[0] != '/' && strncmp(word, "\"$(", 3) != 0) {
        print_error("README.md:%d: %s %s writes into the checkout: use $OUT/...\n", lineno,
                    writers[i], word);
        bad++;
      }
    }
    if (strstr(line, "redis-server ")) {
      redis++;
      if (!strstr(line, "--bind 127.0.0.1")) {
        print_error("README.md:%d: redis-server without --bind 127.0.0.1\n", lineno);
        bad++;
      }
    }
  }
  fclose(f);
  assert_true(checked >= 15); /* the blocks are still there to check */
  assert_true(redis >= 1);
  assert_int_equal(bad, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_commands_write_into_the_scratch_folder),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
