/*
 * bench/daemon_proc.h - a vspecd of its own for a benchmark: started from the build directory
 * of the running program (so the ASan vspecd-soak runs the ASan vspecd), on ipc endpoints in a
 * private temporary directory, stopped with SIGTERM. Used by vspecd-bench and vspecd-soak;
 * the tests have their own, cmocka-based, in tests/support/daemon_harness.c.
 */
#ifndef VS_BENCH_DAEMON_PROC_H
#define VS_BENCH_DAEMON_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct vs_bench_daemon {
  char tmp[128];      /* private directory: sockets, log, anything the caller puts there */
  char exe_dir[1024]; /* the running program's directory, where vspecd is */
  char plugins[1100]; /* exe_dir/plugins */
  char job_ep[300], admin_ep[300], log[300];
  pid_t pid;
} vs_bench_daemon;

/* Fills the paths and makes the temporary directory. Returns 0 or -1 (message on stderr). */
int vs_bench_daemon_init(vs_bench_daemon *d, const char *prog);
/* Starts vspecd with the endpoints, the plugin directory and `args` (NULL-terminated), its
 * stderr to d->log, `env` (NULL-terminated "K=V", may be NULL) added to its environment; waits
 * up to 60 s for it to answer a ping. Returns 0 or -1. */
int vs_bench_daemon_start(vs_bench_daemon *d, const char *const *args, const char *const *env);
/* SIGTERM, then waits up to timeout_ms (SIGKILL after that). Returns the exit status: the
 * code, 128 + the signal if one killed it, -1 if it had to be killed; 0 if none was running. */
int vs_bench_daemon_stop(vs_bench_daemon *d, int timeout_ms);
/* The last `lines` lines of the daemon's log to stderr. */
void vs_bench_daemon_dump_log(const vs_bench_daemon *d, int lines);
struct vs_conn;
/* Grants one more preview credit to a job on connection c (a Credit request; a failed send
 * is ignored: the job still ends with its result). */
void vs_bench_daemon_grant(struct vs_conn *c, uint64_t job);
/* Stops the daemon if it runs and removes the temporary directory. Returns 0 or -1. */
int vs_bench_daemon_cleanup(vs_bench_daemon *d);

#endif /* VS_BENCH_DAEMON_PROC_H */
