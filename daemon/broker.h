/*
 * daemon/broker.h - vspec-broker: one front endpoint for several vspecd daemons.
 *
 * In the spirit of Majordomo (ZeroMQ RFC 18, MDP/0.2): clients talk to one ROUTER; the broker
 * keeps per-backend load and liveness, dispatches each Submit to the least loaded live daemon,
 * streams the daemon's events back as they come (PARTIAL: accepted, progress, previews;
 * FINAL: exactly one result or error), heartbeats every backend and fails over. Unlike MDP the
 * broker dials the daemons (a static list, one DEALER each) instead of daemons registering,
 * so vspecd needs no broker-specific code: to a daemon the broker is one client whose
 * messages carry one more routing frame.
 *
 * Routing: the broker reads only the small protobuf frame of each message (blobs are separate
 * frames and are passed through untouched) to learn job ids, so cancel and credit requests
 * reach the daemon that runs the job. Jobs are keyed by (daemon, job id), but a client names
 * a job by its id alone, so ids must not collide: give each daemon its own [server]
 * node_id. Daemons report theirs in status replies; of live daemons that share one, only the
 * first listed gets jobs (logged as an error), and an Accepted whose job id is already taken
 * is cancelled on its daemon and refused to the client.
 *
 * Answers to a submit count only from the daemon the submit waits on: after a failover the
 * old daemon's late Accepted is cancelled there, its late busy ignored.
 *
 * Slow clients: an event the client's queue cannot take (EAGAIN) is kept, with everything
 * after it for that client, and retried from the poll loop, so terminal events are never
 * dropped; a client that takes nothing for 5 heartbeats (or lets 4096 events pile up) is
 * treated as gone.
 *
 * Failures: a daemon that answers "busy" gets the submit retried on the next live daemon; a
 * daemon silent for 3 heartbeats is declared dead and each of its jobs ends with
 * ERR_UNAVAILABLE for its client; a client that vanishes has its jobs cancelled on their
 * daemons.
 */
#ifndef VS_BROKER_H
#define VS_BROKER_H

#include <stddef.h>

#define VS_BROKER_MAX_BACKENDS 32

typedef struct vs_broker_config {
  char front[256];
  char backends[VS_BROKER_MAX_BACKENDS][256];
  int n_backends;
  int heartbeat_ms;   /* status poll of each backend; dead after 3 missed */
  long max_message_bytes; /* front: ZMQ_MAXMSGSIZE and blob frames of client requests */
  long max_request_bytes; /* front: the protobuf frame of a request */
  long max_event_bytes;   /* frames of the daemons' events (PNG results): trusted peers */
  const char *curve_secret_file; /* CURVE on the front, with ... */
  const char *curve_allow_file;  /* ... this allow-list (daemon/zap.h) */
  const char *backend_server_key; /* CURVE towards the daemons (their public key) */
  const char *backend_client_key; /* the broker's key pair as a daemon client */
} vs_broker_config;

/* Runs until SIGTERM/SIGINT. Returns 0 on a clean stop, a negative status if it could not
 * start (message in err). */
int vs_broker_run(const vs_broker_config *cfg, char *err, size_t errlen);

#endif /* VS_BROKER_H */
