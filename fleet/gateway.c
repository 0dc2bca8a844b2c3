#include "fleet/gateway.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include <time.h>
#include <zmq.h>

#include "core/log.h"
#include "core/names.h"
#include "fleet/fleet_event.h"
#include "fleet/fleet_queue.h"
#include "fleet/gateway_state.h"
#include "daemon/router.h"
#include "daemon/zap.h"
#include "proto/curve_keys.h"
#include "proto/wire.h"

static volatile sig_atomic_t gw_stop;
static void gw_on_signal(int sig) {
  (void)sig;
  gw_stop = 1;
}

/* ---- configuration ------------------------------------------------------------------------- */

void vs_gateway_config_defaults(vs_gateway_config *c) {
  memset(c, 0, sizeof *c);
  vs_fleet_opts o;
  vs_fleet_opts_defaults(&o);
  c->node = "vspec-gateway";
  c->stream = o.stream;
  c->group = o.group;
  c->events_prefix = o.events_prefix;
  c->max_len = o.max_len;
  c->per_client = 16;
  c->events_ttl_s = o.events_ttl_ms / 1000;
  c->heartbeat_ms = 1000;
  c->max_message_bytes = 4l << 20; /* as vspecd's limits.max_message_bytes */
  c->max_request_bytes = 64l << 10;
}

static void gw_fleet_opts(const vs_gateway_config *c, vs_fleet_opts *o) {
  vs_fleet_opts_defaults(o);
  o->url = c->redis_url;
  o->stream = c->stream;
  o->group = c->group;
  o->events_prefix = c->events_prefix;
  o->max_len = c->max_len;
  o->events_ttl_ms = c->events_ttl_s * 1000;
  /* a job is one request: its protobuf frame and up to two blob frames */
  long long most = (long long)c->max_request_bytes + 2ll * c->max_message_bytes;
  o->max_payload = most > (512ll << 20) ? (512u << 20) : (size_t)most;
}

int vs_gateway_check(const vs_gateway_config *c, char *err, size_t errlen) {
  char e[VSPEC_ERRLEN];
  vs_fleet_addr a;
  if (!c->redis_url || vs_fleet_addr_parse(c->redis_url, &a, e, sizeof e)) {
    snprintf(err, errlen, "--redis: %s", c->redis_url ? e : "a Redis URL is required");
    return VSPEC_EINVAL;
  }
  if (vs_name_check(&vs_name_model, "--node", c->node, err, errlen)) return VSPEC_EINVAL;
  /* The queue checks its key names when opened (connecting nothing): one name at a time,
   * so that the message names the option. */
  static const char *const opt[] = {"--stream", "--group", "--events-prefix"};
  for (int i = 0; i < 3; i++) {
    vs_fleet_opts o;
    vs_fleet_opts_defaults(&o);
    o.url = c->redis_url;
    if (i == 0) o.stream = c->stream;
    if (i == 1) o.group = c->group;
    if (i == 2) o.events_prefix = c->events_prefix;
    vs_fleet_queue *q = NULL;
    int rc = vs_fleet_queue_open(&o, &q, e, sizeof e);
    vs_fleet_queue_destroy(&q);
    if (rc) {
      snprintf(err, errlen, "%s: %s", opt[i], e);
      return VSPEC_EINVAL;
    }
  }
  if (c->max_len < 1 || c->per_client < 1 || c->events_ttl_s < 1 || c->heartbeat_ms < 1) {
    snprintf(err, errlen, "--max-len, --per-client, --events-ttl-s and --heartbeat-ms must be "
             "positive");
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}

/* ---- requests (submit, resume and cancel are in gateway_jobs.c) ------------------------- */

static void gw_status(vs_gw *g, const vs_wire_envelope *env, uint64_t rid) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__StatusReply st = VSPEC__STATUS_REPLY__INIT;
  Vspec__FleetInfo fi = VSPEC__FLEET_INFO__INIT;
  Vspec__Totals to = VSPEC__TOTALS__INIT;
  char err[VSPEC_ERRLEN], msg[VSPEC_ERRLEN + 400];
  fi.redis = g->where;
  fi.stream = (char *)g->cfg->stream;
  fi.has_max_length = 1;
  fi.max_length = (uint64_t)g->cfg->max_len;
  long long n = 0, pend = 0;
  int rc = VSPEC_EIO;
  snprintf(err, sizeof err, "%s", g->redis_err);
  if (vs_gw_redis_ready(g, vs_now())) rc = vs_gw_depth(g, &n, &pend, err, sizeof err);
  if (rc) {
    snprintf(msg, sizeof msg, "redis at %s %s: %s", g->where,
             rc == VSPEC_EIO ? "unreachable" : "refused", err);
    fi.error = msg;
  } else {
    fi.has_length = fi.has_pending = 1;
    fi.length = (uint64_t)n;
    fi.pending = (uint64_t)pend;
    /* For `vspec status`: the fleet's queue as a daemon reports its own. */
    st.has_queued = st.has_running = st.has_queue_capacity = 1;
    st.queued = (uint32_t)(n > pend ? n - pend : 0);
    st.running = (uint32_t)pend;
    st.queue_capacity = (uint32_t)g->cfg->max_len;
  }
  to.has_submitted = to.has_rejected_busy = to.has_clients_lost = to.has_malformed = 1;
  to.has_uptime_s = 1;
  to.submitted = g->submitted;
  to.has_completed = to.has_failed = to.has_cancelled = 1;
  to.completed = g->completed;
  to.failed = g->failed;
  to.cancelled = g->cancelled;
  to.rejected_busy = g->busy;
  to.clients_lost = g->clients_lost;
  to.malformed = g->malformed;
  to.uptime_s = vs_now() - g->started;
  st.node = (char *)g->cfg->node;
  st.has_clients = 1;
  st.clients = (uint32_t)vs_gw_clients(g);
  st.totals = &to;
  st.fleet = &fi;
  ev.body_case = VSPEC__EVENT__BODY_STATUS;
  ev.status = &st;
  ev.has_request_id = rid != 0;
  ev.request_id = rid;
  vs_gw_send_own(g, env, &ev);
}

static void gw_pong(vs_gw *g, const vs_wire_envelope *env, uint64_t rid) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__Pong p = VSPEC__PONG__INIT;
  p.node = (char *)g->cfg->node;
  ev.body_case = VSPEC__EVENT__BODY_PONG;
  ev.pong = &p;
  ev.has_request_id = rid != 0;
  ev.request_id = rid;
  vs_gw_send_own(g, env, &ev);
}

static void gw_from_client(vs_gw *g, vs_wire_msg *m) {
  vs_wire_alloc a;
  vs_wire_alloc_init(&a, 256 << 10);
  int code;
  char err[VSPEC_ERRLEN];
  Vspec__Request *r = vs_wire_unpack_request(m, &a, &code, err, sizeof err);
  if (!r) {
    g->malformed++;
    vs_gw_reply_error(g, &m->env, 0, code, err);
    return;
  }
  uint64_t rid = r->has_request_id ? r->request_id : 0;
  switch (r->body_case) {
    case VSPEC__REQUEST__BODY_SUBMIT: vs_gw_submit(g, m, r, rid); break;
    case VSPEC__REQUEST__BODY_RESUME: vs_gw_resume(g, m, r->resume, rid); break;
    case VSPEC__REQUEST__BODY_CANCEL: vs_gw_cancel(g, m, r->cancel->job_id, rid); break;
    case VSPEC__REQUEST__BODY_CREDIT: {
      /* A job that ended meanwhile is not an error, as in vspecd. */
      vs_gw_follow *f = vs_gw_follow_find(g, m, r->credit->job_id);
      if (f) {
        int64_t c = f->credit + r->credit->grant;
        f->credit = c > VS_GW_MAX_CREDIT ? VS_GW_MAX_CREDIT : c;
      }
      break;
    }
    case VSPEC__REQUEST__BODY_STATUS: gw_status(g, &m->env, rid); break;
    case VSPEC__REQUEST__BODY_PING: gw_pong(g, &m->env, rid); break;
    case VSPEC__REQUEST__BODY_PLUGINS:
    case VSPEC__REQUEST__BODY_RELOAD:
      vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_FORBIDDEN,
                        "a gateway has no plugins: ask a daemon's admin endpoint");
      break;
    default:
      g->malformed++;
      vs_gw_reply_error(g, &m->env, rid, VSPEC__ERROR_CODE__ERR_MALFORMED, "unknown request");
  }
  vs_wire_request_free(r, &a);
}

/* ---- the loop ------------------------------------------------------------------------------ */

static int gw_setup_front(vs_gw *g, char *err, size_t errlen) {
  const vs_gateway_config *cfg = g->cfg;
  g->front = vs_router_front(g->ctx, cfg->front, cfg->max_message_bytes, cfg->heartbeat_ms,
                             cfg->curve_secret_file, err, errlen);
  return g->front ? VSPEC_OK : VSPEC_EIO;
}

static int gw_setup(vs_gw *g, vs_zap **zap, char *err, size_t errlen) {
  const vs_gateway_config *cfg = g->cfg;
  vs_fleet_opts o;
  gw_fleet_opts(cfg, &o);
  vs_fleet_addr a;
  int rc = vs_fleet_queue_open(&o, &g->q, err, errlen);
  if (rc || (rc = vs_fleet_addr_parse(cfg->redis_url, &a, err, errlen))) return rc;
  if (a.path[0])
    snprintf(g->where, sizeof g->where, "%s", a.path);
  else
    snprintf(g->where, sizeof g->where, strchr(a.host, ':') ? "[%s]:%d" : "%s:%d", a.host,
             a.port);
  g->max_payload = o.max_payload;
  if (sodium_init() < 0) { /* the digests of client-chosen job ids */
    snprintf(err, errlen, "libsodium could not be initialised");
    return VSPEC_EIO;
  }
  g->ctx = zmq_ctx_new();
  if (!g->ctx) {
    snprintf(err, errlen, "zmq_ctx_new failed");
    return VSPEC_EIO;
  }
  /* The ZAP handler is bound in the context before the front accepts anyone. */
  if (cfg->curve_secret_file &&
      (rc = vs_zap_start(g->ctx, cfg->curve_allow_file, zap, err, errlen)))
    return rc;
  return gw_setup_front(g, err, errlen);
}

/* Up to 256 requests per turn, so the relay runs between bursts. */
static void gw_read_front(vs_gw *g) {
  const vs_gateway_config *cfg = g->cfg;
  for (int k = 0; k < 256; k++) {
    vs_wire_msg m;
    char err[VSPEC_ERRLEN];
    int r = vs_wire_recv_request(g->front, 1, &m, (size_t)cfg->max_request_bytes,
                                 (size_t)cfg->max_message_bytes, err, sizeof err);
    if (r == 0) break;
    if (r < 0) {
      g->malformed++;
      if (m.env.n)
        vs_gw_reply_error(g, &m.env, 0,
                          r == VSPEC_ERANGE ? VSPEC__ERROR_CODE__ERR_TOO_LARGE
                                            : VSPEC__ERROR_CODE__ERR_MALFORMED, err);
      continue;
    }
    gw_from_client(g, &m);
    vs_wire_msg_close(&m);
  }
}

int vs_gateway_run(const vs_gateway_config *cfg, char *err, size_t errlen) {
  vs_gw *g = calloc(1, sizeof *g);
  if (!g) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  g->cfg = cfg;
  g->started = vs_now();
  vs_zap *zap = NULL;
  int rc = gw_setup(g, &zap, err, errlen);
  if (rc) goto done;
  struct sigaction sa = {.sa_handler = gw_on_signal};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  vs_log(VSPEC_LOG_INFO, "gateway", "%s: front %s, fleet %s on redis at %s (at most %lld jobs, "
         "%d per connection)", cfg->node, cfg->front, cfg->stream, g->where, cfg->max_len,
         cfg->per_client);
  char e2[VSPEC_ERRLEN];
  if (!vs_gw_redis_note(g, vs_fleet_queue_connect(g->q, e2, sizeof e2), e2))
    vs_log(VSPEC_LOG_INFO, "gateway", "redis at %s: connected", g->where);
  int more = 0;
  while (!gw_stop) {
    zmq_pollitem_t it = {.socket = g->front, .events = ZMQ_POLLIN};
    /* Followed jobs are read every 2 ms or so (each quiet one less and less often, see
     * gateway_relay.c), at once while a backlog lasts (a resume from the start); an idle
     * gateway only waits for requests. The interval is most of the latency a gateway adds
     * to a job's result (docs/BENCHMARKS.md, "Fleet mode"). */
    long wait = more ? 0 : g->follows || g->out ? 2 : 100;
    if (zmq_poll(&it, 1, wait) < 0 && errno != EINTR) {
      snprintf(err, errlen, "poll: %s", zmq_strerror(errno));
      rc = VSPEC_EIO;
      break;
    }
    gw_read_front(g);
    double now = vs_now();
    if (g->out) vs_gw_retry_out(g, now);
    more = vs_gw_relay(g, now);
    vs_gw_heartbeat(g, now);
    vs_gw_sweep(g);
  }
  vs_log(VSPEC_LOG_INFO, "gateway", "stopping");
done:
  vs_gw_kept_free(g);
  vs_gw_follows_free(g);
  if (g->front) zmq_close(g->front);
  vs_zap_stop(zap);
  if (g->ctx) zmq_ctx_term(g->ctx);
  vs_fleet_queue_destroy(&g->q);
  free(g);
  return rc;
}
