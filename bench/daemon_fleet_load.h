/*
 * bench/daemon_fleet_load.h - the load of vspecd-fleet-bench's throughput runs: `jobs` jobs
 * from two client connections, one per gateway, `in_flight` in flight each, every job with a
 * random client-chosen job id (Submit.job_id), progress streamed and credit granted as the
 * vspec CLI does. With chaos, while it runs:
 *
 *   after 1/4 of the jobs ended, SIGKILL of the daemon that holds most jobs (Redis's view),
 *     started again (same name, same endpoints);
 *   after 1/2, SIGKILL of gateway 0, started again; its client resubmits every unfinished
 *     job (the same submit, the same job id) through gateway 1 and goes on there;
 *   after 3/4, SIGKILL of redis-server, started again from its append-only file redis_down_s
 *     later; submits answered unavailable (or busy) meanwhile are sent again, the same,
 *     after VS_BENCH_LOAD_RETRY_MS.
 *
 * Each kill comes right after a job ended and before its replacement is submitted, so that
 * the replacement meets the failure. At the end: every job must have ended exactly once at
 * its client, with a result, and the jobs stream must be empty with nothing pending.
 */
#ifndef VS_BENCH_DAEMON_FLEET_LOAD_H
#define VS_BENCH_DAEMON_FLEET_LOAD_H

#include <signal.h>

#include "bench/daemon_fleet.h"

#define VS_BENCH_LOAD_RETRY_MS 100

typedef struct vs_bench_load_opts {
  int jobs, in_flight, chaos;
  double redis_down_s;  /* chaos: how long redis-server stays down */
  double stall_s;       /* no job ended for this long: the rest are counted lost */
  uint64_t seed0;       /* job i: seed seed0 + i, class i mod 10 */
  const char *method;
  const volatile sig_atomic_t *stop; /* set by a signal: end the run (jobs left: lost) */
} vs_bench_load_opts;

/* What happened during a chaos run (times from the start of the run, s). */
typedef struct vs_bench_chaos_log {
  char daemon[16];
  int daemon_at, gateway_at, redis_at; /* jobs ended when each was killed (-1: not reached) */
  double daemon_t, gateway_t, redis_t;
  double redis_restart_t, redis_up_t; /* started again; accepting connections again */
  int daemon_jobs;   /* jobs the killed daemon held in Redis (delivered, not acked) */
  int gateway_jobs;  /* unfinished jobs of the killed gateway's client */
} vs_bench_chaos_log;

typedef struct vs_bench_load_result {
  int jobs, ended, results, errors, lost, duplicated;
  int restarted;    /* jobs whose client saw a Restarted event */
  int resubmitted;  /* jobs sent again through the other gateway */
  int retried_jobs, unavailable, busy; /* submits answered unavailable / busy and sent again */
  double wall_s, jobs_per_s, p50_s, p99_s; /* latency: first submit to result */
  long long left, pending; /* the jobs stream at the end (-1: Redis did not tell) */
  double drain_s;          /* from the last result until the stream was seen empty (or
                              given up on); the first look comes after VS__DUP_WAIT_MS */
  int runs; /* daemons' Accepted events over all jobs' events in Redis: a run each */
  int ran_again, ran_again_unexplained; /* from the jobs' events in Redis: jobs with the
                                            Accepted of more than one daemon; of those, jobs
                                            with fewer Restarted events than extra runs */
  int stalled, interrupted;
  char first_error[256];   /* the first job error, or why the run stopped */
  vs_bench_chaos_log chaos;
} vs_bench_load_result;

/* Runs the load. Returns 0 when the run went to its end (whether it passed is in *res:
 * vs_bench_load_passed), -1 when it could not run (message in err). */
int vs_bench_load_run(vs_bench_fleet *f, const vs_bench_load_opts *o, vs_bench_load_result *res,
                      char *err, size_t errlen);
/* 1 when no job was lost, duplicated at its client or failed, and nothing was left in the
 * stream; else 0 with the reasons in why. */
int vs_bench_load_passed(const vs_bench_load_result *res, char *why, size_t whylen);

#endif /* VS_BENCH_DAEMON_FLEET_LOAD_H */
