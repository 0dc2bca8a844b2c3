/*
 * fleet/gateway.h - vspec-gateway: the ZeroMQ front of a fleet (issue 13; DESIGN.md, "Fleet
 * mode").
 *
 * Clients talk to a gateway exactly as to vspecd. A submit becomes an entry of the fleet's
 * jobs stream in Redis (fleet/fleet_queue.h), which some vspecd in fleet mode reads and
 * runs, writing the job's events to the job's own event stream; the gateway relays that
 * stream back to the client. The gateway keeps no durable state: a job is known by its id
 * alone, and everything needed to follow it is in Redis, so gateways can be added, restarted
 * or lost at will, and a client can resume a job's events through any of them (Resume, from
 * the Event.cursor it last saw).
 *
 * Submit. The job id is a random nonzero number below 2^63 (its decimal text is the fleet's
 * job id); the payload is the request frame as the client sent it and its blob frames
 * (fleet_event.h, "VSR1"). The gateway first writes an Accepted of its own to the job's
 * event stream (job id, waiting jobs ahead, the gateway's name), then enqueues: so the client
 * learns the job id before anything else, and the daemon's Accepted always comes after it.
 * A full queue (--max-len) is ERR_BUSY, Redis unreachable ERR_UNAVAILABLE.
 *
 * Relay. Each (connection, job) followed has a cursor, the id of the last event sent; every
 * loop turn reads what came after it, without blocking, and sends it with the job id, the
 * follow's own sequence number (from 0, no gaps), the request id of the submit or resume and
 * the event's cursor. A client whose queue is full (EAGAIN) leaves the cursor where it is:
 * the event is read again later, so nothing is kept in memory for slow clients. Progress and
 * preview events cost one credit, as in vspecd; without credit they are skipped (the cursor
 * moves on). The first result or error in the stream ends the follow: a second one (a run
 * restarted on another daemon) is never sent; only a resume from a cursor past the first
 * would reach it, and clients resume from the last event before their terminal one. A job
 * whose events vanish while followed (expired, or Redis restarted empty) ends with
 * ERR_NOT_FOUND. A client that is gone (unroutable, or taking nothing for 5 heartbeats) is
 * no longer followed; its jobs run on, and it can resume them.
 *
 * Redis. Every call may find Redis unreachable. Submits are then answered ERR_UNAVAILABLE;
 * the relay keeps its cursors and tries again with a backoff (100 ms doubling to 2 s), with
 * one log line when Redis goes and one when it is back. Nothing here exits for Redis.
 *
 * One thread: the front socket and one synchronous fleet queue.
 */
#ifndef VS_GATEWAY_H
#define VS_GATEWAY_H

#include <stddef.h>

typedef struct vs_gateway_config {
  char front[256];
  const char *redis_url;     /* vs_fleet_opts.url */
  const char *node;          /* name in Accepted, Pong and status */
  const char *stream;        /* the fleet's jobs stream */
  const char *group;         /* the daemons' consumer group (for the pending count) */
  const char *events_prefix;
  long long max_len;         /* jobs waiting or running in the stream; more: busy */
  int per_client;            /* jobs one connection may follow at once; more: busy */
  long long events_ttl_s;    /* a job's events expire this long after the last one */
  int heartbeat_ms;          /* heartbeat to silent clients with jobs; TCP liveness */
  long max_message_bytes;    /* front: ZMQ_MAXMSGSIZE and blob frames of requests */
  long max_request_bytes;    /* front: the protobuf frame of a request */
  const char *curve_secret_file; /* CURVE on the front, with ... */
  const char *curve_allow_file;  /* ... this allow-list (daemon/zap.h) */
} vs_gateway_config;

/* node "vspec-gateway", the fleet queue's defaults (stream "vspec:jobs", group "vspec",
 * events prefix "vspec:events:", max_len 1024, 1 hour), per_client 16, heartbeat 1 s,
 * 4 MiB frames, 64 KiB request frames; front and redis_url unset. */
void vs_gateway_config_defaults(vs_gateway_config *c);

/* Checks what can be checked without connecting (the Redis URL, the key names, the node
 * name, the limits). Returns 0, or VSPEC_EINVAL with a message that starts with the
 * option's name ("--stream: ..."). */
int vs_gateway_check(const vs_gateway_config *c, char *err, size_t errlen);

/* Runs until SIGTERM/SIGINT. Returns 0 on a clean stop, a negative status if it could not
 * start (message in err). Redis need not be up. */
int vs_gateway_run(const vs_gateway_config *cfg, char *err, size_t errlen);

#endif /* VS_GATEWAY_H */
