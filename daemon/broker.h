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
 * reach the daemon that runs the job. Job ids must not collide: give each daemon its own
 * [server] node_id.
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
  long max_message_bytes;
  long max_request_bytes;
  const char *curve_secret_file; /* CURVE on the front, with ... */
  const char *curve_allow_file;  /* ... this allow-list (daemon/zap.h) */
  const char *backend_server_key; /* CURVE towards the daemons (their public key) */
  const char *backend_client_key; /* the broker's key pair as a daemon client */
} vs_broker_config;

/* Runs until SIGTERM/SIGINT. Returns 0 on a clean stop, a negative status if it could not
 * start (message in err). */
int vs_broker_run(const vs_broker_config *cfg, char *err, size_t errlen);

#endif /* VS_BROKER_H */
