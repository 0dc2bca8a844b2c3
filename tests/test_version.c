/*
 * tests/test_version.c - every program answers --version the same way.
 *
 * A bug report should say which build it came from, whichever program the user ran: each
 * program of the build prints vs_print_version's one line ("NAME (vspec) X.Y.Z, plugin ABI
 * M.N", core/version.h) on stdout and exits 0, before doing anything else (the bench programs
 * start daemons and load models otherwise).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/version.h"

static const char *const programs[] = {
    "vspec",       "vspecd",       "vspec-gateway",        "vspec-bench",
    "vspecd-bench", "vspecd-soak", "vspecd-startup-bench", "vspecd-fleet-bench"};

/* Runs BUILD/program --version; its stdout (at most cap - 1 bytes) into out, its exit status
 * as a wait status into *status. */
static void run_version(const char *program, char *out, size_t cap, int *status) {
  const char *build = getenv("VSPEC_BUILD") ? getenv("VSPEC_BUILD") : "build";
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", build, program);
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fd[1], 1);
    close(fd[0]);
    close(fd[1]);
    execl(path, program, "--version", (char *)NULL);
    _exit(127);
  }
  close(fd[1]);
  size_t n = 0;
  ssize_t r;
  while (n + 1 < cap && ((r = read(fd[0], out + n, cap - 1 - n)) > 0 || (r < 0 && errno == EINTR)))
    if (r > 0) n += (size_t)r;
  out[n] = '\0';
  close(fd[0]);
  assert_int_equal(waitpid(pid, status, 0), pid);
}

static void test_every_program_prints_the_version_line(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof programs / sizeof *programs; i++) {
    char expected[256], got[256];
    FILE *f = fmemopen(expected, sizeof expected, "w");
    assert_non_null(f);
    vs_print_version(f, programs[i]);
    fclose(f);
    int status;
    run_version(programs[i], got, sizeof got, &status);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      fail_msg("%s --version: exit status %d, expected 0 (output '%s')", programs[i],
               WIFEXITED(status) ? WEXITSTATUS(status) : -1, got);
    if (strcmp(got, expected) != 0)
      fail_msg("%s --version printed '%s', expected '%s'", programs[i], got, expected);
    /* the format itself: "NAME (vspec) VERSION, ..." */
    char head[128];
    snprintf(head, sizeof head, "%s (vspec) %s, plugin ABI ", programs[i], VSPEC_VERSION);
    assert_memory_equal(got, head, strlen(head));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_program_prints_the_version_line),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
