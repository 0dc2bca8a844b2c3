/*
 * fleet/fleet_queue_claims.c - jobs between daemons: stale entries, a lost run announced to its client,
 * releases and claims, the running claims refreshed, cancel flags (fleet/fleet_queue.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "fleet/fleet_queue_internal.h"

/* KEYS: the jobs stream. ARGV: group, min idle, first id of the scan, count. Each pending
 * entry idle that long, with its `job` field ('' when the entry has none or is gone). */
static const char fq_stale_lua[] =
    "local p = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[2], ARGV[3], '+', ARGV[4])\n"
    "local out = {}\n"
    "for i, e in ipairs(p) do\n"
    "  local job = ''\n"
    "  local r = redis.call('XRANGE', KEYS[1], e[1], e[1])\n"
    "  if #r == 1 then\n"
    "    local f = r[1][2]\n"
    "    for k = 1, #f - 1, 2 do\n"
    "      if f[k] == 'job' then job = f[k + 1] break end\n"
    "    end\n"
    "  end\n"
    "  out[i] = {e[1], e[2], e[3], e[4], job}\n"
    "end\n"
    "return out\n";

/* One row of the stale script's reply into s; 0, or -1 when it is not that shape. */
static int fq_stale_from(const redisReply *e, vs_fleet_stale_job *s) {
  memset(s, 0, sizeof *s);
  if (e->type != REDIS_REPLY_ARRAY || e->elements != 5 || !vs__fq_is_str(e->element[0]) ||
      !vs__fq_is_str(e->element[1]) || e->element[2]->type != REDIS_REPLY_INTEGER ||
      e->element[3]->type != REDIS_REPLY_INTEGER || !vs__fq_is_str(e->element[4]) ||
      e->element[0]->len >= sizeof s->entry_id || !vs__fq_id_ok(e->element[0]->str, 0))
    return -1;
  memcpy(s->entry_id, e->element[0]->str, e->element[0]->len + 1);
  /* only for messages: a longer name (not a vspecd's) is cut */
  snprintf(s->consumer, sizeof s->consumer, "%s", e->element[1]->str);
  s->idle_ms = e->element[2]->integer;
  s->deliveries = e->element[3]->integer;
  char ignored[8];
  const redisReply *j = e->element[4];
  if (j->len <= VS_FLEET_JOB_ID_MAX && !memchr(j->str, 0, j->len) &&
      !vs_name_check(&vs__fq_job_name, "job", j->str, ignored, sizeof ignored))
    memcpy(s->job_id, j->str, j->len + 1);
  return 0;
}

int vs_fleet_stale(vs_fleet_queue *q, long long min_idle_ms, vs_fleet_stale_job *out, int max,
                   char *err, size_t errlen) {
  if (max < 1 || max > 1000 || min_idle_ms < 0) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "XPENDING (stale): max must be 1-1000, min_idle_ms >= 0");
  }
  char idle[24], count[16];
  snprintf(idle, sizeof idle, "%lld", min_idle_ms);
  snprintf(count, sizeof count, "%d", max);
  const char *argv[] = {"EVAL", fq_stale_lua, "1", q->stream, q->group, idle, q->cursor, count};
  redisReply *r;
  int rc = vs__fq_eval(q, "XPENDING (stale)", 8, argv, NULL, &r, err, errlen);
  if (rc) return rc;
  int n = 0;
  if (!(rc = vs__fq_want(q, "XPENDING (stale)", r, REDIS_REPLY_ARRAY, err, errlen)) &&
      r->elements > (size_t)max)
    rc = vs__fq_bad_shape(q, "XPENDING (stale)", "more entries than asked for", err, errlen);
  for (size_t i = 0; !rc && i < r->elements; i++, n++)
    if (fq_stale_from(r->element[i], &out[n]))
      rc = vs__fq_bad_shape(q, "XPENDING (stale)", "an entry is not [id, consumer, idle, "
                        "deliveries, job]", err, errlen);
  freeReplyObject(r);
  if (rc) return rc;
  /* a full page: the next scan starts after its last entry; else from the start again */
  if (n == max) snprintf(q->cursor, sizeof q->cursor, "(%s", out[n - 1].entry_id);
  else snprintf(q->cursor, sizeof q->cursor, "-");
  return n;
}

/* KEYS: the jobs stream, the run's lost mark, the job's event stream. ARGV: group, entry id,
 * delivery count, min idle (release: the idle time to set), event, events kept, ttl, mode
 * ('watch' or 'release'), consumer (release: this one). See vs_fleet_announce_loss. */
static const char fq_announce_lua[] =
    "local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)\n"
    "if #p ~= 1 or p[1][4] ~= tonumber(ARGV[3]) then return 0 end\n"
    "if ARGV[8] == 'release' then\n"
    "  if p[1][2] ~= ARGV[9] then return 0 end\n"
    "elseif p[1][3] < tonumber(ARGV[4]) then\n"
    "  return 0\n"
    "end\n"
    "if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[7]) then return 0 end\n"
    "redis.call('XADD', KEYS[3], 'MAXLEN', ARGV[6], '*', 'data', ARGV[5])\n"
    "redis.call('PEXPIRE', KEYS[3], ARGV[7])\n"
    "if ARGV[8] == 'release' then\n"
    "  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[9], 0, ARGV[2], 'IDLE', ARGV[4], 'JUSTID')\n"
    "end\n"
    "return 1\n";

static int fq_announce(vs_fleet_queue *q, const char *mode, const char *entry_id,
                       const char *job_id, long long deliveries, long long idle_ms,
                       const void *event, size_t len, char *err, size_t errlen) {
  const char *what = !strcmp(mode, "release") ? "release" : "announce (lost)";
  char ekey[sizeof q->events_prefix + VS_FLEET_JOB_ID_MAX];
  char mark[sizeof q->stream + 8 + VS_FLEET_ID_MAX + 24];
  int rc = vs__fq_events_key(q, what, job_id, ekey, sizeof ekey, err, errlen);
  if (!rc) rc = vs__fq_check_id(what, entry_id, 0, err, errlen);
  if (rc) return rc;
  if (deliveries < 1 || idle_ms < 0 || len > q->max_payload || (len && !event)) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "%s: deliveries >= 1, idle >= 0 and an event of at most %zu bytes",
                   what, q->max_payload);
  }
  snprintf(mark, sizeof mark, "%s:lost:%s:%lld", q->stream, entry_id, deliveries);
  char dl[24], idle[24], ev_max[24], ttl[24];
  snprintf(dl, sizeof dl, "%lld", deliveries);
  snprintf(idle, sizeof idle, "%lld", idle_ms);
  snprintf(ev_max, sizeof ev_max, "%lld", q->events_max_len);
  snprintf(ttl, sizeof ttl, "%lld", q->events_ttl_ms);
  const char *argv[] = {"EVAL", fq_announce_lua, "3", q->stream, mark, ekey, q->group, entry_id,
                        dl, idle, len ? event : "", ev_max, ttl, mode, q->consumer};
  size_t argl[15];
  for (int i = 0; i < 15; i++) argl[i] = i == 10 ? len : strlen(argv[i]); /* the event: bytes */
  redisReply *r;
  if ((rc = vs__fq_eval(q, what, 15, argv, argl, &r, err, errlen))) return rc;
  if (!(rc = vs__fq_want(q, what, r, REDIS_REPLY_INTEGER, err, errlen))) rc = r->integer > 0;
  freeReplyObject(r);
  return rc;
}

int vs_fleet_announce_loss(vs_fleet_queue *q, const vs_fleet_stale_job *s, long long min_idle_ms,
                           const void *event, size_t len, char *err, size_t errlen) {
  return fq_announce(q, "watch", s->entry_id, s->job_id, s->deliveries, min_idle_ms, event, len,
                     err, errlen);
}

int vs_fleet_release(vs_fleet_queue *q, const char *entry_id, const char *job_id,
                     long long deliveries, long long idle_ms, const void *event, size_t len,
                     char *err, size_t errlen) {
  if (!q->has_consumer) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "release: this queue was opened without a consumer name");
  }
  return fq_announce(q, "release", entry_id, job_id, deliveries, idle_ms, event, len, err,
                     errlen);
}

int vs_fleet_claim(vs_fleet_queue *q, const char *entry_id, long long min_idle_ms,
                   vs_fleet_job *job, char *err, size_t errlen) {
  memset(job, 0, sizeof *job);
  if (!q->has_consumer || min_idle_ms < 0) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "XCLAIM: %s", !q->has_consumer
                                           ? "this queue was opened without a consumer name"
                                           : "min_idle_ms must be >= 0");
  }
  int rc = vs__fq_check_id("XCLAIM", entry_id, 0, err, errlen);
  if (rc) return rc;
  char idle[24];
  snprintf(idle, sizeof idle, "%lld", min_idle_ms);
  redisReply *r;
  if ((rc = vs__fq_run(q, "XCLAIM", 0, &r, err, errlen, "XCLAIM %s %s %s %s %s", q->stream,
                   q->group, q->consumer, idle, entry_id)))
    return rc;
  int got = 0;
  /* 7.0 leaves out an entry deleted while pending (and drops it from the list) */
  if (!(rc = vs__fq_want(q, "XCLAIM", r, REDIS_REPLY_ARRAY, err, errlen)) && r->elements > 1)
    rc = vs__fq_bad_shape(q, "XCLAIM", "more than the one entry claimed", err, errlen);
  if (!rc && r->elements == 1 && r->element[0]->type != REDIS_REPLY_NIL &&
      !(rc = vs__fq_job_from(q, "XCLAIM", r->element[0], job, err, errlen)))
    got = 1;
  freeReplyObject(r);
  if (!rc && got) rc = vs__fq_deliveries(q, job, 1, err, errlen);
  if (rc) {
    vs_fleet_job_clear(job);
    return rc;
  }
  return got;
}

/* ---- running jobs: claims and cancel flags ------------------------------------------------ */

/* Atomically, for each id: still pending on this consumer, and its run not announced lost
 * (vs_fleet_announce_loss's mark)? Then reset its idle time (XCLAIM JUSTID with min-idle 0
 * does not raise the delivery count) and return it. A job claimed away by another daemon, or
 * announced lost to its client, is left alone: a refresh must never steal a job back, nor
 * keep one whose client was told it runs again elsewhere. */
static const char fq_touch_lua[] =
    "local out = {}\n"
    "for i = 3, #ARGV do\n"
    "  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)\n"
    "  if #p == 1 and p[1][2] == ARGV[2] and\n"
    "     redis.call('EXISTS', KEYS[1] .. ':lost:' .. ARGV[i] .. ':' .. p[1][4]) == 0 then\n"
    "    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')\n"
    "    out[#out + 1] = ARGV[i]\n"
    "  end\n"
    "end\n"
    "return out\n";

int vs_fleet_touch(vs_fleet_queue *q, const char *const *entry_ids, int n, int *still_ours,
                   char *err, size_t errlen) {
  if (!q->has_consumer || n < 0 || n > 1000) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "XCLAIM: %s",
                   !q->has_consumer ? "this queue was opened without a consumer name" : "n must be 0-1000");
  }
  for (int i = 0; i < n; i++) {
    still_ours[i] = 0;
    int rc = vs__fq_check_id("XCLAIM", entry_ids[i], 0, err, errlen);
    if (rc) return rc;
  }
  if (!n) return 0;
  int argc = n + 6, rc;
  const char **argv = malloc(sizeof *argv * (size_t)argc);
  if (!argv) {
    return vs_fail(err, errlen, VSPEC_ENOMEM,
                   "XCLAIM: out of memory");
  }
  argv[0] = "EVAL";
  argv[1] = fq_touch_lua;
  argv[2] = "1";
  argv[3] = q->stream;
  argv[4] = q->group;
  argv[5] = q->consumer;
  for (int i = 0; i < n; i++) argv[6 + i] = entry_ids[i];
  redisReply *r;
  rc = vs__fq_eval(q, "XCLAIM (refresh)", argc, argv, NULL, &r, err, errlen);
  free(argv);
  if (rc) return rc;
  if (!(rc = vs__fq_want(q, "XCLAIM (refresh)", r, REDIS_REPLY_ARRAY, err, errlen))) {
    int kept = 0;
    for (size_t k = 0; k < r->elements; k++) {
      if (!vs__fq_is_str(r->element[k])) continue;
      for (int i = 0; i < n; i++)
        if (!still_ours[i] && !strcmp(entry_ids[i], r->element[k]->str)) {
          still_ours[i] = 1;
          kept++;
          break;
        }
    }
    rc = kept;
  }
  freeReplyObject(r);
  return rc;
}

static int fq_cancel_key(const vs_fleet_queue *q, const char *what, const char *job_id,
                         char *key, size_t cap, char *err, size_t errlen) {
  char field[48];
  snprintf(field, sizeof field, "%s job", what);
  int rc = vs_name_check(&vs__fq_job_name, field, job_id ? job_id : "", err, errlen);
  if (rc) return rc;
  snprintf(key, cap, "%s:cancel:%s", q->stream, job_id);
  return VSPEC_OK;
}

int vs_fleet_cancel_set(vs_fleet_queue *q, const char *job_id, char *err, size_t errlen) {
  char key[sizeof q->stream + 8 + VS_FLEET_JOB_ID_MAX];
  int rc = fq_cancel_key(q, "SET", job_id, key, sizeof key, err, errlen);
  if (rc) return rc;
  char ttl[24];
  snprintf(ttl, sizeof ttl, "%lld", q->events_ttl_ms);
  redisReply *r;
  if ((rc = vs__fq_run(q, "SET (cancel)", 0, &r, err, errlen, "SET %s 1 PX %s", key, ttl)))
    return rc;
  rc = vs__fq_want(q, "SET (cancel)", r, REDIS_REPLY_STATUS, err, errlen);
  freeReplyObject(r);
  return rc;
}

int vs_fleet_cancel_check(vs_fleet_queue *q, const char *const *job_ids, int n, int *cancelled,
                          char *err, size_t errlen) {
  if (n < 0 || n > 1000) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "EXISTS (cancel): n must be 0-1000");
  }
  char key[sizeof q->stream + 8 + VS_FLEET_JOB_ID_MAX];
  /* every id checked before anything is sent: a half-sent pipeline would leave replies that
   * the next command would take for its own */
  int rc = 0;
  for (int i = 0; !rc && i < n; i++) {
    cancelled[i] = 0;
    rc = fq_cancel_key(q, "EXISTS", job_ids[i], key, sizeof key, err, errlen);
  }
  if (!rc && n) rc = vs__fq_connect(q, "EXISTS (cancel)", err, errlen);
  for (int i = 0; !rc && i < n; i++) {
    fq_cancel_key(q, "EXISTS", job_ids[i], key, sizeof key, err, errlen);
    rc = vs__fq_append(q, "EXISTS (cancel)", err, errlen, "EXISTS %s", key);
  }
  if (rc || !n) return rc;
  redisReply **r = calloc((size_t)n, sizeof *r);
  if (!r) {
    vs__fq_drop(q); /* n replies are on their way, unread */
    return vs_fail(err, errlen, VSPEC_ENOMEM,
                   "EXISTS (cancel): out of memory");
  }
  int found = 0;
  if (!(rc = vs__fq_getn(q, "EXISTS (cancel)", n, r, q->command_timeout_ms, err, errlen))) {
    for (int i = 0; i < n && !rc; i++)
      if (!(rc = vs__fq_want(q, "EXISTS (cancel)", r[i], REDIS_REPLY_INTEGER, err, errlen)) &&
          r[i]->integer > 0) {
        cancelled[i] = 1;
        found++;
      }
    for (int i = 0; i < n; i++) freeReplyObject(r[i]);
  }
  free(r);
  return rc ? rc : found;
}
