/*
 * proto/curve_keys.h - CURVE key files, shared by vspecd, vspec-gateway and the vspec CLI.
 *
 * A key file (written by `vspec keygen`) holds Z85 text, 40 characters per key:
 *     # vspec CURVE key pair
 *     public = <40 characters>
 *     secret = <40 characters>
 * A file with a single bare 40-character key is read as that key, whatever it is asked for.
 * Secret-key files are created with mode 0600. PREFIX.pub holds a comment and the public
 * line alone, so that it can be appended as it is to a daemon's allow-list (daemon/allow_list.h).
 * A '#' starts a comment line.
 */
#ifndef VS_CURVE_KEYS_H
#define VS_CURVE_KEYS_H

#include <stddef.h>

int vs_curve_is_z85(const char *s, size_t n);

/* One line of a key file or an allow-list, as the readers see it. */
enum { VS_CURVE_LINE_BLANK = 0, VS_CURVE_LINE_KEY = 1, VS_CURVE_LINE_BAD = 2 };
typedef struct vs_curve_line {
  int kind;         /* VS_CURVE_LINE_*: blank or a comment, a key, anything else */
  char label[8];    /* "public" or "secret" for a "NAME = KEY" line, "" for a bare key */
  char key[41];     /* the key, when kind is VS_CURVE_LINE_KEY */
  const char *at;   /* in the line: where the key is or was expected (for messages) */
  const char *rest; /* in the line: what follows a key, blanks skipped; NULL for no key */
} vs_curve_line;
void vs_curve_parse_line(const char *line, vs_curve_line *out);
/* which = "public" or "secret"; key gets 40 characters and a NUL. */
int vs_curve_read_key(const char *path, const char *which, char key[41], char *err,
                      size_t errlen);
/* `text` is a Z85 key itself, or the path of a key file. */
int vs_curve_key_arg(const char *text, const char *which, char key[41], char *err, size_t errlen);
/* Writes a new key pair: PREFIX.key (both keys, 0600) and PREFIX.pub (the public key). */
int vs_curve_keygen(const char *prefix, char public_key[41], char *err, size_t errlen);

#endif /* VS_CURVE_KEYS_H */
