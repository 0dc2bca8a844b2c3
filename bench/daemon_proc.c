#include "bench/daemon_proc.h"

#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "clients/conn.h"

int vs_bench_daemon_init(vs_bench_daemon *d, const char *prog) {
  memset(d, 0, sizeof *d);
  char exe[1024];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) {
    fprintf(stderr, "%s: cannot read /proc/self/exe\n", prog);
    return -1;
  }
  exe[n] = 0;
  snprintf(d->exe_dir, sizeof d->exe_dir, "%s", dirname(exe));
  snprintf(d->plugins, sizeof d->plugins, "%s/plugins", d->exe_dir);
  snprintf(d->tmp, sizeof d->tmp, "/tmp/%s-XXXXXX", prog);
  if (!mkdtemp(d->tmp)) {
    fprintf(stderr, "%s: mkdtemp failed\n", prog);
    return -1;
  }
  snprintf(d->job_ep, sizeof d->job_ep, "ipc://%s/job.sock", d->tmp);
  snprintf(d->admin_ep, sizeof d->admin_ep, "ipc://%s/admin.sock", d->tmp);
  snprintf(d->log, sizeof d->log, "%s/vspecd.log", d->tmp);
  return 0;
}

static void vs__exec(vs_bench_daemon *d, const char *const *args, const char *const *env) {
  char path[1100];
  snprintf(path, sizeof path, "%s/vspecd", d->exe_dir);
  FILE *f = freopen(d->log, "a", stderr);
  (void)f;
  for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
  const char *argv[64] = {path, "--endpoint", d->job_ep, "--admin", d->admin_ep, "--plugins",
                          d->plugins};
  int n = 7;
  for (int i = 0; args && args[i] && n < 63; i++) argv[n++] = args[i];
  argv[n] = NULL;
  execv(path, (char *const *)argv);
  _exit(127);
}

int vs_bench_daemon_start(vs_bench_daemon *d, const char *const *args, const char *const *env) {
  fflush(NULL);
  d->pid = fork();
  if (d->pid < 0) return -1;
  if (d->pid == 0) vs__exec(d, args, env);
  vs_conn c;
  char err[512];
  if (vs_conn_open(&c, d->admin_ep, NULL, err, sizeof err)) return -1;
  double end = vs_bench_now() + 60;
  for (;;) {
    Vspec__Request r = VSPEC__REQUEST__INIT;
    Vspec__Ping p = VSPEC__PING__INIT;
    r.body_case = VSPEC__REQUEST__BODY_PING;
    r.ping = &p;
    vs_conn_event e;
    if (vs_conn_call(&c, &r, 200, &e, err, sizeof err) == 1) {
      vs_conn_event_free(&e);
      break;
    }
    int st;
    if (waitpid(d->pid, &st, WNOHANG) == d->pid || vs_bench_now() > end) {
      fprintf(stderr, "the daemon did not start (see %s)\n", d->log);
      vs_conn_close(&c);
      return -1;
    }
  }
  vs_conn_close(&c);
  return 0;
}

int vs_bench_daemon_stop(vs_bench_daemon *d, int timeout_ms) {
  if (d->pid <= 0) return 0;
  kill(d->pid, SIGTERM);
  int st = 0, rc = -1;
  for (int i = 0; i < timeout_ms / 10; i++) {
    if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
      rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    usleep(10000);
  }
  if (rc == -1) {
    kill(d->pid, SIGKILL);
    waitpid(d->pid, &st, 0);
  }
  d->pid = 0;
  return rc;
}

void vs_bench_daemon_dump_log(const vs_bench_daemon *d, int lines) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "tail -n %d '%s' >&2", lines, d->log);
  if (system(cmd)) fprintf(stderr, "(no daemon log)\n");
}

int vs_bench_daemon_cleanup(vs_bench_daemon *d) {
  vs_bench_daemon_stop(d, 30000);
  if (!*d->tmp) return 0;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->tmp);
  return system(cmd) ? -1 : 0;
}

void vs_bench_daemon_grant(vs_conn *c, uint64_t job) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Credit cc = VSPEC__CREDIT__INIT;
  cc.job_id = job;
  cc.grant = 1;
  r.body_case = VSPEC__REQUEST__BODY_CREDIT;
  r.credit = &cc;
  char err[256];
  vs_conn_send(c, &r, NULL, 0, err, sizeof err);
}
