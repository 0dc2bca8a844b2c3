#include "bench/daemon_proc.h"

#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "client/conn.h"

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

/* In the child: SIGKILL when the benchmark dies (the check after it closes the race with a
 * parent that was already gone). */
static void dp_die_with(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
}

static void dp_exec(vs_bench_daemon *d, const char *const *args, const char *const *env,
                     pid_t parent) {
  if (d->die_with_parent) dp_die_with(parent);
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

int vs_bench_daemon_spawn(vs_bench_daemon *d, const char *const *args, const char *const *env) {
  fflush(NULL);
  pid_t parent = getpid();
  d->pid = fork();
  if (d->pid < 0) {
    d->pid = 0;
    return -1;
  }
  if (d->pid == 0) dp_exec(d, args, env, parent);
  return 0;
}

int vs_bench_ping_until_up(const char *endpoint, pid_t pid, double timeout_s) {
  vs_conn c;
  char err[512];
  if (vs_conn_open(&c, endpoint, NULL, err, sizeof err)) return -1;
  double end = vs_bench_now() + timeout_s;
  int rc = -1;
  for (;;) {
    Vspec__Request r = VSPEC__REQUEST__INIT;
    Vspec__Ping p = VSPEC__PING__INIT;
    r.body_case = VSPEC__REQUEST__BODY_PING;
    r.ping = &p;
    vs_conn_event e;
    if (vs_conn_call(&c, &r, 200, &e, err, sizeof err) == 1) {
      vs_conn_event_free(&e);
      rc = 0;
      break;
    }
    int st;
    if ((pid > 0 && waitpid(pid, &st, WNOHANG) == pid) || vs_bench_now() > end) break;
  }
  vs_conn_close(&c);
  return rc;
}

int vs_bench_daemon_wait_up(vs_bench_daemon *d, double timeout_s) {
  if (vs_bench_ping_until_up(d->admin_ep, d->pid, timeout_s) == 0) return 0;
  fprintf(stderr, "the daemon did not start (see %s)\n", d->log);
  return -1;
}

int vs_bench_daemon_start(vs_bench_daemon *d, const char *const *args, const char *const *env) {
  if (vs_bench_daemon_spawn(d, args, env)) return -1;
  return vs_bench_daemon_wait_up(d, 60);
}

void vs_bench_daemon_kill(vs_bench_daemon *d) {
  if (d->pid <= 0) return;
  kill(d->pid, SIGKILL);
  waitpid(d->pid, NULL, 0);
  d->pid = 0;
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

/* ---- other programs ------------------------------------------------------------------------ */

int vs_bench_proc_spawn(vs_bench_proc *p, const char *const *args) {
  fflush(NULL);
  pid_t parent = getpid();
  p->pid = fork();
  if (p->pid < 0) {
    p->pid = 0;
    return -1;
  }
  if (p->pid > 0) return 0;
  dp_die_with(parent);
  int fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
  }
  const char *argv[64] = {p->path};
  int n = 1;
  for (int i = 0; args && args[i] && n < 63; i++) argv[n++] = args[i];
  argv[n] = NULL;
  execv(p->path, (char *const *)argv);
  _exit(127);
}

int vs_bench_proc_stop(vs_bench_proc *p, int sig, int timeout_ms) {
  if (p->pid <= 0) return 0;
  kill(p->pid, sig);
  int st = 0, rc = -1;
  for (int i = 0; i < timeout_ms / 10; i++) {
    if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
      rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    usleep(10000);
  }
  if (rc == -1) {
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &st, 0);
  }
  p->pid = 0;
  return rc;
}

int vs_bench_proc_exited(vs_bench_proc *p) {
  if (p->pid <= 0) return 1;
  int st;
  if (waitpid(p->pid, &st, WNOHANG) != p->pid) return 0;
  p->pid = 0;
  return 1;
}

void vs_bench_proc_dump_log(const vs_bench_proc *p, const char *title, int lines) {
  fprintf(stderr, "---- %s (%s)\n", title, p->log);
  fflush(stderr);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "tail -n %d '%s' >&2", lines, p->log);
  if (system(cmd)) fprintf(stderr, "(no log)\n");
}

/* Links rather than copies: the daemon reads the files once at load anyway. */
int vs_bench_self_model(const vs_bench_daemon *d, const char *model_dir, char *dir, size_t len) {
  char src[1300], dst[1300];
  snprintf(dir, len, "%s/self", d->tmp);
  if (mkdir(dir, 0755)) return -1;
  const char *files[] = {"gpt.safetensors", "vq.safetensors"};
  for (int i = 0; i < 2; i++) {
    snprintf(src, sizeof src, "%s/%s", model_dir, files[i]);
    snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
    if (symlink(src, dst)) return -1;
  }
  snprintf(dst, sizeof dst, "%s/vspec-model.json", dir);
  FILE *f = fopen(dst, "w");
  if (!f) return -1;
  fputs("{\"name\": \"self\", \"target\": {\"backend\": \"llamagen\", \"gpt\": \"gpt.safetensors\", "
        "\"vq\": \"vq.safetensors\"}, \"draft\": {\"backend\": \"llamagen\", \"gpt\": "
        "\"gpt.safetensors\"}, \"defaults\": {\"cfg_scale\": 2.0}}\n", f);
  return fclose(f) ? -1 : 0;
}

void vs_bench_daemon_scan_log(const vs_bench_daemon *d, long *leaked_bytes, long *leaked_allocs,
                              int *reports) {
  FILE *f = fopen(d->log, "r");
  char line[1024];
  while (f && fgets(line, sizeof line, f)) {
    long bytes, allocs;
    if (sscanf(line, "SUMMARY: AddressSanitizer: %ld byte(s) leaked in %ld allocation(s)", &bytes,
               &allocs) == 2) {
      *leaked_bytes += bytes;
      *leaked_allocs += allocs;
    } else if (strstr(line, "ERROR: AddressSanitizer") || strstr(line, "runtime error:")) {
      (*reports)++;
    }
  }
  if (f) fclose(f);
}
