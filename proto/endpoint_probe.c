#include "proto/endpoint_probe.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <pwd.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "vspec/types.h"

/* Connects fd to addr, waiting up to timeout_ms: 1 connected, 0 not (errno_out set). */
static int ep_connect_within(int fd, const struct sockaddr *addr, socklen_t len, int timeout_ms,
                              int *errno_out) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    *errno_out = errno;
    return 0;
  }
  if (connect(fd, addr, len) == 0) return 1;
  if (errno != EINPROGRESS) {
    *errno_out = errno;
    return 0;
  }
  struct pollfd p = {.fd = fd, .events = POLLOUT};
  int n;
  while ((n = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
  }
  if (n == 0) {
    *errno_out = ETIMEDOUT;
    return 0;
  }
  int so = 0;
  socklen_t sl = sizeof so;
  if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) < 0) so = errno;
  *errno_out = so;
  return so == 0;
}

/* Whose the socket file is, for a refused connect: the usual case is vspecd's admin socket
 * (0660) made by another user, e.g. the systemd unit's. */
static void ep_ipc_denied(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (stat(path, &st)) {
    snprintf(err, errlen, "permission denied on %s (a directory on the way is closed to "
             "this user)", path);
    return;
  }
  struct passwd *pw = getpwuid(st.st_uid);
  struct group *gr = getgrgid(st.st_gid);
  char user[64], group[64];
  snprintf(user, sizeof user, "%s", pw ? pw->pw_name : "?");
  snprintf(group, sizeof group, "%s", gr ? gr->gr_name : "?");
  snprintf(err, errlen, "permission denied on %s: the socket belongs to user %s (uid %u), "
           "group %s, mode %04o, and this process runs as uid %u; run vspec as that user or "
           "a member of group %s, or point --admin at your own daemon's socket", path, user,
           (unsigned)st.st_uid, group, (unsigned)(st.st_mode & 07777), (unsigned)getuid(),
           group);
}

static int ep_probe_ipc(const char *path, int timeout_ms, char *err, size_t errlen) {
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof a.sun_path) return VSPEC_EINVAL;
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return VSPEC_EIO;
  int e = 0, ok = ep_connect_within(fd, (struct sockaddr *)&a, sizeof a, timeout_ms, &e);
  close(fd);
  if (ok) return 1;
  struct stat st;
  if (e == ENOENT)
    snprintf(err, errlen, "no socket file %s", path);
  else if (e == EACCES || e == EPERM) {
    ep_ipc_denied(path, err, errlen);
    return VS_PROBE_DENIED;
  }
  else if (e == ECONNREFUSED && !stat(path, &st) && !S_ISSOCK(st.st_mode))
    snprintf(err, errlen, "%s is not a socket (a regular file or directory is in its place)",
             path);
  else if (e == ECONNREFUSED)
    snprintf(err, errlen, "nothing listening on %s (a socket file left by a process that "
             "is gone)", path);
  else
    snprintf(err, errlen, "cannot connect to %s: %s", path, strerror(e));
  return 0;
}

static int ep_probe_tcp(const char *hostport, int timeout_ms, char *err, size_t errlen) {
  char host[256];
  const char *colon = strrchr(hostport, ':');
  /* "iface;host:port" (a source address) and the like: left to ZeroMQ */
  if (!colon || colon == hostport || (size_t)(colon - hostport) >= sizeof host ||
      strchr(hostport, ';'))
    return VSPEC_EINVAL;
  size_t hl = (size_t)(colon - hostport);
  const char *h = hostport;
  if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') { /* [v6]:port */
    h++;
    hl -= 2;
  }
  memcpy(host, h, hl);
  host[hl] = '\0';
  if (!strcmp(host, "*")) return VSPEC_EINVAL; /* a bind address, not a peer */
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
  int g = getaddrinfo(host, colon + 1, &hints, &res);
  if (g) {
    snprintf(err, errlen, "cannot resolve %s: %s", host, gai_strerror(g));
    return 0;
  }
  int ok = 0, e = 0;
  for (struct addrinfo *ai = res; ai && !ok; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    ok = ep_connect_within(fd, ai->ai_addr, ai->ai_addrlen, timeout_ms, &e);
    close(fd);
  }
  freeaddrinfo(res);
  if (ok) return 1;
  if (e == ECONNREFUSED)
    snprintf(err, errlen, "nothing listening on %s (connection refused)", hostport);
  else if (e == ETIMEDOUT)
    snprintf(err, errlen, "no answer from %s within %d ms", hostport, timeout_ms);
  else
    snprintf(err, errlen, "cannot connect to %s: %s", hostport, strerror(e));
  return 0;
}

int vs_endpoint_probe(const char *endpoint, int timeout_ms, char *err, size_t errlen) {
  if (errlen) err[0] = '\0';
  if (!strncmp(endpoint, "ipc://", 6) && endpoint[6] && endpoint[6] != '@')
    return ep_probe_ipc(endpoint + 6, timeout_ms, err, errlen);
  if (!strncmp(endpoint, "tcp://", 6)) return ep_probe_tcp(endpoint + 6, timeout_ms, err, errlen);
  return VSPEC_EINVAL;
}

/* A connected stream socket to a tcp:// or ipc:// (file or abstract) endpoint, or -1. */
static int ep_open_fd(const char *endpoint, int timeout_ms) {
  int e = 0;
  if (!strncmp(endpoint, "ipc://", 6) && endpoint[6]) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    const char *path = endpoint + 6;
    size_t n = strlen(path);
    if (n >= sizeof a.sun_path) return -1;
    memcpy(a.sun_path, path, n);
    if (path[0] == '@') a.sun_path[0] = '\0'; /* the abstract namespace, as libzmq names it */
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] != '@'));
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && ep_connect_within(fd, (struct sockaddr *)&a, len, timeout_ms, &e)) return fd;
    if (fd >= 0) close(fd);
    return -1;
  }
  if (strncmp(endpoint, "tcp://", 6)) return -1;
  const char *hp = endpoint + 6, *colon = strrchr(hp, ':');
  char host[256];
  if (!colon || colon == hp || (size_t)(colon - hp) >= sizeof host || strchr(hp, ';')) return -1;
  size_t hl = (size_t)(colon - hp);
  if (hp[0] == '[' && hl >= 2 && hp[hl - 1] == ']') {
    hp++;
    hl -= 2;
  }
  memcpy(host, hp, hl);
  host[hl] = '\0';
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
  if (getaddrinfo(host, colon + 1, &hints, &res)) return -1;
  int fd = -1;
  for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd >= 0 && !ep_connect_within(fd, ai->ai_addr, ai->ai_addrlen, timeout_ms, &e)) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  return fd;
}

int vs_endpoint_mechanism(const char *endpoint, int timeout_ms, char mech[21]) {
  mech[0] = '\0';
  int fd = ep_open_fd(endpoint, timeout_ms);
  if (fd < 0) return 0;
  /* The first 11 bytes of a ZMTP 3 greeting (rfc.zeromq.org/spec/23): the signature and the
   * major version. The peer answers with its whole greeting; we never say a mechanism (a
   * CURVE peer told NULL closes before its own greeting is out) and close. */
  unsigned char g[11] = {0xFF, 0, 0, 0, 0, 0, 0, 0, 0, 0x7F, 3};
  unsigned char in[64];
  size_t got = 0;
  if (write(fd, g, sizeof g) == (ssize_t)sizeof g) {
    double left = timeout_ms;
    while (got < sizeof in && left > 0) {
      struct pollfd p = {.fd = fd, .events = POLLIN};
      if (poll(&p, 1, (int)left) <= 0) break;
      ssize_t n = read(fd, in + got, sizeof in - got);
      if (n <= 0) break;
      got += (size_t)n;
      left -= 1; /* bounded: each read is one event */
    }
  }
  close(fd);
  if (got < 32 || in[0] != 0xFF || in[9] != 0x7F || in[10] < 3) return 0;
  memcpy(mech, in + 12, 20);
  mech[20] = '\0';
  return mech[0] != '\0';
}
