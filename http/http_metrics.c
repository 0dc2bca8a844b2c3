/*
 * http/http_metrics.c - GET /health and GET /metrics: the daemon's StatusReply, asked for
 * over inproc like any client's status, as a health answer or as Prometheus's text
 * exposition format 0.0.4 (DESIGN.md "HTTP endpoint" lists the series).
 */
#include "http/http_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/version.h"
#include "vspec/types.h"

void vs__http_health(vs_http *h, vs_http_reply *r) {
  vs_conn_event e;
  char err[VSPEC_ERRLEN];
  if (atomic_load(&h->stopping) || !vs__http_status(h, &e, err, sizeof err)) {
    vs__http_json(r, 503, json_pack("{s:s,s:s}", "status", "unavailable", "message",
                                     atomic_load(&h->stopping) ? "shutting down" : err));
    r->retry_after_s = 1;
    return;
  }
  const Vspec__StatusReply *st = e.ev->status;
  int draining = st->draining;
  vs__http_json(r, draining ? 503 : 200,
                json_pack("{s:s,s:s?,s:i,s:i,s:i,s:b}", "status", draining ? "draining" : "ok",
                          "node", st->node, "queued", (int)st->queued, "running",
                          (int)st->running, "queue_capacity", (int)st->queue_capacity,
                          "draining", draining));
  if (draining) r->retry_after_s = 5;
  vs_conn_event_free(&e);
}

/* ---- the exposition ------------------------------------------------------------------------ */

static void met_family(FILE *f, const char *name, const char *type, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value: backslash, double quote and newline escaped, as the format asks. */
static void met_label(FILE *f, const char *v) {
  for (const char *p = v ? v : ""; *p; p++) {
    if (*p == '\\') fputs("\\\\", f);
    else if (*p == '"') fputs("\\\"", f);
    else if (*p == '\n') fputs("\\n", f);
    else fputc(*p, f);
  }
}

static void met_num(FILE *f, double v) {
  if (isnan(v)) fputs("NaN", f);
  else if (isinf(v)) fputs(v > 0 ? "+Inf" : "-Inf", f);
  else fprintf(f, "%.17g", v);
}

/* name{k1="v1",k2="v2"} value; k2 may be NULL, and k1 too (no labels). */
static void met_sample(FILE *f, const char *name, const char *k1, const char *v1,
                       const char *k2, const char *v2, double v) {
  fputs(name, f);
  if (k1) {
    fprintf(f, "{%s=\"", k1);
    met_label(f, v1);
    if (k2) {
      fprintf(f, "\",%s=\"", k2);
      met_label(f, v2);
    }
    fputs("\"}", f);
  }
  fputc(' ', f);
  met_num(f, v);
  fputc('\n', f);
}

static void met_one(FILE *f, const char *name, const char *type, const char *help, double v) {
  met_family(f, name, type, help);
  met_sample(f, name, NULL, NULL, NULL, NULL, v);
}

/* The endpoint's own counters (http_guard.c): connections it closed or refused. */
static void met_connections(FILE *f, vs_http *h) {
  const vs_http_guard *g = &h->guard;
  met_family(f, "vspec_http_connections_closed_total", "counter",
             "HTTP connections closed before their request was in: deadline (not complete "
             "within [http] request_deadline_ms), displaced (the oldest such when every "
             "connection was taken).");
  met_sample(f, "vspec_http_connections_closed_total", "reason", "deadline", NULL, NULL,
             (double)atomic_load(&g->closed_deadline));
  met_sample(f, "vspec_http_connections_closed_total", "reason", "displaced", NULL, NULL,
             (double)atomic_load(&g->closed_evicted));
  met_family(f, "vspec_http_connections_refused_total", "counter",
             "HTTP connections refused: per_address (past [http] max_connections_per_address), "
             "busy (a 503: every connection answering).");
  met_sample(f, "vspec_http_connections_refused_total", "reason", "per_address", NULL, NULL,
             (double)atomic_load(&g->refused_address));
  met_sample(f, "vspec_http_connections_refused_total", "reason", "busy", NULL, NULL,
             (double)atomic_load(&g->refused_busy));
}

static void met_totals(FILE *f, const Vspec__StatusReply *st) {
  const Vspec__Totals *t = st->totals;
  Vspec__Totals zero = VSPEC__TOTALS__INIT;
  if (!t) t = &zero;
  met_family(f, "vspec_info", "gauge", "The daemon: node name and release (always 1).");
  fputs("vspec_info{node=\"", f);
  met_label(f, st->node);
  fputs("\",version=\"" VSPEC_VERSION "\"} 1\n", f);
  met_one(f, "vspec_uptime_seconds", "gauge", "Seconds since the daemon started.", t->uptime_s);
  met_one(f, "vspec_draining", "gauge", "1 while the daemon drains (shutting down).",
          st->draining);
  met_family(f, "vspec_jobs_total", "counter",
             "Jobs by state: submitted (accepted), completed, failed, cancelled, rejected "
             "(the queue was full).");
  const char *states[] = {"submitted", "completed", "failed", "cancelled", "rejected"};
  const uint64_t n[] = {t->submitted, t->completed, t->failed, t->cancelled, t->rejected_busy};
  for (int i = 0; i < 5; i++)
    met_sample(f, "vspec_jobs_total", "state", states[i], NULL, NULL, (double)n[i]);
  met_one(f, "vspec_clients_lost_total", "counter",
          "Clients that vanished with jobs (their jobs were cancelled).", (double)t->clients_lost);
  met_one(f, "vspec_malformed_requests_total", "counter", "Requests that could not be parsed.",
          (double)t->malformed);
  met_one(f, "vspec_jobs_queued", "gauge", "Jobs waiting in the queue.", st->queued);
  met_one(f, "vspec_jobs_running", "gauge", "Jobs running on a worker.", st->running);
  met_one(f, "vspec_queue_capacity", "gauge", "Jobs the queue holds ([queue] size).",
          st->queue_capacity);
  met_one(f, "vspec_clients", "gauge", "Connected clients with jobs.", st->clients);
  met_one(f, "vspec_tokens_total", "counter",
          "Image tokens of completed jobs; tokens/s is rate(vspec_tokens_total[1m]).",
          (double)t->tokens);
  met_one(f, "vspec_preview_bytes_total", "counter", "PNG bytes of the previews sent.",
          (double)t->preview_bytes);
}

static void met_methods(FILE *f, const Vspec__StatusReply *st) {
  static const struct {
    const char *name, *help;
    size_t off;
  } c[] = {
      {"vspec_method_jobs_total", "Jobs ended (completed, failed or cancelled), by method.",
       offsetof(Vspec__MethodStats, jobs)},
      {"vspec_method_completed_jobs_total", "Jobs completed, by method.",
       offsetof(Vspec__MethodStats, completed)},
      {"vspec_method_tokens_total", "Image tokens emitted, by method (every job that ran).",
       offsetof(Vspec__MethodStats, tokens)},
      {"vspec_method_target_forwards_total", "Target model forward passes, by method.",
       offsetof(Vspec__MethodStats, target_forwards)},
      {"vspec_method_rounds_total", "Verification rounds (AR: one per token), by method.",
       offsetof(Vspec__MethodStats, rounds)},
      {"vspec_method_draft_tokens_total", "Draft tokens the target scored: every tree node but "
       "the roots (vs_metrics.draft_tokens).", offsetof(Vspec__MethodStats, draft_tokens)},
      {"vspec_method_drafted_total", "Depths the verification walk examined, one drafted token "
       "each (vs_metrics.drafted).", offsetof(Vspec__MethodStats, drafted)},
      {"vspec_method_accepted_total", "Draft tokens accepted (vs_metrics.accepted).",
       offsetof(Vspec__MethodStats, accepted)},
      {"vspec_method_tree_nodes_total", "Draft-tree nodes verified by the target, roots included.",
       offsetof(Vspec__MethodStats, tree_nodes)},
  };
  for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
    met_family(f, c[k].name, "counter", c[k].help);
    for (size_t i = 0; i < st->n_methods; i++) {
      const Vspec__MethodStats *m = st->methods[i];
      uint64_t v = *(const uint64_t *)((const char *)m + c[k].off);
      met_sample(f, c[k].name, "method", m->method, NULL, NULL, (double)v);
    }
  }
  /* The ratios since the start, cheap here; over a window use rate() of the counters. */
  met_family(f, "vspec_method_tpf", "gauge", "Tokens per target forward since the start.");
  for (size_t i = 0; i < st->n_methods; i++)
    if (st->methods[i]->target_forwards)
      met_sample(f, "vspec_method_tpf", "method", st->methods[i]->method, NULL, NULL,
                 (double)st->methods[i]->tokens / (double)st->methods[i]->target_forwards);
  met_family(f, "vspec_method_mal", "gauge", "Mean accepted length (tokens per round).");
  for (size_t i = 0; i < st->n_methods; i++)
    if (st->methods[i]->rounds)
      met_sample(f, "vspec_method_mal", "method", st->methods[i]->method, NULL, NULL,
                 (double)st->methods[i]->tokens / (double)st->methods[i]->rounds);
  met_family(f, "vspec_method_accept_rate", "gauge",
             "Draft acceptance rate as vLLM defines it: accepted / draft tokens, since the start.");
  for (size_t i = 0; i < st->n_methods; i++)
    if (st->methods[i]->draft_tokens)
      met_sample(f, "vspec_method_accept_rate", "method", st->methods[i]->method, NULL, NULL,
                 (double)st->methods[i]->accepted / (double)st->methods[i]->draft_tokens);
  met_family(f, "vspec_method_accepted_per_drafted", "gauge",
             "walk_accept_rate: accepted / depths the walk examined, since the start.");
  for (size_t i = 0; i < st->n_methods; i++)
    if (st->methods[i]->drafted)
      met_sample(f, "vspec_method_accepted_per_drafted", "method", st->methods[i]->method, NULL,
                 NULL, (double)st->methods[i]->accepted / (double)st->methods[i]->drafted);
}

static void met_plugins(FILE *f, const Vspec__StatusReply *st) {
  met_family(f, "vspec_plugin_generation", "gauge",
             "Generation of each loaded plugin (1, then one more per reload).");
  for (size_t i = 0; i < st->n_plugins; i++)
    met_sample(f, "vspec_plugin_generation", "kind", st->plugins[i]->kind, "name",
               st->plugins[i]->name, st->plugins[i]->generation);
  met_family(f, "vspec_model_generation", "gauge",
             "Generation of each model (one more per backend reload).");
  for (size_t i = 0; i < st->n_models; i++)
    met_sample(f, "vspec_model_generation", "model", st->models[i]->name, NULL, NULL,
               st->models[i]->generation);
}

void vs__http_metrics(vs_http *h, vs_http_reply *r) {
  vs_conn_event e;
  char err[VSPEC_ERRLEN];
  if (!vs__http_status(h, &e, err, sizeof err)) {
    vs__http_error(r, 503, NULL, "no status from the daemon: %s", err);
    r->retry_after_s = 1;
    return;
  }
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) {
    vs_conn_event_free(&e);
    vs__http_error(r, 500, NULL, "out of memory");
    return;
  }
  met_totals(f, e.ev->status);
  met_connections(f, h);
  met_methods(f, e.ev->status);
  met_plugins(f, e.ev->status);
  fclose(f);
  vs_conn_event_free(&e);
  r->status = 200;
  r->type = "text/plain; version=0.0.4; charset=utf-8";
  r->body = text;
  r->len = len;
}
