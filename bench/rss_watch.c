/*
 * bench/rss_watch.c - a daemon's VmRSS sampled over a run, and the bound the soaks hold it to
 * (rss_watch.h).
 */
#include "bench/rss_watch.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"

#define MEDIAN_OF 5 /* samples at each end of the growth */

long vs_rss_kb(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb;
}

static void take(vs_rss_watch *w, double t0) {
  long kb = vs_rss_kb(w->pid);
  if (kb <= 0) return;
  pthread_mutex_lock(&w->mu);
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 1024;
    vs_rss_sample *p = realloc(w->s, (size_t)cap * sizeof *p);
    if (p) w->s = p, w->cap = cap;
  }
  if (w->n < w->cap)
    w->s[w->n++] = (vs_rss_sample){vs_bench_now() - t0, atomic_load(w->done), kb};
  pthread_mutex_unlock(&w->mu);
}

static void *watch_main(void *arg) {
  vs_rss_watch *w = arg;
  double t0 = vs_bench_now();
  while (!atomic_load(&w->stop)) {
    take(w, t0);
    /* in steps of at most 50 ms, so that a stop never waits a whole period */
    for (long slept = 0; slept < w->period_ms && !atomic_load(&w->stop); slept += 50)
      usleep((useconds_t)(w->period_ms - slept < 50 ? w->period_ms - slept : 50) * 1000);
  }
  take(w, t0);
  return NULL;
}

int vs_rss_watch_start(vs_rss_watch *w, pid_t pid, long period_ms, const atomic_long *done) {
  memset(w, 0, sizeof *w);
  w->pid = pid, w->period_ms = period_ms, w->done = done;
  pthread_mutex_init(&w->mu, NULL);
  if (pthread_create(&w->thread, NULL, watch_main, w)) return -1;
  w->running = 1;
  return 0;
}

void vs_rss_watch_stop(vs_rss_watch *w) {
  if (!w->running) return;
  atomic_store(&w->stop, 1);
  pthread_join(w->thread, NULL);
  w->running = 0;
}

void vs_rss_watch_free(vs_rss_watch *w) {
  vs_rss_watch_stop(w);
  free(w->s);
  w->s = NULL;
  w->n = w->cap = 0;
  pthread_mutex_destroy(&w->mu);
}

static int cmp_long(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return (x > y) - (x < y);
}

/* The median kB of samples [from, from + k) (k <= MEDIAN_OF). */
static long median_kb(const vs_rss_sample *s, int from, int k) {
  long v[MEDIAN_OF];
  for (int i = 0; i < k; i++) v[i] = s[from + i].kb;
  qsort(v, (size_t)k, sizeof *v, cmp_long);
  return v[k / 2];
}

/* Least-squares slope of kB against work done over samples [from, n). */
static double slope(const vs_rss_sample *r, int from, int n) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  int m = n - from;
  if (m < 2) return 0;
  for (int i = from; i < n; i++) {
    sx += (double)r[i].done, sy += (double)r[i].kb;
    sxx += (double)r[i].done * (double)r[i].done, sxy += (double)r[i].done * (double)r[i].kb;
  }
  double den = m * sxx - sx * sx;
  return den > 0 ? (m * sxy - sx * sy) / den : 0;
}

int vs_rss_summarize(vs_rss_watch *w, long warm_done, vs_rss_summary *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&w->mu);
  int n = w->n, warm = 0;
  while (warm < n - 1 && w->s[warm].done < warm_done) warm++;
  if (n - warm < 2) {
    pthread_mutex_unlock(&w->mu);
    return -1;
  }
  out->n = n, out->warm = warm;
  out->first = w->s[0], out->at_warm = w->s[warm], out->last = w->s[n - 1];
  for (int i = 0; i < n; i++) out->max_kb = w->s[i].kb > out->max_kb ? w->s[i].kb : out->max_kb;
  /* the two windows may overlap on a short run; they never reach before the warm-up */
  int k = n - warm < MEDIAN_OF ? n - warm : MEDIAN_OF;
  out->warm_kb = median_kb(w->s, warm, k);
  out->end_kb = median_kb(w->s, n - k, k);
  out->growth_kb = out->end_kb - out->warm_kb;
  out->slope_kb_per_1000 = slope(w->s, warm, n) * 1000;
  pthread_mutex_unlock(&w->mu);
  return 0;
}

int vs_rss_report(FILE *f, vs_rss_watch *w, long warm_done, long bound_kb, const char *unit) {
  vs_rss_summary r;
  if (vs_rss_summarize(w, warm_done, &r)) {
    fprintf(f, "| daemon RSS | too few samples after the warm-up to tell (%d): **FAILED** |\n",
            w->n);
    return 1;
  }
  int over = r.growth_kb > bound_kb;
  fprintf(f, "| daemon RSS (%d samples, every %ld ms) | first %.1f MB; after the warm-up (%ld %s, "
          "%.0f s) %.1f MB; last %.1f MB (%ld %s, %.0f s); max %.1f MB |\n", r.n, w->period_ms,
          r.first.kb / 1024.0, r.at_warm.done, unit, r.at_warm.t, r.at_warm.kb / 1024.0,
          r.last.kb / 1024.0, r.last.done, unit, r.last.t, r.max_kb / 1024.0);
  fprintf(f, "| RSS growth after the warm-up | %+.1f MB (median of the last %d samples %.1f MB - "
          "median of %d from the warm-up on %.1f MB); bound %+.1f MB: **%s**; slope %+.3f MB "
          "per 1000 %s |\n", r.growth_kb / 1024.0, MEDIAN_OF, r.end_kb / 1024.0, MEDIAN_OF,
          r.warm_kb / 1024.0, bound_kb / 1024.0, over ? "EXCEEDED" : "within",
          r.slope_kb_per_1000 / 1024.0, unit);
  return over;
}

int vs_rss_write_csv(vs_rss_watch *w, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f, "seconds,done,rss_kb\n");
  pthread_mutex_lock(&w->mu);
  for (int i = 0; i < w->n; i++)
    fprintf(f, "%.3f,%ld,%ld\n", w->s[i].t, w->s[i].done, w->s[i].kb);
  pthread_mutex_unlock(&w->mu);
  return fclose(f) ? -1 : 0;
}
