#include "tests/support/redis_fixture.h"

#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/support/daemon_harness.h"

/* $VSPEC_REDIS_SERVER names the binary when set (one that is not there: skipped); else PATH. */
static int vs__find_server(char *out, size_t cap) {
  const char *env = getenv("VSPEC_REDIS_SERVER");
  if (env) {
    snprintf(out, cap, "%s", env);
    return *env && access(out, X_OK) == 0;
  }
  const char *path = getenv("PATH");
  char buf[4096];
  snprintf(buf, sizeof buf, "%s:/usr/bin:/usr/sbin", path ? path : "");
  for (char *save = NULL, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
    snprintf(out, cap, "%s/redis-server", *d ? d : ".");
    if (access(out, X_OK) == 0) return 1;
  }
  return 0;
}

void vs_redis_dump_log(const vs_redis_fx *f) {
  FILE *in = fopen(f->log, "r");
  if (!in) return;
  char line[512];
  while (fgets(line, sizeof line, in)) print_message("redis: %s", line);
  fclose(in);
}

/* Waits (bounded) until the socket accepts connections: the file alone says nothing, a
 * killed server leaves its socket file behind. */
static void vs__wait_ready(vs_redis_fx *f) {
  double end = vs_harness_now() + 5.0;
  for (;;) {
    int status;
    if (waitpid(f->pid, &status, WNOHANG) == f->pid) {
      f->pid = 0;
      vs_redis_dump_log(f);
      fail_msg("redis-server exited at start (status %d)", status);
    }
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", f->sock);
    int ok = connect(s, (struct sockaddr *)&a, sizeof a) == 0;
    close(s);
    if (ok) return;
    if (vs_harness_now() > end) {
      kill(f->pid, SIGKILL);
      waitpid(f->pid, NULL, 0);
      f->pid = 0;
      vs_redis_dump_log(f);
      fail_msg("redis-server did not listen on %s within 5 s", f->sock);
    }
    vs_harness_sleep_ms(5);
  }
}

void vs_redis_start(vs_redis_fx *f) {
  pid_t parent = getpid();
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* Dies with the test, however the test dies (the check after it closes the race with a
     * parent that was already gone). */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int fd = open(f->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execl(f->server, f->server, "--port", "0", "--unixsocket", f->sock, "--unixsocketperm",
          "700", "--save", "", "--appendonly", f->aof ? "yes" : "no", "--appendfsync",
          "always", "--daemonize", "no", "--dir", f->dir, (char *)NULL);
    _exit(127);
  }
  f->pid = pid;
  vs__wait_ready(f);
}

void vs_redis_kill(vs_redis_fx *f) {
  if (f->pid <= 0) return;
  kill(f->pid, SIGKILL);
  assert_int_equal(vs_wait_pid(f->pid, 3000), 128 + SIGKILL);
  f->pid = 0;
}

void vs_redis_stop(vs_redis_fx *f) {
  if (f->pid <= 0) return;
  kill(f->pid, SIGCONT); /* a test may have left it stopped */
  kill(f->pid, SIGTERM);
  if (vs_wait_pid(f->pid, 2000) < 0) /* vs_wait_pid SIGKILLs and reaps it after that */
    print_message("redis-server %d did not stop on SIGTERM\n", (int)f->pid);
  f->pid = 0;
}

vs_redis_fx *vs_redis_fx_open(int aof) {
  vs_redis_fx *f = calloc(1, sizeof *f);
  assert_non_null(f);
  if (!vs__find_server(f->server, sizeof f->server)) {
    free(f);
    return NULL;
  }
  snprintf(f->dir, sizeof f->dir, "/tmp/vspec-redis-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  snprintf(f->sock, sizeof f->sock, "%s/redis.sock", f->dir);
  snprintf(f->url, sizeof f->url, "unix://%s", f->sock);
  snprintf(f->log, sizeof f->log, "%s/redis.log", f->dir);
  f->aof = aof;
  vs_redis_start(f);
  return f;
}

/* Everything in the directory, one level of subdirectories included (appendonlydir). */
static void vs__rm_tree(const char *dir, int depth) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[400];
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      if (unlink(p) && depth < 2) vs__rm_tree(p, depth + 1);
    }
  closedir(d);
  rmdir(dir);
}

void vs_redis_fx_close(vs_redis_fx **fp) {
  if (!fp || !*fp) return;
  vs_redis_stop(*fp);
  vs__rm_tree((*fp)->dir, 0);
  free(*fp);
  *fp = NULL;
}
