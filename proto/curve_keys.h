/*
 * proto/curve_keys.h - CURVE key files, shared by vspecd, vspec-broker and the vspec CLI.
 *
 * A key file (written by `vspec keygen`) holds Z85 text, 40 characters per key:
 *     # vspec CURVE key pair
 *     public = <40 characters>
 *     secret = <40 characters>
 * A file with a single bare 40-character key is read as that key, whatever it is asked for.
 * Secret-key files are created with mode 0600.
 */
#ifndef VS_CURVE_KEYS_H
#define VS_CURVE_KEYS_H

#include <stddef.h>

int vs_curve_is_z85(const char *s, size_t n);
/* which = "public" or "secret"; key gets 40 characters and a NUL. */
int vs_curve_read_key(const char *path, const char *which, char key[41], char *err,
                      size_t errlen);
/* `text` is a Z85 key itself, or the path of a key file. */
int vs_curve_key_arg(const char *text, const char *which, char key[41], char *err, size_t errlen);
/* Writes a new key pair: PREFIX.key (both keys, 0600) and PREFIX.pub (the public key). */
int vs_curve_keygen(const char *prefix, char public_key[41], char *err, size_t errlen);

#endif /* VS_CURVE_KEYS_H */
