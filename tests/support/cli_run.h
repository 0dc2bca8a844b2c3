/*
 * tests/support/cli_run.h - running the vspec CLI (or another program of the build) from
 * tests with its stdout and stderr kept apart, a chosen environment, and a bounded wait.
 *
 * The child gets no $VSPEC_SERVER, $VSPEC_ADMIN or CURVE variables of the person running the
 * tests, and $XDG_STATE_HOME is the caller's state directory (so `vspec cancel --last` state
 * stays in the test's temporary folder), before `env` is applied.
 */
#ifndef VS_CLI_RUN_H
#define VS_CLI_RUN_H

#include <stddef.h>
#include <sys/types.h>

typedef struct vs_cli_proc {
  pid_t pid;
  int out_fd, err_fd;
  double t0;
} vs_cli_proc;

typedef struct vs_cli_result {
  int status; /* exit status, 128 + n when killed by signal n */
  double secs;
  char out[1 << 17];
  char err[1 << 14];
} vs_cli_result;

/* Starts $VSPEC_BUILD/tool with args (NULL-ended). state_dir: its $XDG_STATE_HOME (NULL:
 * the caller's). env: NULL-ended "NAME=VALUE" to set, or "NAME" to unset; may be NULL. */
void vs_tool_start(vs_cli_proc *p, const char *tool, const char *const *args,
                   const char *state_dir, const char *const *env);
/* vs_tool_start for $VSPEC_BUILD/vspec. */
void vs_cli_start(vs_cli_proc *p, const char *const *args, const char *state_dir,
                  const char *const *env);
/* Reads both outputs to their end and reaps the child; kills it (and fails the test) after
 * timeout_ms. */
void vs_cli_finish(vs_cli_proc *p, vs_cli_result *r, int timeout_ms);
void vs_cli_run(vs_cli_result *r, const char *const *args, const char *state_dir,
                const char *const *env, int timeout_ms);
/* Runs $VSPEC_BUILD/tool with args and returns its exit status; out gets its stdout, then its
 * stderr (where the messages under test go, which vs_run_tool of daemon_harness.h drops),
 * cut to outlen. A run over timeout_s fails the test. */
int vs_run_tool_all(const char *tool, const char *const *args, int timeout_s, char *out,
                    size_t outlen);

/* The last non-empty line of text (without its newline) into buf. */
const char *vs_cli_last_line(const char *text, char *buf, size_t n);

#endif /* VS_CLI_RUN_H */
