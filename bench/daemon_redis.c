#include "bench/daemon_redis.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "bench/bench.h"

/* $VSPEC_REDIS_SERVER names the binary when set; else the first redis-server on PATH. */
static int dr_find_server(char *out, size_t cap) {
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

/* "Redis server v=7.0.15 sha=..." -> "7.0.15": for the report, "?" when it cannot tell. */
static void dr_version(vs_bench_redis *r) {
  snprintf(r->version, sizeof r->version, "?");
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "'%s' --version 2>/dev/null", r->proc.path);
  FILE *f = popen(cmd, "r");
  if (!f) return;
  char line[256];
  if (fgets(line, sizeof line, f)) {
    const char *v = strstr(line, "v=");
    if (v) sscanf(v + 2, "%31[0-9.]", r->version);
  }
  pclose(f);
}

int vs_bench_redis_init(vs_bench_redis *r, const char *dir, const char *appendfsync, char *err,
                        size_t errlen) {
  memset(r, 0, sizeof *r);
  if (!dr_find_server(r->proc.path, sizeof r->proc.path)) {
    const char *env = getenv("VSPEC_REDIS_SERVER");
    if (env)
      snprintf(err, errlen, "VSPEC_REDIS_SERVER=%s is not an executable file", env);
    else
      snprintf(err, errlen, "redis-server not found on PATH (make deps installs it; or set "
               "VSPEC_REDIS_SERVER=/path/to/redis-server)");
    return -1;
  }
  snprintf(r->dir, sizeof r->dir, "%s", dir);
  snprintf(r->sock, sizeof r->sock, "%s/redis.sock", dir);
  snprintf(r->url, sizeof r->url, "unix://%s", r->sock);
  snprintf(r->proc.log, sizeof r->proc.log, "%s/redis.log", dir);
  snprintf(r->appendfsync, sizeof r->appendfsync, "%s", appendfsync);
  if (strlen(r->sock) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
    snprintf(err, errlen, "the socket path %s is too long for a unix socket", r->sock);
    return -1;
  }
  dr_version(r);
  return 0;
}

int vs_bench_redis_spawn(vs_bench_redis *r) {
  /* No RDB snapshots: the append-only file alone is what a restart loads. */
  const char *args[] = {"--port", "0", "--unixsocket", r->sock, "--unixsocketperm", "700",
                        "--save", "", "--appendonly", "yes", "--appendfsync", r->appendfsync,
                        "--daemonize", "no", "--dir", r->dir, NULL};
  return vs_bench_proc_spawn(&r->proc, args);
}

/* The socket file alone says nothing: a killed server leaves it behind. */
int vs_bench_redis_listening(const vs_bench_redis *r) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return 0;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", r->sock);
  int ok = connect(s, (struct sockaddr *)&a, sizeof a) == 0;
  close(s);
  return ok;
}

int vs_bench_redis_start(vs_bench_redis *r, double timeout_s, char *err, size_t errlen) {
  if (vs_bench_redis_spawn(r)) {
    snprintf(err, errlen, "cannot fork redis-server");
    return -1;
  }
  double end = vs_bench_now() + timeout_s;
  while (!vs_bench_redis_listening(r)) {
    if (vs_bench_proc_exited(&r->proc)) {
      snprintf(err, errlen, "redis-server exited at start (see %s)", r->proc.log);
      return -1;
    }
    if (vs_bench_now() > end) {
      vs_bench_redis_kill(r);
      snprintf(err, errlen, "redis-server did not listen on %s within %.0f s (see %s)", r->sock,
               timeout_s, r->proc.log);
      return -1;
    }
    usleep(5000);
  }
  return 0;
}

void vs_bench_redis_kill(vs_bench_redis *r) { vs_bench_proc_stop(&r->proc, SIGKILL, 3000); }

void vs_bench_redis_stop(vs_bench_redis *r) { vs_bench_proc_stop(&r->proc, SIGTERM, 2000); }
