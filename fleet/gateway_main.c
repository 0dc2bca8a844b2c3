/*
 * vspec-gateway - the ZeroMQ front of a fleet of vspecd daemons sharing a Redis queue
 * (fleet/gateway.h).
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cli_args.h"
#include "core/log.h"
#include "core/version.h"
#include "fleet/gateway.h"

static void gwm_usage(FILE *f) {
  fprintf(f,
          "usage: vspec-gateway --front EP --redis URL [options]\n"
          "\n"
          "Clients connect to the front endpoint exactly as to vspecd; each submit becomes a\n"
          "job in the fleet's Redis stream, run by whichever vspecd in fleet mode is free,\n"
          "and the job's events stream back from Redis. The gateway keeps no state of its\n"
          "own: run several, restart them at will; a client can resume a job's events\n"
          "through any of them.\n"
          "\n"
          "  --front EP               endpoint clients connect to (ROUTER, bound)\n"
          "  --redis URL              redis://[[user]:password@]host[:port][/db],\n"
          "                           unix://[[user]:password@]/path or /path (a socket)\n"
          "  --node NAME              this gateway's name in replies (default vspec-gateway)\n"
          "  --stream KEY             the fleet's jobs stream (default vspec:jobs)\n"
          "  --group NAME             the daemons' consumer group (default vspec)\n"
          "  --events-prefix P        a job's events are in P<job id> (default vspec:events:)\n"
          "  --max-len N              jobs waiting or running in the fleet; submits beyond are\n"
          "                           answered busy (default 1024)\n"
          "  --per-client N           jobs one connection may follow at once (default 16)\n"
          "  --events-ttl-s N         a job's events expire N s after its last (default 3600)\n"
          "  --heartbeat-ms N         heartbeat to clients waiting on a job (default 1000);\n"
          "                           also TCP keepalive, and 5 of it the TCP user timeout\n"
          "  --max-message-bytes N    per-frame limit of client requests (default 4 MiB)\n"
          "  --curve-secret FILE      CURVE on the front with this key file (needed beyond\n"
          "                           localhost) ...\n"
          "  --curve-allow FILE       ... and this allow-list of client keys\n"
          "  --log-level L            error, warn, info (default), debug\n"
          "  --version                version and plugin ABI\n"
          "\n"
          "exit status: 0 stopped by SIGTERM/SIGINT, 1 runtime failure, 2 usage\n");
}

int main(int argc, char **argv) {
  static vs_gateway_config cfg;
  vs_gateway_config_defaults(&cfg);
  int level = VSPEC_LOG_INFO;
  enum {
    O_FRONT = 256, O_REDIS, O_NODE, O_STREAM, O_GROUP, O_PREFIX, O_MAXLEN, O_PERCLIENT, O_TTL,
    O_HB, O_MAXMSG, O_CSEC, O_CALLOW, O_LOG, O_VERSION
  };
  static const struct option opts[] = {
      {"front", required_argument, 0, O_FRONT},   {"redis", required_argument, 0, O_REDIS},
      {"node", required_argument, 0, O_NODE},     {"stream", required_argument, 0, O_STREAM},
      {"group", required_argument, 0, O_GROUP},
      {"events-prefix", required_argument, 0, O_PREFIX},
      {"max-len", required_argument, 0, O_MAXLEN},
      {"per-client", required_argument, 0, O_PERCLIENT},
      {"events-ttl-s", required_argument, 0, O_TTL},
      {"heartbeat-ms", required_argument, 0, O_HB},
      {"max-message-bytes", required_argument, 0, O_MAXMSG},
      {"curve-secret", required_argument, 0, O_CSEC},
      {"curve-allow", required_argument, 0, O_CALLOW},
      {"log-level", required_argument, 0, O_LOG}, {"help", no_argument, 0, 'h'},
      {"version", no_argument, 0, O_VERSION},
      {0, 0, 0, 0}};
  int c;
  long v;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
      case O_FRONT:
        if (strlen(optarg) >= sizeof cfg.front) {
          fprintf(stderr, "vspec-gateway: --front: endpoint longer than %zu bytes\n",
                  sizeof cfg.front - 1);
          return 2;
        }
        snprintf(cfg.front, sizeof cfg.front, "%s", optarg);
        break;
      case O_REDIS: cfg.redis_url = optarg; break;
      case O_NODE: cfg.node = optarg; break;
      case O_STREAM: cfg.stream = optarg; break;
      case O_GROUP: cfg.group = optarg; break;
      case O_PREFIX: cfg.events_prefix = optarg; break;
      case O_MAXLEN:
        if (!vs_cli_long("--max-len", optarg, 1, 1l << 40, &v)) return 2;
        cfg.max_len = v;
        break;
      case O_PERCLIENT:
        if (!vs_cli_long("--per-client", optarg, 1, 65536, &v)) return 2;
        cfg.per_client = (int)v;
        break;
      case O_TTL:
        if (!vs_cli_long("--events-ttl-s", optarg, 1, 366l * 86400, &v)) return 2;
        cfg.events_ttl_s = v;
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
      case O_LOG:
        if ((level = vs_log_parse_level(optarg)) < 0) {
          fprintf(stderr, "vspec-gateway: --log-level '%s' is not error, warn, info, debug\n",
                  optarg);
          return 2;
        }
        break;
      case 'h': gwm_usage(stdout); return 0;
      case O_VERSION: vs_print_version(stdout, "vspec-gateway"); return 0;
      default: fprintf(stderr, "see %s --help\n", "vspec-gateway"); return 2; /* getopt said which */
    }
  }
  if (optind < argc) {
    fprintf(stderr, "vspec-gateway: unexpected argument '%s'\n", argv[optind]);
    gwm_usage(stderr);
    return 2;
  }
  if (!*cfg.front || !cfg.redis_url) {
    fprintf(stderr, "vspec-gateway: %s is required\n", !*cfg.front ? "--front" : "--redis");
    gwm_usage(stderr);
    return 2;
  }
  if (cfg.max_request_bytes > cfg.max_message_bytes) cfg.max_request_bytes = cfg.max_message_bytes;
  if (!!cfg.curve_secret_file != !!cfg.curve_allow_file) {
    fprintf(stderr, "vspec-gateway: --curve-secret and --curve-allow go together\n");
    return 2;
  }
  char err[1024];
  if (vs_gateway_check(&cfg, err, sizeof err)) {
    fprintf(stderr, "vspec-gateway: %s\n", err);
    return 2;
  }
  vs_log_set_level(level);
  signal(SIGPIPE, SIG_IGN);
  int rc = vs_gateway_run(&cfg, err, sizeof err);
  if (rc) {
    vs_log(VSPEC_LOG_ERROR, "gateway", "%s", err);
    return 1;
  }
  return 0;
}
