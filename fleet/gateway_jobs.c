/*
 * fleet/gateway_jobs.c - vspec-gateway's job requests: a submit becomes an entry of the
 * jobs stream (under a fresh id, or the client's own, which makes a retried submit follow the
 * same job), a resume follows a job's events again from a cursor, a cancel sets the job's
 * flag for the daemon that runs it (DESIGN.md, "Fleet mode").
 */
#include <errno.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <zmq.h>

#include "core/log.h"
#include "fleet/fleet_event.h"
#include "fleet/fleet_queue.h"
#include "fleet/gateway_state.h"
#include "proto/wire.h"


/* A fresh job id: random, so that gateways that share nothing never hand out the same one,
 * and a job's events cannot be guessed by another client; nonzero and below 2^63. */
static int gjobs_draw_job_id(uint64_t *out) {
  uint64_t v = 0;
  while (v == 0) {
    ssize_t n = getrandom(&v, sizeof v, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n != (ssize_t)sizeof v) return -1;
    v &= (1ull << 63) - 1;
  }
  *out = v;
  return 0;
}

static int64_t gjobs_credit(int has, uint32_t credit) {
  if (!has) return VS_GW_DEFAULT_CREDIT;
  return credit > VS_GW_MAX_CREDIT ? VS_GW_MAX_CREDIT : credit;
}

/* The gateway's Accepted, first in the job's event stream: the job id at once, the jobs
 * waiting ahead of it (when known), and who took the submit. */
static int gjobs_encode_accepted(const vs_gw *g, uint64_t job, long long ahead,
                                 unsigned char **data, size_t *len) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Accepted acc = VSPEC__ACCEPTED__INIT;
  acc.node = (char *)g->cfg->node;
  acc.has_queue_position = ahead >= 0;
  acc.queue_position = ahead > UINT32_MAX ? UINT32_MAX : (uint32_t)(ahead < 0 ? 0 : ahead);
  ev.version = VSPEC__PROTOCOL_VERSION__PROTOCOL_V1;
  ev.has_job_id = 1;
  ev.job_id = job;
  ev.body_case = VSPEC__EVENT__BODY_ACCEPTED;
  ev.accepted = &acc;
  return vs_fleet_event_encode(&ev, NULL, NULL, 0, data, len);
}

/* Puts a job into the fleet, its Accepted first in its event stream, in one atomic step
 * (vs_fleet_submit); `digest` for a client-chosen id, else NULL. Returns VS_FLEET_NEW /
 * VS_FLEET_SAME / VS_FLEET_CONFLICT, VSPEC_EBUSY or a Redis error (message in err). */
static int gjobs_enqueue(vs_gw *g, uint64_t job, const unsigned char *payload, size_t len,
                         const char *digest, char *err, size_t errlen) {
  char job_text[VS_GW_JOB_TEXT];
  snprintf(job_text, sizeof job_text, "%llu", (unsigned long long)job);
  if (!vs_gw_redis_ready(g, vs_now())) {
    snprintf(err, errlen, "%s", g->redis_err);
    return VSPEC_EIO;
  }
  long long n = -1, pend = -1;
  int rc = vs_gw_depth(g, &n, &pend, err, errlen);
  if (rc == VSPEC_EIO) return rc;
  long long ahead = rc ? -1 : n - pend; /* unknown when Redis refused to tell */
  unsigned char *acc;
  size_t acc_len;
  if (gjobs_encode_accepted(g, job, ahead, &acc, &acc_len)) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  rc = vs_gw_redis_note(g, vs_fleet_submit(g->q, job_text, payload, len, acc, acc_len, digest,
                                           NULL, err, errlen), err);
  free(acc);
  if (rc == VSPEC_EBUSY)
    snprintf(err, errlen, "busy: the fleet queue holds %lld jobs waiting or running, its limit "
             "(--max-len): retry later", n > g->cfg->max_len ? n : g->cfg->max_len);
  return rc;
}

/* The payload of a job: the request frame as the client sent it, then its blob frames. */
static int gjobs_payload(const vs_wire_msg *m, unsigned char **out, size_t *len) {
  const void *frame[VS_FLEET_MAX_FRAMES];
  size_t size[VS_FLEET_MAX_FRAMES];
  frame[0] = zmq_msg_data((zmq_msg_t *)&m->body);
  size[0] = zmq_msg_size((zmq_msg_t *)&m->body);
  for (int i = 0; i < m->n_blobs; i++) {
    frame[1 + i] = zmq_msg_data((zmq_msg_t *)&m->blobs[i]);
    size[1 + i] = zmq_msg_size((zmq_msg_t *)&m->blobs[i]);
  }
  return vs_fleet_frames_encode("VSR1", frame, size, 1 + m->n_blobs, out, len);
}

/* What makes two submits the same job: the submit message and its blob frames (not the
 * request around it, whose request id differs between a try and its retry). Hex, 32 chars. */
static int gjobs_digest(const vs_wire_msg *m, const Vspec__Submit *sub, char out[33]) {
  size_t n = vspec__submit__get_packed_size(sub);
  uint8_t *packed = malloc(n ? n : 1);
  if (!packed) return -1;
  vspec__submit__pack(sub, packed);
  crypto_generichash_state st;
  unsigned char h[16];
  crypto_generichash_init(&st, NULL, 0, sizeof h);
  crypto_generichash_update(&st, packed, n);
  for (int i = 0; i < m->n_blobs; i++)
    crypto_generichash_update(&st, zmq_msg_data((zmq_msg_t *)&m->blobs[i]),
                              zmq_msg_size((zmq_msg_t *)&m->blobs[i]));
  crypto_generichash_final(&st, h, sizeof h);
  free(packed);
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", h[i]);
  return 0;
}

static void gjobs_follow_or_fail(vs_gw *g, const vs_wire_msg *m, uint64_t job, uint64_t rid,
                                 int64_t credit) {
  vs_gw_follow *f = vs_gw_follow_find(g, m, job);
  if (f) vs_gw_follow_restart(f, rid, "0-0", credit);
  else if (!vs_gw_follow_add(g, m, job, rid, "0-0", credit)) {
    char msg[160];
    snprintf(msg, sizeof msg, "job %llu is in the fleet, but the gateway ran out of memory to "
             "follow it: resume it", (unsigned long long)job);
    vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_INTERNAL, msg);
  }
}

/* A client-chosen job id (Submit.job_id): checked, and the digest that tells a retry of the
 * same submit from another request. 0, or answered here (an error) and -1. */
static int gjobs_own_job_id(vs_gw *g, const vs_wire_msg *m, const Vspec__Submit *sub,
                            uint64_t rid, char digest[33]) {
  if (!sub->job_id || sub->job_id >> 63) {
    vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_INVALID,
                      "submit.job_id must be 1 to 2^63-1 (draw it at random)");
    return -1;
  }
  if (gjobs_digest(m, sub, digest)) {
    vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_INTERNAL, "out of memory");
    return -1;
  }
  return 0;
}

void vs_gw_submit(vs_gw *g, const vs_wire_msg *m, const Vspec__Request *r, uint64_t rid) {
  char err[VSPEC_ERRLEN], msg[VSPEC_ERRLEN];
  int following = vs_gw_follows_of(g, &m->env);
  if (following >= g->cfg->per_client) {
    snprintf(msg, sizeof msg, "busy: this connection follows %d jobs already, the gateway's "
             "limit (--per-client): wait for one to end, or use another connection", following);
    g->busy++;
    vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_BUSY, msg);
    return;
  }
  int64_t credit = gjobs_credit(r->submit->has_credit, r->submit->credit);
  int own_id = r->submit->has_job_id;
  char digest[33];
  if (own_id && gjobs_own_job_id(g, m, r->submit, rid, digest)) return;
  unsigned char *payload = NULL;
  size_t len = 0;
  uint64_t job = r->submit->job_id;
  if (gjobs_payload(m, &payload, &len) || (!own_id && gjobs_draw_job_id(&job))) {
    free(payload);
    vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_INTERNAL,
                      "out of memory or of random bytes for a job id");
    return;
  }
  int rc = len > g->max_payload
               ? VSPEC_ERANGE
               : gjobs_enqueue(g, job, payload, len, own_id ? digest : NULL, err, sizeof err);
  free(payload);
  if (rc == VS_FLEET_CONFLICT) {
    snprintf(msg, sizeof msg, "submit.job_id %llu is taken by a different request (a retry "
             "must send the same submit; a new job needs a new id)", (unsigned long long)job);
    vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_INVALID, msg);
    return;
  }
  if (rc == VS_FLEET_SAME) {
    vs_log(VSPEC_LOG_DEBUG, "gateway", "job %llu: submitted again: followed, not run again",
           (unsigned long long)job);
    gjobs_follow_or_fail(g, m, job, rid, credit);
    return;
  }
  if (rc == VSPEC_ERANGE) {
    snprintf(msg, sizeof msg, "the request and its blobs are %zu bytes: the fleet queue takes "
             "jobs of at most %zu", len, g->max_payload);
    vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_TOO_LARGE, msg);
    return;
  }
  if (rc == VSPEC_EBUSY) {
    g->busy++;
    vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_BUSY, err);
    return;
  }
  if (rc != VS_FLEET_NEW) {
    vs_gw_reply_redis(g, &m->env, rid, rc, err);
    return;
  }
  g->submitted++;
  char t[40];
  vs_wire_envelope_text(&m->env, t, sizeof t);
  vs_log(VSPEC_LOG_DEBUG, "gateway", "job %llu: in the fleet (%zu bytes), for client %s",
         (unsigned long long)job, len, t);
  gjobs_follow_or_fail(g, m, job, rid, credit);
}

/* "<ms>-<seq>" or "<ms>", each part a 64-bit decimal: the ids XREAD takes after. */
static int gjobs_cursor_ok(const char *s) {
  size_t n = strlen(s), dash = strcspn(s, "-");
  for (size_t i = 0; i < n; i++)
    if (i != dash && (s[i] < '0' || s[i] > '9')) return 0;
  return dash >= 1 && dash <= 20 && (dash == n || (n - dash - 1 >= 1 && n - dash - 1 <= 20));
}

/* 1 when the job has events in the fleet, 0 when not, or a Redis error (message in err). */
static int gjobs_job_exists(vs_gw *g, const char *job_text, char *err, size_t errlen) {
  if (!vs_gw_redis_ready(g, vs_now())) {
    snprintf(err, errlen, "%s", g->redis_err);
    return VSPEC_EIO;
  }
  return vs_gw_redis_note(g, vs_fleet_events_exist(g->q, job_text, err, errlen), err);
}

void vs_gw_resume(vs_gw *g, const vs_wire_msg *m, const Vspec__Resume *rs, uint64_t rid) {
  char err[VSPEC_ERRLEN], msg[VSPEC_ERRLEN + 100], job_text[VS_GW_JOB_TEXT], t[40];
  const char *after = rs->after ? rs->after : "0-0";
  if (!gjobs_cursor_ok(after)) {
    snprintf(msg, sizeof msg, "resume.after: '%.60s' is not an event cursor (<ms>-<seq>, an "
             "Event.cursor)", after);
    vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_INVALID, msg);
    return;
  }
  vs_gw_follow *f = vs_gw_follow_find(g, m, rs->job_id);
  int following = vs_gw_follows_of(g, &m->env);
  if (!f && following >= g->cfg->per_client) {
    snprintf(msg, sizeof msg, "busy: this connection follows %d jobs already, the gateway's "
             "limit (--per-client)", following);
    g->busy++;
    vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_BUSY, msg);
    return;
  }
  snprintf(job_text, sizeof job_text, "%llu", (unsigned long long)rs->job_id);
  int rc = gjobs_job_exists(g, job_text, err, sizeof err);
  if (rc <= 0) {
    snprintf(msg, sizeof msg, "no job %s in the fleet (or its events expired)", job_text);
    if (rc < 0) vs_gw_reply_redis(g, &m->env, rid, rc, err);
    else vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_NOT_FOUND, msg);
    return;
  }
  vs_wire_envelope_text(&m->env, t, sizeof t);
  vs_log(VSPEC_LOG_DEBUG, "gateway", "job %s: resumed by client %s after %s", job_text, t,
         after);
  int64_t credit = gjobs_credit(rs->has_credit, rs->credit);
  /* On the connection that follows it already: from the client's cursor, numbered anew. */
  if (f) vs_gw_follow_restart(f, rid, after, credit);
  else if (!vs_gw_follow_add(g, m, rs->job_id, rid, after, credit))
    vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_INTERNAL, "out of memory");
}

static void gjobs_ack(vs_gw *g, const vs_wire_envelope *env, uint64_t rid, const char *text) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Ack ack = VSPEC__ACK__INIT;
  ack.message = (char *)text;
  ev.body_case = VSPEC__EVENT__BODY_ACK;
  ev.ack = &ack;
  ev.has_request_id = rid != 0;
  ev.request_id = rid;
  vs_gw_send_own(g, env, &ev);
}

/* The flag the job's daemon polls at round boundaries: it ends the job with a cancelled
 * error, which the relay delivers as the terminal event. */
void vs_gw_cancel(vs_gw *g, const vs_wire_msg *m, uint64_t job, uint64_t rid) {
  char err[VSPEC_ERRLEN], msg[VSPEC_ERRLEN];
  vs_gw_follow *f = vs_gw_follow_find(g, m, job);
  if (!f) {
    snprintf(msg, sizeof msg, "no job %llu followed on this connection",
             (unsigned long long)job);
    vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_NOT_FOUND, msg);
    return;
  }
  int rc = VSPEC_EIO;
  snprintf(err, sizeof err, "%s", g->redis_err);
  if (vs_gw_redis_ready(g, vs_now()))
    rc = vs_gw_redis_note(g, vs_fleet_cancel_set(g->q, f->job_text, err, sizeof err), err);
  if (rc) {
    vs_gw_reply_redis(g, &m->env, rid, rc, err);
    return;
  }
  char t[40];
  vs_wire_envelope_text(&m->env, t, sizeof t);
  vs_log(VSPEC_LOG_INFO, "gateway", "job %s: cancelled by client %s", f->job_text, t);
  snprintf(msg, sizeof msg, "cancel of job %s requested: its daemon ends it", f->job_text);
  gjobs_ack(g, &m->env, rid, msg);
}

