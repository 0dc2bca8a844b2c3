#include "daemon/fleet_queue.h"

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

/* Key names and the group: they show up in redis-cli, logs and messages unquoted. */
static const vs_name_kind vs__key_name = {"a Redis key or group name", "._:-", 1,
                                         "[A-Za-z0-9._:-]", 1, 64};
/* A job id is part of its event stream's key and of every log line about the job. */
static const vs_name_kind vs__job_name = {"a job id", "._:-", 1, "[A-Za-z0-9._:-]", 1,
                                          VS_FLEET_JOB_ID_MAX};

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

/* ---- addresses -------------------------------------------------------------------------- */

static int fq_digits(const char *s, size_t n, long long max, long long *out) {
  if (n == 0 || n > 18) return 0;
  long long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return 0;
    v = v * 10 + (s[i] - '0');
  }
  if (v > max) return 0;
  *out = v;
  return 1;
}

/* "user:password" or ":password" in s[0..n) (the text before '@'): a secret, never echoed. */
static int fq_userinfo(const char *s, size_t n, vs_fleet_addr *a, char *err, size_t errlen) {
  const char *colon = memchr(s, ':', n);
  size_t ulen = colon ? (size_t)(colon - s) : 0;
  size_t plen = colon ? n - ulen - 1 : 0;
  if (!colon || ulen >= sizeof a->user || plen >= sizeof a->password || plen == 0) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "fleet redis: the part before '@' must be user:password or :password "
                   "(user up to %zu bytes, password 1-%zu bytes)", sizeof a->user - 1,
                   sizeof a->password - 1);
  }
  memcpy(a->user, s, ulen);
  memcpy(a->password, colon + 1, plen);
  return VSPEC_OK;
}

int vs_fleet_addr_parse(const char *url, vs_fleet_addr *a, char *err, size_t errlen) {
  memset(a, 0, sizeof *a);
  if (!url || !*url) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "fleet redis: no address (redis://HOST:PORT or a unix socket path)");
  }
  const char *path = NULL;
  int rc;
  if (url[0] == '/') {
    path = url;
  } else if (!strncmp(url, "unix://", 7)) {
    path = url + 7;
    /* unix://[[user]:password@]/path: the first "@/" ends the user information */
    const char *at = path[0] != '/' ? strstr(path, "@/") : NULL;
    if (at) {
      if ((rc = fq_userinfo(path, (size_t)(at - path), a, err, errlen))) return rc;
      path = at + 1;
    }
  }
  if (path) {
    if (path[0] != '/' || strlen(path) >= sizeof a->path) {
      return vs_fail(err, errlen, VSPEC_EINVAL,
                     "fleet redis: unix socket '%.200s' is not an absolute path of at most %zu bytes",
                     path, sizeof a->path - 1);
    }
    snprintf(a->path, sizeof a->path, "%s", path);
    return VSPEC_OK;
  }
  if (!strncmp(url, "rediss://", 9)) {
    return vs_fail(err, errlen, VSPEC_ENOTSUP,
                   "fleet redis: TLS (rediss://) is not supported; use redis:// or a unix socket");
  }
  if (strncmp(url, "redis://", 8)) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "fleet redis: address must be redis://[[user]:password@]host[:port][/db], "
                   "unix://[[user]:password@]/path or /path");
  }
  const char *s = url + 8;
  /* The last '@' ends the user information: a password may hold '@', a host never does. */
  const char *at = strrchr(s, '@');
  if (at) {
    if ((rc = fq_userinfo(s, (size_t)(at - s), a, err, errlen))) return rc;
    s = at + 1;
  }
  const char *hend;
  if (*s == '[') { /* [IPv6]:port */
    const char *close = strchr(s, ']');
    if (!close) goto bad_host;
    if ((size_t)(close - s - 1) >= sizeof a->host || close == s + 1) goto bad_host;
    memcpy(a->host, s + 1, (size_t)(close - s - 1));
    hend = close + 1;
  } else {
    hend = s + strcspn(s, ":/");
    if (hend == s || (size_t)(hend - s) >= sizeof a->host) goto bad_host;
    memcpy(a->host, s, (size_t)(hend - s));
  }
  a->port = 6379;
  if (*hend == ':') {
    const char *p = hend + 1;
    size_t n = strcspn(p, "/");
    long long v;
    if (!fq_digits(p, n, 65535, &v) || v == 0) {
      return vs_fail(err, errlen, VSPEC_EINVAL,
                     "fleet redis: port '%.*s' is not 1-65535", (int)(n > 40 ? 40 : n), p);
    }
    a->port = (int)v;
    hend = p + n;
  }
  if (*hend == '/' && hend[1]) {
    long long v;
    if (!fq_digits(hend + 1, strlen(hend + 1), INT_MAX, &v)) {
      return vs_fail(err, errlen, VSPEC_EINVAL,
                     "fleet redis: database '%.40s' is not a number", hend + 1);
    }
    a->db = (int)v;
  } else if (*hend && strcmp(hend, "/")) {
    goto bad_host;
  }
  return VSPEC_OK;
bad_host:
  return vs_fail(err, errlen, VSPEC_EINVAL,
                 "fleet redis: no valid host in '%.200s' (redis://host[:port][/db])",
                 at ? at + 1 : url + 8);
}

/* ---- the connection --------------------------------------------------------------------- */

/* hiredis writes with write(2): on a connection the server closed, that raises SIGPIPE, which
 * kills a process that did not ignore it. vspecd ignores it, a test or a tool may not, so each
 * round trip runs with SIGPIPE blocked in this thread, and a SIGPIPE it raised is taken back
 * (one already pending before is left alone). */
typedef struct {
  sigset_t old;
  int was_pending;
} vs__pipe_guard;

static void fq_pipe_block(vs__pipe_guard *g) {
  sigset_t set, pend;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  sigemptyset(&pend);
  sigpending(&pend);
  g->was_pending = sigismember(&pend, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

static void fq_pipe_unblock(vs__pipe_guard *g) {
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

static void fq_drop(vs_fleet_queue *q) {
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
  fq_drop(q);
  return VSPEC_EIO;
}

static int fq_set_timeout(vs_fleet_queue *q, long long ms, char *err, size_t errlen) {
  if (redisSetTimeout(q->c, fq_tv(ms)) != REDIS_OK)
    return fq_lost(q, "setting the socket timeout", errno, 0, err, errlen);
  return VSPEC_OK;
}

/* Reads n replies (of commands appended before). All of them or none: after an I/O error the
 * replies read so far are freed and the connection is dropped. */
static int fq_getn(vs_fleet_queue *q, const char *what, int n, redisReply **r, long long wait_ms,
                   char *err, size_t errlen) {
  for (int i = 0; i < n; i++) r[i] = NULL;
  vs__pipe_guard g;
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

static int fq_connect(vs_fleet_queue *q, const char *what, char *err, size_t errlen);

static int fq_append(vs_fleet_queue *q, const char *what, char *err, size_t errlen,
                     const char *fmt, ...) {
  int rc = fq_connect(q, what, err, errlen);
  if (rc) return rc;
  va_list ap;
  va_start(ap, fmt);
  rc = redisvAppendCommand(q->c, fmt, ap);
  va_end(ap);
  if (rc == REDIS_OK) return VSPEC_OK;
  /* hiredis keeps the error in the context, so the connection goes with it. */
  int oom = q->c->err == REDIS_ERR_OOM;
  vs_fail(err, errlen, 0, "%s: cannot format the command: %s", what, q->c->errstr);
  fq_drop(q);
  return oom ? VSPEC_ENOMEM : VSPEC_EINVAL;
}

/* Connects if not connected; messages start with `what`, the command that needed it. */
static int fq_connect(vs_fleet_queue *q, const char *what, char *err, size_t errlen) {
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
      rc = q->addr.user[0] ? fq_append(q, what, err, errlen, "AUTH %s %s", q->addr.user,
                                       q->addr.password)
                           : fq_append(q, what, err, errlen, "AUTH %s", q->addr.password);
      if (rc) return rc;
      n++;
    }
    if (q->addr.db) {
      char db[24];
      snprintf(db, sizeof db, "%d", q->addr.db);
      if ((rc = fq_append(q, what, err, errlen, "SELECT %s", db))) return rc;
      n++;
    }
    redisReply *r[2];
    if ((rc = fq_getn(q, what, n, r, q->command_timeout_ms, err, errlen))) return rc;
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
    if (rc) fq_drop(q);
  }
  return rc;
}

int vs_fleet_queue_connect(vs_fleet_queue *q, char *err, size_t errlen) {
  return fq_connect(q, "connect", err, errlen);
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
  if (!rc) rc = fq_copy_name(q->stream, sizeof q->stream, &vs__key_name, "fleet stream", o->stream,
                             err, errlen);
  if (!rc) rc = fq_copy_name(q->group, sizeof q->group, &vs__key_name, "fleet group", o->group,
                             err, errlen);
  if (!rc) rc = fq_copy_name(q->events_prefix, sizeof q->events_prefix, &vs__key_name,
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
  fq_drop(*qp);
  /* the password is in there */
  explicit_bzero(&(*qp)->addr, sizeof (*qp)->addr);
  free(*qp);
  *qp = NULL;
}

/* ---- commands --------------------------------------------------------------------------- */

/* One command, one reply: connects first if needed. An error reply is returned as a reply
 * (callers that tolerate some errors look at it); fq_want turns it into a status. */
static int fq_run(vs_fleet_queue *q, const char *what, long long block_ms, redisReply **out,
                  char *err, size_t errlen, const char *fmt, ...) {
  *out = NULL;
  int rc = fq_connect(q, what, err, errlen);
  if (rc) return rc;
  va_list ap;
  va_start(ap, fmt);
  int arc = redisvAppendCommand(q->c, fmt, ap);
  va_end(ap);
  if (arc != REDIS_OK) {
    int oom = q->c->err == REDIS_ERR_OOM;
    vs_fail(err, errlen, 0, "%s: cannot format the command: %s", what, q->c->errstr);
    fq_drop(q);
    return oom ? VSPEC_ENOMEM : VSPEC_EINVAL;
  }
  /* A blocking command's reply comes after its block time: the socket waits that long more. */
  if (block_ms > 0 && (rc = fq_set_timeout(q, q->command_timeout_ms + block_ms, err, errlen)))
    return rc;
  rc = fq_getn(q, what, 1, out, q->command_timeout_ms + (block_ms > 0 ? block_ms : 0), err,
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
static int fq_want(const vs_fleet_queue *q, const char *what, const redisReply *r, int type,
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

static int fq_bad_shape(const vs_fleet_queue *q, const char *what, const char *why, char *err,
                        size_t errlen) {
  return vs_fail(err, errlen, VSPEC_EFORMAT,
                 "%s: unexpected reply from redis at %s: %s", what, q->where, why);
}

/* "<ms>-<seq>" or "<ms>" (Redis's own spelling of ids), plus "$" where allowed. */
static int fq_id_ok(const char *s, int dollar) {
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

static int fq_check_id(const char *what, const char *id, int dollar, char *err, size_t errlen) {
  if (fq_id_ok(id, dollar)) return VSPEC_OK;
  return vs_fail(err, errlen, VSPEC_EINVAL,
                 "%s: '%.60s' is not a stream entry id (<ms>-<seq>%s)", what, id ? id : "",
                 dollar ? " or $" : "");
}

/* The replies of MULTI, k queued commands and EXEC (k + 2 in r): the EXEC's array of k
 * results, or an error naming the first command that failed. */
static int fq_exec(const vs_fleet_queue *q, const char *what, redisReply **r, int k,
                   const redisReply **results, char *err, size_t errlen) {
  int rc;
  if ((rc = fq_want(q, what, r[0], REDIS_REPLY_STATUS, err, errlen))) return rc;
  for (int i = 1; i <= k; i++)
    if ((rc = fq_want(q, what, r[i], REDIS_REPLY_STATUS, err, errlen))) return rc;
  const redisReply *x = r[k + 1];
  if ((rc = fq_want(q, what, x, REDIS_REPLY_ARRAY, err, errlen))) return rc;
  if (x->elements != (size_t)k) return fq_bad_shape(q, what, "EXEC result count", err, errlen);
  for (int i = 0; i < k; i++) {
    if (x->element[i]->type == REDIS_REPLY_ERROR)
      return fq_want(q, what, x->element[i], REDIS_REPLY_STATUS, err, errlen);
    results[i] = x->element[i];
  }
  return VSPEC_OK;
}

int vs_fleet_ensure_group(vs_fleet_queue *q, char *err, size_t errlen) {
  redisReply *r;
  int rc = fq_run(q, "XGROUP CREATE", 0, &r, err, errlen, "XGROUP CREATE %s %s 0 MKSTREAM",
                  q->stream, q->group);
  if (rc) return rc;
  if (r->type == REDIS_REPLY_ERROR && r->str && !strncmp(r->str, "BUSYGROUP", 9))
    rc = VSPEC_OK; /* another daemon made it first */
  else
    rc = fq_want(q, "XGROUP CREATE", r, REDIS_REPLY_STATUS, err, errlen);
  freeReplyObject(r);
  return rc;
}

int vs_fleet_enqueue(vs_fleet_queue *q, const char *job_id, const void *payload, size_t len,
                     char *entry_id, char *err, size_t errlen) {
  if (entry_id) entry_id[0] = '\0';
  int rc = vs_name_check(&vs__job_name, "XADD job", job_id ? job_id : "", err, errlen);
  if (rc) return rc;
  if (len > q->max_payload || (len && !payload)) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "XADD: a payload of %zu bytes (at most %zu)", len, q->max_payload);
  }
  redisReply *r;
  if ((rc = fq_run(q, "XLEN", 0, &r, err, errlen, "XLEN %s", q->stream))) return rc;
  rc = fq_want(q, "XLEN", r, REDIS_REPLY_INTEGER, err, errlen);
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
  rc = fq_run(q, "XADD", 0, &r, err, errlen, "XADD %s MAXLEN ~ %s * job %b payload %b",
              q->stream, cap, job_id, strlen(job_id), len ? payload : "", len);
  if (rc) return rc;
  rc = fq_want(q, "XADD", r, REDIS_REPLY_STRING, err, errlen);
  if (!rc && r->len >= VS_FLEET_ID_MAX)
    rc = fq_bad_shape(q, "XADD", "entry id too long", err, errlen);
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

static int fq_is_str(const redisReply *r) { return r && r->type == REDIS_REPLY_STRING; }

static unsigned char *fq_dup(const char *s, size_t n) {
  unsigned char *d = malloc(n + 1);
  if (!d) return NULL;
  if (n) memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

/* The field named `name` of an entry's field list (an array of names and values), or NULL. */
static const redisReply *fq_field(const redisReply *fields, const char *name) {
  if (!fields || fields->type != REDIS_REPLY_ARRAY || fields->elements % 2) return NULL;
  size_t n = strlen(name);
  for (size_t i = 0; i + 1 < fields->elements; i += 2) {
    const redisReply *k = fields->element[i];
    if (fq_is_str(k) && k->len == n && !memcmp(k->str, name, n) &&
        fq_is_str(fields->element[i + 1]))
      return fields->element[i + 1];
  }
  return NULL;
}

/* One stream entry, [id, [field, value, ...]], into a job. VSPEC_EFORMAT when the entry
 * itself is not one (then the whole reply is suspect); bad fields only mark it malformed. */
static int fq_job_from(const vs_fleet_queue *q, const char *what, const redisReply *e,
                       vs_fleet_job *j, char *err, size_t errlen) {
  memset(j, 0, sizeof *j);
  if (!e || e->type != REDIS_REPLY_ARRAY || e->elements != 2 || !fq_is_str(e->element[0]) ||
      e->element[0]->len >= VS_FLEET_ID_MAX)
    return fq_bad_shape(q, what, "a stream entry is not [id, fields]", err, errlen);
  memcpy(j->entry_id, e->element[0]->str, e->element[0]->len + 1);
  const redisReply *id = fq_field(e->element[1], "job");
  const redisReply *pl = fq_field(e->element[1], "payload");
  char ignored[8];
  j->malformed = 1;
  if (!id || !pl || id->len > VS_FLEET_JOB_ID_MAX || memchr(id->str, 0, id->len) ||
      pl->len > q->max_payload)
    return VSPEC_OK;
  char jid[VS_FLEET_JOB_ID_MAX + 1];
  memcpy(jid, id->str, id->len);
  jid[id->len] = '\0';
  if (vs_name_check(&vs__job_name, "job", jid, ignored, sizeof ignored)) return VSPEC_OK;
  if (!(j->payload = fq_dup(pl->str, pl->len))) {
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
static int fq_deliveries(vs_fleet_queue *q, vs_fleet_job *jobs, int n, char *err,
                         size_t errlen) {
  int rc;
  for (int i = 0; i < n; i++)
    if ((rc = fq_append(q, "XPENDING", err, errlen, "XPENDING %s %s %s %s 1", q->stream,
                        q->group, jobs[i].entry_id, jobs[i].entry_id)))
      return rc;
  redisReply *stack[16], **r = n <= 16 ? stack : calloc((size_t)n, sizeof *r);
  if (!r) {
    /* the appended commands' replies would answer the next ones: start over */
    fq_drop(q);
    return vs_fail(err, errlen, VSPEC_ENOMEM,
                   "XPENDING: out of memory");
  }
  rc = fq_getn(q, "XPENDING", n, r, q->command_timeout_ms, err, errlen);
  for (int i = 0; !rc && i < n; i++) {
    if ((rc = fq_want(q, "XPENDING", r[i], REDIS_REPLY_ARRAY, err, errlen))) break;
    jobs[i].deliveries = 0;
    if (r[i]->elements == 0) continue;
    const redisReply *p = r[i]->element[0];
    if (p->type != REDIS_REPLY_ARRAY || p->elements != 4 || !fq_is_str(p->element[0]) ||
        p->element[3]->type != REDIS_REPLY_INTEGER) {
      rc = fq_bad_shape(q, "XPENDING", "an entry is not [id, consumer, idle, deliveries]", err,
                        errlen);
      break;
    }
    if (strcmp(p->element[0]->str, jobs[i].entry_id)) {
      rc = fq_bad_shape(q, "XPENDING", "the pending entry is another one", err, errlen);
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
    rc = fq_run(q, "XREADGROUP", block_ms, &r, err, errlen,
                "XREADGROUP GROUP %s %s COUNT 1 BLOCK %s STREAMS %s >", q->group, q->consumer, b,
                q->stream);
  } else {
    rc = fq_run(q, "XREADGROUP", 0, &r, err, errlen,
                "XREADGROUP GROUP %s %s COUNT 1 STREAMS %s >", q->group, q->consumer, q->stream);
  }
  if (rc) return rc;
  int got = 0;
  if (r->type == REDIS_REPLY_NIL) goto out; /* nothing within block_ms */
  if ((rc = fq_want(q, "XREADGROUP", r, REDIS_REPLY_ARRAY, err, errlen))) goto out;
  if (r->elements != 1 || r->element[0]->type != REDIS_REPLY_ARRAY ||
      r->element[0]->elements != 2 || r->element[0]->element[1]->type != REDIS_REPLY_ARRAY) {
    rc = fq_bad_shape(q, "XREADGROUP", "not [[stream, entries]]", err, errlen);
    goto out;
  }
  const redisReply *entries = r->element[0]->element[1];
  if (entries->elements == 0) goto out;
  if ((rc = fq_job_from(q, "XREADGROUP", entries->element[0], job, err, errlen))) goto out;
  got = 1;
out:
  freeReplyObject(r);
  if (rc) {
    vs_fleet_job_clear(job);
    return rc;
  }
  if (!got) return 0;
  /* Lost here, the job stays pending on this consumer: a claim picks it up once idle. */
  if ((rc = fq_deliveries(q, job, 1, err, errlen))) {
    vs_fleet_job_clear(job);
    return rc;
  }
  return 1;
}

int vs_fleet_ack(vs_fleet_queue *q, const char *entry_id, char *err, size_t errlen) {
  int rc = fq_check_id("XACK", entry_id, 0, err, errlen);
  if (rc) return rc;
  if ((rc = fq_connect(q, "XACK", err, errlen))) return rc;
  if ((rc = fq_append(q, "XACK", err, errlen, "MULTI")) ||
      (rc = fq_append(q, "XACK", err, errlen, "XACK %s %s %s", q->stream, q->group, entry_id)) ||
      (rc = fq_append(q, "XACK", err, errlen, "XDEL %s %s", q->stream, entry_id)) ||
      (rc = fq_append(q, "XACK", err, errlen, "EXEC")))
    return rc;
  redisReply *r[4];
  if ((rc = fq_getn(q, "XACK/XDEL", 4, r, q->command_timeout_ms, err, errlen))) return rc;
  const redisReply *res[2];
  rc = fq_exec(q, "XACK/XDEL", r, 2, res, err, errlen);
  if (!rc && (res[0]->type != REDIS_REPLY_INTEGER || res[1]->type != REDIS_REPLY_INTEGER))
    rc = fq_bad_shape(q, "XACK/XDEL", "counts are not integers", err, errlen);
  if (!rc) rc = res[0]->integer > 0;
  for (int i = 0; i < 4; i++) freeReplyObject(r[i]);
  return rc;
}

static int fq_events_key(const vs_fleet_queue *q, const char *what, const char *job_id,
                         char *key, size_t cap, char *err, size_t errlen) {
  char field[48];
  snprintf(field, sizeof field, "%s job", what);
  int rc = vs_name_check(&vs__job_name, field, job_id ? job_id : "", err, errlen);
  if (rc) return rc;
  snprintf(key, cap, "%s%s", q->events_prefix, job_id);
  return VSPEC_OK;
}

/* A script's EVAL: argv[0] "EVAL", argv[1] the script, then its key count, keys and
 * arguments; argl NULL for strings only. One round trip; the reply as fq_run's. */
static int fq_eval(vs_fleet_queue *q, const char *what, int argc, const char **argv,
                   const size_t *argl, redisReply **out, char *err, size_t errlen) {
  *out = NULL;
  int rc = fq_connect(q, what, err, errlen);
  if (rc) return rc;
  if (redisAppendCommandArgv(q->c, argc, argv, argl) != REDIS_OK) {
    int oom = q->c->err == REDIS_ERR_OOM;
    vs_fail(err, errlen, 0, "%s: cannot format the command: %s", what, q->c->errstr);
    fq_drop(q);
    return oom ? VSPEC_ENOMEM : VSPEC_EINVAL;
  }
  return fq_getn(q, what, 1, out, q->command_timeout_ms, err, errlen);
}

/* KEYS: the jobs stream. ARGV: group, min idle, first id of the scan, count. Each pending
 * entry idle that long, with its `job` field ('' when the entry has none or is gone). */
static const char vs__stale_lua[] =
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
  if (e->type != REDIS_REPLY_ARRAY || e->elements != 5 || !fq_is_str(e->element[0]) ||
      !fq_is_str(e->element[1]) || e->element[2]->type != REDIS_REPLY_INTEGER ||
      e->element[3]->type != REDIS_REPLY_INTEGER || !fq_is_str(e->element[4]) ||
      e->element[0]->len >= sizeof s->entry_id || !fq_id_ok(e->element[0]->str, 0))
    return -1;
  memcpy(s->entry_id, e->element[0]->str, e->element[0]->len + 1);
  /* only for messages: a longer name (not a vspecd's) is cut */
  snprintf(s->consumer, sizeof s->consumer, "%s", e->element[1]->str);
  s->idle_ms = e->element[2]->integer;
  s->deliveries = e->element[3]->integer;
  char ignored[8];
  const redisReply *j = e->element[4];
  if (j->len <= VS_FLEET_JOB_ID_MAX && !memchr(j->str, 0, j->len) &&
      !vs_name_check(&vs__job_name, "job", j->str, ignored, sizeof ignored))
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
  const char *argv[] = {"EVAL", vs__stale_lua, "1", q->stream, q->group, idle, q->cursor, count};
  redisReply *r;
  int rc = fq_eval(q, "XPENDING (stale)", 8, argv, NULL, &r, err, errlen);
  if (rc) return rc;
  int n = 0;
  if (!(rc = fq_want(q, "XPENDING (stale)", r, REDIS_REPLY_ARRAY, err, errlen)) &&
      r->elements > (size_t)max)
    rc = fq_bad_shape(q, "XPENDING (stale)", "more entries than asked for", err, errlen);
  for (size_t i = 0; !rc && i < r->elements; i++, n++)
    if (fq_stale_from(r->element[i], &out[n]))
      rc = fq_bad_shape(q, "XPENDING (stale)", "an entry is not [id, consumer, idle, "
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
static const char vs__announce_lua[] =
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
  int rc = fq_events_key(q, what, job_id, ekey, sizeof ekey, err, errlen);
  if (!rc) rc = fq_check_id(what, entry_id, 0, err, errlen);
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
  const char *argv[] = {"EVAL", vs__announce_lua, "3", q->stream, mark, ekey, q->group, entry_id,
                        dl, idle, len ? event : "", ev_max, ttl, mode, q->consumer};
  size_t argl[15];
  for (int i = 0; i < 15; i++) argl[i] = i == 10 ? len : strlen(argv[i]); /* the event: bytes */
  redisReply *r;
  if ((rc = fq_eval(q, what, 15, argv, argl, &r, err, errlen))) return rc;
  if (!(rc = fq_want(q, what, r, REDIS_REPLY_INTEGER, err, errlen))) rc = r->integer > 0;
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
  int rc = fq_check_id("XCLAIM", entry_id, 0, err, errlen);
  if (rc) return rc;
  char idle[24];
  snprintf(idle, sizeof idle, "%lld", min_idle_ms);
  redisReply *r;
  if ((rc = fq_run(q, "XCLAIM", 0, &r, err, errlen, "XCLAIM %s %s %s %s %s", q->stream,
                   q->group, q->consumer, idle, entry_id)))
    return rc;
  int got = 0;
  /* 7.0 leaves out an entry deleted while pending (and drops it from the list) */
  if (!(rc = fq_want(q, "XCLAIM", r, REDIS_REPLY_ARRAY, err, errlen)) && r->elements > 1)
    rc = fq_bad_shape(q, "XCLAIM", "more than the one entry claimed", err, errlen);
  if (!rc && r->elements == 1 && r->element[0]->type != REDIS_REPLY_NIL &&
      !(rc = fq_job_from(q, "XCLAIM", r->element[0], job, err, errlen)))
    got = 1;
  freeReplyObject(r);
  if (!rc && got) rc = fq_deliveries(q, job, 1, err, errlen);
  if (rc) {
    vs_fleet_job_clear(job);
    return rc;
  }
  return got;
}

int vs_fleet_event_append(vs_fleet_queue *q, const char *job_id, const void *data, size_t len,
                          char *event_id, char *err, size_t errlen) {
  if (event_id) event_id[0] = '\0';
  char key[sizeof q->events_prefix + VS_FLEET_JOB_ID_MAX];
  int rc = fq_events_key(q, "XADD", job_id, key, sizeof key, err, errlen);
  if (rc) return rc;
  if (len > q->max_payload || (len && !data)) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "XADD: an event of %zu bytes (at most %zu)", len, q->max_payload);
  }
  if ((rc = fq_connect(q, "XADD", err, errlen))) return rc;
  char maxlen[24], ttl[24];
  snprintf(maxlen, sizeof maxlen, "%lld", q->events_max_len);
  snprintf(ttl, sizeof ttl, "%lld", q->events_ttl_ms);
  if ((rc = fq_append(q, "XADD", err, errlen, "MULTI")) ||
      (rc = fq_append(q, "XADD", err, errlen, "XADD %s MAXLEN %s * data %b", key, maxlen,
                      len ? data : "", len)) ||
      (rc = fq_append(q, "XADD", err, errlen, "PEXPIRE %s %s", key, ttl)) ||
      (rc = fq_append(q, "XADD", err, errlen, "EXEC")))
    return rc;
  redisReply *r[4];
  if ((rc = fq_getn(q, "XADD/PEXPIRE", 4, r, q->command_timeout_ms, err, errlen))) return rc;
  const redisReply *res[2];
  rc = fq_exec(q, "XADD/PEXPIRE", r, 2, res, err, errlen);
  if (!rc && (!fq_is_str(res[0]) || res[0]->len >= VS_FLEET_ID_MAX ||
              res[1]->type != REDIS_REPLY_INTEGER))
    rc = fq_bad_shape(q, "XADD/PEXPIRE", "not [id, 1]", err, errlen);
  if (!rc && event_id) memcpy(event_id, res[0]->str, res[0]->len + 1);
  for (int i = 0; i < 4; i++) freeReplyObject(r[i]);
  return rc;
}

int vs_fleet_events_read(vs_fleet_queue *q, const char *job_id, const char *after_id,
                         int block_ms, vs_fleet_event *ev, int max, char *err, size_t errlen) {
  char key[sizeof q->events_prefix + VS_FLEET_JOB_ID_MAX];
  int rc = fq_events_key(q, "XREAD", job_id, key, sizeof key, err, errlen);
  if (rc) return rc;
  if ((rc = fq_check_id("XREAD", after_id, 1, err, errlen))) return rc;
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
    rc = fq_run(q, "XREAD", block_ms, &r, err, errlen, "XREAD COUNT %s BLOCK %s STREAMS %s %s",
                count, b, key, after_id);
  } else {
    rc = fq_run(q, "XREAD", 0, &r, err, errlen, "XREAD COUNT %s STREAMS %s %s", count, key,
                after_id);
  }
  if (rc) return rc;
  int n = 0;
  if (r->type == REDIS_REPLY_NIL) goto out;
  if ((rc = fq_want(q, "XREAD", r, REDIS_REPLY_ARRAY, err, errlen))) goto out;
  if (r->elements != 1 || r->element[0]->type != REDIS_REPLY_ARRAY ||
      r->element[0]->elements != 2 || r->element[0]->element[1]->type != REDIS_REPLY_ARRAY ||
      r->element[0]->element[1]->elements > (size_t)max) {
    rc = fq_bad_shape(q, "XREAD", "not [[stream, entries]]", err, errlen);
    goto out;
  }
  const redisReply *entries = r->element[0]->element[1];
  for (size_t i = 0; i < entries->elements; i++) {
    const redisReply *e = entries->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 || !fq_is_str(e->element[0]) ||
        e->element[0]->len >= VS_FLEET_ID_MAX) {
      rc = fq_bad_shape(q, "XREAD", "an event is not [id, fields]", err, errlen);
      goto out;
    }
    memcpy(ev[n].id, e->element[0]->str, e->element[0]->len + 1);
    /* An entry without `data` (not written by vs_fleet_event_append) is kept, empty, so that
     * a reader moves past its id instead of stopping there. */
    const redisReply *d = fq_field(e->element[1], "data");
    if (d) {
      if (!(ev[n].data = fq_dup(d->str, d->len))) {
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

int vs_fleet_depth(vs_fleet_queue *q, long long *length, long long *pending, char *err,
                   size_t errlen) {
  int rc = fq_connect(q, "XLEN", err, errlen);
  if (rc) return rc;
  if ((rc = fq_append(q, "XLEN", err, errlen, "XLEN %s", q->stream)) ||
      (rc = fq_append(q, "XPENDING", err, errlen, "XPENDING %s %s", q->stream, q->group)))
    return rc;
  redisReply *r[2];
  if ((rc = fq_getn(q, "XLEN/XPENDING", 2, r, q->command_timeout_ms, err, errlen))) return rc;
  rc = fq_want(q, "XLEN", r[0], REDIS_REPLY_INTEGER, err, errlen);
  if (!rc) rc = fq_want(q, "XPENDING", r[1], REDIS_REPLY_ARRAY, err, errlen);
  if (!rc && (r[1]->elements < 1 || r[1]->element[0]->type != REDIS_REPLY_INTEGER))
    rc = fq_bad_shape(q, "XPENDING", "no pending count", err, errlen);
  if (!rc) {
    if (length) *length = r[0]->integer;
    if (pending) *pending = r[1]->element[0]->integer;
  }
  freeReplyObject(r[0]);
  freeReplyObject(r[1]);
  return rc;
}

/* ---- running jobs: claims and cancel flags ------------------------------------------------ */

/* Atomically, for each id: still pending on this consumer, and its run not announced lost
 * (vs_fleet_announce_loss's mark)? Then reset its idle time (XCLAIM JUSTID with min-idle 0
 * does not raise the delivery count) and return it. A job claimed away by another daemon, or
 * announced lost to its client, is left alone: a refresh must never steal a job back, nor
 * keep one whose client was told it runs again elsewhere. */
static const char vs__touch_lua[] =
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
    int rc = fq_check_id("XCLAIM", entry_ids[i], 0, err, errlen);
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
  argv[1] = vs__touch_lua;
  argv[2] = "1";
  argv[3] = q->stream;
  argv[4] = q->group;
  argv[5] = q->consumer;
  for (int i = 0; i < n; i++) argv[6 + i] = entry_ids[i];
  redisReply *r;
  rc = fq_eval(q, "XCLAIM (refresh)", argc, argv, NULL, &r, err, errlen);
  free(argv);
  if (rc) return rc;
  if (!(rc = fq_want(q, "XCLAIM (refresh)", r, REDIS_REPLY_ARRAY, err, errlen))) {
    int kept = 0;
    for (size_t k = 0; k < r->elements; k++) {
      if (!fq_is_str(r->element[k])) continue;
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
  int rc = vs_name_check(&vs__job_name, field, job_id ? job_id : "", err, errlen);
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
  if ((rc = fq_run(q, "SET (cancel)", 0, &r, err, errlen, "SET %s 1 PX %s", key, ttl)))
    return rc;
  rc = fq_want(q, "SET (cancel)", r, REDIS_REPLY_STATUS, err, errlen);
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
  if (!rc && n) rc = fq_connect(q, "EXISTS (cancel)", err, errlen);
  for (int i = 0; !rc && i < n; i++) {
    fq_cancel_key(q, "EXISTS", job_ids[i], key, sizeof key, err, errlen);
    rc = fq_append(q, "EXISTS (cancel)", err, errlen, "EXISTS %s", key);
  }
  if (rc || !n) return rc;
  redisReply **r = calloc((size_t)n, sizeof *r);
  if (!r) {
    fq_drop(q); /* n replies are on their way, unread */
    return vs_fail(err, errlen, VSPEC_ENOMEM,
                   "EXISTS (cancel): out of memory");
  }
  int found = 0;
  if (!(rc = fq_getn(q, "EXISTS (cancel)", n, r, q->command_timeout_ms, err, errlen))) {
    for (int i = 0; i < n && !rc; i++)
      if (!(rc = fq_want(q, "EXISTS (cancel)", r[i], REDIS_REPLY_INTEGER, err, errlen)) &&
          r[i]->integer > 0) {
        cancelled[i] = 1;
        found++;
      }
    for (int i = 0; i < n; i++) freeReplyObject(r[i]);
  }
  free(r);
  return rc ? rc : found;
}

int vs_fleet_events_exist(vs_fleet_queue *q, const char *job_id, char *err, size_t errlen) {
  char key[sizeof q->events_prefix + VS_FLEET_JOB_ID_MAX];
  int rc = fq_events_key(q, "EXISTS", job_id, key, sizeof key, err, errlen);
  if (rc) return rc;
  redisReply *r;
  if ((rc = fq_run(q, "EXISTS", 0, &r, err, errlen, "EXISTS %s", key))) return rc;
  if (!(rc = fq_want(q, "EXISTS", r, REDIS_REPLY_INTEGER, err, errlen))) rc = r->integer > 0;
  freeReplyObject(r);
  return rc;
}

/* ---- a gateway's submit, in one step ---------------------------------------------------- */

/* KEYS: the jobs stream, the job's event stream, its id key ("" without a client-chosen id).
 * ARGV: job id, payload, the first event, max_len, the stream's trim backstop, events kept,
 * the events' ttl, the request's digest. Atomic, so that a gateway (or Redis) dying half way
 * leaves either all of it or none: an id taken without its job, or an Accepted without its
 * entry, would leave a retrying client following a job that does not exist. */
static const char vs__submit_lua[] =
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
  int rc = fq_events_key(q, "submit", job_id, ekey, sizeof ekey, err, errlen);
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
  const char *argv[] = {"EVAL", vs__submit_lua, "3", q->stream, ekey, ikey, job_id,
                        len ? payload : "", first_event ? first_event : "", max_len, cap,
                        ev_max, ttl, digest ? digest : ""};
  size_t argl[14];
  for (int i = 0; i < 14; i++) /* the payload and the event are bytes, not strings */
    argl[i] = i == 7 ? len : i == 8 ? event_len : strlen(argv[i]);
  if ((rc = fq_connect(q, "submit", err, errlen))) return rc;
  if (redisAppendCommandArgv(q->c, 14, argv, argl) != REDIS_OK) {
    int oom = q->c->err == REDIS_ERR_OOM;
    vs_fail(err, errlen, 0, "submit: cannot format the command: %s", q->c->errstr);
    fq_drop(q);
    return oom ? VSPEC_ENOMEM : VSPEC_EINVAL;
  }
  redisReply *r;
  if ((rc = fq_getn(q, "submit (XADD)", 1, &r, q->command_timeout_ms, err, errlen))) return rc;
  if ((rc = fq_want(q, "submit (XADD)", r, REDIS_REPLY_ARRAY, err, errlen))) goto out;
  if (r->elements < 1 || !fq_is_str(r->element[0])) {
    rc = fq_bad_shape(q, "submit (XADD)", "no outcome", err, errlen);
    goto out;
  }
  const char *what = r->element[0]->str;
  if (!strcmp(what, "new") && r->elements == 2 && fq_is_str(r->element[1]) &&
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
    rc = fq_bad_shape(q, "submit (XADD)", "an unknown outcome", err, errlen);
  }
out:
  freeReplyObject(r);
  return rc;
}

int vs_fleet_job_keepalive(vs_fleet_queue *q, const char *job_id, char *err, size_t errlen) {
  char ekey[sizeof q->events_prefix + VS_FLEET_JOB_ID_MAX];
  int rc = fq_events_key(q, "PEXPIRE", job_id, ekey, sizeof ekey, err, errlen);
  if (rc) return rc;
  char ttl[24];
  snprintf(ttl, sizeof ttl, "%lld", q->events_ttl_ms);
  if ((rc = fq_append(q, "PEXPIRE", err, errlen, "PEXPIRE %s %s", ekey, ttl)) ||
      (rc = fq_append(q, "PEXPIRE", err, errlen, "PEXPIRE %s:id:%s %s", q->stream, job_id, ttl)))
    return rc;
  redisReply *r[2];
  if ((rc = fq_getn(q, "PEXPIRE", 2, r, q->command_timeout_ms, err, errlen))) return rc;
  rc = fq_want(q, "PEXPIRE", r[0], REDIS_REPLY_INTEGER, err, errlen);
  if (!rc) rc = fq_want(q, "PEXPIRE", r[1], REDIS_REPLY_INTEGER, err, errlen);
  if (!rc) rc = r[0]->integer > 0;
  freeReplyObject(r[0]);
  freeReplyObject(r[1]);
  return rc;
}
