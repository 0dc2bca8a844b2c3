/*
 * http/http_internal.h - what the files of the HTTP endpoint share (not a public API):
 *   http_server.c    libmicrohttpd's lifecycle, the listening socket, routing, bodies,
 *                    sending; the endpoint as a front of the service (http/http_server.h)
 *   http_addr.c      the listening address, and the [http] check (http/http_addr.h)
 *   http_reply.c     the answers' bodies: JSON and OpenAI-style errors
 *   http_daemon.c    the connection to the daemon, its status, its errors as HTTP answers
 *   http_generate.c  POST /v1/images/generations: the request's fields and the answer
 *   http_answer.c    the pieces of a generation's answer, plain or streamed
 *   http_stream.c    a streamed generation (server-sent events)
 *   http_jobs.c      the n jobs of one generation, run together over one connection
 *   http_models.c    GET /v1/models and /v1/models/{id}, from the daemon's status
 *   http_metrics.c   GET /health and GET /metrics (the Prometheus exposition)
 *   http_guard.c     the connections: request deadline, per-address limit, the reserve
 *   http_headers.c   the request's headers held to the letter (smuggling)
 */
#ifndef VS_HTTP_INTERNAL_H
#define VS_HTTP_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "client/conn.h"
#include "core/log_limit.h"
#include "daemon/config.h"
#include "http/http_addr.h"


/* Connections MHD may take past max_connections: a new one displaces the oldest that has
 * not sent its request, or serves /health and /metrics only (http_guard.c). */
#define VS_HTTP_RESERVE 4

/* The connections of the endpoint, tracked (http_guard.c). */
typedef struct vs_http_guard {
  pthread_mutex_t mu;
  struct vs__http_conn *conns;
  int cap, per_address, inited, running;
  pthread_t thread;
  atomic_int stop;
  vs_log_limit log;
  /* for /metrics */
  atomic_ullong closed_deadline, closed_evicted, refused_address, refused_busy;
} vs_http_guard;

typedef struct vs_http vs_http;

struct vs_http {
  const vs_daemon_config *cfg;
  void *zctx;
  char endpoint[128];
  struct MHD_Daemon *mhd;
  int fd; /* the listening socket, ours: MHD is handed it */
  int port;
  atomic_int stopping;
  vs_http_guard guard;
};

typedef struct vs_http_stream vs_http_stream;

/* A reply being built: status, body (malloc'd), its type, and Retry-After (0 = none); or a
 * stream of server-sent events (http_stream.c). */
typedef struct vs_http_reply {
  int status;
  const char *type;
  char *body;
  size_t len;
  int retry_after_s;
  char seed[24]; /* X-Vspec-Seed on a raw PNG answer, "" = none */
  vs_http_stream *stream; /* status 200 and the body from this */
} vs_http_reply;

/* ---- the answers' bodies (http_reply.c) ---- */

/* An OpenAI-style error: {"error": {"message", "type", "param", "code"}}. param may be NULL;
 * code is a short machine-readable word (OpenAI's clients show it), NULL for the status's
 * own ("invalid_value" for a 400, "queue_full" for a 429 ...). */
void vs__http_error(vs_http_reply *r, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void vs__http_error_code(vs_http_reply *r, int status, const char *param, const char *code,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* A JSON body (takes the reference). */
void vs__http_json(vs_http_reply *r, int status, void *json);

/* ---- the daemon (http_daemon.c) ---- */

/* Opens a connection to the daemon for one request. */
int vs__http_connect(vs_http *h, vs_conn *c, char *err, size_t errlen);

/* The daemon's status over inproc: 1 (in *e, free it), or 0 with a message. */
int vs__http_status(vs_http *h, vs_conn_event *e, char *err, size_t errlen);
/* The HTTP answer to a daemon's Error (400, 429 for a full queue, 503, 504, 500). */
void vs__http_daemon_error(int code, const char *msg, uint32_t retry_after_ms,
                           vs_http_reply *r);

/* ---- the jobs of one generation (http_jobs.c) ---- */

#define VS_HTTP_MAX_N 10 /* images per request (OpenAI's limit for n) */

typedef struct vs_http_job {
  uint64_t rid, id;       /* the submit's request id; the job's id once accepted */
  uint64_t seed;
  int has_class;
  int32_t class_label;
  char class_name[64];    /* "" when the model names none */
  char model[64], method[256];
  int done;               /* its Result or Error came */
  vs_conn_event *result;  /* the Result (NULL until then), owning the PNG blob: on the heap,
                             since an event's allocator points into the event itself */
  int err_code;           /* Vspec__ErrorCode of an Error, 0 = none */
  char err_msg[512];
  uint32_t retry_after_ms;
} vs_http_job;

/* Why a batch stopped waiting before every job ended. */
enum { VS_HTTP_RUNNING, VS_HTTP_CLIENT_GONE, VS_HTTP_STOPPING, VS_HTTP_TIMED_OUT };

typedef struct vs_http_batch {
  vs_http *h;
  int client_fd;          /* watched for a client that goes away, -1 = none */
  int client_interim;     /* it may be sent a 1xx (HTTP/1.1), to test a half-close */
  int client_probed;      /* it half-closed and was sent one: only a reset says it left */
  int in_body;            /* a streamed answer's body is being sent: the probe is an SSE
                             comment that the stream writes (probe_due), never raw bytes */
  int probe_due;
  const void *submit;     /* the Vspec__Submit each job is sent as (seed set per job) */
  int n;
  int has_seed;           /* seeds are seed, seed+1, ...; else the daemon draws job 0's */
  uint64_t seed;
  double t0;
  int gave_up;            /* VS_HTTP_* */
  vs_http_job jobs[VS_HTTP_MAX_N];
  /* each Progress/Preview event of job i, when set (streaming); a non-zero return is a
   * client that went away */
  int (*on_event)(void *arg, int i, const vs_conn_event *e);
  void *arg;
  /* the connection and the loop's state (http_jobs.c) */
  vs_conn conn;
  int connected, cancelled, over;
  double end, give_up;
} vs_http_batch;

/* Runs the batch's n jobs together: every submit sent first, then their events until each
 * has ended. The first failure cancels the rest, and so does the client going away, the
 * daemon stopping or [http] timeout_ms (b->gave_up says which). 0, or -1 with *r the error
 * of reaching the daemon. _start and _step are the same in steps, for a streamed answer:
 * _step waits for one event (at most a poll period) and returns 1 once the batch is over. */
int vs__http_jobs_run(vs_http_batch *b, vs_http_reply *r);
int vs__http_jobs_start(vs_http_batch *b, vs_http_reply *r);
int vs__http_jobs_step(vs_http_batch *b);
/* The job whose failure answers the request (the first to fail), or NULL. */
const vs_http_job *vs__http_jobs_failed(const vs_http_batch *b);
void vs__http_jobs_free(vs_http_batch *b);

/* Pieces of the answer (http_answer.c), for the plain and the streamed one: the class a
 * job was taken as (revised_prompt), its PNG enlarged `upscale` times as base64 (malloc'd;
 * NULL with *r the error), OpenAI's usage object of the batch. */
struct json_t;
struct json_t *vs__http_revised_prompt(const vs_http_job *j);
char *vs__http_png_b64(const vs_http_job *j, int upscale, vs_http_reply *r);
struct json_t *vs__http_usage(const vs_http_batch *b);

/* ---- the connections (http_guard.c) ---- */

int vs__http_guard_start(vs_http *h);
void vs__http_guard_stop(vs_http *h); /* the watchdog only: before MHD stops */
void vs__http_guard_free(vs_http *h); /* after MHD stopped */
/* MHD's accept policy (the per-address limit) and connection notifications. */
enum MHD_Result vs__http_guard_accept(void *cls, const struct sockaddr *sa, socklen_t len);
void vs__http_guard_notify(void *cls, struct MHD_Connection *c, void **ctx,
                           enum MHD_ConnectionNotificationCode code);
/* The connection's request is complete and being answered (out of the deadline's reach), or
 * its answer went and the next request may begin. */
void vs__http_guard_answering(vs_http *h, struct MHD_Connection *c);
void vs__http_guard_idle(vs_http *h, struct MHD_Connection *c);
/* Whether a request may be served on c: 0 for a reserve connection asking for more than
 * /health or /metrics (cheap) while every slot is answering. */
int vs__http_guard_admit(vs_http *h, struct MHD_Connection *c, int cheap);

/* The request's headers checked (http_headers.c): 0, or the status to refuse with (400, 417,
 * 501) and why. */
int vs__http_check_headers(struct MHD_Connection *c, char *why, size_t whylen);

/* ---- a streamed generation (http_stream.c) ---- */

/* Starts the jobs of `proto` (a batch's settings) as Submit `submit`, and waits until each is
 * accepted: the stream to answer with, or NULL with *r the error (or empty: the client went
 * away). Takes root, the request's JSON. */
vs_http_stream *vs__http_stream_start(vs_http *h, int client_fd, const void *submit,
                                      const vs_http_batch *proto, void *root, int upscale,
                                      int partial_images, vs_http_reply *r);
struct MHD_Response;
/* MHD's response reading the stream; it frees the stream (and cancels what still runs). */
struct MHD_Response *vs__http_stream_response(vs_http_stream *st);

/* POST /v1/images/generations; client_fd is the HTTP connection's socket, watched for a
 * client that goes away; interim: the client speaks HTTP/1.1 (may be sent a 1xx). */
void vs__http_generate(vs_http *h, int client_fd, int interim, const char *body, size_t len,
                       vs_http_reply *r);
void vs__http_health(vs_http *h, vs_http_reply *r);
/* GET /v1/models (id NULL) and GET /v1/models/{id}. */
void vs__http_models(vs_http *h, const char *id, vs_http_reply *r);
void vs__http_metrics(vs_http *h, vs_http_reply *r);

#endif /* VS_HTTP_INTERNAL_H */
