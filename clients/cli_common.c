/*
 * clients/cli_common.c - the helpers every command of the vspec CLI shares (clients/cli.h).
 */
#include "clients/cli.h"

static const char *cc_default_server(void) {
  const char *e = getenv("VSPEC_SERVER");
  return e && *e ? e : "tcp://127.0.0.1:5555";
}

/* The systemd unit (etc/vspecd.service) puts the admin socket in vspecd's runtime
 * directory; a daemon started by hand uses /tmp's. The CLI takes the unit's when it exists,
 * so that `vspec plugins` works against either without options. */
#define VS_UNIT_ADMIN_SOCK "/run/vspecd/admin.sock"

static const char *cc_default_admin(void) {
  const char *e = getenv("VSPEC_ADMIN");
  if (e && *e) return e;
  return access(VS_UNIT_ADMIN_SOCK, F_OK) == 0 ? "ipc://" VS_UNIT_ADMIN_SOCK
                                                : "ipc:///tmp/vspecd-admin.sock";
}

volatile sig_atomic_t vs__interrupted;
void vs__on_sigint(int sig) {
  (void)sig;
  vs__interrupted = 1;
}

int vs__exit_for(int code) {
  switch (code) {
    case VSPEC__ERROR_CODE__ERR_BUSY:
    case VSPEC__ERROR_CODE__ERR_SHUTTING_DOWN:
    case VSPEC__ERROR_CODE__ERR_UNAVAILABLE: return EXIT_BUSY;
    case VSPEC__ERROR_CODE__ERR_CANCELLED:
    case VSPEC__ERROR_CODE__ERR_DEADLINE: return EXIT_CANCELLED;
    case VSPEC__ERROR_CODE__ERR_INTERNAL: return EXIT_FAIL;
    default: return EXIT_REJECTED;
  }
}

void vs__net_defaults(vs_net_opts *n) {
  n->server = cc_default_server();
  n->admin = cc_default_admin();
  n->server_given = n->admin_given = 0;
  n->server_key = getenv("VSPEC_CURVE_SERVER_KEY");
  n->client_key = getenv("VSPEC_CURVE_KEY");
  if (n->server_key && !*n->server_key) n->server_key = NULL;
  if (n->client_key && !*n->client_key) n->client_key = NULL;
  n->timeout_s = 30;
}

/* The forms the CLI connects to, for every message about an endpoint. */
#define VS_EP_FORMS                                                                       \
  "write tcp://HOST:PORT (e.g. tcp://127.0.0.1:5555, vspecd's job endpoint) or ipc://PATH " \
  "(e.g. ipc:///tmp/vspecd-admin.sock, its admin endpoint)"

/* tcp://HOST:PORT with a port of 1 to 65535 (HOST may be [v6]). */
static int cc_tcp_ok(const char *hp) {
  const char *colon = strrchr(hp, ':');
  if (!colon || colon == hp || !colon[1] || strlen(colon + 1) > 5) return 0;
  for (const char *d = colon + 1; *d; d++)
    if (*d < '0' || *d > '9') return 0;
  long port = atol(colon + 1);
  return port >= 1 && port <= 65535;
}

/* Endpoint syntax, checked where a value enters (options, environment) so that a typo is a
 * usage error that shows the right forms: 0, or -1 with err naming `what` and the fix. */
static int cc_endpoint_check(const char *what, const char *ep, char *err, size_t errlen) {
  const char *sep = strstr(ep, "://");
  if (!strncmp(ep, "tcp://", 6) && cc_tcp_ok(ep + 6)) return 0;
  if (!strncmp(ep, "ipc://", 6) && ep[6]) return 0;
  if (!strncmp(ep, "http://", 7) || !strncmp(ep, "https://", 8))
    snprintf(err, errlen, "%s '%s' is an HTTP URL, but vspec speaks ZeroMQ to vspecd (its "
             "HTTP endpoint is for curl and other HTTP clients): " VS_EP_FORMS, what, ep);
  else if (!sep && strchr(ep, ':'))
    snprintf(err, errlen, "%s '%s' has no transport: did you mean tcp://%s? " VS_EP_FORMS,
             what, ep, ep);
  else if (!sep)
    snprintf(err, errlen, "%s '%s' is not an endpoint: " VS_EP_FORMS, what, ep);
  else if (!strncmp(ep, "tcp://", 6))
    snprintf(err, errlen, "%s '%s' needs HOST:PORT with a port of 1 to 65535: " VS_EP_FORMS,
             what, ep);
  else
    snprintf(err, errlen, "%s '%s': vspec connects over tcp or ipc only: " VS_EP_FORMS, what,
             ep);
  return -1;
}

/* 1 if c was a network option (consumed), 0 if not, -1 on a bad value (said on stderr). */
int vs__net_opt(vs_net_opts *n, int c, const char *arg) {
  char err[1024];
  switch (c) {
    case O_SERVER:
    case O_ADMIN:
      if (cc_endpoint_check(c == O_SERVER ? "--server" : "--admin", arg, err, sizeof err)) {
        fprintf(stderr, "vspec: %s\n", err);
        return -1;
      }
      if (c == O_SERVER) {
        n->server = arg;
        n->server_given = 1;
      } else {
        n->admin = arg;
        n->admin_given = 1;
      }
      return 1;
    case O_SKEY: n->server_key = arg; return 1;
    case O_CKEY: n->client_key = arg; return 1;
    case O_TIMEOUT: return vs_cli_double("--timeout", arg, 0.1, 86400, &n->timeout_s) ? 1 : -1;
    default: return 0;
  }
}

int vs__net_env_check(const vs_net_opts *n, char *err, size_t errlen) {
  if (!n->server_given && getenv("VSPEC_SERVER") && *getenv("VSPEC_SERVER") &&
      cc_endpoint_check("$VSPEC_SERVER", n->server, err, errlen))
    return -1;
  if (!n->admin_given && getenv("VSPEC_ADMIN") && *getenv("VSPEC_ADMIN") &&
      cc_endpoint_check("$VSPEC_ADMIN", n->admin, err, errlen))
    return -1;
  return 0;
}

int vs__connect_msg(vs_conn *c, const vs_net_opts *n, const char *endpoint, int curve,
                    char *err, size_t errlen) {
  char why[1024];
  /* ZeroMQ would retry quietly until our timeout: say now that nobody is there. */
  int probe = vs_endpoint_probe(endpoint, 2000, why, sizeof why);
  if (probe == 0) {
    snprintf(err, errlen, "cannot reach %s: %s; is vspecd (or vspec-gateway) running there?",
             endpoint, why);
    return -1;
  }
  if (probe == VS_PROBE_DENIED) {
    snprintf(err, errlen, "cannot reach %s: %s", endpoint, why);
    return -1;
  }
  vs_conn_opts o = {.server_key = curve ? n->server_key : NULL, .client_key = n->client_key,
                    .watch_handshake = 1};
  if (vs_conn_open(c, endpoint, &o, err, errlen)) return -1;
  /* A refused key or a plaintext/CURVE mismatch would otherwise also look like silence. */
  int window = n->timeout_s < VS_HANDSHAKE_WINDOW_S ? (int)(n->timeout_s * 1000)
                                                     : VS_HANDSHAKE_WINDOW_S * 1000;
  if (vs_conn_wait_ready(c, window, err, errlen) < 0) {
    vs_conn_close(c);
    return -1;
  }
  return 0;
}

/* vs__connect_msg with the reason on stderr. */
static int cc_connect(vs_conn *c, const vs_net_opts *n, const char *endpoint, int curve) {
  char err[1024];
  if (vs__connect_msg(c, n, endpoint, curve, err, sizeof err)) {
    fprintf(stderr, "vspec: %s\n", err);
    return -1;
  }
  return 0;
}

/* Status, plugins, cancel and reload go to the admin endpoint unless only --server was given
 * (e.g. a daemon on another machine, whose admin endpoint is local to it). */
static int cc_connect_admin(vs_conn *c, const vs_net_opts *n) {
  if (n->server_given && !n->admin_given) return cc_connect(c, n, n->server, 1);
  return cc_connect(c, n, n->admin, 0);
}

int vs__write_file_msg(const char *path, const void *data, size_t len, char *err,
                      size_t errlen) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
    return -1;
  }
  int ok = fwrite(data, 1, len, f) == len;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path)) {
    snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
    unlink(tmp);
    return -1;
  }
  return 0;
}

int vs__write_file(const char *path, const void *data, size_t len) {
  char err[4400];
  if (vs__write_file_msg(path, data, len, err, sizeof err)) {
    fprintf(stderr, "vspec: %s\n", err);
    return -1;
  }
  return 0;
}

int vs__call(const vs_net_opts *net, int admin, Vspec__Request *rq, vs_conn_event *e,
             vs_conn *conn) {
  char err[1024];
  if (admin ? cc_connect_admin(conn, net) : cc_connect(conn, net, net->server, 1))
    return EXIT_UNREACHABLE;
  int rc = vs_conn_call(conn, rq, (int)(net->timeout_s * 1000), e, err, sizeof err);
  if (rc <= 0) {
    if (rc == 0)
      fprintf(stderr, "vspec: no answer from %s within %.1f s: is vspecd running there?\n",
              conn->endpoint, net->timeout_s);
    else
      fprintf(stderr, "vspec: %s\n", err);
    vs_conn_close(conn);
    return EXIT_UNREACHABLE;
  }
  if (e->ev->body_case == VSPEC__EVENT__BODY_ERROR) {
    fprintf(stderr, "vspec: %s: %s\n", vs_wire_error_name(e->ev->error->code),
            e->ev->error->message);
    int code = vs__exit_for(e->ev->error->code);
    vs_conn_event_free(e);
    vs_conn_close(conn);
    return code;
  }
  return EXIT_OK;
}

void vs__print_plugin(const Vspec__PluginInfo *p) {
  /* Jobs hold rules and schedulers; backends are held by the loaded models, once per role
   * (target, draft, eagle), whatever the jobs: `vspec status` names the models. */
  int backend = p->kind && !strcmp(p->kind, "backend");
  printf("  %-8s %-14s %-10s generation %u, %s%d %s%s", p->kind ? p->kind : "?",
         p->name ? p->name : "?", p->version ? p->version : "?", p->generation,
         backend ? "held by " : "", p->users, backend ? "model role(s)" : "job(s)",
         p->retired_alive ? "," : "\n");
  if (p->retired_alive) printf(" %d older generation(s) still in use\n", p->retired_alive);
}

void vs__print_plugin_json(const Vspec__PluginInfo *p) {
  printf("{\"kind\": ");
  vs__json_str(stdout, p->kind);
  printf(", \"name\": ");
  vs__json_str(stdout, p->name);
  printf(", \"version\": ");
  vs__json_str(stdout, p->version);
  printf(", \"generation\": %u, \"users\": %d, \"retired_alive\": %d}", p->generation, p->users,
         p->retired_alive);
}

int vs__parse_flags(int argc, char **argv, const char *cmd, const char *const *flags, int *set,
                    vs_net_opts *net, void (*usage)(FILE *)) {
  enum { O_HELP = 1, O_FLAG0 = 2 };
  struct option opts[VS_MAX_FLAGS + 8] = {{"help", no_argument, 0, O_HELP}};
  static const struct option net_opts[] = {VS_NET_LONGOPTS};
  int n = 1, nflags = 0;
  for (int i = 0; flags && flags[i] && i < VS_MAX_FLAGS; i++, n++, nflags++) {
    opts[n] = (struct option){flags[i], no_argument, 0, O_FLAG0 + i};
    set[i] = 0;
  }
  for (size_t i = 0; i < sizeof net_opts / sizeof net_opts[0]; i++) opts[n++] = net_opts[i];
  vs__net_defaults(net);
  optind = 1;
  for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
    int r = vs__net_opt(net, c, optarg);
    if (r < 0) return EXIT_USAGE;
    if (r > 0) continue;
    if (c >= O_FLAG0 && c < O_FLAG0 + nflags) {
      set[c - O_FLAG0] = 1;
    } else if (c == O_HELP || c == 'h') {
      usage(stdout);
      return EXIT_OK;
    } else { /* getopt said which option */
      fprintf(stderr, "see vspec %s --help\n", cmd);
      return EXIT_USAGE;
    }
  }
  char err[1024];
  if (vs__net_env_check(net, err, sizeof err)) {
    fprintf(stderr, "vspec: %s\n", err);
    return EXIT_USAGE;
  }
  return -1;
}
