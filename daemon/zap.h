/*
 * daemon/zap.h - ZAP (RFC 27) handler: CURVE clients are let in only when their public key is
 * on the allow-list.
 *
 * libzmq asks the handler bound at inproc://zeromq.zap.01 about every new CURVE connection;
 * the handler must be bound before the server socket accepts connections, and there is one
 * per ZeroMQ context. It runs on its own small thread with a REP socket, so an allow-list
 * check never waits behind the job loop.
 *
 * Allow-list file: daemon/allow_list.h (NAME.pub lines or bare keys, with names). The
 * connection's user id (zmq_msg_gets "User-Id") is the client's public key in Z85, so it
 * names exactly one key whatever names the list gives (job ownership rests on it); the name
 * (default: the key's first 8 characters) is for the log, through vs_zap_name.
 */
#ifndef VS_ZAP_H
#define VS_ZAP_H

#include <stddef.h>

typedef struct vs_zap vs_zap;

int vs_zap_start(void *zctx, const char *allow_file, vs_zap **out, char *err, size_t errlen);
void vs_zap_stop(vs_zap *z);
int vs_zap_count(const vs_zap *z); /* keys on the list */
/* The allow-list name of a user id (a Z85 public key), or NULL. The list does not change
 * after vs_zap_start, so any thread may ask. */
const char *vs_zap_name(const vs_zap *z, const char *user_id);

#endif /* VS_ZAP_H */
