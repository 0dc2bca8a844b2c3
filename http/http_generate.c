/*
 * http/http_generate.c - POST /v1/images/generations: an OpenAI-style request turned into
 * n Submits to the daemon over inproc (http/http_jobs.c), their Results into the answer
 * (DESIGN.md "HTTP endpoint"). OpenAI's fields are accepted where they mean something here
 * and ignored where they do not (README, "HTTP endpoint", has the table); vspec's own ride
 * beside them (class, method, seed) and in the answer's "vspec" objects.
 */
#include "http/http_internal.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/metrics.h" /* vs_now */
#include "core/png_upscale.h"
#include "vspec/types.h"

#define VS__MAX_UPSCALE 64 /* as vspec generate --upscale */

/* The request, parsed once: strings point into the parsed JSON. */
typedef struct gen_req {
  int has_class;
  int32_t class_label;
  const char *prompt, *method, *model, *size;
  int has_seed;
  uint64_t seed;
  int n;
  int png;            /* response_format "png": the raw image */
  int stream, partial_images;
  int upscale;        /* size a multiple of the model's: enlarged here */
  int width, height;  /* the model's image, once size was checked against it */
} gen_req;

/* ---- the request body ---------------------------------------------------------------------- */

/* A JSON integer only: "class": "1" (or " 1", which strtol would take) is refused, since a
 * proxy or a client library may read such a string otherwise (issue 32, finding 3); a class
 * name goes in "prompt". */
static int gen_parse_class(json_t *v, gen_req *g, vs_http_reply *r) {
  if (!json_is_integer(v)) {
    vs__http_error(r, 400, "class", "class: expected an integer (a JSON number; a class name "
                   "goes in \"prompt\")");
    return -1;
  }
  json_int_t c = json_integer_value(v);
  if (c < INT32_MIN || c > INT32_MAX) {
    vs__http_error(r, 400, "class", "class: %lld is out of range", (long long)c);
    return -1;
  }
  g->class_label = (int32_t)c;
  g->has_class = 1;
  return 0;
}

static int gen_parse_seed(json_t *v, gen_req *g, vs_http_reply *r) {
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
    vs__http_error(r, 400, "seed", "seed: expected an integer 0..2^64-1 (a number or a string "
                   "of digits)");
    return -1;
  }
  g->has_seed = 1;
  return 0;
}

/* An integer field in lo..hi. */
static int gen_parse_int(const char *key, json_t *v, int lo, int hi, int *out, vs_http_reply *r) {
  if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
    vs__http_error(r, 400, key, "%s: expected an integer %d..%d", key, lo, hi);
    return -1;
  }
  *out = (int)json_integer_value(v);
  return 0;
}

/* A string field that must be one of `ok` (space-separated); *out gets it. */
static int gen_parse_word(const char *key, json_t *v, const char *ok, const char *why,
                          const char **out, vs_http_reply *r) {
  const char *t = json_is_string(v) ? json_string_value(v) : NULL;
  size_t n = t ? strlen(t) : 0;
  for (const char *p = ok; t && *p; p += strcspn(p, " "), p += *p == ' ')
    if (n && !strncmp(p, t, n) && (p[n] == ' ' || !p[n])) {
      if (out) *out = t;
      return 0;
    }
  vs__http_error(r, 400, key, "%s: %s%s%s is not served: %s (allowed: %s)", key, t ? "'" : "",
                 t ? t : "a non-string", t ? "'" : "", why, ok);
  return -1;
}

/* OpenAI's fields that change nothing here, and vspec's reasons (README's table). */
static int gen_parse_openai(const char *key, json_t *v, gen_req *g, vs_http_reply *r) {
  const char *f = NULL;
  if (!strcmp(key, "quality")) /* the method decides how an image is made */
    return gen_parse_word(key, v, "auto standard hd low medium high",
                          "quality is the method's (\"method\")", NULL, r);
  if (!strcmp(key, "style"))
    return gen_parse_word(key, v, "vivid natural", "a DALL-E 3 setting", NULL, r);
  if (!strcmp(key, "moderation")) /* a class of the model's own data: nothing to moderate */
    return gen_parse_word(key, v, "auto low", "an OpenAI setting", NULL, r);
  if (!strcmp(key, "background"))
    return gen_parse_word(key, v, "auto opaque", "the model's images are opaque", NULL, r);
  if (!strcmp(key, "output_format"))
    return gen_parse_word(key, v, "png", "vspecd makes PNG images", NULL, r);
  if (!strcmp(key, "output_compression")) /* for JPEG and WebP, which are not made */
    return gen_parse_int(key, v, 0, 100, &(int){0}, r);
  if (!strcmp(key, "response_format")) {
    if (gen_parse_word(key, v, "b64_json png", "vspecd keeps no images to link to", &f, r))
      return -1;
    g->png = !strcmp(f, "png");
    return 0;
  }
  if (!strcmp(key, "user")) return 0; /* OpenAI's end-user id: nothing to do with it */
  return 1;
}

static int gen_parse_field(const char *key, json_t *v, gen_req *g, vs_http_reply *r) {
  int rc = gen_parse_openai(key, v, g, r);
  if (rc <= 0) return rc;
  if (!strcmp(key, "class")) return gen_parse_class(v, g, r);
  if (!strcmp(key, "seed")) return gen_parse_seed(v, g, r);
  if (!strcmp(key, "n")) return gen_parse_int(key, v, 1, VS_HTTP_MAX_N, &g->n, r);
  if (!strcmp(key, "partial_images")) return gen_parse_int(key, v, 0, 3, &g->partial_images, r);
  if (!strcmp(key, "stream")) {
    if (!json_is_boolean(v)) {
      vs__http_error(r, 400, key, "stream: expected true or false");
      return -1;
    }
    g->stream = json_is_true(v);
    return 0;
  }
  const char **s = !strcmp(key, "method") ? &g->method : !strcmp(key, "model") ? &g->model
                   : !strcmp(key, "prompt") ? &g->prompt : !strcmp(key, "size") ? &g->size
                                                                                 : NULL;
  if (!s) {
    vs__http_error_code(r, 400, key, "unknown_parameter", "unknown field '%s' (known: prompt, "
                        "model, n, size, response_format, stream, partial_images, quality, "
                        "style, background, moderation, output_format, output_compression, "
                        "user; vspec's: class, method, seed)", key);
    return -1;
  }
  if (!json_is_string(v)) {
    vs__http_error(r, 400, key, "%s: expected a string", key);
    return -1;
  }
  *s = json_string_value(v);
  return 0;
}

static int gen_parse_request(const char *body, size_t len, json_t **root, gen_req *g,
                             vs_http_reply *r) {
  json_error_t je;
  memset(g, 0, sizeof *g);
  g->n = 1;
  *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
  if (!*root) {
    vs__http_error_code(r, 400, NULL, "invalid_json", "the body is not valid JSON: %s (line %d, "
                        "column %d)", je.text, je.line, je.column);
    return -1;
  }
  if (!json_is_object(*root)) {
    vs__http_error_code(r, 400, NULL, "invalid_json", "the body must be a JSON object");
    return -1;
  }
  const char *key;
  json_t *v;
  json_object_foreach(*root, key, v) {
    if (json_is_null(v)) continue; /* OpenAI's clients send unset fields as null */
    if (gen_parse_field(key, v, g, r)) return -1;
  }
  if (g->png && (g->n > 1 || g->stream)) {
    vs__http_error(r, 400, "response_format", "response_format: \"png\" answers with one raw "
                   "image; use \"b64_json\" for n > 1 or a stream");
    return -1;
  }
  if (g->partial_images && !g->stream) {
    vs__http_error(r, 400, "partial_images", "partial_images: only with \"stream\": true");
    return -1;
  }
  return 0;
}

/* ---- size: the model's own, or a multiple of it served by enlarging ---------------------- */

/* Checks g->size against the model's image size (the daemon's status says it). */
static int gen_check_size(vs_http *h, gen_req *g, vs_http_reply *r) {
  g->upscale = 1;
  if (!g->size || !strcmp(g->size, "auto")) return 0;
  vs_conn_event e;
  char err[VSPEC_ERRLEN];
  if (!vs__http_status(h, &e, err, sizeof err)) {
    vs__http_error(r, 503, NULL, "the daemon's status: %s", err);
    r->retry_after_s = 1;
    return -1;
  }
  const Vspec__StatusReply *st = e.ev->status;
  const char *name = g->model ? g->model : st->default_model ? st->default_model : "";
  const Vspec__ModelInfo *m = NULL;
  for (size_t i = 0; i < st->n_models && !m; i++)
    if (st->models[i]->name && !strcmp(st->models[i]->name, name)) m = st->models[i];
  int mw = m ? (int)m->image_w : 0, mh = m ? (int)m->image_h : 0;
  vs_conn_event_free(&e);
  if (!mw || !mh) { /* an unknown model is the daemon's to refuse, in its words */
    return 0;
  }
  unsigned w = 0, hh = 0;
  char tail;
  int k = sscanf(g->size, "%ux%u%c", &w, &hh, &tail) == 2 && w % (unsigned)mw == 0 &&
                  hh % (unsigned)mh == 0 && w / (unsigned)mw == hh / (unsigned)mh
              ? (int)(w / (unsigned)mw) : 0;
  if (k < 1 || k > VS__MAX_UPSCALE) {
    vs__http_error_code(r, 400, "size", "unsupported_size", "size: '%s' is not served by model "
                        "'%s': its images are %dx%d, enlarged by a whole factor up to %d "
                        "(allowed: auto, %dx%d, %dx%d, %dx%d, ..., %dx%d)", g->size, name, mw,
                        mh, VS__MAX_UPSCALE, mw, mh, 2 * mw, 2 * mh, 3 * mw, 3 * mh,
                        VS__MAX_UPSCALE * mw, VS__MAX_UPSCALE * mh);
    return -1;
  }
  g->upscale = k;
  return 0;
}

/* ---- the answer ---------------------------------------------------------------------------- */

/* The stats object of one job (the "vspec" field of the answer and of each image). */
static json_t *gen_stats(const vs_http_job *j, double wall_s) {
  const Vspec__Result *res = j->result->ev->result;
  const Vspec__Stats *st = res->stats;
  char seed[24];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)res->seed);
  json_t *o = json_pack("{s:s,s:s,s:s,s:s?,s:i,s:i,s:f}", "model", j->model, "method", j->method,
                        "seed", seed, "node", res->node, "width", (int)res->width, "height",
                        (int)res->height, "wall_s", wall_s);
  if (!o) return NULL;
  if (j->has_class) json_object_set_new(o, "class", json_integer(j->class_label));
  if (st) {
    json_object_set_new(o, "tpf", json_real(st->tpf));
    json_object_set_new(o, "mal", json_real(st->mal));
    json_object_set_new(o, "accept_rate", json_real(st->accept_rate));
    json_object_set_new(o, "tokens", json_integer((json_int_t)st->tokens));
    json_object_set_new(o, "target_forwards", json_integer((json_int_t)st->target_forwards));
    json_object_set_new(o, "generate_s", json_real(st->generate_s));
  }
  /* What the daemon said about how the job ran (size=auto's choice, a fallback to AR). */
  json_t *notes = json_array();
  for (size_t i = 0; i < res->n_notes; i++)
    json_array_append_new(notes, json_string(res->notes[i]));
  json_object_set_new(o, "notes", notes);
  return o;
}

static void gen_answer_png(const gen_req *g, const vs_http_job *j, vs_http_reply *r) {
  size_t len = 0;
  const void *png = vs_conn_blob(j->result, VSPEC__BLOB_KIND__BLOB_PNG, &len);
  uint8_t *big = NULL;
  char err[256];
  int bw, bh;
  if (!png || !len) {
    vs__http_error(r, 500, NULL, "the daemon's result carries no PNG");
    return;
  }
  if (g->upscale > 1 && vs_png_upscale(png, len, g->upscale, &big, &len, &bw, &bh, err,
                                       sizeof err)) {
    vs__http_error(r, 500, "size", "size: %s", err);
    return;
  }
  r->body = malloc(len);
  if (!r->body) {
    free(big);
    vs__http_error(r, 500, NULL, "out of memory");
    return;
  }
  memcpy(r->body, big ? big : png, len);
  free(big);
  r->len = len;
  r->status = 200;
  r->type = "image/png";
  snprintf(r->seed, sizeof r->seed, "%llu", (unsigned long long)j->result->ev->result->seed);
}

static void gen_answer(const gen_req *g, const vs_http_batch *b, vs_http_reply *r) {
  if (g->png) {
    gen_answer_png(g, &b->jobs[0], r);
    return;
  }
  double wall_s = vs_now() - b->t0;
  json_t *data = json_array(), *seeds = json_array();
  for (int i = 0; i < b->n; i++) {
    const vs_http_job *j = &b->jobs[i];
    char *b64 = vs__http_png_b64(j, g->upscale, r);
    if (!b64) {
      json_decref(data);
      json_decref(seeds);
      return;
    }
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)j->result->ev->result->seed);
    json_array_append_new(seeds, json_string(seed));
    json_array_append_new(data, json_pack("{s:s,s:o,s:o}", "b64_json", b64, "revised_prompt",
                                          vs__http_revised_prompt(j), "vspec",
                                          gen_stats(j, wall_s)));
    free(b64);
  }
  const Vspec__Result *r0 = b->jobs[0].result->ev->result;
  char size[32];
  snprintf(size, sizeof size, "%ux%u", r0->width * (unsigned)g->upscale,
           r0->height * (unsigned)g->upscale);
  /* "vspec" at the top: the first image's figures, as before n > 1, and every seed */
  json_t *top = gen_stats(&b->jobs[0], wall_s);
  if (top) json_object_set_new(top, "seeds", seeds);
  else json_decref(seeds);
  json_t *out = json_pack("{s:I,s:o,s:s,s:s,s:s,s:o,s:o?}", "created", (json_int_t)time(NULL),
                          "data", data, "background", "opaque", "output_format", "png", "size",
                          size, "usage", vs__http_usage(b), "vspec", top);
  if (!out) {
    vs__http_error(r, 500, NULL, "out of memory");
    return;
  }
  vs__http_json(r, 200, out);
}

/* ---- the request --------------------------------------------------------------------------- */

/* The Submit each of the n jobs is sent as. */
static void gen_submit(const vs_http *h, const gen_req *g, Vspec__Submit *s) {
  vspec__submit__init(s);
  s->model = (char *)g->model;
  s->method = (char *)g->method;
  s->has_class_label = g->has_class;
  s->class_label = g->class_label;
  /* "class" wins: with OpenAI's clients a prompt must be sent, and may then be a filler */
  s->prompt = g->has_class ? NULL : (char *)g->prompt;
  s->has_progress = 1; /* nothing to stream to an HTTP client: no progress, no credit */
  s->progress = 0;
  s->tag = "http";
  /* The daemon's own deadline backs ours up: the job stops even if this thread is late. */
  long dl = h->cfg->http_timeout_ms < h->cfg->max_deadline_ms ? h->cfg->http_timeout_ms
                                                              : h->cfg->max_deadline_ms;
  if (dl > 0) {
    s->has_deadline_ms = 1;
    s->deadline_ms = (uint32_t)dl;
  }
}

/* Why the batch ended without its images, as the answer (when someone is there to read it). */
static void gen_gave_up(const vs_http *h, const vs_http_batch *b, vs_http_reply *r) {
  if (b->gave_up == VS_HTTP_STOPPING) {
    vs__http_error(r, 503, NULL, "the daemon is shutting down");
    r->retry_after_s = 1;
  } else if (b->gave_up == VS_HTTP_TIMED_OUT) {
    vs__http_error(r, 504, NULL, "no image within %d ms ([http] timeout_ms): the job was "
                   "cancelled", h->cfg->http_timeout_ms);
  }
}

void vs__http_generate(vs_http *h, int client_fd, int interim, const char *body, size_t len,
                       vs_http_reply *r) {
  json_t *root = NULL;
  gen_req g;
  if (gen_parse_request(body, len, &root, &g, r) || gen_check_size(h, &g, r)) {
    json_decref(root);
    return;
  }
  Vspec__Submit s;
  gen_submit(h, &g, &s);
  vs_http_batch b = {.h = h, .client_fd = client_fd, .client_interim = interim, .submit = &s,
                     .n = g.n,
                     .has_seed = g.has_seed, .seed = g.seed};
  if (!b.has_seed && b.n > 1) {
    /* consecutive seeds need the first: drawn here, below 2^53 as the daemon draws them */
    randombytes_buf(&b.seed, sizeof b.seed);
    b.seed &= (1ull << 53) - 1;
    b.has_seed = 1;
  }
  if (g.stream) { /* the stream keeps the JSON its submit points into */
    r->stream = vs__http_stream_start(h, client_fd, &s, &b, root, g.upscale, g.partial_images, r);
    return;
  }
  if (vs__http_jobs_run(&b, r) == 0) {
    const vs_http_job *f = vs__http_jobs_failed(&b);
    if (b.gave_up) gen_gave_up(h, &b, r);
    else if (f) vs__http_daemon_error(f->err_code, f->err_msg, f->retry_after_ms, r);
    else gen_answer(&g, &b, r);
  }
  vs__http_jobs_free(&b);
  json_decref(root);
}
