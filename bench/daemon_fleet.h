/*
 * bench/daemon_fleet.h - a fleet of its own for vspecd-fleet-bench: a redis-server
 * (bench/daemon_redis.h), VS_BENCH_FLEET_DAEMONS vspecd in fleet mode on one model and
 * VS_BENCH_FLEET_GATEWAYS vspec-gateway, every one from the build directory of the running
 * program, on unix sockets in private temporary directories, and every one SIGKILLed with
 * the benchmark however it dies (no strays). Members can be killed and started again one by
 * one: that is what the chaos run does.
 */
#ifndef VS_BENCH_DAEMON_FLEET_H
#define VS_BENCH_DAEMON_FLEET_H

#include <stddef.h>

#include "bench/daemon_proc.h"
#include "bench/daemon_redis.h"
#include "fleet/fleet_queue.h"

#define VS_BENCH_FLEET_DAEMONS 3
#define VS_BENCH_FLEET_GATEWAYS 2

typedef struct vs_bench_fleet_opts {
  const char *model_dir;   /* absolute */
  int workers, threads;    /* per daemon */
  int claim_idle_ms;       /* [fleet] claim_idle_ms of every daemon */
  const char *appendfsync; /* redis-server's: "always" or "everysec" */
} vs_bench_fleet_opts;

typedef struct vs_bench_fleet {
  vs_bench_fleet_opts o;
  char dir[128]; /* redis-server's directory; the gateways' sockets and logs */
  vs_bench_redis redis;
  vs_bench_daemon d[VS_BENCH_FLEET_DAEMONS];
  char d_name[VS_BENCH_FLEET_DAEMONS][16]; /* d0, d1, ...: the consumer names */
  vs_bench_proc gw[VS_BENCH_FLEET_GATEWAYS];
  char gw_ep[VS_BENCH_FLEET_GATEWAYS][200];
  char gw_name[VS_BENCH_FLEET_GATEWAYS][16]; /* gw0, gw1: Accepted.node of a gateway */
  vs_fleet_queue *q; /* the benchmark's own connection: queue depth, a job's events */
} vs_bench_fleet;

/* Starts everything (the daemons load the model) and waits until each answers. Returns 0,
 * or -1 with a message in err (what did start is stopped by vs_bench_fleet_stop). */
int vs_bench_fleet_start(vs_bench_fleet *f, const vs_bench_fleet_opts *o, char *err,
                         size_t errlen);
/* (Re)starts daemon i or gateway i without waiting for it: its clients see it come back. */
int vs_bench_fleet_spawn_daemon(vs_bench_fleet *f, int i);
int vs_bench_fleet_spawn_gateway(vs_bench_fleet *f, int i);
/* The index of the daemon named `node`, or -1. */
int vs_bench_fleet_daemon_index(const vs_bench_fleet *f, const char *node);
/* 1 when `node` is one of the gateways' names (their Accepted comes first in each job). */
int vs_bench_fleet_is_gateway(const vs_bench_fleet *f, const char *node);
/* The jobs each daemon holds as Redis sees it (XPENDING's summary: delivered to it and not
 * acknowledged), into held[VS_BENCH_FLEET_DAEMONS]. Returns 0 or -1 (message in err). */
int vs_bench_fleet_held(vs_bench_fleet *f, int *held, char *err, size_t errlen);
/* Every member answers (daemons and gateways a ping, Redis a connection), waiting up to
 * timeout_s for those that were just started again. Returns 0, or -1 naming the first that
 * does not in err. */
int vs_bench_fleet_check_up(vs_bench_fleet *f, double timeout_s, char *err, size_t errlen);
/* Waits up to timeout_s for the jobs stream to be empty, nothing pending (each job's ack may
 * still be on its way when its result reached the client, or waiting out a daemon's Redis
 * backoff). Fills the last length and pending count seen and the time it took. Returns 0
 * when drained, 1 when not, -1 when Redis could not tell (message in err). */
int vs_bench_fleet_drained(vs_bench_fleet *f, double timeout_s, long long *length,
                           long long *pending, double *took_s, char *err, size_t errlen);
/* The tail of every member's log on stderr (after a failure). */
void vs_bench_fleet_dump_logs(const vs_bench_fleet *f);
/* Stops everything (gateways, daemons, then Redis) and removes the temporary directories
 * (keep: leaves them, logs and append-only file, and names them on stderr). Returns 0, or -1
 * if a directory could not be removed. */
int vs_bench_fleet_stop(vs_bench_fleet *f, int keep);

#endif /* VS_BENCH_DAEMON_FLEET_H */
