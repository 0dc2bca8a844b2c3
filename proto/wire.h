/*
 * proto/wire.h - one protocol message on ZeroMQ: routing envelope, empty delimiter, the
 * protobuf frame and its blob frames (proto/vspec.proto explains the layout).
 *
 * Shared by vspecd, vspec-gateway, the vspec CLI and the tests. Everything that touches
 * untrusted bytes is here, so it is fuzzed once for all of them: frame counts and sizes are
 * checked before anything is unpacked, and unpacking runs under an allocator with a byte
 * budget, so a hostile message cannot make protobuf-c allocate more than a fixed amount.
 */
#ifndef VS_WIRE_H
#define VS_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include "proto/vspec.pb-c.h"

#define VS_WIRE_MAX_ENVELOPE 4 /* routing frames before the delimiter (stacked proxies) */
#define VS_WIRE_MAX_ID 255     /* libzmq routing ids are 1..255 bytes */
#define VS_WIRE_MAX_BLOBS 4    /* blob frames after the protobuf frame */
/* A request carries at most a caption embedding and its mask: a message with more frames is
 * refused as soon as the frame over the count is read (see vs_wire_recv_request). */
#define VS_WIRE_REQUEST_BLOBS 2
#define VS_WIRE_MAX_USER_ID 127 /* longest ZAP user id kept (ours are 40-character keys) */

/* The routing frames a ROUTER (or a chain of them) put in front of a message; replies go
 * back with the same envelope. */
typedef struct vs_wire_envelope {
  int n;
  uint8_t len[VS_WIRE_MAX_ENVELOPE];
  uint8_t id[VS_WIRE_MAX_ENVELOPE][VS_WIRE_MAX_ID];
} vs_wire_envelope;

int vs_wire_envelope_equal(const vs_wire_envelope *a, const vs_wire_envelope *b);
/* FNV-1a over the envelope, for hash tables. */
uint64_t vs_wire_envelope_hash(const vs_wire_envelope *e);
/* Printable short form ("a3f0..") for logs. */
void vs_wire_envelope_text(const vs_wire_envelope *e, char *buf, size_t buflen);

/* One received message. */
typedef struct vs_wire_msg {
  vs_wire_envelope env;
  int has_body;
  zmq_msg_t body;
  int n_blobs;
  zmq_msg_t blobs[VS_WIRE_MAX_BLOBS];
  /* The connection's "User-Id" metadata (the ZAP handler's answer; daemon/zap.c makes it the
   * client's CURVE public key), "" without authentication. Unlike the routing id, which a
   * peer may choose itself (ZMQ_ROUTING_ID), it cannot be forged by a peer without the
   * matching secret key. */
  char user_id[VS_WIRE_MAX_USER_ID + 1];
} vs_wire_msg;

/* Receives one whole multipart message without blocking. `envelope` = 1 on a ROUTER (frames
 * up to the empty delimiter are the envelope), 0 on a DEALER talking to a ROUTER (the message
 * must still start with the delimiter). Returns
 *    1  a well-formed message in *m (release with vs_wire_msg_close),
 *    0  nothing to read (EAGAIN),
 *   VSPEC_EFORMAT / VSPEC_ERANGE  a malformed or oversized message: every part was consumed,
 *      m->env holds what envelope could be recovered (m->env.n == 0 if none) and err says
 *      what was wrong; nothing to close,
 *   another negative status on a socket error (errno in err).
 * `max_body` bounds the protobuf frame, `max_blob` each blob frame; at most
 * VS_WIRE_MAX_BLOBS blob frames.
 *
 * libzmq delivers a multipart message only once all of its frames are in, and
 * ZMQ_MAXMSGSIZE bounds each frame, not their number: the frames of one message are in
 * memory before any check here can run. What this can do is refuse such a message at the
 * first frame over the count, release every frame as it is read, and never unpack it; the
 * real bound on a stranger's memory use is CURVE (only allow-listed keys get to send). */
int vs_wire_recv(void *sock, int envelope, vs_wire_msg *m, size_t max_body, size_t max_blob,
                 char *err, size_t errlen);
/* The same for requests: at most VS_WIRE_REQUEST_BLOBS blob frames. */
int vs_wire_recv_request(void *sock, int envelope, vs_wire_msg *m, size_t max_body,
                         size_t max_blob, char *err, size_t errlen);
void vs_wire_msg_close(vs_wire_msg *m);

/* protobuf-c allocator with a byte budget: allocations past `cap` fail, so the unpacker
 * gives up instead of growing without bound (protobuf-c has no size or depth limits). */
typedef struct vs_wire_alloc {
  ProtobufCAllocator base; /* must stay first */
  size_t cap, used;
  int refused; /* an allocation was refused: the message needed more than cap */
} vs_wire_alloc;
void vs_wire_alloc_init(vs_wire_alloc *a, size_t cap);

/* Unpacks the body of m. The result is freed with vs_wire_request_free (same allocator).
 * NULL on failure, with *code a Vspec__ErrorCode (MALFORMED, VERSION, TOO_LARGE) and a
 * message. Checks the protocol version and that the declared blobs match the blob frames
 * (count, sizes, known kinds). */
Vspec__Request *vs_wire_unpack_request(const vs_wire_msg *m, vs_wire_alloc *a, int *code,
                                       char *err, size_t errlen);
Vspec__Event *vs_wire_unpack_event(const vs_wire_msg *m, vs_wire_alloc *a, int *code, char *err,
                                   size_t errlen);
void vs_wire_request_free(Vspec__Request *r, vs_wire_alloc *a);
void vs_wire_event_free(Vspec__Event *e, vs_wire_alloc *a);

/* Index of the first blob of `kind` in the message's descriptors, or -1. */
int vs_wire_find_blob(Vspec__Blob *const *blobs, size_t n, int kind);

/* A blob to send. With `free_fn` set, the frame takes ownership of `data` and calls
 * free_fn(data, hint) later, possibly from a libzmq I/O thread (so it must be thread-safe,
 * as free() is); with free_fn NULL the bytes are copied. */
typedef struct vs_wire_blob {
  int kind; /* Vspec__BlobKind */
  void *data;
  size_t size;
  void (*free_fn)(void *data, void *hint);
  void *hint;
} vs_wire_blob;

/* Sends envelope, delimiter, the packed message and its blobs as one multipart message.
 * `msg` is an Event or a Request (its `blobs` descriptors are filled in here from `blobs`).
 * flags: ZMQ_DONTWAIT or 0. Returns 0 or -errno (-EAGAIN: peer's queue full; -EHOSTUNREACH:
 * the ROUTER no longer knows the peer). Ownership of blobs with free_fn passes to the call in
 * every case (freed on failure). */
int vs_wire_send_event(void *sock, const vs_wire_envelope *env, Vspec__Event *ev,
                       vs_wire_blob *blobs, int n_blobs, int flags);
int vs_wire_send_request(void *sock, const vs_wire_envelope *env, Vspec__Request *rq,
                         vs_wire_blob *blobs, int n_blobs, int flags);

/* Raw forwarding (the gateway): sends env, delimiter, then the given frames (moved, not copied).
 * Returns 0 or -errno. When the head (envelope and delimiter) is refused (-EAGAIN: the
 * peer's queue is full or, with ZMQ_IMMEDIATE, nobody is connected; -EHOSTUNREACH: an
 * unknown peer under ROUTER_MANDATORY) nothing was queued and *m is left as it was: the
 * caller may send it elsewhere, keep it for a retry, or close it. When a later frame fails
 * (not expected: libzmq takes the rest of a message whose first frame it took), the frames
 * are released and m->has_body is 0. vs_wire_msg_close is safe on *m in every case. */
int vs_wire_forward(void *sock, const vs_wire_envelope *env, vs_wire_msg *m, int flags);

const char *vs_wire_error_name(int code); /* "busy", "invalid", ... */
const char *vs_wire_blob_kind_name(int kind);

#endif /* VS_WIRE_H */
