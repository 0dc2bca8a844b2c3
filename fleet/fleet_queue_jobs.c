/*
 * fleet/fleet_queue_jobs.c - the fleet queue's jobs stream: the consumer group, enqueue, read (each job
 * with its delivery count), ack and depth (fleet/fleet_queue.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "fleet/fleet_queue_internal.h"

int vs_fleet_ensure_group(vs_fleet_queue *q, char *err, size_t errlen) {
  redisReply *r;
  int rc = vs__fq_run(q, "XGROUP CREATE", 0, &r, err, errlen, "XGROUP CREATE %s %s 0 MKSTREAM",
                  q->stream, q->group);
  if (rc) return rc;
  if (r->type == REDIS_REPLY_ERROR && r->str && !strncmp(r->str, "BUSYGROUP", 9))
    rc = VSPEC_OK; /* another daemon made it first */
  else
    rc = vs__fq_want(q, "XGROUP CREATE", r, REDIS_REPLY_STATUS, err, errlen);
  freeReplyObject(r);
  return rc;
}

int vs_fleet_enqueue(vs_fleet_queue *q, const char *job_id, const void *payload, size_t len,
                     char *entry_id, char *err, size_t errlen) {
  if (entry_id) entry_id[0] = '\0';
  int rc = vs_name_check(&vs__fq_job_name, "XADD job", job_id ? job_id : "", err, errlen);
  if (rc) return rc;
  if (len > q->max_payload || (len && !payload)) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "XADD: a payload of %zu bytes (at most %zu)", len, q->max_payload);
  }
  redisReply *r;
  if ((rc = vs__fq_run(q, "XLEN", 0, &r, err, errlen, "XLEN %s", q->stream))) return rc;
  rc = vs__fq_want(q, "XLEN", r, REDIS_REPLY_INTEGER, err, errlen);
  long long n = r->integer;
  freeReplyObject(r);
  if (rc) return rc;
  if (n >= q->max_len) {
    return vs_fail(err, errlen, VSPEC_EBUSY,
                   "XLEN: the fleet queue %s holds %lld jobs, its bound is %lld: busy",
                   q->stream, n, q->max_len);
  }
  char cap[24];
  snprintf(cap, sizeof cap, "%lld", 2 * q->max_len);
  rc = vs__fq_run(q, "XADD", 0, &r, err, errlen, "XADD %s MAXLEN ~ %s * job %b payload %b",
              q->stream, cap, job_id, strlen(job_id), len ? payload : "", len);
  if (rc) return rc;
  rc = vs__fq_want(q, "XADD", r, REDIS_REPLY_STRING, err, errlen);
  if (!rc && r->len >= VS_FLEET_ID_MAX)
    rc = vs__fq_bad_shape(q, "XADD", "entry id too long", err, errlen);
  if (!rc && entry_id) memcpy(entry_id, r->str, r->len + 1);
  freeReplyObject(r);
  return rc;
}

void vs_fleet_job_clear(vs_fleet_job *j) {
  if (!j) return;
  free(j->payload);
  memset(j, 0, sizeof *j);
}

void vs_fleet_event_clear(vs_fleet_event *e) {
  if (!e) return;
  free(e->data);
  memset(e, 0, sizeof *e);
}

/* One stream entry, [id, [field, value, ...]], into a job. VSPEC_EFORMAT when the entry
 * itself is not one (then the whole reply is suspect); bad fields only mark it malformed. */
int vs__fq_job_from(const vs_fleet_queue *q, const char *what, const redisReply *e,
                    vs_fleet_job *j, char *err, size_t errlen) {
  memset(j, 0, sizeof *j);
  if (!e || e->type != REDIS_REPLY_ARRAY || e->elements != 2 || !vs__fq_is_str(e->element[0]) ||
      e->element[0]->len >= VS_FLEET_ID_MAX)
    return vs__fq_bad_shape(q, what, "a stream entry is not [id, fields]", err, errlen);
  memcpy(j->entry_id, e->element[0]->str, e->element[0]->len + 1);
  const redisReply *id = vs__fq_field(e->element[1], "job");
  const redisReply *pl = vs__fq_field(e->element[1], "payload");
  char ignored[8];
  j->malformed = 1;
  if (!id || !pl || id->len > VS_FLEET_JOB_ID_MAX || memchr(id->str, 0, id->len) ||
      pl->len > q->max_payload)
    return VSPEC_OK;
  char jid[VS_FLEET_JOB_ID_MAX + 1];
  memcpy(jid, id->str, id->len);
  jid[id->len] = '\0';
  if (vs_name_check(&vs__fq_job_name, "job", jid, ignored, sizeof ignored)) return VSPEC_OK;
  if (!(j->payload = vs__fq_dup(pl->str, pl->len))) {
    return vs_fail(err, errlen, VSPEC_ENOMEM,
                   "%s: out of memory for a payload of %zu bytes", what, pl->len);
  }
  j->payload_len = pl->len;
  memcpy(j->job_id, jid, id->len + 1);
  j->malformed = 0;
  return VSPEC_OK;
}

/* Delivery counts of jobs[0..n) from one pipeline of XPENDING <id> <id> 1: 0 for an entry
 * that is no longer pending. */
int vs__fq_deliveries(vs_fleet_queue *q, vs_fleet_job *jobs, int n, char *err,
                      size_t errlen) {
  int rc;
  for (int i = 0; i < n; i++)
    if ((rc = vs__fq_append(q, "XPENDING", err, errlen, "XPENDING %s %s %s %s 1", q->stream,
                        q->group, jobs[i].entry_id, jobs[i].entry_id)))
      return rc;
  redisReply *stack[16], **r = n <= 16 ? stack : calloc((size_t)n, sizeof *r);
  if (!r) {
    /* the appended commands' replies would answer the next ones: start over */
    vs__fq_drop(q);
    return vs_fail(err, errlen, VSPEC_ENOMEM,
                   "XPENDING: out of memory");
  }
  rc = vs__fq_getn(q, "XPENDING", n, r, q->command_timeout_ms, err, errlen);
  for (int i = 0; !rc && i < n; i++) {
    if ((rc = vs__fq_want(q, "XPENDING", r[i], REDIS_REPLY_ARRAY, err, errlen))) break;
    jobs[i].deliveries = 0;
    if (r[i]->elements == 0) continue;
    const redisReply *p = r[i]->element[0];
    if (p->type != REDIS_REPLY_ARRAY || p->elements != 4 || !vs__fq_is_str(p->element[0]) ||
        p->element[3]->type != REDIS_REPLY_INTEGER) {
      rc = vs__fq_bad_shape(q, "XPENDING", "an entry is not [id, consumer, idle, deliveries]", err,
                        errlen);
      break;
    }
    if (strcmp(p->element[0]->str, jobs[i].entry_id)) {
      rc = vs__fq_bad_shape(q, "XPENDING", "the pending entry is another one", err, errlen);
      break;
    }
    jobs[i].deliveries = p->element[3]->integer;
  }
  for (int i = 0; i < n; i++)
    if (r[i]) freeReplyObject(r[i]);
  if (r != stack) free(r);
  return rc;
}

int vs_fleet_read(vs_fleet_queue *q, int block_ms, vs_fleet_job *job, char *err,
                  size_t errlen) {
  memset(job, 0, sizeof *job);
  if (!q->has_consumer) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "XREADGROUP: this queue was opened without a consumer name");
  }
  redisReply *r;
  int rc;
  if (block_ms > 0) {
    char b[24];
    snprintf(b, sizeof b, "%d", block_ms);
    rc = vs__fq_run(q, "XREADGROUP", block_ms, &r, err, errlen,
                "XREADGROUP GROUP %s %s COUNT 1 BLOCK %s STREAMS %s >", q->group, q->consumer, b,
                q->stream);
  } else {
    rc = vs__fq_run(q, "XREADGROUP", 0, &r, err, errlen,
                "XREADGROUP GROUP %s %s COUNT 1 STREAMS %s >", q->group, q->consumer, q->stream);
  }
  if (rc) return rc;
  int got = 0;
  if (r->type == REDIS_REPLY_NIL) goto out; /* nothing within block_ms */
  if ((rc = vs__fq_want(q, "XREADGROUP", r, REDIS_REPLY_ARRAY, err, errlen))) goto out;
  if (r->elements != 1 || r->element[0]->type != REDIS_REPLY_ARRAY ||
      r->element[0]->elements != 2 || r->element[0]->element[1]->type != REDIS_REPLY_ARRAY) {
    rc = vs__fq_bad_shape(q, "XREADGROUP", "not [[stream, entries]]", err, errlen);
    goto out;
  }
  const redisReply *entries = r->element[0]->element[1];
  if (entries->elements == 0) goto out;
  if ((rc = vs__fq_job_from(q, "XREADGROUP", entries->element[0], job, err, errlen))) goto out;
  got = 1;
out:
  freeReplyObject(r);
  if (rc) {
    vs_fleet_job_clear(job);
    return rc;
  }
  if (!got) return 0;
  /* Lost here, the job stays pending on this consumer: a claim picks it up once idle. */
  if ((rc = vs__fq_deliveries(q, job, 1, err, errlen))) {
    vs_fleet_job_clear(job);
    return rc;
  }
  return 1;
}

int vs_fleet_ack(vs_fleet_queue *q, const char *entry_id, char *err, size_t errlen) {
  int rc = vs__fq_check_id("XACK", entry_id, 0, err, errlen);
  if (rc) return rc;
  if ((rc = vs__fq_connect(q, "XACK", err, errlen))) return rc;
  if ((rc = vs__fq_append(q, "XACK", err, errlen, "MULTI")) ||
      (rc = vs__fq_append(q, "XACK", err, errlen, "XACK %s %s %s", q->stream, q->group, entry_id)) ||
      (rc = vs__fq_append(q, "XACK", err, errlen, "XDEL %s %s", q->stream, entry_id)) ||
      (rc = vs__fq_append(q, "XACK", err, errlen, "EXEC")))
    return rc;
  redisReply *r[4];
  if ((rc = vs__fq_getn(q, "XACK/XDEL", 4, r, q->command_timeout_ms, err, errlen))) return rc;
  const redisReply *res[2];
  rc = vs__fq_exec(q, "XACK/XDEL", r, 2, res, err, errlen);
  if (!rc && (res[0]->type != REDIS_REPLY_INTEGER || res[1]->type != REDIS_REPLY_INTEGER))
    rc = vs__fq_bad_shape(q, "XACK/XDEL", "counts are not integers", err, errlen);
  if (!rc) rc = res[0]->integer > 0;
  for (int i = 0; i < 4; i++) freeReplyObject(r[i]);
  return rc;
}

int vs_fleet_depth(vs_fleet_queue *q, long long *length, long long *pending, char *err,
                   size_t errlen) {
  int rc = vs__fq_connect(q, "XLEN", err, errlen);
  if (rc) return rc;
  if ((rc = vs__fq_append(q, "XLEN", err, errlen, "XLEN %s", q->stream)) ||
      (rc = vs__fq_append(q, "XPENDING", err, errlen, "XPENDING %s %s", q->stream, q->group)))
    return rc;
  redisReply *r[2];
  if ((rc = vs__fq_getn(q, "XLEN/XPENDING", 2, r, q->command_timeout_ms, err, errlen))) return rc;
  rc = vs__fq_want(q, "XLEN", r[0], REDIS_REPLY_INTEGER, err, errlen);
  if (!rc) rc = vs__fq_want(q, "XPENDING", r[1], REDIS_REPLY_ARRAY, err, errlen);
  if (!rc && (r[1]->elements < 1 || r[1]->element[0]->type != REDIS_REPLY_INTEGER))
    rc = vs__fq_bad_shape(q, "XPENDING", "no pending count", err, errlen);
  if (!rc) {
    if (length) *length = r[0]->integer;
    if (pending) *pending = r[1]->element[0]->integer;
  }
  freeReplyObject(r[0]);
  freeReplyObject(r[1]);
  return rc;
}
