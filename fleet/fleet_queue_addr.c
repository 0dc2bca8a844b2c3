/*
 * fleet/fleet_queue_addr.c - the fleet queue's addresses: redis://[[user]:password@]host[:port][/db] and
 * unix:/path[?db=N] (fleet/fleet_queue.h).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "fleet/fleet_queue.h"

/* ---- addresses -------------------------------------------------------------------------- */

static int fq_digits(const char *s, size_t n, long long max, long long *out) {
  if (n == 0 || n > 18) return 0;
  long long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return 0;
    v = v * 10 + (s[i] - '0');
  }
  if (v > max) return 0;
  *out = v;
  return 1;
}

/* "user:password" or ":password" in s[0..n) (the text before '@'): a secret, never echoed. */
static int fq_userinfo(const char *s, size_t n, vs_fleet_addr *a, char *err, size_t errlen) {
  const char *colon = memchr(s, ':', n);
  size_t ulen = colon ? (size_t)(colon - s) : 0;
  size_t plen = colon ? n - ulen - 1 : 0;
  if (!colon || ulen >= sizeof a->user || plen >= sizeof a->password || plen == 0) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "fleet redis: the part before '@' must be user:password or :password "
                   "(user up to %zu bytes, password 1-%zu bytes)", sizeof a->user - 1,
                   sizeof a->password - 1);
  }
  memcpy(a->user, s, ulen);
  memcpy(a->password, colon + 1, plen);
  return VSPEC_OK;
}

int vs_fleet_addr_parse(const char *url, vs_fleet_addr *a, char *err, size_t errlen) {
  memset(a, 0, sizeof *a);
  if (!url || !*url) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "fleet redis: no address (redis://HOST:PORT or a unix socket path)");
  }
  const char *path = NULL;
  int rc;
  if (url[0] == '/') {
    path = url;
  } else if (!strncmp(url, "unix://", 7)) {
    path = url + 7;
    /* unix://[[user]:password@]/path: the first "@/" ends the user information */
    const char *at = path[0] != '/' ? strstr(path, "@/") : NULL;
    if (at) {
      if ((rc = fq_userinfo(path, (size_t)(at - path), a, err, errlen))) return rc;
      path = at + 1;
    }
  }
  if (path) {
    if (path[0] != '/' || strlen(path) >= sizeof a->path) {
      return vs_fail(err, errlen, VSPEC_EINVAL,
                     "fleet redis: unix socket '%.200s' is not an absolute path of at most %zu bytes",
                     path, sizeof a->path - 1);
    }
    snprintf(a->path, sizeof a->path, "%s", path);
    return VSPEC_OK;
  }
  if (!strncmp(url, "rediss://", 9)) {
    return vs_fail(err, errlen, VSPEC_ENOTSUP,
                   "fleet redis: TLS (rediss://) is not supported; use redis:// or a unix socket");
  }
  if (strncmp(url, "redis://", 8)) {
    return vs_fail(err, errlen, VSPEC_EINVAL,
                   "fleet redis: address must be redis://[[user]:password@]host[:port][/db], "
                   "unix://[[user]:password@]/path or /path");
  }
  const char *s = url + 8;
  /* The last '@' ends the user information: a password may hold '@', a host never does. */
  const char *at = strrchr(s, '@');
  if (at) {
    if ((rc = fq_userinfo(s, (size_t)(at - s), a, err, errlen))) return rc;
    s = at + 1;
  }
  const char *hend;
  if (*s == '[') { /* [IPv6]:port */
    const char *close = strchr(s, ']');
    if (!close) goto bad_host;
    if ((size_t)(close - s - 1) >= sizeof a->host || close == s + 1) goto bad_host;
    memcpy(a->host, s + 1, (size_t)(close - s - 1));
    hend = close + 1;
  } else {
    hend = s + strcspn(s, ":/");
    if (hend == s || (size_t)(hend - s) >= sizeof a->host) goto bad_host;
    memcpy(a->host, s, (size_t)(hend - s));
  }
  a->port = 6379;
  if (*hend == ':') {
    const char *p = hend + 1;
    size_t n = strcspn(p, "/");
    long long v;
    if (!fq_digits(p, n, 65535, &v) || v == 0) {
      return vs_fail(err, errlen, VSPEC_EINVAL,
                     "fleet redis: port '%.*s' is not 1-65535", (int)(n > 40 ? 40 : n), p);
    }
    a->port = (int)v;
    hend = p + n;
  }
  if (*hend == '/' && hend[1]) {
    long long v;
    if (!fq_digits(hend + 1, strlen(hend + 1), INT_MAX, &v)) {
      return vs_fail(err, errlen, VSPEC_EINVAL,
                     "fleet redis: database '%.40s' is not a number", hend + 1);
    }
    a->db = (int)v;
  } else if (*hend && strcmp(hend, "/")) {
    goto bad_host;
  }
  return VSPEC_OK;
bad_host:
  return vs_fail(err, errlen, VSPEC_EINVAL,
                 "fleet redis: no valid host in '%.200s' (redis://host[:port][/db])",
                 at ? at + 1 : url + 8);
}
