/*
 * tests/support/cli_run.c - running the vspec CLI from tests (tests/support/cli_run.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tests/support/cli_run.h"

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/daemon_harness.h"

static void vs__child_env(const char *state_dir, const char *const *env) {
  static const char *const clear[] = {"VSPEC_SERVER", "VSPEC_ADMIN", "VSPEC_CURVE_KEY",
                                      "VSPEC_CURVE_SERVER_KEY", NULL};
  for (int i = 0; clear[i]; i++) unsetenv(clear[i]);
  if (state_dir) setenv("XDG_STATE_HOME", state_dir, 1);
  for (int i = 0; env && env[i]; i++) {
    char name[200];
    const char *eq = strchr(env[i], '=');
    snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - env[i]) : (int)strlen(env[i]), env[i]);
    if (eq) setenv(name, eq + 1, 1);
    else unsetenv(name);
  }
}

void vs_tool_start(vs_cli_proc *p, const char *tool, const char *const *args,
                   const char *state_dir, const char *const *env) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", vs_harness_build(), tool);
  int o[2], e[2];
  assert_int_equal(pipe(o), 0);
  assert_int_equal(pipe(e), 0);
  fflush(NULL);
  p->t0 = vs_harness_now();
  p->pid = fork();
  assert_true(p->pid >= 0);
  if (p->pid == 0) {
    dup2(o[1], 1);
    dup2(e[1], 2);
    close(o[0]), close(o[1]), close(e[0]), close(e[1]);
    vs__child_env(state_dir, env);
    const char *argv[64] = {path};
    for (int i = 0; args[i] && i < 62; i++) argv[i + 1] = args[i];
    execv(path, (char *const *)argv);
    _exit(127);
  }
  close(o[1]);
  close(e[1]);
  p->out_fd = o[0];
  p->err_fd = e[0];
}

/* Appends what fd has to buf (cap bytes, NUL-terminated); 0 at its end. */
static int vs__drain(int fd, char *buf, size_t cap, size_t *used) {
  char chunk[4096];
  ssize_t n = read(fd, chunk, sizeof chunk);
  if (n <= 0) return 0;
  size_t k = (size_t)n < cap - 1 - *used ? (size_t)n : cap - 1 - *used;
  memcpy(buf + *used, chunk, k);
  *used += k;
  buf[*used] = 0;
  return 1;
}

void vs_cli_finish(vs_cli_proc *p, vs_cli_result *r, int timeout_ms) {
  size_t nout = 0, nerr = 0;
  r->out[0] = r->err[0] = 0;
  int open_out = 1, open_err = 1;
  double end = vs_harness_now() + timeout_ms / 1000.0;
  while (open_out || open_err) {
    struct pollfd fds[2] = {{.fd = open_out ? p->out_fd : -1, .events = POLLIN},
                            {.fd = open_err ? p->err_fd : -1, .events = POLLIN}};
    int left = (int)((end - vs_harness_now()) * 1000);
    if (left <= 0 || poll(fds, 2, left) <= 0) {
      kill(p->pid, SIGKILL);
      waitpid(p->pid, NULL, 0);
      fail_msg("the program did not finish within %d ms; stderr so far: %s", timeout_ms, r->err);
    }
    if (fds[0].revents) open_out = vs__drain(p->out_fd, r->out, sizeof r->out, &nout);
    if (fds[1].revents) open_err = vs__drain(p->err_fd, r->err, sizeof r->err, &nerr);
  }
  close(p->out_fd);
  close(p->err_fd);
  int st;
  waitpid(p->pid, &st, 0);
  r->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r->secs = vs_harness_now() - p->t0;
}

void vs_cli_start(vs_cli_proc *p, const char *const *args, const char *state_dir,
                  const char *const *env) {
  vs_tool_start(p, "vspec", args, state_dir, env);
}

void vs_cli_run(vs_cli_result *r, const char *const *args, const char *state_dir,
                const char *const *env, int timeout_ms) {
  vs_cli_proc p;
  vs_cli_start(&p, args, state_dir, env);
  vs_cli_finish(&p, r, timeout_ms);
}

int vs_run_tool_all(const char *tool, const char *const *args, int timeout_s, char *out,
                    size_t outlen) {
  static vs_cli_result r; /* large: not on the stack */
  vs_cli_proc p;
  vs_tool_start(&p, tool, args, NULL, NULL);
  vs_cli_finish(&p, &r, timeout_s * 1000);
  if (outlen) snprintf(out, outlen, "%s%s", r.out, r.err);
  return r.status;
}

const char *vs_cli_last_line(const char *text, char *buf, size_t n) {
  const char *end = text + strlen(text);
  while (end > text && end[-1] == '\n') end--;
  const char *start = end;
  while (start > text && start[-1] != '\n') start--;
  snprintf(buf, n, "%.*s", (int)(end - start), start);
  return buf;
}
