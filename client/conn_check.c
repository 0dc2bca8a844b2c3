/*
 * client/conn_check.c - why a connection to vspecd does not come up, said at once.
 *
 * A ZeroMQ connect never fails: a refused CURVE key, a plaintext client at a CURVE endpoint
 * or a wrong server key all look like silence until the client's timeout runs out. A socket
 * monitor sees the handshake itself. What libzmq 4.3.4 (Debian 12) reports, measured:
 *   - success: CONNECTED, HANDSHAKE_SUCCEEDED;
 *   - the daemon's ZAP handler refuses the client's key: HANDSHAKE_FAILED_AUTH with the ZAP
 *     status code (400), then DISCONNECTED; libzmq does not reconnect;
 *   - plaintext against CURVE, or CURVE against plaintext: HANDSHAKE_FAILED_PROTOCOL with
 *     ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH on both sides, or (over ipc, depending on
 *     timing) HANDSHAKE_FAILED_NO_DETAIL only: then the peer's own ZMTP greeting, read with
 *     a plain socket (vs_endpoint_mechanism), says which mechanism it speaks;
 *   - a CURVE server key that is not the daemon's: the server cannot open the client's HELLO
 *     and drops the connection: HANDSHAKE_FAILED_NO_DETAIL, again at every reconnect;
 *   - nothing listening: CLOSED and CONNECT_RETRIED, never CONNECTED;
 *   - something that is not ZeroMQ listening: CONNECTED, then nothing until libzmq's own
 *     handshake timeout (30 s).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "client/conn.h"
#include "proto/endpoint_probe.h"
#include "core/metrics.h" /* vs_now */
#include "vspec/types.h"

#define VS_WATCH_EVENTS                                                                      \
  (ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_CLOSED |                      \
   ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |                    \
   ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)

/* Attempts refused in a row, never connected: nothing listens (libzmq retries every 100 ms
 * or so, with jitter). */
#define VS_RETRY_VERDICT 3

/* A CURVE client whose every attempt ends without detail has the wrong server key: one
 * failure can be a fluke of the first connect (seen over ipc), a second is not. */
#define VS_NO_DETAIL_VERDICT 2

int vs_conn_watch(vs_conn *c, char *err, size_t errlen) {
  char ep[64];
  snprintf(ep, sizeof ep, "inproc://vs-conn-watch-%p", (void *)c);
  if (zmq_socket_monitor(c->sock, ep, VS_WATCH_EVENTS)) {
    snprintf(err, errlen, "socket monitor: %s", zmq_strerror(errno));
    return VSPEC_EIO;
  }
  c->mon = zmq_socket(c->ctx, ZMQ_PAIR);
  int linger = 0;
  if (!c->mon || zmq_setsockopt(c->mon, ZMQ_LINGER, &linger, sizeof linger) ||
      zmq_connect(c->mon, ep)) {
    snprintf(err, errlen, "socket monitor: %s", zmq_strerror(errno));
    return VSPEC_EIO;
  }
  return VSPEC_OK;
}

/* One monitor event (two frames: u16 event + u32 value, then the endpoint): 1, or 0 when
 * none came within wait_ms. */
static int cc_next_event(void *mon, int wait_ms, int *event, uint32_t *value) {
  zmq_pollitem_t it = {.socket = mon, .events = ZMQ_POLLIN};
  if (zmq_poll(&it, 1, wait_ms) <= 0) return 0;
  zmq_msg_t a, b;
  zmq_msg_init(&a);
  zmq_msg_init(&b);
  int ok = zmq_msg_recv(&a, mon, 0) >= 6 && zmq_msg_more(&a) && zmq_msg_recv(&b, mon, 0) >= 0;
  if (ok) {
    const uint8_t *d = zmq_msg_data(&a);
    *event = d[0] | d[1] << 8;
    *value = (uint32_t)d[2] | (uint32_t)d[3] << 8 | (uint32_t)d[4] << 16 | (uint32_t)d[5] << 24;
  }
  zmq_msg_close(&a);
  zmq_msg_close(&b);
  return ok;
}

static void cc_unwatch(vs_conn *c) {
  zmq_socket_monitor(c->sock, NULL, 0);
  zmq_close(c->mon);
  c->mon = NULL;
}

static void cc_protocol_error(const vs_conn *c, uint32_t code, char *err, size_t errlen) {
  if (code == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH && c->curve)
    snprintf(err, errlen, "%s does not use CURVE (a plaintext endpoint), but this client "
             "was given a CURVE server key: leave out --curve-server-key and "
             "$VSPEC_CURVE_SERVER_KEY for it (an admin endpoint is always plaintext)",
             c->endpoint);
  else if (code == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
    snprintf(err, errlen, "%s requires CURVE encryption ([curve] enabled = true in its "
             "vspecd.conf) and this client connected in plaintext: give --curve-server-key "
             "(the daemon's public key, its server.pub) and --curve-key (your key pair from "
             "`vspec keygen NAME`), or $VSPEC_CURVE_SERVER_KEY and $VSPEC_CURVE_KEY",
             c->endpoint);
  else
    snprintf(err, errlen, "the ZeroMQ handshake with %s failed (protocol error 0x%08x): is "
             "it a vspecd endpoint of a compatible version?", c->endpoint, code);
}

/* 1 when the peer's ZMTP greeting announces another mechanism than this client's. */
static int cc_mismatch(const vs_conn *c) {
  char mech[21];
  if (!vs_endpoint_mechanism(c->endpoint, 500, mech)) return 0;
  return c->curve ? strcmp(mech, "CURVE") != 0 : strcmp(mech, "NULL") != 0;
}

int vs_conn_wait_ready(vs_conn *c, int timeout_ms, char *err, size_t errlen) {
  if (!c->mon) return 1;
  double end = vs_now() + timeout_ms / 1000.0;
  int connected = 0, retried = 0, no_detail = 0, rc = 0;
  for (;;) {
    int left = (int)((end - vs_now()) * 1000.0);
    int ev = 0;
    uint32_t val = 0;
    if (left <= 0 || !cc_next_event(c->mon, left, &ev, &val)) break;
    if (ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      rc = 1;
      break;
    }
    if (ev == ZMQ_EVENT_CONNECTED) connected = 1;
    if (ev == ZMQ_EVENT_CONNECT_RETRIED && ++retried >= VS_RETRY_VERDICT && !connected) break;
    if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
      snprintf(err, errlen, "CURVE handshake refused by %s (ZAP status %u): this client's "
               "public key is not in the daemon's allowed clients; add the line of your "
               "NAME.pub (from `vspec keygen NAME`) to the file its [curve] allowed_clients "
               "names and restart vspecd, or give --curve-key the key pair it allows",
               c->endpoint, val);
      rc = VSPEC_EIO;
      break;
    }
    if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
      cc_protocol_error(c, val, err, errlen);
      rc = VSPEC_EIO;
      break;
    }
    /* Without detail, libzmq may mean a mechanism mismatch too (a CURVE client at a
     * plaintext endpoint, seen over ipc): the peer's own greeting says which it speaks. */
    if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL && !no_detail++ && cc_mismatch(c)) {
      cc_protocol_error(c, ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH, err, errlen);
      rc = VSPEC_EIO;
      break;
    }
    if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL && c->curve && no_detail >= VS_NO_DETAIL_VERDICT) {
      snprintf(err, errlen, "CURVE handshake with %s failed: the daemon could not read this "
               "client's hello, so the server key given (--curve-server-key or "
               "$VSPEC_CURVE_SERVER_KEY) is not the daemon's; use the public key of its "
               "[curve] secret_key_file (the server.pub `vspec keygen` wrote with it)",
               c->endpoint);
      rc = VSPEC_EIO;
      break;
    }
  }
  if (rc == 0 && !connected && retried > 0) {
    snprintf(err, errlen, "nothing listening on %s (%d connection attempts refused); is "
             "vspecd (or vspec-gateway) running there?", c->endpoint, retried);
    rc = VSPEC_EIO;
  } else if (rc == 0 && connected && !no_detail) {
    snprintf(err, errlen, "connected to %s, but no ZeroMQ handshake within %d ms: is it a "
             "vspecd job or admin endpoint (not, say, its HTTP port)?", c->endpoint,
             timeout_ms);
    rc = VSPEC_EIO;
  } else if (rc == 0) {
    snprintf(err, errlen, "no ZeroMQ handshake with %s within %d ms", c->endpoint, timeout_ms);
  }
  cc_unwatch(c);
  return rc;
}
