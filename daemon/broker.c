#include "daemon/broker.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "core/metrics.h" /* vs_now */
#include "core/log.h"
#include "daemon/router.h"
#include "daemon/zap.h"
#include "proto/curve_keys.h"
#include "proto/wire.h"
#include "proto/wire_text.h"

#define VS_OWN_REQUEST (1ull << 63) /* request ids of the broker's own status polls */
/* Events a client has not taken yet (its queue is full) that the broker keeps for it: over
 * this, or silent for 5 heartbeats, the client is treated as gone. The daemons' credit keeps
 * the events of one job in flight small, so a reading client never gets near it. */
#define VS_OUTBOX_PER_CLIENT 4096

typedef struct vs__backend {
  char endpoint[256];
  void *sock;
  int alive;
  double last_seen, last_poll;
  int inflight; /* jobs and pending submits */
  int workers, queued, running, clients, queue_cap;
  uint64_t submitted, completed, failed, cancelled, busy, lost, malformed, tokens;
  char node[64];
  int has_node_id; /* the daemon reported its [server] node_id (StatusReply.node_id) */
  unsigned node_id;
  int conflict; /* shares its node_id with a live daemon listed before it: gets no jobs */
} vs__backend;

/* A pending submit (job_id == 0) or a running job. Jobs are keyed by (backend, job_id): two
 * daemons that share a node_id hand out the same ids. */
typedef struct vs__bjob {
  uint64_t job_id, request_id;
  vs_wire_envelope client;
  char user_id[VS_WIRE_MAX_USER_ID + 1]; /* the client's CURVE identity ("" without CURVE) */
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

/* Messages for a client whose queue was full: kept, in order, and retried from the poll loop
 * (like the daemon's outbox), so no terminal event is lost to a slow reader. */
typedef struct vs__outmsg {
  vs_wire_msg msg;
  struct vs__outmsg *next;
} vs__outmsg;

typedef struct vs__outq {
  vs_wire_envelope client;
  vs__outmsg *head, **tail;
  int n;
  double since; /* the first message was kept, or the client last took one */
  struct vs__outq *next;
} vs__outq;

typedef struct vs__broker {
  const vs_broker_config *cfg;
  void *ctx, *front;
  vs__backend be[VS_BROKER_MAX_BACKENDS];
  int n;
  vs__bjob *jobs;
  vs__outq *out;              /* clients with kept messages */
  vs_wire_envelope *gone;     /* clients found gone, dealt with by vs__reap */
  int n_gone, cap_gone;
  uint64_t own_seq, next_request;
  double started;
  uint64_t malformed, unavailable;
} vs__broker;

static volatile sig_atomic_t vs__stop;
static void vs__on_signal(int sig) {
  (void)sig;
  vs__stop = 1;
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

static void vs__client_gone(vs__broker *b, const vs_wire_envelope *env);
static void vs__check_node_ids(vs__broker *b);

static void vs__inflight_done(vs__backend *be) {
  /* Never below zero: a failover resets the count while answers may still be on the way. */
  if (be->inflight > 0) be->inflight--;
}

static void vs__msg_move(vs_wire_msg *dst, vs_wire_msg *src) {
  memset(dst, 0, sizeof *dst);
  dst->env = src->env;
  memcpy(dst->user_id, src->user_id, sizeof dst->user_id);
  if (src->has_body) {
    zmq_msg_init(&dst->body);
    zmq_msg_move(&dst->body, &src->body);
    zmq_msg_close(&src->body);
    dst->has_body = 1;
    src->has_body = 0;
  }
  for (int i = 0; i < src->n_blobs; i++) {
    zmq_msg_init(&dst->blobs[i]);
    zmq_msg_move(&dst->blobs[i], &src->blobs[i]);
    zmq_msg_close(&src->blobs[i]);
  }
  dst->n_blobs = src->n_blobs;
  src->n_blobs = 0;
}

static vs__outq *vs__outq_find(vs__broker *b, const vs_wire_envelope *env) {
  for (vs__outq *q = b->out; q; q = q->next)
    if (vs_wire_envelope_equal(&q->client, env)) return q;
  return NULL;
}

/* Drops what is kept for a client (gone, or given up on). */
static void vs__outq_drop(vs__broker *b, const vs_wire_envelope *env) {
  for (vs__outq **p = &b->out; *p; p = &(*p)->next) {
    vs__outq *q = *p;
    if (!vs_wire_envelope_equal(&q->client, env)) continue;
    *p = q->next;
    while (q->head) {
      vs__outmsg *o = q->head;
      q->head = o->next;
      vs_wire_msg_close(&o->msg);
      free(o);
    }
    free(q);
    return;
  }
}

/* A client is found gone while the caller may be walking the job list: its jobs are cancelled
 * later, by vs__reap from the main loop. */
static void vs__mark_gone(vs__broker *b, const vs_wire_envelope *env) {
  for (int k = 0; k < b->n_gone; k++)
    if (vs_wire_envelope_equal(&b->gone[k], env)) return;
  if (b->n_gone == b->cap_gone) {
    int cap = b->cap_gone ? 2 * b->cap_gone : 8;
    vs_wire_envelope *g = realloc(b->gone, (size_t)cap * sizeof *g);
    if (!g) return; /* then the next send finds it again */
    b->gone = g;
    b->cap_gone = cap;
  }
  b->gone[b->n_gone++] = *env;
}

static void vs__reap(vs__broker *b) {
  while (b->n_gone) {
    vs_wire_envelope env = b->gone[--b->n_gone];
    vs__client_gone(b, &env);
  }
}

/* Sends a message to a client on the front, or keeps it for a retry when the client's queue
 * is full; a client with kept messages gets everything after them in order. Takes the
 * frames of m in every case (m is left empty). */
static void vs__to_client(vs__broker *b, const vs_wire_envelope *env, vs_wire_msg *m) {
  vs__outq *q = vs__outq_find(b, env);
  if (!q) {
    int rc = vs_wire_forward(b->front, env, m, ZMQ_DONTWAIT);
    if (rc == -EHOSTUNREACH) vs__mark_gone(b, env);
    if (rc != -EAGAIN || !m->has_body) { /* sent, gone, or failed after the head */
      vs_wire_msg_close(m);
      return;
    }
  } else if (q->n >= VS_OUTBOX_PER_CLIENT) {
    char t[40];
    vs_wire_envelope_text(env, t, sizeof t);
    vs_log(VSPEC_LOG_INFO, "broker", "client %s does not take its events (%d kept): treated "
           "as gone", t, q->n);
    vs_wire_msg_close(m);
    vs__mark_gone(b, env);
    return;
  }
  vs__outmsg *o = calloc(1, sizeof *o);
  if (!q && o) {
    q = calloc(1, sizeof *q);
    if (q) {
      q->client = *env;
      q->tail = &q->head;
      q->since = vs_now();
      q->next = b->out;
      b->out = q;
    }
  }
  if (!o || !q) {
    free(o);
    vs_wire_msg_close(m);
    return;
  }
  vs__msg_move(&o->msg, m);
  *q->tail = o;
  q->tail = &o->next;
  q->n++;
}

/* Packs an event of the broker's own into a message for vs__to_client, its strings made
 * valid for the wire as the daemon's are (proto/wire_text.h). */
static void vs__send_own(vs__broker *b, const vs_wire_envelope *env, Vspec__Event *ev) {
  vs_wire_msg m;
  memset(&m, 0, sizeof m);
  ev->version = VSPEC__PROTOCOL_VERSION__PROTOCOL_V1;
  if (vs_wire_pack(&ev->base, &m.body)) return;
  m.has_body = 1;
  vs__to_client(b, env, &m);
}

/* Retries what clients have not taken, in order per client; a client that takes nothing for
 * 5 heartbeats (the front's TCP_USER_TIMEOUT) is treated as gone. */
static void vs__retry_out(vs__broker *b, double now) {
  double timeout = 5.0 * b->cfg->heartbeat_ms / 1000.0;
  vs__outq **p = &b->out;
  while (*p) {
    vs__outq *q = *p;
    int rc = 0;
    while (q->head) {
      rc = vs_wire_forward(b->front, &q->client, &q->head->msg, ZMQ_DONTWAIT);
      if (rc == -EAGAIN && q->head->msg.has_body) break;
      vs__outmsg *o = q->head;
      q->head = o->next;
      vs_wire_msg_close(&o->msg);
      free(o);
      q->n--;
      if (rc == -EHOSTUNREACH) break;
      q->since = now;
    }
    if (rc == -EAGAIN && q->head && now - q->since > timeout) {
      char t[40];
      vs_wire_envelope_text(&q->client, t, sizeof t);
      vs_log(VSPEC_LOG_INFO, "broker", "client %s took nothing for %.0f ms: treated as gone", t,
             timeout * 1000);
      rc = -EHOSTUNREACH;
    }
    if (rc == -EHOSTUNREACH) vs__mark_gone(b, &q->client);
    if (!q->head) {
      *p = q->next;
      free(q);
      continue;
    }
    p = &q->next; /* q->tail still points into the last message, which stayed */
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
  vs__send_own(b, env, &ev);
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
      if (!b->be[i].alive || b->be[i].conflict || (j->tried & (1u << i))) continue;
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

/* The job `id` of daemon `backend` (-1: of any daemon). */
static vs__bjob *vs__find_job(vs__broker *b, int backend, uint64_t id) {
  for (vs__bjob *j = b->jobs; j; j = j->next)
    if (j->job_id == id && (backend < 0 || j->backend == backend)) return j;
  return NULL;
}

/* A client's job, for its cancel and credit requests: the job id, the routing envelope and
 * (with CURVE) the key that submitted it must all match. */
static vs__bjob *vs__find_client_job(vs__broker *b, const vs_wire_msg *m, uint64_t id) {
  for (vs__bjob *j = b->jobs; j; j = j->next)
    if (j->job_id == id && vs_wire_envelope_equal(&j->client, &m->env) &&
        !strcmp(j->user_id, m->user_id))
      return j;
  return NULL;
}

/* The submit (pending or accepted) a client sent with request id rid; one waiting on daemon
 * i first, should a client reuse request ids. */
static vs__bjob *vs__find_request(vs__broker *b, int i, const vs_wire_envelope *env,
                                  uint64_t rid) {
  vs__bjob *any = NULL;
  for (vs__bjob *j = b->jobs; j; j = j->next) {
    if (j->request_id != rid || !vs_wire_envelope_equal(&j->client, env)) continue;
    if (!j->job_id && j->backend == i) return j;
    if (!any) any = j;
  }
  return any;
}

/* Cancels job `id` on daemon i, asking with the client's envelope: to the daemon this is the
 * job's owner. */
static void vs__cancel_on(vs__broker *b, int i, const vs_wire_envelope *client, uint64_t id) {
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Cancel c = VSPEC__CANCEL__INIT;
  c.job_id = id;
  r.body_case = VSPEC__REQUEST__BODY_CANCEL;
  r.cancel = &c;
  vs_wire_send_request(b->be[i].sock, client, &r, NULL, 0, ZMQ_DONTWAIT);
}

static void vs__send_cancel(vs__broker *b, vs__bjob *j) {
  vs__cancel_on(b, j->backend, &j->client, j->job_id);
}

/* A client is gone (unroutable on the front): its jobs are cancelled on their daemons. */
static void vs__client_gone(vs__broker *b, const vs_wire_envelope *env) {
  char t[40];
  vs_wire_envelope_text(env, t, sizeof t);
  vs_log(VSPEC_LOG_INFO, "broker", "client %s is gone: cancelling its jobs", t);
  vs__outq_drop(b, env);
  vs__bjob **p = &b->jobs;
  while (*p) {
    vs__bjob *j = *p;
    if (!vs_wire_envelope_equal(&j->client, env)) {
      p = &j->next;
      continue;
    }
    if (j->job_id) {
      vs__send_cancel(b, j);
      vs__inflight_done(&b->be[j->backend]);
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
  to.uptime_s = vs_now() - b->started;
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
  vs__send_own(b, env, &ev);
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
      memcpy(j->user_id, m->user_id, sizeof j->user_id);
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
      vs__bjob *j = vs__find_client_job(b, m, id);
      if (!j) {
        if (r->body_case == VSPEC__REQUEST__BODY_CANCEL) {
          snprintf(err, sizeof err, "no running or queued job %llu of this client",
                   (unsigned long long)id);
          vs__reply_error(b, &m->env, 0, rid, VSPEC__ERROR_CODE__ERR_NOT_FOUND, err);
        }
        break;
      }
      /* An unreachable daemon keeps the message (closed by the caller); it is failed over
       * within three heartbeats and the job ends with "unavailable". */
      vs_wire_forward(b->be[j->backend].sock, &m->env, m, ZMQ_DONTWAIT);
      break;
    }
    case VSPEC__REQUEST__BODY_STATUS: vs__status_reply(b, &m->env, rid); break;
    case VSPEC__REQUEST__BODY_PLUGINS: {
      /* Every daemon loads the same plugin directory: ask one. A refused head leaves the
       * message whole for the next daemon; a failure after it consumed the message. */
      int sent = 0;
      for (int i = 0; i < b->n && !sent && m->has_body; i++)
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
    case VSPEC__REQUEST__BODY_RESUME:
      /* The events of fleet jobs are in Redis, relayed by vspec-gateway; daemons behind a
       * broker keep none. */
      vs__reply_error(b, &m->env, 0, rid, VSPEC__ERROR_CODE__ERR_INVALID,
                      "resume is a fleet-mode request: send it to a vspec-gateway");
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
      vs__send_own(b, &m->env, &ev);
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
  vs__check_node_ids(b);
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

/* Daemons that share a node_id hand out the same job ids: of each such group of live
 * daemons only the first listed gets jobs. */
static void vs__check_node_ids(vs__broker *b) {
  for (int i = 0; i < b->n; i++) {
    vs__backend *be = &b->be[i];
    int other = -1;
    for (int k = 0; k < i && other < 0 && be->has_node_id; k++)
      if (b->be[k].alive && b->be[k].has_node_id && b->be[k].node_id == be->node_id) other = k;
    int conflict = be->alive && other >= 0;
    if (conflict && !be->conflict)
      vs_log(VSPEC_LOG_ERROR, "broker", "daemons %s (%s) and %s (%s) both have node_id %u, so "
             "their job ids collide: %s gets no jobs while %s is alive. Give each daemon its "
             "own [server] node_id (vspecd --node-id).", b->be[other].endpoint,
             b->be[other].node, be->endpoint, be->node, be->node_id, be->endpoint,
             b->be[other].endpoint);
    else if (!conflict && be->conflict)
      vs_log(VSPEC_LOG_INFO, "broker", "daemon %s no longer shares its node_id with a live "
             "daemon: it gets jobs again", be->endpoint);
    be->conflict = conflict;
  }
}

static void vs__own_reply(vs__broker *b, int i, const Vspec__Event *ev) {
  vs__backend *be = &b->be[i];
  if (ev->body_case != VSPEC__EVENT__BODY_STATUS) return;
  const Vspec__StatusReply *s = ev->status;
  if (s->has_node_id && (!be->has_node_id || be->node_id != s->node_id)) {
    be->has_node_id = 1;
    be->node_id = s->node_id;
    vs__check_node_ids(b);
  }
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
  be->last_seen = vs_now();
  if (!be->alive) {
    vs_log(VSPEC_LOG_INFO, "broker", "daemon %s is alive", be->endpoint);
    be->alive = 1;
    vs__check_node_ids(b);
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
  int accepted = ev->body_case == VSPEC__EVENT__BODY_ACCEPTED;
  int forward = 1;
  if (accepted || (ev->body_case == VSPEC__EVENT__BODY_ERROR && !job)) {
    /* The answer to a submit. It counts only from the daemon the submit waits on: after a
     * failover the old daemon may still answer (a late Accepted or busy), and that must not
     * bind the job to it or send the submit on once more. */
    vs__bjob *p = vs__find_request(b, i, &m->env, rid);
    int current = p && !p->job_id && p->backend == i;
    int stale = !current && (accepted || (p && (p->tried & (1u << i))));
    vs__bjob *dup = accepted && current ? vs__find_job(b, -1, job) : NULL;
    if (stale) {
      char t[40];
      vs_wire_envelope_text(&m->env, t, sizeof t);
      if (accepted) {
        /* Nobody waits for this job any more (the submit went elsewhere or was given up):
         * stop it. */
        vs_log(VSPEC_LOG_INFO, "broker", "daemon %s accepted job %llu of client %s late (the "
               "submit was failed over or given up): cancelling it there", be->endpoint,
               (unsigned long long)job, t);
        vs__cancel_on(b, i, &m->env, job);
      } else {
        vs_log(VSPEC_LOG_DEBUG, "broker", "daemon %s answered a submit of client %s late "
               "(%s): ignored", be->endpoint, t, vs_wire_error_name(ev->error->code));
      }
      forward = 0;
    } else if (dup) {
      char msg[400];
      snprintf(msg, sizeof msg, "job id %llu of daemon %s is already used by daemon %s: "
               "daemons behind one broker need distinct [server] node_id", (unsigned long long)job,
               be->node, b->be[dup->backend].node);
      vs_log(VSPEC_LOG_ERROR, "broker", "%s; job refused", msg);
      vs__cancel_on(b, i, &m->env, job);
      vs__inflight_done(be);
      vs__reply_error(b, &p->client, 0, p->request_id, VSPEC__ERROR_CODE__ERR_INTERNAL, msg);
      vs__unlink(b, p);
      vs__bjob_free(p);
      forward = 0;
    } else if (current && accepted) {
      p->job_id = job;
      free(p->body);
      p->body = NULL;
      for (int k = 0; k < p->n_blobs; k++) free(p->blob[k]);
      p->n_blobs = 0;
      if (p->cancel_on_accept) {
        vs__send_cancel(b, p);
        vs__inflight_done(be);
        vs__unlink(b, p);
        vs__bjob_free(p);
        forward = 0;
      }
    } else if (current) {
      vs__inflight_done(be);
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
    /* else: an error that answers no submit (a cancel of an unknown job): forwarded. */
  } else if (job) {
    vs__bjob *j = vs__find_job(b, i, job);
    /* Events of jobs the broker does not know (failed over already) are dropped, so a client
     * never sees anything after its job's terminal event. */
    if (!j) forward = 0;
    else if (ev->body_case == VSPEC__EVENT__BODY_RESULT ||
             ev->body_case == VSPEC__EVENT__BODY_ERROR) {
      vs__inflight_done(be);
      vs__unlink(b, j);
      vs__bjob_free(j);
    }
  }
  vs_wire_event_free(ev, &a);
  if (!forward) return;
  vs_wire_envelope env = m->env;
  vs__to_client(b, &env, m);
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
  /* No ZMTP heartbeats, here nor towards the daemons: libzmq 4.3.4's heartbeat timer aborts
   * the process on a connection that is reset while libzmq has stopped reading it (a client
   * that floods, a daemon that dies while the broker is behind). TCP keepalive and
   * TCP_USER_TIMEOUT close dead connections; a daemon's liveness is the status poll. */
  b->front = vs_router_front(b->ctx, cfg->front, cfg->max_message_bytes, cfg->heartbeat_ms,
                             cfg->curve_secret_file, err, errlen);
  if (!b->front) return VSPEC_EIO;
  int one = 1, linger = 0, hb = cfg->heartbeat_ms, hbt = 5 * cfg->heartbeat_ms;
  for (int i = 0; i < cfg->n_backends; i++) {
    vs__backend *be = &b->be[i];
    snprintf(be->endpoint, sizeof be->endpoint, "%s", cfg->backends[i]);
    snprintf(be->node, sizeof be->node, "%s", cfg->backends[i]);
    be->sock = zmq_socket(b->ctx, ZMQ_DEALER);
    if (!be->sock || zmq_setsockopt(be->sock, ZMQ_IMMEDIATE, &one, sizeof one) ||
        zmq_setsockopt(be->sock, ZMQ_LINGER, &linger, sizeof linger) ||
        vs_tcp_liveness(be->sock, hb, hbt)) {
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
  b->started = vs_now();
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
    /* Kept messages are retried at least every 10 ms. */
    int n = zmq_poll(it, 1 + b->n, b->out ? 10 : 50);
    if (n < 0 && errno != EINTR) {
      snprintf(err, errlen, "poll: %s", zmq_strerror(errno));
      rc = VSPEC_EIO;
      break;
    }
    for (int i = 0; i < b->n; i++) {
      for (int k = 0; k < 256; k++) {
        vs_wire_msg m;
        char e2[VSPEC_ERRLEN];
        int r = vs_wire_recv(b->be[i].sock, 1, &m, (size_t)cfg->max_event_bytes,
                             (size_t)cfg->max_event_bytes, e2, sizeof e2);
        if (r == 0) break;
        if (r < 0) continue;
        vs__from_backend(b, i, &m);
        vs_wire_msg_close(&m);
        vs__reap(b);
      }
    }
    for (int k = 0; k < 256; k++) {
      vs_wire_msg m;
      char e2[VSPEC_ERRLEN];
      int r = vs_wire_recv_request(b->front, 1, &m, (size_t)cfg->max_request_bytes,
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
      vs__reap(b);
    }
    double now = vs_now();
    if (b->out) vs__retry_out(b, now);
    vs__poll_backends(b, now);
    vs__reap(b);
  }
  vs_log(VSPEC_LOG_INFO, "broker", "stopping");
done:
  while (b->out) vs__outq_drop(b, &b->out->client);
  free(b->gone);
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
