/*
 * clients/progress_line.h - how `vspec generate` shows a job's progress.
 *
 * On a terminal: one live line, redrawn in place, with tokens, TPF, MAL, elapsed time and an
 * ETA (elapsed / done * remaining: rounds get cheaper as the KV cache is filled, so it errs
 * on the long side). Otherwise plain lines, one per tenth of the image, so logs stay short.
 */
#ifndef VS_PROGRESS_LINE_H
#define VS_PROGRESS_LINE_H

#include <stdio.h>

typedef struct vs_progress_line {
  FILE *f;
  int tty;
  int live;         /* a live line is on screen */
  int last_tenth;
  unsigned long long job;
} vs_progress_line;

void vs_progress_line_init(vs_progress_line *p, FILE *f, int force_plain);
/* accept: the job's acceptance rate so far (accepted / draft tokens, DESIGN.md "Metrics"), or
 * negative when the daemon did not send one. */
void vs_progress_line_update(vs_progress_line *p, unsigned done, unsigned total, double tpf,
                             double mal, double accept, double elapsed_s);
/* A message on its own line (the live line is cleared first and redrawn by the next update). */
void vs_progress_line_note(vs_progress_line *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void vs_progress_line_end(vs_progress_line *p);

#endif /* VS_PROGRESS_LINE_H */
