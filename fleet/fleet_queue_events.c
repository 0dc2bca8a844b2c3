/*
 * fleet/fleet_queue_events.c - each job's event stream (append, read, exists) and a gateway's submit in
 * one step, with its keepalive (fleet/fleet_queue.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "fleet/fleet_queue_internal.h"

int vs_fleet_event_append(vs_fleet_queue *q, const char *job_id, const void *data, size_t len,
                          char *event_id, char *err, size_t errlen) {
  if (event_id) event_id[0] = '\0';
  char key[sizeof q->events_prefix + VS_FLEET_JOB_ID_MAX];
  int rc = vs__fq_events_key(q, "XADD", job_id, key, sizeof key, err, errlen);
  if (rc) return rc;
  if (len > q->max_payload || (len && !data)) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "XADD: an event of %zu bytes (at most %zu)", len, q->max_payload);
  }
  if ((rc = vs__fq_connect(q, "XADD", err, errlen))) return rc;
  char maxlen[24], ttl[24];
  snprintf(maxlen, sizeof maxlen, "%lld", q->events_max_len);
  snprintf(ttl, sizeof ttl, "%lld", q->events_ttl_ms);
  if ((rc = vs__fq_append(q, "XADD", err, errlen, "MULTI")) ||
      (rc = vs__fq_append(q, "XADD", err, errlen, "XADD %s MAXLEN %s * data %b", key, maxlen,
                      len ? data : "", len)) ||
      (rc = vs__fq_append(q, "XADD", err, errlen, "PEXPIRE %s %s", key, ttl)) ||
      (rc = vs__fq_append(q, "XADD", err, errlen, "EXEC")))
    return rc;
  redisReply *r[4];
  if ((rc = vs__fq_getn(q, "XADD/PEXPIRE", 4, r, q->command_timeout_ms, err, errlen))) return rc;
  const redisReply *res[2];
  rc = vs__fq_exec(q, "XADD/PEXPIRE", r, 2, res, err, errlen);
  if (!rc && (!vs__fq_is_str(res[0]) || res[0]->len >= VS_FLEET_ID_MAX ||
              res[1]->type != REDIS_REPLY_INTEGER))
    rc = vs__fq_bad_shape(q, "XADD/PEXPIRE", "not [id, 1]", err, errlen);
  if (!rc && event_id) memcpy(event_id, res[0]->str, res[0]->len + 1);
  for (int i = 0; i < 4; i++) freeReplyObject(r[i]);
  return rc;
}

int vs_fleet_events_read(vs_fleet_queue *q, const char *job_id, const char *after_id,
                         int block_ms, vs_fleet_event *ev, int max, char *err, size_t errlen) {
  char key[sizeof q->events_prefix + VS_FLEET_JOB_ID_MAX];
  int rc = vs__fq_events_key(q, "XREAD", job_id, key, sizeof key, err, errlen);
  if (rc) return rc;
  if ((rc = vs__fq_check_id("XREAD", after_id, 1, err, errlen))) return rc;
  if (max < 1 || max > 100000) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "XREAD: max must be 1-100000");
  }
  for (int i = 0; i < max; i++) memset(&ev[i], 0, sizeof ev[i]);
  char count[16];
  snprintf(count, sizeof count, "%d", max);
  redisReply *r;
  if (block_ms > 0) {
    char b[24];
    snprintf(b, sizeof b, "%d", block_ms);
    rc = vs__fq_run(q, "XREAD", block_ms, &r, err, errlen, "XREAD COUNT %s BLOCK %s STREAMS %s %s",
                count, b, key, after_id);
  } else {
    rc = vs__fq_run(q, "XREAD", 0, &r, err, errlen, "XREAD COUNT %s STREAMS %s %s", count, key,
                after_id);
  }
  if (rc) return rc;
  int n = 0;
  if (r->type == REDIS_REPLY_NIL) goto out;
  if ((rc = vs__fq_want(q, "XREAD", r, REDIS_REPLY_ARRAY, err, errlen))) goto out;
  if (r->elements != 1 || r->element[0]->type != REDIS_REPLY_ARRAY ||
      r->element[0]->elements != 2 || r->element[0]->element[1]->type != REDIS_REPLY_ARRAY ||
      r->element[0]->element[1]->elements > (size_t)max) {
    rc = vs__fq_bad_shape(q, "XREAD", "not [[stream, entries]]", err, errlen);
    goto out;
  }
  const redisReply *entries = r->element[0]->element[1];
  for (size_t i = 0; i < entries->elements; i++) {
    const redisReply *e = entries->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 || !vs__fq_is_str(e->element[0]) ||
        e->element[0]->len >= VS_FLEET_ID_MAX) {
      rc = vs__fq_bad_shape(q, "XREAD", "an event is not [id, fields]", err, errlen);
      goto out;
    }
    memcpy(ev[n].id, e->element[0]->str, e->element[0]->len + 1);
    /* An entry without `data` (not written by vs_fleet_event_append) is kept, empty, so that
     * a reader moves past its id instead of stopping there. */
    const redisReply *d = vs__fq_field(e->element[1], "data");
    if (d) {
      if (!(ev[n].data = vs__fq_dup(d->str, d->len))) {
        vs_fail(err, errlen, 0, "XREAD: out of memory for an event of %zu bytes", d->len);
        rc = VSPEC_ENOMEM;
        goto out;
      }
      ev[n].len = d->len;
    }
    n++;
  }
out:
  freeReplyObject(r);
  if (rc) {
    for (int i = 0; i < max; i++) vs_fleet_event_clear(&ev[i]);
    return rc;
  }
  return n;
}

int vs_fleet_events_exist(vs_fleet_queue *q, const char *job_id, char *err, size_t errlen) {
  char key[sizeof q->events_prefix + VS_FLEET_JOB_ID_MAX];
  int rc = vs__fq_events_key(q, "EXISTS", job_id, key, sizeof key, err, errlen);
  if (rc) return rc;
  redisReply *r;
  if ((rc = vs__fq_run(q, "EXISTS", 0, &r, err, errlen, "EXISTS %s", key))) return rc;
  if (!(rc = vs__fq_want(q, "EXISTS", r, REDIS_REPLY_INTEGER, err, errlen))) rc = r->integer > 0;
  freeReplyObject(r);
  return rc;
}

/* ---- a gateway's submit, in one step ---------------------------------------------------- */

/* KEYS: the jobs stream, the job's event stream, its id key ("" without a client-chosen id).
 * ARGV: job id, payload, the first event, max_len, the stream's trim backstop, events kept,
 * the events' ttl, the request's digest. Atomic, so that a gateway (or Redis) dying half way
 * leaves either all of it or none: an id taken without its job, or an Accepted without its
 * entry, would leave a retrying client following a job that does not exist. */
static const char fq_submit_lua[] =
    "if KEYS[3] ~= '' then\n"
    "  local v = redis.call('GET', KEYS[3])\n"
    "  if v then\n"
    "    if v == ARGV[8] then return {'same'} end\n"
    "    return {'conflict'}\n"
    "  end\n"
    "end\n"
    "local n = redis.call('XLEN', KEYS[1])\n"
    "if n >= tonumber(ARGV[4]) then return {'busy', n} end\n"
    "redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[6], '*', 'data', ARGV[3])\n"
    "redis.call('PEXPIRE', KEYS[2], ARGV[7])\n"
    "local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[5], '*', 'job', ARGV[1],\n"
    "                      'payload', ARGV[2])\n"
    "if KEYS[3] ~= '' then redis.call('SET', KEYS[3], ARGV[8], 'PX', ARGV[7]) end\n"
    "return {'new', id}\n";

int vs_fleet_submit(vs_fleet_queue *q, const char *job_id, const void *payload, size_t len,
                    const void *first_event, size_t event_len, const char *digest,
                    char *entry_id, char *err, size_t errlen) {
  if (entry_id) entry_id[0] = '\0';
  char ekey[sizeof q->events_prefix + VS_FLEET_JOB_ID_MAX], ikey[sizeof q->stream + 4 + VS_FLEET_JOB_ID_MAX] = "";
  int rc = vs__fq_events_key(q, "submit", job_id, ekey, sizeof ekey, err, errlen);
  if (rc) return rc;
  if (digest) snprintf(ikey, sizeof ikey, "%s:id:%s", q->stream, job_id);
  if (len > q->max_payload || (len && !payload) || event_len > q->max_payload ||
      (event_len && !first_event)) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "submit: a payload of %zu bytes or an event of %zu (at most %zu)", len,
                   event_len, q->max_payload);
  }
  char max_len[24], cap[24], ev_max[24], ttl[24];
  snprintf(max_len, sizeof max_len, "%lld", q->max_len);
  snprintf(cap, sizeof cap, "%lld", 2 * q->max_len);
  snprintf(ev_max, sizeof ev_max, "%lld", q->events_max_len);
  snprintf(ttl, sizeof ttl, "%lld", q->events_ttl_ms);
  const char *argv[] = {"EVAL", fq_submit_lua, "3", q->stream, ekey, ikey, job_id,
                        len ? payload : "", first_event ? first_event : "", max_len, cap,
                        ev_max, ttl, digest ? digest : ""};
  size_t argl[14];
  for (int i = 0; i < 14; i++) /* the payload and the event are bytes, not strings */
    argl[i] = i == 7 ? len : i == 8 ? event_len : strlen(argv[i]);
  if ((rc = vs__fq_connect(q, "submit", err, errlen))) return rc;
  if (redisAppendCommandArgv(q->c, 14, argv, argl) != REDIS_OK) {
    int oom = q->c->err == REDIS_ERR_OOM;
    vs_fail(err, errlen, 0, "submit: cannot format the command: %s", q->c->errstr);
    vs__fq_drop(q);
    return oom ? VSPEC_ENOMEM : VSPEC_EINVAL;
  }
  redisReply *r;
  if ((rc = vs__fq_getn(q, "submit (XADD)", 1, &r, q->command_timeout_ms, err, errlen))) return rc;
  if ((rc = vs__fq_want(q, "submit (XADD)", r, REDIS_REPLY_ARRAY, err, errlen))) goto out;
  if (r->elements < 1 || !vs__fq_is_str(r->element[0])) {
    rc = vs__fq_bad_shape(q, "submit (XADD)", "no outcome", err, errlen);
    goto out;
  }
  const char *what = r->element[0]->str;
  if (!strcmp(what, "new") && r->elements == 2 && vs__fq_is_str(r->element[1]) &&
      r->element[1]->len < VS_FLEET_ID_MAX) {
    if (entry_id) memcpy(entry_id, r->element[1]->str, r->element[1]->len + 1);
    rc = VS_FLEET_NEW;
  } else if (!strcmp(what, "same")) {
    rc = VS_FLEET_SAME;
  } else if (!strcmp(what, "conflict")) {
    vs_fail(err, errlen, 0, "submit: job id %s is taken by a different request", job_id);
    rc = VS_FLEET_CONFLICT;
  } else if (!strcmp(what, "busy") && r->elements == 2 &&
             r->element[1]->type == REDIS_REPLY_INTEGER) {
    vs_fail(err, errlen, 0, "submit: the fleet queue %s holds %lld jobs, its bound is %lld: busy",
            q->stream, r->element[1]->integer, q->max_len);
    rc = VSPEC_EBUSY;
  } else {
    rc = vs__fq_bad_shape(q, "submit (XADD)", "an unknown outcome", err, errlen);
  }
out:
  freeReplyObject(r);
  return rc;
}

int vs_fleet_job_keepalive(vs_fleet_queue *q, const char *job_id, char *err, size_t errlen) {
  char ekey[sizeof q->events_prefix + VS_FLEET_JOB_ID_MAX];
  int rc = vs__fq_events_key(q, "PEXPIRE", job_id, ekey, sizeof ekey, err, errlen);
  if (rc) return rc;
  char ttl[24];
  snprintf(ttl, sizeof ttl, "%lld", q->events_ttl_ms);
  if ((rc = vs__fq_append(q, "PEXPIRE", err, errlen, "PEXPIRE %s %s", ekey, ttl)) ||
      (rc = vs__fq_append(q, "PEXPIRE", err, errlen, "PEXPIRE %s:id:%s %s", q->stream, job_id, ttl)))
    return rc;
  redisReply *r[2];
  if ((rc = vs__fq_getn(q, "PEXPIRE", 2, r, q->command_timeout_ms, err, errlen))) return rc;
  rc = vs__fq_want(q, "PEXPIRE", r[0], REDIS_REPLY_INTEGER, err, errlen);
  if (!rc) rc = vs__fq_want(q, "PEXPIRE", r[1], REDIS_REPLY_INTEGER, err, errlen);
  if (!rc) rc = r[0]->integer > 0;
  freeReplyObject(r[0]);
  freeReplyObject(r[1]);
  return rc;
}
