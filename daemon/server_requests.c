/*
 * daemon/server_requests.c - vspecd's requests from clients: submit, cancel, credit, ping, dispatched from a table
 * (daemon/server_internal.h).
 */
#include "daemon/server_internal.h"

/* ---- requests ---------------------------------------------------------------------------- */

static uint64_t req_new_id(vs_server *s) {
  return ((uint64_t)s->cfg.node_id << 40) | ++s->next_id;
}

static void req_handle_submit(vs_server *s, int sock, const Vspec__Request *r,
                              const vs_wire_msg *m) {
  const vs_wire_envelope *env = &m->env;
  uint64_t rid = r->has_request_id ? r->request_id : 0;
  char err[VSPEC_ERRLEN];
  if (s->draining) {
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_SHUTTING_DOWN,
                    "the daemon is shutting down and accepts no new jobs", s->cfg.busy_retry_ms);
    return;
  }
  vs_client *c = vs__client_find(s, sock, m);
  if (c && c->n_jobs >= s->cfg.per_client) {
    snprintf(err, sizeof err, "this connection already has %d jobs (queue.per_client = %d)",
             c->n_jobs, s->cfg.per_client);
    s->totals.rejected_busy++;
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_BUSY, err, s->cfg.busy_retry_ms);
    return;
  }
  if (!c && s->n_clients >= s->cfg.max_clients) {
    snprintf(err, sizeof err, "%d client connections have jobs (limits.max_clients)",
             s->n_clients);
    s->totals.rejected_busy++;
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_BUSY, err, s->cfg.busy_retry_ms);
    return;
  }
  int code = 0;
  uint64_t id = req_new_id(s);
  vs_djob *j = vs_submit_build(&s->submit, r, m, id, &code, err, sizeof err);
  if (!j) {
    vs_log(VSPEC_LOG_INFO, "server", "submit refused: %s", err);
    vs__reply_error(s, sock, env, rid, code, err, 0);
    return;
  }
  j->client_key = vs__client_key(sock, m);
  int rc = vs_job_queue_push(s->queue, j);
  if (rc) {
    snprintf(err, sizeof err, "the queue is full (%d jobs waiting, queue.size = %d)",
             vs_job_queue_waiting(s->queue), s->cfg.queue_size);
    s->totals.rejected_busy++;
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_BUSY, err, s->cfg.busy_retry_ms);
    vs_djob_release(j);
    return;
  }
  if (!c) c = vs__client_add(s, sock, m);
  if (!c) {
    /* Cannot track it: take it back out, as if the queue had been full. */
    if (vs_job_queue_remove(s->queue, j)) {
      vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_BUSY, "out of memory",
                      s->cfg.busy_retry_ms);
      vs_djob_release(j);
      return;
    }
    /* A worker has it already: it stops at the first round and nobody hears of it. */
    j->lp.terminal_sent = 1;
    vs_djob_cancel(j, VS_CANCEL_GONE);
    vs_djob_release(j);
    return;
  }
  vs__job_link(s, j, c, env); /* the loop's reference */
  s->totals.submitted++;
  int pos = vs_job_queue_position(s->queue, j);
  char who[40];
  snprintf(who, sizeof who, "job %llu", (unsigned long long)j->id);
  char where[48];
  if (pos < 0) snprintf(where, sizeof where, "running");
  else snprintf(where, sizeof where, "queue position %d", pos);
  /* The tag is the client's free text: quoted, as every value from a client in a message. */
  char tag[4 * sizeof j->tag + 3];
  vs_text_quote(tag, sizeof tag, j->tag, strlen(j->tag));
  vs_log(VSPEC_LOG_INFO, who, "accepted from %s: model %s, method %s, class %d, seed %llu, "
         "preview %d, %s%s%s", c->text, j->model, j->method.text, j->class_label,
         (unsigned long long)j->seed, j->preview_kind, where, *j->tag ? ", tag " : "",
         *j->tag ? tag : "");
  j->lp.accepted_pending = 1;
  if (vs__send_accepted(s, j) == -EAGAIN) {
    vs_log(VSPEC_LOG_DEBUG, who, "client %s's queue is full: Accepted will be retried", c->text);
    j->lp.retry = 1;
  }
  vs__start_tick(s);
}

static vs_djob *req_owned_job(vs_server *s, int sock, const vs_wire_msg *m, uint64_t id,
                              int any) {
  vs_djob *j = vs__job_find(s, id);
  if (!j || j->lp.terminal_sent) return NULL;
  if (any) return j;
  return vs__job_owned_by(j, sock, m) ? j : NULL;
}

static void req_handle_cancel(vs_server *s, int sock, const vs_wire_msg *m,
                              const Vspec__Request *r) {
  const vs_wire_envelope *env = &m->env;
  uint64_t rid = r->has_request_id ? r->request_id : 0;
  uint64_t id = r->cancel->job_id;
  int admin = sock == VS_SOCK_ADMIN;
  vs_djob *j = req_owned_job(s, sock, m, id, admin);
  char msg[160];
  if (!j) {
    snprintf(msg, sizeof msg, "no running or queued job %llu%s", (unsigned long long)id,
             admin ? "" : " of this client");
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_NOT_FOUND, msg, 0);
    return;
  }
  int reason = admin ? VS_CANCEL_ADMIN : VS_CANCEL_CLIENT;
  char who[40];
  snprintf(who, sizeof who, "job %llu", (unsigned long long)id);
  vs_log(VSPEC_LOG_INFO, who, "cancel requested (%s)", admin ? "admin" : "client");
  int owner = vs__job_owned_by(j, sock, m);
  vs_djob_retain(j);
  if (vs_job_queue_remove(s->queue, j)) vs__finish_unstarted(s, j, reason);
  else vs_djob_cancel(j, reason);
  vs_djob_release(j);
  if (!owner) {
    Vspec__Event ev = VSPEC__EVENT__INIT;
    Vspec__Ack ack = VSPEC__ACK__INIT;
    snprintf(msg, sizeof msg, "job %llu is being cancelled", (unsigned long long)id);
    ack.message = msg;
    ev.body_case = VSPEC__EVENT__BODY_ACK;
    ev.ack = &ack;
    ev.has_job_id = 1;
    ev.job_id = id;
    if (rid) {
      ev.has_request_id = 1;
      ev.request_id = rid;
    }
    vs__send(s, sock, env, &ev, NULL, 0);
  }
}

static void req_handle_credit(vs_server *s, int sock, const vs_wire_msg *m,
                              const Vspec__Request *r) {
  vs_djob *j = req_owned_job(s, sock, m, r->credit->job_id, 0);
  if (!j) return; /* finished meanwhile: credit for a finished job is not an error */
  int64_t c = (int64_t)j->lp.credit + r->credit->grant;
  j->lp.credit = c > s->cfg.max_credit ? s->cfg.max_credit : (int)c;
  vs__pump(s, j);
}


static void req_handle_ping(vs_server *s, int sock, const vs_wire_msg *m,
                            const Vspec__Request *r, uint64_t rid) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Pong p = VSPEC__PONG__INIT;
  p.node = s->cfg.node;
  ev.body_case = VSPEC__EVENT__BODY_PONG;
  ev.pong = &p;
  if (rid) {
    ev.has_request_id = 1;
    ev.request_id = rid;
  }
  vs__send(s, sock, &m->env, &ev, NULL, 0);
}

static void req_handle_resume(vs_server *s, int sock, const vs_wire_msg *m,
                              const Vspec__Request *r, uint64_t rid) {
  /* Events are kept only in fleet mode, by Redis, and relayed by vspec-gateway. */
  vs__reply_error(s, sock, &m->env, rid, VSPEC__ERROR_CODE__ERR_INVALID,
                  "resume is a fleet-mode request: send it to a vspec-gateway (vspecd "
                  "alone keeps no events of finished or abandoned jobs)", 0);
}

/* Adapters to the table's one signature. */
static void req_on_submit(vs_server *s, int sock, const vs_wire_msg *m, const Vspec__Request *r,
                          uint64_t rid) {
  req_handle_submit(s, sock, r, m);
}
static void req_on_cancel(vs_server *s, int sock, const vs_wire_msg *m, const Vspec__Request *r,
                          uint64_t rid) {
  req_handle_cancel(s, sock, m, r);
}
static void req_on_credit(vs_server *s, int sock, const vs_wire_msg *m, const Vspec__Request *r,
                          uint64_t rid) {
  req_handle_credit(s, sock, m, r);
}
static void req_on_status(vs_server *s, int sock, const vs_wire_msg *m, const Vspec__Request *r,
                          uint64_t rid) {
  vs__handle_status(s, sock, m, rid);
}
static void req_on_plugins(vs_server *s, int sock, const vs_wire_msg *m,
                           const Vspec__Request *r, uint64_t rid) {
  vs__handle_plugins(s, sock, &m->env, rid);
}
static void req_on_reload(vs_server *s, int sock, const vs_wire_msg *m, const Vspec__Request *r,
                          uint64_t rid) {
  vs__handle_reload(s, sock, &m->env, r);
}

typedef void (*req_request_fn)(vs_server *s, int sock, const vs_wire_msg *m,
                               const Vspec__Request *r, uint64_t rid);

/* Every request body the daemon answers; admin_only ones are refused on the job endpoint
 * (DESIGN.md, "Security"). A body not listed is malformed. */
static const struct {
  Vspec__Request__BodyCase body;
  int admin_only;
  const char *refusal;
  req_request_fn fn;
} req_requests[] = {
    {VSPEC__REQUEST__BODY_SUBMIT, 0, NULL, req_on_submit},
    {VSPEC__REQUEST__BODY_CANCEL, 0, NULL, req_on_cancel},
    {VSPEC__REQUEST__BODY_CREDIT, 0, NULL, req_on_credit},
    {VSPEC__REQUEST__BODY_STATUS, 0, NULL, req_on_status},
    {VSPEC__REQUEST__BODY_PLUGINS, 0, NULL, req_on_plugins},
    {VSPEC__REQUEST__BODY_RELOAD, 1, "plugin reload is an admin request: use the admin endpoint",
     req_on_reload},
    {VSPEC__REQUEST__BODY_PING, 0, NULL, req_handle_ping},
    {VSPEC__REQUEST__BODY_RESUME, 0, NULL, req_handle_resume},
};

static void req_handle(vs_server *s, int sock, vs_wire_msg *m) {
  vs_wire_alloc a;
  vs_wire_alloc_init(&a, (size_t)s->cfg.unpack_budget_bytes);
  int code = 0;
  char err[VSPEC_ERRLEN];
  Vspec__Request *r = vs_wire_unpack_request(m, &a, &code, err, sizeof err);
  if (!r) {
    s->totals.malformed++;
    vs_log(VSPEC_LOG_DEBUG, "server", "bad request: %s", err);
    vs__reply_error(s, sock, &m->env, 0, code, err, 0);
    return;
  }
  uint64_t rid = r->has_request_id ? r->request_id : 0;
  size_t i = 0, n = sizeof req_requests / sizeof req_requests[0];
  while (i < n && req_requests[i].body != r->body_case) i++;
  if (i == n)
    vs__reply_error(s, sock, &m->env, rid, VSPEC__ERROR_CODE__ERR_MALFORMED,
                    "unknown request body", 0);
  else if (req_requests[i].admin_only && sock != VS_SOCK_ADMIN)
    vs__reply_error(s, sock, &m->env, rid, VSPEC__ERROR_CODE__ERR_FORBIDDEN,
                    req_requests[i].refusal, 0);
  else
    req_requests[i].fn(s, sock, m, r, rid);
  vs_wire_request_free(r, &a);
}

int vs__on_read(vs_zwatch *w, void *user) {
  vs_server *s = user;
  /* Drained and stopping (a request handled just now may have sent the last terminal
   * event): the workers are joined, nothing more is read, whatever is still queued. */
  if (s->stopping) return 0;
  int sock = w == &s->watch[VS_SOCK_ADMIN] ? VS_SOCK_ADMIN : VS_SOCK_JOB;
  vs_wire_msg m;
  char err[VSPEC_ERRLEN];
  int rc = vs_wire_recv_request(s->sock[sock], 1, &m, (size_t)s->cfg.max_request_bytes,
                                (size_t)s->cfg.max_message_bytes, err, sizeof err);
  if (rc == 0) return 0;
  if (rc < 0) {
    if (rc == VSPEC_EFORMAT || rc == VSPEC_ERANGE) {
      s->totals.malformed++;
      vs_log(VSPEC_LOG_DEBUG, "server", "malformed message: %s", err);
      if (m.env.n > 0)
        vs__reply_error(s, sock, &m.env, 0,
                        rc == VSPEC_ERANGE ? VSPEC__ERROR_CODE__ERR_TOO_LARGE
                                           : VSPEC__ERROR_CODE__ERR_MALFORMED,
                        err, 0);
      vs__reap(s);
      return 1;
    }
    vs_log(VSPEC_LOG_ERROR, "server", "%s", err);
    return 0;
  }
  req_handle(s, sock, &m);
  vs_wire_msg_close(&m);
  vs__reap(s);
  vs__check_drained(s);
  return 1;
}
