#include "proto/curve_keys.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "vspec/types.h"

int vs_curve_is_z85(const char *s, size_t n) {
  static const char z85[] =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  for (size_t i = 0; i < n; i++)
    if (!s[i] || !strchr(z85, s[i])) return 0;
  return 1;
}

int vs_curve_read_key(const char *path, const char *which, char key[41], char *err,
                      size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, errlen, "cannot open key file %s: %s", path, strerror(errno));
    return VSPEC_ENOENT;
  }
  char line[512];
  int rc = VSPEC_EFORMAT;
  while (rc && fgets(line, sizeof line, f)) {
    char *p = line;
    while (*p && isspace((unsigned char)*p)) p++;
    if (*p == '#' || !*p) continue;
    /* "NAME = KEY": Z85 has '=' in its alphabet, so split only after a known name. */
    const char *names[] = {"public", "secret"};
    int named = 0;
    for (int i = 0; i < 2; i++) {
      size_t l = strlen(names[i]);
      /* The prefix first: p + l is inside the line only if the line starts with the name. */
      if (strncmp(p, names[i], l)) continue;
      char *q = p + l;
      while (*q == ' ' || *q == '\t') q++;
      if (*q == '=') {
        if (strcmp(names[i], which)) named = -1;
        else {
          named = 1;
          p = q + 1;
        }
      }
    }
    if (named < 0) continue;
    while (*p && isspace((unsigned char)*p)) p++;
    size_t n = 0;
    while (p[n] && !isspace((unsigned char)p[n])) n++;
    if (n == 40 && vs_curve_is_z85(p, 40)) {
      memcpy(key, p, 40);
      key[40] = 0;
      rc = VSPEC_OK;
    }
  }
  fclose(f);
  if (rc) snprintf(err, errlen, "%s: no %s key (40 Z85 characters) found", path, which);
  return rc;
}

int vs_curve_key_arg(const char *text, const char *which, char key[41], char *err,
                     size_t errlen) {
  if (strlen(text) == 40 && vs_curve_is_z85(text, 40)) {
    memcpy(key, text, 41);
    return VSPEC_OK;
  }
  return vs_curve_read_key(text, which, key, err, errlen);
}

/* Writes a new file and renames it over `path`: open(O_CREAT) would keep the mode of a file
 * that is there already (a secret key written into a 0644 file), and a reader never sees a
 * half-written key. */
static int vs__write(const char *path, int mode, const char *text, char *err, size_t errlen) {
  char tmp[1200];
  snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
  int fd = mkstemp(tmp); /* created 0600 */
  if (fd < 0) {
    snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    return VSPEC_EIO;
  }
  size_t n = strlen(text);
  int ok = fchmod(fd, (mode_t)mode) == 0;
  ok = ok && write(fd, text, n) == (ssize_t)n;
  ok = ok && fsync(fd) == 0;
  int e = errno;
  ok = close(fd) == 0 && ok;
  if (!ok) {
    snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(e ? e : errno));
    unlink(tmp);
    return VSPEC_EIO;
  }
  if (rename(tmp, path)) {
    snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    unlink(tmp);
    return VSPEC_EIO;
  }
  return VSPEC_OK;
}

int vs_curve_keygen(const char *prefix, char public_key[41], char *err, size_t errlen) {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec)) {
    snprintf(err, errlen, "libzmq cannot make CURVE keys: %s", zmq_strerror(errno));
    return VSPEC_ENOTSUP;
  }
  char path[1100], text[256];
  snprintf(path, sizeof path, "%s.key", prefix);
  snprintf(text, sizeof text, "# vspec CURVE key pair: keep this file secret\npublic = %s\n"
           "secret = %s\n", pub, sec);
  int rc = vs__write(path, 0600, text, err, errlen);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s.pub", prefix);
  snprintf(text, sizeof text, "# vspec CURVE public key\npublic = %s\n", pub);
  if ((rc = vs__write(path, 0644, text, err, errlen))) return rc;
  memcpy(public_key, pub, 41);
  return VSPEC_OK;
}
