/*
 * clients/cmd_plugins.c - vspec plugins: list | reload NAME.
 */
#include "clients/cli.h"

static void usage_plugins(FILE *f) {
  fprintf(f,
          "usage: vspec plugins list [options]\n"
          "       vspec plugins reload NAME [options]\n"
          "\n"
          "list:   the loaded plugins, their versions and generations\n"
          "reload: load a new generation of NAME (NAME, KIND/NAME or KIND_NAME; KIND = backend,\n"
          "        accept or sched) from the daemon's plugin directory while jobs run: running\n"
          "        jobs finish on the old generation, new jobs get the new one\n"
          "\n"
          "  --json               JSON on stdout\n" VS_NET_OPTIONS_HELP
          "\nExit status: 0, 2 usage, 3 daemon unreachable, 4 refused (unknown plugin, failed\n"
          "load: the old generation stays).\n");
}

int vs_cmd_plugins(int argc, char **argv) {
  vs_net_opts net;
  static const char *const flags[] = {"json", NULL};
  int json, prc = vs__parse_flags(argc, argv, "plugins", flags, &json, &net, usage_plugins);
  if (prc >= 0) return prc;
  const char *what = optind < argc ? argv[optind] : "list";
  Vspec__Request rq = VSPEC__REQUEST__INIT;
  Vspec__PluginsRequest pr = VSPEC__PLUGINS_REQUEST__INIT;
  Vspec__ReloadRequest rr = VSPEC__RELOAD_REQUEST__INIT;
  if (!strcmp(what, "list")) {
    if (optind + 1 < argc) {
      fprintf(stderr, "vspec plugins list: unexpected argument '%s'\n", argv[optind + 1]);
      return EXIT_USAGE;
    }
    rq.body_case = VSPEC__REQUEST__BODY_PLUGINS;
    rq.plugins = &pr;
  } else if (!strcmp(what, "reload")) {
    if (optind + 2 != argc) {
      fprintf(stderr, "vspec plugins reload: give exactly one plugin NAME\n");
      return EXIT_USAGE;
    }
    rr.name = argv[optind + 1];
    rq.body_case = VSPEC__REQUEST__BODY_RELOAD;
    rq.reload = &rr;
  } else {
    fprintf(stderr, "vspec plugins: '%s' is not list or reload\n", what);
    return EXIT_USAGE;
  }
  vs_conn conn;
  vs_conn_event e;
  /* Reloading a backend reopens models: allow it a while. */
  if (rq.body_case == VSPEC__REQUEST__BODY_RELOAD && net.timeout_s < 120) net.timeout_s = 120;
  int rc = vs__call(&net, 1, &rq, &e, &conn);
  if (rc) return rc;
  if (e.ev->body_case == VSPEC__EVENT__BODY_PLUGINS) {
    const Vspec__PluginsReply *p = e.ev->plugins;
    if (json) {
      printf("{\"plugin_dir\": ");
      vs__json_str(stdout, p->plugin_dir);
      printf(", \"plugins\": [");
      for (size_t i = 0; i < p->n_plugins; i++) {
        if (i) printf(", ");
        vs__print_plugin_json(p->plugins[i]);
      }
      printf("]}\n");
    } else {
      if (p->plugin_dir) printf("plugins in %s:\n", p->plugin_dir);
      else printf("plugins (the directory is shown on the admin endpoint only):\n");
      for (size_t i = 0; i < p->n_plugins; i++) vs__print_plugin(p->plugins[i]);
    }
  } else if (e.ev->body_case == VSPEC__EVENT__BODY_RELOAD) {
    const Vspec__ReloadReply *r = e.ev->reload;
    if (json) {
      printf("{\"plugin\": ");
      if (r->plugin) vs__print_plugin_json(r->plugin);
      else printf("null");
      printf(", \"models_reloaded\": [");
      for (size_t i = 0; i < r->n_models_reloaded; i++) {
        if (i) printf(", ");
        vs__json_str(stdout, r->models_reloaded[i]);
      }
      printf("]}\n");
    } else {
      if (r->plugin)
        printf("reloaded %s/%s: version %s, generation %u\n", r->plugin->kind, r->plugin->name,
               r->plugin->version, r->plugin->generation);
      for (size_t i = 0; i < r->n_models_reloaded; i++)
        printf("model %s reopened with it\n", r->models_reloaded[i]);
    }
  }
  vs_conn_event_free(&e);
  vs_conn_close(&conn);
  return EXIT_OK;
}
