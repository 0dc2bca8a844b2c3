/*
 * `vspec completion bash|zsh` (clients/cmd_completion.c): the bash script parses (bash -n),
 * completes `vspec gen<TAB>` to generate in a bash that sourced it, completes --accept with the
 * names a daemon has loaded (here a stand-in `vspec` that prints a plugins list) and with the
 * shipped names when none answers, and knows every command `vspec --help` lists and every
 * option each command's --help lists (so a new option without completion fails here). The
 * zsh script parses and offers the commands, where zsh is installed. No daemon is started.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/support/daemon_harness.h"

typedef struct fixture {
  char dir[64], bash[200], zsh[200], vspec[700];
} fixture;

/* Runs a shell command; its stdout and stderr into out; the exit status. */
static int sh(const char *cmd, char *out, size_t n) {
  fflush(NULL);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t used = fread(out, 1, n - 1, p);
  out[used] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  *state = f;
  snprintf(f->dir, sizeof f->dir, "/tmp/vspec-compl-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->bash, sizeof f->bash, "%s/vspec.bash", f->dir);
  snprintf(f->zsh, sizeof f->zsh, "%s/_vspec", f->dir);
  snprintf(f->vspec, sizeof f->vspec, "%s/vspec", vs_harness_build());
  char cmd[1200], out[256];
  snprintf(cmd, sizeof cmd, "%s completion bash > %s && %s completion zsh > %s", f->vspec,
           f->bash, f->vspec, f->zsh);
  assert_int_equal(sh(cmd, out, sizeof out), 0);
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  char cmd[200], out[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
  sh(cmd, out, sizeof out);
  free(f);
  return 0;
}

/* The replies of the bash completion for `line` (the cursor at its end): bash sources the
 * script, sets COMP_* as readline would and calls the function `complete -p vspec` names. */
static void complete_bash(const fixture *f, const char *line, const char *env, char *out,
                          size_t n) {
  char script[300], cmd[2400];
  snprintf(script, sizeof script, "%s/t.sh", f->dir);
  FILE *s = fopen(script, "w");
  assert_non_null(s);
  fprintf(s, "source '%s' || exit 9\n"
             "fn=$(complete -p vspec | sed -n 's/.*-F \\([^ ]*\\) vspec$/\\1/p')\n"
             "[ -n \"$fn\" ] || exit 8\n"
             "COMP_LINE='%s'; COMP_POINT=${#COMP_LINE}\n"
             "read -ra COMP_WORDS <<<\"$COMP_LINE\"\n"
             "[[ $COMP_LINE == *' ' ]] && COMP_WORDS+=('')\n"
             "COMP_CWORD=$((${#COMP_WORDS[@]} - 1))\n"
             "\"$fn\" vspec \"${COMP_WORDS[COMP_CWORD]}\" \"${COMP_WORDS[COMP_CWORD-1]}\"\n"
             "printf '%%s\\n' \"${COMPREPLY[@]}\"\n", f->bash, line);
  fclose(s);
  snprintf(cmd, sizeof cmd, "env -i PATH=/usr/bin:/bin VSPEC_ADMIN=ipc://%s/none.sock %s "
           "bash %s 2>&1", f->dir, env ? env : "", script);
  int rc = sh(cmd, out, n);
  printf("  [%s] -> %s", line, out);
  assert_int_equal(rc, 0);
}

static void test_bash_syntax(void **state) {
  fixture *f = *state;
  char cmd[300], out[4096];
  snprintf(cmd, sizeof cmd, "bash -n %s 2>&1", f->bash);
  assert_int_equal(sh(cmd, out, sizeof out), 0);
  assert_string_equal(out, "");
}

static void test_bash_completes(void **state) {
  fixture *f = *state;
  char out[4096];
  complete_bash(f, "vspec gen", NULL, out, sizeof out);
  assert_string_equal(out, "generate\n");
  complete_bash(f, "vspec generate --prev", NULL, out, sizeof out);
  assert_string_equal(out, "--previews\n--preview-kind\n--preview-every\n");
  complete_bash(f, "vspec generate --preview-kind ", NULL, out, sizeof out);
  assert_string_equal(out, "lut\ndecode\n");
  complete_bash(f, "vspec plugins ", NULL, out, sizeof out);
  assert_string_equal(out, "list\nreload\n");
  complete_bash(f, "vspec completion ", NULL, out, sizeof out);
  assert_string_equal(out, "bash\nzsh\n");
}

/* --accept, --sched and --method: the shipped names when no daemon answers (the stand-in
 * path does not exist), the loaded ones when `vspec plugins list` prints them. */
static void test_bash_plugin_names(void **state) {
  fixture *f = *state;
  char out[4096], line[300], fake[200];
  snprintf(line, sizeof line, "%s/nonexistent generate --accept la", f->dir);
  complete_bash(f, line, NULL, out, sizeof out);
  assert_string_equal(out, "lantern\nlanternpp\n");
  snprintf(line, sizeof line, "%s/nonexistent generate --sched ", f->dir);
  complete_bash(f, line, NULL, out, sizeof out);
  assert_string_equal(out, "standard\nvvs\n");
  snprintf(line, sizeof line, "%s/nonexistent generate --method sd:lantern@v", f->dir);
  complete_bash(f, line, NULL, out, sizeof out);
  assert_string_equal(out, "lantern@vvs\n"); /* bash shows it after the colon */
  snprintf(fake, sizeof fake, "%s/fakevspec", f->dir);
  FILE *s = fopen(fake, "w");
  assert_non_null(s);
  fprintf(s, "#!/bin/sh\n[ \"$1 $2\" = 'plugins list' ] || exit 3\n"
             "echo 'plugins in /x:'\n"
             "echo '  accept   myrule         1.0.0      generation 1, 0 job(s)'\n"
             "echo '  sched    standard       1.0.0      generation 1, 0 job(s)'\n");
  fclose(s);
  assert_int_equal(chmod(fake, 0755), 0);
  snprintf(line, sizeof line, "%s generate --accept ", fake);
  complete_bash(f, line, NULL, out, sizeof out);
  assert_string_equal(out, "myrule\n");
}

/* Command names from `vspec --help`: the first word of each line of its command list. */
static void help_commands(const fixture *f, char names[][32], int *n) {
  char cmd[800], out[8192];
  snprintf(cmd, sizeof cmd, "%s --help | sed -n '/^$/,/^Examples/p' | awk 'NF && $1 != "
           "\"Examples:\" { print $1 }' | sort -u", f->vspec);
  assert_int_equal(sh(cmd, out, sizeof out), 0);
  *n = 0;
  for (char *t = strtok(out, "\n"); t && *n < 32; t = strtok(NULL, "\n"))
    snprintf(names[(*n)++], 32, "%s", t);
  assert_true(*n >= 8);
}

/* Every command --help lists is completed, and every option its own --help lists. */
static void test_bash_knows_every_option(void **state) {
  fixture *f = *state;
  char names[32][32], cmd[1600], opts[8192], known[4096];
  int n;
  help_commands(f, names, &n);
  for (int i = 0; i < n; i++) {
    char line[64];
    snprintf(line, sizeof line, "vspec %.4s", names[i]);
    complete_bash(f, line, NULL, known, sizeof known);
    if (!strstr(known, names[i])) fail_msg("command %s is not completed", names[i]);
    snprintf(cmd, sizeof cmd, "%s %s --help | grep -E '^  --' | grep -oE -- '--[a-z][a-z-]*'",
             f->vspec, names[i]);
    sh(cmd, opts, sizeof opts);
    snprintf(cmd, sizeof cmd, "bash -c 'source %s; echo \" $(_vspec_options %s) \"'", f->bash,
             names[i]);
    assert_int_equal(sh(cmd, known, sizeof known), 0); /* " --help --json ... " */
    int checked = 0;
    for (char *o = strtok(opts, "\n"); o; o = strtok(NULL, "\n"), checked++) {
      char word[80];
      snprintf(word, sizeof word, " %s ", o);
      if (!strstr(known, word)) fail_msg("vspec %s: option %s is not completed", names[i], o);
    }
    printf("  vspec %s: %d options of its --help completed\n", names[i], checked);
  }
}

/* zsh: the script parses, and at the command position it offers the commands. */
static void test_zsh(void **state) {
  fixture *f = *state;
  char cmd[800], out[4096];
  if (sh("command -v zsh", out, sizeof out)) {
    printf("  zsh is not installed: its script is not checked here\n");
    skip();
  }
  snprintf(cmd, sizeof cmd, "zsh -n %s 2>&1", f->zsh);
  assert_int_equal(sh(cmd, out, sizeof out), 0);
  snprintf(cmd, sizeof cmd, "zsh -f -c 'compadd() { print -r -- \"$@\" }; words=(vspec gen); "
           "CURRENT=2; source %s' 2>&1", f->zsh);
  assert_int_equal(sh(cmd, out, sizeof out), 0);
  printf("  zsh offers: %s", out);
  assert_non_null(strstr(out, " generate "));
  assert_non_null(strstr(out, " completion"));
}

static void test_usage(void **state) {
  fixture *f = *state;
  char cmd[800], out[4096];
  snprintf(cmd, sizeof cmd, "%s completion fish 2>&1", f->vspec);
  assert_int_equal(sh(cmd, out, sizeof out), 2);
  assert_non_null(strstr(out, "bash or zsh"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bash_syntax),       cmocka_unit_test(test_bash_completes),
      cmocka_unit_test(test_bash_plugin_names), cmocka_unit_test(test_bash_knows_every_option),
      cmocka_unit_test(test_zsh),               cmocka_unit_test(test_usage)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
