/*
 * fleet/fleet_event.h - one job event as it is kept in Redis in fleet mode (issue 13;
 * DESIGN.md, "Fleet mode").
 *
 * A daemon's agent (fleet/fleet_agent.c) writes each event of a fleet job to the job's event
 * stream; gateways read them back and send them to clients. On the wire an event is several
 * ZeroMQ frames (the protobuf Event, then its blob frames: PNG results, previews, token
 * maps); in Redis it is one value:
 *
 *   "VSE1" | n (1 byte, 1 + blobs) | n lengths (4 bytes each, little-endian) | the n frames
 *
 * The first frame is the packed vspec.Event, whose `blobs` describe the others in order, as
 * on the wire. Decoding checks every length against the value's size before reading, unpacks
 * under a byte budget and checks the blob descriptors against the frames, so a corrupt or
 * foreign value in Redis is an error, never a crash.
 */
#ifndef VS_FLEET_EVENT_H
#define VS_FLEET_EVENT_H

#include <stddef.h>

#include "proto/wire.h"

/* The frame codec underneath, also used for a job's payload in the jobs stream (the packed
 * vspec.Request and its blob frames, magic "VSR1"): n frames (1-5) into one malloc'd value,
 * and back (frame[i] then points into `data`). Returns 0, VSPEC_EINVAL / VSPEC_EFORMAT (with
 * a message) or VSPEC_ENOMEM. */
#define VS_FLEET_MAX_FRAMES (1 + VS_WIRE_MAX_BLOBS)
int vs_fleet_frames_encode(const char magic[4], const void *const *frame, const size_t *size,
                           int n, unsigned char **out, size_t *out_len);
int vs_fleet_frames_decode(const char magic[4], const unsigned char *data, size_t len,
                           const unsigned char **frame, size_t *size, int *n, char *err,
                           size_t errlen);

/* Packs ev (its `blobs` already describing blob data[0..n_blobs)) and the blob bytes into one
 * malloc'd value. Returns 0, VSPEC_EINVAL (too many blobs, a size mismatch) or VSPEC_ENOMEM. */
int vs_fleet_event_encode(const Vspec__Event *ev, const void *const *blob_data,
                          const size_t *blob_size, int n_blobs, unsigned char **out,
                          size_t *out_len);

/* Unpacks a value written by vs_fleet_event_encode. *ev is allocated from `a` (free it with
 * vs_wire_event_free(*ev, a)); blobs[i] point into `data` (free_fn NULL: vs_wire_send_event
 * copies them), kinds and sizes from the descriptors. Returns 0 or VSPEC_EFORMAT with a
 * message. */
int vs_fleet_event_decode(const unsigned char *data, size_t len, vs_wire_alloc *a,
                          Vspec__Event **ev, vs_wire_blob *blobs, int *n_blobs, char *err,
                          size_t errlen);

#endif /* VS_FLEET_EVENT_H */
