/*
 * http/http_addr.h - the HTTP endpoint's listening address ([http] listen), read and checked
 * the same way by vspecd's configuration check, the endpoint itself and its connection guard.
 */
#ifndef VS_HTTP_ADDR_H
#define VS_HTTP_ADDR_H

#include <stddef.h>
#include <sys/socket.h>

#include "daemon/config.h"

/* "HOST:PORT": an IPv4 address, "[IPv6]" or "localhost", and a port 0..65535 (0: any free
 * one). Returns 0 or VSPEC_EINVAL with a message naming the problem. */
int vs_http_parse_listen(const char *text, struct sockaddr_storage *sa, socklen_t *len,
                         char *err, size_t errlen);
int vs_http_addr_is_loopback(const struct sockaddr_storage *sa);
/* With the endpoint on (http.listen set): the address parsed now, so that a typo stops the
 * start, and refused where other machines reach it unless http.allow_remote. After
 * vs_config_check (daemon/config.h). */
int vs_http_config_check(const vs_daemon_config *c, char *err, size_t errlen);

#endif /* VS_HTTP_ADDR_H */
