/*
 * tests/support/raw_http.c - HTTP over a bare loopback socket (raw_http.h).
 */
#include "tests/support/raw_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/support/daemon_harness.h"

int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

int raw_send(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

char *raw_read_all(int fd, double max_s, size_t *len) {
  size_t cap = 4096, n = 0;
  char *b = malloc(cap);
  assert_non_null(b);
  double end = vs_harness_now() + max_s;
  for (;;) {
    int left = (int)((end - vs_harness_now()) * 1000);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (left <= 0 || poll(&p, 1, left) <= 0) break;
    if (n + 4096 + 1 > cap) {
      cap *= 2;
      b = realloc(b, cap);
      assert_non_null(b);
    }
    ssize_t r = recv(fd, b + n, cap - n - 1, 0);
    if (r <= 0) break;
    n += (size_t)r;
  }
  b[n] = '\0';
  if (len) *len = n;
  return b;
}

int raw_closed_within(int fd, double max_s) {
  double end = vs_harness_now() + max_s;
  char c[256];
  for (;;) {
    int left = (int)((end - vs_harness_now()) * 1000);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (left <= 0 || poll(&p, 1, left) <= 0) return 0;
    ssize_t r = recv(fd, c, sizeof c, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return 1;
  }
}

int raw_final_status(const char *reply) {
  for (const char *p = reply; p && *p;) {
    int st = 0;
    if (strncmp(p, "HTTP/1.", 7) || !p[7] || p[8] != ' ') return 0;
    st = atoi(p + 9);
    if (st < 100 || st >= 200) return st;
    p = strstr(p, "\r\n\r\n"); /* an interim response: the next one */
    if (p) p += 4;
  }
  return 0;
}

int raw_request(int port, const char *req, size_t n, double max_s, double *seconds) {
  double t0 = vs_harness_now();
  int fd = raw_connect(port);
  int st = 0;
  if (!raw_send(fd, req, n)) {
    char *r = raw_read_all(fd, max_s, NULL);
    st = raw_final_status(r);
    free(r);
  }
  close(fd);
  if (seconds) *seconds = vs_harness_now() - t0;
  return st;
}
