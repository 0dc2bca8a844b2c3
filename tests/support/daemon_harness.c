#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/support/daemon_harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double vs_harness_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void vs_harness_sleep_ms(int ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

const char *vs_harness_build(void) {
  const char *b = getenv("VSPEC_BUILD");
  return b && *b ? b : "build";
}

static void vs__abs(char *out, size_t cap, const char *rel) {
  if (rel[0] == '/') {
    snprintf(out, cap, "%s", rel);
    return;
  }
  char cwd[900];
  assert_non_null(getcwd(cwd, sizeof cwd));
  snprintf(out, cap, "%s/%s", cwd, rel);
}

static void vs__copy(const char *src, const char *dst) {
  FILE *in = fopen(src, "rb");
  if (!in) fail_msg("cannot open %s (build the test plugins first)", src);
  char tmp[1200];
  snprintf(tmp, sizeof tmp, "%s.tmp", dst);
  FILE *out = fopen(tmp, "wb");
  assert_non_null(out);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) assert_int_equal(fwrite(buf, 1, n, out), n);
  fclose(in);
  assert_int_equal(fclose(out), 0);
  /* vspecd refuses plugin files others can write, whatever the umask made of this one. */
  assert_int_equal(chmod(tmp, 0644), 0);
  assert_int_equal(rename(tmp, dst), 0);
}

void vs_fixture_install(vs_fixture *f, const char *built, const char *as) {
  char src[1200], dst[600];
  snprintf(src, sizeof src, "%s/tests/plugins/%s", vs_harness_build(), built);
  snprintf(dst, sizeof dst, "%s/%s", f->plugins, as);
  vs__copy(src, dst);
}

void vs_fixture_make(vs_fixture *f) {
  memset(f, 0, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/vspec-dt-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->plugins, sizeof f->plugins, "%s/plugins", f->dir);
  assert_int_equal(mkdir(f->plugins, 0755), 0);
  /* the daemons' preview colour tables go to the fixture, not to the user's cache */
  char cache[200];
  snprintf(cache, sizeof cache, "%s/cache", f->dir);
  setenv("VSPEC_CACHE_DIR", cache, 1);
  /* vspec generate records its jobs for `vspec cancel --last` there: not in the user's home */
  char state[200];
  snprintf(state, sizeof state, "%s/state", f->dir);
  setenv("XDG_STATE_HOME", state, 1);
  /* The project's plugins, symlinked (the registry copies each generation anyway). */
  char built[1000], absb[1100];
  snprintf(built, sizeof built, "%s/plugins", vs_harness_build());
  vs__abs(absb, sizeof absb, built);
  DIR *d = opendir(absb);
  if (!d) fail_msg("no plugin directory %s", absb);
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t l = strlen(de->d_name);
    if (l < 4 || strcmp(de->d_name + l - 3, ".so")) continue;
    char src[1400], dst[700];
    snprintf(src, sizeof src, "%s/%s", absb, de->d_name);
    snprintf(dst, sizeof dst, "%s/%s", f->plugins, de->d_name);
    assert_int_equal(symlink(src, dst), 0);
  }
  closedir(d);
  vs_fixture_install(f, "testrule_v1.so", "accept_testrule.so");
  vs_fixture_install(f, "slowsched.so", "sched_slow.so");
  /* Models: the micro model, and the same drafting for itself. */
  vs__abs(f->micro_model, sizeof f->micro_model, "tests/golden/micro_c2i");
  snprintf(f->self_model, sizeof f->self_model, "%s/self", f->dir);
  assert_int_equal(mkdir(f->self_model, 0755), 0);
  const char *files[] = {"gpt.safetensors", "vq.safetensors"};
  for (int i = 0; i < 2; i++) {
    char src[1300], dst[400];
    snprintf(src, sizeof src, "%s/%s", f->micro_model, files[i]);
    snprintf(dst, sizeof dst, "%s/%s", f->self_model, files[i]);
    assert_int_equal(symlink(src, dst), 0);
  }
  char path[400];
  snprintf(path, sizeof path, "%s/vspec-model.json", f->self_model);
  FILE *m = fopen(path, "w");
  assert_non_null(m);
  fputs("{\"name\": \"self\", \"target\": {\"backend\": \"llamagen\", \"gpt\": \"gpt.safetensors\", "
        "\"vq\": \"vq.safetensors\"}, \"draft\": {\"backend\": \"llamagen\", \"gpt\": "
        "\"gpt.safetensors\"}, \"defaults\": {\"cfg_scale\": 2.0}}\n", m);
  fclose(m);
}

void vs_fixture_remove(vs_fixture *f) {
  if (!*f->dir) return;
  if (getenv("VSPEC_TEST_KEEP")) { /* for post-mortems: logs and sockets stay */
    fprintf(stderr, "kept %s\n", f->dir);
    return;
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", f->dir);
  *f->dir = 0;
}

static pid_t vs__spawn(const char *path, const char *const *argv, const char *log) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int fd = log ? open(log, O_WRONLY | O_CREAT | O_APPEND, 0644) : open("/dev/null", O_WRONLY);
    if (fd >= 0) {
      dup2(fd, 2);
      int out = open("/dev/null", O_WRONLY);
      if (out >= 0) dup2(out, 1);
    }
    execv(path, (char *const *)argv);
    _exit(127);
  }
  return pid;
}

pid_t vs_spawn_tool(const char *tool, const char *const *args, const char *log) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", vs_harness_build(), tool);
  const char *argv[64];
  int n = 0;
  argv[n++] = path;
  for (int i = 0; args && args[i] && n < 63; i++) argv[n++] = args[i];
  argv[n] = NULL;
  return vs__spawn(path, argv, log);
}

int vs_wait_pid(pid_t pid, int timeout_ms) {
  double end = vs_harness_now() + timeout_ms / 1000.0;
  for (;;) {
    int st;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r < 0) return -2;
    if (vs_harness_now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    vs_harness_sleep_ms(5);
  }
}

int vs_run_tool(const char *tool, const char *const *args, char *out, size_t outlen) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", vs_harness_build(), tool);
  int pipefd[2];
  assert_int_equal(pipe(pipefd), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(pipefd[1], 1);
    close(pipefd[0]);
    close(pipefd[1]);
    const char *argv[64];
    int n = 0;
    argv[n++] = path;
    for (int i = 0; args && args[i] && n < 63; i++) argv[n++] = args[i];
    argv[n] = NULL;
    execv(path, (char *const *)argv);
    _exit(127);
  }
  close(pipefd[1]);
  size_t used = 0;
  char buf[4096];
  ssize_t r;
  while ((r = read(pipefd[0], buf, sizeof buf)) > 0) {
    if (out && used + 1 < outlen) {
      size_t k = (size_t)r < outlen - 1 - used ? (size_t)r : outlen - 1 - used;
      memcpy(out + used, buf, k);
      used += k;
    }
  }
  if (out && outlen) out[used] = 0;
  close(pipefd[0]);
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void vs_daemon_dump_log(const vs_daemon *d) {
  FILE *f = fopen(d->log, "r");
  if (!f) return;
  char lines[40][400];
  int n = 0;
  while (fgets(lines[n % 40], sizeof lines[0], f)) n++;
  fclose(f);
  fprintf(stderr, "---- last lines of %s ----\n", d->log);
  for (int i = n > 40 ? n - 40 : 0; i < n; i++) fputs(lines[i % 40], stderr);
}

int vs_daemon_alive(const vs_daemon *d) {
  int st;
  return d->pid > 0 && waitpid(d->pid, &st, WNOHANG) == 0;
}

void vs_daemon_finish(vs_daemon *d, vs_fixture *f) {
  if (d->pid > 0 && vs_daemon_stop(d, SIGTERM, 30000) != 0) vs_daemon_dump_log(d);
  vs_fixture_remove(f);
}

vs_daemon_fixture *vs_daemon_fixture_start(const char *name) {
  vs_daemon_fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  vs_fixture_make(&f->fx);
  vs_daemon_start(&f->d, &f->fx, name, NULL);
  return f;
}

void vs_daemon_fixture_stop(vs_daemon_fixture *f) {
  vs_daemon_finish(&f->d, &f->fx);
  free(f);
}

void vs_daemon_start(vs_daemon *d, const vs_fixture *f, const char *name,
                     const char *const *extra) {
  memset(d, 0, sizeof *d);
  snprintf(d->name, sizeof d->name, "%s", name);
  snprintf(d->job_ep, sizeof d->job_ep, "ipc://%s/%s-job.sock", f->dir, name);
  snprintf(d->admin_ep, sizeof d->admin_ep, "ipc://%s/%s-admin.sock", f->dir, name);
  snprintf(d->log, sizeof d->log, "%s/%s.log", f->dir, name);
  char micro[1200], self[300];
  snprintf(micro, sizeof micro, "micro=%s", f->micro_model);
  snprintf(self, sizeof self, "self=%s", f->self_model);
  const char *args[48] = {"--endpoint", d->job_ep, "--admin", d->admin_ep, "--plugins",
                          f->plugins, "--model", micro, "--model", self, "--set",
                          "models.fmnist=", "--default-model", "micro", "--threads", "1",
                          "--node", name, "--log-level", "debug",
                          /* a rule named without a size keeps the scheduler's defaults: tuning
                           * size=auto would add a second or more to each test that submits
                           * one; tests of size=auto turn it back on with an extra --set */
                          "--set", "defaults.auto_size=false"};
  int n = 22;
  for (int i = 0; extra && extra[i] && n < 47; i++) args[n++] = extra[i];
  args[n] = NULL;
  d->pid = vs_spawn_tool("vspecd", args, d->log);
  /* Ready when it answers a ping on the admin endpoint. */
  double end = vs_harness_now() + 30;
  vs_conn c;
  vs_client_open(&c, d->admin_ep);
  for (;;) {
    if (vs_client_ping(&c, 200, NULL, 0)) break;
    if (!vs_daemon_alive(d) || vs_harness_now() > end) {
      vs_conn_close(&c);
      vs_daemon_dump_log(d);
      fail_msg("vspecd '%s' did not come up", name);
    }
  }
  vs_conn_close(&c);
}

int vs_daemon_stop(vs_daemon *d, int sig, int timeout_ms) {
  if (d->pid <= 0) return -2;
  kill(d->pid, sig);
  int rc = vs_wait_pid(d->pid, timeout_ms);
  d->pid = 0;
  return rc;
}

void vs_client_open(vs_conn *c, const char *ep) {
  char err[512];
  if (vs_conn_open(c, ep, NULL, err, sizeof err)) fail_msg("%s", err);
}

uint64_t vs_client_submit(vs_conn *c, Vspec__Submit *s) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  r.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  r.submit = s;
  char err[512];
  if (vs_conn_send(c, &r, NULL, 0, err, sizeof err)) fail_msg("%s", err);
  return r.request_id;
}

void vs_client_next(vs_conn *c, int timeout_ms, vs_conn_event *e) {
  double end = vs_harness_now() + timeout_ms / 1000.0;
  for (;;) {
    int left = (int)((end - vs_harness_now()) * 1000);
    if (left <= 0) fail_msg("no event within %d ms", timeout_ms);
    char err[512];
    int rc = vs_conn_recv(c, left, e, err, sizeof err);
    if (rc < 0) fail_msg("receive: %s", err);
    if (rc == 0) continue;
    if (e->ev->body_case == VSPEC__EVENT__BODY_HEARTBEAT) {
      vs_conn_event_free(e);
      continue;
    }
    return;
  }
}

int vs_client_until_end(vs_conn *c, uint64_t rid, uint64_t *job, int timeout_ms,
                        vs_conn_event *e) {
  int n = 0, first = 1;
  uint64_t expect_seq = 0;
  double end = vs_harness_now() + timeout_ms / 1000.0;
  for (;;) {
    int left = (int)((end - vs_harness_now()) * 1000);
    if (left <= 0) fail_msg("job %llu did not end within %d ms", (unsigned long long)*job,
                            timeout_ms);
    vs_client_next(c, left, e);
    Vspec__Event *ev = e->ev;
    int ours = (*job && ev->has_job_id && ev->job_id == *job) ||
               (!*job && ev->has_request_id && ev->request_id == rid);
    if (!ours) {
      vs_conn_event_free(e);
      continue;
    }
    if (ev->has_job_id) {
      if (!*job) *job = ev->job_id;
      assert_true(ev->has_seq);
      /* Events already read by the caller were numbered before this one. */
      if (first) expect_seq = ev->seq;
      first = 0;
      assert_int_equal(ev->seq, expect_seq);
      expect_seq++;
    }
    if (ev->body_case == VSPEC__EVENT__BODY_RESULT || ev->body_case == VSPEC__EVENT__BODY_ERROR)
      return n;
    n++;
    vs_conn_event_free(e);
  }
}

void vs_client_cancel(vs_conn *c, uint64_t job) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Cancel cc = VSPEC__CANCEL__INIT;
  cc.job_id = job;
  r.body_case = VSPEC__REQUEST__BODY_CANCEL;
  r.cancel = &cc;
  char err[512];
  if (vs_conn_send(c, &r, NULL, 0, err, sizeof err)) fail_msg("%s", err);
}

void vs_client_credit(vs_conn *c, uint64_t job, uint32_t grant) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Credit cc = VSPEC__CREDIT__INIT;
  cc.job_id = job;
  cc.grant = grant;
  r.body_case = VSPEC__REQUEST__BODY_CREDIT;
  r.credit = &cc;
  char err[512];
  if (vs_conn_send(c, &r, NULL, 0, err, sizeof err)) fail_msg("%s", err);
}

int vs_client_ping(vs_conn *c, int timeout_ms, char *node, size_t cap) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Ping p = VSPEC__PING__INIT;
  r.body_case = VSPEC__REQUEST__BODY_PING;
  r.ping = &p;
  vs_conn_event e;
  char err[512];
  if (vs_conn_call(c, &r, timeout_ms, &e, err, sizeof err) != 1) return 0;
  int pong = e.ev->body_case == VSPEC__EVENT__BODY_PONG;
  if (pong && node) snprintf(node, cap, "%s", e.ev->pong->node ? e.ev->pong->node : "");
  vs_conn_event_free(&e);
  return pong;
}

void vs_client_status(const char *admin_ep, vs_conn_event *e) {
  vs_conn c;
  vs_client_open(&c, admin_ep);
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__StatusRequest s = VSPEC__STATUS_REQUEST__INIT;
  r.body_case = VSPEC__REQUEST__BODY_STATUS;
  r.status = &s;
  char err[512];
  int rc = vs_conn_call(&c, &r, 10000, e, err, sizeof err);
  if (rc != 1) fail_msg("status: %s", rc ? err : "timeout");
  assert_int_equal(e->ev->body_case, VSPEC__EVENT__BODY_STATUS);
  /* The event's frames stay valid after the socket closes. */
  vs_conn_close(&c);
}
