/*
 * fleet/fleet_queue.c - the fleet queue's connection and its commands: options, connecting
 * (timeouts, SIGPIPE kept in), one command and its reply, the checks every reply and id go
 * through, scripts, names and keys (fleet/fleet_queue.h; the files of the queue are listed
 * in fleet/fleet_queue_internal.h).
 */
#include "fleet/fleet_queue.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "core/names.h"
#include "core/status.h"
#include "fleet/fleet_queue_internal.h"

/* Key names and the group: they show up in redis-cli, logs and messages unquoted. */
static const vs_name_kind fq_key_name = {"a Redis key or group name", "._:-", 1,
                                         "[A-Za-z0-9._:-]", 1, 64};
/* A job id is part of its event stream's key and of every log line about the job. */
const vs_name_kind vs__fq_job_name = {"a job id", "._:-", 1, "[A-Za-z0-9._:-]", 1,
                                      VS_FLEET_JOB_ID_MAX};

void vs_fleet_opts_defaults(vs_fleet_opts *o) {
  memset(o, 0, sizeof *o);
  o->stream = "vspec:jobs";
  o->group = "vspec";
  o->events_prefix = "vspec:events:";
  o->max_len = 1024;
  o->events_max_len = 1024;
  o->events_ttl_ms = 3600 * 1000;
  o->max_payload = 4u << 20;
  o->connect_timeout_ms = 2000;
  o->command_timeout_ms = 2000;
}

/* ---- the connection --------------------------------------------------------------------- */

/* hiredis writes with write(2): on a connection the server closed, that raises SIGPIPE, which
 * kills a process that did not ignore it. vspecd ignores it, a test or a tool may not, so each
 * round trip runs with SIGPIPE blocked in this thread, and a SIGPIPE it raised is taken back
 * (one already pending before is left alone). */
typedef struct {
  sigset_t old;
  int was_pending;
} fq_pipe_guard;

static void fq_pipe_block(fq_pipe_guard *g) {
  sigset_t set, pend;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  sigemptyset(&pend);
  sigpending(&pend);
  g->was_pending = sigismember(&pend, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

static void fq_pipe_unblock(fq_pipe_guard *g) {
  if (!g->was_pending) {
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigemptyset(&pend);
    sigpending(&pend);
    if (sigismember(&pend, SIGPIPE) == 1) {
      struct timespec zero = {0, 0};
      int saved = errno;
      while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR) {
      }
      errno = saved;
    }
  }
  pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

static struct timeval fq_tv(long long ms) {
  struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};
  return tv;
}

void vs__fq_drop(vs_fleet_queue *q) {
  if (q->c) redisFree(q->c);
  q->c = NULL;
}

/* After a failed round trip (errno_at: errno right after it): the context is unusable (hiredis
 * keeps the error, and a late reply would answer the wrong command), so it is dropped. */
static int fq_lost(vs_fleet_queue *q, const char *what, int errno_at, long long waited_ms,
                   char *err, size_t errlen) {
  if (q->c && q->c->err == REDIS_ERR_IO && (errno_at == EAGAIN || errno_at == EWOULDBLOCK))
    vs_fail(err, errlen, 0, "%s: no reply from redis at %s within %lld ms; connection dropped", what,
            q->where, waited_ms);
  else
    vs_fail(err, errlen, 0, "%s: connection to redis at %s lost: %s", what, q->where,
            q->c && q->c->errstr[0] ? q->c->errstr : "unknown error");
  vs__fq_drop(q);
  return VSPEC_EIO;
}

static int fq_set_timeout(vs_fleet_queue *q, long long ms, char *err, size_t errlen) {
  if (redisSetTimeout(q->c, fq_tv(ms)) != REDIS_OK)
    return fq_lost(q, "setting the socket timeout", errno, 0, err, errlen);
  return VSPEC_OK;
}

/* Reads n replies (of commands appended before). All of them or none: after an I/O error the
 * replies read so far are freed and the connection is dropped. */
int vs__fq_getn(vs_fleet_queue *q, const char *what, int n, redisReply **r, long long wait_ms,
                char *err, size_t errlen) {
  for (int i = 0; i < n; i++) r[i] = NULL;
  fq_pipe_guard g;
  fq_pipe_block(&g);
  int failed = 0, errno_at = 0;
  for (int i = 0; i < n; i++) {
    void *rep = NULL;
    errno = 0;
    if (redisGetReply(q->c, &rep) != REDIS_OK || !rep) {
      errno_at = errno;
      if (rep) freeReplyObject(rep);
      failed = 1;
      break;
    }
    r[i] = rep;
  }
  fq_pipe_unblock(&g);
  if (!failed) return VSPEC_OK;
  for (int i = 0; i < n; i++) {
    if (r[i]) freeReplyObject(r[i]);
    r[i] = NULL;
  }
  return fq_lost(q, what, errno_at, wait_ms, err, errlen);
}

int vs__fq_append(vs_fleet_queue *q, const char *what, char *err, size_t errlen,
                  const char *fmt, ...) {
  int rc = vs__fq_connect(q, what, err, errlen);
  if (rc) return rc;
  va_list ap;
  va_start(ap, fmt);
  rc = redisvAppendCommand(q->c, fmt, ap);
  va_end(ap);
  if (rc == REDIS_OK) return VSPEC_OK;
  /* hiredis keeps the error in the context, so the connection goes with it. */
  int oom = q->c->err == REDIS_ERR_OOM;
  vs_fail(err, errlen, 0, "%s: cannot format the command: %s", what, q->c->errstr);
  vs__fq_drop(q);
  return oom ? VSPEC_ENOMEM : VSPEC_EINVAL;
}

/* Connects if not connected; messages start with `what`, the command that needed it. */
int vs__fq_connect(vs_fleet_queue *q, const char *what, char *err, size_t errlen) {
  if (q->c) return VSPEC_OK;
  struct timeval tv = fq_tv(q->connect_timeout_ms);
  redisContext *c = q->addr.path[0] ? redisConnectUnixWithTimeout(q->addr.path, tv)
                                    : redisConnectWithTimeout(q->addr.host, q->addr.port, tv);
  if (!c) {
    return vs_fail(err, errlen, VSPEC_ENOMEM,
                   "%s: cannot allocate a redis context", what);
  }
  if (c->err) {
    vs_fail(err, errlen, 0, "%s: cannot connect to redis at %s: %s", what, q->where, c->errstr);
    redisFree(c);
    return VSPEC_EIO;
  }
  q->c = c;
  int rc = fq_set_timeout(q, q->command_timeout_ms, err, errlen);
  if (rc) return rc;
  /* A dead peer on a TCP connection that sits in a long blocking read is found by keepalive
   * probes rather than never (the read timeout covers the rest). */
  if (!q->addr.path[0] && redisEnableKeepAlive(q->c) != REDIS_OK)
    return fq_lost(q, what, errno, 0, err, errlen);
  if (q->addr.password[0] || q->addr.db) {
    int n = 0;
    if (q->addr.password[0]) {
      rc = q->addr.user[0] ? vs__fq_append(q, what, err, errlen, "AUTH %s %s", q->addr.user,
                                       q->addr.password)
                           : vs__fq_append(q, what, err, errlen, "AUTH %s", q->addr.password);
      if (rc) return rc;
      n++;
    }
    if (q->addr.db) {
      char db[24];
      snprintf(db, sizeof db, "%d", q->addr.db);
      if ((rc = vs__fq_append(q, what, err, errlen, "SELECT %s", db))) return rc;
      n++;
    }
    redisReply *r[2];
    if ((rc = vs__fq_getn(q, what, n, r, q->command_timeout_ms, err, errlen))) return rc;
    for (int i = 0; i < n; i++) {
      if (!rc && r[i]->type != REDIS_REPLY_STATUS) {
        const char *cmd = q->addr.password[0] && i == 0 ? "AUTH" : "SELECT";
        if (r[i]->type == REDIS_REPLY_ERROR) {
          vs_fail(err, errlen, 0, "%s: %s: redis at %s: %.200s", what, cmd, q->where, r[i]->str);
          rc = VS_FLEET_EREDIS;
        } else {
          vs_fail(err, errlen, 0, "%s: %s: unexpected reply type %d from redis at %s", what, cmd,
                  r[i]->type, q->where);
          rc = VSPEC_EFORMAT;
        }
      }
      freeReplyObject(r[i]);
    }
    /* Not authenticated or on the wrong database: nothing else may use this connection. */
    if (rc) vs__fq_drop(q);
  }
  return rc;
}

int vs_fleet_queue_connect(vs_fleet_queue *q, char *err, size_t errlen) {
  return vs__fq_connect(q, "connect", err, errlen);
}

int vs_fleet_queue_connected(const vs_fleet_queue *q) { return q && q->c != NULL; }

static int fq_copy_name(char *dst, size_t cap, const vs_name_kind *k, const char *field,
                        const char *v, char *err, size_t errlen) {
  int rc = vs_name_check(k, field, v ? v : "", err, errlen);
  if (rc) return rc;
  snprintf(dst, cap, "%s", v);
  return VSPEC_OK;
}

int vs_fleet_queue_open(const vs_fleet_opts *o, vs_fleet_queue **out, char *err, size_t errlen) {
  *out = NULL;
  vs_fleet_queue *q = calloc(1, sizeof *q);
  if (!q) {
    return vs_fail(err, errlen, VSPEC_ENOMEM,
                   "fleet queue: out of memory");
  }
  int rc = vs_fleet_addr_parse(o->url, &q->addr, err, errlen);
  if (!rc) rc = fq_copy_name(q->stream, sizeof q->stream, &fq_key_name, "fleet stream", o->stream,
                             err, errlen);
  if (!rc) rc = fq_copy_name(q->group, sizeof q->group, &fq_key_name, "fleet group", o->group,
                             err, errlen);
  if (!rc) rc = fq_copy_name(q->events_prefix, sizeof q->events_prefix, &fq_key_name,
                             "fleet events prefix", o->events_prefix, err, errlen);
  if (!rc && o->consumer) {
    rc = fq_copy_name(q->consumer, sizeof q->consumer, &vs_name_model, "fleet consumer",
                      o->consumer, err, errlen);
    q->has_consumer = !rc;
  }
  if (!rc && (o->max_len < 1 || o->max_len > LLONG_MAX / 2 || o->events_max_len < 1 ||
              o->events_ttl_ms < 1 || o->max_payload < 1 || o->max_payload > (512u << 20) ||
              o->connect_timeout_ms < 1 || o->command_timeout_ms < 1)) {
    vs_fail(err, errlen, 0, "fleet queue: max_len, events_max_len, events_ttl_ms, max_payload "
            "(at most 512 MiB, Redis's limit) and the timeouts must be positive");
    rc = VSPEC_EINVAL;
  }
  if (rc) {
    free(q);
    return rc;
  }
  if (q->addr.path[0])
    snprintf(q->where, sizeof q->where, "unix:%s", q->addr.path);
  else
    snprintf(q->where, sizeof q->where, strchr(q->addr.host, ':') ? "[%s]:%d" : "%s:%d",
             q->addr.host, q->addr.port);
  q->max_len = o->max_len;
  q->events_max_len = o->events_max_len;
  q->events_ttl_ms = o->events_ttl_ms;
  q->max_payload = o->max_payload;
  q->connect_timeout_ms = o->connect_timeout_ms;
  q->command_timeout_ms = o->command_timeout_ms;
  snprintf(q->cursor, sizeof q->cursor, "-");
  *out = q;
  return VSPEC_OK;
}

void vs_fleet_queue_destroy(vs_fleet_queue **qp) {
  if (!qp || !*qp) return;
  vs__fq_drop(*qp);
  /* the password is in there */
  explicit_bzero(&(*qp)->addr, sizeof (*qp)->addr);
  free(*qp);
  *qp = NULL;
}

/* ---- commands --------------------------------------------------------------------------- */

/* One command, one reply: connects first if needed. An error reply is returned as a reply
 * (callers that tolerate some errors look at it); vs__fq_want turns it into a status. */
int vs__fq_run(vs_fleet_queue *q, const char *what, long long block_ms, redisReply **out,
               char *err, size_t errlen, const char *fmt, ...) {
  *out = NULL;
  int rc = vs__fq_connect(q, what, err, errlen);
  if (rc) return rc;
  va_list ap;
  va_start(ap, fmt);
  int arc = redisvAppendCommand(q->c, fmt, ap);
  va_end(ap);
  if (arc != REDIS_OK) {
    int oom = q->c->err == REDIS_ERR_OOM;
    vs_fail(err, errlen, 0, "%s: cannot format the command: %s", what, q->c->errstr);
    vs__fq_drop(q);
    return oom ? VSPEC_ENOMEM : VSPEC_EINVAL;
  }
  /* A blocking command's reply comes after its block time: the socket waits that long more. */
  if (block_ms > 0 && (rc = fq_set_timeout(q, q->command_timeout_ms + block_ms, err, errlen)))
    return rc;
  rc = vs__fq_getn(q, what, 1, out, q->command_timeout_ms + (block_ms > 0 ? block_ms : 0), err,
               errlen);
  if (!rc && block_ms > 0 && (rc = fq_set_timeout(q, q->command_timeout_ms, err, errlen))) {
    freeReplyObject(*out);
    *out = NULL;
  }
  return rc;
}

static const char *fq_type_name(int t) {
  switch (t) {
  case REDIS_REPLY_STRING: return "string";
  case REDIS_REPLY_ARRAY: return "array";
  case REDIS_REPLY_INTEGER: return "integer";
  case REDIS_REPLY_NIL: return "nil";
  case REDIS_REPLY_STATUS: return "status";
  case REDIS_REPLY_ERROR: return "error";
  default: return "unknown";
  }
}

/* Status of reply r of `what`, expected of type `type`: VS_FLEET_EREDIS for an error reply,
 * VSPEC_EFORMAT for any other type (r stays with the caller either way). */
int vs__fq_want(const vs_fleet_queue *q, const char *what, const redisReply *r, int type,
                char *err, size_t errlen) {
  if (r->type == type) return VSPEC_OK;
  if (r->type == REDIS_REPLY_ERROR) {
    return vs_fail(err, errlen, VS_FLEET_EREDIS,
                   "%s: redis at %s: %.300s", what, q->where, r->str ? r->str : "");
  }
  return vs_fail(err, errlen, VSPEC_EFORMAT,
                 "%s: redis at %s replied with %s where %s was expected", what, q->where,
                 fq_type_name(r->type), fq_type_name(type));
}

int vs__fq_bad_shape(const vs_fleet_queue *q, const char *what, const char *why, char *err,
                     size_t errlen) {
  return vs_fail(err, errlen, VSPEC_EFORMAT,
                 "%s: unexpected reply from redis at %s: %s", what, q->where, why);
}

/* "<ms>-<seq>" or "<ms>" (Redis's own spelling of ids), plus "$" where allowed. */
int vs__fq_id_ok(const char *s, int dollar) {
  if (!s) return 0;
  if (dollar && !strcmp(s, "$")) return 1;
  size_t n = strlen(s);
  const char *dash = strchr(s, '-');
  size_t a = dash ? (size_t)(dash - s) : n, b = dash ? n - a - 1 : 0;
  for (size_t i = 0; i < n; i++)
    if (i != a && (s[i] < '0' || s[i] > '9')) return 0;
  /* each part a 64-bit decimal: at most 20 digits */
  return a >= 1 && a <= 20 && (!dash || (b >= 1 && b <= 20));
}

int vs__fq_check_id(const char *what, const char *id, int dollar, char *err, size_t errlen) {
  if (vs__fq_id_ok(id, dollar)) return VSPEC_OK;
  return vs_fail(err, errlen, VSPEC_EINVAL,
                 "%s: '%.60s' is not a stream entry id (<ms>-<seq>%s)", what, id ? id : "",
                 dollar ? " or $" : "");
}

/* The replies of MULTI, k queued commands and EXEC (k + 2 in r): the EXEC's array of k
 * results, or an error naming the first command that failed. */
int vs__fq_exec(const vs_fleet_queue *q, const char *what, redisReply **r, int k,
                const redisReply **results, char *err, size_t errlen) {
  int rc;
  if ((rc = vs__fq_want(q, what, r[0], REDIS_REPLY_STATUS, err, errlen))) return rc;
  for (int i = 1; i <= k; i++)
    if ((rc = vs__fq_want(q, what, r[i], REDIS_REPLY_STATUS, err, errlen))) return rc;
  const redisReply *x = r[k + 1];
  if ((rc = vs__fq_want(q, what, x, REDIS_REPLY_ARRAY, err, errlen))) return rc;
  if (x->elements != (size_t)k) return vs__fq_bad_shape(q, what, "EXEC result count", err, errlen);
  for (int i = 0; i < k; i++) {
    if (x->element[i]->type == REDIS_REPLY_ERROR)
      return vs__fq_want(q, what, x->element[i], REDIS_REPLY_STATUS, err, errlen);
    results[i] = x->element[i];
  }
  return VSPEC_OK;
}

/* A script's EVAL: argv[0] "EVAL", argv[1] the script, then its key count, keys and
 * arguments; argl NULL for strings only. One round trip; the reply as vs__fq_run's. */
int vs__fq_eval(vs_fleet_queue *q, const char *what, int argc, const char **argv,
                const size_t *argl, redisReply **out, char *err, size_t errlen) {
  *out = NULL;
  int rc = vs__fq_connect(q, what, err, errlen);
  if (rc) return rc;
  if (redisAppendCommandArgv(q->c, argc, argv, argl) != REDIS_OK) {
    int oom = q->c->err == REDIS_ERR_OOM;
    vs_fail(err, errlen, 0, "%s: cannot format the command: %s", what, q->c->errstr);
    vs__fq_drop(q);
    return oom ? VSPEC_ENOMEM : VSPEC_EINVAL;
  }
  return vs__fq_getn(q, what, 1, out, q->command_timeout_ms, err, errlen);
}

int vs__fq_events_key(const vs_fleet_queue *q, const char *what, const char *job_id,
                      char *key, size_t cap, char *err, size_t errlen) {
  char field[48];
  snprintf(field, sizeof field, "%s job", what);
  int rc = vs_name_check(&vs__fq_job_name, field, job_id ? job_id : "", err, errlen);
  if (rc) return rc;
  snprintf(key, cap, "%s%s", q->events_prefix, job_id);
  return VSPEC_OK;
}

/* ---- replies ----------------------------------------------------------------------------- */

int vs__fq_is_str(const redisReply *r) { return r && r->type == REDIS_REPLY_STRING; }

unsigned char *vs__fq_dup(const char *s, size_t n) {
  unsigned char *d = malloc(n + 1);
  if (!d) return NULL;
  if (n) memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

/* The field named `name` of an entry's field list (an array of names and values), or NULL. */
const redisReply *vs__fq_field(const redisReply *fields, const char *name) {
  if (!fields || fields->type != REDIS_REPLY_ARRAY || fields->elements % 2) return NULL;
  size_t n = strlen(name);
  for (size_t i = 0; i + 1 < fields->elements; i += 2) {
    const redisReply *k = fields->element[i];
    if (vs__fq_is_str(k) && k->len == n && !memcmp(k->str, name, n) &&
        vs__fq_is_str(fields->element[i + 1]))
      return fields->element[i + 1];
  }
  return NULL;
}

