/*
 * proto/wire_text.h - `string` fields on the wire: what comes in must be UTF-8 without NUL
 * bytes, what goes out is made valid on its way (core/text.h).
 *
 * protobuf-c checks neither. It copies a `string` field into a NUL-terminated C string, so a
 * NUL inside the value cuts it short without a word ("micro\0junk" arrives as "micro"), and
 * bytes that are not UTF-8 pass through, to come back in replies that strict decoders
 * (proto3, Go, Java, Python) refuse whole. The length a value had on the wire is gone once
 * it is unpacked, so an incoming message is read a second time here, its string fields
 * found through the message descriptors.
 */
#ifndef VS_WIRE_TEXT_H
#define VS_WIRE_TEXT_H

#include <stddef.h>
#include <stdint.h>
#include <zmq.h>

#include <protobuf-c/protobuf-c.h>

/* Bytes of one outgoing string field at most (a path of VS_CONF_PATH fits escaped). */
#define VS_WIRE_TEXT_MAX 4096

/* Checks every `string` field of the packed message buf[0..len) of type d, nested messages
 * included: 0, or VSPEC_EFORMAT with a message naming the field ("submit.model"), the value
 * (quoted), the byte and its offset. For a message protobuf-c has unpacked already. */
int vs_wire_text_check(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t len,
                       char *err, size_t errlen);

/* Packs msg into *out (initialised here) with every `string` field as vs_text_clean makes it
 * (valid UTF-8, control characters escaped, at most VS_WIRE_TEXT_MAX bytes). The caller's
 * strings are back as they were when it returns. Returns 0 or -errno. */
int vs_wire_pack(ProtobufCMessage *msg, zmq_msg_t *out);

#endif /* VS_WIRE_TEXT_H */
