/*
 * bench/daemon_jobs.h - jobs submitted to a vspecd by a benchmark, as the CLI submits them
 * (progress streamed and acknowledged with credit), with their latencies and the worker's own
 * timings. Used by vspecd-bench (bench/daemon_bench.c, bench/daemon_batch.c).
 */
#ifndef VS_BENCH_DAEMON_JOBS_H
#define VS_BENCH_DAEMON_JOBS_H

#include <stdint.h>

#include "client/conn.h"

typedef struct vs_bench_jobres {
  double latency, generate_s, preview_s, decode_s;
  int previews;
} vs_bench_jobres;

/* Nonzero: jobs are submitted without progress events (vspecd-bench --no-progress). */
extern int vs_bench_jobs_no_progress;

/* Runs `total` jobs (seeds seed0, seed0 + 1, ..., class cls) with `inflight` in flight on
 * connection c; fills res[total] in completion order. preview: a VSPEC__PREVIEW_KIND_* or 0.
 * Returns the wall time, or < 0 on failure (message on stderr). */
double vs_bench_run_jobs(vs_conn *c, int total, int inflight, uint64_t seed0, int cls,
                         const char *method, int preview, vs_bench_jobres *res);

#endif /* VS_BENCH_DAEMON_JOBS_H */
