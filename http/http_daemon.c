/*
 * http/http_daemon.c - the HTTP endpoint's side of its daemon: a connection over inproc for
 * one request, the daemon's status, and the daemon's errors as HTTP answers
 * (http/http_internal.h). Every route that asks the daemon goes through it.
 */
#include "http/http_internal.h"

#include <stdio.h>
#include <string.h>

#include "vspec/types.h"

#define DAEMON_STATUS_TIMEOUT_MS 2000

int vs__http_connect(vs_http *h, vs_conn *c, char *err, size_t errlen) {
  vs_conn_opts o = {.ctx = h->zctx};
  return vs_conn_open(c, h->endpoint, &o, err, errlen);
}

int vs__http_status(vs_http *h, vs_conn_event *e, char *err, size_t errlen) {
  vs_conn c;
  if (vs__http_connect(h, &c, err, errlen)) return 0;
  Vspec__Request q = VSPEC__REQUEST__INIT;
  Vspec__StatusRequest sr = VSPEC__STATUS_REQUEST__INIT;
  q.body_case = VSPEC__REQUEST__BODY_STATUS;
  q.status = &sr;
  int rc = vs_conn_call(&c, &q, DAEMON_STATUS_TIMEOUT_MS, e, err, errlen);
  vs_conn_close(&c);
  if (rc == 0) snprintf(err, errlen, "the daemon did not answer within %d ms",
                        DAEMON_STATUS_TIMEOUT_MS);
  if (rc == 1 && e->ev->body_case != VSPEC__EVENT__BODY_STATUS) {
    snprintf(err, errlen, "the daemon answered no status: %s",
             e->ev->body_case == VSPEC__EVENT__BODY_ERROR ? e->ev->error->message : "?");
    vs_conn_event_free(e);
    return 0;
  }
  return rc == 1;
}

/* The parameter a daemon message names ("class_label: 12 is out of range ..."), in the
 * HTTP request's spelling. */
static const char *daemon_param_of(const char *msg, char *buf, size_t n) {
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

void vs__http_daemon_error(int code, const char *msg, uint32_t retry_after_ms,
                           vs_http_reply *r) {
  char pb[40];
  const char *param = daemon_param_of(msg, pb, sizeof pb);
  int retry = 0;
  switch (code) {
  case VSPEC__ERROR_CODE__ERR_INVALID:
  case VSPEC__ERROR_CODE__ERR_MALFORMED:
  case VSPEC__ERROR_CODE__ERR_TOO_LARGE:
    vs__http_error_code(r, 400, param,
                        param && !strcmp(param, "prompt") ? "unknown_class" : NULL, "%s", msg);
    break;
  case VSPEC__ERROR_CODE__ERR_BUSY: /* a full queue: OpenAI's clients retry a 429 */
    vs__http_error(r, 429, NULL, "%s", msg);
    retry = 1;
    break;
  case VSPEC__ERROR_CODE__ERR_SHUTTING_DOWN:
  case VSPEC__ERROR_CODE__ERR_CANCELLED:
    vs__http_error(r, 503, NULL, "%s", msg);
    retry = 1;
    break;
  case VSPEC__ERROR_CODE__ERR_DEADLINE:
    vs__http_error(r, 504, NULL, "%s", msg);
    break;
  default:
    vs__http_error(r, 500, NULL, "%s", msg);
  }
  if (retry) r->retry_after_s = retry_after_ms ? (int)((retry_after_ms + 999) / 1000) : 1;
}
