/*
 * daemon/sd_notify.h - systemd's readiness protocol without libsystemd.
 *
 * A unit of Type=notify starts vspecd with $NOTIFY_SOCKET: the path of an AF_UNIX datagram
 * socket (a leading '@' names one in the abstract namespace). vspecd sends "STATUS=..."
 * while it loads its models, "READY=1" once it answers requests, "RELOADING=1" and
 * "READY=1" around a SIGHUP rescan, and "STOPPING=1" when it begins to drain. Without the
 * variable every call does nothing; a failed send is ignored (systemd then times the start
 * out, which says more than a log line would).
 */
#ifndef VS_SD_NOTIFY_H
#define VS_SD_NOTIFY_H

/* Sends `state` (newline-separated KEY=VALUE assignments) to $NOTIFY_SOCKET. Returns 1 when
 * sent, 0 when there is no socket to tell, a negative status when the send failed. */
int vs_sd_notify(const char *state);
/* "STATUS=" + printf-formatted text. */
int vs_sd_notifyf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* VS_SD_NOTIFY_H */
