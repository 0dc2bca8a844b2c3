#include "fleet/fleet_event.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vspec/types.h"

static void fe_put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t fe_get32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int vs_fleet_frames_encode(const char magic[4], const void *const *frame, const size_t *size,
                           int n, unsigned char **out, size_t *out_len) {
  *out = NULL;
  *out_len = 0;
  if (n < 1 || n > VS_FLEET_MAX_FRAMES) return VSPEC_EINVAL;
  size_t total = 5 + 4 * (size_t)n;
  for (int i = 0; i < n; i++) {
    if (size[i] > UINT32_MAX || total + size[i] < total) return VSPEC_EINVAL;
    total += size[i];
  }
  unsigned char *buf = malloc(total), *p = buf;
  if (!buf) return VSPEC_ENOMEM;
  memcpy(p, magic, 4);
  p[4] = (unsigned char)n;
  p += 5;
  for (int i = 0; i < n; i++, p += 4) fe_put32(p, (uint32_t)size[i]);
  for (int i = 0; i < n; i++) {
    if (size[i]) memcpy(p, frame[i], size[i]);
    p += size[i];
  }
  *out = buf;
  *out_len = total;
  return VSPEC_OK;
}

int vs_fleet_frames_decode(const char magic[4], const unsigned char *data, size_t len,
                           const unsigned char **frame, size_t *size, int *n, char *err,
                           size_t errlen) {
  *n = 0;
  if (!data || len < 5 || memcmp(data, magic, 4)) {
    snprintf(err, errlen, "a fleet value of %zu bytes does not start with %.4s", len, magic);
    return VSPEC_EFORMAT;
  }
  int k = data[4];
  if (k < 1 || k > VS_FLEET_MAX_FRAMES || len < 5 + 4 * (size_t)k) {
    snprintf(err, errlen, "a fleet value declares %d frames (1-%d) in %zu bytes", k,
             VS_FLEET_MAX_FRAMES, len);
    return VSPEC_EFORMAT;
  }
  size_t at = 5 + 4 * (size_t)k;
  for (int i = 0; i < k; i++) {
    size[i] = fe_get32(data + 5 + 4 * (size_t)i);
    if (size[i] > len - at) {
      snprintf(err, errlen, "a fleet value's frame %d (%zu bytes) runs past its end", i, size[i]);
      return VSPEC_EFORMAT;
    }
    frame[i] = data + at;
    at += size[i];
  }
  if (at != len) {
    snprintf(err, errlen, "a fleet value has %zu bytes after its frames", len - at);
    return VSPEC_EFORMAT;
  }
  *n = k;
  return VSPEC_OK;
}

int vs_fleet_event_encode(const Vspec__Event *ev, const void *const *blob_data,
                          const size_t *blob_size, int n_blobs, unsigned char **out,
                          size_t *out_len) {
  *out = NULL;
  *out_len = 0;
  if (n_blobs < 0 || n_blobs > VS_WIRE_MAX_BLOBS || ev->n_blobs != (size_t)n_blobs)
    return VSPEC_EINVAL;
  for (int i = 0; i < n_blobs; i++)
    if (ev->blobs[i]->size != blob_size[i]) return VSPEC_EINVAL;
  size_t body_len = protobuf_c_message_get_packed_size(&ev->base);
  uint8_t *body = malloc(body_len ? body_len : 1);
  if (!body) return VSPEC_ENOMEM;
  protobuf_c_message_pack(&ev->base, body);
  const void *frame[VS_FLEET_MAX_FRAMES] = {body};
  size_t size[VS_FLEET_MAX_FRAMES] = {body_len};
  for (int i = 0; i < n_blobs; i++) {
    frame[1 + i] = blob_data[i];
    size[1 + i] = blob_size[i];
  }
  int rc = vs_fleet_frames_encode("VSE1", frame, size, 1 + n_blobs, out, out_len);
  free(body);
  return rc;
}

int vs_fleet_event_decode(const unsigned char *data, size_t len, vs_wire_alloc *a,
                          Vspec__Event **ev, vs_wire_blob *blobs, int *n_blobs, char *err,
                          size_t errlen) {
  *ev = NULL;
  *n_blobs = 0;
  const unsigned char *frame[VS_FLEET_MAX_FRAMES];
  size_t size[VS_FLEET_MAX_FRAMES];
  int n, rc = vs_fleet_frames_decode("VSE1", data, len, frame, size, &n, err, errlen);
  if (rc) return rc;
  Vspec__Event *e = vspec__event__unpack(&a->base, size[0], frame[0]);
  if (!e) {
    snprintf(err, errlen, "a fleet event is not a vspec.Event%s",
             a->refused ? " within the unpack budget" : "");
    return VSPEC_EFORMAT;
  }
  if (e->n_blobs != (size_t)(n - 1)) {
    snprintf(err, errlen, "a fleet event describes %zu blobs and carries %d", e->n_blobs, n - 1);
    vs_wire_event_free(e, a);
    return VSPEC_EFORMAT;
  }
  for (int i = 1; i < n; i++) {
    if (e->blobs[i - 1]->size != size[i]) {
      snprintf(err, errlen, "a fleet event's blob %d is %zu bytes, its descriptor says %llu",
               i - 1, size[i], (unsigned long long)e->blobs[i - 1]->size);
      vs_wire_event_free(e, a);
      return VSPEC_EFORMAT;
    }
    blobs[i - 1] = (vs_wire_blob){.kind = e->blobs[i - 1]->kind, .data = (void *)frame[i],
                                  .size = size[i]};
  }
  *ev = e;
  *n_blobs = n - 1;
  return VSPEC_OK;
}
