/*
 * fleet/gateway_relay.c - vspec-gateway's followed jobs (fleet/gateway_state.h): the follow
 * table, the relay of each job's event stream from Redis with credit, heartbeats, the sweep.
 */
#include "fleet/gateway_state.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "core/log.h"
#include "fleet/fleet_event.h"

#define VS_GW_READ_BATCH 16
#define VS_GW_IDLE_MIN 0.002 /* a quiet event stream is read every 2 ms at first ... */
#define VS_GW_IDLE_MAX 0.032 /* ... then less often, down to every 32 ms */
/* An event's protobuf frame is the daemon's (trusted) but read back from Redis, where
 * anything may have written: unpacked under a budget, as the client unpacks events. */
#define VS_GW_UNPACK_BUDGET (4u << 20)

/* ---- the follow table ---------------------------------------------------------------------- */

vs_gw_follow *vs_gw_follow_add(vs_gw *g, const vs_wire_msg *m, uint64_t job, uint64_t rid,
                               const char *after, int64_t credit) {
  vs_gw_follow *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  f->job = job;
  snprintf(f->job_text, sizeof f->job_text, "%llu", (unsigned long long)job);
  f->client = m->env;
  memcpy(f->user_id, m->user_id, sizeof f->user_id);
  vs_gw_follow_restart(f, rid, after, credit);
  f->next = g->follows;
  g->follows = f;
  return f;
}

void vs_gw_follow_restart(vs_gw_follow *f, uint64_t rid, const char *after, int64_t credit) {
  f->request_id = rid;
  snprintf(f->cursor, sizeof f->cursor, "%s", after);
  f->credit = credit;
  f->seq = f->skipped = 0;
  f->last_sent = f->last_event = vs_now();
  f->next_read = f->idle = f->blocked_since = 0;
}

vs_gw_follow *vs_gw_follow_find(vs_gw *g, const vs_wire_msg *m, uint64_t job) {
  for (vs_gw_follow *f = g->follows; f; f = f->next)
    if (!f->done && f->job == job && vs_wire_envelope_equal(&f->client, &m->env) &&
        !strcmp(f->user_id, m->user_id))
      return f;
  return NULL;
}

int vs_gw_follows_of(const vs_gw *g, const vs_wire_envelope *env) {
  int n = 0;
  for (const vs_gw_follow *f = g->follows; f; f = f->next)
    n += !f->done && vs_wire_envelope_equal(&f->client, env);
  return n;
}

/* The first live follow of f's client in the table: one per connection. */
static const vs_gw_follow *relay_first_of(const vs_gw *g, const vs_gw_follow *f) {
  for (const vs_gw_follow *k = g->follows; k; k = k->next)
    if (!k->done && vs_wire_envelope_equal(&k->client, &f->client)) return k;
  return NULL;
}

int vs_gw_clients(const vs_gw *g) {
  int n = 0;
  for (const vs_gw_follow *f = g->follows; f; f = f->next)
    n += !f->done && relay_first_of(g, f) == f;
  return n;
}

void vs_gw_sweep(vs_gw *g) {
  vs_gw_follow **p = &g->follows;
  while (*p) {
    vs_gw_follow *f = *p;
    if (f->done) {
      *p = f->next;
      free(f);
    } else {
      p = &f->next;
    }
  }
}

void vs_gw_follows_free(vs_gw *g) {
  for (vs_gw_follow *f = g->follows; f; f = f->next) f->done = 1;
  vs_gw_sweep(g);
}

/* ---- the relay ----------------------------------------------------------------------------- */

/* What a send's status means for the follow: 0 when the event is dealt with (sent, or the
 * client is gone), -EAGAIN when the client's queue is full and it must be tried again. */
static int relay_sent(vs_gw *g, vs_gw_follow *f, int rc, double now) {
  if (rc == 0) {
    f->seq++;
    f->last_sent = now;
    f->blocked_since = 0;
  } else if (rc == -EAGAIN) {
    if (!f->blocked_since) {
      char t[40];
      vs_wire_envelope_text(&f->client, t, sizeof t);
      vs_log(VSPEC_LOG_DEBUG, "gateway", "job %s: the queue of client %s is full: its events "
             "wait in redis", f->job_text, t);
      f->blocked_since = now;
    }
  } else if (rc == -EHOSTUNREACH) {
    vs_gw_client_gone(g, &f->client, "is gone");
  } else {
    /* Not expected (the event was checked when it was decoded): dropped, not retried
     * forever. */
    vs_log(VSPEC_LOG_WARN, "gateway", "job %s: an event could not be sent: %s", f->job_text,
           zmq_strerror(-rc));
    rc = 0;
  }
  return rc == -EAGAIN ? rc : 0;
}

static void relay_ended(vs_gw *g, vs_gw_follow *f, const Vspec__Event *ev) {
  f->done = 1;
  /* the totals of `vspec status`: terminal events this gateway delivered */
  if (ev->body_case == VSPEC__EVENT__BODY_RESULT) g->completed++;
  else if (ev->error->code == VSPEC__ERROR_CODE__ERR_CANCELLED) g->cancelled++;
  else g->failed++;
  char t[40];
  vs_wire_envelope_text(&f->client, t, sizeof t);
  vs_log(VSPEC_LOG_DEBUG, "gateway", "job %s: %s sent to client %s after %llu event(s) (%llu "
         "progress/preview skipped for want of credit): no longer followed", f->job_text,
         ev->body_case == VSPEC__EVENT__BODY_RESULT ? "result" : "error",
         t, (unsigned long long)f->seq - 1, (unsigned long long)f->skipped);
}

/* One event of f's stream: sent with the follow's numbering, or skipped. 0 when the cursor
 * may move past it, -EAGAIN when it must be read and tried again. */
static int relay_one(vs_gw *g, vs_gw_follow *f, const vs_fleet_event *e, double now) {
  vs_wire_alloc a;
  vs_wire_alloc_init(&a, VS_GW_UNPACK_BUDGET);
  Vspec__Event *ev;
  vs_wire_blob blobs[VS_WIRE_MAX_BLOBS];
  int nb;
  char err[VSPEC_ERRLEN];
  if (vs_fleet_event_decode(e->data, e->len, &a, &ev, blobs, &nb, err, sizeof err)) {
    vs_log(VSPEC_LOG_WARN, "gateway", "job %s: event %s skipped: %s", f->job_text, e->id, err);
    return 0;
  }
  int body = ev->body_case;
  int costs = body == VSPEC__EVENT__BODY_PROGRESS || body == VSPEC__EVENT__BODY_PREVIEW;
  /* Every event of a job's stream is about that job, so any result or error ends it; the
   * first one counts, a second (from a run restarted elsewhere) is never sent. */
  int terminal = body == VSPEC__EVENT__BODY_RESULT || body == VSPEC__EVENT__BODY_ERROR;
  int rc = 0;
  if (costs && f->credit <= 0) {
    f->skipped++;
  } else {
    char *stored = ev->cursor; /* the allocator's, freed with the event */
    ev->has_job_id = 1;
    ev->job_id = f->job;
    ev->has_seq = 1;
    ev->seq = f->seq;
    ev->has_request_id = f->request_id != 0;
    ev->request_id = f->request_id;
    ev->cursor = (char *)e->id;
    rc = relay_sent(g, f, vs_wire_send_event(g->front, &f->client, ev, blobs, nb, ZMQ_DONTWAIT),
                    now);
    ev->cursor = stored;
    if (rc == 0 && costs) f->credit--;
    if (rc == 0 && terminal && !f->done) relay_ended(g, f, ev);
  }
  vs_wire_event_free(ev, &a);
  return rc;
}

/* The job's stream is gone (it expired, or Redis restarted empty): nothing will come, so the
 * client gets a terminal error instead of heartbeats forever. */
static void relay_lost(vs_gw *g, vs_gw_follow *f, double now) {
  char msg[300];
  snprintf(msg, sizeof msg, "job %s has no events in the fleet any more (they expired, or "
           "redis at %s lost them): its result, if any, cannot be delivered", f->job_text,
           g->where);
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Error e = VSPEC__ERROR__INIT;
  e.code = VSPEC__ERROR_CODE__ERR_NOT_FOUND;
  e.message = msg;
  ev.body_case = VSPEC__EVENT__BODY_ERROR;
  ev.error = &e;
  ev.has_job_id = ev.has_seq = 1;
  ev.job_id = f->job;
  ev.seq = f->seq;
  ev.has_request_id = f->request_id != 0;
  ev.request_id = f->request_id;
  if (relay_sent(g, f, vs_wire_send_event(g->front, &f->client, &ev, NULL, 0, ZMQ_DONTWAIT),
                 now) == 0 && !f->done) {
    vs_log(VSPEC_LOG_WARN, "gateway", "%s", msg);
    relay_ended(g, f, &ev);
  }
}

/* Nothing new: read less often, and once in a while make sure the stream still exists. */
static void relay_quiet(vs_gw *g, vs_gw_follow *f, double now) {
  f->idle = f->idle > 0 ? f->idle * 2 : VS_GW_IDLE_MIN;
  if (f->idle > VS_GW_IDLE_MAX) f->idle = VS_GW_IDLE_MAX;
  f->next_read = now + f->idle;
  if (now - f->last_event < 5.0 * g->cfg->heartbeat_ms / 1000.0) return;
  char err[VSPEC_ERRLEN];
  /* the check also puts off the expiry of a job that waits long in the queue */
  int rc = vs_gw_redis_note(g, vs_fleet_job_keepalive(g->q, f->job_text, err, sizeof err), err);
  if (rc == 0) relay_lost(g, f, now);
  else if (rc > 0) f->last_event = now;
}

/* Returns 1 when the read was full and went out whole: more may be waiting. */
static int relay_follow(vs_gw *g, vs_gw_follow *f, double now) {
  /* A client that takes nothing for 5 heartbeats is treated as gone. */
  if (f->blocked_since && now - f->blocked_since > 5.0 * g->cfg->heartbeat_ms / 1000.0) {
    vs_gw_client_gone(g, &f->client, "took nothing for 5 heartbeats");
    return 0;
  }
  vs_fleet_event ev[VS_GW_READ_BATCH];
  char err[VSPEC_ERRLEN];
  /* A client that is not reading is offered one event at a time: each try reads it again. */
  int max = f->blocked_since ? 1 : VS_GW_READ_BATCH;
  int n = vs_gw_redis_note(
      g, vs_fleet_events_read(g->q, f->job_text, f->cursor, 0, ev, max, err, sizeof err), err);
  if (n < 0) {
    /* Unreachable: the health's backoff. Anything else is this stream's: once a second. */
    if (n != VSPEC_EIO && !f->warned)
      vs_log(VSPEC_LOG_WARN, "gateway", "job %s: cannot read its events: %s (trying again "
             "every second)", f->job_text, err);
    f->warned = n != VSPEC_EIO;
    if (n != VSPEC_EIO) f->next_read = now + 1.0;
    return 0;
  }
  f->warned = 0;
  if (n == 0) {
    relay_quiet(g, f, now);
    return 0;
  }
  f->idle = f->next_read = 0;
  f->last_event = now;
  int i = 0;
  for (; i < n && !f->done; i++) {
    if (relay_one(g, f, &ev[i], now) == -EAGAIN) break;
    snprintf(f->cursor, sizeof f->cursor, "%s", ev[i].id);
  }
  for (int k = 0; k < n; k++) vs_fleet_event_clear(&ev[k]);
  return n == VS_GW_READ_BATCH && i == n && !f->done;
}

int vs_gw_relay(vs_gw *g, double now) {
  int more = 0;
  for (vs_gw_follow *f = g->follows; f; f = f->next) {
    if (f->done || now < f->next_read || vs_gw_has_kept(g, &f->client)) continue;
    if (!vs_gw_redis_ready(g, now)) break;
    more |= relay_follow(g, f, now);
  }
  return more;
}

/* The last time anything of any job went to f's client. */
static double relay_client_last(const vs_gw *g, const vs_gw_follow *f) {
  double last = f->last_sent;
  for (const vs_gw_follow *k = g->follows; k; k = k->next)
    if (!k->done && k->last_sent > last && vs_wire_envelope_equal(&k->client, &f->client))
      last = k->last_sent;
  return last;
}

/* A client waiting on a job that sits in the queue hears that the gateway is there (vspec
 * gives up after --timeout of silence), and a connection that vanished shows up as
 * unroutable. One heartbeat per connection: it counts as sent for each of its follows. */
void vs_gw_heartbeat(vs_gw *g, double now) {
  double ivl = g->cfg->heartbeat_ms / 1000.0;
  for (vs_gw_follow *f = g->follows; f; f = f->next) {
    /* The follow's own time first: the scans of the table only for a quiet one. */
    if (f->done || now - f->last_sent < ivl || now - relay_client_last(g, f) < ivl) continue;
    Vspec__Event ev = VSPEC__EVENT__INIT;
    Vspec__Heartbeat hb = VSPEC__HEARTBEAT__INIT;
    ev.body_case = VSPEC__EVENT__BODY_HEARTBEAT;
    ev.heartbeat = &hb;
    int rc = vs_wire_send_event(g->front, &f->client, &ev, NULL, 0, ZMQ_DONTWAIT);
    if (rc == -EHOSTUNREACH) {
      vs_gw_client_gone(g, &f->client, "is gone (heartbeat)");
      continue;
    }
    /* EAGAIN too: the client has things to read. */
    for (vs_gw_follow *k = f; k; k = k->next)
      if (vs_wire_envelope_equal(&k->client, &f->client)) k->last_sent = now;
  }
}
