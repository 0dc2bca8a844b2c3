/*
 * daemon/http_internal.h - what the files of the HTTP endpoint share (not a public API):
 *   http_server.c    libmicrohttpd's lifecycle, the listening socket, routing, bodies,
 *                    replies and errors
 *   http_generate.c  POST /v1/images/generations
 *   http_metrics.c   GET /health and GET /metrics (the Prometheus exposition)
 */
#ifndef VS_HTTP_INTERNAL_H
#define VS_HTTP_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>

#include "clients/conn.h"
#include "daemon/http_server.h"

struct MHD_Daemon;

struct vs_http {
  const vs_daemon_config *cfg;
  void *zctx;
  char endpoint[128];
  struct MHD_Daemon *mhd;
  int fd; /* the listening socket, ours: MHD is handed it */
  int port;
  atomic_int stopping;
};

/* A reply being built: status, body (malloc'd), its type, and Retry-After (0 = none). */
typedef struct vs_http_reply {
  int status;
  const char *type;
  char *body;
  size_t len;
  int retry_after_s;
  char seed[24]; /* X-Vspec-Seed on a raw PNG answer, "" = none */
} vs_http_reply;

/* An OpenAI-style error: {"error": {"message", "type", "param", "code": null}}. param may
 * be NULL. */
void vs__http_error(vs_http_reply *r, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A JSON body (takes the reference). */
void vs__http_json(vs_http_reply *r, int status, void *json);

/* Opens a connection to the daemon for one request. */
int vs__http_connect(vs_http *h, vs_conn *c, char *err, size_t errlen);

/* POST /v1/images/generations; client_fd is the HTTP connection's socket, watched for a
 * client that goes away. */
void vs__http_generate(vs_http *h, int client_fd, const char *body, size_t len,
                       vs_http_reply *r);
void vs__http_health(vs_http *h, vs_http_reply *r);
void vs__http_metrics(vs_http *h, vs_http_reply *r);

#endif /* VS_HTTP_INTERNAL_H */
