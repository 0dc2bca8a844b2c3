/*
 * daemon/http_server.h - vspecd's HTTP endpoint ([http] listen; DESIGN.md "HTTP endpoint"):
 * GET /health, GET /metrics (Prometheus text format 0.0.4) and an OpenAI-style
 * POST /v1/images/generations, for users and tools that do not speak ZeroMQ.
 *
 * libmicrohttpd serves it with a thread per connection (at most [http] max_connections).
 * Like the fleet agent (daemon/fleet_agent.h), every request is a client of its own daemon:
 * each one connects to the daemon's job socket over inproc and sends a Submit or a
 * StatusRequest exactly as a ZeroMQ client would, so HTTP jobs get the same validation,
 * fairness, credit, deadline, cancel and drain, and the daemon's loop thread never waits on
 * HTTP. A job whose HTTP client disconnects is cancelled.
 */
#ifndef VS_HTTP_SERVER_H
#define VS_HTTP_SERVER_H

#include <stddef.h>
#include <sys/socket.h>

#include "daemon/config.h"

typedef struct vs_http vs_http;

/* "HOST:PORT": an IPv4 address, "[IPv6]" or "localhost", and a port 0..65535 (0: any free
 * one). Returns 0 or VSPEC_EINVAL with a message naming the problem. */
int vs_http_parse_listen(const char *text, struct sockaddr_storage *sa, socklen_t *len,
                         char *err, size_t errlen);
int vs_http_addr_is_loopback(const struct sockaddr_storage *sa);

/* Binds cfg->http_listen and listens (a port in use is an error, not a wait): called before
 * the models load, so that the mistake costs no load. cfg must outlive the server. */
int vs_http_listen(const vs_daemon_config *cfg, vs_http **out, char *err, size_t errlen);
/* Starts serving; requests connect to `endpoint` (an inproc endpoint of the job socket) in
 * ZeroMQ context `zctx`. Logs the bound address, with the real port when the configured one
 * was 0. */
int vs_http_serve(vs_http *h, void *zctx, const char *endpoint, char *err, size_t errlen);
/* The port it listens on. */
int vs_http_port(const vs_http *h);
/* Stops accepting, ends the requests in flight (their jobs are cancelled) and joins the
 * threads, before the ZeroMQ context goes; frees h and sets *h to NULL. */
void vs_http_stop(vs_http **h);

#endif /* VS_HTTP_SERVER_H */
