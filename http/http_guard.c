/*
 * http/http_guard.c - the HTTP endpoint's connections held to account (issue 32, finding 2).
 *
 * libmicrohttpd's connection timeout is one of inactivity: every byte resets it, so a client
 * that trickles its request a byte at a time holds its thread for ever, and max_connections
 * of them shut everyone else out (/health too). Here every connection is tracked from its
 * accept (MHD's notify-connection callback) with the time its current request began, and:
 *   - a request (headers and body) not complete within [http] request_deadline_ms is cut,
 *     whatever its activity (a watchdog thread, by shutdown(2) of the socket: MHD's thread
 *     then reads the end and closes it; MHD calls CLOSED before it closes the socket, and the
 *     table's mutex orders the two);
 *   - MHD may take VS_HTTP_RESERVE connections past max_connections; when it does, the oldest
 *     connection still sending its request (or idle between requests) is closed for the new
 *     one, and a connection that found none to displace may only ask for /health or /metrics
 *     (anything else is a 503): so a crowd of slow clients never keeps the health check out;
 *   - an address may hold at most [http] max_connections_per_address (MHD's accept-policy
 *     callback; MHD's own per-IP option would refuse without telling us, uncounted);
 *   - each kind is counted (/metrics) and logged at most once per address per interval
 *     (core/log_limit.h).
 */
#include "http/http_internal.h"

#include <arpa/inet.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "core/log.h"
#include "core/metrics.h" /* vs_now */

#define VS__LOG_INTERVAL_S 10.0
#define VS__WATCH_MS 50 /* how often the deadlines are looked at */

enum { VS__FREE, VS__RECEIVING, VS__ANSWERING, VS__CLOSING };

struct vs__http_conn {
  struct MHD_Connection *c;
  int fd;
  int state;
  int reserve;  /* admitted past max_connections, with nobody to displace */
  double t0;    /* when its current request began: the accept, or the previous answer's end */
  char addr[INET6_ADDRSTRLEN];
};

static void guard_addr_text(const struct sockaddr *sa, char *out, size_t n) {
  snprintf(out, n, "?");
  if (!sa) return;
  if (sa->sa_family == AF_INET)
    inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)n);
  else if (sa->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out, (socklen_t)n);
}

/* One event of `kind` from addr, counted by the caller: logged at most once per address and
 * kind per interval, the next line saying how many were not. */
static void guard_log(vs_http_guard *g, const char *kind, const char *addr, const char *what) {
  char key[80];
  uint64_t before = 0;
  snprintf(key, sizeof key, "%s %s", kind, addr);
  if (!vs_log_limit_allow(&g->log, key, vs_now(), &before)) return;
  if (before)
    vs_log(VSPEC_LOG_INFO, "http", "%s (%llu more of it from %s not logged in the last %.0f s)",
           what, (unsigned long long)before, addr, VS__LOG_INTERVAL_S);
  else
    vs_log(VSPEC_LOG_INFO, "http", "%s (more from %s: one line per %.0f s)", what, addr,
           VS__LOG_INTERVAL_S);
}

static void guard_log_quiet(vs_http_guard *g, double now) {
  char key[64];
  uint64_t n;
  while (vs_log_limit_take_quiet(&g->log, now, key, sizeof key, &n))
    vs_log(VSPEC_LOG_INFO, "http", "%llu more connection(s) of '%s' not logged one by one",
           (unsigned long long)n, key);
}

/* Closes a tracked connection from outside its thread (mutex held). */
static void guard_cut(struct vs__http_conn *e) {
  e->state = VS__CLOSING;
  shutdown(e->fd, SHUT_RDWR);
}

/* ---- MHD's callbacks ------------------------------------------------------------------------ */

enum MHD_Result vs__http_guard_accept(void *cls, const struct sockaddr *sa, socklen_t len) {
  (void)len;
  vs_http *h = cls;
  vs_http_guard *g = &h->guard;
  char addr[INET6_ADDRSTRLEN];
  guard_addr_text(sa, addr, sizeof addr);
  int n = 0;
  pthread_mutex_lock(&g->mu);
  for (int i = 0; i < g->cap; i++)
    n += g->conns[i].state != VS__FREE && g->conns[i].state != VS__CLOSING &&
         !strcmp(g->conns[i].addr, addr);
  pthread_mutex_unlock(&g->mu);
  if (n < g->per_address) return MHD_YES;
  atomic_fetch_add(&g->refused_address, 1);
  char what[200];
  snprintf(what, sizeof what, "refused a connection from %s: it holds %d already ([http] "
           "max_connections_per_address)", addr, n);
  guard_log(g, "refused", addr, what);
  return MHD_NO;
}

/* A new connection: tracked; past max_connections the oldest one still receiving is closed
 * for it, or it is a reserve connection (vs__http_guard_admit). */
static void guard_started(vs_http *h, vs_http_guard *g, struct MHD_Connection *c, void **ctx) {
  const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  char evicted[INET6_ADDRSTRLEN] = "";
  pthread_mutex_lock(&g->mu);
  struct vs__http_conn *e = NULL, *oldest = NULL;
  int live = 0;
  for (int i = 0; i < g->cap; i++) {
    struct vs__http_conn *x = &g->conns[i];
    if (x->state == VS__FREE) {
      if (!e) e = x;
      continue;
    }
    live += x->state != VS__CLOSING;
    if (x->state == VS__RECEIVING && (!oldest || x->t0 < oldest->t0)) oldest = x;
  }
  if (e && fi) {
    memset(e, 0, sizeof *e);
    e->c = c;
    e->fd = fi->connect_fd;
    e->state = VS__RECEIVING;
    e->t0 = vs_now();
    guard_addr_text(ai ? ai->client_addr : NULL, e->addr, sizeof e->addr);
    live++;
    *ctx = e;
  }
  if (live > h->cfg->http_max_connections) {
    if (oldest) {
      snprintf(evicted, sizeof evicted, "%s", oldest->addr);
      guard_cut(oldest);
    } else if (e) {
      e->reserve = 1;
    }
  }
  pthread_mutex_unlock(&g->mu);
  if (*evicted) {
    atomic_fetch_add(&g->closed_evicted, 1);
    char what[200];
    snprintf(what, sizeof what, "closed a connection from %s that had not sent its request, "
             "for a new one: all [http] max_connections in use", evicted);
    guard_log(g, "displaced", evicted, what);
  }
}

void vs__http_guard_notify(void *cls, struct MHD_Connection *c, void **ctx,
                           enum MHD_ConnectionNotificationCode code) {
  vs_http *h = cls;
  vs_http_guard *g = &h->guard;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    *ctx = NULL;
    guard_started(h, g, c, ctx);
    return;
  }
  struct vs__http_conn *e = *ctx;
  if (!e) return;
  pthread_mutex_lock(&g->mu); /* before MHD closes the socket: the watchdog is done with it */
  e->state = VS__FREE;
  e->c = NULL;
  pthread_mutex_unlock(&g->mu);
  *ctx = NULL;
}

static struct vs__http_conn *guard_entry(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return i ? i->socket_context : NULL;
}

static void guard_set(vs_http_guard *g, struct MHD_Connection *c, int state) {
  struct vs__http_conn *e = guard_entry(c);
  if (!e) return;
  pthread_mutex_lock(&g->mu);
  if (e->state != VS__CLOSING && e->state != VS__FREE) {
    e->state = state;
    e->t0 = vs_now();
  }
  pthread_mutex_unlock(&g->mu);
}

void vs__http_guard_answering(vs_http *h, struct MHD_Connection *c) {
  guard_set(&h->guard, c, VS__ANSWERING);
}

void vs__http_guard_idle(vs_http *h, struct MHD_Connection *c) {
  guard_set(&h->guard, c, VS__RECEIVING);
}

int vs__http_guard_admit(vs_http *h, struct MHD_Connection *c, int cheap) {
  vs_http_guard *g = &h->guard;
  struct vs__http_conn *e = guard_entry(c);
  if (!e || cheap) return 1;
  pthread_mutex_lock(&g->mu);
  int busy = 0;
  for (int i = 0; e->reserve && i < g->cap; i++) busy += g->conns[i].state == VS__ANSWERING;
  int ok = !e->reserve || busy < h->cfg->http_max_connections;
  if (ok) e->reserve = 0; /* slots freed up since it came */
  char addr[INET6_ADDRSTRLEN];
  snprintf(addr, sizeof addr, "%s", e->addr);
  pthread_mutex_unlock(&g->mu);
  if (ok) return 1;
  atomic_fetch_add(&g->refused_busy, 1);
  char what[200];
  snprintf(what, sizeof what, "answered 503 to %s: all [http] max_connections are answering "
           "(the connections past it serve /health and /metrics only)", addr);
  guard_log(g, "busy", addr, what);
  return 0;
}

/* ---- the deadline --------------------------------------------------------------------------- */

static void *guard_watchdog(void *arg) {
  vs_http *h = arg;
  vs_http_guard *g = &h->guard;
  double deadline = h->cfg->http_request_deadline_ms / 1000.0;
  while (!atomic_load(&g->stop)) {
    struct timespec ts = {0, VS__WATCH_MS * 1000000L};
    nanosleep(&ts, NULL);
    double now = vs_now();
    char cut[8][INET6_ADDRSTRLEN];
    int ncut = 0;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->cap; i++) {
      struct vs__http_conn *e = &g->conns[i];
      if (e->state != VS__RECEIVING || now - e->t0 <= deadline) continue;
      guard_cut(e);
      atomic_fetch_add(&g->closed_deadline, 1);
      if (ncut < 8) snprintf(cut[ncut++], sizeof cut[0], "%s", e->addr);
    }
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < ncut; i++) {
      char what[200];
      snprintf(what, sizeof what, "closed a connection from %s: no complete request within "
               "%d ms ([http] request_deadline_ms)", cut[i], h->cfg->http_request_deadline_ms);
      guard_log(g, "slow", cut[i], what);
    }
    guard_log_quiet(g, now);
  }
  return NULL;
}

int vs__http_guard_start(vs_http *h) {
  vs_http_guard *g = &h->guard;
  g->cap = h->cfg->http_max_connections + VS_HTTP_RESERVE + 8;
  g->conns = calloc((size_t)g->cap, sizeof *g->conns);
  if (!g->conns) return -1;
  /* 0 is automatic: on loopback every client shares 127.0.0.1 (a reverse proxy too), so a
   * limit of its own would only lower the total; reachable from other machines, a quarter */
  int per = h->cfg->http_max_connections_per_address;
  struct sockaddr_storage sa;
  socklen_t len;
  char err[200];
  int loopback = !vs_http_parse_listen(h->cfg->http_listen, &sa, &len, err, sizeof err) &&
                 vs_http_addr_is_loopback(&sa);
  if (per <= 0)
    per = loopback ? h->cfg->http_max_connections + VS_HTTP_RESERVE
                   : (h->cfg->http_max_connections + 3) / 4;
  g->per_address = per;
  pthread_mutex_init(&g->mu, NULL);
  vs_log_limit_init(&g->log, VS__LOG_INTERVAL_S);
  g->inited = 1;
  if (pthread_create(&g->thread, NULL, guard_watchdog, h)) return -1;
  g->running = 1;
  return 0;
}

void vs__http_guard_stop(vs_http *h) {
  vs_http_guard *g = &h->guard;
  if (g->running) {
    atomic_store(&g->stop, 1);
    pthread_join(g->thread, NULL);
    g->running = 0;
  }
}

void vs__http_guard_free(vs_http *h) {
  vs_http_guard *g = &h->guard;
  vs__http_guard_stop(h);
  if (!g->inited) return;
  guard_log_quiet(g, INFINITY);
  vs_log_limit_destroy(&g->log);
  pthread_mutex_destroy(&g->mu);
  free(g->conns);
  g->conns = NULL;
  g->inited = 0;
}
