#include "daemon/server.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <uv.h>
#include <zmq.h>

#include "core/metrics.h" /* vs_now */
#include "core/host.h"
#include "core/log.h"
#include "core/names.h"
#include "core/text.h"
#include "core/registry.h"
#include "daemon/fleet_agent.h"
#include "daemon/fleet_queue.h"
#include "daemon/job_queue.h"
#include "daemon/model_set.h"
#include "daemon/plugin_ref.h"
#include "daemon/router.h"
#include "daemon/submit.h"
#include "daemon/workers.h"
#include "daemon/zap.h"
#include "daemon/zsock_watch.h"
#include "kernels/vs_kernels.h"
#include "proto/curve_keys.h"
#include "proto/endpoint_probe.h"
#include "proto/wire.h"

enum { VS_SOCK_JOB = 0, VS_SOCK_ADMIN = 1 };
#define VS_BUCKETS 1024
#define VS_TICK_MS 20

/* A client is one connection on one socket: the routing id the ROUTER knows it by (the first
 * routing frame, which is the ROUTER's, not the peer's to add to) and, with CURVE, the key it
 * authenticated with. Routing frames after the first come from the peer (a broker puts its
 * client's id there, but any DEALER can put anything there): they route a job's events back
 * (vs_djob.lp.env) and decide who owns it, but never make one connection several clients, so
 * queue.per_client, limits.max_clients and the queue's fairness count connections. A peer
 * can choose its own routing id (ZMQ_ROUTING_ID) and so claim another's once that one has
 * disconnected, but it cannot present another's key. Without CURVE the routing id is all
 * there is (DESIGN.md, "Security"). */
typedef struct vs_client {
  vs_wire_envelope env; /* the connection: the first routing frame alone */
  char user_id[VS_WIRE_MAX_USER_ID + 1]; /* ZAP user id (CURVE public key), "" without */
  int sock;
  uint64_t key;
  struct vs_client *hnext;
  vs_djob *jobs;
  int n_jobs;
  int gone;
  char text[112]; /* short routing id and allow-list name, for logs */
} vs_client;

typedef struct vs_totals {
  uint64_t submitted, completed, failed, cancelled, rejected_busy, clients_lost, malformed, tokens;
} vs_totals;

typedef struct vs_reload_work {
  uv_work_t req;
  struct vs_server *s;
  vs_wire_envelope env;
  int sock;
  uint64_t request_id;
  char backend[64];
  int rc;
  char err[VSPEC_ERRLEN];
  char names[VS_CONF_MAX_MODELS][64];
  int n_names;
} vs_reload_work;

struct vs_server {
  vs_daemon_config cfg;
  uv_loop_t loop;
  void *zctx;
  void *sock[2];
  vs_zwatch watch[2];
  int watches_open;
  vs_fleet_agent *fleet; /* fleet mode: takes jobs from Redis, submits them here */
  uv_async_t async;
  uv_timer_t tick;
  uv_signal_t sig_term, sig_int, sig_hup;
  int tick_running;

  vspec_host host;
  vs_registry *reg;
  vspec_dev *load_dev;
  vs_model_table *models;
  vs_job_queue *queue;
  vs_workers *workers;
  vs_zap *zap;
  vs_submit_ctx submit;

  pthread_mutex_t mail_mu;
  vs_djob *mail;

  vs_client *clients[VS_BUCKETS];
  int n_clients, n_gone;
  vs_djob *jobs[VS_BUCKETS]; /* live jobs by id: accepted, terminal event not yet sent */
  int n_jobs;
  vs_djob *outbox;           /* terminal events waiting for a full peer queue */
  uint64_t next_id;

  vs_totals totals;
  double started_at, last_heartbeat;
  int draining, hard_cancel, stopping;
  double drain_started;
  vs_reload_work *reload; /* a backend reload in flight */
  vs_registry_refresh_report hup; /* SIGHUP: changed backends still to reload, in order */
  int hup_next;
  int exit_code;
};

static void vs__start_tick(vs_server *s);
static void vs__pump(vs_server *s, vs_djob *j);
static void vs__check_drained(vs_server *s);

/* ---- clients ------------------------------------------------------------------------ */

/* The connection of an envelope: its first routing frame. */
static void vs__connection(const vs_wire_envelope *env, vs_wire_envelope *conn) {
  conn->n = env->n > 0;
  if (conn->n) {
    conn->len[0] = env->len[0];
    memcpy(conn->id[0], env->id[0], env->len[0]);
  }
}

/* The client key of the connection m came on (the hash table's and the queue's fairness). */
static uint64_t vs__client_key(int sock, const vs_wire_msg *m) {
  vs_wire_envelope conn;
  vs__connection(&m->env, &conn);
  return vs_wire_envelope_hash(&conn) ^ (uint64_t)sock;
}

static vs_client *vs__client_find(vs_server *s, int sock, const vs_wire_msg *m) {
  vs_wire_envelope conn;
  vs__connection(&m->env, &conn);
  uint64_t key = vs__client_key(sock, m);
  for (vs_client *c = s->clients[key % VS_BUCKETS]; c; c = c->hnext)
    if (c->key == key && c->sock == sock && vs_wire_envelope_equal(&c->env, &conn) &&
        !strcmp(c->user_id, m->user_id))
      return c;
  return NULL;
}

static vs_client *vs__client_add(vs_server *s, int sock, const vs_wire_msg *m) {
  vs_client *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  vs__connection(&m->env, &c->env);
  memcpy(c->user_id, m->user_id, sizeof c->user_id);
  c->sock = sock;
  c->key = vs__client_key(sock, m);
  vs_wire_envelope_text(&c->env, c->text, sizeof c->text);
  const char *name = *c->user_id ? vs_zap_name(s->zap, c->user_id) : NULL;
  if (name) {
    size_t n = strlen(c->text);
    snprintf(c->text + n, sizeof c->text - n, " (%s)", name);
  }
  vs_client **b = &s->clients[c->key % VS_BUCKETS];
  c->hnext = *b;
  *b = c;
  s->n_clients++;
  return c;
}

static void vs__client_free(vs_server *s, vs_client *c) {
  for (vs_client **p = &s->clients[c->key % VS_BUCKETS]; *p; p = &(*p)->hnext)
    if (*p == c) {
      *p = c->hnext;
      break;
    }
  s->n_clients--;
  free(c);
}

/* ---- the job table ---------------------------------------------------------------------- */

static vs_djob *vs__job_find(vs_server *s, uint64_t id) {
  for (vs_djob *j = s->jobs[id % VS_BUCKETS]; j; j = j->lp.id_next)
    if (j->id == id) return j;
  return NULL;
}

static void vs__job_link(vs_server *s, vs_djob *j, vs_client *c, const vs_wire_envelope *env) {
  vs_djob **b = &s->jobs[j->id % VS_BUCKETS];
  j->lp.id_next = *b;
  *b = j;
  s->n_jobs++;
  j->lp.client = c;
  j->lp.env = *env;
  j->lp.last_event = vs_now();
  j->lp.client_next = c->jobs;
  c->jobs = j;
  c->n_jobs++;
}

/* Counts a job in the status totals by how it ended (a job that never finished was
 * cancelled), once: every job that leaves the table passes here, whichever way it left. */
static void vs__count(vs_server *s, vs_djob *j) {
  if (j->lp.counted) return;
  j->lp.counted = 1;
  pthread_mutex_lock(&j->mu);
  int finished = j->sh.finished, rc = j->sh.rc;
  int64_t tokens = j->sh.stats.tokens;
  pthread_mutex_unlock(&j->mu);
  if (!finished || rc == VSPEC_ECANCELED) {
    s->totals.cancelled++;
  } else if (rc == 0) {
    s->totals.completed++;
    s->totals.tokens += (uint64_t)tokens;
  } else {
    s->totals.failed++;
  }
}

/* Forgets a job whose terminal event is sent (or whose client is gone): counts it if nothing
 * did yet and drops the loop's reference. The client goes with its last job. */
static void vs__job_unlink(vs_server *s, vs_djob *j) {
  vs__count(s, j);
  for (vs_djob **p = &s->jobs[j->id % VS_BUCKETS]; *p; p = &(*p)->lp.id_next)
    if (*p == j) {
      *p = j->lp.id_next;
      s->n_jobs--;
      break;
    }
  for (vs_djob **p = &s->outbox; *p; p = &(*p)->lp.outbox_next)
    if (*p == j) {
      *p = j->lp.outbox_next;
      break;
    }
  vs_client *c = j->lp.client;
  if (c) {
    for (vs_djob **p = &c->jobs; *p; p = &(*p)->lp.client_next)
      if (*p == j) {
        *p = j->lp.client_next;
        c->n_jobs--;
        break;
      }
    j->lp.client = NULL;
    if (!c->n_jobs && !c->gone) vs__client_free(s, c);
  }
  j->lp.terminal_sent = 1;
  vs_djob_release(j);
}

/* ---- sending ----------------------------------------------------------------------------- */

static int vs__send(vs_server *s, int sock, const vs_wire_envelope *env, Vspec__Event *ev,
                    vs_wire_blob *blobs, int n_blobs) {
  return vs_wire_send_event(s->sock[sock], env, ev, blobs, n_blobs, ZMQ_DONTWAIT);
}

static void vs__reply_error(vs_server *s, int sock, const vs_wire_envelope *env,
                            uint64_t request_id, int code, const char *msg, int retry_ms) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Error e = VSPEC__ERROR__INIT;
  e.code = code;
  e.message = (char *)msg;
  if (retry_ms > 0) {
    e.has_retry_after_ms = 1;
    e.retry_after_ms = (uint32_t)retry_ms;
  }
  ev.body_case = VSPEC__EVENT__BODY_ERROR;
  ev.error = &e;
  if (request_id) {
    ev.has_request_id = 1;
    ev.request_id = request_id;
  }
  vs__send(s, sock, env, &ev, NULL, 0);
}

/* A send to the client failed with EHOSTUNREACH: the ROUTER no longer knows it. Its jobs are
 * dealt with by vs__reap once the current callback is done with them. */
static void vs__client_lost(vs_server *s, vs_client *c) {
  if (c->gone) return;
  c->gone = 1;
  s->n_gone++;
}

/* Sends a job event to its client (job id and sequence number filled in). */
static int vs__job_send(vs_server *s, vs_djob *j, Vspec__Event *ev, vs_wire_blob *blobs,
                        int n_blobs) {
  vs_client *c = j->lp.client;
  if (!c || c->gone) {
    for (int i = 0; i < n_blobs; i++)
      if (blobs[i].free_fn) blobs[i].free_fn(blobs[i].data, blobs[i].hint);
    return -EHOSTUNREACH;
  }
  ev->has_job_id = 1;
  ev->job_id = j->id;
  ev->has_seq = 1;
  ev->seq = j->lp.seq;
  if (j->lp.request_id) {
    ev->has_request_id = 1;
    ev->request_id = j->lp.request_id;
  }
  int rc = vs__send(s, c->sock, &j->lp.env, ev, blobs, n_blobs);
  if (rc == 0) {
    j->lp.seq++;
    j->lp.last_event = vs_now();
  } else if (rc == -EHOSTUNREACH) {
    vs_log(VSPEC_LOG_INFO, "server", "client %s is gone (unroutable); cancelling its jobs",
           c->text);
    vs__client_lost(s, c);
  }
  return rc;
}

/* ---- Accepted ----------------------------------------------------------------------------- */

/* Sends a job's Accepted (its first event, seq 0). Returns 0 when that is done with (sent, or
 * the client is gone), -EAGAIN when the client's queue is full: then j->lp.accepted_pending
 * stays set, nothing else of the job goes out before it, and the timer retries it (from
 * vs__pump, or with the terminal event from the outbox), so the client always learns its
 * job's id. */
static int vs__send_accepted(vs_server *s, vs_djob *j) {
  if (!j->lp.accepted_pending) return 0;
  int pos = vs_job_queue_position(s->queue, j);
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Accepted a = VSPEC__ACCEPTED__INIT;
  a.has_queue_position = 1;
  a.queue_position = pos > 0 ? (uint32_t)pos : 0;
  a.model = j->model;
  a.method = j->method;
  a.node = s->cfg.node;
  a.has_tokens_total = 1;
  a.tokens_total = (uint32_t)j->tokens_total;
  a.has_seed = 1;
  a.seed = j->seed;
  ev.body_case = VSPEC__EVENT__BODY_ACCEPTED;
  ev.accepted = &a;
  int rc = vs__job_send(s, j, &ev, NULL, 0);
  if (rc == -EAGAIN) return rc;
  j->lp.accepted_pending = 0;
  j->lp.queued_reported = pos;
  return 0;
}

/* ---- terminal events ---------------------------------------------------------------------- */

static const char *vs__reason_text(int reason) {
  switch (reason) {
    case VS_CANCEL_CLIENT: return "cancelled by its client";
    case VS_CANCEL_ADMIN: return "cancelled by an operator";
    case VS_CANCEL_DEADLINE: return "its deadline passed";
    case VS_CANCEL_DRAIN: return "the daemon is shutting down";
    case VS_CANCEL_GONE: return "its client is gone";
    default: return "cancelled";
  }
}

static void vs__free_blob(void *data, void *hint) {
  (void)hint;
  free(data);
}

/* Sends the Result or Error of a finished job. Returns 0 when the job is done with (sent, or
 * its client is gone), -EAGAIN when the client's queue is full (retry later). */
static int vs__send_terminal(vs_server *s, vs_djob *j) {
  /* The Accepted goes first: a client learns the job's id before it hears how it ended. */
  if (vs__send_accepted(s, j) == -EAGAIN) return -EAGAIN;
  char who[40];
  snprintf(who, sizeof who, "job %llu", (unsigned long long)j->id);
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Result res = VSPEC__RESULT__INIT;
  Vspec__Stats st = VSPEC__STATS__INIT;
  Vspec__Error er = VSPEC__ERROR__INIT;
  vs_wire_blob blobs[3];
  int n_blobs = 0;
  char msg[700];
  pthread_mutex_lock(&j->mu);
  int rc = j->sh.rc;
  int reason = atomic_load(&j->cancel_reason);
  if (rc == 0) {
    const vs_djob_stats *x = &j->sh.stats;
    res.has_width = res.has_height = res.has_grid_h = res.has_grid_w = 1;
    res.width = (uint32_t)j->sh.width;
    res.height = (uint32_t)j->sh.height;
    res.grid_h = (uint32_t)j->sh.grid_h;
    res.grid_w = (uint32_t)j->sh.grid_w;
    res.describe = j->sh.describe;
    res.node = s->cfg.node;
    res.has_seed = 1;
    res.seed = j->seed;
    st.has_tokens = st.has_target_forwards = st.has_rounds = st.has_drafted = 1;
    st.has_accepted = st.has_tpf = st.has_mal = st.has_accept_rate = 1;
    st.has_generate_s = st.has_decode_s = st.has_queue_s = st.has_preview_s = 1;
    st.has_previews = st.has_skipped_rounds = st.has_unverified_tokens = 1;
    st.has_model_generation = 1;
    st.tokens = (uint64_t)x->tokens;
    st.target_forwards = (uint64_t)x->target_forwards;
    st.rounds = (uint64_t)x->rounds;
    st.drafted = (uint64_t)x->drafted;
    st.accepted = (uint64_t)x->accepted;
    st.tpf = x->tpf;
    st.mal = x->mal;
    st.accept_rate = x->accept_rate;
    st.generate_s = x->generate_s;
    st.decode_s = x->decode_s;
    st.queue_s = x->queue_s;
    st.preview_s = x->preview_s;
    st.previews = (uint32_t)x->previews;
    st.skipped_rounds = (uint64_t)x->skipped_rounds;
    st.unverified_tokens = (uint64_t)x->unverified;
    st.model_generation = x->model_generation;
    if (*x->rule_version) st.rule_version = (char *)x->rule_version;
    if (*x->sched_version) st.sched_version = (char *)x->sched_version;
    res.stats = &st;
    ev.body_case = VSPEC__EVENT__BODY_RESULT;
    ev.result = &res;
    /* Copied by libzmq (free_fn NULL): the job keeps its copy for a retry after EAGAIN. */
    int n = j->tokens_total;
    blobs[n_blobs++] = (vs_wire_blob){.kind = VSPEC__BLOB_KIND__BLOB_PNG, .data = j->sh.png,
                                      .size = j->sh.png_len};
    int32_t *le = malloc((size_t)n * 4);
    uint8_t *stt = malloc((size_t)n);
    if (le && stt) {
      for (int i = 0; i < n; i++) {
        uint32_t v = (uint32_t)j->sh.tokens[i];
        uint8_t *b = (uint8_t *)&le[i];
        b[0] = (uint8_t)v;
        b[1] = (uint8_t)(v >> 8);
        b[2] = (uint8_t)(v >> 16);
        b[3] = (uint8_t)(v >> 24);
      }
      memcpy(stt, j->sh.status, (size_t)n);
      blobs[n_blobs++] = (vs_wire_blob){.kind = VSPEC__BLOB_KIND__BLOB_TOKENS_I32LE, .data = le,
                                        .size = (size_t)n * 4, .free_fn = vs__free_blob};
      blobs[n_blobs++] = (vs_wire_blob){.kind = VSPEC__BLOB_KIND__BLOB_STATUS_U8, .data = stt,
                                        .size = (size_t)n, .free_fn = vs__free_blob};
    } else {
      free(le);
      free(stt);
    }
  } else {
    er.code = VSPEC__ERROR_CODE__ERR_INTERNAL;
    if (rc == VSPEC_ECANCELED) {
      er.code = reason == VS_CANCEL_DEADLINE ? VSPEC__ERROR_CODE__ERR_DEADLINE
                : reason == VS_CANCEL_DRAIN  ? VSPEC__ERROR_CODE__ERR_SHUTTING_DOWN
                                             : VSPEC__ERROR_CODE__ERR_CANCELLED;
      snprintf(msg, sizeof msg, "job %llu stopped after %d of %d tokens: %s",
               (unsigned long long)j->id, j->sh.n_tokens, j->tokens_total,
               vs__reason_text(reason));
      if (reason == VS_CANCEL_DRAIN) {
        er.has_retry_after_ms = 1;
        er.retry_after_ms = (uint32_t)s->cfg.busy_retry_ms;
      }
    } else {
      if (rc == VSPEC_EINVAL || rc == VSPEC_ERANGE || rc == VSPEC_ENOENT || rc == VSPEC_ENOTSUP)
        er.code = VSPEC__ERROR_CODE__ERR_INVALID;
      snprintf(msg, sizeof msg, "job %llu failed: %s", (unsigned long long)j->id, j->sh.error);
    }
    er.message = msg;
    ev.body_case = VSPEC__EVENT__BODY_ERROR;
    ev.error = &er;
  }
  int src = vs__job_send(s, j, &ev, blobs, n_blobs);
  pthread_mutex_unlock(&j->mu);
  if (src == -EAGAIN) return -EAGAIN;
  if (src == 0)
    vs_log(VSPEC_LOG_DEBUG, who, "terminal event sent (%s)", rc ? vs_wire_error_name(er.code)
                                                               : "result");
  return 0;
}

/* Counts a finished job and sends its terminal event; forgets it once that is done. */
static void vs__finish(vs_server *s, vs_djob *j) {
  if (j->lp.terminal_sent || j->lp.in_outbox) return;
  vs__count(s, j);
  if (vs__send_terminal(s, j) == -EAGAIN) {
    j->lp.in_outbox = 1;
    j->lp.outbox_since = vs_now();
    j->lp.outbox_next = s->outbox;
    s->outbox = j;
    vs__start_tick(s);
    return;
  }
  vs__job_unlink(s, j);
}

/* Ends a job that never reached a worker (cancelled, deadline, drain) or was just taken
 * from the queue. */
static void vs__finish_unstarted(vs_server *s, vs_djob *j, int reason) {
  int none = VS_CANCEL_NONE;
  atomic_compare_exchange_strong(&j->cancel_reason, &none, reason);
  atomic_store(&j->cancel, 1);
  pthread_mutex_lock(&j->mu);
  if (!j->sh.finished) {
    j->sh.finished = 1;
    j->sh.rc = VSPEC_ECANCELED;
    snprintf(j->sh.error, sizeof j->sh.error, "%s", vs__reason_text(reason));
  }
  pthread_mutex_unlock(&j->mu);
  vs__finish(s, j);
}

/* ---- progress and previews ------------------------------------------------------------------ */

/* Sends what the job's client can take now: the token-map delta since the last progress
 * event and the newest preview, each costing one credit; or the terminal event. */
static void vs__pump(vs_server *s, vs_djob *j) {
  if (j->lp.terminal_sent || j->lp.in_outbox) return;
  vs_client *c = j->lp.client;
  j->lp.retry = 0;
  pthread_mutex_lock(&j->mu);
  int finished = j->sh.finished;
  pthread_mutex_unlock(&j->mu);
  if (!c || c->gone) {
    if (finished) vs__finish(s, j);
    return;
  }
  /* Nothing goes out before the Accepted; a finished job's waits in the outbox with its
   * terminal event, which sends both in order. */
  if (vs__send_accepted(s, j) == -EAGAIN) {
    if (finished) {
      vs__finish(s, j);
    } else {
      j->lp.retry = 1;
      vs__start_tick(s);
    }
    return;
  }
  /* The last state goes out before the terminal event (credit permitting), so a client that
   * follows the deltas ends up with the complete map. */
  double now = vs_now();
  int progress_due = finished || j->progress_interval <= 0 ||
                     now - j->lp.last_progress >= j->progress_interval;
  if (j->progress && j->lp.credit > 0 && !progress_due) {
    /* Too soon after the last one: the tick sends the newest state when it is due. */
    pthread_mutex_lock(&j->mu);
    int dirty = j->sh.dirty;
    pthread_mutex_unlock(&j->mu);
    if (dirty) {
      j->lp.retry = 1;
      vs__start_tick(s);
    }
  }
  if (j->progress && j->lp.credit > 0 && progress_due) {
    int n = j->tokens_total;
    uint32_t *pos = NULL, *stv = NULL;
    int32_t *tok = NULL;
    int nd = 0, have = 0, coalesced = 0, n_tokens = 0;
    int64_t round = 0;
    double tpf = 0, mal = 0, acc = 0, elapsed = 0;
    pthread_mutex_lock(&j->mu);
    if (j->sh.dirty) {
      pos = malloc((size_t)n * sizeof *pos);
      tok = malloc((size_t)n * sizeof *tok);
      stv = malloc((size_t)n * sizeof *stv);
      if (pos && tok && stv) {
        have = 1;
        n_tokens = j->sh.n_tokens;
        /* Raster order: the first n_tokens entries are the map, and each of them goes out once
         * even when it equals what the client was sent. A continuous-token model reveals
         * positions in any order: its whole map is current and a position goes out when its
         * status changes. */
        int whole = j->sh.whole_map;
        int cur = whole ? n : n_tokens;
        for (int i = 0; i < n; i++) {
          int32_t t = i < cur ? j->sh.tokens[i] : 0;
          uint8_t st = i < cur ? j->sh.status[i] : 0;
          if (t != j->lp.sent_tokens[i] || st != j->lp.sent_status[i] ||
              (!whole && i < n_tokens && i >= j->lp.sent_n)) {
            pos[nd] = (uint32_t)i;
            tok[nd] = t;
            stv[nd] = st;
            nd++;
          }
        }
        round = j->sh.round;
        coalesced = j->sh.coalesced;
        tpf = j->sh.tpf;
        mal = j->sh.mal;
        acc = j->sh.accept_rate;
        elapsed = j->sh.elapsed_s;
        j->sh.dirty = 0;
        j->sh.coalesced = 0;
      }
    }
    pthread_mutex_unlock(&j->mu);
    if (have) {
      Vspec__Event ev = VSPEC__EVENT__INIT;
      Vspec__Progress p = VSPEC__PROGRESS__INIT;
      p.has_round = p.has_tokens_done = p.has_tokens_total = p.has_tpf = p.has_mal = 1;
      p.has_elapsed_s = p.has_coalesced = p.has_accept_rate = 1;
      p.round = round;
      p.tokens_done = (uint32_t)n_tokens;
      p.tokens_total = (uint32_t)n;
      p.tpf = tpf;
      p.mal = mal;
      p.accept_rate = acc;
      p.elapsed_s = elapsed;
      p.coalesced = (uint32_t)coalesced;
      p.n_positions = p.n_tokens = p.n_status = (size_t)nd;
      p.positions = pos;
      p.tokens = tok;
      p.status = stv;
      ev.body_case = VSPEC__EVENT__BODY_PROGRESS;
      ev.progress = &p;
      int rc = vs__job_send(s, j, &ev, NULL, 0);
      if (rc == 0) {
        j->lp.credit--;
        j->lp.last_progress = now;
        for (int k = 0; k < nd; k++) {
          j->lp.sent_tokens[pos[k]] = tok[k];
          j->lp.sent_status[pos[k]] = (uint8_t)stv[k];
        }
        if (n_tokens > j->lp.sent_n) j->lp.sent_n = n_tokens;
      } else {
        /* Not sent: the same state (or a newer one) goes out next time. */
        pthread_mutex_lock(&j->mu);
        j->sh.dirty = 1;
        pthread_mutex_unlock(&j->mu);
        if (rc == -EAGAIN) {
          j->lp.retry = 1;
          vs__start_tick(s);
        }
      }
    }
    free(pos);
    free(tok);
    free(stv);
  }

  if (finished) {
    vs__finish(s, j);
    return;
  }
  if (j->lp.credit > 0 && !c->gone) {
    pthread_mutex_lock(&j->mu);
    uint8_t *png = j->sh.preview_png;
    size_t len = j->sh.preview_len;
    int64_t round = j->sh.preview_round;
    int tokens = j->sh.preview_tokens, w = j->sh.preview_w, h = j->sh.preview_h;
    j->sh.preview_png = NULL;
    pthread_mutex_unlock(&j->mu);
    if (png) {
      Vspec__Event ev = VSPEC__EVENT__INIT;
      Vspec__Preview p = VSPEC__PREVIEW__INIT;
      p.has_kind = p.has_round = p.has_tokens_done = p.has_tokens_total = 1;
      p.has_width = p.has_height = 1;
      p.kind = j->preview_kind;
      p.round = round;
      p.tokens_done = (uint32_t)tokens;
      p.tokens_total = (uint32_t)j->tokens_total;
      p.width = (uint32_t)w;
      p.height = (uint32_t)h;
      ev.body_case = VSPEC__EVENT__BODY_PREVIEW;
      ev.preview = &p;
      vs_wire_blob b = {.kind = VSPEC__BLOB_KIND__BLOB_PNG, .data = png, .size = len};
      int rc = vs__job_send(s, j, &ev, &b, 1);
      if (rc == 0) {
        j->lp.credit--;
        free(png);
      } else {
        /* Put it back unless the worker has a newer one already. */
        pthread_mutex_lock(&j->mu);
        if (!j->sh.preview_png) {
          j->sh.preview_png = png;
          png = NULL;
        }
        pthread_mutex_unlock(&j->mu);
        free(png);
        if (rc == -EAGAIN) {
          j->lp.retry = 1;
          vs__start_tick(s);
        }
      }
    }
  }
}

/* Deals with clients found gone: waiting jobs are dropped, running ones cancelled (the worker
 * stops at the next round and the job is freed then), finished ones forgotten. */
static void vs__reap(vs_server *s) {
  if (!s->n_gone) return;
  for (int b = 0; b < VS_BUCKETS; b++) {
    vs_client **pc = &s->clients[b];
    while (*pc) {
      vs_client *c = *pc;
      if (!c->gone) {
        pc = &c->hnext;
        continue;
      }
      s->totals.clients_lost++;
      while (c->jobs) {
        vs_djob *j = c->jobs;
        c->jobs = j->lp.client_next;
        c->n_jobs--;
        j->lp.client = NULL;
        char who[40];
        snprintf(who, sizeof who, "job %llu", (unsigned long long)j->id);
        if (vs_job_queue_remove(s->queue, j)) {
          vs_log(VSPEC_LOG_INFO, who, "dropped from the queue: its client is gone");
          vs__job_unlink(s, j); /* counted as cancelled */
          continue;
        }
        pthread_mutex_lock(&j->mu);
        int finished = j->sh.finished;
        pthread_mutex_unlock(&j->mu);
        if (finished) {
          /* Finished, perhaps before the loop heard of it (its news may still be in the
           * mailbox): counted here by how it ended, unless vs__finish counted it already. */
          vs__job_unlink(s, j);
        } else {
          vs_log(VSPEC_LOG_INFO, who, "cancelled: its client is gone");
          vs_djob_cancel(j, VS_CANCEL_GONE);
          /* Stays in the job table until the worker finishes; then vs__finish drops it. */
        }
      }
      *pc = c->hnext;
      s->n_clients--;
      s->n_gone--;
      free(c);
    }
  }
}

/* ---- requests ---------------------------------------------------------------------------- */

static uint64_t vs__new_id(vs_server *s) {
  return ((uint64_t)s->cfg.node_id << 40) | ++s->next_id;
}

static void vs__handle_submit(vs_server *s, int sock, const Vspec__Request *r,
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
  uint64_t id = vs__new_id(s);
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
         "preview %d, %s%s%s", c->text, j->model, j->method, j->class_label,
         (unsigned long long)j->seed, j->preview_kind, where, *j->tag ? ", tag " : "",
         *j->tag ? tag : "");
  j->lp.accepted_pending = 1;
  if (vs__send_accepted(s, j) == -EAGAIN) {
    vs_log(VSPEC_LOG_DEBUG, who, "client %s's queue is full: Accepted will be retried", c->text);
    j->lp.retry = 1;
  }
  vs__start_tick(s);
}

/* Whether the sender of m owns the job: the same socket, whole routing envelope (through a
 * broker, the same client of the broker) and CURVE key. */
static int vs__is_owner(const vs_djob *j, int sock, const vs_wire_msg *m) {
  const vs_client *c = j->lp.client;
  return c && c->sock == sock && vs_wire_envelope_equal(&j->lp.env, &m->env) &&
         !strcmp(c->user_id, m->user_id);
}

static vs_djob *vs__owned_job(vs_server *s, int sock, const vs_wire_msg *m, uint64_t id,
                              int any) {
  vs_djob *j = vs__job_find(s, id);
  if (!j || j->lp.terminal_sent) return NULL;
  if (any) return j;
  return vs__is_owner(j, sock, m) ? j : NULL;
}

static void vs__handle_cancel(vs_server *s, int sock, const vs_wire_msg *m,
                              const Vspec__Request *r) {
  const vs_wire_envelope *env = &m->env;
  uint64_t rid = r->has_request_id ? r->request_id : 0;
  uint64_t id = r->cancel->job_id;
  int admin = sock == VS_SOCK_ADMIN;
  vs_djob *j = vs__owned_job(s, sock, m, id, admin);
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
  int owner = vs__is_owner(j, sock, m);
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

static void vs__handle_credit(vs_server *s, int sock, const vs_wire_msg *m,
                              const Vspec__Request *r) {
  vs_djob *j = vs__owned_job(s, sock, m, r->credit->job_id, 0);
  if (!j) return; /* finished meanwhile: credit for a finished job is not an error */
  int64_t c = (int64_t)j->lp.credit + r->credit->grant;
  j->lp.credit = c > s->cfg.max_credit ? s->cfg.max_credit : (int)c;
  vs__pump(s, j);
}

static void vs__fill_plugin(Vspec__PluginInfo *pi, const vs_plugin_status *p) {
  vspec__plugin_info__init(pi);
  pi->kind = (char *)vs_plugin_kind_name(p->kind);
  pi->name = (char *)p->name;
  pi->version = (char *)p->version;
  pi->has_generation = pi->has_users = pi->has_retired_alive = 1;
  pi->generation = p->generation;
  pi->users = p->users;
  pi->retired_alive = p->retired_alive;
}

#define VS_MAX_PLUGINS 128

static void vs__handle_status(vs_server *s, int sock, const vs_wire_envelope *env, uint64_t rid) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__StatusReply st = VSPEC__STATUS_REPLY__INIT;
  Vspec__Totals to = VSPEC__TOTALS__INIT;
  static vs_plugin_status ps[VS_MAX_PLUGINS];
  static Vspec__PluginInfo pi[VS_MAX_PLUGINS];
  Vspec__PluginInfo *pip[VS_MAX_PLUGINS];
  vs_model_status ms[VS_CONF_MAX_MODELS];
  Vspec__ModelInfo mi[VS_CONF_MAX_MODELS], *mip[VS_CONF_MAX_MODELS];
  vs_worker_status ws[256];
  Vspec__WorkerInfo wi[256], *wip[256];
  st.node = s->cfg.node;
  st.has_queued = st.has_queue_capacity = st.has_running = st.has_draining = st.has_clients = 1;
  st.queued = (uint32_t)vs_job_queue_waiting(s->queue);
  st.queue_capacity = (uint32_t)s->cfg.queue_size;
  st.running = (uint32_t)vs_job_queue_running(s->queue);
  st.draining = s->draining != 0;
  st.clients = (uint32_t)s->n_clients;
  st.default_model = s->cfg.default_model;
  st.has_node_id = 1;
  st.node_id = s->cfg.node_id;
  Vspec__DeviceInfo dv = VSPEC__DEVICE_INFO__INIT;
  vs_device_info di;
  if (vs_workers_device_info(s->workers, &di) == VSPEC_OK) {
    dv.name = di.name;
    dv.kind = di.kind == VSPEC_DEVICE_CUDA ? "cuda" : "cpu";
    dv.has_index = dv.has_memory_used = dv.has_memory_total = 1;
    dv.index = (uint32_t)di.index;
    dv.memory_used = di.mem_used;
    dv.memory_total = di.mem_total;
    dv.precision = di.precision == VS_PRECISION_BF16 ? "bf16" : "fp32";
    st.device = &dv;
  }
  int nw = vs_workers_status(s->workers, ws, 256);
  for (int i = 0; i < nw; i++) {
    vspec__worker_info__init(&wi[i]);
    wi[i].has_index = wi[i].has_job_id = wi[i].has_tokens_done = 1;
    wi[i].has_tokens_total = wi[i].has_jobs_done = 1;
    wi[i].index = (uint32_t)i;
    wi[i].job_id = ws[i].job_id;
    wi[i].tokens_done = (uint32_t)ws[i].tokens_done;
    wi[i].tokens_total = (uint32_t)ws[i].tokens_total;
    wi[i].jobs_done = ws[i].jobs_done;
    wip[i] = &wi[i];
  }
  st.n_workers = (size_t)nw;
  st.workers = wip;
  int np = vs_registry_list(s->reg, ps, VS_MAX_PLUGINS);
  if (np > VS_MAX_PLUGINS) np = VS_MAX_PLUGINS;
  for (int i = 0; i < np; i++) {
    vs__fill_plugin(&pi[i], &ps[i]);
    pip[i] = &pi[i];
  }
  st.n_plugins = (size_t)np;
  st.plugins = pip;
  int nm = vs_model_table_status(s->models, ms, VS_CONF_MAX_MODELS);
  for (int i = 0; i < nm; i++) {
    vspec__model_info__init(&mi[i]);
    mi[i].name = ms[i].name;
    mi[i].dir = ms[i].dir;
    mi[i].has_generation = mi[i].has_jobs = mi[i].has_retired_alive = 1;
    mi[i].generation = ms[i].generation;
    mi[i].jobs = ms[i].jobs;
    mi[i].retired_alive = ms[i].retired_alive;
    if (ms[i].loaded) {
      mi[i].has_grid_h = mi[i].has_grid_w = mi[i].has_num_classes = 1;
      mi[i].has_has_draft = mi[i].has_has_eagle = mi[i].has_continuous = 1;
      mi[i].grid_h = (uint32_t)ms[i].info.grid_h;
      mi[i].grid_w = (uint32_t)ms[i].info.grid_w;
      mi[i].num_classes = (uint32_t)ms[i].info.num_classes;
      mi[i].has_draft = ms[i].has_draft;
      mi[i].has_eagle = ms[i].has_eagle;
      mi[i].continuous = ms[i].info.token_kind == VSPEC_TOKENS_CONTINUOUS;
    }
    mip[i] = &mi[i];
  }
  st.n_models = (size_t)nm;
  st.models = mip;
  to.has_submitted = to.has_completed = to.has_failed = to.has_cancelled = 1;
  to.has_rejected_busy = to.has_clients_lost = to.has_malformed = to.has_tokens = 1;
  to.has_uptime_s = 1;
  to.submitted = s->totals.submitted;
  to.completed = s->totals.completed;
  to.failed = s->totals.failed;
  to.cancelled = s->totals.cancelled;
  to.rejected_busy = s->totals.rejected_busy;
  to.clients_lost = s->totals.clients_lost;
  to.malformed = s->totals.malformed;
  to.tokens = s->totals.tokens;
  to.uptime_s = vs_now() - s->started_at;
  st.totals = &to;
  ev.body_case = VSPEC__EVENT__BODY_STATUS;
  ev.status = &st;
  if (rid) {
    ev.has_request_id = 1;
    ev.request_id = rid;
  }
  vs__send(s, sock, env, &ev, NULL, 0);
}

static void vs__handle_plugins(vs_server *s, int sock, const vs_wire_envelope *env,
                               uint64_t rid) {
  static vs_plugin_status ps[VS_MAX_PLUGINS];
  static Vspec__PluginInfo pi[VS_MAX_PLUGINS];
  Vspec__PluginInfo *pip[VS_MAX_PLUGINS];
  int np = vs_registry_list(s->reg, ps, VS_MAX_PLUGINS);
  if (np > VS_MAX_PLUGINS) np = VS_MAX_PLUGINS;
  for (int i = 0; i < np; i++) {
    vs__fill_plugin(&pi[i], &ps[i]);
    pip[i] = &pi[i];
  }
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__PluginsReply pr = VSPEC__PLUGINS_REPLY__INIT;
  pr.n_plugins = (size_t)np;
  pr.plugins = pip;
  pr.plugin_dir = (char *)vs_registry_dir(s->reg);
  ev.body_case = VSPEC__EVENT__BODY_PLUGINS;
  ev.plugins = &pr;
  if (rid) {
    ev.has_request_id = 1;
    ev.request_id = rid;
  }
  vs__send(s, sock, env, &ev, NULL, 0);
}

static int vs__plugin_status(vs_server *s, int kind, const char *name, vs_plugin_status *out) {
  static vs_plugin_status ps[VS_MAX_PLUGINS];
  int np = vs_registry_list(s->reg, ps, VS_MAX_PLUGINS);
  for (int i = 0; i < np && i < VS_MAX_PLUGINS; i++)
    if (ps[i].kind == kind && !strcmp(ps[i].name, name)) {
      *out = ps[i];
      return 1;
    }
  return 0;
}

static void vs__send_reload_reply(vs_server *s, int sock, const vs_wire_envelope *env,
                                  uint64_t rid, int kind, const char *name, char names[][64],
                                  int n_names) {
  vs_plugin_status p;
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__ReloadReply rr = VSPEC__RELOAD_REPLY__INIT;
  Vspec__PluginInfo pi;
  char *np[VS_CONF_MAX_MODELS];
  if (vs__plugin_status(s, kind, name, &p)) {
    vs__fill_plugin(&pi, &p);
    rr.plugin = &pi;
  }
  for (int i = 0; i < n_names && i < VS_CONF_MAX_MODELS; i++) np[i] = names[i];
  rr.n_models_reloaded = (size_t)(n_names < VS_CONF_MAX_MODELS ? n_names : VS_CONF_MAX_MODELS);
  rr.models_reloaded = np;
  ev.body_case = VSPEC__EVENT__BODY_RELOAD;
  ev.reload = &rr;
  if (rid) {
    ev.has_request_id = 1;
    ev.request_id = rid;
  }
  vs__send(s, sock, env, &ev, NULL, 0);
}

static void vs__reload_work(uv_work_t *req) {
  vs_reload_work *w = req->data;
  w->rc = vs_model_table_reload_backend(w->s->models, w->backend, w->names, VS_CONF_MAX_MODELS,
                                        w->err, sizeof w->err);
}

static void vs__hup_next_backend(vs_server *s);

static void vs__reload_done(uv_work_t *req, int status) {
  vs_reload_work *w = req->data;
  vs_server *s = w->s;
  s->reload = NULL;
  /* sock < 0: started by SIGHUP, nobody to answer. */
  if (status < 0 || w->rc < 0) {
    char msg[VSPEC_ERRLEN + 64];
    snprintf(msg, sizeof msg, "backend %s: the plugin was reloaded but its models were not: %s",
             w->backend, status < 0 ? uv_strerror(status) : w->err);
    vs_log(VSPEC_LOG_WARN, "admin", "%s", msg);
    if (w->sock >= 0)
      vs__reply_error(s, w->sock, &w->env, w->request_id, VSPEC__ERROR_CODE__ERR_INTERNAL, msg, 0);
  } else {
    vs_log(VSPEC_LOG_INFO, "admin", "backend %s reloaded; %d model(s) reopened", w->backend,
           w->rc);
    if (w->sock >= 0)
      vs__send_reload_reply(s, w->sock, &w->env, w->request_id, VSPEC_PLUGIN_BACKEND,
                            w->backend, w->names, w->rc < VS_CONF_MAX_MODELS ? w->rc
                                                                             : VS_CONF_MAX_MODELS);
  }
  free(w);
  vs__hup_next_backend(s);
  vs__check_drained(s);
}

static int vs__plugin_file_exists(vs_server *s, int kind, const char *name) {
  char path[2048];
  struct stat sb;
  snprintf(path, sizeof path, "%s/%s_%s.so", vs_registry_dir(s->reg), vs_plugin_kind_name(kind),
           name);
  return stat(path, &sb) == 0;
}

static void vs__handle_reload(vs_server *s, int sock, const vs_wire_envelope *env,
                              const Vspec__Request *r) {
  uint64_t rid = r->has_request_id ? r->request_id : 0;
  char msg[VSPEC_ERRLEN + 128], name[64] = "";
  int kind = -1;
  /* Off the admin socket: only the characters of a plugin reference get further, so that no
   * message or log line below carries the sender's bytes (core/names.h). */
  if (vs_name_check(&vs_name_reload, "reload", r->reload->name, msg, sizeof msg) ||
      vs_plugin_ref_parse(r->reload->name, &kind, name, msg, sizeof msg)) {
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_INVALID, msg, 0);
    return;
  }
  if (kind < 0) {
    int found = 0;
    for (int k = VSPEC_PLUGIN_BACKEND; k <= VSPEC_PLUGIN_SCHED; k++)
      if (vs__plugin_file_exists(s, k, name)) {
        kind = k;
        found++;
      }
    if (found != 1) {
      snprintf(msg, sizeof msg, found ? "reload: '%s' names plugins of several kinds; say "
               "KIND/%s" : "reload: no plugin '%s' in the plugin directory%.0s", name, name);
      vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_INVALID, msg, 0);
      return;
    }
  }
  if (kind == VSPEC_PLUGIN_BACKEND && s->reload) {
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_BUSY,
                    "a backend reload is already running", 1000);
    return;
  }
  char err[VSPEC_ERRLEN];
  int rc = vs_registry_reload(s->reg, kind, name, err, sizeof err);
  if (rc) {
    snprintf(msg, sizeof msg, "reload %s/%s failed, the current generation stays: %s",
             vs_plugin_kind_name(kind), name, err);
    vs_log(VSPEC_LOG_WARN, "admin", "%s", msg);
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_INVALID, msg, 0);
    return;
  }
  vs_plugin_status ps;
  if (vs__plugin_status(s, kind, name, &ps))
    vs_log(VSPEC_LOG_INFO, "admin", "%s/%s reloaded: version %s, generation %u",
           vs_plugin_kind_name(kind), name, ps.version, ps.generation);
  if (kind != VSPEC_PLUGIN_BACKEND) {
    vs__send_reload_reply(s, sock, env, rid, kind, name, NULL, 0);
    return;
  }
  /* Backends serve models: open new model sets on the thread pool (weights, colour table);
   * running jobs keep their sets. */
  vs_reload_work *w = calloc(1, sizeof *w);
  if (!w) {
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_INTERNAL, "out of memory", 0);
    return;
  }
  w->s = s;
  w->env = *env;
  w->sock = sock;
  w->request_id = rid;
  snprintf(w->backend, sizeof w->backend, "%s", name);
  w->req.data = w;
  s->reload = w;
  if ((rc = uv_queue_work(&s->loop, &w->req, vs__reload_work, vs__reload_done))) {
    s->reload = NULL;
    free(w);
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_INTERNAL, uv_strerror(rc), 0);
  }
}

static void vs__handle(vs_server *s, int sock, vs_wire_msg *m) {
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
  switch (r->body_case) {
    case VSPEC__REQUEST__BODY_SUBMIT: vs__handle_submit(s, sock, r, m); break;
    case VSPEC__REQUEST__BODY_CANCEL: vs__handle_cancel(s, sock, m, r); break;
    case VSPEC__REQUEST__BODY_CREDIT: vs__handle_credit(s, sock, m, r); break;
    case VSPEC__REQUEST__BODY_STATUS: vs__handle_status(s, sock, &m->env, rid); break;
    case VSPEC__REQUEST__BODY_PLUGINS: vs__handle_plugins(s, sock, &m->env, rid); break;
    case VSPEC__REQUEST__BODY_RELOAD:
      if (sock != VS_SOCK_ADMIN)
        vs__reply_error(s, sock, &m->env, rid, VSPEC__ERROR_CODE__ERR_FORBIDDEN,
                        "plugin reload is an admin request: use the admin endpoint", 0);
      else
        vs__handle_reload(s, sock, &m->env, r);
      break;
    case VSPEC__REQUEST__BODY_PING: {
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
      break;
    }
    case VSPEC__REQUEST__BODY_RESUME:
      /* Events are kept only in fleet mode, by Redis, and relayed by vspec-gateway. */
      vs__reply_error(s, sock, &m->env, rid, VSPEC__ERROR_CODE__ERR_INVALID,
                      "resume is a fleet-mode request: send it to a vspec-gateway (vspecd "
                      "alone keeps no events of finished or abandoned jobs)", 0);
      break;
    default:
      vs__reply_error(s, sock, &m->env, rid, VSPEC__ERROR_CODE__ERR_MALFORMED,
                      "unknown request body", 0);
  }
  vs_wire_request_free(r, &a);
}

static int vs__on_read(vs_zwatch *w, void *user) {
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
  vs__handle(s, sock, &m);
  vs_wire_msg_close(&m);
  vs__reap(s);
  vs__check_drained(s);
  return 1;
}

/* ---- worker news ----------------------------------------------------------------------------- */

static void vs__post(vs_djob *j, void *user) {
  vs_server *s = user;
  pthread_mutex_lock(&s->mail_mu);
  if (!j->in_mail) {
    j->in_mail = 1;
    vs_djob_retain(j);
    j->mail_next = s->mail;
    s->mail = j;
  }
  pthread_mutex_unlock(&s->mail_mu);
  uv_async_send(&s->async);
}

static void vs__drain_mail(vs_server *s) {
  /* uv_async_send coalesces wake-ups, so take everything that is there. */
  pthread_mutex_lock(&s->mail_mu);
  vs_djob *list = s->mail;
  s->mail = NULL;
  for (vs_djob *j = list; j; j = j->mail_next) {
    j->in_mail = 0;
    j->taken_next = j->mail_next;
  }
  pthread_mutex_unlock(&s->mail_mu);
  while (list) {
    vs_djob *j = list;
    list = j->taken_next;
    if (!j->lp.terminal_sent) {
      if (!j->lp.client) {
        /* Client gone while it ran: now that it has stopped, forget it. */
        pthread_mutex_lock(&j->mu);
        int finished = j->sh.finished;
        pthread_mutex_unlock(&j->mu);
        if (finished) vs__job_unlink(s, j); /* counted by how it ended */
      } else {
        vs__pump(s, j);
      }
    }
    vs_djob_release(j);
  }
}

static void vs__on_async(uv_async_t *h) {
  vs_server *s = h->data;
  vs__drain_mail(s);
  vs__reap(s);
  vs__check_drained(s);
}

/* ---- the timer: deadlines, retries, heartbeats, queue positions, drain ----------------------- */

/* When anything last went along the routing envelope of job j: its own events and those of
 * the connection's other jobs with the same envelope, and heartbeats. */
static double vs__envelope_last(const vs_client *c, const vs_djob *j) {
  double last = j->lp.last_event;
  for (const vs_djob *k = c->jobs; k; k = k->lp.client_next)
    if (k->lp.last_event > last && vs_wire_envelope_equal(&k->lp.env, &j->lp.env))
      last = k->lp.last_event;
  return last;
}

/* A Heartbeat goes along each routing envelope of the connection's jobs that got nothing for
 * heartbeat_ivl_ms: a client waiting for a queued job hears the daemon is there (vspec gives
 * up after --timeout of silence), through a broker each of the broker's clients does, and a
 * connection that vanished shows up as unroutable. */
static void vs__heartbeat(vs_server *s, vs_client *c, double now) {
  double ivl = s->cfg.heartbeat_ivl_ms / 1000.0;
  for (vs_djob *j = c->jobs; j && !c->gone; j = j->lp.client_next) {
    if (now - vs__envelope_last(c, j) < ivl) continue;
    Vspec__Event ev = VSPEC__EVENT__INIT;
    Vspec__Heartbeat hb = VSPEC__HEARTBEAT__INIT;
    ev.body_case = VSPEC__EVENT__BODY_HEARTBEAT;
    ev.heartbeat = &hb;
    int rc = vs__send(s, c->sock, &j->lp.env, &ev, NULL, 0);
    if (rc == 0) {
      j->lp.last_event = now;
    } else if (rc == -EHOSTUNREACH) {
      vs_log(VSPEC_LOG_INFO, "server", "client %s is gone (heartbeat); cancelling its jobs",
             c->text);
      vs__client_lost(s, c);
    }
  }
}

static void vs__on_tick(uv_timer_t *h) {
  vs_server *s = h->data;
  double now = vs_now();
  int heartbeat = now - s->last_heartbeat >= s->cfg.heartbeat_ivl_ms / 1000.0;
  if (heartbeat) s->last_heartbeat = now;
  /* Collect first: finishing a job changes the table. */
  int cap = s->n_jobs, n = 0;
  vs_djob **all = cap ? malloc((size_t)cap * sizeof *all) : NULL;
  for (int b = 0; all && b < VS_BUCKETS; b++)
    for (vs_djob *j = s->jobs[b]; j && n < cap; j = j->lp.id_next) {
      vs_djob_retain(j);
      all[n++] = j;
    }
  for (int i = 0; i < n; i++) {
    vs_djob *j = all[i];
    if (j->lp.terminal_sent) continue;
    if (j->deadline > 0 && now >= j->deadline && !atomic_load(&j->cancel)) {
      char who[40];
      snprintf(who, sizeof who, "job %llu", (unsigned long long)j->id);
      vs_log(VSPEC_LOG_INFO, who, "deadline passed");
      if (vs_job_queue_remove(s->queue, j)) vs__finish_unstarted(s, j, VS_CANCEL_DEADLINE);
      else vs_djob_cancel(j, VS_CANCEL_DEADLINE);
      continue;
    }
    if (s->hard_cancel && !atomic_load(&j->cancel)) vs_djob_cancel(j, VS_CANCEL_DRAIN);
    if (j->lp.retry) vs__pump(s, j);
    /* Waiting jobs hear where they are in the queue when it changes. */
    if (heartbeat && j->progress && j->lp.credit > 0 && !j->lp.accepted_pending &&
        j->lp.client && !j->lp.client->gone) {
      int pos = vs_job_queue_position(s->queue, j);
      if (pos >= 0 && pos != j->lp.queued_reported) {
        Vspec__Event ev = VSPEC__EVENT__INIT;
        Vspec__Progress p = VSPEC__PROGRESS__INIT;
        p.has_round = p.has_queue_position = p.has_tokens_total = 1;
        p.round = -1;
        p.queue_position = (uint32_t)pos;
        p.tokens_total = (uint32_t)j->tokens_total;
        ev.body_case = VSPEC__EVENT__BODY_PROGRESS;
        ev.progress = &p;
        if (vs__job_send(s, j, &ev, NULL, 0) == 0) {
          j->lp.credit--;
          j->lp.queued_reported = pos;
        }
      }
    }
  }
  for (int i = 0; i < n; i++) vs_djob_release(all[i]);
  free(all);

  /* Terminal events that met a full queue: retry; a client that takes nothing for a whole
   * heartbeat timeout is treated as gone. */
  vs_djob *ob = s->outbox;
  s->outbox = NULL;
  while (ob) {
    vs_djob *j = ob;
    ob = j->lp.outbox_next;
    j->lp.outbox_next = NULL;
    int rc = vs__send_terminal(s, j);
    if (rc == -EAGAIN && now - j->lp.outbox_since < s->cfg.heartbeat_timeout_ms / 1000.0) {
      j->lp.outbox_next = s->outbox;
      s->outbox = j;
      continue;
    }
    if (rc == -EAGAIN && j->lp.client) {
      vs_log(VSPEC_LOG_INFO, "server", "client %s took nothing for %d ms: treated as gone",
             j->lp.client->text, s->cfg.heartbeat_timeout_ms);
      vs__client_lost(s, j->lp.client);
    }
    j->lp.in_outbox = 0;
    vs__job_unlink(s, j);
  }

  if (heartbeat)
    for (int b = 0; b < VS_BUCKETS; b++)
      for (vs_client *c = s->clients[b]; c; c = c->hnext) vs__heartbeat(s, c, now);
  vs__reap(s);

  if (s->draining && !s->hard_cancel && s->cfg.drain_timeout_ms >= 0 &&
      now - s->drain_started >= s->cfg.drain_timeout_ms / 1000.0 && s->n_jobs) {
    vs_log(VSPEC_LOG_WARN, "server", "drain timeout (%d ms): cancelling %d job(s)",
           s->cfg.drain_timeout_ms, s->n_jobs);
    s->hard_cancel = 1;
  }
  if (!s->n_jobs && !s->outbox && !s->draining) {
    uv_timer_stop(&s->tick);
    s->tick_running = 0;
  }
  vs__check_drained(s);
}

static void vs__start_tick(vs_server *s) {
  if (s->tick_running || s->stopping) return;
  s->tick_running = 1;
  uv_timer_start(&s->tick, vs__on_tick, VS_TICK_MS, VS_TICK_MS);
}

/* ---- shutdown ------------------------------------------------------------------------------- */

static void vs__watch_closed(vs_zwatch *w, void *user) {
  vs_server *s = user;
  (void)w;
  s->watches_open--;
}

static void vs__stop_loop(vs_server *s) {
  if (s->stopping) return;
  s->stopping = 1;
  vs_log(VSPEC_LOG_INFO, "server", "drained: stopping");
  /* Workers first: after they are joined nobody calls uv_async_send any more. */
  vs_job_queue_stop(s->queue);
  vs_workers_join(s->workers);
  s->workers = NULL;
  vs__drain_mail(s);
  uv_timer_stop(&s->tick);
  uv_close((uv_handle_t *)&s->tick, NULL);
  uv_close((uv_handle_t *)&s->async, NULL);
  uv_signal_stop(&s->sig_term);
  uv_signal_stop(&s->sig_int);
  uv_signal_stop(&s->sig_hup);
  uv_close((uv_handle_t *)&s->sig_term, NULL);
  uv_close((uv_handle_t *)&s->sig_int, NULL);
  uv_close((uv_handle_t *)&s->sig_hup, NULL);
  for (int i = 0; i < 2; i++) vs_zwatch_close(&s->watch[i], vs__watch_closed);
}

static void vs__check_drained(vs_server *s) {
  if (s->draining && !s->stopping && !s->n_jobs && !s->outbox && !s->reload) vs__stop_loop(s);
}

static void vs__begin_drain(vs_server *s, const char *why) {
  if (s->draining) {
    if (!s->hard_cancel) {
      vs_log(VSPEC_LOG_WARN, "server", "%s again: cancelling the running jobs", why);
      s->hard_cancel = 1;
    }
    vs__start_tick(s);
    return;
  }
  s->draining = 1;
  s->drain_started = vs_now();
  vs_fleet_agent_drain(s->fleet);
  vs_djob *q[4096];
  int n, total = 0;
  while ((n = vs_job_queue_take_all(s->queue, q, 4096)) > 0) {
    for (int i = 0; i < n; i++) {
      vs__finish_unstarted(s, q[i], VS_CANCEL_DRAIN);
      vs_djob_release(q[i]); /* the queue's reference */
    }
    total += n;
  }
  if (s->cfg.drain == VS_DRAIN_CANCEL) s->hard_cancel = 1;
  vs_log(VSPEC_LOG_INFO, "server", "%s: draining; %d waiting job(s) refused, %d running job(s) "
         "%s", why, total, s->n_jobs, s->hard_cancel ? "cancelled" : "finishing");
  vs__reap(s);
  vs__start_tick(s);
  vs__check_drained(s);
}

static void vs__on_signal(uv_signal_t *h, int signum) {
  vs_server *s = h->data;
  vs__begin_drain(s, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* SIGHUP's backends, one at a time: a backend reload reopens its models on the thread pool
 * (vs__reload_done starts the next). */
static void vs__hup_next_backend(vs_server *s) {
  while (!s->reload && !s->draining && s->hup_next < s->hup.n_backends) {
    const char *name = s->hup.backends[s->hup_next++];
    char err[VSPEC_ERRLEN];
    if (vs_registry_reload(s->reg, VSPEC_PLUGIN_BACKEND, name, err, sizeof err)) {
      vs_log(VSPEC_LOG_WARN, "server", "SIGHUP: backend %s: %s; the current generation stays",
             name, err);
      continue;
    }
    vs_reload_work *w = calloc(1, sizeof *w);
    if (!w) return;
    w->s = s;
    w->sock = -1;
    snprintf(w->backend, sizeof w->backend, "%s", name);
    w->req.data = w;
    s->reload = w;
    if (uv_queue_work(&s->loop, &w->req, vs__reload_work, vs__reload_done)) {
      s->reload = NULL;
      free(w);
    }
  }
}

/* SIGHUP (systemctl reload): the plugin directory again: new plugins loaded, changed ones
 * reloaded (docs/DESIGN.md, "Plugin loading rules"). Jobs keep the generations they hold. */
static void vs__on_sighup(uv_signal_t *h, int signum) {
  vs_server *s = h->data;
  if (s->draining) return;
  if (s->reload || s->hup_next < s->hup.n_backends) {
    vs_log(VSPEC_LOG_WARN, "server", "SIGHUP: a backend reload is still running; send it again "
           "once it is done");
    return;
  }
  vs_registry_refresh_report *r = &s->hup;
  if (vs_registry_refresh(s->reg, r)) {
    vs_log(VSPEC_LOG_WARN, "server", "SIGHUP: cannot read the plugin directory %s",
           vs_registry_dir(s->reg));
    return;
  }
  s->hup_next = 0;
  vs_log(VSPEC_LOG_INFO, "server", "SIGHUP: plugin directory scanned: %d new, %d reloaded, "
         "%d backend(s) to reload with their models, %d failed", r->loaded, r->reloaded,
         r->n_backends, r->failed);
  vs__hup_next_backend(s);
}

/* ---- setup -------------------------------------------------------------------------------- */

static int vs__setup_socket(vs_server *s, int which, const char *endpoint, int curve,
                            const char *secret, char *err, size_t errlen) {
  /* Unpredictable automatic routing ids (daemon/router.c says why). */
  void *z = vs_router_open(s->zctx, err, errlen);
  if (!z) return VSPEC_EIO;
  s->sock[which] = z;
  int one = 1, linger = 0;
  int64_t maxmsg = s->cfg.max_message_bytes;
  /* A vanished peer becomes EHOSTUNREACH and a full one EAGAIN instead of a silent drop. No
   * ZMTP heartbeats: their timer aborts libzmq 4.3.4 on a flooded connection that is reset;
   * TCP keepalive and TCP_USER_TIMEOUT close dead connections instead, and the Heartbeat
   * events of the tick turn them into lost clients (daemon/router.c). */
  if (zmq_setsockopt(z, ZMQ_ROUTER_MANDATORY, &one, sizeof one) ||
      zmq_setsockopt(z, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
      zmq_setsockopt(z, ZMQ_LINGER, &linger, sizeof linger) ||
      vs_tcp_liveness(z, s->cfg.heartbeat_ivl_ms, s->cfg.heartbeat_timeout_ms)) {
    snprintf(err, errlen, "socket options: %s", zmq_strerror(errno));
    return VSPEC_EIO;
  }
  if (curve) {
    if (zmq_setsockopt(z, ZMQ_CURVE_SERVER, &one, sizeof one) ||
        zmq_setsockopt(z, ZMQ_CURVE_SECRETKEY, secret, 40) ||
        zmq_setsockopt(z, ZMQ_ZAP_DOMAIN, "vspec", 5)) {
      snprintf(err, errlen, "CURVE options: %s", zmq_strerror(errno));
      return VSPEC_EIO;
    }
  }
  /* An ipc admin socket is for this user (and its group) only, from the moment it exists:
   * libzmq creates the socket file inside zmq_bind, on this thread, so a umask around it
   * leaves no window with a wider mode (workers do not create files at this point). */
  int admin_file = which == VS_SOCK_ADMIN && !strncmp(endpoint, "ipc://", 6) &&
                   endpoint[6] != '@';
  mode_t old_mask = admin_file ? umask(0117) : 0;
  int bound = zmq_bind(z, endpoint);
  int bind_errno = errno;
  if (admin_file) umask(old_mask);
  if (bound) {
    snprintf(err, errlen, "cannot bind %s: %s", endpoint, zmq_strerror(bind_errno));
    return VSPEC_EIO;
  }
  if (admin_file && chmod(endpoint + 6, 0660)) {
    snprintf(err, errlen, "cannot make the admin socket %s mode 0660: %s", endpoint + 6,
             strerror(errno));
    return VSPEC_EIO;
  }
  if (vs_zwatch_start(&s->loop, &s->watch[which], z, vs__on_read, s)) {
    snprintf(err, errlen, "cannot watch %s in the event loop", endpoint);
    return VSPEC_EIO;
  }
  s->watches_open++;
  return VSPEC_OK;
}

/* Binding an ipc path takes it over from whoever serves it now: a second daemon started with
 * the same paths would silently steal the first one's clients. Checked before anything is
 * loaded, so the mistake costs no model load. */
static int vs__endpoints_free(const vs_daemon_config *cfg, char *err, size_t errlen) {
  const char *eps[2] = {cfg->endpoint, cfg->admin_endpoint};
  char perr[300];
  for (int i = 0; i < 2; i++)
    if (!strncmp(eps[i], "ipc://", 6) && vs_endpoint_probe(eps[i], 500, perr, sizeof perr) == 1) {
      snprintf(err, errlen, "another process serves %s (a vspecd already running?): stop it, "
               "or give this daemon other paths", eps[i]);
      return VSPEC_EIO;
    }
  return VSPEC_OK;
}

int vs_server_open(const vs_daemon_config *cfg, vs_server **out, char *err, size_t errlen) {
  *out = NULL;
  int busy = vs__endpoints_free(cfg, err, errlen);
  if (busy) return busy;
  vs_server *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  s->cfg = *cfg;
  s->started_at = s->last_heartbeat = vs_now();
  pthread_mutex_init(&s->mail_mu, NULL);
  uv_loop_init(&s->loop);
  int rc;
  vs_host_init(&s->host, vs_cpu_ops());
  /* Models load on the configured device ([device]); the workers' devices share its memory
   * space. A device that cannot be opened (no GPU, wrong index) stops the start here. */
  char spec[32];
  vs_config_device_spec(cfg, spec, sizeof spec);
  vs_device_options dopt = {.threads = 1, .precision = cfg->device_precision,
                            .memory_limit = (size_t)cfg->device_memory_mb << 20};
  char inner[VSPEC_ERRLEN] = "";
  if ((rc = vs_device_open(spec, &dopt, &s->load_dev, inner, sizeof inner))) {
    snprintf(err, errlen, "[device] %s: %s", spec, inner);
    goto fail;
  }
  {
    vs_device_info di;
    vs_dev_info(s->load_dev, &di);
    vs_log(VSPEC_LOG_INFO, "server", "device %s (%s weights)", di.name,
           di.precision == VS_PRECISION_BF16 ? "bf16" : "fp32");
  }
  if ((rc = vs_registry_open(cfg->plugin_dir, &s->host, &s->reg, err, errlen))) goto fail;
  int bad = vs_registry_scan(s->reg);
  if (bad) vs_log(VSPEC_LOG_WARN, "server", "%d plugin(s) in %s failed to load", bad,
                  cfg->plugin_dir);
  if ((rc = vs_model_table_open(s->reg, &s->host, s->load_dev, cfg, &s->models, err, errlen)))
    goto fail;
  {
    /* The default model may not exist yet (models/fmnist is trained separately): then jobs
     * that name no model go to the first model that did load. */
    vs_model_status ms[VS_CONF_MAX_MODELS];
    int nm = vs_model_table_status(s->models, ms, VS_CONF_MAX_MODELS), def_ok = 0, first = -1;
    for (int i = 0; i < nm; i++) {
      if (ms[i].loaded && first < 0) first = i;
      if (ms[i].loaded && !strcmp(ms[i].name, s->cfg.default_model)) def_ok = 1;
    }
    if (!def_ok && first >= 0) {
      vs_log(VSPEC_LOG_WARN, "server", "default model '%s' is not available: using '%s'",
             s->cfg.default_model, ms[first].name);
      snprintf(s->cfg.default_model, sizeof s->cfg.default_model, "%s", ms[first].name);
    }
  }
  s->submit = (vs_submit_ctx){.cfg = &s->cfg, .models = s->models, .reg = s->reg,
                              .host = &s->host};
  if ((rc = vs_job_queue_open(cfg->queue_size, cfg->workers, &s->queue))) {
    snprintf(err, errlen, "out of memory");
    goto fail;
  }
  uv_async_init(&s->loop, &s->async, vs__on_async);
  s->async.data = s;
  vs_workers_config wc = {.count = cfg->workers, .threads = cfg->threads, .queue = s->queue,
                          .models = s->models, .reg = s->reg, .post = vs__post,
                          .post_user = s, .node = s->cfg.node, .device_options = dopt};
  snprintf(wc.device, sizeof wc.device, "%s", spec);
  if ((rc = vs_workers_start(&wc, &s->workers, err, errlen))) goto fail;
  uv_timer_init(&s->loop, &s->tick);
  s->tick.data = s;
  uv_signal_init(&s->loop, &s->sig_term);
  uv_signal_init(&s->loop, &s->sig_int);
  uv_signal_init(&s->loop, &s->sig_hup);
  s->sig_term.data = s->sig_int.data = s->sig_hup.data = s;
  uv_signal_start(&s->sig_term, vs__on_signal, SIGTERM);
  uv_signal_start(&s->sig_int, vs__on_signal, SIGINT);
  uv_signal_start(&s->sig_hup, vs__on_sighup, SIGHUP);

  s->zctx = zmq_ctx_new();
  if (!s->zctx) {
    snprintf(err, errlen, "zmq_ctx_new failed");
    rc = VSPEC_EIO;
    goto fail;
  }
  char secret[41] = "";
  if (cfg->curve) {
    if ((rc = vs_curve_read_key(cfg->curve_secret_file, "secret", secret, err, errlen))) goto fail;
    /* The handler must be bound before the job socket takes connections. */
    if ((rc = vs_zap_start(s->zctx, cfg->curve_allow_file, &s->zap, err, errlen))) goto fail;
  }
  if ((rc = vs__setup_socket(s, VS_SOCK_JOB, cfg->endpoint, cfg->curve, secret, err, errlen)))
    goto fail;
  if ((rc = vs__setup_socket(s, VS_SOCK_ADMIN, cfg->admin_endpoint, 0, NULL, err, errlen)))
    goto fail;
  if (cfg->fleet_redis[0]) {
    /* The agent is a client of this daemon over inproc (daemon/fleet_agent.h says why). */
    static const char fleet_ep[] = "inproc://vspecd-fleet";
    if (zmq_bind(s->sock[VS_SOCK_JOB], fleet_ep)) {
      snprintf(err, errlen, "cannot bind %s: %s", fleet_ep, zmq_strerror(errno));
      rc = VSPEC_EIO;
      goto fail;
    }
    if ((rc = vs_fleet_agent_start(&s->cfg, s->zctx, fleet_ep, &s->fleet, err, errlen)))
      goto fail;
    vs_fleet_addr fa; /* for the log: where, never the password */
    char where[400];
    vs_fleet_addr_parse(cfg->fleet_redis, &fa, where, sizeof where);
    if (fa.path[0]) snprintf(where, sizeof where, "%s", fa.path);
    else snprintf(where, sizeof where, "%s:%d", fa.host, fa.port);
    vs_log(VSPEC_LOG_INFO, "server", "%s: fleet mode, jobs from redis at %s (stream %s, group %s)",
           cfg->node, where, cfg->fleet_stream, cfg->fleet_group);
  }
  vs_log(VSPEC_LOG_INFO, "server", "%s: jobs on %s%s, admin on %s, plugins from %s", cfg->node,
         cfg->endpoint, cfg->curve ? " (CURVE)" : "", cfg->admin_endpoint, cfg->plugin_dir);
  *out = s;
  return VSPEC_OK;
fail:
  vs_server_close(s);
  return rc ? rc : VSPEC_EIO;
}

int vs_server_run(vs_server *s) {
  uv_run(&s->loop, UV_RUN_DEFAULT);
  return s->exit_code;
}

static void vs__walk_close(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

void vs_server_close(vs_server *s) {
  if (!s) return;
  /* First: it writes the events this daemon already sent, and must not lose its socket. */
  vs_fleet_agent_stop(&s->fleet);
  if (s->queue) vs_job_queue_stop(s->queue);
  vs_workers_join(s->workers);
  s->workers = NULL;
  if (s->async.data) vs__drain_mail(s);
  /* After a failed open, or anything left: close every handle and let the loop finish. */
  uv_walk(&s->loop, vs__walk_close, NULL);
  uv_run(&s->loop, UV_RUN_DEFAULT);
  uv_loop_close(&s->loop);
  for (int b = 0; b < VS_BUCKETS; b++) {
    while (s->jobs[b]) {
      vs_djob *j = s->jobs[b];
      s->jobs[b] = j->lp.id_next;
      vs_djob_release(j);
    }
    while (s->clients[b]) {
      vs_client *c = s->clients[b];
      s->clients[b] = c->hnext;
      free(c);
    }
  }
  for (int i = 0; i < 2; i++) {
    if (!s->sock[i]) continue;
    /* Bounded linger: final events get a moment to leave, the exit is never blocked. */
    int linger = s->cfg.linger_ms;
    zmq_setsockopt(s->sock[i], ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(s->sock[i]);
  }
  vs_zap_stop(s->zap);
  if (s->zctx) zmq_ctx_term(s->zctx);
  vs_job_queue_close(s->queue);
  vs_model_table_close(s->models);
  vs_registry_close(s->reg);
  if (s->load_dev) vs_dev_destroy(s->load_dev);
  pthread_mutex_destroy(&s->mail_mu);
  free(s);
}
