/*
 * fleet/gateway_state.h - inside vspec-gateway (fleet/gateway.h): the state its files share
 * and what each offers the others, each calling only those below it in this list:
 *
 *   gateway.c        the loop, the front socket, requests;
 *   gateway_jobs.c   the job requests: submit, resume, cancel;
 *   gateway_relay.c  the table of followed jobs and the relay of their event streams;
 *   gateway_reply.c  the gateway's own replies, kept while a client's queue is full, and
 *                    the end of a client found gone;
 *   gateway_redis.c  Redis's health (the backoff) and the jobs stream's depth.
 */
#ifndef VS_GATEWAY_STATE_H
#define VS_GATEWAY_STATE_H

#include <stdint.h>

#include "fleet/fleet_queue.h"
#include "fleet/gateway.h"
#include "core/metrics.h" /* vs_now */
#include "proto/wire.h"

#define VS_GW_DEFAULT_CREDIT 8 /* as vspecd's [limits] credit */
#define VS_GW_MAX_CREDIT 1024
#define VS_GW_JOB_TEXT 24      /* a job id in decimal, with its NUL */

/* One job followed by one client connection. */
typedef struct vs_gw_follow {
  uint64_t job;
  char job_text[VS_GW_JOB_TEXT];          /* the fleet's job id */
  vs_wire_envelope client;
  char user_id[VS_WIRE_MAX_USER_ID + 1];  /* the client's CURVE key ("" without CURVE) */
  uint64_t request_id;                    /* of the submit or resume: echoed in each event */
  char cursor[VS_FLEET_ID_MAX];           /* the last event sent or skipped */
  int64_t credit;                         /* progress/preview events the client may get */
  uint64_t seq;                           /* of the next event sent */
  uint64_t skipped;                       /* progress/previews skipped for want of credit */
  double last_sent;                       /* anything sent to the client for this job */
  double last_event;                      /* an event was read, or the stream checked */
  double next_read, idle;                 /* a quiet stream is read less often */
  double blocked_since;                   /* the client's queue was full (0: it is not) */
  int warned;                             /* a Redis error about this stream was logged */
  int done;                               /* ended, or its client is gone: see vs_gw_sweep */
  struct vs_gw_follow *next;
} vs_gw_follow;

typedef struct vs_gw_out vs_gw_out; /* the gateway's own replies kept for a client */

typedef struct vs_gw {
  const vs_gateway_config *cfg;
  void *ctx, *front;
  vs_fleet_queue *q;
  char where[300];    /* Redis without the password: FleetInfo.redis and messages */
  size_t max_payload; /* of a job: the queue's bound */
  vs_gw_follow *follows;
  vs_gw_out *out;
  int down;           /* Redis unreachable: asked again at retry_at */
  double retry_at, backoff;
  char redis_err[VSPEC_ERRLEN];
  double started;
  uint64_t submitted, busy, malformed, clients_lost;
  uint64_t completed, failed, cancelled; /* terminal events delivered to clients */
} vs_gw;


/* Redis's health (gateway_redis.c). Whether to ask it now: while it is unreachable, once per backoff. */
int vs_gw_redis_ready(const vs_gw *g, double now);
/* Every fleet call's status goes through here: a lost connection starts (or doubles) the
 * backoff, an answer ends it, each logged once. Returns rc. */
int vs_gw_redis_note(vs_gw *g, int rc, const char *err);
/* XLEN and XPENDING of the jobs stream (the group made first when Redis has none). */
int vs_gw_depth(vs_gw *g, long long *len, long long *pend, char *err, size_t errlen);

/* Own replies (gateway_reply.c). Sent at once, or kept while the client's queue is full
 * and retried from the loop; the client's relayed events wait behind them, so it sees
 * everything in order. A client that takes none for 5 heartbeats is gone. */
void vs_gw_send_own(vs_gw *g, const vs_wire_envelope *env, Vspec__Event *ev);
void vs_gw_reply_error(vs_gw *g, const vs_wire_envelope *env, uint64_t rid, int code,
                       const char *msg); /* busy and unavailable: with retry_after_ms */
/* A request that needed Redis, which is unreachable (rc VSPEC_EIO) or answered with an
 * error: ERR_UNAVAILABLE, naming Redis (never its password). */
void vs_gw_reply_redis(vs_gw *g, const vs_wire_envelope *env, uint64_t rid, int rc,
                       const char *err);
void vs_gw_retry_out(vs_gw *g, double now);
int vs_gw_has_kept(const vs_gw *g, const vs_wire_envelope *env);
void vs_gw_drop_kept(vs_gw *g, const vs_wire_envelope *env);
void vs_gw_kept_free(vs_gw *g); /* everything kept, at the end */
/* The client is unroutable or stopped reading: its follows end (the jobs run on; it can
 * resume them), what was kept for it is dropped. */
void vs_gw_client_gone(vs_gw *g, const vs_wire_envelope *env, const char *why);

/* Job requests (gateway_jobs.c); each answers the client itself. */
void vs_gw_submit(vs_gw *g, const vs_wire_msg *m, const Vspec__Request *r, uint64_t rid);
void vs_gw_resume(vs_gw *g, const vs_wire_msg *m, const Vspec__Resume *rs, uint64_t rid);
void vs_gw_cancel(vs_gw *g, const vs_wire_msg *m, uint64_t job, uint64_t rid);

/* The follow table. A new follow reads the job's events after `after` ("0-0": all). */
vs_gw_follow *vs_gw_follow_add(vs_gw *g, const vs_wire_msg *m, uint64_t job, uint64_t rid,
                               const char *after, int64_t credit);
/* Starts a follow over (a resume of a job the connection follows already). */
void vs_gw_follow_restart(vs_gw_follow *f, uint64_t rid, const char *after, int64_t credit);
/* The follow of `job` by the client of m: its envelope and its CURVE key must both match. */
vs_gw_follow *vs_gw_follow_find(vs_gw *g, const vs_wire_msg *m, uint64_t job);
int vs_gw_follows_of(const vs_gw *g, const vs_wire_envelope *env);
int vs_gw_clients(const vs_gw *g); /* connections with followed jobs */

/* One relay turn: new events of each followed job; returns 1 when a stream had more than one
 * read takes (the loop comes back at once). Then heartbeats; vs_gw_sweep frees the follows
 * that ended. */
int vs_gw_relay(vs_gw *g, double now);
void vs_gw_heartbeat(vs_gw *g, double now);
void vs_gw_sweep(vs_gw *g);
void vs_gw_follows_free(vs_gw *g);

#endif /* VS_GATEWAY_STATE_H */
