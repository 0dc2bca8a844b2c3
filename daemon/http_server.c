/*
 * daemon/http_server.c - the HTTP endpoint's lifecycle and routing (daemon/http_server.h).
 */
#include "daemon/http_internal.h"

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

/* ---- the listening address ---------------------------------------------------------------- */

int vs_http_parse_listen(const char *text, struct sockaddr_storage *sa, socklen_t *len,
                         char *err, size_t errlen) {
  memset(sa, 0, sizeof *sa);
  const char *colon = strrchr(text, ':');
  if (!colon || colon == text) {
    snprintf(err, errlen, "expected HOST:PORT, e.g. 127.0.0.1:8080 or [::1]:8080");
    return VSPEC_EINVAL;
  }
  char host[100];
  size_t hl = (size_t)(colon - text);
  if (hl >= sizeof host) {
    snprintf(err, errlen, "the host part is too long");
    return VSPEC_EINVAL;
  }
  memcpy(host, text, hl);
  host[hl] = '\0';
  const char *p = colon + 1;
  char *end;
  errno = 0;
  long port = strtol(p, &end, 10);
  if (!*p || *end || errno || port < 0 || port > 65535 || *p == '-' || *p == '+') {
    snprintf(err, errlen, "port '%s' is not a number 0..65535", p);
    return VSPEC_EINVAL;
  }
  if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
  struct sockaddr_in *v4 = (struct sockaddr_in *)sa;
  struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)sa;
  if (host[0] == '[' && hl >= 2 && host[hl - 1] == ']') {
    host[hl - 1] = '\0';
    if (inet_pton(AF_INET6, host + 1, &v6->sin6_addr) != 1) {
      snprintf(err, errlen, "'%s' is not an IPv6 address", host + 1);
      return VSPEC_EINVAL;
    }
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons((uint16_t)port);
    *len = sizeof *v6;
    return VSPEC_OK;
  }
  if (inet_pton(AF_INET, host, &v4->sin_addr) != 1) {
    snprintf(err, errlen, "'%s' is not an IPv4 address, [IPv6] or localhost (names are not "
             "resolved)", host);
    return VSPEC_EINVAL;
  }
  v4->sin_family = AF_INET;
  v4->sin_port = htons((uint16_t)port);
  *len = sizeof *v4;
  return VSPEC_OK;
}

int vs_http_addr_is_loopback(const struct sockaddr_storage *sa) {
  if (sa->ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->ss_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) ||
           (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
  }
  return 0;
}

/* ---- replies ------------------------------------------------------------------------------- */

void vs__http_json(vs_http_reply *r, int status, void *json) {
  free(r->body);
  r->status = status;
  r->type = "application/json";
  r->body = json ? json_dumps(json, JSON_COMPACT) : NULL;
  r->len = r->body ? strlen(r->body) : 0;
  json_decref(json);
  if (!r->body) r->status = MHD_HTTP_INTERNAL_SERVER_ERROR;
}

/* OpenAI's error types and a code for each status the endpoint answers with. */
static void vs__error_kind(int status, const char **type, const char **code) {
  *type = status >= 500 ? "server_error" : status == 429 ? "rate_limit_error"
                                                         : "invalid_request_error";
  switch (status) {
  case 400: *code = "invalid_value"; break;
  case 404: *code = "not_found"; break;
  case 405: *code = "method_not_allowed"; break;
  case 413: *code = "request_too_large"; break;
  case 417: *code = "expectation_failed"; break;
  case 429: *code = "queue_full"; break;
  case 503: *code = "unavailable"; break;
  case 501: *code = "not_implemented"; break;
  case 504: *code = "timeout"; break;
  default: *code = "internal_error";
  }
}

static void vs__error_v(vs_http_reply *r, int status, const char *param, const char *code,
                        const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  const char *type, *dflt;
  vs__error_kind(status, &type, &dflt);
  json_t *e = json_pack("{s:{s:s,s:s,s:o,s:s}}", "error", "message", msg, "type", type, "param",
                        param ? json_string(param) : json_null(), "code", code ? code : dflt);
  vs__http_json(r, status, e);
  r->status = status;
}

void vs__http_error(vs_http_reply *r, int status, const char *param, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vs__error_v(r, status, param, NULL, fmt, ap);
  va_end(ap);
}

void vs__http_error_code(vs_http_reply *r, int status, const char *param, const char *code,
                         const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vs__error_v(r, status, param, code, fmt, ap);
  va_end(ap);
}

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
} vs__routes[] = {
    {"/health", VS__HEALTH, 0, 0},
    {"/metrics", VS__METRICS, 0, 0},
    {"/v1/images/generations", VS__GENERATE, 1, 0},
    {"/v1/models", VS__MODELS, 0, 0},
    {"/v1/models/", VS__MODEL, 0, 1},
};

/* Whether url is route i's path. */
static int vs__route_is(size_t i, const char *url) {
  const char *p = vs__routes[i].path;
  if (!vs__routes[i].prefix) return !strcmp(p, url);
  size_t n = strlen(p);
  return !strncmp(p, url, n) && url[n] && !strchr(url + n, '/');
}

/* A request in progress: the route, the rest of its path, and the body read so far. */
typedef struct vs__req {
  int route;
  char arg[128]; /* the {id} of a prefix route */
  char *body;
  size_t len;
  int too_large;
} vs__req;

int vs__http_connect(vs_http *h, vs_conn *c, char *err, size_t errlen) {
  vs_conn_opts o = {.ctx = h->zctx};
  return vs_conn_open(c, h->endpoint, &o, err, errlen);
}

static enum MHD_Result vs__error_now(vs_http *h, struct MHD_Connection *c, int status,
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
static enum MHD_Result vs__begin(vs_http *h, struct MHD_Connection *c, const char *url,
                                 const char *method, void **cls) {
  char why[200];
  int bad = vs__http_check_headers(c, why, sizeof why);
  if (bad) return vs__error_now(h, c, bad, NULL, NULL, "%s", why);
  size_t n = sizeof vs__routes / sizeof vs__routes[0], i = 0;
  while (i < n && !vs__route_is(i, url)) i++;
  if (i == n)
    return vs__error_now(h, c, MHD_HTTP_NOT_FOUND, NULL, NULL,
                         "no such path: %s (served: /health, /metrics, /v1/models, POST "
                         "/v1/images/generations)", url);
  int post = !strcmp(method, MHD_HTTP_METHOD_POST);
  int get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
  if (vs__routes[i].post ? !post : !get)
    return vs__error_now(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, vs__routes[i].post ? "POST" : "GET, HEAD",
                         NULL, vs__routes[i].post ? "%s takes POST only" : "%s takes GET only",
                         url);
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (post && cl && strtoull(cl, NULL, 10) > (unsigned long long)h->cfg->http_max_body_bytes) {
    char lim[32];
    snprintf(lim, sizeof lim, "%ld", h->cfg->http_max_body_bytes);
    return vs__error_now(h, c, 413, NULL, NULL,
                         "the body is over the limit of %s bytes ([http] max_body_bytes)", lim);
  }
  int cheap = vs__routes[i].route == VS__HEALTH || vs__routes[i].route == VS__METRICS;
  if (!vs__http_guard_admit(h, c, cheap))
    return vs__error_now(h, c, MHD_HTTP_SERVICE_UNAVAILABLE, NULL, NULL, "%s",
                         "every HTTP connection is busy ([http] max_connections): try again");
  vs__req *q = calloc(1, sizeof *q);
  if (!q) return MHD_NO;
  q->route = vs__routes[i].route;
  if (vs__routes[i].prefix)
    snprintf(q->arg, sizeof q->arg, "%s", url + strlen(vs__routes[i].path));
  *cls = q;
  return MHD_YES;
}

static enum MHD_Result vs__access(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **req_cls) {
  vs_http *h = cls;
  vs__req *q = *req_cls;
  if (!q) return vs__begin(h, c, url, method, req_cls);
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

static void vs__completed(void *cls, struct MHD_Connection *c, void **req_cls,
                          enum MHD_RequestTerminationCode toe) {
  vs__http_guard_idle(cls, c); /* the next request's deadline runs from here */
  vs__req *q = *req_cls;
  if (q) free(q->body);
  free(q);
  *req_cls = NULL;
}

static void vs__mhd_log(void *cls, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t n = strlen(msg);
  while (n && msg[n - 1] == '\n') msg[--n] = '\0';
  vs_log(VSPEC_LOG_DEBUG, "http", "%s", msg);
}

/* ---- lifecycle ----------------------------------------------------------------------------- */

/* Our own socket, so that a port in use is a clear startup error and port 0's real port can
 * be read back. */
static int vs__listen(const vs_daemon_config *cfg, int *fd_out, int *port, char *err,
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

int vs_http_listen(const vs_daemon_config *cfg, vs_http **out, char *err, size_t errlen) {
  *out = NULL;
  vs_http *h = calloc(1, sizeof *h);
  if (!h) {
    snprintf(err, errlen, "http: out of memory");
    return VSPEC_ENOMEM;
  }
  h->cfg = cfg;
  h->fd = -1;
  int rc = vs__listen(cfg, &h->fd, &h->port, err, errlen);
  if (rc) {
    free(h);
    return rc;
  }
  *out = h;
  return VSPEC_OK;
}

int vs_http_serve(vs_http *h, void *zctx, const char *endpoint, char *err, size_t errlen) {
  h->zctx = zctx;
  snprintf(h->endpoint, sizeof h->endpoint, "%s", endpoint);
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                   MHD_USE_ERROR_LOG;
  if (vs__http_guard_start(h)) {
    snprintf(err, errlen, "http: cannot start the connection watchdog");
    return VSPEC_EIO;
  }
  unsigned limit = (unsigned)(h->cfg->http_max_connections + VS_HTTP_RESERVE);
  h->mhd = MHD_start_daemon(flags, 0, vs__http_guard_accept, h, vs__access, h,
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)h->fd,
                            MHD_OPTION_CONNECTION_LIMIT, limit,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)VS_HTTP_IDLE_S,
                            MHD_OPTION_NOTIFY_COMPLETED, vs__completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, vs__http_guard_notify, h,
                            MHD_OPTION_EXTERNAL_LOGGER, vs__mhd_log, h, MHD_OPTION_END);
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

int vs_http_port(const vs_http *h) { return h ? h->port : 0; }

void vs_http_stop(vs_http **hp) {
  if (!hp || !*hp) return;
  vs_http *h = *hp;
  /* Requests in flight see the flag within one poll (50 ms), cancel their jobs and return;
   * MHD_stop_daemon joins their threads and closes the listening socket. */
  atomic_store(&h->stopping, 1);
  vs__http_guard_stop(h);
  if (h->mhd) MHD_stop_daemon(h->mhd);
  vs__http_guard_free(h); /* MHD's callbacks are done with it */
  if (h->fd >= 0) close(h->fd);
  free(h);
  *hp = NULL;
}
