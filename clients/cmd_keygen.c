/*
 * clients/cmd_keygen.c - vspec keygen: a CURVE key pair for an allow-listed client (or a server).
 */
#include "clients/cli.h"

int vs_cmd_keygen(int argc, char **argv) {
  const char *prefix = NULL;
  int force = 0, help = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--force")) force = 1;
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) help = 1;
    else if (argv[i][0] == '-' || prefix) {
      fprintf(stderr, "vspec keygen: unexpected '%s'; see vspec keygen --help\n", argv[i]);
      return EXIT_USAGE;
    } else prefix = argv[i];
  }
  if (help || !prefix) {
    fprintf(help ? stdout : stderr,
            "usage: vspec keygen [--force] PREFIX\n\n"
            "Writes a CURVE key pair: PREFIX.key (public and secret, mode 0600) and PREFIX.pub\n"
            "(public), and prints the public key. Give PREFIX.key to the client (--curve-key)\n"
            "or to vspecd ([curve] secret_key_file); append a client's PREFIX.pub as it is\n"
            "to the daemon's allow-list ([curve] allowed_clients: cat PREFIX.pub >> FILE)\n"
            "and give the server's PREFIX.pub to clients (--curve-server-key). Existing\n"
            "files are kept unless --force: a replaced key locks out whoever holds the old\n"
            "one.\n");
    return help ? EXIT_OK : EXIT_USAGE;
  }
  char path[2][1100];
  snprintf(path[0], sizeof path[0], "%s.key", prefix);
  snprintf(path[1], sizeof path[1], "%s.pub", prefix);
  for (int i = 0; i < 2 && !force; i++)
    if (access(path[i], F_OK) == 0) {
      fprintf(stderr, "vspec keygen: %s exists; --force replaces it (whoever holds the old key "
              "is locked out)\n", path[i]);
      return EXIT_FAIL;
    }
  char pub[41], err[1024];
  if (vs_curve_keygen(prefix, pub, err, sizeof err)) {
    fprintf(stderr, "vspec keygen: %s\n", err);
    return EXIT_FAIL;
  }
  fprintf(stderr, "vspec keygen: wrote %s (secret, mode 0600) and %s (public)\n", path[0],
          path[1]);
  printf("%s\n", pub);
  return EXIT_OK;
}
