/*
 * tests/support/redis_fixture.h - a private redis-server for one test: a unix socket in a
 * temporary directory, never a shared server, killed with the test however the test dies.
 *
 * Without redis-server (make deps installs it; $VSPEC_REDIS_SERVER may name another binary)
 * vs_redis_fx_open returns NULL and the test skips (VS_NEED_REDIS).
 */
#ifndef VS_TEST_REDIS_FIXTURE_H
#define VS_TEST_REDIS_FIXTURE_H

#include <sys/types.h>

typedef struct vs_redis_fx {
  char server[512]; /* the redis-server binary */
  char dir[64];
  char sock[128];
  char url[160]; /* unix://<sock> */
  char log[128];
  int aof;       /* appendonly yes, fsync always: acknowledged writes survive a kill */
  pid_t pid;
} vs_redis_fx;

/* A temporary directory and a server started in it (aof: see above); NULL without
 * redis-server. */
vs_redis_fx *vs_redis_fx_open(int aof);
/* Stops the server, removes the directory, frees f and sets *f to NULL. */
void vs_redis_fx_close(vs_redis_fx **f);

void vs_redis_start(vs_redis_fx *f);   /* (again) in the same directory, same socket */
void vs_redis_kill(vs_redis_fx *f);    /* SIGKILL: a crash as a client sees it */
void vs_redis_stop(vs_redis_fx *f);    /* SIGTERM, then SIGKILL after 2 s */
void vs_redis_dump_log(const vs_redis_fx *f);

#define VS_NEED_REDIS(fx)                                  \
  do {                                                     \
    if (!(fx)) {                                           \
      print_message("skipped: redis-server not found\n"); \
      skip();                                              \
    }                                                      \
  } while (0)

#endif /* VS_TEST_REDIS_FIXTURE_H */
