/*
 * bench/rss_watch.h - a daemon's resident memory over a long run (issue 32, finding 8;
 * docs/RELIABILITY.md, "Soak"): VmRSS from /proc/PID/status sampled by a thread of its own,
 * each sample with the count of work done so far (jobs, requests), and the verdict the soaks
 * (vspecd-soak, vspecd-http-soak) fail on: growth after the warm-up within a stated bound.
 *
 * Why after a warm-up: the first jobs fill caches, arenas and (in the ASan build) the
 * quarantine, so RSS rises at first whatever the code; memory that creeps with the work shows
 * as growth once that settled. Growth is the median of the last 5 samples minus the median of
 * the 5 samples from the end of the warm-up on: a median, so that one sample taken while a
 * few jobs held their buffers (or had just freed them) moves neither end.
 */
#ifndef VS_BENCH_RSS_WATCH_H
#define VS_BENCH_RSS_WATCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/types.h>

typedef struct vs_rss_sample {
  double t;  /* seconds since the watch started */
  long done; /* work done when it was taken */
  long kb;   /* VmRSS */
} vs_rss_sample;

typedef struct vs_rss_watch {
  pid_t pid;
  long period_ms;
  const atomic_long *done; /* the caller's count of work done */
  atomic_int stop;
  pthread_t thread;
  int running;
  pthread_mutex_t mu; /* the samples */
  vs_rss_sample *s;
  int n, cap;
} vs_rss_watch;

/* What a run came to; growth_kb is what the bound applies to. */
typedef struct vs_rss_summary {
  int n, warm;          /* samples; index of the first one after the warm-up */
  vs_rss_sample first, at_warm, last;
  long max_kb;
  long warm_kb, end_kb; /* the medians growth is measured between */
  long growth_kb;
  double slope_kb_per_1000; /* least squares of kB against work done, after the warm-up */
} vs_rss_summary;

/* VmRSS of process pid in kB, or -1 (gone, no /proc). */
long vs_rss_kb(pid_t pid);

/* Starts sampling pid every period_ms; *done is read with each sample. Returns 0 or -1. */
int vs_rss_watch_start(vs_rss_watch *w, pid_t pid, long period_ms, const atomic_long *done);
/* Takes one last sample, stops and joins the thread (the samples stay). */
void vs_rss_watch_stop(vs_rss_watch *w);
void vs_rss_watch_free(vs_rss_watch *w);

/* The summary, the warm-up ending at the first sample with done >= warm_done. Returns 0, or
 * -1 with too few samples to tell (fewer than 2 after the warm-up). */
int vs_rss_summarize(vs_rss_watch *w, long warm_done, vs_rss_summary *out);

/* The report's rows (markdown, "| what | value |") and the verdict against bound_kb:
 * returns 1 when the growth after the warm-up exceeds it (or there was too little to tell),
 * else 0. `unit` names the work ("jobs", "requests"). */
int vs_rss_report(FILE *f, vs_rss_watch *w, long warm_done, long bound_kb, const char *unit);

/* Writes the samples as CSV (seconds,done,rss_kb). Returns 0 or -1. */
int vs_rss_write_csv(vs_rss_watch *w, const char *path);

#endif /* VS_BENCH_RSS_WATCH_H */
