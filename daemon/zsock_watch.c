#include "daemon/zsock_watch.h"

#include <zmq.h>

#include "core/log.h"

static int zw_events(void *sock) {
  int ev = 0;
  size_t len = sizeof ev;
  /* Reading ZMQ_EVENTS also processes the socket's pending commands, which is what re-arms
   * the fd for the next edge. */
  if (zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &len)) return 0;
  return ev;
}

static void zw_drain(vs_zwatch *w) {
  int left = w->budget;
  /* on_read may close the watch (the daemon stops once drained): then stop reading, the
   * user's state behind the socket may be gone. */
  while (left > 0 && !w->closing && (zw_events(w->sock) & ZMQ_POLLIN)) {
    int n = w->on_read(w, w->user);
    if (n <= 0) break;
    left -= n;
  }
}

static void zw_on_poll(uv_poll_t *h, int status, int events) {
  (void)events;
  if (status < 0) vs_log(VSPEC_LOG_WARN, "zmq", "poll on ZMQ_FD: %s", uv_strerror(status));
  /* Nothing else: the check handle runs right after this and reads ZMQ_EVENTS. */
  (void)h;
}

static void zw_on_check(uv_check_t *h) { zw_drain(h->data); }

static void zw_on_idle(uv_idle_t *h) { (void)h; }

static void zw_on_prepare(uv_prepare_t *h) {
  vs_zwatch *w = h->data;
  if (w->closing) return;
  if (zw_events(w->sock) & ZMQ_POLLIN) {
    if (!uv_is_active((uv_handle_t *)&w->idle)) uv_idle_start(&w->idle, zw_on_idle);
  } else if (uv_is_active((uv_handle_t *)&w->idle)) {
    uv_idle_stop(&w->idle);
  }
}

int vs_zwatch_start(uv_loop_t *loop, vs_zwatch *w, void *sock, vs_zwatch_read_fn on_read,
                    void *user) {
  int fd;
  size_t len = sizeof fd;
  if (zmq_getsockopt(sock, ZMQ_FD, &fd, &len)) return -1;
  w->sock = sock;
  w->user = user;
  w->on_read = on_read;
  w->on_closed = NULL;
  w->closing = 0;
  if (w->budget <= 0) w->budget = 256;
  int rc = uv_poll_init(loop, &w->poll, fd);
  if (rc) return rc;
  uv_prepare_init(loop, &w->prepare);
  uv_check_init(loop, &w->check);
  uv_idle_init(loop, &w->idle);
  w->poll.data = w->prepare.data = w->check.data = w->idle.data = w;
  w->open_handles = 4;
  uv_poll_start(&w->poll, UV_READABLE, zw_on_poll);
  uv_prepare_start(&w->prepare, zw_on_prepare);
  uv_check_start(&w->check, zw_on_check);
  return 0;
}

static void zw_closed(uv_handle_t *h) {
  vs_zwatch *w = h->data;
  if (--w->open_handles == 0 && w->on_closed) w->on_closed(w, w->user);
}

void vs_zwatch_close(vs_zwatch *w, vs_zwatch_closed_fn on_closed) {
  w->on_closed = on_closed;
  w->closing = 1;
  if (w->open_handles == 0) {
    if (on_closed) on_closed(w, w->user);
    return;
  }
  /* The poll handle goes first: the fd belongs to libzmq and must not be polled after the
   * socket is closed. */
  uv_close((uv_handle_t *)&w->poll, zw_closed);
  uv_close((uv_handle_t *)&w->prepare, zw_closed);
  uv_close((uv_handle_t *)&w->check, zw_closed);
  uv_close((uv_handle_t *)&w->idle, zw_closed);
}

void vs_zwatch_kick(vs_zwatch *w) {
  if (w->open_handles && !w->closing) zw_drain(w);
}
