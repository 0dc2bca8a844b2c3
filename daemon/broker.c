#include "daemon/broker.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "core/log.h"
#include "daemon/zap.h"
#include "proto/curve_keys.h"
#include "proto/wire.h"

#define VS_OWN_REQUEST (1ull << 63) /* request ids of the broker's own status polls */

typedef struct vs__backend {
  char endpoint[256];
  void *sock;
  int alive;
  double last_seen, last_poll;
  int inflight; /* jobs and pending submits */
  int workers, queued, running, clients, queue_cap;
  uint64_t submitted, completed, failed, cancelled, busy, lost, malformed, tokens;
  char node[64];
} vs__backend;

/* A pending submit (job_id == 0) or a running job. */
typedef struct vs__bjob {
  uint64_t job_id, request_id;
  vs_wire_envelope client;
  int backend;
  unsigned tried;
  int cancel_on_accept; /* its client vanished before the daemon accepted it */
  int redispatch;       /* its daemon died before accepting it: send it elsewhere */
  /* the submit, kept until a daemon accepts it (a busy daemon means: try the next) */
  uint8_t *body;
  size_t body_len;
  int n_blobs;
  uint8_t *blob[VS_WIRE_MAX_BLOBS];
  size_t blob_len[VS_WIRE_MAX_BLOBS];
  int blob_kind[VS_WIRE_MAX_BLOBS];
  struct vs__bjob *next;
} vs__bjob;

typedef struct vs__broker {
  const vs_broker_config *cfg;
  void *ctx, *front;
  vs__backend be[VS_BROKER_MAX_BACKENDS];
  int n;
  vs__bjob *jobs;
  uint64_t own_seq, next_request;
  double started;
  uint64_t malformed, unavailable;
} vs__broker;

static volatile sig_atomic_t vs__stop;
static void vs__on_signal(int sig) {
  (void)sig;
  vs__stop = 1;
}

static double vs__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void vs__bjob_free(vs__bjob *j) {
  free(j->body);
  for (int i = 0; i < j->n_blobs; i++) free(j->blob[i]);
  free(j);
}

static void vs__unlink(vs__broker *b, vs__bjob *j) {
  for (vs__bjob **p = &b->jobs; *p; p = &(*p)->next)
    if (*p == j) {
      *p = j->next;
      return;
    }
}

static void vs__reply_error(vs__broker *b, const vs_wire_envelope *env, uint64_t job,
                            uint64_t rid, int code, const char *msg) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Error e = VSPEC__ERROR__INIT;
  e.code = code;
  e.message = (char *)msg;
  if (code == VSPEC__ERROR_CODE__ERR_BUSY || code == VSPEC__ERROR_CODE__ERR_UNAVAILABLE) {
    e.has_retry_after_ms = 1;
    e.retry_after_ms = 1000;
  }
  ev.body_case = VSPEC__EVENT__BODY_ERROR;
  ev.error = &e;
  if (job) {
    ev.has_job_id = 1;
    ev.job_id = job;
  }
  if (rid) {
    ev.has_request_id = 1;
    ev.request_id = rid;
  }
  vs_wire_send_event(b->front, env, &ev, NULL, 0, ZMQ_DONTWAIT);
}

/* Sends a kept submit to a daemon; 0 or -errno. */
static int vs__send_submit(vs__broker *b, vs__bjob *j, int i) {
  void *s = b->be[i].sock;
  int flags = ZMQ_DONTWAIT;
  /* DEALER -> daemon ROUTER: [client envelope] [""] [body] [blobs]; ZMQ_IMMEDIATE makes an
   * unconnected daemon an EAGAIN here instead of a queue that waits for it. */
  for (int k = 0; k < j->client.n; k++)
    if (zmq_send(s, j->client.id[k], j->client.len[k], ZMQ_SNDMORE | flags) < 0) return -errno;
  if (zmq_send(s, "", 0, ZMQ_SNDMORE | flags) < 0) return -errno;
  if (zmq_send(s, j->body, j->body_len, (j->n_blobs ? ZMQ_SNDMORE : 0) | flags) < 0)
    return -errno;
  for (int k = 0; k < j->n_blobs; k++)
    if (zmq_send(s, j->blob[k], j->blob_len[k], (k + 1 < j->n_blobs ? ZMQ_SNDMORE : 0) | flags) <
        0)
      return -errno;
  return 0;
}

static double vs__load(const vs__backend *be) {
  return (double)be->inflight / (be->workers > 0 ? be->workers : 1);
}

/* Sends a pending submit to the least loaded live daemon it has not tried yet. */
static void vs__dispatch(vs__broker *b, vs__bjob *j, int last_code) {
  for (;;) {
    int best = -1;
    for (int i = 0; i < b->n; i++) {
      if (!b->be[i].alive || (j->tried & (1u << i))) continue;
      if (best < 0 || vs__load(&b->be[i]) < vs__load(&b->be[best])) best = i;
    }
    if (best < 0) {
      int code = last_code ? last_code : VSPEC__ERROR_CODE__ERR_UNAVAILABLE;
      char msg[160];
      snprintf(msg, sizeof msg, "%s: no daemon behind this broker can take the job now",
               code == VSPEC__ERROR_CODE__ERR_BUSY ? "busy" : "unavailable");
      b->unavailable++;
      vs__reply_error(b, &j->client, 0, j->request_id, code, msg);
      vs__unlink(b, j);
      vs__bjob_free(j);
      return;
    }
    j->tried |= 1u << best;
    if (vs__send_submit(b, j, best) == 0) {
      j->backend = best;
      b->be[best].inflight++;
      return;
    }
    vs_log(VSPEC_LOG_INFO, "broker", "daemon %s not reachable for a submit: trying another",
           b->be[best].endpoint);
  }
}

static vs__bjob *vs__find_job(vs__broker *b, uint64_t id) {
  for (vs__bjob *j = b->jobs; j; j = j->next)
    if (j->job_id == id) return j;
  return NULL;
}

static vs__bjob *vs__find_pending(vs__broker *b, const vs_wire_envelope *env, uint64_t rid) {
  for (vs__bjob *j = b->jobs; j; j = j->next)
    if (!j->job_id && j->request_id == rid && vs_wire_envelope_equal(&j->client, env)) return j;
  return NULL;
}

static void vs__send_cancel(vs__broker *b, vs__bjob *j) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Cancel c = VSPEC__CANCEL__INIT;
  c.job_id = j->job_id;
  r.body_case = VSPEC__REQUEST__BODY_CANCEL;
  r.cancel = &c;
  /* With the client's envelope: to the daemon this is the job's owner asking. */
  vs_wire_send_request(b->be[j->backend].sock, &j->client, &r, NULL, 0, ZMQ_DONTWAIT);
}

/* A client is gone (unroutable on the front): its jobs are cancelled on their daemons. */
static void vs__client_gone(vs__broker *b, const vs_wire_envelope *env) {
  char t[40];
  vs_wire_envelope_text(env, t, sizeof t);
  vs_log(VSPEC_LOG_INFO, "broker", "client %s is gone: cancelling its jobs", t);
  vs__bjob **p = &b->jobs;
  while (*p) {
    vs__bjob *j = *p;
    if (!vs_wire_envelope_equal(&j->client, env)) {
      p = &j->next;
      continue;
    }
    if (j->job_id) {
      vs__send_cancel(b, j);
      b->be[j->backend].inflight--;
      *p = j->next;
      vs__bjob_free(j);
    } else {
      j->cancel_on_accept = 1;
      p = &j->next;
    }
  }
}

/* ---- requests from clients ----------------------------------------------------------------- */

static void vs__status_reply(vs__broker *b, const vs_wire_envelope *env, uint64_t rid) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__StatusReply st = VSPEC__STATUS_REPLY__INIT;
  Vspec__Totals to = VSPEC__TOTALS__INIT;
  Vspec__WorkerInfo wi[VS_BROKER_MAX_BACKENDS], *wip[VS_BROKER_MAX_BACKENDS];
  char node[64];
  int alive = 0;
  st.has_queued = st.has_running = st.has_clients = st.has_queue_capacity = 1;
  to.has_submitted = to.has_completed = to.has_failed = to.has_cancelled = 1;
  to.has_rejected_busy = to.has_clients_lost = to.has_malformed = to.has_tokens = 1;
  to.has_uptime_s = 1;
  for (int i = 0; i < b->n; i++) {
    const vs__backend *be = &b->be[i];
    /* One line per daemon: index, and the number of its running jobs as "tokens". */
    vspec__worker_info__init(&wi[i]);
    wi[i].has_index = wi[i].has_jobs_done = wi[i].has_tokens_done = 1;
    wi[i].index = (uint32_t)i;
    wi[i].jobs_done = be->completed;
    wi[i].tokens_done = (uint32_t)be->inflight;
    wip[i] = &wi[i];
    if (!be->alive) continue;
    alive++;
    st.queued += (uint32_t)be->queued;
    st.running += (uint32_t)be->running;
    st.clients += (uint32_t)be->clients;
    st.queue_capacity += (uint32_t)be->queue_cap;
    to.submitted += be->submitted;
    to.completed += be->completed;
    to.failed += be->failed;
    to.cancelled += be->cancelled;
    to.rejected_busy += be->busy;
    to.clients_lost += be->lost;
    to.malformed += be->malformed;
    to.tokens += be->tokens;
  }
  to.malformed += b->malformed;
  to.uptime_s = vs__now() - b->started;
  snprintf(node, sizeof node, "vspec-broker (%d of %d daemons alive)", alive, b->n);
  st.node = node;
  st.n_workers = (size_t)b->n;
  st.workers = wip;
  st.totals = &to;
  ev.body_case = VSPEC__EVENT__BODY_STATUS;
  ev.status = &st;
  if (rid) {
    ev.has_request_id = 1;
    ev.request_id = rid;
  }
  vs_wire_send_event(b->front, env, &ev, NULL, 0, ZMQ_DONTWAIT);
}

static int vs__keep_submit(vs__bjob *j, const vs_wire_msg *m, Vspec__Request *r,
                           vs_wire_alloc *a, uint64_t forced_rid) {
  if (forced_rid) {
    /* The daemon echoes request ids; the broker needs one to match its answer. */
    r->has_request_id = 1;
    r->request_id = forced_rid;
    j->body_len = vspec__request__get_packed_size(r);
    j->body = malloc(j->body_len);
    if (!j->body) return -1;
    vspec__request__pack(r, j->body);
  } else {
    j->body_len = zmq_msg_size((zmq_msg_t *)&m->body);
    j->body = malloc(j->body_len ? j->body_len : 1);
    if (!j->body) return -1;
    memcpy(j->body, zmq_msg_data((zmq_msg_t *)&m->body), j->body_len);
  }
  (void)a;
  for (int i = 0; i < m->n_blobs; i++) {
    zmq_msg_t *bm = (zmq_msg_t *)&m->blobs[i];
    j->blob_len[i] = zmq_msg_size(bm);
    j->blob[i] = malloc(j->blob_len[i] ? j->blob_len[i] : 1);
    if (!j->blob[i]) return -1;
    memcpy(j->blob[i], zmq_msg_data(bm), j->blob_len[i]);
    j->n_blobs++;
  }
  return 0;
}

static void vs__from_client(vs__broker *b, vs_wire_msg *m) {
  vs_wire_alloc a;
  vs_wire_alloc_init(&a, 256 << 10);
  int code;
  char err[VSPEC_ERRLEN];
  Vspec__Request *r = vs_wire_unpack_request(m, &a, &code, err, sizeof err);
  if (!r) {
    b->malformed++;
    vs__reply_error(b, &m->env, 0, 0, code, err);
    return;
  }
  uint64_t rid = r->has_request_id ? r->request_id : 0;
  switch (r->body_case) {
    case VSPEC__REQUEST__BODY_SUBMIT: {
      vs__bjob *j = calloc(1, sizeof *j);
      uint64_t forced = rid ? 0 : (++b->next_request | (1ull << 62));
      if (!j || vs__keep_submit(j, m, r, &a, forced)) {
        if (j) vs__bjob_free(j);
        vs__reply_error(b, &m->env, 0, rid, VSPEC__ERROR_CODE__ERR_INTERNAL, "out of memory");
        break;
      }
      j->client = m->env;
      j->request_id = rid ? rid : forced;
      j->next = b->jobs;
      b->jobs = j;
      vs__dispatch(b, j, 0);
      break;
    }
    case VSPEC__REQUEST__BODY_CANCEL:
    case VSPEC__REQUEST__BODY_CREDIT: {
      uint64_t id = r->body_case == VSPEC__REQUEST__BODY_CANCEL ? r->cancel->job_id
                                                                 : r->credit->job_id;
      vs__bjob *j = vs__find_job(b, id);
      if (!j || !vs_wire_envelope_equal(&j->client, &m->env)) {
        if (r->body_case == VSPEC__REQUEST__BODY_CANCEL) {
          snprintf(err, sizeof err, "no running or queued job %llu of this client",
                   (unsigned long long)id);
          vs__reply_error(b, &m->env, 0, rid, VSPEC__ERROR_CODE__ERR_NOT_FOUND, err);
        }
        break;
      }
      vs_wire_forward(b->be[j->backend].sock, &m->env, m, ZMQ_DONTWAIT);
      break;
    }
    case VSPEC__REQUEST__BODY_STATUS: vs__status_reply(b, &m->env, rid); break;
    case VSPEC__REQUEST__BODY_PLUGINS: {
      /* Every daemon loads the same plugin directory: ask one. */
      int sent = 0;
      for (int i = 0; i < b->n && !sent; i++)
        if (b->be[i].alive) sent = vs_wire_forward(b->be[i].sock, &m->env, m, ZMQ_DONTWAIT) == 0;
      if (!sent)
        vs__reply_error(b, &m->env, 0, rid, VSPEC__ERROR_CODE__ERR_UNAVAILABLE,
                        "no daemon behind this broker is alive");
      break;
    }
    case VSPEC__REQUEST__BODY_RELOAD:
      vs__reply_error(b, &m->env, 0, rid, VSPEC__ERROR_CODE__ERR_FORBIDDEN,
                      "reload plugins on each daemon's admin endpoint, not through the broker");
      break;
    case VSPEC__REQUEST__BODY_PING: {
      Vspec__Event ev = VSPEC__EVENT__INIT;
      Vspec__Pong p = VSPEC__PONG__INIT;
      p.node = "vspec-broker";
      ev.body_case = VSPEC__EVENT__BODY_PONG;
      ev.pong = &p;
      if (rid) {
        ev.has_request_id = 1;
        ev.request_id = rid;
      }
      vs_wire_send_event(b->front, &m->env, &ev, NULL, 0, ZMQ_DONTWAIT);
      break;
    }
    default:
      vs__reply_error(b, &m->env, 0, rid, VSPEC__ERROR_CODE__ERR_MALFORMED, "unknown request");
  }
  vs_wire_request_free(r, &a);
}

/* ---- events from daemons ------------------------------------------------------------------ */

static void vs__backend_dead(vs__broker *b, int i) {
  vs__backend *be = &b->be[i];
  vs_log(VSPEC_LOG_WARN, "broker", "daemon %s (%s) stopped answering: failing over",
         be->endpoint, be->node);
  be->alive = 0;
  vs__bjob **p = &b->jobs;
  while (*p) {
    vs__bjob *j = *p;
    if (j->backend != i || (!j->job_id && !j->body)) {
      p = &j->next;
      continue;
    }
    if (j->job_id) {
      char msg[400];
      snprintf(msg, sizeof msg, "job %llu lost: daemon %s stopped answering",
               (unsigned long long)j->job_id, be->node);
      vs__send_cancel(b, j); /* in case it comes back */
      vs__reply_error(b, &j->client, j->job_id, j->request_id,
                      VSPEC__ERROR_CODE__ERR_UNAVAILABLE, msg);
      *p = j->next;
      vs__bjob_free(j);
    } else {
      j->redispatch = 1; /* below: dispatching may free j and change the list */
      p = &j->next;
    }
  }
  be->inflight = 0;
  for (;;) {
    vs__bjob *j = b->jobs;
    while (j && !j->redispatch) j = j->next;
    if (!j) break;
    j->redispatch = 0;
    vs__dispatch(b, j, 0);
  }
}

static void vs__own_reply(vs__broker *b, int i, const Vspec__Event *ev) {
  vs__backend *be = &b->be[i];
  if (ev->body_case != VSPEC__EVENT__BODY_STATUS) return;
  const Vspec__StatusReply *s = ev->status;
  be->workers = (int)s->n_workers;
  be->queued = (int)s->queued;
  be->running = (int)s->running;
  be->clients = (int)s->clients;
  be->queue_cap = (int)s->queue_capacity;
  if (s->node) snprintf(be->node, sizeof be->node, "%s", s->node);
  if (s->totals) {
    be->submitted = s->totals->submitted;
    be->completed = s->totals->completed;
    be->failed = s->totals->failed;
    be->cancelled = s->totals->cancelled;
    be->busy = s->totals->rejected_busy;
    be->lost = s->totals->clients_lost;
    be->malformed = s->totals->malformed;
    be->tokens = s->totals->tokens;
  }
}

static void vs__from_backend(vs__broker *b, int i, vs_wire_msg *m) {
  vs__backend *be = &b->be[i];
  be->last_seen = vs__now();
  if (!be->alive) {
    vs_log(VSPEC_LOG_INFO, "broker", "daemon %s is alive", be->endpoint);
    be->alive = 1;
  }
  vs_wire_alloc a;
  vs_wire_alloc_init(&a, 4 << 20);
  int code;
  char err[VSPEC_ERRLEN];
  Vspec__Event *ev = vs_wire_unpack_event(m, &a, &code, err, sizeof err);
  if (!ev) {
    vs_log(VSPEC_LOG_WARN, "broker", "daemon %s sent a bad event: %s", be->endpoint, err);
    return;
  }
  if (m->env.n == 0) { /* an answer to the broker itself */
    vs__own_reply(b, i, ev);
    vs_wire_event_free(ev, &a);
    return;
  }
  uint64_t rid = ev->has_request_id ? ev->request_id : 0;
  uint64_t job = ev->has_job_id ? ev->job_id : 0;
  int forward = 1;
  vs__bjob *p = NULL;
  if (ev->body_case == VSPEC__EVENT__BODY_ACCEPTED ||
      (ev->body_case == VSPEC__EVENT__BODY_ERROR && !job))
    p = vs__find_pending(b, &m->env, rid);
  if (p) {
    if (ev->body_case == VSPEC__EVENT__BODY_ACCEPTED) {
      p->job_id = job;
      free(p->body);
      p->body = NULL;
      for (int k = 0; k < p->n_blobs; k++) free(p->blob[k]);
      p->n_blobs = 0;
      if (p->cancel_on_accept) {
        vs__send_cancel(b, p);
        be->inflight--;
        vs__unlink(b, p);
        vs__bjob_free(p);
        forward = 0;
      }
    } else {
      be->inflight--;
      int c = ev->error->code;
      if ((c == VSPEC__ERROR_CODE__ERR_BUSY || c == VSPEC__ERROR_CODE__ERR_SHUTTING_DOWN) &&
          !p->cancel_on_accept) {
        vs__dispatch(b, p, VSPEC__ERROR_CODE__ERR_BUSY); /* next daemon, or busy for good */
        forward = 0;
      } else {
        vs__unlink(b, p);
        vs__bjob_free(p);
      }
    }
  } else if (job) {
    vs__bjob *j = vs__find_job(b, job);
    /* Events of jobs the broker does not know (failed over already) are dropped, so a client
     * never sees anything after its job's terminal event. */
    if (!j || j->backend != i) forward = 0;
    else if (ev->body_case == VSPEC__EVENT__BODY_RESULT ||
             ev->body_case == VSPEC__EVENT__BODY_ERROR) {
      be->inflight--;
      vs__unlink(b, j);
      vs__bjob_free(j);
    }
  }
  vs_wire_event_free(ev, &a);
  if (!forward) return;
  vs_wire_envelope env = m->env;
  int rc = vs_wire_forward(b->front, &env, m, ZMQ_DONTWAIT);
  if (rc == -EHOSTUNREACH) vs__client_gone(b, &env);
}

static void vs__poll_backends(vs__broker *b, double now) {
  for (int i = 0; i < b->n; i++) {
    vs__backend *be = &b->be[i];
    double ivl = b->cfg->heartbeat_ms / 1000.0;
    if (be->alive && now - be->last_seen > 3 * ivl) vs__backend_dead(b, i);
    if (now - be->last_poll < ivl) continue;
    be->last_poll = now;
    Vspec__Request r = VSPEC__REQUEST__INIT;
    Vspec__StatusRequest s = VSPEC__STATUS_REQUEST__INIT;
    r.body_case = VSPEC__REQUEST__BODY_STATUS;
    r.status = &s;
    r.has_request_id = 1;
    r.request_id = VS_OWN_REQUEST | ++b->own_seq;
    vs_wire_send_request(be->sock, NULL, &r, NULL, 0, ZMQ_DONTWAIT);
  }
}

static int vs__setup(vs__broker *b, char *err, size_t errlen) {
  const vs_broker_config *cfg = b->cfg;
  /* With CURVE the context exists already: its ZAP handler is bound in it. */
  if (!b->ctx) b->ctx = zmq_ctx_new();
  if (!b->ctx) {
    snprintf(err, errlen, "zmq_ctx_new failed");
    return VSPEC_EIO;
  }
  b->front = zmq_socket(b->ctx, ZMQ_ROUTER);
  int one = 1, linger = 0, hb = cfg->heartbeat_ms, hbt = 5 * cfg->heartbeat_ms;
  int64_t maxmsg = cfg->max_message_bytes;
  if (!b->front || zmq_setsockopt(b->front, ZMQ_ROUTER_MANDATORY, &one, sizeof one) ||
      zmq_setsockopt(b->front, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
      zmq_setsockopt(b->front, ZMQ_LINGER, &linger, sizeof linger) ||
      zmq_setsockopt(b->front, ZMQ_HEARTBEAT_IVL, &hb, sizeof hb) ||
      zmq_setsockopt(b->front, ZMQ_HEARTBEAT_TIMEOUT, &hbt, sizeof hbt)) {
    snprintf(err, errlen, "front socket: %s", zmq_strerror(errno));
    return VSPEC_EIO;
  }
  if (cfg->curve_secret_file) {
    char secret[41];
    int rc = vs_curve_read_key(cfg->curve_secret_file, "secret", secret, err, errlen);
    if (rc) return rc;
    if (zmq_setsockopt(b->front, ZMQ_CURVE_SERVER, &one, sizeof one) ||
        zmq_setsockopt(b->front, ZMQ_CURVE_SECRETKEY, secret, 40) ||
        zmq_setsockopt(b->front, ZMQ_ZAP_DOMAIN, "vspec", 5)) {
      snprintf(err, errlen, "CURVE options: %s", zmq_strerror(errno));
      return VSPEC_EIO;
    }
  }
  if (zmq_bind(b->front, cfg->front)) {
    snprintf(err, errlen, "cannot bind %s: %s", cfg->front, zmq_strerror(errno));
    return VSPEC_EIO;
  }
  for (int i = 0; i < cfg->n_backends; i++) {
    vs__backend *be = &b->be[i];
    snprintf(be->endpoint, sizeof be->endpoint, "%s", cfg->backends[i]);
    snprintf(be->node, sizeof be->node, "%s", cfg->backends[i]);
    be->sock = zmq_socket(b->ctx, ZMQ_DEALER);
    if (!be->sock || zmq_setsockopt(be->sock, ZMQ_IMMEDIATE, &one, sizeof one) ||
        zmq_setsockopt(be->sock, ZMQ_LINGER, &linger, sizeof linger) ||
        zmq_setsockopt(be->sock, ZMQ_HEARTBEAT_IVL, &hb, sizeof hb) ||
        zmq_setsockopt(be->sock, ZMQ_HEARTBEAT_TIMEOUT, &hbt, sizeof hbt)) {
      snprintf(err, errlen, "backend socket: %s", zmq_strerror(errno));
      return VSPEC_EIO;
    }
    if (cfg->backend_server_key) {
      char server[41], pub[41], sec[41];
      int rc;
      if ((rc = vs_curve_key_arg(cfg->backend_server_key, "public", server, err, errlen)))
        return rc;
      if (!cfg->backend_client_key) {
        snprintf(err, errlen, "CURVE to the daemons needs the broker's own key file too");
        return VSPEC_EINVAL;
      }
      if ((rc = vs_curve_read_key(cfg->backend_client_key, "public", pub, err, errlen)) ||
          (rc = vs_curve_read_key(cfg->backend_client_key, "secret", sec, err, errlen)))
        return rc;
      zmq_setsockopt(be->sock, ZMQ_CURVE_SERVERKEY, server, 40);
      zmq_setsockopt(be->sock, ZMQ_CURVE_PUBLICKEY, pub, 40);
      zmq_setsockopt(be->sock, ZMQ_CURVE_SECRETKEY, sec, 40);
    }
    if (zmq_connect(be->sock, be->endpoint)) {
      snprintf(err, errlen, "cannot connect to %s: %s", be->endpoint, zmq_strerror(errno));
      return VSPEC_EIO;
    }
    b->n++;
  }
  return VSPEC_OK;
}

int vs_broker_run(const vs_broker_config *cfg, char *err, size_t errlen) {
  vs__broker *b = calloc(1, sizeof *b);
  if (!b) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  b->cfg = cfg;
  b->started = vs__now();
  vs_zap *zap = NULL;
  int rc = VSPEC_OK;
  if (cfg->curve_secret_file) {
    b->ctx = zmq_ctx_new();
    if (!b->ctx || (rc = vs_zap_start(b->ctx, cfg->curve_allow_file, &zap, err, errlen))) {
      if (!rc) rc = VSPEC_EIO;
      goto done;
    }
  }
  rc = vs__setup(b, err, errlen);
  if (rc) goto done;
  struct sigaction sa = {.sa_handler = vs__on_signal};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  vs_log(VSPEC_LOG_INFO, "broker", "front %s, %d daemon(s)", cfg->front, b->n);
  while (!vs__stop) {
    zmq_pollitem_t it[1 + VS_BROKER_MAX_BACKENDS];
    it[0] = (zmq_pollitem_t){.socket = b->front, .events = ZMQ_POLLIN};
    for (int i = 0; i < b->n; i++)
      it[1 + i] = (zmq_pollitem_t){.socket = b->be[i].sock, .events = ZMQ_POLLIN};
    int n = zmq_poll(it, 1 + b->n, 50);
    if (n < 0 && errno != EINTR) {
      snprintf(err, errlen, "poll: %s", zmq_strerror(errno));
      rc = VSPEC_EIO;
      break;
    }
    for (int i = 0; i < b->n; i++) {
      for (int k = 0; k < 256; k++) {
        vs_wire_msg m;
        char e2[VSPEC_ERRLEN];
        int r = vs_wire_recv(b->be[i].sock, 1, &m, (size_t)cfg->max_message_bytes,
                             (size_t)cfg->max_message_bytes, e2, sizeof e2);
        if (r == 0) break;
        if (r < 0) continue;
        vs__from_backend(b, i, &m);
        vs_wire_msg_close(&m);
      }
    }
    for (int k = 0; k < 256; k++) {
      vs_wire_msg m;
      char e2[VSPEC_ERRLEN];
      int r = vs_wire_recv(b->front, 1, &m, (size_t)cfg->max_request_bytes,
                           (size_t)cfg->max_message_bytes, e2, sizeof e2);
      if (r == 0) break;
      if (r < 0) {
        b->malformed++;
        if (m.env.n)
          vs__reply_error(b, &m.env, 0, 0,
                          r == VSPEC_ERANGE ? VSPEC__ERROR_CODE__ERR_TOO_LARGE
                                            : VSPEC__ERROR_CODE__ERR_MALFORMED, e2);
        continue;
      }
      vs__from_client(b, &m);
      vs_wire_msg_close(&m);
    }
    vs__poll_backends(b, vs__now());
  }
  vs_log(VSPEC_LOG_INFO, "broker", "stopping");
done:
  while (b->jobs) {
    vs__bjob *j = b->jobs;
    b->jobs = j->next;
    vs__bjob_free(j);
  }
  for (int i = 0; i < b->n; i++) zmq_close(b->be[i].sock);
  if (b->front) zmq_close(b->front);
  vs_zap_stop(zap);
  if (b->ctx) zmq_ctx_term(b->ctx);
  free(b);
  return rc;
}
