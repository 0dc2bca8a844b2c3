#include "client/conn.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/metrics.h" /* vs_now */
#include "proto/curve_keys.h"
#include "vspec/types.h"

int vs_conn_open(vs_conn *c, const char *endpoint, const vs_conn_opts *opts, char *err,
                 size_t errlen) {
  memset(c, 0, sizeof *c);
  snprintf(c->endpoint, sizeof c->endpoint, "%s", endpoint);
  c->max_blob = (size_t)1 << 30;
  c->next_request_id = 1;
  c->ctx = opts && opts->ctx ? opts->ctx : zmq_ctx_new();
  c->own_ctx = !(opts && opts->ctx);
  if (!c->ctx) {
    snprintf(err, errlen, "zmq_ctx_new failed");
    return VSPEC_EIO;
  }
  c->sock = zmq_socket(c->ctx, ZMQ_DEALER);
  int linger = 200;
  if (!c->sock || zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger)) {
    snprintf(err, errlen, "cannot create a socket: %s", zmq_strerror(errno));
    vs_conn_close(c);
    return VSPEC_EIO;
  }
  if (opts && opts->server_key) {
    char server[41], pub[41], sec[41];
    int rc;
    if ((rc = vs_curve_key_arg(opts->server_key, "public", server, err, errlen))) {
      vs_conn_close(c);
      return rc;
    }
    if (!opts->client_key) {
      snprintf(err, errlen, "CURVE needs this client's key file too (vspec keygen NAME)");
      vs_conn_close(c);
      return VSPEC_EINVAL;
    }
    if ((rc = vs_curve_read_key(opts->client_key, "public", pub, err, errlen)) ||
        (rc = vs_curve_read_key(opts->client_key, "secret", sec, err, errlen))) {
      vs_conn_close(c);
      return rc;
    }
    if (zmq_setsockopt(c->sock, ZMQ_CURVE_SERVERKEY, server, 40) ||
        zmq_setsockopt(c->sock, ZMQ_CURVE_PUBLICKEY, pub, 40) ||
        zmq_setsockopt(c->sock, ZMQ_CURVE_SECRETKEY, sec, 40)) {
      snprintf(err, errlen, "CURVE options: %s", zmq_strerror(errno));
      vs_conn_close(c);
      return VSPEC_EIO;
    }
    c->curve = 1;
  }
  int rc;
  if (opts && opts->watch_handshake && (rc = vs_conn_watch(c, err, errlen))) {
    vs_conn_close(c);
    return rc;
  }
  if (zmq_connect(c->sock, endpoint)) {
    snprintf(err, errlen, "cannot connect to %s: %s", endpoint, zmq_strerror(errno));
    vs_conn_close(c);
    return VSPEC_EIO;
  }
  return VSPEC_OK;
}

void vs_conn_close(vs_conn *c) {
  if (c->mon) zmq_close(c->mon);
  if (c->sock) zmq_close(c->sock);
  c->mon = NULL;
  if (c->ctx && c->own_ctx) zmq_ctx_term(c->ctx);
  c->sock = c->ctx = NULL;
}

int vs_conn_send(vs_conn *c, Vspec__Request *r, vs_wire_blob *blobs, int n_blobs, char *err,
                 size_t errlen) {
  if (!r->has_request_id) {
    r->has_request_id = 1;
    r->request_id = c->next_request_id++;
  }
  int rc = vs_wire_send_request(c->sock, NULL, r, blobs, n_blobs, 0);
  if (rc) {
    snprintf(err, errlen, "send to %s failed: %s", c->endpoint, zmq_strerror(-rc));
    return VSPEC_EIO;
  }
  return VSPEC_OK;
}

int vs_conn_recv(vs_conn *c, int timeout_ms, vs_conn_event *e, char *err, size_t errlen) {
  memset(e, 0, sizeof *e);
  double end = vs_now() + timeout_ms / 1000.0;
  for (;;) {
    int rc = vs_wire_recv(c->sock, 0, &e->msg, c->max_blob, c->max_blob, err, errlen);
    if (rc < 0) return rc;
    if (rc == 1) break;
    int wait = timeout_ms < 0 ? -1 : (int)((end - vs_now()) * 1000.0 + 0.5);
    if (timeout_ms >= 0 && wait <= 0) return 0;
    zmq_pollitem_t it = {.socket = c->sock, .events = ZMQ_POLLIN};
    int n = zmq_poll(&it, 1, wait);
    if (n < 0) {
      if (errno == EINTR) return 0; /* a signal: let the caller look at its flags */
      snprintf(err, errlen, "poll: %s", zmq_strerror(errno));
      return VSPEC_EIO;
    }
    if (n == 0) return 0;
  }
  int code;
  vs_wire_alloc_init(&e->alloc, (size_t)64 << 20);
  e->ev = vs_wire_unpack_event(&e->msg, &e->alloc, &code, err, errlen);
  if (!e->ev) {
    vs_wire_msg_close(&e->msg);
    return VSPEC_EFORMAT;
  }
  return 1;
}

void vs_conn_event_free(vs_conn_event *e) {
  if (e->ev) vs_wire_event_free(e->ev, &e->alloc);
  e->ev = NULL;
  vs_wire_msg_close(&e->msg);
}

const void *vs_conn_blob(const vs_conn_event *e, int kind, size_t *size) {
  int i = vs_wire_find_blob(e->ev->blobs, e->ev->n_blobs, kind);
  if (i < 0) return NULL;
  zmq_msg_t *m = (zmq_msg_t *)&e->msg.blobs[i];
  if (size) *size = zmq_msg_size(m);
  return zmq_msg_data(m);
}

int vs_conn_call(vs_conn *c, Vspec__Request *r, int timeout_ms, vs_conn_event *e, char *err,
                 size_t errlen) {
  r->has_request_id = 0;
  int rc = vs_conn_send(c, r, NULL, 0, err, errlen);
  if (rc) return rc;
  double end = vs_now() + timeout_ms / 1000.0;
  for (;;) {
    int left = (int)((end - vs_now()) * 1000.0);
    if (left <= 0) return 0;
    rc = vs_conn_recv(c, left, e, err, errlen);
    if (rc <= 0) return rc;
    if (e->ev->has_request_id && e->ev->request_id == r->request_id) return 1;
    vs_conn_event_free(e);
  }
}
