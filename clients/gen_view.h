/*
 * clients/gen_view.h - what `vspec generate` shows of its job.
 *
 * Text: the progress line (clients/progress_line.h) and notes on stderr. With --json: one
 * JSON object per event on stdout, and the last line is always the result or an error
 * object, whatever ended the command: the daemon's error, or one of this side's (a bad
 * command line, no daemon, a timeout, an interrupt, an output that could not be written),
 * each with a `code` and the exit status it ends with.
 */
#ifndef VS_GEN_VIEW_H
#define VS_GEN_VIEW_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "clients/progress_line.h"
#include "proto/wire.h"

/* The codes of this side's errors in --json error objects (the daemon's are
 * vs_wire_error_name's: "invalid", "busy", ...). */
#define VS_GEN_USAGE "usage"             /* bad command line (exit 2) */
#define VS_GEN_UNREACHABLE "unreachable" /* no daemon, or it cannot be talked to (exit 3) */
#define VS_GEN_TIMEOUT "timeout"         /* the daemon went silent (exit 3) */
#define VS_GEN_PROTOCOL "protocol"       /* a broken connection or message (exit 3) */
#define VS_GEN_OUTPUT "output"           /* the image could not be written (exit 1) */
#define VS_GEN_INTERRUPTED "interrupted" /* Ctrl-C or SIGTERM (exit 130) */

#define VS_GEN_MAX_NOTES 16

typedef struct vs_gen_view {
  FILE *out; /* the JSON lines */
  int json, quiet;
  vs_progress_line pl; /* the text view */
  unsigned long long job;
  unsigned long long seed;
  int has_seed;
  int drafting;       /* the method drafts (is not "ar"): its acceptance figures mean something */
  uint8_t *status;    /* TokenStatus per position, from the progress deltas */
  unsigned n_status;
  unsigned unverified; /* positions whose status is TOKEN_UNVERIFIED */
  char *notes[VS_GEN_MAX_NOTES]; /* the notices shown, so that Result.notes repeats none */
  int n_notes;
  int ended; /* the result or an error object was written */
} vs_gen_view;

/* What was written for the result. */
typedef struct vs_gen_written {
  const char *out;
  unsigned width, height;
  long upscale;
  double latency_s;
  int previews;
  const uint8_t *tokens; /* the token grid blob (int32 LE), or NULL */
  size_t tokens_len;
} vs_gen_written;

/* text: where the text view goes (stderr); mode: VS_PL_*. */
void vs_gen_view_init(vs_gen_view *v, FILE *out, FILE *text, int json, int quiet, int mode,
                      double now);
void vs_gen_view_free(vs_gen_view *v);

void vs_gen_show_accepted(vs_gen_view *v, const Vspec__Event *ev, double now);
void vs_gen_show_progress(vs_gen_view *v, const Vspec__Event *ev, double now);
void vs_gen_show_phase(vs_gen_view *v, const Vspec__Event *ev, double now);
void vs_gen_show_notice(vs_gen_view *v, const Vspec__Event *ev);
void vs_gen_show_restarted(vs_gen_view *v, const Vspec__Event *ev, double now);
/* path: the file the preview was written to, "" if none. */
void vs_gen_show_preview(vs_gen_view *v, const Vspec__Event *ev, const char *path);
void vs_gen_show_result(vs_gen_view *v, const Vspec__Result *r, const vs_gen_written *w);
/* The daemon's error event; status is the exit status it ends with (returned). */
int vs_gen_show_error(vs_gen_view *v, const Vspec__Error *x, int status);
/* This side's failure: "vspec: MESSAGE" on stderr and, with --json, an error object with
 * `code` (VS_GEN_*). Returns status. */
int vs_gen_fail(vs_gen_view *v, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* VS_GEN_VIEW_H */
