#include "fleet/fleet_agent.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/metrics.h" /* vs_now */
#include "client/conn.h"
#include "core/log.h"
#include "fleet/fleet_config.h"
#include "fleet/fleet_event.h"
#include "fleet/fleet_queue.h"
#include "vspec/types.h"

#define VS_AGENT_MAX_SLOTS 64
#define VS_AGENT_STOP_GRACE_S 3.0 /* what stop waits for events already sent */
#define VS_AGENT_STALE_MAX 8      /* lost jobs looked at per sweep */

/* One job this daemon holds. */
typedef enum {
  VS__FREE = 0,
  VS__WAITING,  /* the daemon said busy: submit again at retry_at */
  VS__RUNNING,  /* submitted; events flow */
  VS__FINISHING /* its terminal event (kept in `terminal`) still has to reach Redis, or the ack */
} agent_slot_state;

typedef struct agent_slot {
  agent_slot_state state;
  vs_fleet_job job;
  uint64_t fleet_id;  /* the job id clients know (the fleet job id, a decimal) */
  uint64_t request_id, local_id; /* in the daemon: the submit's request id, then its job id */
  uint64_t seq;
  double retry_at;
  double submitted_at; /* handed to the daemon; its Accepted (or an error) is due at once */
  int cancel_sent;
  int warned; /* a failure to finish it was logged */
  int lost; /* claimed by another daemon meanwhile: our events are no longer the job's */
  unsigned char *terminal; /* the encoded terminal event, until it is in Redis */
  size_t terminal_len;
  int terminal_written;
} agent_slot;

struct vs_fleet_agent {
  const vs_daemon_config *cfg;
  vs_fleet_queue *q;
  vs_conn conn;
  pthread_t thread;
  int started;
  atomic_int draining, stopping;
  agent_slot slot[VS_AGENT_MAX_SLOTS];
  int n_slots;
  /* Redis unreachable: no command before redis_retry_at; backoff doubles up to 5 s */
  double redis_retry_at, backoff_s;
  int redis_down;
  double next_touch, next_cancel_poll, next_sweep;
};

static const char *agent_who = "fleet";

/* ---- Redis health ------------------------------------------------------------------------- */

static int agent_redis_ok(const vs_fleet_agent *a) { return vs_now() >= a->redis_retry_at; }

/* After a Redis call: a lost connection starts (or extends) the backoff; anything else is the
 * command's own problem. Returns rc. */
static int agent_redis_result(vs_fleet_agent *a, int rc, const char *err) {
  if (rc == VSPEC_EIO) {
    if (!a->redis_down)
      vs_log(VSPEC_LOG_WARN, agent_who, "redis unreachable, retrying with a backoff: %s", err);
    a->redis_down = 1;
    a->backoff_s = a->backoff_s > 0 ? a->backoff_s * 2 : 0.1;
    if (a->backoff_s > 5) a->backoff_s = 5;
    a->redis_retry_at = vs_now() + a->backoff_s;
  } else if (rc >= 0 && a->redis_down) {
    vs_log(VSPEC_LOG_INFO, agent_who, "redis reachable again");
    a->redis_down = 0;
    a->backoff_s = 0;
  }
  return rc;
}

/* ---- events to Redis ---------------------------------------------------------------------- */

static void agent_free_slot(agent_slot *s) {
  vs_fleet_job_clear(&s->job);
  free(s->terminal);
  memset(s, 0, sizeof *s);
}

/* Writes one event of the slot's job (job id, request id and seq made the fleet's). */
static int agent_encode(agent_slot *s, Vspec__Event *ev, const vs_conn_event *e,
                        unsigned char **out, size_t *len) {
  ev->has_job_id = 1;
  ev->job_id = s->fleet_id;
  ev->has_request_id = 0;
  ev->has_seq = 1;
  ev->seq = s->seq++;
  const void *data[VS_WIRE_MAX_BLOBS];
  size_t size[VS_WIRE_MAX_BLOBS];
  int n = e ? e->msg.n_blobs : 0;
  for (int i = 0; i < n; i++) {
    data[i] = zmq_msg_data((zmq_msg_t *)&e->msg.blobs[i]);
    size[i] = zmq_msg_size((zmq_msg_t *)&e->msg.blobs[i]);
  }
  return vs_fleet_event_encode(ev, data, size, n, out, len);
}

static int agent_append(vs_fleet_agent *a, agent_slot *s, const unsigned char *v, size_t len) {
  char err[VSPEC_ERRLEN];
  int rc = agent_redis_result(a, vs_fleet_event_append(a->q, s->job.job_id, v, len, NULL, err,
                                                       sizeof err), err);
  if (rc && rc != VSPEC_EIO && !s->warned)
    vs_log(VSPEC_LOG_ERROR, agent_who, "[job %s] cannot write an event: %s", s->job.job_id, err);
  return rc;
}

/* An event made here (restarted, poison, cancelled before it ran). */
static int agent_append_own(vs_fleet_agent *a, agent_slot *s, Vspec__Event *ev) {
  ev->version = VSPEC__PROTOCOL_VERSION__PROTOCOL_V1;
  unsigned char *v;
  size_t len;
  int rc = agent_encode(s, ev, NULL, &v, &len);
  if (rc) return rc;
  rc = agent_append(a, s, v, len);
  free(v);
  return rc;
}

/* The terminal event is written, then the job acked: both retried until they succeed (or
 * the job turns out to be another daemon's), so a finished job is never left pending. */
static void agent_finish(vs_fleet_agent *a, agent_slot *s) {
  char err[VSPEC_ERRLEN];
  if (s->lost) {
    agent_free_slot(s);
    return;
  }
  double now = vs_now();
  if (!agent_redis_ok(a) || now < s->retry_at) return;
  /* Any failure, a refusal (OOM, READONLY after a failover, LOADING, MISCONF) as much as a
   * lost connection, is tried again a second later: the slot keeps the job, and its claim
   * stays refreshed, until its terminal event is in Redis and the job is acked. */
  int rc = 0;
  if (!s->terminal_written && s->terminal) rc = agent_append(a, s, s->terminal, s->terminal_len);
  if (rc >= 0) {
    s->terminal_written = 1;
    rc = agent_redis_result(a, vs_fleet_ack(a->q, s->job.entry_id, err, sizeof err), err);
    if (rc < 0 && rc != VSPEC_EIO && !s->warned)
      vs_log(VSPEC_LOG_ERROR, agent_who, "[job %s] ack: %s (trying again every second)",
             s->job.job_id, err);
  }
  if (rc < 0) {
    s->warned = 1;
    s->retry_at = now + 1;
    return;
  }
  vs_log(VSPEC_LOG_DEBUG, agent_who, "[job %s] done and acked", s->job.job_id);
  agent_free_slot(s);
}

/* Ends a job here with an error event of our own (poison, cancelled, malformed payload). */
static void agent_fail(vs_fleet_agent *a, agent_slot *s, int code, const char *msg) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Error er = VSPEC__ERROR__INIT;
  er.code = code;
  er.message = (char *)msg;
  ev.version = VSPEC__PROTOCOL_VERSION__PROTOCOL_V1;
  ev.body_case = VSPEC__EVENT__BODY_ERROR;
  ev.error = &er;
  s->state = VS__FINISHING;
  if (agent_encode(s, &ev, NULL, &s->terminal, &s->terminal_len)) {
    s->terminal = NULL;
    s->terminal_written = 1; /* out of memory: ack anyway, the job cannot be run */
  }
  agent_finish(a, s);
}

/* ---- jobs to the daemon ------------------------------------------------------------------- */

/* splitmix64: a job without a seed gets one derived from its fleet id, so that every delivery
 * of it draws the same image. */
static uint64_t agent_seed_of(uint64_t id) {
  uint64_t z = id + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Gateways name jobs by a decimal id; any other name (a job enqueued by something else) gets
 * a stable number from its name, so its events and its seed are the same each time. */
static uint64_t agent_fleet_id_of(const char *job_id) {
  char *end;
  uint64_t id = strtoull(job_id, &end, 10);
  if (!*end && id) return id;
  uint64_t h = 1469598103934665603ull;
  for (const char *c = job_id; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  return (h >> 1) | 1;
}

static void agent_submit(vs_fleet_agent *a, agent_slot *s) {
  char err[VSPEC_ERRLEN];
  const unsigned char *frame[VS_FLEET_MAX_FRAMES];
  size_t size[VS_FLEET_MAX_FRAMES];
  int n;
  if (vs_fleet_frames_decode("VSR1", s->job.payload, s->job.payload_len, frame, size, &n, err,
                             sizeof err)) {
    agent_fail(a, s, VSPEC__ERROR_CODE__ERR_MALFORMED, err);
    return;
  }
  vs_wire_alloc al;
  vs_wire_alloc_init(&al, (size_t)a->cfg->unpack_budget_bytes);
  Vspec__Request *r = vspec__request__unpack(&al.base, size[0], frame[0]);
  if (!r || r->body_case != VSPEC__REQUEST__BODY_SUBMIT || n - 1 > VS_WIRE_REQUEST_BLOBS) {
    if (r) vspec__request__free_unpacked(r, &al.base);
    agent_fail(a, s, VSPEC__ERROR_CODE__ERR_MALFORMED,
               "the job's payload is not a vspec.Request with a submit");
    return;
  }
  if (!r->submit->has_seed) {
    r->submit->has_seed = 1;
    r->submit->seed = agent_seed_of(s->fleet_id);
  }
  /* Gateways allow a client more credit than a daemon may (they hold the events in Redis);
   * the agent returns credit for every event it writes, so the daemon's bound is enough. */
  if (r->submit->has_credit && r->submit->credit > (uint32_t)a->cfg->max_credit)
    r->submit->credit = (uint32_t)a->cfg->max_credit;
  /* The connection numbers every request, cancels and credits included, so that an answer
   * to one of those can never be taken for the submit's. */
  r->has_request_id = 0;
  /* The daemon refuses an oversized message without parsing it, so without a request id to
   * answer with: the job would wait for an answer that never comes. Checked here instead
   * (the seed added above makes a request a few bytes longer than the gateway saw). */
  size_t body = vspec__request__get_packed_size(r) + 12; /* + the request id */
  int too_big = body > (size_t)a->cfg->max_request_bytes;
  for (int i = 1; i < n; i++) too_big |= size[i] > (size_t)a->cfg->max_message_bytes;
  if (too_big || (size_t)(n - 1) != r->n_blobs) {
    vspec__request__free_unpacked(r, &al.base);
    char msg[200];
    snprintf(msg, sizeof msg, "the job's request (%zu bytes) or a blob is over this daemon's "
             "limits ([limits] max_request_bytes %ld, max_message_bytes %ld), or its blobs "
             "do not match their descriptors", body, a->cfg->max_request_bytes,
             a->cfg->max_message_bytes);
    agent_fail(a, s, too_big ? VSPEC__ERROR_CODE__ERR_TOO_LARGE : VSPEC__ERROR_CODE__ERR_MALFORMED,
               msg);
    return;
  }
  vs_wire_blob blobs[VS_WIRE_MAX_BLOBS];
  for (int i = 1; i < n; i++)
    blobs[i - 1] = (vs_wire_blob){.kind = r->n_blobs >= (size_t)i ? r->blobs[i - 1]->kind : 0,
                                  .data = (void *)frame[i], .size = size[i]};
  int rc = vs_conn_send(&a->conn, r, blobs, n - 1, err, sizeof err);
  s->request_id = r->request_id;
  vspec__request__free_unpacked(r, &al.base);
  if (rc) {
    vs_log(VSPEC_LOG_ERROR, agent_who, "[job %s] cannot hand it to the daemon: %s",
           s->job.job_id, err);
    s->state = VS__WAITING;
    s->retry_at = vs_now() + 1;
    return;
  }
  s->state = VS__RUNNING;
  s->submitted_at = vs_now();
}

/* A job just read or claimed: refused here (poison, malformed, already cancelled), or run. */
static void agent_take(vs_fleet_agent *a, agent_slot *s) {
  char err[VSPEC_ERRLEN], msg[256];
  const vs_fleet_job *j = &s->job;
  if (j->malformed) {
    vs_log(VSPEC_LOG_WARN, agent_who, "entry %s of the jobs stream is not a job: acked and dropped",
           j->entry_id);
    agent_redis_result(a, vs_fleet_ack(a->q, j->entry_id, err, sizeof err), err);
    agent_free_slot(s);
    return;
  }
  s->fleet_id = agent_fleet_id_of(j->job_id);
  if (j->deliveries > a->cfg->fleet_max_deliveries) {
    snprintf(msg, sizeof msg, "poison job: delivered %lld times, and each daemon that ran it "
             "stopped before it ended ([fleet] max_deliveries = %d)", j->deliveries,
             a->cfg->fleet_max_deliveries);
    vs_log(VSPEC_LOG_WARN, agent_who, "[job %s] %s", j->job_id, msg);
    agent_fail(a, s, VSPEC__ERROR_CODE__ERR_INTERNAL, msg);
    return;
  }
  const char *id = j->job_id;
  int cancelled = 0;
  /* its events and its id live events_ttl from now: the job may have waited long */
  agent_redis_result(a, vs_fleet_job_keepalive(a->q, j->job_id, err, sizeof err), err);
  if (agent_redis_result(a, vs_fleet_cancel_check(a->q, &id, 1, &cancelled, err, sizeof err),
                         err) > 0) {
    agent_fail(a, s, VSPEC__ERROR_CODE__ERR_CANCELLED, "cancelled before it started");
    return;
  }
  if (j->deliveries > 1) {
    Vspec__Event ev = VSPEC__EVENT__INIT;
    Vspec__Restarted rs = VSPEC__RESTARTED__INIT;
    rs.has_delivery = 1;
    rs.delivery = (uint32_t)j->deliveries;
    rs.node = (char *)a->cfg->node;
    ev.body_case = VSPEC__EVENT__BODY_RESTARTED;
    ev.restarted = &rs;
    agent_append_own(a, s, &ev);
    vs_log(VSPEC_LOG_INFO, agent_who, "[job %s] run again (delivery %lld)", j->job_id,
           j->deliveries);
  }
  agent_submit(a, s);
}

static agent_slot *agent_free_one(vs_fleet_agent *a) {
  for (int i = 0; i < a->n_slots; i++)
    if (a->slot[i].state == VS__FREE) return &a->slot[i];
  return NULL;
}

/* ---- lost runs ---------------------------------------------------------------------------- */

/* 1 while one of this daemon's slots holds the entry. */
static int agent_holds(const vs_fleet_agent *a, const char *entry_id) {
  for (int i = 0; i < a->n_slots; i++)
    if (a->slot[i].state != VS__FREE && !strcmp(a->slot[i].job.entry_id, entry_id)) return 1;
  return 0;
}

/* The Phase "waiting" that tells a job's client its run stopped (`what`: why) and when the
 * next one should start: at the next sweep of a free daemon, every heartbeat_ms. `sure`: this
 * daemon takes the job itself now; else every daemon may be busy. Encoded for the job's event
 * stream; 0 or VSPEC_ENOMEM. */
static int agent_waiting_event(const vs_fleet_agent *a, const char *job_id, const char *what,
                               long long deliveries, int sure, unsigned char **out,
                               size_t *len) {
  const vs_daemon_config *c = a->cfg;
  char msg[400];
  int n = (c->fleet_heartbeat_ms + 999) / 1000;
  if (deliveries >= c->fleet_max_deliveries)
    snprintf(msg, sizeof msg, "%s; the job was delivered %lld times ([fleet] max_deliveries = "
             "%d): it ends with an error within %d s", what, deliveries, c->fleet_max_deliveries,
             n);
  else
    snprintf(msg, sizeof msg, "%s; the job restarts on another daemon within %d s%s", what, n,
             sure ? "" : ", or once one is free");
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Phase ph = VSPEC__PHASE__INIT;
  ph.name = "waiting";
  ph.message = msg;
  ph.has_eta_s = 1;
  ph.eta_s = c->fleet_heartbeat_ms / 1000.0;
  ev.version = VSPEC__PROTOCOL_VERSION__PROTOCOL_V1;
  ev.has_job_id = 1;
  ev.job_id = agent_fleet_id_of(job_id);
  ev.body_case = VSPEC__EVENT__BODY_PHASE;
  ev.phase = &ph;
  return vs_fleet_event_encode(&ev, NULL, NULL, 0, out, len);
}

/* Tells the client of a lost run, unless someone did already (the queue's mark makes it once
 * per run, whichever daemon sees it first). Returns the announce's status. */
static int agent_announce(vs_fleet_agent *a, const vs_fleet_stale_job *st, int sure) {
  char err[VSPEC_ERRLEN], what[160];
  snprintf(what, sizeof what, "daemon %s lost (no heartbeat for %.1f s)", st->consumer,
           st->idle_ms / 1000.0);
  unsigned char *v;
  size_t len;
  if (agent_waiting_event(a, st->job_id, what, st->deliveries, sure, &v, &len)) return VSPEC_ENOMEM;
  int rc = agent_redis_result(a, vs_fleet_announce_loss(a->q, st, a->cfg->fleet_claim_idle_ms, v,
                                                        len, err, sizeof err), err);
  free(v);
  if (rc > 0)
    vs_log(VSPEC_LOG_INFO, agent_who, "[job %s] %s: its client is told, the job runs again",
           st->job_id, what);
  else if (rc < 0 && rc != VSPEC_EIO)
    vs_log(VSPEC_LOG_WARN, agent_who, "[job %s] cannot announce the loss of its run: %s",
           st->job_id, err);
  return rc;
}

/* A job this daemon leaves without running it (it drains): its client is told, and the entry
 * is made claimable at once instead of after the claim time. Best effort: without Redis, the
 * other daemons announce it once it has been idle for the claim time. */
static void agent_release(vs_fleet_agent *a, const agent_slot *s) {
  char err[VSPEC_ERRLEN], what[160];
  snprintf(what, sizeof what, "daemon %s is stopping", a->cfg->node);
  unsigned char *v;
  size_t len;
  if (!agent_redis_ok(a) ||
      agent_waiting_event(a, s->job.job_id, what, s->job.deliveries, 0, &v, &len))
    return;
  int rc = agent_redis_result(a, vs_fleet_release(a->q, s->job.entry_id, s->job.job_id,
                                                  s->job.deliveries, a->cfg->fleet_claim_idle_ms,
                                                  v, len, err, sizeof err), err);
  free(v);
  if (rc < 0 && rc != VSPEC_EIO)
    vs_log(VSPEC_LOG_WARN, agent_who, "[job %s] cannot hand it over at once: %s", s->job.job_id,
           err);
}

/* Every heartbeat, busy or not: jobs idle for the claim time are lost runs. Each one's client
 * is told (by whichever daemon sees it first), and a daemon with a free slot takes the job
 * over. Returns how many jobs this daemon took. */
static int agent_sweep(vs_fleet_agent *a) {
  char err[VSPEC_ERRLEN];
  vs_fleet_stale_job st[VS_AGENT_STALE_MAX];
  long long claim = a->cfg->fleet_claim_idle_ms;
  int n = agent_redis_result(a, vs_fleet_stale(a->q, claim, st, VS_AGENT_STALE_MAX, err,
                                               sizeof err), err);
  if (n == VS_FLEET_EREDIS && strstr(err, "NOGROUP")) {
    /* Redis restarted empty (no persistence): the group is made again, as a read does */
    agent_redis_result(a, vs_fleet_ensure_group(a->q, err, sizeof err), err);
    return 0;
  }
  if (n < 0 && n != VSPEC_EIO) {
    vs_log(VSPEC_LOG_ERROR, agent_who, "looking for lost jobs: %s", err);
    a->redis_retry_at = vs_now() + 1;
  }
  int taken = 0;
  for (int i = 0; i < n && agent_redis_ok(a); i++) {
    /* One of ours, idle because Redis was away: we still run it unless its refresh finds it
     * announced or claimed (agent_touch_and_poll); never a second time here. */
    if (agent_holds(a, st[i].entry_id)) continue;
    agent_slot *s = a->draining ? NULL : agent_free_one(a);
    /* an entry without a job has no client to tell: taken over, it is acked and dropped */
    if (st[i].job_id[0] && agent_announce(a, &st[i], s != NULL) < 0) continue;
    if (!s) continue;
    int rc = agent_redis_result(a, vs_fleet_claim(a->q, st[i].entry_id, claim, &s->job, err,
                                                  sizeof err), err);
    if (rc < 0 && rc != VSPEC_EIO)
      vs_log(VSPEC_LOG_ERROR, agent_who, "taking over entry %s: %s", st[i].entry_id, err);
    if (rc <= 0) continue;
    if (s->job.deliveries == 0) { /* acked in between (its old daemon finished after all) */
      vs_fleet_job_clear(&s->job);
      continue;
    }
    agent_take(a, s);
    taken++;
  }
  return taken;
}

/* New jobs while a slot is free: lost ones first (the sweep), then ones never delivered. */
static void agent_fetch(vs_fleet_agent *a, int block_ms) {
  char err[VSPEC_ERRLEN];
  double now = vs_now();
  agent_slot *s;
  if (agent_redis_ok(a) && now >= a->next_sweep) {
    a->next_sweep = now + a->cfg->fleet_heartbeat_ms / 1000.0;
    if (agent_sweep(a)) block_ms = 0; /* a job to look after now */
  }
  /* an idle daemon's blocking read must not put off its next sweep */
  int to_sweep = (int)((a->next_sweep - now) * 1000) + 1;
  if (block_ms > to_sweep) block_ms = to_sweep;
  while (!a->draining && agent_redis_ok(a) && (s = agent_free_one(a))) {
    int rc = agent_redis_result(a, vs_fleet_read(a->q, block_ms, &s->job, err, sizeof err), err);
    block_ms = 0;
    if (rc == VS_FLEET_EREDIS && strstr(err, "NOGROUP")) {
      /* Redis restarted empty (no persistence): the group is made again. */
      rc = agent_redis_result(a, vs_fleet_ensure_group(a->q, err, sizeof err), err);
      if (!rc) continue;
    }
    if (rc < 0 && rc != VSPEC_EIO) {
      vs_log(VSPEC_LOG_ERROR, agent_who, "reading the jobs stream: %s", err);
      a->redis_retry_at = vs_now() + 1;
    }
    if (rc <= 0) break;
    if (s->job.deliveries == 0) {
      vs_fleet_job_clear(&s->job);
      continue;
    }
    agent_take(a, s);
  }
}

/* ---- events from the daemon --------------------------------------------------------------- */

static agent_slot *agent_slot_of(vs_fleet_agent *a, const Vspec__Event *ev) {
  for (int i = 0; i < a->n_slots; i++) {
    agent_slot *s = &a->slot[i];
    if (s->state != VS__RUNNING) continue;
    if (s->local_id && ev->has_job_id && ev->job_id == s->local_id) return s;
    if (ev->has_request_id && ev->request_id == s->request_id) return s;
  }
  return NULL;
}

static void agent_send_small(vs_fleet_agent *a, int cancel, uint64_t job, uint32_t grant) {
  char err[VSPEC_ERRLEN];
  Vspec__Request r = VSPEC__REQUEST__INIT;
  Vspec__Cancel c = VSPEC__CANCEL__INIT;
  Vspec__Credit cr = VSPEC__CREDIT__INIT;
  if (cancel) {
    c.job_id = job;
    r.body_case = VSPEC__REQUEST__BODY_CANCEL;
    r.cancel = &c;
  } else {
    cr.job_id = job;
    cr.grant = grant;
    r.body_case = VSPEC__REQUEST__BODY_CREDIT;
    r.credit = &cr;
  }
  if (vs_conn_send(&a->conn, &r, NULL, 0, err, sizeof err))
    vs_log(VSPEC_LOG_WARN, agent_who, "to the daemon: %s", err);
}

static void agent_on_event(vs_fleet_agent *a, vs_conn_event *e) {
  Vspec__Event *ev = e->ev;
  if (ev->body_case == VSPEC__EVENT__BODY_HEARTBEAT || ev->body_case == VSPEC__EVENT__BODY_ACK)
    return;
  agent_slot *s = agent_slot_of(a, ev);
  if (!s) return;
  int terminal = ev->body_case == VSPEC__EVENT__BODY_RESULT ||
                 ev->body_case == VSPEC__EVENT__BODY_ERROR;
  /* Not verdicts on the job: this daemon cannot run it now. Draining (the job may have
   * been queued here already): leave it pending, another daemon claims it once it is idle
   * and runs it (a restarted event says so). Busy: ask again later. */
  if (ev->body_case == VSPEC__EVENT__BODY_ERROR &&
      ev->error->code == VSPEC__ERROR_CODE__ERR_SHUTTING_DOWN) {
    vs_log(VSPEC_LOG_INFO, agent_who, "[job %s] left to another daemon: this one is draining",
           s->job.job_id);
    if (!s->lost) agent_release(a, s);
    agent_free_slot(s);
    return;
  }
  if (ev->body_case == VSPEC__EVENT__BODY_ERROR && !s->local_id &&
      ev->error->code == VSPEC__ERROR_CODE__ERR_BUSY) {
    if (s->lost) { /* another daemon has it now */
      agent_free_slot(s);
      return;
    }
    s->state = VS__WAITING;
    s->retry_at = vs_now() + (ev->error->retry_after_ms ? ev->error->retry_after_ms : 500) / 1e3;
    return;
  }
  if (ev->body_case == VSPEC__EVENT__BODY_ACCEPTED && ev->has_job_id) s->local_id = ev->job_id;
  uint64_t local = s->local_id;
  int progress = ev->body_case == VSPEC__EVENT__BODY_PROGRESS ||
                 ev->body_case == VSPEC__EVENT__BODY_PREVIEW;
  if (s->lost) {
    if (terminal) agent_free_slot(s);
    else if (ev->body_case == VSPEC__EVENT__BODY_ACCEPTED && local)
      agent_send_small(a, 1, local, 0);
    else if (progress && local) agent_send_small(a, 0, local, 1);
    return;
  }
  unsigned char *v;
  size_t len;
  if (agent_encode(s, ev, e, &v, &len)) {
    vs_log(VSPEC_LOG_ERROR, agent_who, "[job %s] cannot encode an event", s->job.job_id);
    if (terminal) agent_fail(a, s, VSPEC__ERROR_CODE__ERR_INTERNAL, "out of memory for its result");
    return;
  }
  if (terminal) {
    s->terminal = v;
    s->terminal_len = len;
    s->state = VS__FINISHING;
    agent_finish(a, s);
    return;
  }
  /* Progress and previews lost to a Redis outage stay lost (the next ones supersede them). */
  if (agent_redis_ok(a)) agent_append(a, s, v, len);
  free(v);
  /* The agent is the daemon's client: credit comes back as soon as an event is in Redis (the
   * gateways apply each client's own credit when they relay). */
  if (progress && local) agent_send_small(a, 0, local, 1);
}

/* ---- periodic work ------------------------------------------------------------------------ */

static void agent_touch_and_poll(vs_fleet_agent *a) {
  char err[VSPEC_ERRLEN];
  double now = vs_now();
  const char *ids[VS_AGENT_MAX_SLOTS];
  agent_slot *held[VS_AGENT_MAX_SLOTS];
  int flag[VS_AGENT_MAX_SLOTS], n = 0;
  for (int i = 0; i < a->n_slots; i++)
    if (a->slot[i].state != VS__FREE && !a->slot[i].lost) held[n++] = &a->slot[i];
  if (!n || !agent_redis_ok(a)) return;
  if (now >= a->next_touch) {
    a->next_touch = now + a->cfg->fleet_heartbeat_ms / 1000.0;
    for (int i = 0; i < n; i++) ids[i] = held[i]->job.entry_id;
    int rc = agent_redis_result(a, vs_fleet_touch(a->q, ids, n, flag, err, sizeof err), err);
    if (rc == VSPEC_EIO) {
      a->next_touch = now; /* again as soon as the backoff allows: it is the heartbeat */
      return;
    }
    for (int i = 0; rc >= 0 && i < n; i++) {
      if (flag[i]) continue;
      agent_slot *s = held[i];
      /* Another daemon has it or announced its loss (this one was silent past
       * claim_idle_ms), or it was acked. */
      vs_log(VSPEC_LOG_WARN, agent_who, "[job %s] no longer ours: stopped here", s->job.job_id);
      s->lost = 1;
      if (s->state == VS__RUNNING && s->local_id) agent_send_small(a, 1, s->local_id, 0);
      else if (s->state != VS__RUNNING) agent_free_slot(s);
    }
  }
  if (now >= a->next_cancel_poll) {
    a->next_cancel_poll = now + a->cfg->fleet_cancel_poll_ms / 1000.0;
    n = 0;
    for (int i = 0; i < a->n_slots; i++) {
      agent_slot *s = &a->slot[i];
      if ((s->state == VS__RUNNING || s->state == VS__WAITING) && !s->lost && !s->cancel_sent) {
        held[n] = s;
        ids[n++] = s->job.job_id;
      }
    }
    if (!n) return;
    int rc = agent_redis_result(a, vs_fleet_cancel_check(a->q, ids, n, flag, err, sizeof err), err);
    for (int i = 0; rc > 0 && i < n; i++) {
      if (!flag[i]) continue;
      agent_slot *s = held[i];
      if (s->state == VS__WAITING) {
        agent_fail(a, s, VSPEC__ERROR_CODE__ERR_CANCELLED, "cancelled by its client");
      } else if (s->local_id) {
        s->cancel_sent = 1;
        agent_send_small(a, 1, s->local_id, 0);
      }
    }
  }
}

static void agent_retry(vs_fleet_agent *a) {
  double now = vs_now();
  for (int i = 0; i < a->n_slots; i++) {
    agent_slot *s = &a->slot[i];
    if (s->state == VS__WAITING && s->lost) agent_free_slot(s);
    else if (s->state == VS__WAITING && now >= s->retry_at) agent_submit(a, s);
    else if (s->state == VS__RUNNING && !s->local_id && now - s->submitted_at > 30)
      /* no Accepted and no error in 30 s: the daemon dropped the submit (it answers at once,
       * queued or not); fail the job rather than hold it and its claim for ever */
      agent_fail(a, s, VSPEC__ERROR_CODE__ERR_INTERNAL,
                 "the daemon did not answer the job's submit within 30 s");
    else if (s->state == VS__FINISHING) agent_finish(a, s);
  }
}

static int agent_busy_slots(const vs_fleet_agent *a) {
  int n = 0;
  for (int i = 0; i < a->n_slots; i++) n += a->slot[i].state != VS__FREE;
  return n;
}

static void *agent_main(void *arg) {
  vs_fleet_agent *a = arg;
  char err[VSPEC_ERRLEN];
  double stop_by = 0, next_periodic = 0;
  agent_redis_result(a, vs_fleet_ensure_group(a->q, err, sizeof err), err);
  for (;;) {
    if (a->stopping) {
      if (!stop_by) stop_by = vs_now() + VS_AGENT_STOP_GRACE_S;
      if (!agent_busy_slots(a) || vs_now() > stop_by) break;
    }
    /* Nothing running: wait for a job in Redis instead (the daemon has nothing to say). */
    int idle = !agent_busy_slots(a) && !a->draining && agent_redis_ok(a);
    vs_conn_event e;
    int rc = vs_conn_recv(&a->conn, idle ? 0 : 20, &e, err, sizeof err);
    if (rc > 0) {
      agent_on_event(a, &e);
      vs_conn_event_free(&e);
    }
    if (rc < 0) vs_log(VSPEC_LOG_WARN, agent_who, "from the daemon: %s", err);
    /* The periodic work runs every 20 ms however busy the event stream is: a job streaming
     * previews must still have its claim refreshed, and a free worker must still get a job. */
    double now = vs_now();
    if (rc > 0 && now < next_periodic) continue;
    next_periodic = now + 0.02;
    /* the refresh first: nothing else may put off a live daemon's heartbeat */
    agent_touch_and_poll(a);
    agent_retry(a);
    agent_fetch(a, idle ? 200 : 0);
  }
  return NULL;
}

int vs_fleet_agent_start(const vs_daemon_config *cfg, void *zctx, const char *endpoint,
                         vs_fleet_agent **out, char *err, size_t errlen) {
  *out = NULL;
  vs_fleet_agent *a = calloc(1, sizeof *a);
  if (!a) {
    snprintf(err, errlen, "fleet agent: out of memory");
    return VSPEC_ENOMEM;
  }
  a->cfg = cfg;
  a->n_slots = cfg->workers < VS_AGENT_MAX_SLOTS ? cfg->workers : VS_AGENT_MAX_SLOTS;
  vs_fleet_opts o;
  vs_fleet_config_opts(cfg, &o);
  int rc = vs_fleet_queue_open(&o, &a->q, err, errlen);
  vs_conn_opts co = {.ctx = zctx};
  if (!rc) rc = vs_conn_open(&a->conn, endpoint, &co, err, errlen);
  if (!rc && pthread_create(&a->thread, NULL, agent_main, a)) {
    snprintf(err, errlen, "fleet agent: cannot start its thread");
    rc = VSPEC_ENOMEM;
  }
  if (rc) {
    if (a->conn.sock) vs_conn_close(&a->conn);
    vs_fleet_queue_destroy(&a->q);
    free(a);
    return rc;
  }
  a->started = 1;
  *out = a;
  return VSPEC_OK;
}

void vs_fleet_agent_drain(vs_fleet_agent *a) {
  if (a) a->draining = 1;
}

void vs_fleet_agent_stop(vs_fleet_agent **ap) {
  if (!ap || !*ap) return;
  vs_fleet_agent *a = *ap;
  a->draining = 1;
  a->stopping = 1;
  if (a->started) pthread_join(a->thread, NULL);
  for (int i = 0; i < a->n_slots; i++) agent_free_slot(&a->slot[i]);
  vs_conn_close(&a->conn);
  vs_fleet_queue_destroy(&a->q);
  free(a);
  *ap = NULL;
}

/* ---- the agent as a front of the service (daemon/server.h) --------------------------------- */

static int agent_front_start(const vs_daemon_config *cfg, void **front, void *zctx,
                             const char *endpoint, char *err, size_t errlen) {
  vs_fleet_agent *a = NULL;
  int rc = vs_fleet_agent_start(cfg, zctx, endpoint, &a, err, errlen);
  if (rc) return rc;
  *front = a;
  vs_fleet_addr fa; /* for the log: where, never the password */
  char where[400];
  vs_fleet_addr_parse(cfg->fleet_redis, &fa, where, sizeof where);
  if (fa.path[0]) snprintf(where, sizeof where, "%s", fa.path);
  else snprintf(where, sizeof where, "%s:%d", fa.host, fa.port);
  vs_log(VSPEC_LOG_INFO, "server", "%s: fleet mode, jobs from redis at %s (stream %s, group %s)",
         cfg->node, where, cfg->fleet_stream, cfg->fleet_group);
  return VSPEC_OK;
}

static void agent_front_drain(void *front) { vs_fleet_agent_drain(front); }

static void agent_front_stop(void **front) {
  vs_fleet_agent *a = *front;
  vs_fleet_agent_stop(&a);
  *front = NULL;
}

const vs_server_front vs_fleet_front = {.endpoint = "inproc://vspecd-fleet",
                                        .start = agent_front_start,
                                        .drain = agent_front_drain,
                                        .stop = agent_front_stop};
