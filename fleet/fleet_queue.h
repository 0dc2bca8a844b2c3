/*
 * fleet/fleet_queue.h - the fleet's job queue on Redis Streams, over one synchronous
 * hiredis connection (issue 13; DESIGN.md, "Fleet mode").
 *
 * Fleet mode keeps jobs in Redis so that they outlive the daemon that runs them: a job is an
 * entry of one stream (fields `job`: the id the client can retry with, `payload`: the packed
 * request, any bytes), the daemons read it through one consumer group, and each job's events
 * go to a stream of its own (`<events_prefix><job id>`, field `data`) that expires some time
 * after its last event. An entry stays pending (XPENDING) from the read until the ack, so a
 * daemon that dies mid-job leaves it there for another one to claim (XCLAIM) once it has
 * been idle long enough (vs_fleet_stale, vs_fleet_claim); Redis counts the deliveries, which
 * is what bounds a poison job. The daemon running a job refreshes its claim (vs_fleet_touch)
 * every heartbeat; a job idle for the claim time is a lost run, announced to its client
 * once (vs_fleet_announce_loss) before another daemon takes it over.
 *
 * This file is only the queue: commands, their replies and their errors. What a job means,
 * when to ack it, how often to retry, is the caller's. Nothing here is thread-safe: one
 * vs_fleet_queue per thread (a blocking read holds the connection for its whole wait).
 *
 * Errors. Every function returns 0 (or a count) or a negative status and, then, a message in
 * err that names the Redis command:
 *   VSPEC_EBUSY     enqueue: the jobs stream already holds max_len entries;
 *   VSPEC_EIO       no connection: it could not be made, was lost, or a reply did not come
 *                   within the timeout. The connection is dropped and the next call connects
 *                   again (each call tries once, with the connect timeout; retrying with a
 *                   backoff is the caller's). A command that failed this way may or may not
 *                   have run: nothing here repeats one;
 *   VS_FLEET_EREDIS Redis answered with an error (NOGROUP, OOM, WRONGTYPE, WRONGPASS...); the
 *                   connection stays;
 *   VSPEC_EFORMAT   a reply of a shape this code does not know (not a Redis that speaks
 *                   Streams as 7.0 does);
 *   VSPEC_EINVAL    a bad argument or option; VSPEC_ENOMEM.
 * A lost connection never raises SIGPIPE in the caller, whatever its signal setup.
 */
#ifndef VS_FLEET_QUEUE_H
#define VS_FLEET_QUEUE_H

#include <stddef.h>

#include "vspec/types.h"

/* Redis answered a command with an error reply (beyond the vspec_status range so that it is
 * not mistaken for one of those). */
#define VS_FLEET_EREDIS (-1101)

/* A stream entry id, "<ms>-<seq>": two 64-bit decimals and a dash, with its NUL. */
#define VS_FLEET_ID_MAX 48
/* A job id: 1-128 bytes of [A-Za-z0-9._:-] (part of a key name and of log lines). */
#define VS_FLEET_JOB_ID_MAX 128

typedef struct vs_fleet_opts {
  /* redis://[[user]:password@]host[:port][/db] (port 6379, db 0),
   * unix://[[user]:password@]/path/to/sock or /path/to/sock. No percent-decoding; messages
   * never show the password. */
  const char *url;
  const char *stream;        /* the jobs stream (key) */
  const char *group;         /* the daemons' consumer group */
  const char *consumer;      /* this daemon in the group (its node name); NULL for a process
                                that only enqueues, appends or reads events */
  const char *events_prefix; /* a job's event stream is this prefix and the job id */
  long long max_len;         /* jobs the stream may hold, waiting and running: enqueue's bound */
  long long events_max_len;  /* events kept per job (the oldest go first) */
  long long events_ttl_ms;   /* an event stream expires this long after its last append */
  size_t max_payload;        /* bytes of one job's payload or one event's data */
  int connect_timeout_ms;
  int command_timeout_ms;    /* per reply; a blocking read waits its block time on top */
} vs_fleet_opts;

/* stream "vspec:jobs", group "vspec", no consumer, events_prefix "vspec:events:", max_len
 * 1024, events_max_len 1024, events_ttl_ms 1 hour, max_payload 4 MiB (the wire's default
 * frame limit), timeouts 2 s; url NULL (required). */
void vs_fleet_opts_defaults(vs_fleet_opts *o);

/* Where a URL points; vs_fleet_addr_parse is what vs_fleet_queue_open uses, exposed so that a
 * configuration can be checked without connecting. */
typedef struct vs_fleet_addr {
  char host[256]; /* "" for a unix socket */
  int port;
  char path[108]; /* the unix socket's path ("" for tcp): sun_path's size */
  char user[64];
  char password[256];
  int db;
} vs_fleet_addr;

int vs_fleet_addr_parse(const char *url, vs_fleet_addr *a, char *err, size_t errlen);

typedef struct vs_fleet_queue vs_fleet_queue;

/* Checks and copies the options; connects nothing (the first command does, or
 * vs_fleet_queue_connect), so a daemon can start before Redis does. */
int vs_fleet_queue_open(const vs_fleet_opts *o, vs_fleet_queue **out, char *err, size_t errlen);
/* Closes the connection, frees q and sets *q to NULL (NULL or *q NULL: nothing). */
void vs_fleet_queue_destroy(vs_fleet_queue **q);
/* Connects now if not connected (and authenticates, selects the db); 0 or VSPEC_EIO. */
int vs_fleet_queue_connect(vs_fleet_queue *q, char *err, size_t errlen);
/* 1 while a connection is held (it may still turn out lost at the next command). */
int vs_fleet_queue_connected(const vs_fleet_queue *q);

/* A job as read or claimed. payload is malloc'd (with a NUL after it, not counted); clear it
 * with vs_fleet_job_clear. An entry without a valid `job` and `payload` (not written by
 * vs_fleet_enqueue) comes back with malformed = 1, its entry id, job_id "" and no payload: it
 * is pending all the same, so the caller acks it (and says so) rather than leave it to be
 * claimed again and again. */
typedef struct vs_fleet_job {
  char entry_id[VS_FLEET_ID_MAX];
  char job_id[VS_FLEET_JOB_ID_MAX + 1];
  unsigned char *payload;
  size_t payload_len;
  long long deliveries; /* this delivery included (1 the first time); 0: no longer pending
                           (acked by another consumer in between): do not run it */
  int malformed;
} vs_fleet_job;

void vs_fleet_job_clear(vs_fleet_job *j);

/* XGROUP CREATE stream group 0 MKSTREAM: from id 0, so jobs enqueued before the first daemon
 * came up are delivered too. An existing group (BUSYGROUP) is success. */
int vs_fleet_ensure_group(vs_fleet_queue *q, char *err, size_t errlen);

/* Adds a job: XLEN, then VSPEC_EBUSY if the stream holds max_len entries, else XADD. The
 * check and the add are two commands, so gateways that enqueue at the same moment can each
 * pass it and take the stream a little past max_len (by at most one entry per concurrent
 * enqueuer); the bound is admission control, not an invariant. The XADD's own MAXLEN is a
 * backstop at twice the bound, never reached by that race: trimming drops the oldest
 * entries, pending ones included, so a trim is a lost job. entry_id (VS_FLEET_ID_MAX bytes,
 * may be NULL) gets the new entry's id. */
int vs_fleet_enqueue(vs_fleet_queue *q, const char *job_id, const void *payload, size_t len,
                     char *entry_id, char *err, size_t errlen);

/* The next job never delivered to the group, for this consumer: XREADGROUP COUNT 1, blocking
 * up to block_ms (<= 0: not at all), then XPENDING for its delivery count. Returns 1 with
 * *job filled, 0 when none came, or an error (a missing group is VS_FLEET_EREDIS, NOGROUP:
 * see vs_fleet_ensure_group; a Redis restarted without persistence has none). A connection
 * lost between the two commands leaves the job pending on this consumer: a claim takes it
 * once it is idle. */
int vs_fleet_read(vs_fleet_queue *q, int block_ms, vs_fleet_job *job, char *err,
                  size_t errlen);

/* Done with a job: XACK and XDEL in one MULTI/EXEC, so that the stream's length counts only
 * jobs waiting or running (enqueue's bound) and an acked job is never delivered again.
 * Returns 1, or 0 when the entry was no longer pending. XACK does not check who holds the
 * entry: a daemon whose job was claimed away still acks it (fleet mode decides what that
 * means, DESIGN.md). */
int vs_fleet_ack(vs_fleet_queue *q, const char *entry_id, char *err, size_t errlen);

/* A job whose daemon stopped refreshing its claim: pending for at least the claim time. */
typedef struct vs_fleet_stale_job {
  char entry_id[VS_FLEET_ID_MAX];
  char job_id[VS_FLEET_JOB_ID_MAX + 1]; /* "" for an entry without a valid `job` field (not
                                           written by enqueue: no event stream to tell) */
  char consumer[64];                    /* the daemon that held it */
  long long idle_ms;
  long long deliveries;                 /* of the run that stopped (1 the first time) */
} vs_fleet_stale_job;

/* Up to max jobs pending for at least min_idle_ms on any consumer (their daemon is presumed
 * dead), with who held them: XPENDING IDLE and each entry's `job` field, in one Lua script.
 * Each call resumes where the previous one's scan stopped (from the start again after a
 * short page), so calling it periodically visits the whole pending list. Reads only: see
 * vs_fleet_announce_loss and vs_fleet_claim. Returns the number filled in out[]. */
int vs_fleet_stale(vs_fleet_queue *q, long long min_idle_ms, vs_fleet_stale_job *out, int max,
                   char *err, size_t errlen);

/* Tells a lost run's client, exactly once per lost run: atomically (one Lua script), if the
 * entry is still pending with the same delivery count and still idle for min_idle_ms, and no
 * one has announced this run's loss yet, marks it lost (`<stream>:lost:<entry id>:<delivery>`,
 * expiring with the events) and appends `event` (an encoded fleet event, fleet_event.h) to
 * the job's event stream as vs_fleet_event_append does. The mark is a commitment: from then
 * on vs_fleet_touch no longer refreshes that run's claim, so its daemon, if it was only slow,
 * gives the job up instead of racing the one that runs it again. Returns 1 when this call
 * announced it, 0 when the run was announced already, refreshed, claimed or acked. */
int vs_fleet_announce_loss(vs_fleet_queue *q, const vs_fleet_stale_job *s, long long min_idle_ms,
                           const void *event, size_t len, char *err, size_t errlen);

/* The same announcement by the daemon holding the job, which stops (drains) without running
 * it: if the entry is pending on this consumer with that delivery count, marks the run lost,
 * appends `event` and sets the entry's idle time to idle_ms (the fleet's claim time), so that
 * the next sweep of any daemon takes it over instead of waiting out the claim time. Returns 1,
 * or 0 when the run was announced already or is no longer this consumer's. */
int vs_fleet_release(vs_fleet_queue *q, const char *entry_id, const char *job_id,
                     long long deliveries, long long idle_ms, const void *event, size_t len,
                     char *err, size_t errlen);

/* Takes over one job found by vs_fleet_stale if it is still idle for min_idle_ms (XCLAIM,
 * which raises its delivery count; so two daemons never both take it), then reads its
 * delivery count. Returns 1 with *job filled, 0 when another daemon took it first, it was
 * acked, or its entry is gone (Redis then drops it from the pending list). */
int vs_fleet_claim(vs_fleet_queue *q, const char *entry_id, long long min_idle_ms,
                   vs_fleet_job *job, char *err, size_t errlen);

/* One event of a job's event stream; data is malloc'd (NUL after it, not counted), NULL for an
 * entry without a `data` field (not written by vs_fleet_event_append). */
typedef struct vs_fleet_event {
  char id[VS_FLEET_ID_MAX];
  unsigned char *data;
  size_t len;
} vs_fleet_event;

void vs_fleet_event_clear(vs_fleet_event *e);

/* Appends to the job's event stream, keeping its last events_max_len, and (re)sets its
 * expiry to events_ttl_ms: XADD and PEXPIRE in one MULTI/EXEC, so that no stream is ever left
 * without an expiry by a connection lost between the two. event_id (may be NULL) gets the
 * new event's id. */
int vs_fleet_event_append(vs_fleet_queue *q, const char *job_id, const void *data, size_t len,
                          char *event_id, char *err, size_t errlen);

/* Up to max events of the job after after_id ("0" or "0-0": from the first; "$": only those
 * appended from now on; an event's id: the ones after it), waiting up to block_ms (<= 0: not
 * at all) when there are none yet: XREAD. Returns the number filled in ev[] (0 when none
 * came; a job without an event stream, or one expired, is 0 as well). */
int vs_fleet_events_read(vs_fleet_queue *q, const char *job_id, const char *after_id,
                         int block_ms, vs_fleet_event *ev, int max, char *err, size_t errlen);

/* Queue depth: the stream's length (jobs waiting and running, XLEN) and the group's pending
 * count (delivered, not acked: running or abandoned; XPENDING). Either pointer may be NULL. */
int vs_fleet_depth(vs_fleet_queue *q, long long *length, long long *pending, char *err,
                   size_t errlen);

/* Keeps running jobs un-idle, so that no other daemon claims them: for each entry id still
 * pending on this consumer whose run was not announced lost (vs_fleet_announce_loss), resets
 * its idle time (XCLAIM JUSTID, which leaves the delivery count alone) and sets
 * still_ours[i] = 1; an entry acked, claimed by another consumer or announced lost (this
 * daemon was taken for dead) gets 0 and is not touched: one Lua script, atomic, so a refresh
 * never steals a job back. Call it every [fleet] heartbeat_ms, at most a third of the
 * others' claim time (DESIGN.md, "Fleet mode"). Returns how many are still ours. */
int vs_fleet_touch(vs_fleet_queue *q, const char *const *entry_ids, int n, int *still_ours,
                   char *err, size_t errlen);

/* Cancel flags, a key per job (`<stream>:cancel:<job id>`, expiring with the job's events):
 * set by a gateway when a client cancels, polled by the daemon running the job at round
 * boundaries. vs_fleet_cancel_check sets cancelled[i] for each job whose flag is set and
 * returns how many are (one pipelined EXISTS per job). */
int vs_fleet_cancel_set(vs_fleet_queue *q, const char *job_id, char *err, size_t errlen);
int vs_fleet_cancel_check(vs_fleet_queue *q, const char *const *job_ids, int n, int *cancelled,
                          char *err, size_t errlen);

/* 1 if the job has an event stream (it was run, or is running, and has not expired), else 0. */
int vs_fleet_events_exist(vs_fleet_queue *q, const char *job_id, char *err, size_t errlen);

/* A gateway's submit, atomically (one Lua script): with a digest (a client-chosen job id,
 * Submit.job_id), the id is looked up first: taken by the same digest, VS_FLEET_SAME (a retry:
 * follow that job); by another, VS_FLEET_CONFLICT. Then enqueue's bound (VSPEC_EBUSY), and
 * then the job's first event (the gateway's Accepted) goes to its event stream, the entry to
 * the jobs stream and the id key (`<stream>:id:<job id>`, holding the digest, expiring with
 * the events) is set: VS_FLEET_NEW, the entry's id in entry_id. All of it or none, so a
 * gateway or a Redis that dies half way never leaves a retry following a job that is not
 * there. */
#define VS_FLEET_NEW 1
#define VS_FLEET_SAME 2
#define VS_FLEET_CONFLICT 3
int vs_fleet_submit(vs_fleet_queue *q, const char *job_id, const void *payload, size_t len,
                    const void *first_event, size_t event_len, const char *digest,
                    char *entry_id, char *err, size_t errlen);

/* Puts off the expiry of a job's event stream and of its client-chosen id (by events_ttl_ms
 * from now): called by the daemon that takes the job and by gateways while a followed job is
 * quiet, so that a job that waits in the queue longer than the TTL keeps its events and its
 * id. Returns 1 when the event stream exists, 0 when it does not (expired, or lost). */
int vs_fleet_job_keepalive(vs_fleet_queue *q, const char *job_id, char *err, size_t errlen);

#endif /* VS_FLEET_QUEUE_H */
