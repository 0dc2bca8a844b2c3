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

/* Loads plugins and models, starts the workers and binds both endpoints. */
/* On failure *config_refused says whether the configuration is at fault (a plugin directory
 * missing or writable by others, no model that loads, unreadable CURVE keys or allow-list, a
 * device or address this host does not have: vspecd exits 2) or the moment is (a port in
 * use, I/O, memory: exit 1). */
int vs_server_open(const vs_daemon_config *cfg, vs_server **out, int *config_refused, char *err,
                   size_t errlen);
/* Runs until the daemon has drained after SIGTERM/SIGINT (or vs_server_stop). Returns 0 after
 * a clean drain. */
int vs_server_run(vs_server *s);
void vs_server_close(vs_server *s);

#endif /* VS_SERVER_H */
