/*
 * daemon/server.c - vspecd's service put together (daemon/server.h): open (the device, the
 * models, the workers, the sockets, then the fronts), run, close. The files it calls are
 * listed in daemon/server_internal.h; none of them calls back into this one.
 */
#include "daemon/server_internal.h"

#include <signal.h>

/* ---- setup -------------------------------------------------------------------------------- */

static int server_setup_socket(vs_server *s, int which, const char *endpoint, int curve,
                               const char *secret, char *err, size_t errlen) {
  /* Unpredictable automatic routing ids (daemon/router.c says why). */
  void *z = vs_router_open(s->zctx, err, errlen);
  if (!z) return VSPEC_EIO;
  s->sock[which] = z;
  int one = 1, linger = 0;
  int64_t maxmsg = s->cfg.max_message_bytes;
  /* A vanished peer becomes EHOSTUNREACH and a full one EAGAIN instead of a silent drop. No
   * ZMTP heartbeats: their timer aborts libzmq 4.3.4 on a flooded connection that is reset;
   * TCP keepalive and TCP_USER_TIMEOUT close dead connections instead, and the Heartbeat
   * events of the tick turn them into lost clients (daemon/router.c). */
  if (zmq_setsockopt(z, ZMQ_ROUTER_MANDATORY, &one, sizeof one) ||
      zmq_setsockopt(z, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
      zmq_setsockopt(z, ZMQ_LINGER, &linger, sizeof linger) ||
      vs_tcp_liveness(z, s->cfg.heartbeat_ivl_ms, s->cfg.heartbeat_timeout_ms)) {
    snprintf(err, errlen, "socket options: %s", zmq_strerror(errno));
    return VSPEC_EIO;
  }
  if (curve) {
    if (zmq_setsockopt(z, ZMQ_CURVE_SERVER, &one, sizeof one) ||
        zmq_setsockopt(z, ZMQ_CURVE_SECRETKEY, secret, 40) ||
        zmq_setsockopt(z, ZMQ_ZAP_DOMAIN, "vspec", 5)) {
      snprintf(err, errlen, "CURVE options: %s", zmq_strerror(errno));
      return VSPEC_EIO;
    }
  }
  /* An ipc admin socket is for this user (and its group) only, from the moment it exists:
   * libzmq creates the socket file inside zmq_bind, on this thread, so a umask around it
   * leaves no window with a wider mode (workers do not create files at this point). */
  int admin_file = which == VS_SOCK_ADMIN && !strncmp(endpoint, "ipc://", 6) &&
                   endpoint[6] != '@';
  mode_t old_mask = admin_file ? umask(0117) : 0;
  int bound = zmq_bind(z, endpoint);
  int bind_errno = errno;
  if (admin_file) umask(old_mask);
  if (bound) {
    snprintf(err, errlen, "cannot bind %s: %s", endpoint, zmq_strerror(bind_errno));
    /* An address this host does not have, or an ipc path that cannot exist, is the
     * configuration's fault (exit 2); a port in use is the moment's (exit 1). */
    int bad = bind_errno == EINVAL || bind_errno == EPROTONOSUPPORT ||
              bind_errno == EADDRNOTAVAIL || bind_errno == ENODEV || bind_errno == ENOENT ||
              bind_errno == ENOTDIR;
    return bad ? VSPEC_EINVAL : VSPEC_EIO;
  }
  /* An ipc socket file this daemon made: removed at a clean exit (libzmq leaves it). */
  if (!strncmp(endpoint, "ipc://", 6) && endpoint[6] != '@')
    snprintf(s->ipc_file[which], sizeof s->ipc_file[which], "%s", endpoint + 6);
  if (admin_file && chmod(endpoint + 6, 0660)) {
    snprintf(err, errlen, "cannot make the admin socket %s mode 0660: %s", endpoint + 6,
             strerror(errno));
    return VSPEC_EIO;
  }
  if (vs_zwatch_start(&s->loop, &s->watch[which], z, vs__on_read, s)) {
    snprintf(err, errlen, "cannot watch %s in the event loop", endpoint);
    return VSPEC_EIO;
  }
  s->watches_open++;
  return VSPEC_OK;
}

/* Binding an ipc path takes it over from whoever serves it now: a second daemon started with
 * the same paths would silently steal the first one's clients. Checked before anything is
 * loaded, so the mistake costs no model load. */
static int server_endpoints_free(const vs_daemon_config *cfg, char *err, size_t errlen) {
  const char *eps[2] = {cfg->endpoint, cfg->admin_endpoint};
  char perr[300];
  for (int i = 0; i < 2; i++)
    if (!strncmp(eps[i], "ipc://", 6) && vs_endpoint_probe(eps[i], 500, perr, sizeof perr) == 1) {
      snprintf(err, errlen, "another process serves %s (a vspecd already running?): stop it, "
               "or give this daemon other paths", eps[i]);
      return VSPEC_EIO;
    }
  return VSPEC_OK;
}

/* Whether a failure to use what the configuration names (a directory, a key, a model, a
 * device) is the configuration's fault: all but the host's own troubles (I/O, memory). */
static int server_refusal(int rc) { return rc && rc != VSPEC_EIO && rc != VSPEC_ENOMEM; }

/* The load device ([device]): models load on it, the workers' devices share its memory
 * space. A device that cannot be opened (no GPU, wrong index) stops the start here. */
static int server_open_device(vs_server *s, const char *spec, const vs_device_options *dopt,
                              int *config_refused, char *err, size_t errlen) {
  char inner[VSPEC_ERRLEN] = "";
  int rc = vs_device_open(spec, dopt, &s->load_dev, inner, sizeof inner);
  if (rc) {
    snprintf(err, errlen, "[device] %s: %s", spec, inner);
    *config_refused = rc != VSPEC_ENOMEM; /* a device this host cannot open */
    return rc;
  }
  vs_device_info di;
  vs_dev_info(s->load_dev, &di);
  vs_log(VSPEC_LOG_INFO, "server", "device %s (%s weights)", di.name,
         di.precision == VS_PRECISION_BF16 ? "bf16" : "fp32");
  return VSPEC_OK;
}

/* The default model may not exist yet (models/fmnist is trained separately): then jobs that
 * name no model go to the first model that did load. */
static void server_default_model(vs_server *s) {
  vs_model_status ms[VS_CONF_MAX_MODELS];
  int nm = vs_model_table_status(s->models, ms, VS_CONF_MAX_MODELS), def_ok = 0, first = -1;
  for (int i = 0; i < nm; i++) {
    if (ms[i].loaded && first < 0) first = i;
    if (ms[i].loaded && !strcmp(ms[i].name, s->cfg.default_model)) def_ok = 1;
  }
  if (!def_ok && first >= 0) {
    vs_log(VSPEC_LOG_WARN, "server", "default model '%s' is not available: using '%s'",
           s->cfg.default_model, ms[first].name);
    snprintf(s->cfg.default_model, sizeof s->cfg.default_model, "%s", ms[first].name);
  }
}

/* The plugin registry and the model table. */
static int server_open_models(vs_server *s, const vs_daemon_config *cfg, int *config_refused,
                              char *err, size_t errlen) {
  /* A plugin directory that is missing or others can write; an unusable TMPDIR is EIO. */
  int rc = vs_registry_open(cfg->plugin_dir, &s->host, &s->reg, err, errlen);
  if (rc) {
    *config_refused = server_refusal(rc);
    return rc;
  }
  int bad = vs_registry_scan(s->reg);
  if (bad) vs_log(VSPEC_LOG_WARN, "server", "%d plugin(s) in %s failed to load", bad,
                  cfg->plugin_dir);
  /* No configured model loads (missing directories, bad manifests or weights). */
  if ((rc = vs_model_table_open(s->reg, &s->host, s->load_dev, cfg, &s->models, err, errlen))) {
    *config_refused = rc != VSPEC_ENOMEM;
    return rc;
  }
  server_default_model(s);
  return VSPEC_OK;
}

/* The job queue, the loop's wake-up, the workers, the tick and the signals. */
static int server_open_workers(vs_server *s, const vs_daemon_config *cfg, const char *spec,
                               const vs_device_options *dopt, char *err, size_t errlen) {
  s->submit = (vs_submit_ctx){.cfg = &s->cfg, .models = s->models, .reg = s->reg,
                              .host = &s->host};
  int rc = vs_job_queue_open(cfg->queue_size, cfg->workers, &s->queue);
  if (rc) {
    snprintf(err, errlen, "out of memory");
    return rc;
  }
  uv_async_init(&s->loop, &s->async, vs__on_async);
  s->async.data = s;
  vs_workers_config wc = {.count = cfg->workers, .threads = cfg->threads, .batch = cfg->batch,
                          .queue = s->queue,
                          .models = s->models, .reg = s->reg, .post = vs__post,
                          .post_user = s, .node = s->cfg.node, .device_options = *dopt};
  snprintf(wc.device, sizeof wc.device, "%s", spec);
  if ((rc = vs_workers_start(&wc, &s->workers, err, errlen))) return rc;
  uv_timer_init(&s->loop, &s->tick);
  s->tick.data = s;
  s->on_tick = vs__on_tick;
  uv_signal_init(&s->loop, &s->sig_term);
  uv_signal_init(&s->loop, &s->sig_int);
  uv_signal_init(&s->loop, &s->sig_hup);
  s->sig_term.data = s->sig_int.data = s->sig_hup.data = s;
  uv_signal_start(&s->sig_term, vs__on_signal, SIGTERM);
  uv_signal_start(&s->sig_int, vs__on_signal, SIGINT);
  uv_signal_start(&s->sig_hup, vs__on_sighup, SIGHUP);
  return VSPEC_OK;
}

/* The ZeroMQ context, CURVE (key and allow-list), the job and admin sockets. */
static int server_open_sockets(vs_server *s, const vs_daemon_config *cfg, int *config_refused,
                               char *err, size_t errlen) {
  int rc;
  s->zctx = zmq_ctx_new();
  if (!s->zctx) {
    snprintf(err, errlen, "zmq_ctx_new failed");
    return VSPEC_EIO;
  }
  char secret[41] = "";
  if (cfg->curve) {
    /* The key file and the allow-list: missing, unreadable or malformed are refusals. */
    if ((rc = vs_curve_read_key(cfg->curve_secret_file, "secret", secret, err, errlen)) ||
        /* The handler must be bound before the job socket takes connections. */
        (rc = vs_zap_start(s->zctx, cfg->curve_allow_file, &s->zap, err, errlen))) {
      *config_refused = server_refusal(rc);
      return rc;
    }
  }
  if ((rc = server_setup_socket(s, VS_SOCK_JOB, cfg->endpoint, cfg->curve, secret, err, errlen)) ||
      (rc = server_setup_socket(s, VS_SOCK_ADMIN, cfg->admin_endpoint, 0, NULL, err, errlen))) {
    *config_refused = rc == VSPEC_EINVAL;
    return rc;
  }
  return VSPEC_OK;
}

/* The job socket bound once more, to an inproc endpoint for a client inside vspecd. */
static int server_bind_inproc(vs_server *s, const char *ep, char *err, size_t errlen) {
  if (!zmq_bind(s->sock[VS_SOCK_JOB], ep)) return VSPEC_OK;
  snprintf(err, errlen, "cannot bind %s: %s", ep, zmq_strerror(errno));
  return VSPEC_EIO;
}

/* The fronts, in table order, once the sockets are bound: each is a client of this daemon over
 * an inproc endpoint of its own (daemon/server.h says why). */
static int server_start_fronts(vs_server *s, char *err, size_t errlen) {
  for (int i = 0; i < s->n_fronts; i++) {
    const vs_server_front *f = &s->fronts[i];
    int rc = server_bind_inproc(s, f->endpoint, err, errlen);
    if (!rc) rc = f->start(&s->cfg, &s->front[i], s->zctx, f->endpoint, err, errlen);
    if (rc) return rc;
  }
  return VSPEC_OK;
}

/* Stops the fronts in table order: they write what this daemon already sent, and their
 * requests hold sockets of the ZeroMQ context. */
static void server_stop_fronts(vs_server *s) {
  for (int i = 0; i < s->n_fronts; i++) s->fronts[i].stop(&s->front[i]);
}

int vs_server_open(const vs_daemon_config *cfg, const vs_server_front *fronts, int n_fronts,
                   vs_server **out, int *config_refused, char *err, size_t errlen) {
  *out = NULL;
  *config_refused = 0;
  int rc, busy = server_endpoints_free(cfg, err, errlen);
  if (busy) return busy;
  vs_server *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  s->cfg = *cfg;
  s->started_at = s->last_heartbeat = vs_now();
  s->n_fronts = n_fronts < VS_SERVER_MAX_FRONTS ? n_fronts : VS_SERVER_MAX_FRONTS;
  for (int i = 0; i < s->n_fronts; i++) {
    s->fronts[i] = fronts[i];
    if (fronts[i].prepare && (rc = fronts[i].prepare(&s->cfg, &s->front[i], err, errlen))) {
      server_stop_fronts(s);
      free(s);
      return rc;
    }
  }
  pthread_mutex_init(&s->mail_mu, NULL);
  uv_loop_init(&s->loop);
  vs_host_init(&s->host, vs_cpu_ops());
  char spec[32];
  vs_config_device_spec(cfg, spec, sizeof spec);
  vs_device_options dopt = {.threads = 1, .precision = cfg->device_precision,
                            .memory_limit = (size_t)cfg->device_memory_mb << 20};
  if ((rc = server_open_device(s, spec, &dopt, config_refused, err, errlen)) ||
      (rc = server_open_models(s, cfg, config_refused, err, errlen)) ||
      (rc = server_open_workers(s, cfg, spec, &dopt, err, errlen)) ||
      (rc = server_open_sockets(s, cfg, config_refused, err, errlen)) ||
      (rc = server_start_fronts(s, err, errlen))) {
    vs_server_close(s);
    return rc ? rc : VSPEC_EIO;
  }
  vs_log(VSPEC_LOG_INFO, "server", "%s: jobs on %s%s, admin on %s, plugins from %s", cfg->node,
         cfg->endpoint, cfg->curve ? " (CURVE)" : "", cfg->admin_endpoint, cfg->plugin_dir);
  *out = s;
  return VSPEC_OK;
}

int vs_server_run(vs_server *s) {
  uv_run(&s->loop, UV_RUN_DEFAULT);
  return s->exit_code;
}

static void server_walk_close(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

void vs_server_close(vs_server *s) {
  if (!s) return;
  /* First: the fleet agent writes the events this daemon already sent, and must not lose its
   * socket; HTTP requests hold sockets of the ZeroMQ context. */
  server_stop_fronts(s);
  if (s->queue) vs_job_queue_stop(s->queue);
  vs_workers_join(s->workers);
  s->workers = NULL;
  if (s->async.data) vs__drain_mail(s);
  /* After a failed open, or anything left: close every handle and let the loop finish. */
  uv_walk(&s->loop, server_walk_close, NULL);
  uv_run(&s->loop, UV_RUN_DEFAULT);
  uv_loop_close(&s->loop);
  for (int b = 0; b < VS_BUCKETS; b++) {
    while (s->jobs[b]) {
      vs_djob *j = s->jobs[b];
      s->jobs[b] = j->lp.id_next;
      vs_djob_release(j);
    }
    while (s->clients[b]) {
      vs_client *c = s->clients[b];
      s->clients[b] = c->hnext;
      free(c);
    }
  }
  for (int i = 0; i < 2; i++) {
    if (!s->sock[i]) continue;
    /* Bounded linger: final events get a moment to leave, the exit is never blocked. */
    int linger = s->cfg.linger_ms;
    zmq_setsockopt(s->sock[i], ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(s->sock[i]);
    if (s->ipc_file[i][0]) unlink(s->ipc_file[i]);
  }
  vs_zap_stop(s->zap);
  if (s->zctx) zmq_ctx_term(s->zctx);
  vs_job_queue_close(s->queue);
  vs_model_table_close(s->models);
  vs_registry_close(s->reg);
  if (s->load_dev) vs_dev_destroy(s->load_dev);
  pthread_mutex_destroy(&s->mail_mu);
  free(s);
}
