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

/* A token of exactly 40 Z85 characters at p, ended by a blank or the line's end. */
static int ck_key_token(const char *p) {
  size_t n = 0;
  while (p[n] && !isspace((unsigned char)p[n])) n++;
  return n == 40 && vs_curve_is_z85(p, 40);
}

void vs_curve_parse_line(const char *line, vs_curve_line *out) {
  memset(out, 0, sizeof *out);
  const char *p = line;
  while (*p && isspace((unsigned char)*p)) p++;
  out->kind = VS_CURVE_LINE_BAD;
  out->at = p;
  /* A Z85 key never starts with '#' (its first character encodes at most 0xffffffff / 85^4,
   * '%'), so '#' always starts a comment. */
  if (*p == '#' || !*p) {
    out->kind = VS_CURVE_LINE_BLANK;
    return;
  }
  /* A bare key first: "public=" followed by 33 characters is no named key anyway. */
  if (ck_key_token(p)) {
    out->kind = VS_CURVE_LINE_KEY;
  } else {
    /* "NAME = KEY": Z85 has '=' in its alphabet, so split only after a known name. */
    static const char *const names[] = {"public", "secret"};
    for (int i = 0; i < 2; i++) {
      size_t l = strlen(names[i]);
      /* The prefix first: p + l is inside the line only if the line starts with the name. */
      if (strncmp(p, names[i], l)) continue;
      const char *q = p + l;
      while (*q == ' ' || *q == '\t') q++;
      if (*q != '=') continue;
      snprintf(out->label, sizeof out->label, "%s", names[i]);
      for (q++; *q && isspace((unsigned char)*q); q++) {}
      p = out->at = q;
      if (ck_key_token(p)) out->kind = VS_CURVE_LINE_KEY;
      break;
    }
    if (out->kind != VS_CURVE_LINE_KEY) return;
  }
  memcpy(out->key, p, 40);
  out->key[40] = 0;
  for (p += 40; *p && isspace((unsigned char)*p); p++) {}
  out->rest = p;
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
    vs_curve_line l;
    vs_curve_parse_line(line, &l);
    /* A bare key is whatever is asked for; a named one only when its name is. */
    if (l.kind == VS_CURVE_LINE_KEY && (!*l.label || !strcmp(l.label, which))) {
      memcpy(key, l.key, 41);
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
static int ck_write(const char *path, int mode, const char *text, char *err, size_t errlen) {
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
  int rc = ck_write(path, 0600, text, err, errlen);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s.pub", prefix);
  snprintf(text, sizeof text, "# vspec CURVE public key\npublic = %s\n", pub);
  if ((rc = ck_write(path, 0644, text, err, errlen))) return rc;
  memcpy(public_key, pub, 41);
  return VSPEC_OK;
}
