#include "daemon/sd_notify.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "vspec/types.h"

int vs_sd_notify(const char *state) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !*path) return 0;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  size_t len = strlen(path);
  if (len >= sizeof sa.sun_path || (path[0] != '/' && path[0] != '@')) return VSPEC_EINVAL;
  memcpy(sa.sun_path, path, len);
  /* An abstract socket's name starts with a NUL byte and has no terminator. */
  if (path[0] == '@') sa.sun_path[0] = 0;
  socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len +
                                (path[0] == '@' ? 0 : 1));
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return VSPEC_EIO;
  ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen);
  close(fd);
  return n == (ssize_t)strlen(state) ? 1 : VSPEC_EIO;
}

int vs_sd_notifyf(const char *fmt, ...) {
  if (!getenv("NOTIFY_SOCKET")) return 0;
  char buf[512] = "STATUS=";
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + 7, sizeof buf - 7, fmt, ap);
  va_end(ap);
  return vs_sd_notify(buf);
}
