/*
 * http/http_stream.c - POST /v1/images/generations with "stream": true: OpenAI's
 * server-sent events. Up to partial_images (0..3) "image_generation.partial_image" events per
 * image, each a progressive preview of the job (the daemon's colour-table previews, picked at
 * even shares of the image), then one "image_generation.completed" per image with the final
 * PNG and the usage; a failure after the stream began is an "error" event.
 *
 * The jobs are accepted before the answer's 200 goes out, so that a refused prompt is still a
 * plain 400. libmicrohttpd then calls stream_read on the connection's own thread for each piece
 * of the body: it steps the jobs (http/http_jobs.c) until there is something to send. A
 * client that goes away ends the stream: its jobs are cancelled when MHD frees it.
 */
#include "http/http_internal.h"

#include <jansson.h>
#include <microhttpd.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "vspec/types.h"

struct vs_http_stream {
  vs_http_batch b;
  Vspec__Submit submit;
  void *root;           /* the request's JSON, which the submit's strings point into */
  int upscale, partial_images;
  int sent[VS_HTTP_MAX_N]; /* partial images sent, per job */
  char *buf;            /* SSE bytes not yet handed to MHD */
  size_t len, off;
  int ended;            /* the last event is in buf */
};

/* Appends one SSE event: "event: TYPE\ndata: JSON\n\n" (takes the reference). */
static void stream_emit(vs_http_stream *st, const char *type, json_t *data) {
  char *js = data ? json_dumps(data, JSON_COMPACT) : NULL;
  json_decref(data);
  if (!js) return;
  size_t n = strlen(type) + strlen(js) + 20;
  char *b = realloc(st->buf, st->len + n);
  if (b) {
    st->buf = b;
    st->len += (size_t)snprintf(b + st->len, n, "event: %s\ndata: %s\n\n", type, js);
  }
  free(js);
}

static json_t *stream_image_event(const char *type, const char *b64, int w, int h) {
  char size[32];
  snprintf(size, sizeof size, "%dx%d", w, h);
  return json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:s}", "type", type, "b64_json", b64,
                   "created_at", (json_int_t)time(NULL), "size", size, "quality", "auto",
                   "background", "opaque", "output_format", "png");
}

/* A preview of job i: sent when it passes the next of partial_images even shares. */
static int stream_on_event(void *arg, int i, const vs_conn_event *e) {
  vs_http_stream *st = arg;
  const Vspec__Event *ev = e->ev;
  if (ev->body_case != VSPEC__EVENT__BODY_PREVIEW) return 0;
  const Vspec__Preview *p = ev->preview;
  int k = st->sent[i];
  if (k >= st->partial_images || !p->tokens_total ||
      (uint64_t)p->tokens_done * (uint64_t)(st->partial_images + 1) <
          (uint64_t)(k + 1) * p->tokens_total)
    return 0;
  size_t len = 0;
  const void *png = vs_conn_blob(e, VSPEC__BLOB_KIND__BLOB_PNG, &len);
  if (!png || !len) return 0;
  size_t b64_len = sodium_base64_encoded_len(len, sodium_base64_VARIANT_ORIGINAL);
  char *b64 = malloc(b64_len);
  if (!b64) return 0;
  sodium_bin2base64(b64, b64_len, png, len, sodium_base64_VARIANT_ORIGINAL);
  json_t *o = stream_image_event("image_generation.partial_image", b64, (int)p->width,
                                 (int)p->height);
  free(b64);
  /* OpenAI numbers the partial images of a request from 0; vspec's extension says whose */
  json_object_set_new(o, "partial_image_index", json_integer(k));
  json_object_set_new(o, "vspec", json_pack("{s:i,s:i,s:i}", "image", i, "tokens_done",
                                            (int)p->tokens_done, "tokens_total",
                                            (int)p->tokens_total));
  stream_emit(st, "image_generation.partial_image", o);
  st->sent[i] = k + 1;
  return 0;
}

/* The batch is over: the completed images, or the error. */
static void stream_finish(vs_http_stream *st) {
  vs_http_batch *b = &st->b;
  const vs_http_job *f = vs__http_jobs_failed(b);
  vs_http_reply r = {0};
  if (f || b->gave_up) {
    if (f) vs__http_daemon_error(f->err_code, f->err_msg, f->retry_after_ms, &r);
    else vs__http_error(&r, b->gave_up == VS_HTTP_STOPPING ? 503 : 504, NULL, "%s",
                        b->gave_up == VS_HTTP_STOPPING ? "the daemon is shutting down"
                                                       : "no image within [http] timeout_ms");
  }
  for (int i = 0; !r.status && i < b->n; i++) {
    const Vspec__Result *res = b->jobs[i].result->ev->result;
    char *b64 = vs__http_png_b64(&b->jobs[i], st->upscale, &r);
    if (!b64) break;
    json_t *o = stream_image_event("image_generation.completed", b64,
                                   (int)res->width * st->upscale, (int)res->height * st->upscale);
    free(b64);
    json_object_set_new(o, "revised_prompt", vs__http_revised_prompt(&b->jobs[i]));
    json_object_set_new(o, "usage", vs__http_usage(b));
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)res->seed);
    json_object_set_new(o, "vspec", json_pack("{s:i,s:s}", "image", i, "seed", seed));
    stream_emit(st, "image_generation.completed", o);
  }
  if (r.status) { /* OpenAI's clients raise an "error" event's error */
    json_error_t je;
    stream_emit(st, "error", r.body ? json_loads(r.body, 0, &je) : NULL);
  }
  free(r.body);
  st->ended = 1;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
  vs_http_stream *st = cls;
  st->b.in_body = 1; /* the 200 went: a probe of a half-closed client is part of the body */
  while (st->off == st->len) {
    st->off = st->len = 0;
    if (st->ended) return (ssize_t)MHD_CONTENT_READER_END_OF_STREAM;
    if (vs__http_jobs_step(&st->b)) {
      if (st->b.gave_up == VS_HTTP_CLIENT_GONE) return (ssize_t)MHD_CONTENT_READER_END_WITH_ERROR;
      stream_finish(st);
    } else if (st->b.probe_due) { /* an SSE comment: clients skip it, a gone one resets */
      st->b.probe_due = 0;
      static const char ping[] = ": still working\n\n";
      char *b = realloc(st->buf, sizeof ping);
      if (b) {
        st->buf = b;
        memcpy(b, ping, sizeof ping - 1);
        st->len = sizeof ping - 1;
      }
    }
  }
  size_t n = st->len - st->off < max ? st->len - st->off : max;
  memcpy(out, st->buf + st->off, n);
  st->off += n;
  return (ssize_t)n;
}

static void stream_free(vs_http_stream *st) {
  if (!st) return;
  if (st->b.connected && (st->b.gave_up == VS_HTTP_CLIENT_GONE || !st->b.over))
    vs_log(VSPEC_LOG_INFO, "http", "stream client went away: %d job(s) cancelled", st->b.n);
  vs__http_jobs_free(&st->b);
  json_decref(st->root);
  free(st->buf);
  free(st);
}

static void stream_free_cb(void *cls) { stream_free(cls); }

vs_http_stream *vs__http_stream_start(vs_http *h, int client_fd, const void *submit,
                                      const vs_http_batch *proto, void *root, int upscale,
                                      int partial_images, vs_http_reply *r) {
  vs_http_stream *st = calloc(1, sizeof *st);
  if (!st) {
    vs__http_error(r, 500, NULL, "out of memory");
    json_decref(root);
    return NULL;
  }
  st->submit = *(const Vspec__Submit *)submit;
  st->root = root;
  st->upscale = upscale;
  st->partial_images = partial_images;
  st->b = *proto;
  st->b.submit = &st->submit;
  st->b.on_event = stream_on_event;
  st->b.arg = st;
  if (partial_images) { /* the daemon's previews, as many as credit lets through */
    st->submit.has_preview = 1;
    st->submit.preview = VSPEC__PREVIEW_KIND__PREVIEW_LUT;
    st->submit.has_credit = 1;
    st->submit.credit = (uint32_t)h->cfg->max_credit;
  }
  if (vs__http_jobs_start(&st->b, r)) {
    stream_free(st);
    return NULL;
  }
  /* every job accepted (or one refused, a plain error answer) before the 200 goes out */
  for (;;) {
    int waiting = 0;
    for (int i = 0; i < st->b.n; i++) waiting |= !st->b.jobs[i].id && !st->b.jobs[i].done;
    const vs_http_job *f = vs__http_jobs_failed(&st->b);
    if (f) vs__http_daemon_error(f->err_code, f->err_msg, f->retry_after_ms, r);
    if (f || !waiting || st->b.gave_up || vs__http_jobs_step(&st->b)) break;
  }
  if (!r->status && st->b.gave_up && st->b.gave_up != VS_HTTP_CLIENT_GONE) {
    vs__http_error(r, 503, NULL, "the daemon is shutting down or timed out");
    r->retry_after_s = 1;
  }
  if (r->status || st->b.gave_up) {
    stream_free(st);
    return NULL;
  }
  return st;
}

struct MHD_Response *vs__http_stream_response(vs_http_stream *st) {
  struct MHD_Response *resp =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st,
                                        stream_free_cb);
  if (!resp) stream_free(st);
  return resp;
}
