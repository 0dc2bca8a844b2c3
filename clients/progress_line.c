#include "clients/progress_line.h"

#include <stdarg.h>
#include <unistd.h>

void vs_progress_line_init(vs_progress_line *p, FILE *f, int force_plain) {
  p->f = f;
  p->tty = !force_plain && isatty(fileno(f));
  p->live = 0;
  p->last_tenth = -1;
  p->job = 0;
}

static void vs__fmt_time(char *buf, size_t n, double s) {
  if (s < 60) snprintf(buf, n, "%.1fs", s);
  else snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
}

void vs_progress_line_update(vs_progress_line *p, unsigned done, unsigned total, double tpf,
                             double mal, double accept, double elapsed_s) {
  char el[32], eta[32] = "?", acc[32] = "", plain_acc[32] = "";
  if (accept >= 0) {
    snprintf(acc, sizeof acc, "  accept %.0f%%", 100.0 * accept);
    snprintf(plain_acc, sizeof plain_acc, ", accept %.0f%%", 100.0 * accept);
  }
  vs__fmt_time(el, sizeof el, elapsed_s);
  if (done > 0 && total >= done) vs__fmt_time(eta, sizeof eta, elapsed_s / done * (total - done));
  if (p->tty) {
    fprintf(p->f, "\r\033[K[job %llu] %u/%u tokens  TPF %.2f  MAL %.2f%s  %s  ETA %s", p->job,
            done, total, tpf, mal, acc, el, eta);
    fflush(p->f);
    p->live = 1;
    return;
  }
  int tenth = total ? (int)(10ull * done / total) : 0;
  if (tenth == p->last_tenth) return;
  p->last_tenth = tenth;
  fprintf(p->f, "job %llu: %u/%u tokens, TPF %.2f, MAL %.2f%s, %s elapsed, ETA %s\n", p->job,
          done, total, tpf, mal, plain_acc, el, eta);
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
