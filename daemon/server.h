/*
 * daemon/server.h - vspecd's event loop: the job and admin endpoints, clients, the queue
 * and the workers, put together.
 *
 * Threads: the libuv loop thread owns every ZeroMQ socket and all client state; N worker
 * threads run jobs (daemon/workers.h) and hand news back through a mailbox drained by a
 * uv_async callback; the ZAP thread (daemon/zap.h) answers CURVE authentication. Model
 * reloads run on libuv's thread pool.
 *
 * Guarantees (DESIGN.md, "Daemon"):
 *  - every accepted job gets exactly one terminal event (Result or Error), unless its client
 *    is gone, in which case the job is cancelled and freed;
 *  - a full queue answers "busy" with a retry hint; nothing is dropped silently;
 *  - progress and previews never exceed the job's credit: while the client has no credit
 *    the worker's newest state and newest preview replace older ones (coalescing);
 *  - no request, however malformed, stops the daemon: it gets an Error event naming the
 *    problem (or is dropped when it cannot even be routed back).
 */
#ifndef VS_SERVER_H
#define VS_SERVER_H

#include <stddef.h>

#include "daemon/config.h"

typedef struct vs_server vs_server;

/* A front: a part of vspecd that reaches the service as one more client of it, over an inproc
 * endpoint of the job socket, so that its jobs get the same validation, fairness, credit,
 * deadline, cancel and drain as any other (the HTTP endpoint, http/http_server.h; the fleet
 * agent, fleet/fleet_agent.h). The service knows its fronts only through this table: daemon/
 * includes neither folder, and vspecd's main (vspecd/vspecd.c) hands in those that the
 * configuration turns on. `*front` is the front's own state, NULL until it is made. */
typedef struct vs_server_front {
  const char *endpoint; /* the inproc endpoint the job socket binds for it */
  /* Optional: called before the models load, so that a mistake (a port in use) costs no
   * load. cfg is the server's copy, which outlives the front. */
  int (*prepare)(const vs_daemon_config *cfg, void **front, char *err, size_t errlen);
  /* Once the service's sockets are bound: starts serving through `endpoint` in the ZeroMQ
   * context zctx. */
  int (*start)(const vs_daemon_config *cfg, void **front, void *zctx, const char *endpoint,
               char *err, size_t errlen);
  /* Optional: the daemon began draining. */
  void (*drain)(void *front);
  /* Stops and frees *front (NULL: nothing to do) and sets it to NULL; called in table order,
   * before the ZeroMQ context goes. */
  void (*stop)(void **front);
} vs_server_front;
#define VS_SERVER_MAX_FRONTS 4

/* Loads plugins and models, starts the workers, binds both endpoints and starts the fronts
 * (n_fronts <= VS_SERVER_MAX_FRONTS; the table is copied). */
/* On failure *config_refused says whether the configuration is at fault (a plugin directory
 * missing or writable by others, no model that loads, unreadable CURVE keys or allow-list, a
 * device or address this host does not have: vspecd exits 2) or the moment is (a port in
 * use, I/O, memory: exit 1). */
int vs_server_open(const vs_daemon_config *cfg, const vs_server_front *fronts, int n_fronts,
                   vs_server **out, int *config_refused, char *err, size_t errlen);
/* Runs until the daemon has drained after SIGTERM/SIGINT (or vs_server_stop). Returns 0 after
 * a clean drain. */
int vs_server_run(vs_server *s);
void vs_server_close(vs_server *s);

#endif /* VS_SERVER_H */
