/*
 * clients/progress_line.h - how `vspec generate` shows a job's progress.
 *
 * On a terminal: one live line, redrawn in place, with tokens, TPF, MAL, the acceptance
 * figures, elapsed time and an ETA; while the job is in another phase (size=auto tuning, a
 * model loading, a fleet job waiting for another daemon) the line shows that phase instead.
 * Otherwise plain lines, one per tenth of the image (or of a phase), so logs stay short.
 *
 * The ETA counts generation only: its clock restarts whenever the job was seen not
 * generating (accepted, queued, in a phase, restarted on another daemon), so neither the
 * queue nor a tuning phase nor an abandoned run makes it read minutes for a job of seconds.
 * It is generation time so far / tokens done * tokens left: rounds get cheaper as the KV
 * cache is filled, so it errs on the long side.
 */
#ifndef VS_PROGRESS_LINE_H
#define VS_PROGRESS_LINE_H

#include <stdio.h>

enum { VS_PL_AUTO = 0, VS_PL_PLAIN, VS_PL_LIVE }; /* live line only on a terminal, or forced */

typedef struct vs_progress_line {
  FILE *f;
  int tty;
  int live;         /* a live line is on screen */
  int last_tenth;   /* plain mode: the tenth of the image last printed */
  unsigned long long job;
  double t0;        /* submitted: the elapsed time shown counts from here */
  double gen_t0;    /* the last time the job was seen not generating: the ETA's clock */
  char phase[200];  /* plain mode: the phase last printed (its name, else its message) */
  int phase_tenth;  /* and the tenth of it */
} vs_progress_line;

/* What one progress event says. */
typedef struct vs_progress_figures {
  unsigned done, total;
  double tpf, mal;
  double accept;     /* accepted / draft tokens so far; < 0: nothing is drafted (AR) */
  double unverified; /* share of the done tokens taken without verification (VVS); 0: none */
  double gen_s;      /* the daemon's generation time (Progress.elapsed_s); <= 0: unknown */
} vs_progress_figures;

void vs_progress_line_init(vs_progress_line *p, FILE *f, int mode, double now);
/* The job is not generating at `now` (accepted, queued, in a phase): the ETA counts from the
 * next progress on. */
void vs_progress_line_pause(vs_progress_line *p, double now);
/* The job runs again from its first token (fleet mode's Restarted): as pause, and plain mode
 * prints the tenths again. */
void vs_progress_line_restart(vs_progress_line *p, double now);
void vs_progress_line_update(vs_progress_line *p, const vs_progress_figures *x, double now);
/* A phase other than generation: its name ("tuning", may be NULL), its message, done (0..1,
 * < 0 unknown) and the seconds it should still take (< 0 unknown). Pauses the ETA's clock.
 * Plain mode prints a line when the phase changes and then per tenth done. */
void vs_progress_line_phase(vs_progress_line *p, const char *name, const char *message,
                            double done, double eta_s, double now);
/* A message on its own line (the live line is cleared first and redrawn by the next update). */
void vs_progress_line_note(vs_progress_line *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void vs_progress_line_end(vs_progress_line *p);

#endif /* VS_PROGRESS_LINE_H */
