/*
 * fleet/gateway_reply.c - vspec-gateway's own replies (fleet/gateway_state.h): sent at once, or
 * kept while the client's queue is full and retried from the loop, ahead of its relayed
 * events; and the end of a client found gone (its follows, what was kept for it).
 */
#include "fleet/gateway_state.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "core/log.h"
#include "proto/wire_text.h"

/* Own replies kept for one client: over this many, or none taken for 5 heartbeats, the
 * client is treated as gone. Replies are one per request, so a client that reads never gets
 * near it. */
#define VS_GW_KEPT_MAX 64
#define VS_GW_RETRY_MS 1000 /* retry_after_ms of busy and unavailable answers */

typedef struct out_kept {
  vs_wire_msg msg;
  struct out_kept *next;
} out_kept;

struct vs_gw_out {
  vs_wire_envelope client;
  out_kept *head, **tail;
  int n;
  double since; /* the first reply was kept, or the client last took one */
  vs_gw_out *next;
};

static vs_gw_out *out_find(const vs_gw *g, const vs_wire_envelope *env) {
  for (vs_gw_out *o = g->out; o; o = o->next)
    if (vs_wire_envelope_equal(&o->client, env)) return o;
  return NULL;
}

int vs_gw_has_kept(const vs_gw *g, const vs_wire_envelope *env) {
  return g->out && out_find(g, env) != NULL;
}

static void out_free(vs_gw_out *o) {
  while (o->head) {
    out_kept *k = o->head;
    o->head = k->next;
    vs_wire_msg_close(&k->msg);
    free(k);
  }
  free(o);
}

void vs_gw_drop_kept(vs_gw *g, const vs_wire_envelope *env) {
  for (vs_gw_out **p = &g->out; *p; p = &(*p)->next)
    if (vs_wire_envelope_equal(&(*p)->client, env)) {
      vs_gw_out *o = *p;
      *p = o->next;
      out_free(o);
      return;
    }
}

void vs_gw_kept_free(vs_gw *g) {
  while (g->out) {
    vs_gw_out *o = g->out;
    g->out = o->next;
    out_free(o);
  }
}

/* Keeps a reply the client's queue could not take (its frames move into the kept copy). */
static void out_keep(vs_gw *g, vs_gw_out *o, const vs_wire_envelope *env, vs_wire_msg *m) {
  if (o && o->n >= VS_GW_KEPT_MAX) {
    vs_wire_msg_close(m);
    vs_gw_client_gone(g, env, "does not take its replies");
    return;
  }
  out_kept *k = calloc(1, sizeof *k);
  if (k && !o && (o = calloc(1, sizeof *o))) {
    o->client = *env;
    o->tail = &o->head;
    o->since = vs_now();
    o->next = g->out;
    g->out = o;
  }
  if (!k || !o) {
    free(k);
    vs_wire_msg_close(m);
    return;
  }
  zmq_msg_init(&k->msg.body);
  zmq_msg_move(&k->msg.body, &m->body);
  k->msg.has_body = 1;
  vs_wire_msg_close(m);
  *o->tail = k;
  o->tail = &k->next;
  o->n++;
}

/* Packs an event of the gateway's own (its strings made valid for the wire) and sends it, or
 * keeps it while the client's queue is full. */
void vs_gw_send_own(vs_gw *g, const vs_wire_envelope *env, Vspec__Event *ev) {
  vs_wire_msg m;
  memset(&m, 0, sizeof m);
  ev->version = VSPEC__PROTOCOL_VERSION__PROTOCOL_V1;
  if (vs_wire_pack(&ev->base, &m.body)) return;
  m.has_body = 1;
  vs_gw_out *o = out_find(g, env);
  if (!o) {
    int rc = vs_wire_forward(g->front, env, &m, ZMQ_DONTWAIT);
    if (rc == -EHOSTUNREACH) vs_gw_client_gone(g, env, "is gone");
    if (rc != -EAGAIN || !m.has_body) {
      vs_wire_msg_close(&m);
      return;
    }
  }
  out_keep(g, o, env, &m);
}

/* Retries kept replies in order; a client that takes none for 5 heartbeats is gone. */
void vs_gw_retry_out(vs_gw *g, double now) {
  double timeout = 5.0 * g->cfg->heartbeat_ms / 1000.0;
  vs_gw_out **p = &g->out;
  while (*p) {
    vs_gw_out *o = *p;
    int rc = 0;
    while (o->head) {
      rc = vs_wire_forward(g->front, &o->client, &o->head->msg, ZMQ_DONTWAIT);
      if (rc == -EAGAIN && o->head->msg.has_body) break;
      out_kept *k = o->head;
      o->head = k->next;
      vs_wire_msg_close(&k->msg);
      free(k);
      o->n--;
      if (rc == -EHOSTUNREACH) break;
      o->since = now;
    }
    int gone = rc == -EHOSTUNREACH || (o->head && now - o->since > timeout);
    if (!gone && o->head) {
      p = &o->next;
      continue;
    }
    *p = o->next;
    vs_wire_envelope env = o->client;
    out_free(o);
    if (gone) vs_gw_client_gone(g, &env, rc == -EHOSTUNREACH ? "is gone" : "took nothing for "
                                "5 heartbeats");
  }
}

void vs_gw_reply_error(vs_gw *g, const vs_wire_envelope *env, uint64_t rid, int code,
                       const char *msg) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Error e = VSPEC__ERROR__INIT;
  e.code = code;
  e.message = (char *)msg;
  if (code == VSPEC__ERROR_CODE__ERR_BUSY || code == VSPEC__ERROR_CODE__ERR_UNAVAILABLE) {
    e.has_retry_after_ms = 1;
    e.retry_after_ms = VS_GW_RETRY_MS;
  }
  ev.body_case = VSPEC__EVENT__BODY_ERROR;
  ev.error = &e;
  ev.has_request_id = rid != 0;
  ev.request_id = rid;
  vs_gw_send_own(g, env, &ev);
}

/* Redis answering with an error (OOM, a key of another type) is "unavailable" too: the
 * fleet cannot take the request now, and a retry may find it fixed. */
void vs_gw_reply_redis(vs_gw *g, const vs_wire_envelope *env, uint64_t rid, int rc,
                       const char *err) {
  char msg[VSPEC_ERRLEN + 400];
  snprintf(msg, sizeof msg, "redis at %s %s: %s", g->where,
           rc == VSPEC_EIO ? "unreachable" : "failed", err);
  vs_gw_reply_error(g, env, rid, VSPEC__ERROR_CODE__ERR_UNAVAILABLE, msg);
}

/* The follows of a client found gone end here, beside what was kept for it: the replies
 * and the relay both find clients gone, and the relay already asks this file about what is
 * kept (vs_gw_has_kept), so neither calls the other back. */
void vs_gw_client_gone(vs_gw *g, const vs_wire_envelope *env, const char *why) {
  int n = 0;
  for (vs_gw_follow *f = g->follows; f; f = f->next)
    if (!f->done && vs_wire_envelope_equal(&f->client, env)) {
      f->done = 1;
      n++;
    }
  vs_gw_drop_kept(g, env);
  if (!n) return;
  g->clients_lost++;
  char t[40];
  vs_wire_envelope_text(env, t, sizeof t);
  vs_log(VSPEC_LOG_INFO, "gateway", "client %s %s: no longer following its %d job(s) (they "
         "run on in the fleet; the client can resume them)", t, why, n);
}
