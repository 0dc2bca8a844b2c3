/*
 * clients/gen_view.c - what `vspec generate` shows of its job (clients/gen_view.h).
 */
#include "clients/gen_view.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "clients/json_out.h"

void vs_gen_view_init(vs_gen_view *v, FILE *out, FILE *text, int json, int quiet, int mode,
                      double now) {
  memset(v, 0, sizeof *v);
  v->out = out;
  v->json = json;
  v->quiet = quiet;
  v->drafting = 1; /* until an Accepted names the method */
  vs_progress_line_init(&v->pl, text, mode, now);
}

void vs_gen_view_free(vs_gen_view *v) {
  free(v->status);
  v->status = NULL;
  for (int i = 0; i < v->n_notes; i++) free(v->notes[i]);
  v->n_notes = 0;
}

/* Text output is for people: none with --json (stdout is for programs then) or --quiet. */
static int gv_text(const vs_gen_view *v) { return !v->json && !v->quiet; }

static void gv_json_end(vs_gen_view *v) {
  fprintf(v->out, "}\n");
  fflush(v->out);
}

static void gv_json_opt(FILE *f, const char *key, int has, double x) {
  if (has) fprintf(f, ", \"%s\": %.4f", key, x);
  else fprintf(f, ", \"%s\": null", key);
}

void vs_gen_show_accepted(vs_gen_view *v, const Vspec__Event *ev, double now) {
  const Vspec__Accepted *a = ev->accepted;
  v->job = v->pl.job = ev->job_id;
  if (a->has_seed) {
    v->seed = a->seed;
    v->has_seed = 1;
  }
  if (a->method) v->drafting = strcmp(a->method, "ar") != 0;
  vs_progress_line_pause(&v->pl, now);
  if (v->json) {
    fprintf(v->out, "{\"event\": \"accepted\", \"job\": %llu, \"queue_position\": %u, \"model\": ",
            v->job, a->queue_position);
    vs__json_str(v->out, a->model);
    fprintf(v->out, ", \"method\": ");
    vs__json_str(v->out, a->method);
    fprintf(v->out, ", \"node\": ");
    vs__json_str(v->out, a->node);
    if (a->has_seed) fprintf(v->out, ", \"seed\": %llu", (unsigned long long)a->seed);
    else fprintf(v->out, ", \"seed\": null");
    if (a->has_class_label) {
      fprintf(v->out, ", \"class\": %d, \"class_name\": ", (int)a->class_label);
      vs__json_str(v->out, a->class_name);
    }
    gv_json_end(v);
  } else if (gv_text(v) && !a->model) {
    /* fleet mode: a gateway put the job in the queue; a daemon's Accepted follows */
    vs_progress_line_note(&v->pl, "job %llu queued by %s (%u job(s) waiting before it)", v->job,
                          a->node ? a->node : "?", a->queue_position);
  } else if (gv_text(v)) {
    char seed[40] = "", cls[100] = "";
    if (a->has_seed) snprintf(seed, sizeof seed, ", seed %llu", (unsigned long long)a->seed);
    /* the class a --prompt was taken as, or --class's name */
    if (a->has_class_label && a->class_name)
      snprintf(cls, sizeof cls, ", class %d (%s)", (int)a->class_label, a->class_name);
    else if (a->has_class_label)
      snprintf(cls, sizeof cls, ", class %d", (int)a->class_label);
    vs_progress_line_note(&v->pl, "job %llu accepted by %s: model %s, method %s%s%s, %u "
                          "tokens%s", v->job, a->node ? a->node : "?", a->model,
                          a->method ? a->method : "?", cls, seed, a->tokens_total,
                          a->queue_position ? ", queued" : "");
  }
}

/* Applies a progress delta to the status map (allocated at the first one): the unverified
 * count follows every change, and coalesced deltas carry the newest state. */
static void gv_track_status(vs_gen_view *v, const Vspec__Progress *p) {
  if (!v->status && p->tokens_total > 0 && p->tokens_total <= (1u << 24)) {
    v->status = calloc(p->tokens_total, 1);
    v->n_status = v->status ? p->tokens_total : 0;
  }
  size_t n = p->n_positions < p->n_status ? p->n_positions : p->n_status;
  for (size_t i = 0; v->status && i < n; i++) {
    uint32_t at = p->positions[i];
    if (at >= v->n_status) continue;
    uint8_t was = v->status[at], now = (uint8_t)p->status[i];
    v->unverified += (now == VSPEC__TOKEN_STATUS__TOKEN_UNVERIFIED) -
                     (was == VSPEC__TOKEN_STATUS__TOKEN_UNVERIFIED);
    v->status[at] = now;
  }
}

static void gv_progress_json(vs_gen_view *v, const Vspec__Event *ev) {
  const Vspec__Progress *p = ev->progress;
  fprintf(v->out,
          "{\"event\": \"progress\", \"job\": %llu, \"seq\": %llu, \"round\": %lld, "
          "\"tokens_done\": %u, \"tokens_total\": %u, \"tpf\": %.4f, \"mal\": %.4f, "
          "\"accept_rate\": %.4f, \"walk_accept_rate\": %.4f, \"unverified_tokens\": %u, "
          "\"elapsed_s\": %.4f, \"changed\": %zu",
          v->job, (unsigned long long)ev->seq, (long long)p->round, p->tokens_done,
          p->tokens_total, p->tpf, p->mal, p->accept_rate, p->walk_accept_rate, v->unverified,
          p->elapsed_s, p->n_positions);
  gv_json_end(v);
}

void vs_gen_show_progress(vs_gen_view *v, const Vspec__Event *ev, double now) {
  const Vspec__Progress *p = ev->progress;
  if (p->round < 0) { /* queued */
    vs_progress_line_pause(&v->pl, now);
    if (v->json) gv_progress_json(v, ev);
    else if (gv_text(v))
      vs_progress_line_note(&v->pl, "job %llu: position %u in the queue", v->job,
                            p->queue_position);
    return;
  }
  gv_track_status(v, p);
  if (v->json) {
    gv_progress_json(v, ev);
    return;
  }
  if (!gv_text(v)) return;
  vs_progress_figures x = {.done = p->tokens_done, .total = p->tokens_total, .tpf = p->tpf,
                           .mal = p->mal, .accept = -1, .gen_s = p->elapsed_s};
  if (v->drafting && p->has_accept_rate) x.accept = p->accept_rate;
  if (p->tokens_done > 0) x.unverified = (double)v->unverified / p->tokens_done;
  vs_progress_line_update(&v->pl, &x, now);
}

void vs_gen_show_phase(vs_gen_view *v, const Vspec__Event *ev, double now) {
  const Vspec__Phase *ph = ev->phase;
  if (v->json) {
    fprintf(v->out, "{\"event\": \"phase\", \"job\": %llu, \"name\": ", v->job);
    vs__json_str(v->out, ph->name);
    fprintf(v->out, ", \"message\": ");
    vs__json_str(v->out, ph->message);
    gv_json_opt(v->out, "done", ph->has_done, ph->done);
    gv_json_opt(v->out, "eta_s", ph->has_eta_s, ph->eta_s);
    gv_json_end(v);
  }
  if (gv_text(v))
    vs_progress_line_phase(&v->pl, ph->name, ph->message ? ph->message : ph->name,
                           ph->has_done ? ph->done : -1, ph->has_eta_s ? ph->eta_s : -1, now);
  else
    vs_progress_line_pause(&v->pl, now);
}

static int gv_noted(const vs_gen_view *v, const char *msg) {
  for (int i = 0; i < v->n_notes; i++)
    if (!strcmp(v->notes[i], msg)) return 1;
  return 0;
}

/* Shows a note once (text) and keeps it for the result's "notes". */
static void gv_note(vs_gen_view *v, const char *msg) {
  if (!msg || gv_noted(v, msg)) return;
  if (gv_text(v)) vs_progress_line_note(&v->pl, "note: %s", msg);
  if (v->n_notes < VS_GEN_MAX_NOTES) v->notes[v->n_notes] = strdup(msg);
  if (v->n_notes < VS_GEN_MAX_NOTES && v->notes[v->n_notes]) v->n_notes++;
}

void vs_gen_show_notice(vs_gen_view *v, const Vspec__Event *ev) {
  const Vspec__Notice *n = ev->notice;
  if (v->json) {
    fprintf(v->out, "{\"event\": \"notice\", \"job\": %llu, \"kind\": ", v->job);
    vs__json_str(v->out, n->kind);
    fprintf(v->out, ", \"message\": ");
    vs__json_str(v->out, n->message);
    gv_json_end(v);
  }
  gv_note(v, n->message);
}

void vs_gen_show_restarted(vs_gen_view *v, const Vspec__Event *ev, double now) {
  /* Fleet mode: the daemon that had the job died; another one runs it from the start. */
  const Vspec__Restarted *x = ev->restarted;
  vs_progress_line_end(&v->pl);
  vs_progress_line_restart(&v->pl, now);
  if (v->status) memset(v->status, 0, v->n_status);
  v->unverified = 0;
  if (v->json) {
    fprintf(v->out, "{\"event\": \"restarted\", \"job\": %llu, \"delivery\": %u, \"node\": ",
            v->job, x->delivery);
    vs__json_str(v->out, x->node);
    gv_json_end(v);
  } else if (gv_text(v)) {
    fprintf(v->pl.f, "vspec: job %llu restarted on %s (its daemon stopped answering; run %u)\n",
            v->job, x->node ? x->node : "?", x->delivery);
  }
}

void vs_gen_show_preview(vs_gen_view *v, const Vspec__Event *ev, const char *path) {
  const Vspec__Preview *p = ev->preview;
  if (!v->json) return;
  fprintf(v->out, "{\"event\": \"preview\", \"job\": %llu, \"seq\": %llu, \"tokens_done\": %u, "
          "\"tokens_total\": %u, \"file\": ", v->job, (unsigned long long)ev->seq,
          p->tokens_done, p->tokens_total);
  vs__json_str(v->out, path);
  gv_json_end(v);
}

/* "accept 3% of 412 draft tokens, 61% of the tokens unverified (VVS)", or "accept -" when
 * nothing was drafted: the % counts draft tokens the target verified, which VVS's unverified
 * tokens are not, so a high MAL beside a low accept is not a contradiction. */
static void gv_accept_text(char *buf, size_t n, const Vspec__Stats *st) {
  if (!st || !st->draft_tokens) {
    snprintf(buf, n, "accept -");
    return;
  }
  int k = snprintf(buf, n, "accept %.0f%% of %llu draft tokens", 100.0 * st->accept_rate,
                   (unsigned long long)st->draft_tokens);
  if (st->unverified_tokens && st->tokens && k > 0 && (size_t)k < n)
    snprintf(buf + k, n - (size_t)k, ", %.0f%% of the tokens unverified (VVS)",
             100.0 * (double)st->unverified_tokens / (double)st->tokens);
}

static void gv_result_text(vs_gen_view *v, const Vspec__Result *r, const vs_gen_written *w) {
  const Vspec__Stats *st = r->stats;
  char acc[128], seed[40] = "";
  gv_accept_text(acc, sizeof acc, st);
  if (r->has_seed) snprintf(seed, sizeof seed, ", seed %llu", (unsigned long long)r->seed);
  fprintf(v->pl.f, "wrote %s (%ux%u): job %llu%s, %llu tokens, %llu target forwards, TPF "
          "%.2f, MAL %.2f, %s, %.3f s end to end (%.3f s generating)\n",
          w->out, w->width, w->height, v->job, seed, st ? (unsigned long long)st->tokens : 0ull,
          st ? (unsigned long long)st->target_forwards : 0ull, st ? st->tpf : 0,
          st ? st->mal : 0, acc, w->latency_s, st ? st->generate_s : 0);
}

static void gv_stats_json(FILE *f, const Vspec__Stats *st) {
  fprintf(f, ", \"tokens\": %llu, \"target_forwards\": %llu, \"tpf\": %.4f, \"mal\": %.4f, "
          "\"accept_rate\": %.4f, \"walk_accept_rate\": %.4f, \"draft_tokens\": %llu, "
          "\"drafted\": %llu, \"accepted\": %llu, \"unverified_tokens\": %llu, "
          "\"generate_s\": %.6f, \"decode_s\": %.6f, \"queue_s\": %.6f, \"preview_s\": %.6f, "
          "\"rule\": ",
          (unsigned long long)st->tokens, (unsigned long long)st->target_forwards, st->tpf,
          st->mal, st->accept_rate, st->walk_accept_rate, (unsigned long long)st->draft_tokens,
          (unsigned long long)st->drafted, (unsigned long long)st->accepted,
          (unsigned long long)st->unverified_tokens, st->generate_s, st->decode_s, st->queue_s,
          st->preview_s);
  vs__json_str(f, st->rule_version);
}

static void gv_grid_json(FILE *f, const uint8_t *tok, size_t len) {
  fprintf(f, ", \"grid\": [");
  for (size_t i = 0; tok && i + 4 <= len; i += 4)
    fprintf(f, "%s%d", i ? ", " : "",
            (int32_t)((uint32_t)tok[i] | (uint32_t)tok[i + 1] << 8 |
                      (uint32_t)tok[i + 2] << 16 | (uint32_t)tok[i + 3] << 24));
  fputc(']', f);
}

/* The notices shown and whatever else the result's notes say, in order. */
static void gv_notes_json(vs_gen_view *v) {
  fprintf(v->out, ", \"notes\": [");
  for (int i = 0; i < v->n_notes; i++) {
    if (i) fprintf(v->out, ", ");
    vs__json_str(v->out, v->notes[i]);
  }
  fputc(']', v->out);
}

void vs_gen_show_result(vs_gen_view *v, const Vspec__Result *r, const vs_gen_written *w) {
  vs_progress_line_end(&v->pl);
  v->ended = 1;
  /* Notes a client saw no Notice for (a relay that drops them): shown now, once. */
  for (size_t i = 0; i < r->n_notes; i++) gv_note(v, r->notes[i]);
  if (!v->json) {
    if (!v->quiet) gv_result_text(v, r, w);
    return;
  }
  fprintf(v->out, "{\"event\": \"result\", \"job\": %llu, \"out\": ", v->job);
  vs__json_str(v->out, w->out);
  fprintf(v->out, ", \"width\": %u, \"height\": %u, \"upscale\": %ld, \"latency_s\": %.6f, "
          "\"previews\": %d", w->width, w->height, w->upscale, w->latency_s, w->previews);
  if (r->has_seed) fprintf(v->out, ", \"seed\": %llu", (unsigned long long)r->seed);
  else fprintf(v->out, ", \"seed\": null");
  if (r->stats) gv_stats_json(v->out, r->stats);
  fprintf(v->out, ", \"describe\": ");
  vs__json_str(v->out, r->describe);
  gv_notes_json(v);
  gv_grid_json(v->out, w->tokens, w->tokens_len);
  gv_json_end(v);
}

static void gv_error_json(vs_gen_view *v, const char *code, const char *message,
                           const Vspec__Error *x, int status) {
  fprintf(v->out, "{\"event\": \"error\", \"job\": %llu, \"code\": ", v->job);
  vs__json_str(v->out, code);
  fprintf(v->out, ", \"message\": ");
  vs__json_str(v->out, message);
  if (x && x->has_retry_after_ms) fprintf(v->out, ", \"retry_after_ms\": %u", x->retry_after_ms);
  fprintf(v->out, ", \"exit\": %d", status);
  gv_json_end(v);
}

int vs_gen_show_error(vs_gen_view *v, const Vspec__Error *x, int status) {
  vs_progress_line_end(&v->pl);
  v->ended = 1;
  if (v->json) gv_error_json(v, vs_wire_error_name(x->code), x->message, x, status);
  if (!v->json || !v->quiet) {
    fprintf(v->pl.f, "vspec: %s: %s", vs_wire_error_name(x->code), x->message);
    if (x->has_retry_after_ms) fprintf(v->pl.f, " (retry after %u ms)", x->retry_after_ms);
    fputc('\n', v->pl.f);
  }
  return status;
}

int vs_gen_fail(vs_gen_view *v, int status, const char *code, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  vs_progress_line_end(&v->pl);
  /* One terminal object: a failure after the result (say) must not add a second one. */
  if (v->json && !v->ended) gv_error_json(v, code, msg, NULL, status);
  v->ended = 1;
  if (!v->json || !v->quiet) fprintf(v->pl.f, "vspec: %s\n", msg);
  return status;
}
