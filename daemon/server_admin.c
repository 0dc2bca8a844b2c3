/*
 * daemon/server_admin.c - vspecd's admin requests: status, plugins, reloads, and SIGHUP's rescan of the plugin directory
 * (daemon/server_internal.h).
 */
#include "daemon/server_internal.h"

static void admin_fill_plugin(Vspec__PluginInfo *pi, const vs_plugin_status *p) {
  vspec__plugin_info__init(pi);
  pi->kind = (char *)vs_plugin_kind_name(p->kind);
  pi->name = (char *)p->name;
  pi->version = (char *)p->version;
  pi->has_generation = pi->has_users = pi->has_retired_alive = 1;
  pi->generation = p->generation;
  pi->users = p->users;
  pi->retired_alive = p->retired_alive;
}

#define VS_MAX_PLUGINS 128

/* The workers: every one on the admin endpoint; on the job endpoint only those running a job
 * of the asker, since job ids are how a client cancels or follows a job and the others' are
 * none of its business (issue 32, finding 6). Fills wi/wip, returns how many. */
static int admin_status_workers(vs_server *s, int sock, const vs_wire_msg *m,
                                Vspec__WorkerInfo *wi, Vspec__WorkerInfo **wip, int max) {
  vs_worker_status ws[256];
  int nw = vs_workers_status(s->workers, ws, max < 256 ? max : 256), n = 0;
  for (int i = 0; i < nw; i++) {
    if (sock != VS_SOCK_ADMIN) {
      const vs_djob *j = ws[i].job_id ? vs__job_find(s, ws[i].job_id) : NULL;
      if (!j || !vs__job_owned_by(j, sock, m)) continue;
    }
    vspec__worker_info__init(&wi[n]);
    wi[n].has_index = wi[n].has_job_id = wi[n].has_tokens_done = 1;
    wi[n].has_tokens_total = wi[n].has_jobs_done = 1;
    wi[n].index = (uint32_t)i;
    wi[n].job_id = ws[i].job_id;
    wi[n].tokens_done = (uint32_t)ws[i].tokens_done;
    wi[n].tokens_total = (uint32_t)ws[i].tokens_total;
    wi[n].jobs_done = ws[i].jobs_done;
    wip[n] = &wi[n];
    n++;
  }
  return n;
}

/* One model's entry; its directory only for the admin endpoint (paths of the host are not
 * for job clients). class_names gets an array for the caller to free. */
static void admin_status_model(vs_server *s, int i, const vs_model_status *ms, int admin,
                               Vspec__ModelInfo *mi, char *backends[3], char ***class_names) {
  vspec__model_info__init(mi);
  mi->name = (char *)ms->name;
  mi->dir = admin ? (char *)ms->dir : NULL;
  mi->has_generation = mi->has_jobs = mi->has_retired_alive = 1;
  mi->generation = ms->generation;
  mi->jobs = ms->jobs;
  mi->retired_alive = ms->retired_alive;
  if (!ms->loaded) return;
  mi->has_grid_h = mi->has_grid_w = mi->has_num_classes = 1;
  mi->has_has_draft = mi->has_has_eagle = mi->has_continuous = 1;
  mi->grid_h = (uint32_t)ms->info.grid_h;
  mi->grid_w = (uint32_t)ms->info.grid_w;
  mi->num_classes = (uint32_t)ms->info.num_classes;
  mi->has_image_h = mi->has_image_w = 1;
  mi->image_h = (uint32_t)ms->info.image_h;
  mi->image_w = (uint32_t)ms->info.image_w;
  mi->has_draft = ms->has_draft;
  mi->has_eagle = ms->has_eagle;
  mi->continuous = ms->info.token_kind == VSPEC_TOKENS_CONTINUOUS;
  for (int b = 0; b < ms->n_backends; b++) backends[b] = (char *)ms->backends[b];
  mi->n_backends = (size_t)ms->n_backends;
  mi->backends = backends;
  int nc = 0;
  *class_names = vs_model_table_class_names(s->models, i, &nc);
  mi->n_class_names = (size_t)nc;
  mi->class_names = *class_names;
  if (ms->costed) {
    mi->has_step_ops = mi->has_step_downloads = mi->has_verify16_ops = 1;
    mi->step_ops = (uint32_t)ms->step_cost.ops;
    mi->step_downloads = (uint32_t)ms->step_cost.downloads;
    mi->verify16_ops = (uint32_t)ms->verify16_cost.ops;
  }
}

static void admin_status_totals(vs_server *s, Vspec__Totals *to) {
  to->has_submitted = to->has_completed = to->has_failed = to->has_cancelled = 1;
  to->has_rejected_busy = to->has_clients_lost = to->has_malformed = to->has_tokens = 1;
  to->has_uptime_s = to->has_preview_bytes = 1;
  to->submitted = s->totals.submitted;
  to->completed = s->totals.completed;
  to->failed = s->totals.failed;
  to->cancelled = s->totals.cancelled;
  to->rejected_busy = s->totals.rejected_busy;
  to->clients_lost = s->totals.clients_lost;
  to->malformed = s->totals.malformed;
  to->tokens = s->totals.tokens;
  to->uptime_s = vs_now() - s->started_at;
  to->preview_bytes = s->stats.preview_bytes;
}

void vs__handle_status(vs_server *s, int sock, const vs_wire_msg *m, uint64_t rid) {
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__StatusReply st = VSPEC__STATUS_REPLY__INIT;
  Vspec__Totals to = VSPEC__TOTALS__INIT;
  static vs_plugin_status ps[VS_MAX_PLUGINS];
  static Vspec__PluginInfo pi[VS_MAX_PLUGINS];
  Vspec__PluginInfo *pip[VS_MAX_PLUGINS];
  vs_model_status ms[VS_CONF_MAX_MODELS];
  Vspec__ModelInfo mi[VS_CONF_MAX_MODELS], *mip[VS_CONF_MAX_MODELS];
  char *backends[VS_CONF_MAX_MODELS][3];
  char **class_names[VS_CONF_MAX_MODELS] = {0};
  Vspec__WorkerInfo wi[256], *wip[256];
  int admin = sock == VS_SOCK_ADMIN;
  st.node = s->cfg.node;
  st.has_queued = st.has_queue_capacity = st.has_running = st.has_draining = st.has_clients = 1;
  st.queued = (uint32_t)vs_job_queue_waiting(s->queue);
  st.queue_capacity = (uint32_t)s->cfg.queue_size;
  st.running = (uint32_t)vs_job_queue_running(s->queue);
  st.draining = s->draining != 0;
  st.clients = (uint32_t)s->n_clients;
  st.default_model = s->cfg.default_model;
  st.has_node_id = 1;
  st.node_id = s->cfg.node_id;
  st.has_own_jobs_only = !admin;
  st.own_jobs_only = !admin;
  Vspec__DeviceInfo dv = VSPEC__DEVICE_INFO__INIT;
  vs_device_info di;
  if (vs_workers_device_info(s->workers, &di) == VSPEC_OK) {
    dv.name = di.name;
    dv.kind = di.kind == VSPEC_DEVICE_CUDA ? "cuda" : "cpu";
    dv.has_index = dv.has_memory_used = dv.has_memory_total = 1;
    dv.index = (uint32_t)di.index;
    dv.memory_used = di.mem_used;
    dv.memory_total = di.mem_total;
    dv.precision = di.precision == VS_PRECISION_BF16 ? "bf16" : "fp32";
    st.device = &dv;
  }
  st.n_workers = (size_t)admin_status_workers(s, sock, m, wi, wip, 256);
  st.workers = wip;
  int np = vs_registry_list(s->reg, ps, VS_MAX_PLUGINS);
  if (np > VS_MAX_PLUGINS) np = VS_MAX_PLUGINS;
  for (int i = 0; i < np; i++) {
    admin_fill_plugin(&pi[i], &ps[i]);
    pip[i] = &pi[i];
  }
  st.n_plugins = (size_t)np;
  st.plugins = pip;
  int nm = vs_model_table_status(s->models, ms, VS_CONF_MAX_MODELS);
  for (int i = 0; i < nm; i++) {
    admin_status_model(s, i, &ms[i], admin, &mi[i], backends[i], &class_names[i]);
    mip[i] = &mi[i];
  }
  st.n_models = (size_t)nm;
  st.models = mip;
  admin_status_totals(s, &to);
  st.totals = &to;
  Vspec__MethodStats ms_buf[VS_STATS_MAX_METHODS], *ms_ptr[VS_STATS_MAX_METHODS];
  st.n_methods = (size_t)vs_stats_to_proto(&s->stats, ms_buf, ms_ptr, VS_STATS_MAX_METHODS);
  st.methods = ms_ptr;
  ev.body_case = VSPEC__EVENT__BODY_STATUS;
  ev.status = &st;
  if (rid) {
    ev.has_request_id = 1;
    ev.request_id = rid;
  }
  vs__send(s, sock, &m->env, &ev, NULL, 0);
  for (int i = 0; i < nm; i++) free(class_names[i]);
}

void vs__handle_plugins(vs_server *s, int sock, const vs_wire_envelope *env,
                        uint64_t rid) {
  static vs_plugin_status ps[VS_MAX_PLUGINS];
  static Vspec__PluginInfo pi[VS_MAX_PLUGINS];
  Vspec__PluginInfo *pip[VS_MAX_PLUGINS];
  int np = vs_registry_list(s->reg, ps, VS_MAX_PLUGINS);
  if (np > VS_MAX_PLUGINS) np = VS_MAX_PLUGINS;
  for (int i = 0; i < np; i++) {
    admin_fill_plugin(&pi[i], &ps[i]);
    pip[i] = &pi[i];
  }
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__PluginsReply pr = VSPEC__PLUGINS_REPLY__INIT;
  pr.n_plugins = (size_t)np;
  pr.plugins = pip;
  /* A path of the host: for the admin endpoint only (issue 32, finding 6). */
  if (sock == VS_SOCK_ADMIN) pr.plugin_dir = (char *)vs_registry_dir(s->reg);
  ev.body_case = VSPEC__EVENT__BODY_PLUGINS;
  ev.plugins = &pr;
  if (rid) {
    ev.has_request_id = 1;
    ev.request_id = rid;
  }
  vs__send(s, sock, env, &ev, NULL, 0);
}

static int admin_plugin_status(vs_server *s, int kind, const char *name, vs_plugin_status *out) {
  static vs_plugin_status ps[VS_MAX_PLUGINS];
  int np = vs_registry_list(s->reg, ps, VS_MAX_PLUGINS);
  for (int i = 0; i < np && i < VS_MAX_PLUGINS; i++)
    if (ps[i].kind == kind && !strcmp(ps[i].name, name)) {
      *out = ps[i];
      return 1;
    }
  return 0;
}

static void admin_send_reload_reply(vs_server *s, int sock, const vs_wire_envelope *env,
                                    uint64_t rid, int kind, const char *name, char names[][64],
                                    int n_names) {
  vs_plugin_status p;
  Vspec__Event ev = VSPEC__EVENT__INIT;
  Vspec__ReloadReply rr = VSPEC__RELOAD_REPLY__INIT;
  Vspec__PluginInfo pi;
  char *np[VS_CONF_MAX_MODELS];
  if (admin_plugin_status(s, kind, name, &p)) {
    admin_fill_plugin(&pi, &p);
    rr.plugin = &pi;
  }
  for (int i = 0; i < n_names && i < VS_CONF_MAX_MODELS; i++) np[i] = names[i];
  rr.n_models_reloaded = (size_t)(n_names < VS_CONF_MAX_MODELS ? n_names : VS_CONF_MAX_MODELS);
  rr.models_reloaded = np;
  ev.body_case = VSPEC__EVENT__BODY_RELOAD;
  ev.reload = &rr;
  if (rid) {
    ev.has_request_id = 1;
    ev.request_id = rid;
  }
  vs__send(s, sock, env, &ev, NULL, 0);
}

static void admin_reload_work(uv_work_t *req) {
  vs_reload_work *w = req->data;
  w->rc = vs_model_table_reload_backend(w->s->models, w->backend, w->names, VS_CONF_MAX_MODELS,
                                        w->err, sizeof w->err);
}

static void admin_hup_next_backend(vs_server *s);

static void admin_reload_done(uv_work_t *req, int status) {
  vs_reload_work *w = req->data;
  vs_server *s = w->s;
  s->reload = NULL;
  /* sock < 0: started by SIGHUP, nobody to answer. */
  if (status < 0 || w->rc < 0) {
    char msg[VSPEC_ERRLEN + 64];
    snprintf(msg, sizeof msg, "backend %s: the plugin was reloaded but its models were not: %s",
             w->backend, status < 0 ? uv_strerror(status) : w->err);
    vs_log(VSPEC_LOG_WARN, "admin", "%s", msg);
    if (w->sock >= 0)
      vs__reply_error(s, w->sock, &w->env, w->request_id, VSPEC__ERROR_CODE__ERR_INTERNAL, msg, 0);
  } else {
    vs_log(VSPEC_LOG_INFO, "admin", "backend %s reloaded; %d model(s) reopened", w->backend,
           w->rc);
    if (w->sock >= 0)
      admin_send_reload_reply(s, w->sock, &w->env, w->request_id, VSPEC_PLUGIN_BACKEND,
                              w->backend, w->names, w->rc < VS_CONF_MAX_MODELS ? w->rc
                                                                             : VS_CONF_MAX_MODELS);
  }
  free(w);
  admin_hup_next_backend(s);
  vs__check_drained(s);
}

static int admin_plugin_file_exists(vs_server *s, int kind, const char *name) {
  char path[2048];
  struct stat sb;
  snprintf(path, sizeof path, "%s/%s_%s.so", vs_registry_dir(s->reg), vs_plugin_kind_name(kind),
           name);
  return stat(path, &sb) == 0;
}

void vs__handle_reload(vs_server *s, int sock, const vs_wire_envelope *env,
                       const Vspec__Request *r) {
  uint64_t rid = r->has_request_id ? r->request_id : 0;
  char msg[VSPEC_ERRLEN + 128], name[64] = "";
  int kind = -1;
  /* Off the admin socket: only the characters of a plugin reference get further, so that no
   * message or log line below carries the sender's bytes (core/names.h). */
  if (vs_name_check(&vs_name_reload, "reload", r->reload->name, msg, sizeof msg) ||
      vs_plugin_ref_parse(r->reload->name, &kind, name, msg, sizeof msg)) {
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_INVALID, msg, 0);
    return;
  }
  if (kind < 0) {
    int found = 0;
    for (int k = VSPEC_PLUGIN_BACKEND; k <= VSPEC_PLUGIN_DRAFTER; k++)
      if (admin_plugin_file_exists(s, k, name)) {
        kind = k;
        found++;
      }
    if (found != 1) {
      snprintf(msg, sizeof msg, found ? "reload: '%s' names plugins of several kinds; say "
               "KIND/%s" : "reload: no plugin '%s' in the plugin directory%.0s", name, name);
      vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_INVALID, msg, 0);
      return;
    }
  }
  if (kind == VSPEC_PLUGIN_BACKEND && s->reload) {
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_BUSY,
                    "a backend reload is already running", 1000);
    return;
  }
  char err[VSPEC_ERRLEN];
  int rc = vs_registry_reload(s->reg, kind, name, err, sizeof err);
  if (rc) {
    snprintf(msg, sizeof msg, "reload %s/%s failed, the current generation stays: %s",
             vs_plugin_kind_name(kind), name, err);
    vs_log(VSPEC_LOG_WARN, "admin", "%s", msg);
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_INVALID, msg, 0);
    return;
  }
  vs_plugin_status ps;
  if (admin_plugin_status(s, kind, name, &ps))
    vs_log(VSPEC_LOG_INFO, "admin", "%s/%s reloaded: version %s, generation %u",
           vs_plugin_kind_name(kind), name, ps.version, ps.generation);
  if (kind != VSPEC_PLUGIN_BACKEND) {
    admin_send_reload_reply(s, sock, env, rid, kind, name, NULL, 0);
    return;
  }
  /* Backends serve models: open new model sets on the thread pool (weights, colour table);
   * running jobs keep their sets. */
  vs_reload_work *w = calloc(1, sizeof *w);
  if (!w) {
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_INTERNAL, "out of memory", 0);
    return;
  }
  w->s = s;
  w->env = *env;
  w->sock = sock;
  w->request_id = rid;
  snprintf(w->backend, sizeof w->backend, "%s", name);
  w->req.data = w;
  s->reload = w;
  if ((rc = uv_queue_work(&s->loop, &w->req, admin_reload_work, admin_reload_done))) {
    s->reload = NULL;
    free(w);
    vs__reply_error(s, sock, env, rid, VSPEC__ERROR_CODE__ERR_INTERNAL, uv_strerror(rc), 0);
  }
}


/* SIGHUP's backends, one at a time: a backend reload reopens its models on the thread pool
 * (admin_reload_done starts the next). */
static void admin_hup_next_backend(vs_server *s) {
  while (!s->reload && !s->draining && s->hup_next < s->hup.n_backends) {
    const char *name = s->hup.backends[s->hup_next++];
    char err[VSPEC_ERRLEN];
    if (vs_registry_reload(s->reg, VSPEC_PLUGIN_BACKEND, name, err, sizeof err)) {
      vs_log(VSPEC_LOG_WARN, "server", "SIGHUP: backend %s: %s; the current generation stays",
             name, err);
      continue;
    }
    vs_reload_work *w = calloc(1, sizeof *w);
    if (!w) return;
    w->s = s;
    w->sock = -1;
    snprintf(w->backend, sizeof w->backend, "%s", name);
    w->req.data = w;
    s->reload = w;
    if (uv_queue_work(&s->loop, &w->req, admin_reload_work, admin_reload_done)) {
      s->reload = NULL;
      free(w);
    }
  }
  if (s->hup_reloading && !s->reload && s->hup_next >= s->hup.n_backends) {
    s->hup_reloading = 0;
    vs_sd_notify("READY=1\nSTATUS=serving");
  }
}

/* SIGHUP (systemctl reload): the plugin directory again: new plugins loaded, changed ones
 * reloaded (docs/DESIGN.md, "Plugin loading rules"). Jobs keep the generations they hold. */
void vs__on_sighup(uv_signal_t *h, int signum) {
  vs_server *s = h->data;
  if (s->draining) return;
  if (s->reload || s->hup_next < s->hup.n_backends) {
    vs_log(VSPEC_LOG_WARN, "server", "SIGHUP: a backend reload is still running; send it again "
           "once it is done");
    return;
  }
  vs_registry_refresh_report *r = &s->hup;
  if (vs_registry_refresh(s->reg, r)) {
    vs_log(VSPEC_LOG_WARN, "server", "SIGHUP: cannot read the plugin directory %s",
           vs_registry_dir(s->reg));
    return;
  }
  s->hup_next = 0;
  s->hup_reloading = 1;
  /* systemd's reload protocol: RELOADING=1 with the time it began, READY=1 when done. */
  char st[96];
  snprintf(st, sizeof st, "RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=reloading plugins",
           (unsigned long long)(vs_now() * 1e6));
  vs_sd_notify(st);
  vs_log(VSPEC_LOG_INFO, "server", "SIGHUP: plugin directory scanned: %d new, %d reloaded, "
         "%d backend(s) to reload with their models, %d failed", r->loaded, r->reloaded,
         r->n_backends, r->failed);
  admin_hup_next_backend(s);
}
