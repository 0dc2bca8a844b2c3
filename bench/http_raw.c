/*
 * bench/http_raw.c - HTTP over a bare loopback socket, every wait bounded (http_raw.h).
 */
#include "bench/http_raw.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench/bench.h"

static int ms_left(double end) {
  double left = (end - vs_bench_now()) * 1000;
  return left <= 0 ? 0 : left > 1e9 ? 1000000000 : (int)left;
}

int vs_raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
    close(fd);
    return -1;
  }
  return fd;
}

int vs_raw_send(int fd, const void *p, size_t n, double max_s) {
  const char *c = p;
  double end = vs_bench_now() + max_s;
  while (n) {
    struct pollfd pf = {.fd = fd, .events = POLLOUT};
    int left = ms_left(end);
    if (!left || poll(&pf, 1, left) <= 0) return -1;
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w <= 0) return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

char *vs_raw_read_all(int fd, double max_s, size_t cap_max, size_t *len, int *closed) {
  size_t cap = 4096, n = 0;
  char *b = malloc(cap);
  double end = vs_bench_now() + max_s;
  *closed = 0;
  while (b && n < cap_max) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int left = ms_left(end);
    if (!left || poll(&p, 1, left) <= 0) break;
    if (n + 4096 + 1 > cap) {
      char *nb = realloc(b, cap * 2);
      if (!nb) break;
      b = nb, cap *= 2;
    }
    ssize_t r = recv(fd, b + n, cap - n - 1, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      *closed = 1;
      break;
    }
    n += (size_t)r;
  }
  if (!b) return NULL;
  b[n] = '\0';
  *len = n;
  return b;
}

int vs_raw_closed_within(int fd, double max_s) {
  double end = vs_bench_now() + max_s;
  char c[512];
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int left = ms_left(end);
    if (poll(&p, 1, left) <= 0) return 0;
    ssize_t r = recv(fd, c, sizeof c, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return 1;
    if (!left) return 0;
  }
}

/* The end of the head of the response at p (after its blank line), or NULL. */
static const char *head_end(const char *p, const char *end) {
  for (; p + 4 <= end; p++)
    if (!memcmp(p, "\r\n\r\n", 4)) return p + 4;
  return NULL;
}

/* The final (not 1xx) response's first byte, or NULL. */
static const char *final_response(const char *reply, size_t len) {
  const char *p = reply, *end = reply + len;
  while (p && p + 12 <= end) {
    if (strncmp(p, "HTTP/1.", 7) || p[8] != ' ') return NULL;
    int st = atoi(p + 9);
    if (st < 100 || st >= 200) return p;
    p = head_end(p, end); /* an interim response: the next one */
  }
  return NULL;
}

int vs_raw_final_status(const char *reply, size_t len) {
  const char *p = final_response(reply, len);
  return p ? atoi(p + 9) : 0;
}

const char *vs_raw_body(const char *reply, size_t len) {
  const char *p = final_response(reply, len);
  return p ? head_end(p, reply + len) : NULL;
}

void vs_raw_reset(int fd) {
  struct linger l = {.l_onoff = 1, .l_linger = 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  close(fd);
}

int vs_raw_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  int port = 0;
  if (!bind(fd, (struct sockaddr *)&a, sizeof a) && !getsockname(fd, (struct sockaddr *)&a, &al))
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}
