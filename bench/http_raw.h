/*
 * bench/http_raw.h - HTTP/1.1 over a bare loopback socket for vspecd-http-soak: requests sent
 * whole, in pieces or a byte at a time, answers read to the server's close, every wait
 * bounded. (The tests have their own, cmocka-based, in tests/support/raw_http.c.)
 */
#ifndef VS_BENCH_HTTP_RAW_H
#define VS_BENCH_HTTP_RAW_H

#include <stddef.h>

/* A TCP socket connected to 127.0.0.1:port, or -1. */
int vs_raw_connect(int port);
/* Sends all n bytes within max_s; 0, or -1 (closed, reset, or too slow). */
int vs_raw_send(int fd, const void *p, size_t n, double max_s);
/* Reads until the server closes (or max_s passes, or cap bytes): malloc'd, NUL-terminated,
 * *len its length; NULL when nothing could be allocated. *closed: 1 if the server closed. */
char *vs_raw_read_all(int fd, double max_s, size_t cap, size_t *len, int *closed);
/* Whether the peer closed (or reset) fd within max_s: a read returns 0 or an error. Bytes it
 * sent meanwhile are read and dropped. */
int vs_raw_closed_within(int fd, double max_s);
/* The status of the first response line that is not a 1xx ("HTTP/1.1 200 ..."), or 0. */
int vs_raw_final_status(const char *reply, size_t len);
/* Where the body of the final response starts, or NULL. */
const char *vs_raw_body(const char *reply, size_t len);
/* Closes with a reset (SO_LINGER 0), as a client killed mid-request looks to the server. */
void vs_raw_reset(int fd);
/* A free loopback TCP port (bound to port 0, read back, closed), or 0. */
int vs_raw_free_port(void);

#endif /* VS_BENCH_HTTP_RAW_H */
