/*
 * daemon/zsock_watch.h - a ZeroMQ socket inside a libuv loop.
 *
 * ZMQ_FD is edge-triggered and only says "look at ZMQ_EVENTS"; after any zmq_send or
 * zmq_recv the socket's state can change without a new edge (zmq_getsockopt(3), ZMQ_FD and
 * ZMQ_EVENTS). So the fd
 * poll only wakes the loop, and the real decision is made from ZMQ_EVENTS in two places:
 *  - a check handle (after the loop's I/O phase) reads while ZMQ_EVENTS says POLLIN, until
 *    EAGAIN or a per-iteration budget,
 *  - a prepare handle (before the loop would block) looks again and, if input is still
 *    pending (budget hit, or messages that arrived during our own sends), starts an idle
 *    handle so the loop does not block, and the next check drains the rest.
 * One watch per socket, used on the loop thread only (ZeroMQ sockets are not thread-safe).
 */
#ifndef VS_ZSOCK_WATCH_H
#define VS_ZSOCK_WATCH_H

#include <uv.h>

typedef struct vs_zwatch vs_zwatch;
/* Called while the socket has input; read with ZMQ_DONTWAIT. Return the number of messages
 * read: the watch calls again in the same iteration until 0 or the budget is used. */
typedef int (*vs_zwatch_read_fn)(vs_zwatch *w, void *user);
typedef void (*vs_zwatch_closed_fn)(vs_zwatch *w, void *user);

struct vs_zwatch {
  void *sock;
  void *user;
  vs_zwatch_read_fn on_read;
  vs_zwatch_closed_fn on_closed;
  int budget; /* messages per loop iteration before others get a turn */
  int open_handles;
  int closing; /* vs_zwatch_close was called: read nothing more, even inside a drain */
  uv_poll_t poll;
  uv_prepare_t prepare;
  uv_check_t check;
  uv_idle_t idle;
};

int vs_zwatch_start(uv_loop_t *loop, vs_zwatch *w, void *sock, vs_zwatch_read_fn on_read,
                    void *user);
/* Stops watching and closes the libuv handles; on_closed runs once they are closed (then the
 * socket may be zmq_close'd and the memory of w reused). May be called from on_read: the
 * watch reads nothing after it. */
void vs_zwatch_close(vs_zwatch *w, vs_zwatch_closed_fn on_closed);
/* Reads now if there is input (after sending from outside the watch's callbacks). */
void vs_zwatch_kick(vs_zwatch *w);

#endif /* VS_ZSOCK_WATCH_H */
