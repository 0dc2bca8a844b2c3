#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/support/tool_output.h"

#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/daemon_harness.h"

int vs_run_tool_all(const char *tool, const char *const *args, int timeout_s, char *out,
                    size_t outlen) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", vs_harness_build(), tool);
  int p[2];
  assert_int_equal(pipe(p), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(p[1], 1);
    dup2(p[1], 2);
    close(p[0]);
    close(p[1]);
    const char *argv[64] = {path};
    for (int i = 0; args && args[i] && i < 62; i++) argv[i + 1] = args[i];
    alarm((unsigned)timeout_s); /* survives exec: a hung tool dies of SIGALRM */
    execv(path, (char *const *)argv);
    _exit(127);
  }
  close(p[1]);
  size_t used = 0;
  char buf[4096];
  ssize_t r;
  while ((r = read(p[0], buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < r && used + 1 < outlen; i++) out[used++] = buf[i];
  if (outlen) out[used] = 0;
  close(p[0]);
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
