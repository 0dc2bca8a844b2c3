#include "daemon/server_internal.h"

#include <signal.h>

/* ---- the timer: deadlines, retries, heartbeats, queue positions, drain ----------------------- */

/* When anything last went along the routing envelope of job j: its own events and those of
 * the connection's other jobs with the same envelope, and heartbeats. */
static double vs__envelope_last(const vs_client *c, const vs_djob *j) {
  double last = j->lp.last_event;
  for (const vs_djob *k = c->jobs; k; k = k->lp.client_next)
    if (k->lp.last_event > last && vs_wire_envelope_equal(&k->lp.env, &j->lp.env))
      last = k->lp.last_event;
  return last;
}

/* A Heartbeat goes along each routing envelope of the connection's jobs that got nothing for
 * heartbeat_ivl_ms: a client waiting for a queued job hears the daemon is there (vspec gives
 * up after --timeout of silence), through a proxy each of the proxy's clients does, and a
 * connection that vanished shows up as unroutable. */
static void vs__heartbeat(vs_server *s, vs_client *c, double now) {
  double ivl = s->cfg.heartbeat_ivl_ms / 1000.0;
  for (vs_djob *j = c->jobs; j && !c->gone; j = j->lp.client_next) {
    if (now - vs__envelope_last(c, j) < ivl) continue;
    Vspec__Event ev = VSPEC__EVENT__INIT;
    Vspec__Heartbeat hb = VSPEC__HEARTBEAT__INIT;
    ev.body_case = VSPEC__EVENT__BODY_HEARTBEAT;
    ev.heartbeat = &hb;
    int rc = vs__send(s, c->sock, &j->lp.env, &ev, NULL, 0);
    if (rc == 0) {
      j->lp.last_event = now;
    } else if (rc == -EHOSTUNREACH) {
      vs_log(VSPEC_LOG_INFO, "server", "client %s is gone (heartbeat); cancelling its jobs",
             c->text);
      vs__client_lost(s, c);
    }
  }
}

static void vs__on_tick(uv_timer_t *h) {
  vs_server *s = h->data;
  double now = vs_now();
  int heartbeat = now - s->last_heartbeat >= s->cfg.heartbeat_ivl_ms / 1000.0;
  if (heartbeat) s->last_heartbeat = now;
  /* Collect first: finishing a job changes the table. */
  int cap = s->n_jobs, n = 0;
  vs_djob **all = cap ? malloc((size_t)cap * sizeof *all) : NULL;
  for (int b = 0; all && b < VS_BUCKETS; b++)
    for (vs_djob *j = s->jobs[b]; j && n < cap; j = j->lp.id_next) {
      vs_djob_retain(j);
      all[n++] = j;
    }
  for (int i = 0; i < n; i++) {
    vs_djob *j = all[i];
    if (j->lp.terminal_sent) continue;
    if (j->deadline > 0 && now >= j->deadline && !atomic_load(&j->cancel)) {
      char who[40];
      snprintf(who, sizeof who, "job %llu", (unsigned long long)j->id);
      vs_log(VSPEC_LOG_INFO, who, "deadline passed");
      if (vs_job_queue_remove(s->queue, j)) vs__finish_unstarted(s, j, VS_CANCEL_DEADLINE);
      else vs_djob_cancel(j, VS_CANCEL_DEADLINE);
      continue;
    }
    if (s->hard_cancel && !atomic_load(&j->cancel)) vs_djob_cancel(j, VS_CANCEL_DRAIN);
    if (j->lp.retry) vs__pump(s, j);
    /* Waiting jobs hear where they are in the queue when it changes. */
    if (heartbeat && j->progress && j->lp.credit > 0 && !j->lp.accepted_pending &&
        j->lp.client && !j->lp.client->gone) {
      int pos = vs_job_queue_position(s->queue, j);
      if (pos >= 0 && pos != j->lp.queued_reported) {
        Vspec__Event ev = VSPEC__EVENT__INIT;
        Vspec__Progress p = VSPEC__PROGRESS__INIT;
        p.has_round = p.has_queue_position = p.has_tokens_total = 1;
        p.round = -1;
        p.queue_position = (uint32_t)pos;
        p.tokens_total = (uint32_t)j->tokens_total;
        ev.body_case = VSPEC__EVENT__BODY_PROGRESS;
        ev.progress = &p;
        if (vs__job_send(s, j, &ev, NULL, 0) == 0) {
          j->lp.credit--;
          j->lp.queued_reported = pos;
        }
      }
    }
  }
  for (int i = 0; i < n; i++) vs_djob_release(all[i]);
  free(all);

  /* Terminal events that met a full queue: retry; a client that takes nothing for a whole
   * heartbeat timeout is treated as gone. */
  vs_djob *ob = s->outbox;
  s->outbox = NULL;
  while (ob) {
    vs_djob *j = ob;
    ob = j->lp.outbox_next;
    j->lp.outbox_next = NULL;
    int rc = vs__send_terminal(s, j);
    if (rc == -EAGAIN && now - j->lp.outbox_since < s->cfg.heartbeat_timeout_ms / 1000.0) {
      j->lp.outbox_next = s->outbox;
      s->outbox = j;
      continue;
    }
    if (rc == -EAGAIN && j->lp.client) {
      vs_log(VSPEC_LOG_INFO, "server", "client %s took nothing for %d ms: treated as gone",
             j->lp.client->text, s->cfg.heartbeat_timeout_ms);
      vs__client_lost(s, j->lp.client);
    }
    j->lp.in_outbox = 0;
    vs__job_unlink(s, j);
  }

  if (heartbeat)
    for (int b = 0; b < VS_BUCKETS; b++)
      for (vs_client *c = s->clients[b]; c; c = c->hnext) vs__heartbeat(s, c, now);
  vs__reap(s);

  if (s->draining && !s->hard_cancel && s->cfg.drain_timeout_ms >= 0 &&
      now - s->drain_started >= s->cfg.drain_timeout_ms / 1000.0 && s->n_jobs) {
    vs_log(VSPEC_LOG_WARN, "server", "drain timeout (%d ms): cancelling %d job(s)",
           s->cfg.drain_timeout_ms, s->n_jobs);
    s->hard_cancel = 1;
  }
  if (!s->n_jobs && !s->outbox && !s->draining) {
    uv_timer_stop(&s->tick);
    s->tick_running = 0;
  }
  vs__check_drained(s);
}

void vs__start_tick(vs_server *s) {
  if (s->tick_running || s->stopping) return;
  s->tick_running = 1;
  uv_timer_start(&s->tick, vs__on_tick, VS_TICK_MS, VS_TICK_MS);
}


/* ---- shutdown ------------------------------------------------------------------------------- */

static void vs__watch_closed(vs_zwatch *w, void *user) {
  vs_server *s = user;
  (void)w;
  s->watches_open--;
}

static void vs__stop_loop(vs_server *s) {
  if (s->stopping) return;
  s->stopping = 1;
  vs_log(VSPEC_LOG_INFO, "server", "drained: stopping");
  /* Workers first: after they are joined nobody calls uv_async_send any more. */
  vs_job_queue_stop(s->queue);
  vs_workers_join(s->workers);
  s->workers = NULL;
  vs__drain_mail(s);
  uv_timer_stop(&s->tick);
  uv_close((uv_handle_t *)&s->tick, NULL);
  uv_close((uv_handle_t *)&s->async, NULL);
  uv_signal_stop(&s->sig_term);
  uv_signal_stop(&s->sig_int);
  uv_signal_stop(&s->sig_hup);
  uv_close((uv_handle_t *)&s->sig_term, NULL);
  uv_close((uv_handle_t *)&s->sig_int, NULL);
  uv_close((uv_handle_t *)&s->sig_hup, NULL);
  /* Stopping the watchers gives the signals back their default action, which kills: a
   * second SIGTERM (a supervisor's, a user's Ctrl-C) landing during the bounded teardown
   * would turn a clean exit into a death by signal. The teardown is short; SIGKILL stays. */
  signal(SIGTERM, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  for (int i = 0; i < 2; i++) vs_zwatch_close(&s->watch[i], vs__watch_closed);
}

void vs__check_drained(vs_server *s) {
  if (s->draining && !s->stopping && !s->n_jobs && !s->outbox && !s->reload) vs__stop_loop(s);
}

static void vs__begin_drain(vs_server *s, const char *why) {
  if (s->draining) {
    if (!s->hard_cancel) {
      vs_log(VSPEC_LOG_WARN, "server", "%s again: cancelling the running jobs", why);
      s->hard_cancel = 1;
    }
    vs__start_tick(s);
    return;
  }
  s->draining = 1;
  s->drain_started = vs_now();
  vs_sd_notify("STOPPING=1\nSTATUS=draining");
  vs_fleet_agent_drain(s->fleet);
  vs_djob *q[4096];
  int n, total = 0;
  while ((n = vs_job_queue_take_all(s->queue, q, 4096)) > 0) {
    for (int i = 0; i < n; i++) {
      vs__finish_unstarted(s, q[i], VS_CANCEL_DRAIN);
      vs_djob_release(q[i]); /* the queue's reference */
    }
    total += n;
  }
  if (s->cfg.drain == VS_DRAIN_CANCEL) s->hard_cancel = 1;
  vs_log(VSPEC_LOG_INFO, "server", "%s: draining; %d waiting job(s) refused, %d running job(s) "
         "%s", why, total, s->n_jobs, s->hard_cancel ? "cancelled" : "finishing");
  vs__reap(s);
  vs__start_tick(s);
  vs__check_drained(s);
}

static void server_on_signal(uv_signal_t *h, int signum) {
  vs_server *s = h->data;
  vs__begin_drain(s, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}


/* ---- setup -------------------------------------------------------------------------------- */

static int vs__setup_socket(vs_server *s, int which, const char *endpoint, int curve,
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
static int vs__endpoints_free(const vs_daemon_config *cfg, char *err, size_t errlen) {
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
static int vs__refusal(int rc) { return rc && rc != VSPEC_EIO && rc != VSPEC_ENOMEM; }

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
    *config_refused = vs__refusal(rc);
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
  uv_signal_init(&s->loop, &s->sig_term);
  uv_signal_init(&s->loop, &s->sig_int);
  uv_signal_init(&s->loop, &s->sig_hup);
  s->sig_term.data = s->sig_int.data = s->sig_hup.data = s;
  uv_signal_start(&s->sig_term, server_on_signal, SIGTERM);
  uv_signal_start(&s->sig_int, server_on_signal, SIGINT);
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
      *config_refused = vs__refusal(rc);
      return rc;
    }
  }
  if ((rc = vs__setup_socket(s, VS_SOCK_JOB, cfg->endpoint, cfg->curve, secret, err, errlen)) ||
      (rc = vs__setup_socket(s, VS_SOCK_ADMIN, cfg->admin_endpoint, 0, NULL, err, errlen))) {
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

/* Fleet mode: the agent is a client of this daemon over inproc (daemon/fleet_agent.h says
 * why). */
static int server_open_fleet(vs_server *s, const vs_daemon_config *cfg, char *err,
                             size_t errlen) {
  static const char fleet_ep[] = "inproc://vspecd-fleet";
  int rc = server_bind_inproc(s, fleet_ep, err, errlen);
  if (!rc) rc = vs_fleet_agent_start(&s->cfg, s->zctx, fleet_ep, &s->fleet, err, errlen);
  if (rc) return rc;
  vs_fleet_addr fa; /* for the log: where, never the password */
  char where[400];
  vs_fleet_addr_parse(cfg->fleet_redis, &fa, where, sizeof where);
  if (fa.path[0]) snprintf(where, sizeof where, "%s", fa.path);
  else snprintf(where, sizeof where, "%s:%d", fa.host, fa.port);
  vs_log(VSPEC_LOG_INFO, "server", "%s: fleet mode, jobs from redis at %s (stream %s, group %s)",
         cfg->node, where, cfg->fleet_stream, cfg->fleet_group);
  return VSPEC_OK;
}

int vs_server_open(const vs_daemon_config *cfg, vs_server **out, int *config_refused, char *err,
                   size_t errlen) {
  *out = NULL;
  *config_refused = 0;
  int rc, busy = vs__endpoints_free(cfg, err, errlen);
  if (busy) return busy;
  vs_server *s = calloc(1, sizeof *s);
  if (!s) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  s->cfg = *cfg;
  s->started_at = s->last_heartbeat = vs_now();
  if (cfg->http_listen[0] && (rc = vs_http_listen(&s->cfg, &s->http, err, errlen))) {
    free(s);
    return rc;
  }
  pthread_mutex_init(&s->mail_mu, NULL);
  uv_loop_init(&s->loop);
  vs_host_init(&s->host, vs_cpu_ops());
  char spec[32];
  vs_config_device_spec(cfg, spec, sizeof spec);
  vs_device_options dopt = {.threads = 1, .precision = cfg->device_precision,
                            .memory_limit = (size_t)cfg->device_memory_mb << 20};
  static const char http_ep[] = "inproc://vspecd-http";
  if ((rc = server_open_device(s, spec, &dopt, config_refused, err, errlen)) ||
      (rc = server_open_models(s, cfg, config_refused, err, errlen)) ||
      (rc = server_open_workers(s, cfg, spec, &dopt, err, errlen)) ||
      (rc = server_open_sockets(s, cfg, config_refused, err, errlen)) ||
      (cfg->fleet_redis[0] && (rc = server_open_fleet(s, cfg, err, errlen))) ||
      /* HTTP requests are clients of this daemon over inproc too (daemon/http_server.h). */
      (cfg->http_listen[0] && ((rc = server_bind_inproc(s, http_ep, err, errlen)) ||
                               (rc = vs_http_serve(s->http, s->zctx, http_ep, err, errlen))))) {
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

static void vs__walk_close(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h)) uv_close(h, NULL);
}

void vs_server_close(vs_server *s) {
  if (!s) return;
  /* First: it writes the events this daemon already sent, and must not lose its socket. */
  vs_fleet_agent_stop(&s->fleet);
  vs_http_stop(&s->http); /* its requests hold sockets of the ZeroMQ context */
  if (s->queue) vs_job_queue_stop(s->queue);
  vs_workers_join(s->workers);
  s->workers = NULL;
  if (s->async.data) vs__drain_mail(s);
  /* After a failed open, or anything left: close every handle and let the loop finish. */
  uv_walk(&s->loop, vs__walk_close, NULL);
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
