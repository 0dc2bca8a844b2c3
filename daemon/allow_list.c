#include "daemon/allow_list.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "proto/curve_keys.h"
#include "vspec/types.h"

/* What a line should have been, for every message about one that was not. */
#define VS__ALLOW_FORMS                                                                       \
  "expected a client's public key: the `public = KEY` line of its NAME.pub (from `vspec "  \
  "keygen NAME`; `cat NAME.pub >> FILE` adds it), or the 40-character Z85 key alone, "      \
  "either optionally followed by a name"

/* One line into entry e; 0 for a key, 1 for a blank or comment line, or an error. */
static int al_allow_line(const char *path, int lineno, const char *line, vs_allow_entry *e,
                         char *err, size_t errlen) {
  vs_curve_line l;
  vs_curve_parse_line(line, &l);
  if (l.kind == VS_CURVE_LINE_BLANK) return 1;
  if (l.kind == VS_CURVE_LINE_KEY && !strcmp(l.label, "secret")) {
    snprintf(err, errlen, "%s:%d: this is a secret key (a line of a NAME.key file): the "
             "allow-list takes public keys, the `public = ...` line of NAME.pub; keep the "
             "secret key with its client only (and make a new pair: this one was exposed)",
             path, lineno);
    return VSPEC_EFORMAT;
  }
  if (l.kind != VS_CURVE_LINE_KEY) {
    size_t n = strcspn(l.at, " \t\r\n");
    snprintf(err, errlen, "%s:%d: '%.*s%s' (%zu characters) is not a key; " VS__ALLOW_FORMS,
             path, lineno, (int)(n < 48 ? n : 48), l.at, n > 48 ? "..." : "", n);
    return VSPEC_EFORMAT;
  }
  memset(e, 0, sizeof *e);
  zmq_z85_decode(e->key, l.key);
  size_t nl = strcspn(l.rest, " \t\r\n#");
  if (nl) snprintf(e->name, sizeof e->name, "%.*s", (int)(nl < 63 ? nl : 63), l.rest);
  else snprintf(e->name, sizeof e->name, "%.8s", l.key);
  return VSPEC_OK;
}

int vs_allow_list_read(const char *path, vs_allow_entry **out, int *n, char *err,
                       size_t errlen) {
  *out = NULL;
  *n = 0;
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, errlen, "cannot open allow-list %s: %s", path, strerror(errno));
    return VSPEC_ENOENT;
  }
  vs_allow_entry *list = calloc(VS_ALLOW_LIST_MAX, sizeof *list);
  if (!list) {
    fclose(f);
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  /* getline: a long line is one line, not several read in pieces. */
  char *line = NULL;
  size_t cap = 0;
  int lineno = 0, count = 0, rc = VSPEC_OK;
  while (getline(&line, &cap, f) >= 0) {
    lineno++;
    vs_allow_entry e;
    int r = al_allow_line(path, lineno, line, &e, err, errlen);
    if (r == 1) continue;
    if ((rc = r)) break;
    if (count == VS_ALLOW_LIST_MAX) {
      snprintf(err, errlen, "%s:%d: more than %d keys", path, lineno, VS_ALLOW_LIST_MAX);
      rc = VSPEC_ERANGE;
      break;
    }
    list[count++] = e;
  }
  if (!rc && ferror(f)) {
    snprintf(err, errlen, "cannot read allow-list %s: %s", path, strerror(errno));
    rc = VSPEC_EIO;
  }
  free(line);
  fclose(f);
  if (rc) {
    free(list);
    return rc;
  }
  *out = list;
  *n = count;
  return VSPEC_OK;
}
