/*
 * http/http_reply.c - the bodies of the HTTP endpoint's answers: JSON, and OpenAI-style errors
 * (http/http_internal.h). A leaf: every route answers through it, and it calls none of them.
 */
#include "http/http_internal.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void vs__http_json(vs_http_reply *r, int status, void *json) {
  free(r->body);
  r->status = status;
  r->type = "application/json";
  r->body = json ? json_dumps(json, JSON_COMPACT) : NULL;
  r->len = r->body ? strlen(r->body) : 0;
  json_decref(json);
  if (!r->body) r->status = MHD_HTTP_INTERNAL_SERVER_ERROR;
}

/* OpenAI's error types and a code for each status the endpoint answers with. */
static void reply_error_kind(int status, const char **type, const char **code) {
  *type = status >= 500 ? "server_error" : status == 429 ? "rate_limit_error"
                                                         : "invalid_request_error";
  switch (status) {
  case 400: *code = "invalid_value"; break;
  case 404: *code = "not_found"; break;
  case 405: *code = "method_not_allowed"; break;
  case 413: *code = "request_too_large"; break;
  case 417: *code = "expectation_failed"; break;
  case 429: *code = "queue_full"; break;
  case 503: *code = "unavailable"; break;
  case 501: *code = "not_implemented"; break;
  case 504: *code = "timeout"; break;
  default: *code = "internal_error";
  }
}

static void reply_error_v(vs_http_reply *r, int status, const char *param, const char *code,
                          const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  const char *type, *dflt;
  reply_error_kind(status, &type, &dflt);
  json_t *e = json_pack("{s:{s:s,s:s,s:o,s:s}}", "error", "message", msg, "type", type, "param",
                        param ? json_string(param) : json_null(), "code", code ? code : dflt);
  vs__http_json(r, status, e);
  r->status = status;
}

void vs__http_error(vs_http_reply *r, int status, const char *param, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  reply_error_v(r, status, param, NULL, fmt, ap);
  va_end(ap);
}

void vs__http_error_code(vs_http_reply *r, int status, const char *param, const char *code,
                         const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  reply_error_v(r, status, param, code, fmt, ap);
  va_end(ap);
}
