/*
 * vspec - the command-line client of vspecd: one table of commands, each in its own file
 * (clients/cmd_*.c) on the helpers of clients/cli.h.
 *
 * Exit codes (for scripts): see clients/cli.h and vs__exit_for().
 */
#include "clients/cli.h"

static int vspe_cmd_version(int argc, char **argv) {
  vs_print_version(stdout, "vspec");
  return EXIT_OK;
}

typedef struct vs__command {
  const char *name;
  const char *synopsis; /* as the vspe_usage lists it */
  const char *summary;
  int (*run)(int argc, char **argv); /* argv[0] is the command's name */
} vs__command;

static const vs__command vs__commands[] = {
    {"generate", "generate", "submit an image job and stream its progress", vs_cmd_generate},
    {"status", "status", "queue, workers, models, plugins, totals", vs_cmd_status},
    {"plugins", "plugins list", "loaded plugins with generations", vs_cmd_plugins},
    {NULL, "plugins reload", "hot-swap a plugin", NULL}, /* the same command, for the vspe_usage */
    {"cancel", "cancel JOB|--last", "cancel a job (--last: the last one you submitted)",
     vs_cmd_cancel},
    {"ping", "ping", "round trip to the daemon", vs_cmd_ping},
    {"keygen", "keygen PREFIX", "make a CURVE key pair", vs_cmd_keygen},
    {"version", "version", "the version and plugin ABI (also --version)", vspe_cmd_version},
    {"completion", "completion bash|zsh", "a shell completion script", vs_cmd_completion},
};
#define VS_N_COMMANDS (sizeof vs__commands / sizeof vs__commands[0])

static void vspe_usage(FILE *f) {
  fprintf(f, "vspe_usage: vspec COMMAND [options]     (vspec COMMAND --help for each)\n\n");
  for (size_t i = 0; i < VS_N_COMMANDS; i++)
    fprintf(f, "  %-20s %s\n", vs__commands[i].synopsis, vs__commands[i].summary);
  fprintf(f,
          "\n"
          "Examples:\n"
          "  vspec generate --class 7 --accept lantern --param delta=0.2 --seed 1 --out img.png\n"
          "  vspec generate --model micro_mar --accept continuous \\\n"
          "      --sched-param shape=chain,depth=2 --num-iter 8 --out img.png   (a MAR model)\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    vspe_usage(stderr);
    return EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "--version")) return vspe_cmd_version(argc - 1, argv + 1);
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    vspe_usage(stdout);
    return EXIT_OK;
  }
  for (size_t i = 0; i < VS_N_COMMANDS; i++)
    if (vs__commands[i].name && !strcmp(cmd, vs__commands[i].name))
      return vs__commands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "vspec: unknown command '%s' (", cmd);
  for (size_t i = 0, n = 0; i < VS_N_COMMANDS; i++)
    if (vs__commands[i].name) fprintf(stderr, "%s%s", n++ ? ", " : "", vs__commands[i].name);
  fprintf(stderr, "); see vspec --help\n");
  return EXIT_USAGE;
}
