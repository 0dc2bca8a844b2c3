/*
 * vspec-broker - one front endpoint for several vspecd daemons (daemon/broker.h).
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cli_args.h"
#include "core/log.h"
#include "core/version.h"
#include "daemon/broker.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: vspec-broker --front EP --backend EP [--backend EP ...] [options]\n"
          "\n"
          "Clients connect to the front endpoint exactly as to vspecd; each submit goes to the\n"
          "least loaded live daemon, whose events stream back through the broker. A busy daemon\n"
          "means the next one is tried; a daemon silent for 3 heartbeats is failed over (its\n"
          "jobs end with error 'unavailable').\n"
          "\n"
          "  --front EP               endpoint clients connect to (ROUTER, bound)\n"
          "  --backend EP             a vspecd job endpoint (repeat, up to 32); give each daemon\n"
          "                           its own --node-id so job ids do not collide\n"
          "  --heartbeat-ms N         status poll interval per daemon (default 1000); also\n"
          "                           TCP keepalive, and 5 of it the TCP user timeout\n"
          "  --max-message-bytes N    per-frame limit of client requests (default 4 MiB)\n"
          "  --curve-secret FILE      CURVE on the front with this key file (needed beyond\n"
          "                           localhost) ...\n"
          "  --curve-allow FILE       ... and this allow-list of client keys\n"
          "  --backend-server-key K   CURVE towards the daemons: their public key (or file)\n"
          "  --backend-key FILE       the broker's own key pair for that\n"
          "  --log-level L            error, warn, info (default), debug\n"
          "  --version                version and plugin ABI\n"
          "\n"
          "exit status: 0 stopped by SIGTERM/SIGINT, 1 runtime failure, 2 usage\n");
}

int main(int argc, char **argv) {
  static vs_broker_config cfg;
  cfg.heartbeat_ms = 1000;
  cfg.max_message_bytes = 4l << 20;  /* as vspecd's limits.max_message_bytes */
  cfg.max_request_bytes = 64l << 10;
  cfg.max_event_bytes = 64l << 20;
  int level = VSPEC_LOG_INFO;
  enum { O_FRONT = 256, O_BACKEND, O_HB, O_MAXMSG, O_CSEC, O_CALLOW, O_BSKEY, O_BKEY, O_LOG, O_VERSION };
  static const struct option opts[] = {
      {"front", required_argument, 0, O_FRONT},  {"backend", required_argument, 0, O_BACKEND},
      {"heartbeat-ms", required_argument, 0, O_HB},
      {"max-message-bytes", required_argument, 0, O_MAXMSG},
      {"curve-secret", required_argument, 0, O_CSEC},
      {"curve-allow", required_argument, 0, O_CALLOW},
      {"backend-server-key", required_argument, 0, O_BSKEY},
      {"backend-key", required_argument, 0, O_BKEY},
      {"log-level", required_argument, 0, O_LOG}, {"help", no_argument, 0, 'h'},
      {"version", no_argument, 0, O_VERSION},
      {0, 0, 0, 0}};
  int c;
  long v;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
      case O_FRONT: snprintf(cfg.front, sizeof cfg.front, "%s", optarg); break;
      case O_BACKEND:
        if (cfg.n_backends == VS_BROKER_MAX_BACKENDS) {
          fprintf(stderr, "vspec-broker: at most %d backends\n", VS_BROKER_MAX_BACKENDS);
          return 2;
        }
        snprintf(cfg.backends[cfg.n_backends++], sizeof cfg.backends[0], "%s", optarg);
        break;
      case O_HB:
        if (!vs_cli_long("--heartbeat-ms", optarg, 10, 600000, &v)) return 2;
        cfg.heartbeat_ms = (int)v;
        break;
      case O_MAXMSG:
        if (!vs_cli_long("--max-message-bytes", optarg, 1024, 1l << 30, &v)) return 2;
        cfg.max_message_bytes = v;
        break;
      case O_CSEC: cfg.curve_secret_file = optarg; break;
      case O_CALLOW: cfg.curve_allow_file = optarg; break;
      case O_BSKEY: cfg.backend_server_key = optarg; break;
      case O_BKEY: cfg.backend_client_key = optarg; break;
      case O_LOG:
        if ((level = vs_log_parse_level(optarg)) < 0) {
          fprintf(stderr, "vspec-broker: --log-level '%s' is not error, warn, info, debug\n",
                  optarg);
          return 2;
        }
        break;
      case 'h': usage(stdout); return 0;
      case O_VERSION: vs_print_version(stdout, "vspec-broker"); return 0;
      default: fprintf(stderr, "see %s --help\n", "vspec-broker"); return 2; /* getopt said which */
    }
  }
  if (optind < argc || !*cfg.front || !cfg.n_backends) {
    usage(stderr);
    return 2;
  }
  if (cfg.max_request_bytes > cfg.max_message_bytes) cfg.max_request_bytes = cfg.max_message_bytes;
  if (!!cfg.curve_secret_file != !!cfg.curve_allow_file) {
    fprintf(stderr, "vspec-broker: --curve-secret and --curve-allow go together\n");
    return 2;
  }
  vs_log_set_level(level);
  signal(SIGPIPE, SIG_IGN);
  char err[1024];
  int rc = vs_broker_run(&cfg, err, sizeof err);
  if (rc) {
    vs_log(VSPEC_LOG_ERROR, "broker", "%s", err);
    return 1;
  }
  return 0;
}
