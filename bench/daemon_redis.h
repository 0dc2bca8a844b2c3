/*
 * bench/daemon_redis.h - a redis-server of its own for a benchmark of fleet mode: a unix
 * socket in a private directory (never a shared server, no TCP port), append-only file on,
 * killed with the benchmark however it dies. The tests have their own, cmocka-based, in
 * tests/support/redis_fixture.c; this one reports failures instead of asserting.
 */
#ifndef VS_BENCH_DAEMON_REDIS_H
#define VS_BENCH_DAEMON_REDIS_H

#include <stddef.h>

#include "bench/daemon_proc.h"

typedef struct vs_bench_redis {
  vs_bench_proc proc;   /* path: the redis-server binary; log: dir/redis.log */
  char dir[200];        /* its working directory: the socket, appendonlydir */
  char sock[260];
  char url[300];        /* unix://<sock>, for --set fleet.redis and --redis */
  char appendfsync[16]; /* "always" or "everysec" */
  char version[32];     /* "7.0.15", or "?" */
} vs_bench_redis;

/* Finds redis-server ($VSPEC_REDIS_SERVER when set, else PATH, then /usr/bin, /usr/sbin) and
 * fills the paths under dir (an existing directory). Returns 0, or -1 with a message in err
 * that says how to get one. */
int vs_bench_redis_init(vs_bench_redis *r, const char *dir, const char *appendfsync, char *err,
                        size_t errlen);
/* Starts the server (again: it loads its append-only file) and waits up to timeout_s for the
 * socket to accept connections. Returns 0 or -1 (message in err). */
int vs_bench_redis_start(vs_bench_redis *r, double timeout_s, char *err, size_t errlen);
/* Starts it without waiting: clients see it come up. Returns 0 or -1. */
int vs_bench_redis_spawn(vs_bench_redis *r);
/* 1 when the socket accepts a connection now. */
int vs_bench_redis_listening(const vs_bench_redis *r);
/* SIGKILL (a crash as its clients see it), reaped. */
void vs_bench_redis_kill(vs_bench_redis *r);
/* SIGTERM, SIGKILL after 2 s. */
void vs_bench_redis_stop(vs_bench_redis *r);

#endif /* VS_BENCH_DAEMON_REDIS_H */
