/*
 * bench/daemon_batch.h - vspecd-bench --batch: what cross-job batching ([workers] batch)
 * buys, three daemons side by side on one machine, runs interleaved.
 */
#ifndef VS_BENCH_DAEMON_BATCH_H
#define VS_BENCH_DAEMON_BATCH_H

typedef struct vs_batch_bench_opts {
  const char *prog;      /* the program's name, for messages and temporary directories */
  const char *model_dir; /* absolute */
  const char *method;
  int batch;  /* jobs per batched forward, and jobs in flight */
  int jobs;   /* jobs per measurement */
  int rounds; /* measurements per configuration */
  int cores;
  const char *precision; /* [device] precision of all three daemons, NULL = default */
  int lanes;             /* [workers] batch_lanes of the batched daemon */
  const char *device;    /* "cpu", "cuda" or "cuda:N"; NULL = cpu */
} vs_batch_bench_opts;

/* Prints a markdown section; returns 0, or 1 on failure (message on stderr). */
int vs_daemon_batch_bench(const vs_batch_bench_opts *o);

#endif /* VS_BENCH_DAEMON_BATCH_H */
