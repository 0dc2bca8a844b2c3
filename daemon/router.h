/*
 * daemon/router.h - sockets that face peers we do not control (vspecd's endpoints, the
 * gateway's front), made so that no peer can abort the process through libzmq 4.3.4.
 *
 *  - vs_router_open: a ROUTER whose automatic routing ids cannot be predicted. libzmq starts a
 *    ROUTER's ids (0x00 + a 32-bit counter) at rand(), and never seeds rand(); a peer that
 *    names itself (ZMQ_ROUTING_ID) what the ROUTER hands out next makes the next ordinary
 *    peer collide with it, which libzmq answers with an assertion (abort).
 *  - vs_tcp_liveness: dead peers found by TCP keepalive and TCP_USER_TIMEOUT instead of ZMTP
 *    heartbeats: libzmq 4.3.4's heartbeat timer aborts the process on a connection that was
 *    reset while libzmq had stopped reading it (a flood, then RST).
 * docs/RELIABILITY.md lists the defects and their tests.
 */
#ifndef VS_ROUTER_H
#define VS_ROUTER_H

#include <stddef.h>

/* A new ROUTER in zctx, or NULL with the reason in err. */
void *vs_router_open(void *zctx, char *err, size_t errlen);

/* TCP keepalive probes after ivl_ms of silence, every ivl_ms (whole seconds, at least 1), and
 * the connection closed once sent data or probes stay unanswered for timeout_ms. Without
 * effect on ipc and inproc endpoints. Returns 0 or -1 (errno set). */
int vs_tcp_liveness(void *sock, int ivl_ms, int timeout_ms);

/* The client-facing ROUTER of vspec-gateway: vs_router_open, then
 * ROUTER_MANDATORY (a vanished peer is EHOSTUNREACH, a full one EAGAIN), a per-frame size
 * limit, no linger, vs_tcp_liveness(hb_ms, 5 hb_ms), CURVE with the secret key of
 * `curve_secret_file` when it is not NULL (the ZAP handler must already be bound in zctx),
 * and bound to `endpoint`. NULL with the reason in err (the socket closed). */
void *vs_router_front(void *zctx, const char *endpoint, long max_message_bytes, int hb_ms,
                      const char *curve_secret_file, char *err, size_t errlen);

#endif /* VS_ROUTER_H */
