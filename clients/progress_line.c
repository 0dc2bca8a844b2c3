/*
 * clients/progress_line.c - the live line (or plain lines) of `vspec generate`
 * (clients/progress_line.h).
 */
#include "clients/progress_line.h"

#include <stdarg.h>
#include <string.h>
#include <unistd.h>

void vs_progress_line_init(vs_progress_line *p, FILE *f, int mode, double now) {
  memset(p, 0, sizeof *p);
  p->f = f;
  p->tty = mode == VS_PL_LIVE || (mode == VS_PL_AUTO && isatty(fileno(f)));
  p->last_tenth = p->phase_tenth = -1;
  p->t0 = p->gen_t0 = now;
}

void vs_progress_line_pause(vs_progress_line *p, double now) { p->gen_t0 = now; }

void vs_progress_line_restart(vs_progress_line *p, double now) {
  p->gen_t0 = now;
  p->last_tenth = -1;
}

static void pl_fmt_time(char *buf, size_t n, double s) {
  if (s < 60) snprintf(buf, n, "%.1fs", s);
  else snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
}

/* "accept 3%" (or "accept -" when nothing is drafted), then the unverified share if any;
 * sep separates the figures (two spaces on the live line, a comma in plain lines). */
static void pl_fmt_accept(char *buf, size_t n, const vs_progress_figures *x, const char *sep) {
  int k = x->accept < 0 ? snprintf(buf, n, "%saccept -", sep)
                        : snprintf(buf, n, "%saccept %.0f%%", sep, 100.0 * x->accept);
  if (x->unverified > 0 && k > 0 && (size_t)k < n)
    snprintf(buf + k, n - (size_t)k, "%sunverified %.0f%%", sep, 100.0 * x->unverified);
}

/* Generation time so far: since the clock last restarted, or the daemon's own figure when
 * that is shorter (a daemon that reports no phase still knows when it started generating). */
static double pl_gen_time(const vs_progress_line *p, const vs_progress_figures *x,
                           double now) {
  double gen = now - p->gen_t0;
  if (x->gen_s > 0 && x->gen_s < gen) gen = x->gen_s;
  return gen;
}

void vs_progress_line_update(vs_progress_line *p, const vs_progress_figures *x, double now) {
  char el[32], eta[32] = "?", acc[64], plain_acc[64];
  pl_fmt_accept(acc, sizeof acc, x, "  ");
  pl_fmt_accept(plain_acc, sizeof plain_acc, x, ", ");
  pl_fmt_time(el, sizeof el, now - p->t0);
  if (x->done > 0 && x->total >= x->done)
    pl_fmt_time(eta, sizeof eta, pl_gen_time(p, x, now) / x->done * (x->total - x->done));
  p->phase[0] = 0;
  if (p->tty) {
    fprintf(p->f, "\r\033[K[job %llu] %u/%u tokens  TPF %.2f  MAL %.2f%s  %s  ETA %s", p->job,
            x->done, x->total, x->tpf, x->mal, acc, el, eta);
    fflush(p->f);
    p->live = 1;
    return;
  }
  int tenth = x->total ? (int)(10ull * x->done / x->total) : 0;
  if (tenth == p->last_tenth) return;
  p->last_tenth = tenth;
  fprintf(p->f, "job %llu: %u/%u tokens, TPF %.2f, MAL %.2f%s, %s elapsed, ETA %s\n", p->job,
          x->done, x->total, x->tpf, x->mal, plain_acc, el, eta);
}

void vs_progress_line_phase(vs_progress_line *p, const char *name, const char *message,
                            double done, double eta_s, double now) {
  char pct[16] = "", left[40] = "";
  if (!message) message = "";
  if (done >= 0) snprintf(pct, sizeof pct, " %.0f%%", 100.0 * (done > 1 ? 1 : done));
  if (eta_s >= 0 && (done < 0 || done < 1)) snprintf(left, sizeof left, " (%.0f s left)", eta_s);
  p->gen_t0 = now;
  if (p->tty) {
    fprintf(p->f, "\r\033[K[job %llu] %s%s%s", p->job, message, pct, left);
    fflush(p->f);
    p->live = 1;
    return;
  }
  /* Plain lines: a new phase, then one line per tenth of it (its message may change with
   * every event: "3 of 9", "4 of 9"; a phase of unknown length prints each new message). */
  const char *key = name && *name && done >= 0 ? name : message;
  int tenth = done >= 0 ? (int)(10.0 * (done > 1 ? 1 : done)) : -1;
  if (!strcmp(p->phase, key) && tenth == p->phase_tenth) return;
  snprintf(p->phase, sizeof p->phase, "%s", key);
  p->phase_tenth = tenth;
  fprintf(p->f, "job %llu: %s%s%s\n", p->job, message, pct, left);
}

void vs_progress_line_note(vs_progress_line *p, const char *fmt, ...) {
  if (p->live) fputs("\r\033[K", p->f);
  p->live = 0;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(p->f, fmt, ap);
  va_end(ap);
  fputc('\n', p->f);
}

void vs_progress_line_end(vs_progress_line *p) {
  if (p->live) fputs("\r\033[K", p->f);
  p->live = 0;
}
