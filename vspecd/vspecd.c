/*
 * vspecd/vspecd.c - vspecd, the vspec job daemon: its options, --check, and the service
 * (daemon/server.h) started with the fronts that the configuration turns on, the fleet agent
 * (fleet/) and the HTTP endpoint (http/). The program stands above all three, so that the
 * service includes neither front (DESIGN.md, "Layout").
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "daemon/allow_list.h"
#include "daemon/config.h"
#include "daemon/server.h"
#include "core/manifest.h"
#include "core/models.h"
#include "core/version.h"
#include "daemon/sd_notify.h"
#include "fleet/fleet_agent.h"
#include "fleet/fleet_config.h"
#include "http/http_addr.h"
#include "http/http_server.h"
#include "proto/curve_keys.h"

static void vd_usage(FILE *f) {
  fprintf(f,
          "usage: vspecd [options]\n"
          "\n"
          "Serves image-generation jobs over ZeroMQ (proto/vspec.proto). Configuration comes\n"
          "from the built-in defaults, then the file given with -c, then the options below.\n"
          "SIGTERM or SIGINT drains: no new jobs, waiting jobs refused, running jobs finished\n"
          "(or cancelled, per [shutdown] drain), then a clean exit; a second signal cancels.\n"
          "\n"
          "  -c, --config FILE        INI configuration (see etc/vspecd.conf)\n"
          "      --set S.K=V          set key K of section S, e.g. --set queue.size=8\n"
          "      --endpoint EP        job endpoint (server.endpoint, default tcp://127.0.0.1:5555)\n"
          "      --admin EP           admin endpoint (server.admin_endpoint,\n"
          "                           default ipc:///tmp/vspecd-admin.sock)\n"
          "      --workers N          worker threads (workers.count, default 1)\n"
          "      --threads N          compute threads per worker (workers.threads, 0 = auto)\n"
          "      --batch N            cross-job batching: forwards of up to N jobs in flight as\n"
          "                           one (workers.batch, default 1 = off; needs --workers >= N)\n"
          "      --plugins DIR        plugin directory (plugins.dir; default: plugins/ next to\n"
          "                           vspecd, else ../lib/vspec/plugins from it)\n"
          "      --model NAME=DIR     serve the model directory DIR as NAME ([models])\n"
          "      --default-model NAME the model of jobs that name none (models.default)\n"
          "      --node NAME          this daemon's name in events and logs (server.node)\n"
          "      --node-id N          job-id prefix, distinct per daemon sharing clients\n"
          "      --log-level L        error, warn, info (default) or debug\n"
          "      --check              check the configuration and exit: every model's\n"
          "                           manifest and, with [curve], the server's key and the\n"
          "                           client allow-list, read as the daemon reads them\n"
          "  -h, --help               this text\n"
          "      --version            version and plugin ABI\n"
          "\n"
          "exit status:\n"
          "  0  clean shutdown\n"
          "  1  runtime failure (a port or socket path in use, I/O, memory)\n"
          "  2  usage, or a configuration refused: a bad value in the file or the options,\n"
          "     a plugin directory missing or writable by others, no configured model that\n"
          "     loads, CURVE key or allow-list unreadable or malformed, a device or an\n"
          "     address this host does not have (at parsing, --check or start alike)\n");
}

/* A model directory as `--check` sees it: there, with a manifest that parses, or with the
 * bare gpt.safetensors a manifest-less directory needs. */
static int vd_check_model(const vs_model_conf *m, char *err, size_t errlen) {
  struct stat st;
  if (stat(m->dir, &st) || !S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "directory '%s' does not exist", m->dir);
    return VSPEC_ENOENT;
  }
  vs_sampling base = {.temperature = 1.0f, .top_p = 1.0f, .cfg_scale = 4.0f, .cfg_interval = -1};
  vs_manifest mf;
  int rc = vs_manifest_read(m->dir, &base, VS_ROLE_ALL, &mf, err, errlen);
  vs_manifest_free(&mf);
  if (rc != VSPEC_ENOENT) return rc;
  char gpt[VS_CONF_PATH + 32];
  snprintf(gpt, sizeof gpt, "%s/gpt.safetensors", m->dir);
  if (stat(gpt, &st)) {
    snprintf(err, errlen, "'%s' has neither vspec-model.json nor gpt.safetensors", m->dir);
    return VSPEC_ENOENT;
  }
  return VSPEC_OK;
}

/* [curve] as `--check` sees it: the server's secret key and the allow-list read by the
 * parsers the daemon uses (proto/curve_keys.h, daemon/allow_list.h), so that a file the
 * daemon would refuse fails the check, with its line. *n_keys gets the allowed keys. */
static int vd_check_curve(const vs_daemon_config *c, int *n_keys, char *err, size_t errlen) {
  char secret[41], inner[1024];
  if (vs_curve_read_key(c->curve_secret_file, "secret", secret, inner, sizeof inner)) {
    snprintf(err, errlen, "[curve] secret_key_file: %s", inner);
    return VSPEC_EFORMAT;
  }
  vs_allow_entry *list = NULL;
  int rc = vs_allow_list_read(c->curve_allow_file, &list, n_keys, inner, sizeof inner);
  free(list);
  if (rc) snprintf(err, errlen, "[curve] allowed_clients: %s", inner);
  return rc;
}

enum { O_SET = 256, O_EP, O_ADMIN, O_WORKERS, O_THREADS, O_PLUGINS, O_MODEL, O_DEFMODEL,
       O_NODE, O_NODEID, O_LOG, O_CHECK, O_VERSION, O_BATCH };
static const struct option vd_opts[] = {
    {"config", required_argument, 0, 'c'},    {"set", required_argument, 0, O_SET},
    {"endpoint", required_argument, 0, O_EP}, {"admin", required_argument, 0, O_ADMIN},
    {"workers", required_argument, 0, O_WORKERS}, {"threads", required_argument, 0, O_THREADS},
    {"batch", required_argument, 0, O_BATCH},
    {"plugins", required_argument, 0, O_PLUGINS}, {"model", required_argument, 0, O_MODEL},
    {"default-model", required_argument, 0, O_DEFMODEL},
    {"node", required_argument, 0, O_NODE},   {"node-id", required_argument, 0, O_NODEID},
    {"log-level", required_argument, 0, O_LOG}, {"check", no_argument, 0, O_CHECK},
    {"help", no_argument, 0, 'h'},            {"version", no_argument, 0, O_VERSION},
    {0, 0, 0, 0}};

/* The first pass over the options: --config, --check, --help, --version and the operands.
 * -1 to go on, else the exit code. */
static int vd_first_pass(int argc, char **argv, const char **config, int *check) {
  int c;
  while ((c = getopt_long(argc, argv, "c:h", vd_opts, NULL)) != -1) {
    if (c == 'c') *config = optarg;
    else if (c == 'h') {
      vd_usage(stdout);
      return 0;
    } else if (c == O_CHECK) *check = 1;
    else if (c == O_VERSION) {
      vs_print_version(stdout, "vspecd");
      return 0;
    } else if (c == '?') { /* getopt said which option */
      fprintf(stderr, "see vspecd --help\n");
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "vspecd: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  return -1;
}

/* --model NAME=DIR into the [models] section. */
static int vd_model_arg(vs_daemon_config *cfg, const char *arg, char *err, size_t errlen) {
  char name[128];
  const char *eq = strchr(arg, '=');
  if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof name) {
    snprintf(err, errlen, "--model '%s': expected NAME=DIR", arg);
    return -1;
  }
  memcpy(name, arg, (size_t)(eq - arg));
  name[eq - arg] = 0;
  return vs_config_set(cfg, "models", name, eq + 1, err, errlen);
}

/* The second pass: every override, in command-line order, over the file's values. */
static int vd_overrides(int argc, char **argv, vs_daemon_config *cfg, char *err, size_t errlen) {
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "c:h", vd_opts, NULL)) != -1) {
    int rc = 0;
    const char *s = NULL, *k = NULL;
    switch (c) {
      case O_SET: rc = vs_config_set_arg(cfg, optarg, err, errlen); break;
      case O_EP: s = "server", k = "endpoint"; break;
      case O_ADMIN: s = "server", k = "admin_endpoint"; break;
      case O_WORKERS: s = "workers", k = "count"; break;
      case O_THREADS: s = "workers", k = "threads"; break;
      case O_BATCH: s = "workers", k = "batch"; break;
      case O_PLUGINS: s = "plugins", k = "dir"; break;
      case O_DEFMODEL: s = "models", k = "default"; break;
      case O_NODE: s = "server", k = "node"; break;
      case O_NODEID: s = "server", k = "node_id"; break;
      case O_LOG: s = "server", k = "log_level"; break;
      case O_MODEL: rc = vd_model_arg(cfg, optarg, err, errlen); break;
      default: break;
    }
    if (!rc && s) rc = vs_config_set(cfg, s, k, optarg, err, errlen);
    if (rc) return rc;
  }
  return 0;
}

/* --check: the models too, without loading them: each directory's manifest is read and
 * checked (the daemon itself starts when one model loads, and reports the others). */
static int vd_check(const vs_daemon_config *cfg) {
  char err[1024];
  int bad = 0;
  for (int i = 0; i < cfg->n_models; i++)
    if (vd_check_model(&cfg->models[i], err, sizeof err)) {
      fprintf(stderr, "vspecd: model '%s': %s\n", cfg->models[i].name, err);
      bad++;
    }
  int n_keys = 0;
  if (cfg->curve && vd_check_curve(cfg, &n_keys, err, sizeof err)) {
    fprintf(stderr, "vspecd: %s\n", err);
    bad++;
  }
  if (bad) return 2;
  char curve[64] = "";
  if (cfg->curve) snprintf(curve, sizeof curve, ", CURVE with %d allowed client key(s)", n_keys);
  printf("vspecd: configuration OK (%d model(s), %d worker(s), jobs on %s, admin on %s%s%s)\n",
         cfg->n_models, cfg->workers, cfg->endpoint, cfg->admin_endpoint, curve,
         cfg->fleet_redis[0] ? ", fleet mode" : "");
  return 0;
}

/* Opens the service and runs it until it stops. */
static int vd_serve(const vs_daemon_config *cfg) {
  char err[1024];
  vs_log_set_level(cfg->log_level);
  /* libzmq sends with MSG_NOSIGNAL, but a plugin writing to a closed pipe must not kill us. */
  signal(SIGPIPE, SIG_IGN);
  vs_server *srv;
  vs_sd_notifyf("starting: %d model(s) to load", cfg->n_models);
  /* The fleet agent first: at close it writes the events this daemon already sent before the
   * HTTP requests end. */
  vs_server_front fronts[2];
  int n_fronts = 0;
  if (cfg->fleet_redis[0]) fronts[n_fronts++] = vs_fleet_front;
  if (cfg->http_listen[0]) fronts[n_fronts++] = vs_http_front;
  int refused = 0;
  if (vs_server_open(cfg, fronts, n_fronts, &srv, &refused, err, sizeof err)) {
    vs_log(VSPEC_LOG_ERROR, "vspecd", "%s", err);
    vs_sd_notifyf("failed: %s", err);
    /* Exit 2 for a configuration refused at start, as for one refused while parsing: a
     * service manager should not restart into the same refusal (RestartPreventExitStatus). */
    return refused ? 2 : 1;
  }
  vs_log(VSPEC_LOG_INFO, "vspecd", "ready (pid %ld)", (long)getpid());
  /* Type=notify: systemd counts the start done here, when requests are answered. */
  vs_sd_notify("READY=1\nSTATUS=serving");
  int rc = vs_server_run(srv);
  vs_server_close(srv);
  vs_log(VSPEC_LOG_INFO, "vspecd", "exit %d", rc);
  return rc;
}

int main(int argc, char **argv) {
  vs_daemon_config cfg;
  vs_config_defaults(&cfg);
  /* Two passes: the file first, then every override in command-line order. */
  const char *config = NULL;
  int check = 0;
  int rc = vd_first_pass(argc, argv, &config, &check);
  if (rc >= 0) return rc;
  char err[1024];
  if ((config && vs_config_load(&cfg, config, err, sizeof err)) ||
      vd_overrides(argc, argv, &cfg, err, sizeof err) || vs_config_check(&cfg, err, sizeof err) ||
      vs_fleet_config_check(&cfg, err, sizeof err) || vs_http_config_check(&cfg, err, sizeof err)) {
    fprintf(stderr, "vspecd: %s\n", err);
    return 2;
  }
  return check ? vd_check(&cfg) : vd_serve(&cfg);
}
