/*
 * daemon/http_generate.c - POST /v1/images/generations: an OpenAI-style request turned into
 * a Submit to the daemon over inproc, its Result turned into the answer (DESIGN.md "HTTP
 * endpoint").
 */
#include "daemon/http_internal.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "core/log.h"
#include "core/metrics.h" /* vs_now */
#include "vspec/types.h"

#define VS__POLL_MS 50          /* how often the HTTP client and the stop flag are looked at */
#define VS__CANCEL_GRACE_S 2.0  /* waiting for the terminal event of a cancelled job */

typedef struct vs__gen {
  int has_class;
  int32_t class_label;
  const char *method, *model; /* point into the parsed JSON */
  int has_seed;
  uint64_t seed;
  int png; /* response_format "png": the raw image */
} vs__gen;

/* ---- the request body ---------------------------------------------------------------------- */

static int vs__parse_class(json_t *v, vs__gen *g, vs_http_reply *r) {
  if (json_is_integer(v)) {
    json_int_t c = json_integer_value(v);
    if (c < INT32_MIN || c > INT32_MAX) {
      vs__http_error(r, 400, "class", "class: %lld is out of range", (long long)c);
      return -1;
    }
    g->class_label = (int32_t)c;
  } else if (json_is_string(v)) {
    /* No model manifest names its labels (core/manifest.h): a label is its number, which
     * may come as a string of digits. */
    const char *t = json_string_value(v);
    char *end;
    errno = 0;
    long c = strtol(t, &end, 10);
    if (!*t || *end || errno || c < INT32_MIN || c > INT32_MAX) {
      vs__http_error(r, 400, "class", "class: '%s' is not a class number (this daemon's "
                     "models have no label names)", t);
      return -1;
    }
    g->class_label = (int32_t)c;
  } else {
    vs__http_error(r, 400, "class", "class: expected an integer");
    return -1;
  }
  g->has_class = 1;
  return 0;
}

static int vs__parse(const char *body, size_t len, json_t **root, vs__gen *g, vs_http_reply *r) {
  json_error_t je;
  memset(g, 0, sizeof *g);
  *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
  if (!*root) {
    vs__http_error(r, 400, NULL, "the body is not valid JSON: %s (line %d, column %d)", je.text,
                   je.line, je.column);
    return -1;
  }
  if (!json_is_object(*root)) {
    vs__http_error(r, 400, NULL, "the body must be a JSON object");
    return -1;
  }
  const char *key;
  json_t *v;
  json_object_foreach(*root, key, v) {
    if (json_is_null(v)) continue; /* OpenAI's clients send unset fields as null */
    if (!strcmp(key, "class")) {
      if (vs__parse_class(v, g, r)) return -1;
    } else if (!strcmp(key, "method") || !strcmp(key, "model")) {
      if (!json_is_string(v)) {
        vs__http_error(r, 400, key, "%s: expected a string", key);
        return -1;
      }
      *(!strcmp(key, "method") ? &g->method : &g->model) = json_string_value(v);
    } else if (!strcmp(key, "seed")) {
      /* Seeds are 64-bit: above 2^53 only a string keeps every digit in JavaScript. */
      const char *t = json_is_string(v) ? json_string_value(v) : NULL;
      char *end = NULL;
      errno = 0;
      unsigned long long x = t ? strtoull(t, &end, 10) : 0;
      if (json_is_integer(v) && json_integer_value(v) >= 0) {
        g->seed = (uint64_t)json_integer_value(v);
      } else if (t && *t >= '0' && *t <= '9' && !*end && !errno) {
        g->seed = x;
      } else {
        vs__http_error(r, 400, key, "seed: expected an integer 0..2^64-1 (a number or a string "
                       "of digits)");
        return -1;
      }
      g->has_seed = 1;
    } else if (!strcmp(key, "n")) {
      if (!json_is_integer(v) || json_integer_value(v) != 1) {
        vs__http_error(r, 400, key, "n: only 1 image per request is supported (send several "
                       "requests for more)");
        return -1;
      }
    } else if (!strcmp(key, "response_format")) {
      const char *f = json_is_string(v) ? json_string_value(v) : "";
      if (strcmp(f, "b64_json") && strcmp(f, "png")) {
        vs__http_error(r, 400, key, "response_format: expected \"b64_json\" or \"png\"");
        return -1;
      }
      g->png = !strcmp(f, "png");
    } else if (!strcmp(key, "prompt")) {
      /* Text models take their caption as embeddings (Submit's caption blobs); vspecd has no
       * text encoder to make them from words. */
      vs__http_error(r, 400, key, "prompt: text prompts are not supported: vspecd has no text "
                     "encoder (class-conditional models take \"class\"; a text model's caption "
                     "embeddings go over the ZeroMQ protocol)");
      return -1;
    } else if (!strcmp(key, "user")) {
      /* OpenAI's end-user id: accepted and ignored */
    } else {
      vs__http_error(r, 400, key, "unknown field '%s' (known: class, method, model, seed, n, "
                     "response_format, prompt, user)", key);
      return -1;
    }
  }
  return 0;
}

/* ---- the daemon's answer -------------------------------------------------------------------- */

/* The parameter a daemon message names ("class_label: 12 is out of range ..."), in the
 * HTTP request's spelling. */
static const char *vs__param_of(const char *msg, char *buf, size_t n) {
  size_t i = 0;
  while (msg[i] && (msg[i] == '_' || (msg[i] >= 'a' && msg[i] <= 'z')) && i + 1 < n) {
    buf[i] = msg[i];
    i++;
  }
  buf[i] = '\0';
  if (!i || msg[i] != ':') return NULL;
  if (!strcmp(buf, "class_label")) return "class";
  return buf;
}

static void vs__daemon_error(const Vspec__Error *er, vs_http_reply *r) {
  char pb[40];
  const char *msg = er->message ? er->message : "";
  switch (er->code) {
  case VSPEC__ERROR_CODE__ERR_INVALID:
  case VSPEC__ERROR_CODE__ERR_MALFORMED:
  case VSPEC__ERROR_CODE__ERR_TOO_LARGE:
    vs__http_error(r, 400, vs__param_of(msg, pb, sizeof pb), "%s", msg);
    break;
  case VSPEC__ERROR_CODE__ERR_BUSY:
  case VSPEC__ERROR_CODE__ERR_SHUTTING_DOWN:
  case VSPEC__ERROR_CODE__ERR_CANCELLED:
    vs__http_error(r, 503, NULL, "%s", msg);
    r->retry_after_s = er->has_retry_after_ms ? (int)((er->retry_after_ms + 999) / 1000) : 1;
    if (r->retry_after_s < 1) r->retry_after_s = 1;
    break;
  case VSPEC__ERROR_CODE__ERR_DEADLINE:
    vs__http_error(r, 504, NULL, "%s", msg);
    break;
  default:
    vs__http_error(r, 500, NULL, "%s", msg);
  }
}

static void vs__result(const vs__gen *g, const vs_conn_event *e, const char *model,
                       const char *method, double wall_s, vs_http_reply *r) {
  const Vspec__Result *res = e->ev->result;
  size_t png_len = 0;
  const void *png = vs_conn_blob(e, VSPEC__BLOB_KIND__BLOB_PNG, &png_len);
  if (!png || !png_len) {
    vs__http_error(r, 500, NULL, "the daemon's result carries no PNG");
    return;
  }
  if (g->png) {
    r->body = malloc(png_len);
    if (!r->body) {
      vs__http_error(r, 500, NULL, "out of memory");
      return;
    }
    memcpy(r->body, png, png_len);
    r->len = png_len;
    r->status = 200;
    r->type = "image/png";
    snprintf(r->seed, sizeof r->seed, "%llu", (unsigned long long)res->seed);
    return;
  }
  size_t b64_len = sodium_base64_encoded_len(png_len, sodium_base64_VARIANT_ORIGINAL);
  char *b64 = malloc(b64_len);
  if (!b64) {
    vs__http_error(r, 500, NULL, "out of memory");
    return;
  }
  sodium_bin2base64(b64, b64_len, png, png_len, sodium_base64_VARIANT_ORIGINAL);
  const Vspec__Stats *st = res->stats;
  char seed[24];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)res->seed);
  json_t *stats = json_pack("{s:s,s:s,s:s,s:s?,s:i,s:i,s:f}", "model", model, "method", method,
                            "seed", seed, "node", res->node, "width",
                            (int)res->width, "height", (int)res->height, "wall_s", wall_s);
  if (stats && st) {
    json_object_set_new(stats, "tpf", json_real(st->tpf));
    json_object_set_new(stats, "mal", json_real(st->mal));
    json_object_set_new(stats, "accept_rate", json_real(st->accept_rate));
    json_object_set_new(stats, "tokens", json_integer((json_int_t)st->tokens));
    json_object_set_new(stats, "target_forwards", json_integer((json_int_t)st->target_forwards));
    json_object_set_new(stats, "generate_s", json_real(st->generate_s));
  }
  /* What the daemon said about how the job ran (size=auto's choice, a fallback to AR). */
  json_t *notes = stats ? json_array() : NULL;
  for (size_t i = 0; notes && i < res->n_notes; i++)
    json_array_append_new(notes, json_string(res->notes[i]));
  if (notes) json_object_set_new(stats, "notes", notes);
  json_t *out = json_pack("{s:I,s:[{s:s,s:n}],s:o?}", "created", (json_int_t)time(NULL), "data",
                          "b64_json", b64, "revised_prompt", "vspec", stats);
  free(b64);
  if (!out) {
    vs__http_error(r, 500, NULL, "out of memory");
    return;
  }
  vs__http_json(r, 200, out);
}

/* ---- the job ------------------------------------------------------------------------------- */

/* Whether the HTTP client has closed its connection (a read would return 0). A client that
 * pipelines another request is still there. */
static int vs__client_gone(int fd) {
  if (fd < 0) return 0;
  struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return 0;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return 1;
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void vs__cancel(vs_conn *c, uint64_t job) {
  char err[VSPEC_ERRLEN];
  Vspec__Request q = VSPEC__REQUEST__INIT;
  Vspec__Cancel cn = VSPEC__CANCEL__INIT;
  cn.job_id = job;
  q.body_case = VSPEC__REQUEST__BODY_CANCEL;
  q.cancel = &cn;
  vs_conn_send(c, &q, NULL, 0, err, sizeof err);
}

/* Sends the submit and waits for its terminal event; r stays empty (status 0) when the
 * client went away. */
static void vs__run(vs_http *h, int fd, const vs__gen *g, vs_http_reply *r) {
  char err[VSPEC_ERRLEN];
  vs_conn conn;
  if (vs__http_connect(h, &conn, err, sizeof err)) {
    vs__http_error(r, 500, NULL, "cannot reach the daemon: %s", err);
    return;
  }
  Vspec__Request q = VSPEC__REQUEST__INIT;
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.model = (char *)g->model;
  s.method = (char *)g->method;
  s.has_class_label = g->has_class;
  s.class_label = g->class_label;
  s.has_seed = g->has_seed;
  s.seed = g->seed;
  s.has_progress = 1; /* nothing to stream to an HTTP client: no progress, no credit */
  s.progress = 0;
  s.tag = "http";
  /* The daemon's own deadline backs ours up: the job stops even if this thread is late. */
  long dl = h->cfg->http_timeout_ms < h->cfg->max_deadline_ms ? h->cfg->http_timeout_ms
                                                              : h->cfg->max_deadline_ms;
  if (dl > 0) {
    s.has_deadline_ms = 1;
    s.deadline_ms = (uint32_t)dl;
  }
  q.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  q.submit = &s;
  double t0 = vs_now(), end = t0 + h->cfg->http_timeout_ms / 1000.0, give_up = 0;
  if (vs_conn_send(&conn, &q, NULL, 0, err, sizeof err)) {
    vs__http_error(r, 500, NULL, "cannot submit to the daemon: %s", err);
    vs_conn_close(&conn);
    return;
  }
  uint64_t rid = q.request_id, job = 0;
  int gone = 0, cancelled = 0;
  char model[64] = "", method[256] = "";
  for (;;) {
    double now = vs_now();
    if (!gone && (vs__client_gone(fd) || atomic_load(&h->stopping) || now > end)) {
      gone = vs__client_gone(fd) ? 1 : atomic_load(&h->stopping) ? 2 : 3;
      give_up = now + VS__CANCEL_GRACE_S;
    }
    if (gone && job && !cancelled) {
      vs__cancel(&conn, job);
      cancelled = 1;
    }
    if (gone && now > give_up) break;
    vs_conn_event e;
    int rc = vs_conn_recv(&conn, VS__POLL_MS, &e, err, sizeof err);
    if (rc < 0) {
      if (!gone) vs__http_error(r, 500, NULL, "from the daemon: %s", err);
      break;
    }
    if (rc == 0) continue;
    const Vspec__Event *ev = e.ev;
    int mine = (ev->has_request_id && ev->request_id == rid) ||
               (job && ev->has_job_id && ev->job_id == job);
    if (!mine) {
      vs_conn_event_free(&e);
      continue;
    }
    if (ev->body_case == VSPEC__EVENT__BODY_ACCEPTED) {
      job = ev->has_job_id ? ev->job_id : 0;
      snprintf(model, sizeof model, "%s", ev->accepted->model ? ev->accepted->model : "");
      snprintf(method, sizeof method, "%s", ev->accepted->method ? ev->accepted->method : "");
    } else if (ev->body_case == VSPEC__EVENT__BODY_RESULT ||
               ev->body_case == VSPEC__EVENT__BODY_ERROR) {
      if (!gone && ev->body_case == VSPEC__EVENT__BODY_RESULT)
        vs__result(g, &e, model, method, vs_now() - t0, r);
      else if (!gone)
        vs__daemon_error(ev->error, r);
      vs_conn_event_free(&e);
      break;
    }
    vs_conn_event_free(&e);
  }
  if (gone == 2) vs__http_error(r, 503, NULL, "the daemon is shutting down");
  if (gone == 3)
    vs__http_error(r, 504, NULL, "no image within %d ms ([http] timeout_ms): the job was "
                   "cancelled", h->cfg->http_timeout_ms);
  if (gone == 1)
    vs_log(VSPEC_LOG_INFO, "http", "client went away: job %llu cancelled",
           (unsigned long long)job);
  vs_conn_close(&conn);
}

void vs__http_generate(vs_http *h, int client_fd, const char *body, size_t len,
                       vs_http_reply *r) {
  json_t *root = NULL;
  vs__gen g;
  if (vs__parse(body, len, &root, &g, r) == 0) vs__run(h, client_fd, &g, r);
  json_decref(root);
}
