/*
 * clients/cli.h - what the commands of the vspec CLI share (clients/cli_common.c): exit
 * codes, the connection options every command takes, connecting, printing helpers.
 */
#ifndef VS_CLI_H
#define VS_CLI_H

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/metrics.h" /* vs_now */
#include "core/png_read.h"
#include "core/png_write.h"
#include "client/conn.h"
#include "clients/json_out.h"
#include "clients/progress_line.h"
#include "core/cli_args.h"
#include "proto/curve_keys.h"
#include "proto/endpoint_probe.h"
#include "core/version.h"


enum {
  EXIT_OK = 0,
  EXIT_FAIL = 1,        /* the job failed in the daemon, or the output could not be written */
  EXIT_USAGE = 2,       /* bad command line */
  EXIT_UNREACHABLE = 3, /* no answer from the daemon, or a protocol error */
  EXIT_REJECTED = 4,    /* the daemon refused the request as invalid */
  EXIT_BUSY = 5,        /* busy or shutting down: retry later */
  EXIT_CANCELLED = 6,   /* cancelled or past its deadline */
  EXIT_INTERRUPTED = 130
};

/* Common connection options of every command. */
typedef struct vs_net_opts {
  const char *server, *admin;
  int server_given, admin_given;
  const char *server_key, *client_key;
  double timeout_s;
} vs_net_opts;

#define VS_NET_OPTIONS_HELP                                                                     \
  "  --server EP          job endpoint (default $VSPEC_SERVER or tcp://127.0.0.1:5555)\n"     \
  "  --admin EP           admin endpoint (default $VSPEC_ADMIN, else\n"                        \
  "                       ipc:///run/vspecd/admin.sock when it exists (the systemd unit's),\n" \
  "                       else ipc:///tmp/vspecd-admin.sock)\n"                                \
  "  --curve-server-key K the server's CURVE public key, or a file holding it\n"              \
  "                       (default $VSPEC_CURVE_SERVER_KEY)\n"                                 \
  "  --curve-key FILE     this client's key pair from `vspec keygen` ($VSPEC_CURVE_KEY)\n"    \
  "  --timeout S          give up after S seconds without a word from the daemon (default 30)\n"

enum { O_SERVER = 1000, O_ADMIN, O_SKEY, O_CKEY, O_TIMEOUT };

#define VS_NET_LONGOPTS                                                                 \
  {"server", required_argument, 0, O_SERVER}, {"admin", required_argument, 0, O_ADMIN}, \
      {"curve-server-key", required_argument, 0, O_SKEY},                               \
      {"curve-key", required_argument, 0, O_CKEY}, {"timeout", required_argument, 0, O_TIMEOUT}

/* How long the CLI watches a connection's handshake for a reason it fails (at most
 * --timeout): every verdict but "connected to something that does not speak ZeroMQ" comes
 * within a few hundred milliseconds. */
#define VS_HANDSHAKE_WINDOW_S 5

/* Set by SIGINT (Ctrl-C): generate cancels its job, the others give up. */
extern volatile sig_atomic_t vs__interrupted;

int cmd_cancel(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_ping(int argc, char **argv);
int cmd_plugins(int argc, char **argv);
int cmd_status(int argc, char **argv);
int vs__call(const vs_net_opts *net, int admin, Vspec__Request *rq, vs_conn_event *e,
             vs_conn *conn);
/* Connects c to endpoint (curve: with the server's key, as the options and environment
 * set them); 0, or nonzero with the reason in err. */
int vs__connect_msg(vs_conn *c, const vs_net_opts *n, const char *endpoint, int curve,
                    char *err, size_t errlen);
/* The endpoints taken from $VSPEC_SERVER / $VSPEC_ADMIN (not overridden by an option). */
int vs__net_env_check(const vs_net_opts *n, char *err, size_t errlen);
int vs__exit_for(int code);
void vs__net_defaults(vs_net_opts *n);
int vs__net_opt(vs_net_opts *n, int c, const char *arg);
/* Options of a command that takes the network options and on/off flags only (status,
 * plugins, cancel, ping): fills *net (defaults first) and set[i] for flags[i] (a NULL-ended
 * list, at most VS_MAX_FLAGS). Returns -1 to go on (positional arguments from optind), else
 * the exit code: EXIT_OK after printing usage for --help, EXIT_USAGE on a bad option. */
#define VS_MAX_FLAGS 4
int vs__parse_flags(int argc, char **argv, const char *cmd, const char *const *flags, int *set,
                    vs_net_opts *net, void (*usage)(FILE *));
void vs__on_sigint(int sig);
void vs__print_plugin(const Vspec__PluginInfo *p);
void vs__print_plugin_json(const Vspec__PluginInfo *p);
int vs__write_file(const char *path, const void *data, size_t len);
/* As vs__write_file (a temporary file renamed into place), with the reason in err. */
int vs__write_file_msg(const char *path, const void *data, size_t len, char *err,
                       size_t errlen);

/* The commands (clients/cmd_*.c): each parses its own options and returns an exit code. */
int vs_cmd_generate(int argc, char **argv);
int vs_cmd_status(int argc, char **argv);
int vs_cmd_plugins(int argc, char **argv);
int vs_cmd_cancel(int argc, char **argv);
int vs_cmd_ping(int argc, char **argv);
int vs_cmd_keygen(int argc, char **argv);
int vs_cmd_completion(int argc, char **argv);

#endif /* VS_CLI_H */
