#include "daemon/router.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/curve_keys.h"

/* Why the seed, and why that is the fix.
 *
 * libzmq 4.3.4 names a ROUTER's peers that bring no routing id of their own 0x00 + a 32-bit
 * counter, big-endian, which starts at generate_random() = rand() | rand() << 31 when the
 * ROUTER is made and counts up (router.cpp, identify_peer). libzmq never calls srand(), so
 * unseeded the counter starts at the same value in every process. A peer may call itself
 * anything (ZMQ_ROUTING_ID; with CURVE on, any allowed key may): one that takes the next
 * automatic id makes the next ordinary peer's id a duplicate, the automatic path does not look
 * for one, and add_out_pipe asserts (socket_base.cpp:2130): SIGABRT.
 *
 * The collision cannot be refused from the server side in 4.3.4: the peer's id arrives in the
 * ZMTP handshake, before the application sees anything (a ZAP request carries the server's
 * routing id, not the peer's), and ZMQ_ROUTER_HANDOVER only changes what happens when a
 * peer's *chosen* id is taken (the newcomer takes the name over, which would let a stranger
 * take another client's events, and the old connection is renamed with the next automatic id,
 * unchecked again), never the automatic path. So the counter is made unpredictable: rand() is
 * seeded from getrandom() right before each ROUTER is made, so its start is one of 2^32
 * values. Peers never see routing ids (the ROUTER strips them; only logs show them), so an
 * attacker guesses blind: each connection it holds open under a guessed name collides with an
 * ordinary newcomer with probability 2^-32, a thousand of them (about a whole fd limit) once
 * in some four million newcomers on average, instead of with the first one. */
static int rt_seed(char *err, size_t errlen) {
  unsigned seed = 0;
  ssize_t n;
  do {
    n = getrandom(&seed, sizeof seed, 0);
  } while (n < 0 && errno == EINTR);
  if (n == (ssize_t)sizeof seed) {
    srand(seed);
    return 0;
  }
  /* getrandom(2) missing (ENOSYS): the same bytes from the device */
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    n = read(fd, &seed, sizeof seed);
    close(fd);
    if (n == (ssize_t)sizeof seed) {
      srand(seed);
      return 0;
    }
  }
  snprintf(err, errlen, "no random seed for the ROUTER's routing ids (getrandom and "
           "/dev/urandom failed: %s)", strerror(errno));
  return -1;
}

void *vs_router_open(void *zctx, char *err, size_t errlen) {
  if (rt_seed(err, errlen)) return NULL;
  void *z = zmq_socket(zctx, ZMQ_ROUTER);
  if (!z) snprintf(err, errlen, "zmq_socket(ROUTER): %s", zmq_strerror(errno));
  return z;
}

static int rt_secs(int ms) { return ms < 1000 ? 1 : ms / 1000; }

/* libzmq 4.3.4's ZMTP heartbeat timer (ZMQ_HEARTBEAT_IVL) writes through a connection's
 * engine without looking at its I/O error flag: after a peer floods until libzmq stops reading
 * it and then resets, the timer asserts (stream_engine_base.cpp:331). So sockets facing peers
 * run without ZMTP heartbeats and leave dead-peer detection to the kernel, which needs no
 * engine: keepalive probes find a silent peer on an idle connection, TCP_USER_TIMEOUT
 * (ZMQ_TCP_MAXRT) one that stops acknowledging what was sent. Either closes the connection,
 * and the next send to the peer fails with EHOSTUNREACH (the daemon's Heartbeat events
 * make sure there is one). */
int vs_tcp_liveness(void *sock, int ivl_ms, int timeout_ms) {
  int on = 1, idle = rt_secs(ivl_ms), intvl = rt_secs(ivl_ms);
  int cnt = (timeout_ms + intvl * 1000 - 1) / (intvl * 1000);
  if (cnt < 1) cnt = 1;
  if (cnt > 127) cnt = 127; /* TCP_KEEPCNT's limit */
  if (zmq_setsockopt(sock, ZMQ_TCP_KEEPALIVE, &on, sizeof on) ||
      zmq_setsockopt(sock, ZMQ_TCP_KEEPALIVE_IDLE, &idle, sizeof idle) ||
      zmq_setsockopt(sock, ZMQ_TCP_KEEPALIVE_INTVL, &intvl, sizeof intvl) ||
      zmq_setsockopt(sock, ZMQ_TCP_KEEPALIVE_CNT, &cnt, sizeof cnt) ||
      zmq_setsockopt(sock, ZMQ_TCP_MAXRT, &timeout_ms, sizeof timeout_ms))
    return -1;
  return 0;
}

void *vs_router_front(void *zctx, const char *endpoint, long max_message_bytes, int hb_ms,
                      const char *curve_secret_file, char *err, size_t errlen) {
  void *z = vs_router_open(zctx, err, errlen);
  if (!z) return NULL;
  int one = 1, linger = 0;
  int64_t maxmsg = max_message_bytes;
  /* No ZMTP heartbeats (libzmq 4.3.4 can abort on them, above): TCP liveness instead. */
  if (zmq_setsockopt(z, ZMQ_ROUTER_MANDATORY, &one, sizeof one) ||
      zmq_setsockopt(z, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
      zmq_setsockopt(z, ZMQ_LINGER, &linger, sizeof linger) ||
      vs_tcp_liveness(z, hb_ms, 5 * hb_ms)) {
    snprintf(err, errlen, "front socket: %s", zmq_strerror(errno));
    goto fail;
  }
  if (curve_secret_file) {
    char secret[41];
    if (vs_curve_read_key(curve_secret_file, "secret", secret, err, errlen)) goto fail;
    if (zmq_setsockopt(z, ZMQ_CURVE_SERVER, &one, sizeof one) ||
        zmq_setsockopt(z, ZMQ_CURVE_SECRETKEY, secret, 40) ||
        zmq_setsockopt(z, ZMQ_ZAP_DOMAIN, "vspec", 5)) {
      snprintf(err, errlen, "CURVE options: %s", zmq_strerror(errno));
      goto fail;
    }
  }
  if (zmq_bind(z, endpoint)) {
    snprintf(err, errlen, "cannot bind %s: %s", endpoint, zmq_strerror(errno));
    goto fail;
  }
  return z;
fail:
  zmq_close(z);
  return NULL;
}
