/*
 * fleet/fleet_queue_internal.h - what the files of the fleet queue share (not a public API;
 * the queue is fleet/fleet_queue.h). One concern a file:
 *   fleet_queue.c         the connection and its commands: open, connect, one command and its
 *                         reply, the checks of replies and ids, scripts, names and keys
 *   fleet_queue_addr.c    redis:// and unix: addresses
 *   fleet_queue_jobs.c    the jobs stream: group, enqueue, read (with delivery counts), ack,
 *                         depth
 *   fleet_queue_claims.c  jobs between daemons: stale entries, lost runs announced, releases
 *                         and claims, running claims refreshed, cancel flags
 *   fleet_queue_events.c  each job's event stream, and a gateway's submit in one step
 */
#ifndef VS_FLEET_QUEUE_INTERNAL_H
#define VS_FLEET_QUEUE_INTERNAL_H

#include <hiredis/hiredis.h>

#include "core/names.h"
#include "fleet/fleet_queue.h"

struct vs_fleet_queue {
  redisContext *c; /* NULL while not connected */
  vs_fleet_addr addr;
  char where[300]; /* "unix:/path" or "host:port", for messages: never the password */
  char stream[65], group[65], consumer[64], events_prefix[65];
  int has_consumer;
  long long max_len, events_max_len, events_ttl_ms;
  size_t max_payload;
  int connect_timeout_ms, command_timeout_ms;
  char cursor[VS_FLEET_ID_MAX + 1]; /* where the next stale scan starts: "-" or "(<id>" */
};

/* A job id is part of its event stream's key and of every log line about the job. */
extern const vs_name_kind vs__fq_job_name;

/* ---- the connection and its commands (fleet_queue.c) ---- */

void vs__fq_drop(vs_fleet_queue *q);
/* Reads n replies (of commands appended before). All of them or none: after an I/O error the
 * replies read so far are freed and the connection is dropped. */
int vs__fq_getn(vs_fleet_queue *q, const char *what, int n, redisReply **r, long long wait_ms,
                char *err, size_t errlen);
int vs__fq_append(vs_fleet_queue *q, const char *what, char *err, size_t errlen,
                  const char *fmt, ...);
/* Connects if not connected; messages start with `what`, the command that needed it. */
int vs__fq_connect(vs_fleet_queue *q, const char *what, char *err, size_t errlen);
/* One command, one reply: connects first if needed. An error reply is returned as a reply
 * (callers that tolerate some errors look at it); vs__fq_want turns it into a status. */
int vs__fq_run(vs_fleet_queue *q, const char *what, long long block_ms, redisReply **out,
               char *err, size_t errlen, const char *fmt, ...);
/* Status of reply r of `what`, expected of type `type`: VS_FLEET_EREDIS for an error reply,
 * VSPEC_EFORMAT for any other type (r stays with the caller either way). */
int vs__fq_want(const vs_fleet_queue *q, const char *what, const redisReply *r, int type,
                char *err, size_t errlen);
int vs__fq_bad_shape(const vs_fleet_queue *q, const char *what, const char *why, char *err,
                     size_t errlen);
/* "<ms>-<seq>" or "<ms>" (Redis's own spelling of ids), plus "$" where allowed. */
int vs__fq_id_ok(const char *s, int dollar);
int vs__fq_check_id(const char *what, const char *id, int dollar, char *err, size_t errlen);
/* The replies of MULTI, k queued commands and EXEC (k + 2 in r): the EXEC's array of k
 * results, or an error naming the first command that failed. */
int vs__fq_exec(const vs_fleet_queue *q, const char *what, redisReply **r, int k,
                const redisReply **results, char *err, size_t errlen);
/* A script's EVAL: argv[0] "EVAL", argv[1] the script, then its key count, keys and
 * arguments; argl NULL for strings only. One round trip; the reply as vs__fq_run's. */
int vs__fq_eval(vs_fleet_queue *q, const char *what, int argc, const char **argv,
                const size_t *argl, redisReply **out, char *err, size_t errlen);
int vs__fq_events_key(const vs_fleet_queue *q, const char *what, const char *job_id,
                      char *key, size_t cap, char *err, size_t errlen);
int vs__fq_is_str(const redisReply *r);
unsigned char *vs__fq_dup(const char *s, size_t n);
/* The field named `name` of an entry's field list (an array of names and values), or NULL. */
const redisReply *vs__fq_field(const redisReply *fields, const char *name);

/* ---- jobs from the stream (fleet_queue_jobs.c) ---- */

/* One stream entry, [id, [field, value, ...]], into a job. VSPEC_EFORMAT when the entry
 * itself is not one (then the whole reply is suspect); bad fields only mark it malformed. */
int vs__fq_job_from(const vs_fleet_queue *q, const char *what, const redisReply *e,
                    vs_fleet_job *j, char *err, size_t errlen);
/* Delivery counts of jobs[0..n) from one pipeline of XPENDING <id> <id> 1: 0 for an entry
 * that is no longer pending. */
int vs__fq_deliveries(vs_fleet_queue *q, vs_fleet_job *jobs, int n, char *err,
                      size_t errlen);

#endif /* VS_FLEET_QUEUE_INTERNAL_H */
