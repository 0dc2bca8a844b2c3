/*
 * daemon/allow_list.h - the CURVE allow-list file: which client public keys may connect to a
 * CURVE endpoint (vspecd's [curve] allowed_clients, vspec-gateway's
 * --curve-allow).
 *
 * One client per line, in either form `vspec keygen NAME` hands out:
 *     public = <40 Z85 characters> [name]     the line of NAME.pub, as written
 *     <40 Z85 characters> [name]              the key keygen prints
 * so `cat alice.pub >> clients.allow` works. '#' starts a comment line (NAME.pub's first line
 * is one; a key that starts with '#' is still a key, proto/curve_keys.h says how they are
 * told apart) and ends the name. The name, for the log, defaults to the key's first 8
 * characters. A `secret = ...` line (a NAME.key file) is refused: a client's secret key
 * belongs with the client only.
 *
 * The daemon's ZAP handler (daemon/zap.c) and `vspecd --check` read the file with this one
 * parser, so a list --check passes is a list the daemon takes.
 */
#ifndef VS_ALLOW_LIST_H
#define VS_ALLOW_LIST_H

#include <stddef.h>
#include <stdint.h>

#define VS_ALLOW_LIST_MAX 4096 /* keys in one file */

typedef struct vs_allow_entry {
  uint8_t key[32]; /* the public key, decoded */
  char name[64];
} vs_allow_entry;

/* Reads the allow-list at `path`: 0 with *out (malloc'ed, the caller frees it) holding *n
 * entries, or a negative status with a message "PATH:LINE: what is wrong, and the forms that
 * are right". An empty list is valid (nobody gets in). */
int vs_allow_list_read(const char *path, vs_allow_entry **out, int *n, char *err,
                       size_t errlen);

#endif /* VS_ALLOW_LIST_H */
