/*
 * http/http_server.h - vspecd's HTTP endpoint ([http] listen; DESIGN.md "HTTP endpoint"):
 * GET /health, GET /metrics (Prometheus text format 0.0.4) and an OpenAI-style
 * POST /v1/images/generations, for users and tools that do not speak ZeroMQ.
 *
 * libmicrohttpd serves it with a thread per connection (at most [http] max_connections).
 * Like the fleet agent (fleet/fleet_agent.h), every request is a client of its own daemon:
 * each one connects to the daemon's job socket over inproc and sends a Submit or a
 * StatusRequest exactly as a ZeroMQ client would, so HTTP jobs get the same validation,
 * fairness, credit, deadline, cancel and drain, and the daemon's loop thread never waits on
 * HTTP. A job whose HTTP client disconnects is cancelled.
 */
#ifndef VS_HTTP_SERVER_H
#define VS_HTTP_SERVER_H

#include "daemon/server.h"

/* The endpoint as a front of vspecd's service (daemon/server.h), on inproc://vspecd-http: it
 * binds [http] listen before the models load (a port in use is an error, not a wait), serves
 * once the service's sockets are bound, and at close ends the requests in flight (their jobs
 * are cancelled) and joins their threads, before the ZeroMQ context goes. The address is
 * checked with the configuration (http/http_addr.h). */
extern const vs_server_front vs_http_front;

#endif /* VS_HTTP_SERVER_H */
