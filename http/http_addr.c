/*
 * http/http_addr.c - the HTTP endpoint's listening address (http/http_addr.h).
 */
#include "http/http_addr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vspec/types.h"

int vs_http_parse_listen(const char *text, struct sockaddr_storage *sa, socklen_t *len,
                         char *err, size_t errlen) {
  memset(sa, 0, sizeof *sa);
  const char *colon = strrchr(text, ':');
  if (!colon || colon == text) {
    snprintf(err, errlen, "expected HOST:PORT, e.g. 127.0.0.1:8080 or [::1]:8080");
    return VSPEC_EINVAL;
  }
  char host[100];
  size_t hl = (size_t)(colon - text);
  if (hl >= sizeof host) {
    snprintf(err, errlen, "the host part is too long");
    return VSPEC_EINVAL;
  }
  memcpy(host, text, hl);
  host[hl] = '\0';
  const char *p = colon + 1;
  char *end;
  errno = 0;
  long port = strtol(p, &end, 10);
  if (!*p || *end || errno || port < 0 || port > 65535 || *p == '-' || *p == '+') {
    snprintf(err, errlen, "port '%s' is not a number 0..65535", p);
    return VSPEC_EINVAL;
  }
  if (!strcmp(host, "localhost")) snprintf(host, sizeof host, "127.0.0.1");
  struct sockaddr_in *v4 = (struct sockaddr_in *)sa;
  struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)sa;
  if (host[0] == '[' && hl >= 2 && host[hl - 1] == ']') {
    host[hl - 1] = '\0';
    if (inet_pton(AF_INET6, host + 1, &v6->sin6_addr) != 1) {
      snprintf(err, errlen, "'%s' is not an IPv6 address", host + 1);
      return VSPEC_EINVAL;
    }
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons((uint16_t)port);
    *len = sizeof *v6;
    return VSPEC_OK;
  }
  if (inet_pton(AF_INET, host, &v4->sin_addr) != 1) {
    snprintf(err, errlen, "'%s' is not an IPv4 address, [IPv6] or localhost (names are not "
             "resolved)", host);
    return VSPEC_EINVAL;
  }
  v4->sin_family = AF_INET;
  v4->sin_port = htons((uint16_t)port);
  *len = sizeof *v4;
  return VSPEC_OK;
}

int vs_http_addr_is_loopback(const struct sockaddr_storage *sa) {
  if (sa->ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->ss_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) ||
           (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
  }
  return 0;
}

int vs_http_config_check(const vs_daemon_config *c, char *err, size_t errlen) {
  if (!c->http_listen[0]) return VSPEC_OK; /* the endpoint is off */
  struct sockaddr_storage sa;
  socklen_t len;
  char inner[200];
  if (vs_http_parse_listen(c->http_listen, &sa, &len, inner, sizeof inner)) {
    snprintf(err, errlen, "http.listen = %s: %s", c->http_listen, inner);
    return VSPEC_EINVAL;
  }
  if (!c->http_allow_remote && !vs_http_addr_is_loopback(&sa)) {
    snprintf(err, errlen, "http.listen = %s can be reached from other machines (the HTTP "
             "endpoint has no authentication): use a loopback address, or set "
             "http.allow_remote = true", c->http_listen);
    return VSPEC_EINVAL;
  }
  return VSPEC_OK;
}
