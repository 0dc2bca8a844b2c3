#include "proto/wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/wire_text.h"
#include "vspec/types.h"

int vs_wire_envelope_equal(const vs_wire_envelope *a, const vs_wire_envelope *b) {
  if (a->n != b->n) return 0;
  for (int i = 0; i < a->n; i++)
    if (a->len[i] != b->len[i] || memcmp(a->id[i], b->id[i], a->len[i]) != 0) return 0;
  return 1;
}

uint64_t vs_wire_envelope_hash(const vs_wire_envelope *e) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < e->n; i++) {
    h = (h ^ e->len[i]) * 1099511628211ull;
    for (int j = 0; j < e->len[i]; j++) h = (h ^ e->id[i][j]) * 1099511628211ull;
  }
  return h;
}

void vs_wire_envelope_text(const vs_wire_envelope *e, char *buf, size_t buflen) {
  static const char hex[] = "0123456789abcdef";
  size_t o = 0;
  if (!buflen) return;
  for (int i = 0; i < e->n && o + 4 < buflen; i++) {
    if (i) buf[o++] = '/';
    /* The last bytes differ between peers (libzmq numbers them), so show those. */
    int start = e->len[i] > 4 ? e->len[i] - 4 : 0;
    for (int j = start; j < e->len[i] && o + 3 < buflen; j++) {
      buf[o++] = hex[e->id[i][j] >> 4];
      buf[o++] = hex[e->id[i][j] & 15];
    }
  }
  buf[o] = 0;
}

/* ---- receiving ------------------------------------------------------------------------ */

static int wire_recv(void *sock, int envelope, vs_wire_msg *m, size_t max_body, size_t max_blob,
                     int max_blobs, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  zmq_msg_t part;
  zmq_msg_init(&part);
  if (zmq_msg_recv(&part, sock, ZMQ_DONTWAIT) < 0) {
    int e = errno;
    zmq_msg_close(&part);
    if (e == EAGAIN) return 0;
    snprintf(err, errlen, "receive failed: %s", zmq_strerror(e));
    return VSPEC_EIO;
  }
  /* Phases: routing frames, then (after the delimiter) the body, then blobs. Once something
   * is wrong we keep reading until the last part, so the next message starts clean. */
  enum { ENV, BODY, BLOBS } phase = envelope ? ENV : BODY;
  int bad = 0, first = 1, delimiter = 0;
  for (;;) {
    /* The connection's metadata (NULL without ZAP) comes with the frames the peer sent. Not
     * always with the routing-id frame a ROUTER adds: libzmq (4.3.4) builds that one without
     * metadata when the message was prefetched by a poll or ZMQ_EVENTS, as in vspecd's event
     * loop and the gateway's zmq_poll. So every frame is asked until one answers. */
    if (!*m->user_id) {
      const char *user = zmq_msg_gets(&part, "User-Id");
      if (user) snprintf(m->user_id, sizeof m->user_id, "%s", user);
    }
    size_t size = zmq_msg_size(&part);
    int more = zmq_msg_more(&part);
    if (bad) {
      /* discard */
    } else if (phase == ENV) {
      if (size == 0) {
        phase = BODY;
        delimiter = 1;
      } else if (m->env.n == VS_WIRE_MAX_ENVELOPE || size > VS_WIRE_MAX_ID) {
        bad = VSPEC_EFORMAT;
        snprintf(err, errlen, "no empty delimiter frame within the first %d frames",
                 VS_WIRE_MAX_ENVELOPE + 1);
      } else {
        m->env.len[m->env.n] = (uint8_t)size;
        memcpy(m->env.id[m->env.n], zmq_msg_data(&part), size);
        m->env.n++;
      }
    } else if (phase == BODY && !envelope && first) {
      /* A DEALER talking to a ROUTER: the message must open with the delimiter. */
      if (size != 0) {
        bad = VSPEC_EFORMAT;
        snprintf(err, errlen, "message does not start with an empty delimiter frame");
      } else {
        delimiter = 1;
      }
    } else if (phase == BODY) {
      if (size > max_body) {
        bad = VSPEC_ERANGE;
        snprintf(err, errlen, "protobuf frame of %zu bytes is over the limit of %zu", size,
                 max_body);
      } else {
        zmq_msg_init(&m->body);
        zmq_msg_move(&m->body, &part);
        m->has_body = 1;
        phase = BLOBS;
      }
    } else {
      if (m->n_blobs == max_blobs) {
        bad = VSPEC_ERANGE;
        snprintf(err, errlen, "more than %d blob frames", max_blobs);
      } else if (size > max_blob) {
        bad = VSPEC_ERANGE;
        snprintf(err, errlen, "blob frame of %zu bytes is over the limit of %zu", size, max_blob);
      } else {
        zmq_msg_init(&m->blobs[m->n_blobs]);
        zmq_msg_move(&m->blobs[m->n_blobs], &part);
        m->n_blobs++;
      }
    }
    first = 0;
    if (!more) break;
    if (zmq_msg_recv(&part, sock, ZMQ_DONTWAIT) < 0) {
      /* Parts of one message arrive together; this is a socket failure. */
      int e = errno;
      zmq_msg_close(&part);
      vs_wire_msg_close(m);
      snprintf(err, errlen, "receive of a message part failed: %s", zmq_strerror(e));
      return VSPEC_EIO;
    }
  }
  zmq_msg_close(&part);
  if (!bad && !delimiter) {
    bad = VSPEC_EFORMAT;
    snprintf(err, errlen, "no empty delimiter frame before the protobuf frame");
  }
  if (!bad && !m->has_body) {
    bad = VSPEC_EFORMAT;
    snprintf(err, errlen, "no protobuf frame after the delimiter");
  }
  if (bad) {
    vs_wire_envelope env = m->env;
    vs_wire_msg_close(m);
    /* Without a delimiter the frames we took for routing may be payload; only the first
     * frame a ROUTER received is certainly a routing id. */
    if (!delimiter && env.n > 1) env.n = 1;
    m->env = env;
    return bad;
  }
  return 1;
}

int vs_wire_recv(void *sock, int envelope, vs_wire_msg *m, size_t max_body, size_t max_blob,
                 char *err, size_t errlen) {
  return wire_recv(sock, envelope, m, max_body, max_blob, VS_WIRE_MAX_BLOBS, err, errlen);
}

int vs_wire_recv_request(void *sock, int envelope, vs_wire_msg *m, size_t max_body,
                         size_t max_blob, char *err, size_t errlen) {
  return wire_recv(sock, envelope, m, max_body, max_blob, VS_WIRE_REQUEST_BLOBS, err, errlen);
}

void vs_wire_msg_close(vs_wire_msg *m) {
  if (m->has_body) zmq_msg_close(&m->body);
  for (int i = 0; i < m->n_blobs; i++) zmq_msg_close(&m->blobs[i]);
  m->has_body = 0;
  m->n_blobs = 0;
}

/* ---- bounded unpacking ------------------------------------------------------------------ */

typedef struct vs__block {
  size_t size;
  size_t pad; /* keeps the payload 16-byte aligned */
} vs__block;

static void *wire_alloc(void *data, size_t size) {
  vs_wire_alloc *a = data;
  if (size > a->cap || a->used > a->cap - size) {
    a->refused = 1;
    return NULL;
  }
  vs__block *b = malloc(sizeof *b + size);
  if (!b) return NULL;
  b->size = size;
  a->used += size;
  return b + 1;
}

static void wire_free(void *data, void *ptr) {
  vs_wire_alloc *a = data;
  if (!ptr) return;
  vs__block *b = (vs__block *)ptr - 1;
  a->used -= b->size;
  free(b);
}

void vs_wire_alloc_init(vs_wire_alloc *a, size_t cap) {
  a->base.alloc = wire_alloc;
  a->base.free = wire_free;
  a->base.allocator_data = a;
  a->cap = cap;
  a->used = 0;
  a->refused = 0;
}

static int wire_check_blobs(Vspec__Blob *const *blobs, size_t n, const vs_wire_msg *m, char *err,
                            size_t errlen) {
  if (n != (size_t)m->n_blobs) {
    snprintf(err, errlen, "the message declares %zu blob(s) but %d blob frame(s) follow", n,
             m->n_blobs);
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    if (blobs[i]->kind <= VSPEC__BLOB_KIND__BLOB_UNKNOWN ||
        blobs[i]->kind > VSPEC__BLOB_KIND__BLOB_CAPTION_MASK_U8) {
      snprintf(err, errlen, "blob %zu has unknown kind %d", i, (int)blobs[i]->kind);
      return -1;
    }
    size_t got = zmq_msg_size((zmq_msg_t *)&m->blobs[i]);
    if (blobs[i]->size != got) {
      snprintf(err, errlen, "blob %zu (%s) declares %llu bytes but its frame has %zu", i,
               vs_wire_blob_kind_name(blobs[i]->kind), (unsigned long long)blobs[i]->size, got);
      return -1;
    }
  }
  return 0;
}

Vspec__Request *vs_wire_unpack_request(const vs_wire_msg *m, vs_wire_alloc *a, int *code,
                                       char *err, size_t errlen) {
  zmq_msg_t *body = (zmq_msg_t *)&m->body;
  Vspec__Request *r =
      vspec__request__unpack(&a->base, zmq_msg_size(body), zmq_msg_data(body));
  if (!r) {
    *code = a->refused ? VSPEC__ERROR_CODE__ERR_TOO_LARGE : VSPEC__ERROR_CODE__ERR_MALFORMED;
    snprintf(err, errlen, "%s",
             *code == VSPEC__ERROR_CODE__ERR_TOO_LARGE
                 ? "request needs more memory to unpack than the limit allows"
                 : "request is not a valid vspec.Request protobuf");
    return NULL;
  }
  if (r->version != VSPEC__PROTOCOL_VERSION__PROTOCOL_V1) {
    *code = VSPEC__ERROR_CODE__ERR_VERSION;
    snprintf(err, errlen, "protocol version %u is not supported (this side speaks %d)",
             r->version, VSPEC__PROTOCOL_VERSION__PROTOCOL_V1);
    vs_wire_request_free(r, a);
    return NULL;
  }
  /* What protobuf-c let through: a NUL inside a string (the value would be cut short
   * without a word) or bytes that are not UTF-8 (they would come back in replies). */
  if (vs_wire_text_check(&vspec__request__descriptor, zmq_msg_data(body), zmq_msg_size(body),
                         err, errlen) ||
      wire_check_blobs(r->blobs, r->n_blobs, m, err, errlen)) {
    *code = VSPEC__ERROR_CODE__ERR_MALFORMED;
    vs_wire_request_free(r, a);
    return NULL;
  }
  if (r->body_case == VSPEC__REQUEST__BODY__NOT_SET) {
    *code = VSPEC__ERROR_CODE__ERR_MALFORMED;
    snprintf(err, errlen, "request has no body (submit, cancel, credit, status, plugins, "
             "reload, ping or resume)");
    vs_wire_request_free(r, a);
    return NULL;
  }
  return r;
}

Vspec__Event *vs_wire_unpack_event(const vs_wire_msg *m, vs_wire_alloc *a, int *code, char *err,
                                   size_t errlen) {
  zmq_msg_t *body = (zmq_msg_t *)&m->body;
  Vspec__Event *e = vspec__event__unpack(&a->base, zmq_msg_size(body), zmq_msg_data(body));
  if (!e) {
    *code = a->refused ? VSPEC__ERROR_CODE__ERR_TOO_LARGE : VSPEC__ERROR_CODE__ERR_MALFORMED;
    snprintf(err, errlen, "event is not a valid vspec.Event protobuf");
    return NULL;
  }
  if (e->version != VSPEC__PROTOCOL_VERSION__PROTOCOL_V1) {
    *code = VSPEC__ERROR_CODE__ERR_VERSION;
    snprintf(err, errlen, "protocol version %u is not supported (this side speaks %d)",
             e->version, VSPEC__PROTOCOL_VERSION__PROTOCOL_V1);
    vs_wire_event_free(e, a);
    return NULL;
  }
  if (wire_check_blobs(e->blobs, e->n_blobs, m, err, errlen)) {
    *code = VSPEC__ERROR_CODE__ERR_MALFORMED;
    vs_wire_event_free(e, a);
    return NULL;
  }
  return e;
}

void vs_wire_request_free(Vspec__Request *r, vs_wire_alloc *a) {
  if (r) vspec__request__free_unpacked(r, &a->base);
}

void vs_wire_event_free(Vspec__Event *e, vs_wire_alloc *a) {
  if (e) vspec__event__free_unpacked(e, &a->base);
}

int vs_wire_find_blob(Vspec__Blob *const *blobs, size_t n, int kind) {
  for (size_t i = 0; i < n; i++)
    if ((int)blobs[i]->kind == kind) return (int)i;
  return -1;
}

/* ---- sending ----------------------------------------------------------------------------- */

static void wire_free_blobs(vs_wire_blob *blobs, int from, int n) {
  for (int i = from; i < n; i++)
    if (blobs[i].free_fn) blobs[i].free_fn(blobs[i].data, blobs[i].hint);
}

/* Envelope and delimiter; the first frame decides whether the message goes out at all
 * (EHOSTUNREACH / EAGAIN under ROUTER_MANDATORY), later frames of an accepted message
 * always queue. */
static int wire_send_head(void *sock, const vs_wire_envelope *env, int flags) {
  for (int i = 0; env && i < env->n; i++)
    if (zmq_send(sock, env->id[i], env->len[i], ZMQ_SNDMORE | flags) < 0) return -errno;
  if (zmq_send(sock, "", 0, ZMQ_SNDMORE | flags) < 0) return -errno;
  return 0;
}

static int wire_send_tail(void *sock, zmq_msg_t *body, vs_wire_blob *blobs, int n_blobs,
                          int flags) {
  int rc = 0;
  if (zmq_msg_send(body, sock, (n_blobs ? ZMQ_SNDMORE : 0) | flags) < 0) {
    rc = -errno;
    zmq_msg_close(body);
    wire_free_blobs(blobs, 0, n_blobs);
    return rc;
  }
  for (int i = 0; i < n_blobs; i++) {
    zmq_msg_t part;
    int more = i + 1 < n_blobs ? ZMQ_SNDMORE : 0;
    if (blobs[i].free_fn) {
      if (zmq_msg_init_data(&part, blobs[i].data, blobs[i].size, blobs[i].free_fn,
                            blobs[i].hint)) {
        rc = -errno;
        wire_free_blobs(blobs, i, n_blobs);
        return rc;
      }
    } else {
      if (zmq_msg_init_size(&part, blobs[i].size)) {
        rc = -errno;
        wire_free_blobs(blobs, i + 1, n_blobs);
        return rc;
      }
      if (blobs[i].size) memcpy(zmq_msg_data(&part), blobs[i].data, blobs[i].size);
    }
    if (zmq_msg_send(&part, sock, more | flags) < 0) {
      rc = -errno;
      zmq_msg_close(&part);
      wire_free_blobs(blobs, i + 1, n_blobs);
      return rc;
    }
  }
  return 0;
}

/* `clean`: every string field made valid for the wire (events: what the daemon and the gateway
 * say). Requests go out as the user wrote them: the daemon refuses what is wrong, naming it. */
static int wire_send_packed(void *sock, const vs_wire_envelope *env, ProtobufCMessage *msg,
                            int clean, vs_wire_blob *blobs, int n_blobs, int flags) {
  zmq_msg_t body;
  int rc = 0;
  if (clean) {
    rc = vs_wire_pack(msg, &body);
  } else if (zmq_msg_init_size(&body, protobuf_c_message_get_packed_size(msg))) {
    rc = -errno;
  } else {
    protobuf_c_message_pack(msg, zmq_msg_data(&body));
  }
  if (rc) {
    wire_free_blobs(blobs, 0, n_blobs);
    return rc;
  }
  rc = wire_send_head(sock, env, flags);
  if (rc) {
    zmq_msg_close(&body);
    wire_free_blobs(blobs, 0, n_blobs);
    return rc;
  }
  return wire_send_tail(sock, &body, blobs, n_blobs, flags);
}

/* The one sender of both directions: an Event's or a Request's `version`, `n_blobs` and `blobs`
 * (the descriptors of the frames that follow) are set for the send, the caller's descriptors
 * put back after it. `clean` as for wire_send_packed. */
static int wire_send_msg(void *sock, const vs_wire_envelope *env, ProtobufCMessage *msg,
                         uint32_t *version, size_t *n_desc, Vspec__Blob ***desc, int clean,
                         vs_wire_blob *blobs, int n_blobs, int flags) {
  Vspec__Blob d[VS_WIRE_MAX_BLOBS], *dp[VS_WIRE_MAX_BLOBS];
  if (n_blobs > VS_WIRE_MAX_BLOBS) {
    wire_free_blobs(blobs, 0, n_blobs);
    return -EMSGSIZE;
  }
  for (int i = 0; i < n_blobs; i++) {
    vspec__blob__init(&d[i]);
    d[i].kind = blobs[i].kind;
    d[i].size = blobs[i].size;
    dp[i] = &d[i];
  }
  size_t saved_n = *n_desc;
  Vspec__Blob **saved = *desc;
  *n_desc = (size_t)n_blobs;
  *desc = dp;
  *version = VSPEC__PROTOCOL_VERSION__PROTOCOL_V1;
  int rc = wire_send_packed(sock, env, msg, clean, blobs, n_blobs, flags);
  *n_desc = saved_n;
  *desc = saved;
  return rc;
}

int vs_wire_send_event(void *sock, const vs_wire_envelope *env, Vspec__Event *ev,
                       vs_wire_blob *blobs, int n_blobs, int flags) {
  return wire_send_msg(sock, env, &ev->base, &ev->version, &ev->n_blobs, &ev->blobs, 1, blobs,
                       n_blobs, flags);
}

int vs_wire_send_request(void *sock, const vs_wire_envelope *env, Vspec__Request *rq,
                         vs_wire_blob *blobs, int n_blobs, int flags) {
  return wire_send_msg(sock, env, &rq->base, &rq->version, &rq->n_blobs, &rq->blobs, 0, blobs,
                       n_blobs, flags);
}

int vs_wire_forward(void *sock, const vs_wire_envelope *env, vs_wire_msg *m, int flags) {
  int rc = wire_send_head(sock, env, flags);
  /* Nothing queued: the message stays the caller's (another daemon, a retry later). */
  if (rc) return rc;
  if (zmq_msg_send(&m->body, sock, (m->n_blobs ? ZMQ_SNDMORE : 0) | flags) < 0) {
    rc = -errno;
    vs_wire_msg_close(m);
    return rc;
  }
  m->has_body = 0;
  for (int i = 0; i < m->n_blobs; i++) {
    if (zmq_msg_send(&m->blobs[i], sock, (i + 1 < m->n_blobs ? ZMQ_SNDMORE : 0) | flags) < 0) {
      rc = -errno;
      for (int j = i; j < m->n_blobs; j++) zmq_msg_close(&m->blobs[j]);
      m->n_blobs = 0;
      return rc;
    }
  }
  m->n_blobs = 0;
  return 0;
}

const char *vs_wire_error_name(int code) {
  switch (code) {
    case VSPEC__ERROR_CODE__ERR_MALFORMED: return "malformed";
    case VSPEC__ERROR_CODE__ERR_INVALID: return "invalid";
    case VSPEC__ERROR_CODE__ERR_BUSY: return "busy";
    case VSPEC__ERROR_CODE__ERR_CANCELLED: return "cancelled";
    case VSPEC__ERROR_CODE__ERR_DEADLINE: return "deadline";
    case VSPEC__ERROR_CODE__ERR_NOT_FOUND: return "not-found";
    case VSPEC__ERROR_CODE__ERR_FORBIDDEN: return "forbidden";
    case VSPEC__ERROR_CODE__ERR_SHUTTING_DOWN: return "shutting-down";
    case VSPEC__ERROR_CODE__ERR_INTERNAL: return "internal";
    case VSPEC__ERROR_CODE__ERR_TOO_LARGE: return "too-large";
    case VSPEC__ERROR_CODE__ERR_VERSION: return "version";
    case VSPEC__ERROR_CODE__ERR_UNAVAILABLE: return "unavailable";
    default: return "unknown";
  }
}

const char *vs_wire_blob_kind_name(int kind) {
  switch (kind) {
    case VSPEC__BLOB_KIND__BLOB_PNG: return "png";
    case VSPEC__BLOB_KIND__BLOB_TOKENS_I32LE: return "tokens";
    case VSPEC__BLOB_KIND__BLOB_STATUS_U8: return "status";
    case VSPEC__BLOB_KIND__BLOB_CAPTION_F32LE: return "caption";
    case VSPEC__BLOB_KIND__BLOB_CAPTION_MASK_U8: return "caption-mask";
    default: return "unknown";
  }
}
