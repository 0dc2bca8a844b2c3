/*
 * tests/support/raw_http.h - HTTP over a bare loopback socket, for requests no well-behaved
 * client would send (repeated headers, control characters, half-closes, slow trickles).
 */
#ifndef VS_RAW_HTTP_H
#define VS_RAW_HTTP_H

#include <stddef.h>

/* A connected TCP socket to 127.0.0.1:port (fails the test otherwise). */
int raw_connect(int port);
/* Sends all n bytes; 0, or -1 when the server closed or reset the connection. */
int raw_send(int fd, const void *p, size_t n);
/* Reads until the server closes (or max_s passes, or cap bytes); NUL-terminated, malloc'd,
 * *len its length (NULL when not wanted). */
char *raw_read_all(int fd, double max_s, size_t *len);
/* Whether the server closed (or reset) fd within max_s: a read returns 0 or an error. */
int raw_closed_within(int fd, double max_s);
/* The status of the first response line that is not a 1xx ("HTTP/1.1 200 ..."), or 0. */
int raw_final_status(const char *reply);
/* Sends req on a fresh connection and reads the whole answer: the final status, or 0;
 * *seconds (may be NULL) how long it took. */
int raw_request(int port, const char *req, size_t n, double max_s, double *seconds);

#endif /* VS_RAW_HTTP_H */
