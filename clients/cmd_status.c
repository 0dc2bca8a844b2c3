/*
 * clients/cmd_status.c - vspec status: queue, workers, models, plugins with generations, totals.
 */
#include "clients/cli.h"

static void usage_status(FILE *f) {
  fprintf(f,
          "usage: vspec status [options]\n"
          "\n"
          "Shows the daemon's queue, workers, models (with the names of their classes, what\n"
          "`vspec generate --class N` asks for), loaded plugins with their generations, and\n"
          "totals since it started. Asked on the job endpoint (--server) it shows your own\n"
          "jobs, the daemon's counts and no paths; the admin endpoint (the default, --admin)\n"
          "shows every job, the model directories and the plugin directory.\n"
          "\n"
          "  --json               one JSON object on stdout\n" VS_NET_OPTIONS_HELP
          "\nExit status: 0, 3 daemon unreachable.\n");
}

static int cs_uses(const Vspec__ModelInfo *m, const char *backend) {
  for (size_t b = 0; b < m->n_backends; b++)
    if (!strcmp(m->backends[b], backend)) return 1;
  return 0;
}

/* A backend plugin is held by the models it serves, once per role (fmnist-mar's target and
 * draft are two), and jobs hold models, not backends: its own reference count read as
 * "4 job(s)" on an idle daemon. Shown instead: the models that use it, the jobs on them. */
static void cs_print_backend(const Vspec__PluginInfo *p, const Vspec__StatusReply *s) {
  int n = 0, jobs = 0;
  char names[512] = "";
  size_t used = 0;
  for (size_t i = 0; i < s->n_models; i++) {
    const Vspec__ModelInfo *m = s->models[i];
    if (!p->name || !cs_uses(m, p->name)) continue;
    if (used + 1 < sizeof names)
      used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", n ? ", " : "", m->name);
    n++;
    jobs += m->jobs;
  }
  printf("  %-8s %-14s %-10s generation %u, ", p->kind, p->name ? p->name : "?",
         p->version ? p->version : "?", p->generation);
  if (n) printf("held by %d model(s) (%s), %d job(s) on them", n, names, jobs);
  else printf("held by no model");
  if (p->retired_alive) printf(", %d older generation(s) still in use", p->retired_alive);
  printf("\n");
}

/* "classes 0 T-shirt/top, 1 Trouser, ..." under a model's line, wrapped at 80 columns:
 * what `--class` numbers mean. */
static void cs_print_classes(const Vspec__ModelInfo *m) {
  if (!m->n_class_names) return;
  int col = printf("             classes");
  for (size_t c = 0; c < m->n_class_names; c++) {
    char item[96];
    int n = snprintf(item, sizeof item, " %zu %s%s", c, m->class_names[c],
                     c + 1 < m->n_class_names ? "," : "");
    if (col + n > 80) col = printf("\n                    ");
    col += printf("%s", item);
  }
  printf("\n");
}

/* Whether the daemon says which backends its models use (older ones do not). */
static int cs_knows_backends(const Vspec__StatusReply *s) {
  for (size_t i = 0; i < s->n_models; i++)
    if (s->models[i]->n_backends) return 1;
  return 0;
}

/* ---- --json ------------------------------------------------------------------------- */

static void status_json_device(const Vspec__DeviceInfo *d) {
  printf(", \"device\": {\"name\": ");
  vs__json_str(stdout, d->name);
  printf(", \"kind\": ");
  vs__json_str(stdout, d->kind);
  printf(", \"index\": %u, \"memory_used\": %llu, \"memory_total\": %llu, \"precision\": ",
         d->index, (unsigned long long)d->memory_used, (unsigned long long)d->memory_total);
  vs__json_str(stdout, d->precision);
  printf("}");
}

static void status_json_fleet(const Vspec__FleetInfo *f) {
  printf(", \"fleet\": {\"redis\": ");
  vs__json_str(stdout, f->redis);
  printf(", \"stream\": ");
  vs__json_str(stdout, f->stream);
  printf(", \"length\": %llu, \"pending\": %llu, \"max_length\": %llu, \"error\": ",
         (unsigned long long)f->length, (unsigned long long)f->pending,
         (unsigned long long)f->max_length);
  if (f->error) vs__json_str(stdout, f->error);
  else printf("null");
  printf("}");
}

/* A JSON array of n strings. */
static void status_json_strs(char **v, size_t n) {
  printf("[");
  for (size_t i = 0; i < n; i++) {
    if (i) printf(", ");
    vs__json_str(stdout, v[i]);
  }
  printf("]");
}

static void status_json_model(const Vspec__ModelInfo *m) {
  printf("{\"name\": ");
  vs__json_str(stdout, m->name);
  printf(", \"dir\": ");
  if (m->dir) vs__json_str(stdout, m->dir);
  else printf("null"); /* the job endpoint's answer */
  printf(", \"generation\": %u, \"jobs\": %d, \"retired_alive\": %d, \"loaded\": %s, "
         "\"num_classes\": %u, \"grid_h\": %u, \"grid_w\": %u, \"continuous\": %s",
         m->generation, m->jobs, m->retired_alive, m->has_grid_h ? "true" : "false",
         m->num_classes, m->grid_h, m->grid_w, m->continuous ? "true" : "false");
  printf(", \"backends\": ");
  status_json_strs(m->backends, m->n_backends);
  printf(", \"class_names\": ");
  status_json_strs(m->class_names, m->n_class_names);
  if (m->has_step_ops)
    printf(", \"step_ops\": %u, \"step_downloads\": %u, \"verify16_ops\": %u", m->step_ops,
           m->step_downloads, m->verify16_ops);
  printf("}");
}

/* The reply as one JSON object on stdout. */
static void status_json(const Vspec__StatusReply *s) {
  const Vspec__Totals *t = s->totals;
  printf("{\"node\": ");
  vs__json_str(stdout, s->node);
  printf(", \"queued\": %u, \"queue_capacity\": %u, \"running\": %u, \"clients\": %u, "
         "\"draining\": %s, ",
         s->queued, s->queue_capacity, s->running, s->clients, s->draining ? "true" : "false");
  printf("\"own_jobs_only\": %s, \"default_model\": ", s->own_jobs_only ? "true" : "false");
  vs__json_str(stdout, s->default_model);
  if (s->device) status_json_device(s->device);
  printf(", \"workers\": [");
  for (size_t i = 0; i < s->n_workers; i++)
    printf("%s{\"index\": %u, \"job\": %llu, \"tokens_done\": %u, \"tokens_total\": %u, "
           "\"jobs_done\": %llu}", i ? ", " : "", s->workers[i]->index,
           (unsigned long long)s->workers[i]->job_id, s->workers[i]->tokens_done,
           s->workers[i]->tokens_total, (unsigned long long)s->workers[i]->jobs_done);
  printf("]");
  if (s->fleet) status_json_fleet(s->fleet);
  printf(", \"models\": [");
  for (size_t i = 0; i < s->n_models; i++) {
    if (i) printf(", ");
    status_json_model(s->models[i]);
  }
  printf("], \"plugins\": [");
  for (size_t i = 0; i < s->n_plugins; i++) {
    if (i) printf(", ");
    vs__print_plugin_json(s->plugins[i]);
  }
  printf("]");
  if (t)
    printf(", \"totals\": {\"submitted\": %llu, \"completed\": %llu, \"failed\": %llu, "
           "\"cancelled\": %llu, \"rejected_busy\": %llu, \"clients_lost\": %llu, "
           "\"malformed\": %llu, \"tokens\": %llu, \"uptime_s\": %.3f}",
           (unsigned long long)t->submitted, (unsigned long long)t->completed,
           (unsigned long long)t->failed, (unsigned long long)t->cancelled,
           (unsigned long long)t->rejected_busy, (unsigned long long)t->clients_lost,
           (unsigned long long)t->malformed, (unsigned long long)t->tokens, t->uptime_s);
  printf("}\n");
}

/* ---- text ----------------------------------------------------------------------------- */

/* The first lines: the node and its queue, its device, its fleet queue. */
static void status_text_node(const Vspec__StatusReply *s) {
  const Vspec__Totals *t = s->totals;
  printf("%s%s: %u waiting (capacity %u), %u running, %u client(s), up %.0f s\n",
         s->node ? s->node : "vspecd", s->draining ? " (draining)" : "", s->queued,
         s->queue_capacity, s->running, s->clients, t ? t->uptime_s : 0.0);
  if (s->device) {
    const Vspec__DeviceInfo *d = s->device;
    printf("device: %s, %s weights", d->name ? d->name : "?", d->precision ? d->precision : "?");
    if (d->memory_total)
      printf(", %.0f MiB of %.0f MiB in use", (double)d->memory_used / (1 << 20),
             (double)d->memory_total / (1 << 20));
    printf("\n");
  }
  if (s->fleet) {
    const Vspec__FleetInfo *f = s->fleet;
    if (f->error)
      printf("fleet: %s on %s: %s\n", f->stream ? f->stream : "?", f->redis ? f->redis : "?",
             f->error);
    else
      printf("fleet: %llu job(s) in %s (max %llu), %llu of them running, on redis %s\n",
             (unsigned long long)f->length, f->stream ? f->stream : "?",
             (unsigned long long)f->max_length, (unsigned long long)f->pending,
             f->redis ? f->redis : "?");
  }
}

static void status_text_workers(const Vspec__StatusReply *s) {
  if (s->own_jobs_only)
    printf("your jobs: %s(the job endpoint shows a client its own jobs and no paths; every "
           "job and the directories need the admin endpoint, --admin)\n",
           s->n_workers ? "" : "none running ");
  else if (s->n_workers)
    printf("workers:\n");
  for (size_t i = 0; i < s->n_workers; i++) {
    const Vspec__WorkerInfo *w = s->workers[i];
    if (w->job_id)
      printf("  %u  job %llu, %u/%u tokens (%llu done before)\n", w->index,
             (unsigned long long)w->job_id, w->tokens_done, w->tokens_total,
             (unsigned long long)w->jobs_done);
    else
      printf("  %u  idle (%llu job(s) done)\n", w->index, (unsigned long long)w->jobs_done);
  }
}

static void status_text_model(const Vspec__ModelInfo *m) {
  if (!m->has_grid_h) {
    printf("  %-10s not loaded%s%s%s\n", m->name, m->dir ? "  [" : "", m->dir ? m->dir : "",
           m->dir ? "]" : "");
    return;
  }
  printf("  %-10s generation %u, %ux%u %stokens, %u classes, draft %s, eagle %s, %d job(s)"
         "%s%s%s%s\n", m->name, m->generation, m->grid_h, m->grid_w,
         m->continuous ? "continuous " : "", m->num_classes,
         m->has_draft ? "yes" : "no", m->has_eagle ? "yes" : "no", m->jobs,
         m->retired_alive ? ", older generation in use" : "", m->dir ? "  [" : "",
         m->dir ? m->dir : "", m->dir ? "]" : "");
  cs_print_classes(m);
  if (m->has_step_ops)
    printf("             a forward issues %u ops and %u download(s) per token step, %u ops "
           "per 16-node verify\n", m->step_ops, m->step_downloads, m->verify16_ops);
}

/* Totals since the start, and the work by method (daemon/stats.h): TPF, MAL and acceptance
 * over all its jobs. */
static void status_text_totals(const Vspec__StatusReply *s) {
  const Vspec__Totals *t = s->totals;
  if (t)
    printf("totals: %llu submitted, %llu completed, %llu failed, %llu cancelled, %llu busy, "
           "%llu client(s) lost, %llu malformed, %llu tokens\n",
           (unsigned long long)t->submitted, (unsigned long long)t->completed,
           (unsigned long long)t->failed, (unsigned long long)t->cancelled,
           (unsigned long long)t->rejected_busy, (unsigned long long)t->clients_lost,
           (unsigned long long)t->malformed, (unsigned long long)t->tokens);
  if (s->n_methods) printf("methods:\n");
  for (size_t i = 0; i < s->n_methods; i++) {
    const Vspec__MethodStats *m = s->methods[i];
    printf("  %-40s %llu job(s), %llu tokens, TPF %.2f, MAL %.2f, accepted %llu of %llu "
           "draft tokens\n", m->method ? m->method : "?", (unsigned long long)m->jobs,
           (unsigned long long)m->tokens,
           m->target_forwards ? (double)m->tokens / (double)m->target_forwards : 0.0,
           m->rounds ? (double)m->tokens / (double)m->rounds : 0.0,
           (unsigned long long)m->accepted, (unsigned long long)m->draft_tokens);
  }
}

/* The reply for a person. */
static void status_text(const Vspec__StatusReply *s) {
  status_text_node(s);
  status_text_workers(s);
  if (s->n_models || s->default_model)
    printf("models (default %s):\n", s->default_model ? s->default_model : "?");
  for (size_t i = 0; i < s->n_models; i++) status_text_model(s->models[i]);
  if (s->n_plugins) printf("plugins:\n");
  for (size_t i = 0; i < s->n_plugins; i++) {
    const Vspec__PluginInfo *p = s->plugins[i];
    if (p->kind && !strcmp(p->kind, "backend") && cs_knows_backends(s))
      cs_print_backend(p, s);
    else
      vs__print_plugin(p);
  }
  status_text_totals(s);
}

int vs_cmd_status(int argc, char **argv) {
  vs_net_opts net;
  static const char *const flags[] = {"json", NULL};
  int json, prc = vs__parse_flags(argc, argv, "status", flags, &json, &net, usage_status);
  if (prc >= 0) return prc;
  Vspec__Request rq = VSPEC__REQUEST__INIT;
  Vspec__StatusRequest sr = VSPEC__STATUS_REQUEST__INIT;
  rq.body_case = VSPEC__REQUEST__BODY_STATUS;
  rq.status = &sr;
  vs_conn conn;
  vs_conn_event e;
  int rc = vs__call(&net, 1, &rq, &e, &conn);
  if (rc) return rc;
  if (e.ev->body_case != VSPEC__EVENT__BODY_STATUS) {
    fprintf(stderr, "vspec: unexpected reply\n");
    vs_conn_event_free(&e);
    vs_conn_close(&conn);
    return EXIT_UNREACHABLE;
  }
  if (json) status_json(e.ev->status);
  else status_text(e.ev->status);
  vs_conn_event_free(&e);
  vs_conn_close(&conn);
  return EXIT_OK;
}
