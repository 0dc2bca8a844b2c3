/*
 * http/http_server.c - the HTTP endpoint's lifecycle and routing (http/http_server.h).
 */
#include "http/http_server.h"
#include "http/http_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "vspec/types.h"

/* A silent connection is closed after this long (MHD's timeout, reset by every byte): with one
 * thread per connection, idle ones must not hold max_connections for ever. A request that
 * trickles in is cut by [http] request_deadline_ms whatever its activity (http_guard.c); one
 * being answered is bounded by [http] timeout_ms. */
#define VS_HTTP_IDLE_S 10

/* ---- sending ------------------------------------------------------------------------------- */

static enum MHD_Result http_send(struct MHD_Connection *c, vs_http_reply *r, const char *allow) {
  if (r->stream) {
    struct MHD_Response *sr = vs__http_stream_response(r->stream);
    r->stream = NULL;
    if (!sr) return MHD_NO;
    MHD_add_response_header(sr, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(sr, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    enum MHD_Result sok = MHD_queue_response(c, MHD_HTTP_OK, sr);
    MHD_destroy_response(sr);
    return sok;
  }
  struct MHD_Response *resp =
      MHD_create_response_from_buffer(r->len, r->body ? r->body : (void *)"",
                                      r->body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
  if (!resp) {
    free(r->body);
    r->body = NULL;
    return MHD_NO;
  }
  r->body = NULL; /* the response frees it */
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                          r->type ? r->type : "application/json");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  char n[24];
  if (r->retry_after_s > 0) {
    snprintf(n, sizeof n, "%d", r->retry_after_s);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, n);
  }
  if (r->seed[0]) MHD_add_response_header(resp, "X-Vspec-Seed", r->seed);
  if (allow) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
  enum MHD_Result ok = MHD_queue_response(c, (unsigned)r->status, resp);
  MHD_destroy_response(resp);
  return ok;
}

/* ---- routing ------------------------------------------------------------------------------- */

enum { VS__HEALTH, VS__METRICS, VS__GENERATE, VS__MODELS, VS__MODEL };

static const struct {
  const char *path;
  int route;
  int post;   /* POST only; else GET (and HEAD) */
  int prefix; /* the path and one more segment: /v1/models/{id} */
} http_routes[] = {
    {"/health", VS__HEALTH, 0, 0},
    {"/metrics", VS__METRICS, 0, 0},
    {"/v1/images/generations", VS__GENERATE, 1, 0},
    {"/v1/models", VS__MODELS, 0, 0},
    {"/v1/models/", VS__MODEL, 0, 1},
};

/* Whether url is route i's path. */
static int http_route_is(size_t i, const char *url) {
  const char *p = http_routes[i].path;
  if (!http_routes[i].prefix) return !strcmp(p, url);
  size_t n = strlen(p);
  return !strncmp(p, url, n) && url[n] && !strchr(url + n, '/');
}

/* A request in progress: the route, the rest of its path, and the body read so far. */
typedef struct http_req {
  int route;
  char arg[128]; /* the {id} of a prefix route */
  char *body;
  size_t len;
  int too_large;
} http_req;

static enum MHD_Result http_error_now(vs_http *h, struct MHD_Connection *c, int status,
                                      const char *allow, const char *param, const char *fmt,
                                      const char *arg) {
  vs_http_reply r = {0};
  vs__http_error(&r, status, param, fmt, arg);
  if (status == 503) r.retry_after_s = 1;
  vs__http_guard_answering(h, c);
  return http_send(c, &r, allow);
}

/* The first call for a request: route it, refuse what will never be served before any body
 * is read (an announced oversize body is refused without reading it). */
static enum MHD_Result http_begin(vs_http *h, struct MHD_Connection *c, const char *url,
                                  const char *method, void **cls) {
  char why[200];
  int bad = vs__http_check_headers(c, why, sizeof why);
  if (bad) return http_error_now(h, c, bad, NULL, NULL, "%s", why);
  size_t n = sizeof http_routes / sizeof http_routes[0], i = 0;
  while (i < n && !http_route_is(i, url)) i++;
  if (i == n)
    return http_error_now(h, c, MHD_HTTP_NOT_FOUND, NULL, NULL,
                          "no such path: %s (served: /health, /metrics, /v1/models, POST "
                          "/v1/images/generations)", url);
  int post = !strcmp(method, MHD_HTTP_METHOD_POST);
  int get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
  if (http_routes[i].post ? !post : !get)
    return http_error_now(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, http_routes[i].post ? "POST" : "GET, HEAD",
                          NULL, http_routes[i].post ? "%s takes POST only" : "%s takes GET only",
                          url);
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (post && cl && strtoull(cl, NULL, 10) > (unsigned long long)h->cfg->http_max_body_bytes) {
    char lim[32];
    snprintf(lim, sizeof lim, "%ld", h->cfg->http_max_body_bytes);
    return http_error_now(h, c, 413, NULL, NULL,
                          "the body is over the limit of %s bytes ([http] max_body_bytes)", lim);
  }
  int cheap = http_routes[i].route == VS__HEALTH || http_routes[i].route == VS__METRICS;
  if (!vs__http_guard_admit(h, c, cheap))
    return http_error_now(h, c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, NULL, "%s",
                          "every HTTP connection is busy ([http] max_connections): try again");
  http_req *q = calloc(1, sizeof *q);
  if (!q) return MHD_NO;
  q->route = http_routes[i].route;
  if (http_routes[i].prefix)
    snprintf(q->arg, sizeof q->arg, "%s", url + strlen(http_routes[i].path));
  *cls = q;
  return MHD_YES;
}

static enum MHD_Result http_access(void *cls, struct MHD_Connection *c, const char *url,
                                   const char *method, const char *version,
                                   const char *upload, size_t *upload_size, void **req_cls) {
  vs_http *h = cls;
  http_req *q = *req_cls;
  if (!q) return http_begin(h, c, url, method, req_cls);
  if (*upload_size) {
    /* A body without a length (chunked) that grows past the limit is read to its end and
     * dropped, then refused. */
    size_t n = *upload_size;
    *upload_size = 0;
    if (q->too_large || q->len + n > (size_t)h->cfg->http_max_body_bytes) {
      q->too_large = 1;
      free(q->body);
      q->body = NULL;
      return MHD_YES;
    }
    char *b = realloc(q->body, q->len + n + 1);
    if (!b) return MHD_NO;
    memcpy(b + q->len, upload, n);
    q->body = b;
    q->len += n;
    q->body[q->len] = '\0';
    return MHD_YES;
  }
  vs_http_reply r = {0};
  vs__http_guard_answering(h, c); /* the request is in: the deadline is done with it */
  if (q->too_large) {
    vs__http_error(&r, 413, NULL, "the body is over the limit of %ld "
                   "bytes ([http] max_body_bytes)", h->cfg->http_max_body_bytes);
  } else if (q->route == VS__HEALTH) {
    vs__http_health(h, &r);
  } else if (q->route == VS__METRICS) {
    vs__http_metrics(h, &r);
  } else if (q->route == VS__MODELS || q->route == VS__MODEL) {
    vs__http_models(h, q->route == VS__MODEL ? q->arg : NULL, &r);
  } else {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    /* a 1xx may be sent to tell a half-closed client from a gone one (http_jobs.c) */
    int interim = strcmp(version, MHD_HTTP_VERSION_1_0) != 0;
    vs__http_generate(h, ci ? ci->connect_fd : -1, interim, q->body ? q->body : "", q->len, &r);
  }
  if (!r.status && !r.stream) { /* the client went away: nobody to answer */
    free(r.body);
    return MHD_NO;
  }
  return http_send(c, &r, NULL);
}

static void http_completed(void *cls, struct MHD_Connection *c, void **req_cls,
                           enum MHD_RequestTerminationCode toe) {
  vs__http_guard_idle(cls, c); /* the next request's deadline runs from here */
  http_req *q = *req_cls;
  if (q) free(q->body);
  free(q);
  *req_cls = NULL;
}

static void http_mhd_log(void *cls, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t n = strlen(msg);
  while (n && msg[n - 1] == '\n') msg[--n] = '\0';
  vs_log(VSPEC_LOG_DEBUG, "http", "%s", msg);
}

/* ---- lifecycle ----------------------------------------------------------------------------- */

/* Our own socket, so that a port in use is a clear startup error and port 0's real port can
 * be read back. */
static int http_open_socket(const vs_daemon_config *cfg, int *fd_out, int *port, char *err,
                            size_t errlen) {
  struct sockaddr_storage sa;
  socklen_t len;
  char inner[200];
  if (vs_http_parse_listen(cfg->http_listen, &sa, &len, inner, sizeof inner)) {
    snprintf(err, errlen, "http.listen = %s: %s", cfg->http_listen, inner);
    return VSPEC_EINVAL;
  }
  int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, errlen, "http: socket: %s", strerror(errno));
    return VSPEC_EIO;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* past TIME_WAIT, not a listener */
  if (sa.ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&sa, len) || listen(fd, 64)) {
    snprintf(err, errlen, "http: cannot listen on %s: %s", cfg->http_listen, strerror(errno));
    close(fd);
    return VSPEC_EIO;
  }
  struct sockaddr_storage got;
  socklen_t gl = sizeof got;
  getsockname(fd, (struct sockaddr *)&got, &gl);
  *port = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                          : ((struct sockaddr_in *)&got)->sin_port);
  *fd_out = fd;
  return VSPEC_OK;
}

/* Binds cfg->http_listen and listens (a port in use is an error, not a wait): the front's
 * prepare, before the models load, so that the mistake costs no load. */
static int http_prepare(const vs_daemon_config *cfg, void **front, char *err, size_t errlen) {
  vs_http **out = (vs_http **)front;
  *out = NULL;
  vs_http *h = calloc(1, sizeof *h);
  if (!h) {
    snprintf(err, errlen, "http: out of memory");
    return VSPEC_ENOMEM;
  }
  h->cfg = cfg;
  h->fd = -1;
  int rc = http_open_socket(cfg, &h->fd, &h->port, err, errlen);
  if (rc) {
    free(h);
    return rc;
  }
  *out = h;
  return VSPEC_OK;
}

/* Starts serving; requests connect to `endpoint` (an inproc endpoint of the job socket) in
 * ZeroMQ context `zctx`. Logs the bound address, with the real port when the configured one
 * was 0. */
static int http_start(const vs_daemon_config *cfg, void **front, void *zctx,
                      const char *endpoint, char *err, size_t errlen) {
  (void)cfg; /* the one http_prepare kept */
  vs_http *h = *front;
  h->zctx = zctx;
  snprintf(h->endpoint, sizeof h->endpoint, "%s", endpoint);
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                   MHD_USE_ERROR_LOG;
  if (vs__http_guard_start(h)) {
    snprintf(err, errlen, "http: cannot start the connection watchdog");
    return VSPEC_EIO;
  }
  unsigned limit = (unsigned)(h->cfg->http_max_connections + VS_HTTP_RESERVE);
  h->mhd = MHD_start_daemon(flags, 0, vs__http_guard_accept, h, http_access, h,
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)h->fd,
                            MHD_OPTION_CONNECTION_LIMIT, limit,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)VS_HTTP_IDLE_S,
                            MHD_OPTION_NOTIFY_COMPLETED, http_completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, vs__http_guard_notify, h,
                            MHD_OPTION_EXTERNAL_LOGGER, http_mhd_log, h, MHD_OPTION_END);
  if (!h->mhd) {
    snprintf(err, errlen, "http: libmicrohttpd could not start on %s", h->cfg->http_listen);
    return VSPEC_EIO;
  }
  h->fd = -1; /* MHD's now: it closes it when it stops */
  char where[160];
  snprintf(where, sizeof where, "%s", h->cfg->http_listen);
  char *colon = strrchr(where, ':');
  if (colon) snprintf(colon + 1, sizeof where - (size_t)(colon + 1 - where), "%d", h->port);
  vs_log(VSPEC_LOG_INFO, "http", "listening on http://%s (port %d)", where, h->port);
  return VSPEC_OK;
}

/* Stops accepting, ends the requests in flight (their jobs are cancelled) and joins the
 * threads, before the ZeroMQ context goes; frees the endpoint and sets *front to NULL. */
static void http_stop(void **front) {
  if (!front || !*front) return;
  vs_http *h = *front;
  /* Requests in flight see the flag within one poll (50 ms), cancel their jobs and return;
   * MHD_stop_daemon joins their threads and closes the listening socket. */
  atomic_store(&h->stopping, 1);
  vs__http_guard_stop(h);
  if (h->mhd) MHD_stop_daemon(h->mhd);
  vs__http_guard_free(h); /* MHD's callbacks are done with it */
  if (h->fd >= 0) close(h->fd);
  free(h);
  *front = NULL;
}

const vs_server_front vs_http_front = {.endpoint = "inproc://vspecd-http",
                                       .prepare = http_prepare,
                                       .start = http_start,
                                       .stop = http_stop};
