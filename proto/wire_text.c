#include "proto/wire_text.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/text.h"
#include "vspec/types.h"

/* No message type of the protocol nests deeper than this (proto/vspec.proto). */
#define VS__MAX_DEPTH 8

/* ---- incoming: the packed bytes --------------------------------------------------------- */

static int wt_varint(const uint8_t *p, size_t n, size_t *at, uint64_t *v) {
  uint64_t x = 0;
  for (int shift = 0; shift < 64 && *at < n; shift += 7) {
    uint8_t b = p[(*at)++];
    x |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = x;
      return 0;
    }
  }
  return -1;
}

static int wt_check_string(const char *path, const uint8_t *p, size_t n, char *err,
                            size_t errlen) {
  const uint8_t *nul = memchr(p, 0, n);
  size_t upto = nul ? (size_t)(nul - p) : n;
  size_t at = vs_text_utf8_prefix((const char *)p, upto);
  if (!nul && at == n) return VSPEC_OK;
  char q[96], b[8];
  vs_text_clean(b, sizeof b, (const char *)p + at, 1, VS_TEXT_ASCII | VS_TEXT_BACKSLASH);
  snprintf(err, errlen, "%s: %s has %s at offset %zu: %s", path,
           vs_text_quote(q, sizeof q, (const char *)p, n), b, at,
           at < upto ? "a string field must be UTF-8"
                     : "a string field must not hold NUL bytes (it would end the value there)");
  return VSPEC_EFORMAT;
}

static int wt_scan(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, char *path,
                    size_t plen, int depth, char *err, size_t errlen);

/* A length-delimited field `id` of message d at p[0..len): a string is checked, a message
 * read in turn; path grows by the field's name meanwhile. */
static int wt_field(const ProtobufCMessageDescriptor *d, uint64_t id, const uint8_t *p,
                     size_t len, char *path, size_t plen, int depth, char *err, size_t errlen) {
  const ProtobufCFieldDescriptor *f =
      id <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)id) : NULL;
  if (!f || (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE))
    return VSPEC_OK; /* bytes keep their length (ProtobufCBinaryData); unknown fields unread */
  size_t at = strlen(path), nl = strlen(f->name);
  if (at + 1 + nl < plen) { /* deeper than the buffer: the path stays short, nothing else */
    if (at) path[at] = '.';
    memcpy(path + at + (at > 0), f->name, nl + 1);
  }
  int rc = f->type == PROTOBUF_C_TYPE_STRING
               ? wt_check_string(path, p, len, err, errlen)
               : wt_scan(f->descriptor, p, len, path, plen, depth + 1, err, errlen);
  path[at] = 0;
  return rc;
}

static int wt_scan(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, char *path,
                    size_t plen, int depth, char *err, size_t errlen) {
  if (depth > VS__MAX_DEPTH) return VSPEC_OK;
  size_t at = 0;
  while (at < n) {
    uint64_t key, v;
    if (wt_varint(p, n, &at, &key)) goto bad;
    switch (key & 7) {
      case 0:
        if (wt_varint(p, n, &at, &v)) goto bad;
        break;
      case 1:
        if (n - at < 8) goto bad;
        at += 8;
        break;
      case 5:
        if (n - at < 4) goto bad;
        at += 4;
        break;
      case 2: {
        if (wt_varint(p, n, &at, &v) || v > n - at) goto bad;
        int rc = wt_field(d, key >> 3, p + at, (size_t)v, path, plen, depth, err, errlen);
        if (rc) return rc;
        at += (size_t)v;
        break;
      }
      default: goto bad; /* groups: nothing of ours has them, and they could hide a string */
    }
  }
  return VSPEC_OK;
bad:
  snprintf(err, errlen, "%s%sthe protobuf cannot be read through (wire type or length)",
           path, *path ? ": " : "");
  return VSPEC_EFORMAT;
}

int vs_wire_text_check(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                       char *err, size_t errlen) {
  char path[256] = "";
  return wt_scan(d, buf, len, path, sizeof path, 0, err, errlen);
}

/* ---- outgoing: the message struct --------------------------------------------------------- */

/* The strings replaced while packing, to put back afterwards. */
typedef struct vs__fixes {
  struct {
    char **slot;
    char *orig;
  } *v;
  size_t n, cap;
  int oom;
} vs__fixes;

static void wt_clean_one(char **slot, vs__fixes *fx) {
  const char *s = *slot;
  size_t n = strlen(s);
  if (n <= VS_WIRE_TEXT_MAX && vs_text_clean_prefix(s, n) == n) return; /* the usual case */
  if (fx->n == fx->cap) {
    size_t cap = fx->cap ? 2 * fx->cap : 8;
    void *v = realloc(fx->v, cap * sizeof *fx->v);
    if (!v) {
      fx->oom = 1;
      return;
    }
    fx->v = v;
    fx->cap = cap;
  }
  char *c = malloc(VS_WIRE_TEXT_MAX + 1);
  if (!c) {
    fx->oom = 1;
    return;
  }
  vs_text_clean(c, VS_WIRE_TEXT_MAX + 1, s, n, 0);
  fx->v[fx->n].slot = slot;
  fx->v[fx->n].orig = *slot;
  fx->n++;
  *slot = c;
}

static void wt_clean_msg(ProtobufCMessage *m, vs__fixes *fx, int depth) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  char *base = (char *)m;
  for (unsigned i = 0; i < d->n_fields && depth <= VS__MAX_DEPTH; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    /* A oneof's members share their storage: only the one its case names is there. */
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
        *(const uint32_t *)(base + f->quantifier_offset) != f->id)
      continue;
    void **items = (void **)(base + f->offset);
    size_t n = 1;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      n = *(const size_t *)(base + f->quantifier_offset);
      items = *(void ***)(base + f->offset);
    }
    for (size_t k = 0; k < n; k++) {
      if (!items[k]) continue;
      if (f->type == PROTOBUF_C_TYPE_STRING) wt_clean_one((char **)&items[k], fx);
      else wt_clean_msg(items[k], fx, depth + 1);
    }
  }
}

int vs_wire_pack(ProtobufCMessage *msg, zmq_msg_t *out) {
  vs__fixes fx = {0};
  wt_clean_msg(msg, &fx, 0);
  int rc = fx.oom ? -ENOMEM : 0;
  if (!rc) {
    size_t len = protobuf_c_message_get_packed_size(msg);
    if (zmq_msg_init_size(out, len)) rc = -errno;
    else protobuf_c_message_pack(msg, zmq_msg_data(out));
  }
  for (size_t i = fx.n; i-- > 0;) {
    free(*fx.v[i].slot);
    *fx.v[i].slot = fx.v[i].orig;
  }
  free(fx.v);
  return rc;
}
