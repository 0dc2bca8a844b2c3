/*
 * client/conn.h - a client's connection to vspecd (or vspec-gateway): one DEALER socket,
 * requests out, events in.
 *
 * Used by the vspec CLI, vspecd-bench and the tests' raw clients. The socket is a DEALER, so
 * several jobs can be in flight on one connection; every message starts with the empty
 * delimiter frame (proto/vspec.proto). Requests carry a request id, and the replies that are
 * not job events (status, plugins, reload, pong, errors of refused requests) echo it.
 */
#ifndef VS_CONN_H
#define VS_CONN_H

#include <stdint.h>

#include "proto/wire.h"

typedef struct vs_conn {
  void *ctx;
  void *sock;
  int own_ctx;
  uint64_t next_request_id;
  char endpoint[256];
  size_t max_blob;
  void *mon;  /* the socket monitor's PAIR while the handshake is watched, or NULL */
  int curve;  /* this side speaks CURVE */
} vs_conn;

typedef struct vs_conn_opts {
  const char *server_key; /* CURVE: the server's public key (Z85) or NULL */
  const char *client_key; /* CURVE: this client's key file (public + secret) */
  void *ctx;              /* a ZeroMQ context to share, or NULL for a private one */
  int watch_handshake;    /* monitor the connection so vs_conn_wait_ready can say why it
                             fails (client/conn_check.c) */
} vs_conn_opts;

int vs_conn_open(vs_conn *c, const char *endpoint, const vs_conn_opts *opts, char *err,
                 size_t errlen);
void vs_conn_close(vs_conn *c);

/* client/conn_check.c. Starts the socket monitor (before zmq_connect). */
int vs_conn_watch(vs_conn *c, char *err, size_t errlen);
/* Waits up to timeout_ms for the ZeroMQ handshake of a connection opened with
 * watch_handshake, then stops watching. Returns 1 when the handshake succeeded, 0 when there
 * was no verdict in time and nothing pointed to a cause (the caller carries on), or
 * VSPEC_EIO with err saying what failed and what to do: nothing listening, the daemon refused
 * this client's CURVE key, a plaintext client against a CURVE endpoint or the reverse, a
 * CURVE server key that is not the daemon's, something that is not ZeroMQ listening. Every
 * verdict comes from the events libzmq 4.3 reports (ZMQ_EVENT_HANDSHAKE_*, _CONNECT_RETRIED,
 * _CLOSED), within a few hundred milliseconds for all but the last. Without watching: 1. */
int vs_conn_wait_ready(vs_conn *c, int timeout_ms, char *err, size_t errlen);

/* Sends a request (version and, if unset, a fresh request id filled in). Returns 0 or a
 * negative status. */
int vs_conn_send(vs_conn *c, Vspec__Request *r, vs_wire_blob *blobs, int n_blobs, char *err,
                 size_t errlen);

/* One received event. Free with vs_conn_event_free. */
typedef struct vs_conn_event {
  vs_wire_msg msg;
  vs_wire_alloc alloc;
  Vspec__Event *ev;
} vs_conn_event;

/* Waits up to timeout_ms (-1 = forever) for the next event. Returns 1 (event in *e), 0 (timed
 * out) or a negative status (socket error or a malformed event; err says which). */
int vs_conn_recv(vs_conn *c, int timeout_ms, vs_conn_event *e, char *err, size_t errlen);
void vs_conn_event_free(vs_conn_event *e);
/* Bytes of blob `kind` in the event, or NULL. */
const void *vs_conn_blob(const vs_conn_event *e, int kind, size_t *size);

/* Sends r and waits for the event with its request id (heartbeats and other events are
 * skipped). Returns 1, 0 on timeout, or a negative status. */
int vs_conn_call(vs_conn *c, Vspec__Request *r, int timeout_ms, vs_conn_event *e, char *err,
                 size_t errlen);

#endif /* VS_CONN_H */
