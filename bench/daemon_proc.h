/*
 * bench/daemon_proc.h - a vspecd of its own for a benchmark: started from the build directory
 * of the running program (so the ASan vspecd-soak runs the ASan vspecd), on ipc endpoints in a
 * private temporary directory, stopped with SIGTERM. Used by vspecd-bench, vspecd-soak and
 * vspecd-fleet-bench, which also runs other programs next to its daemons (vs_bench_proc:
 * vspec-gateway, redis-server). The tests have their own, cmocka-based, in
 * tests/support/daemon_harness.c.
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
  int die_with_parent; /* 0 after init; set it before a start: the daemon gets SIGKILL when
                          the benchmark dies, however it dies (PR_SET_PDEATHSIG) */
} vs_bench_daemon;

/* Fills the paths and makes the temporary directory. Returns 0 or -1 (message on stderr). */
int vs_bench_daemon_init(vs_bench_daemon *d, const char *prog);
/* Starts vspecd with the endpoints, the plugin directory and `args` (NULL-terminated), its
 * stderr to d->log, `env` (NULL-terminated "K=V", may be NULL) added to its environment; waits
 * up to 60 s for it to answer a ping. Returns 0 or -1. */
int vs_bench_daemon_start(vs_bench_daemon *d, const char *const *args, const char *const *env);
/* vs_bench_daemon_start without the wait: the daemon is forked and executed, and the caller
 * goes on (vs_bench_daemon_wait_up later, or never). Returns 0 or -1. */
int vs_bench_daemon_spawn(vs_bench_daemon *d, const char *const *args, const char *const *env);
/* Waits up to timeout_s for the daemon to answer a ping on its admin endpoint. Returns 0, or
 * -1 when it exited or did not answer in time (message on stderr). */
int vs_bench_daemon_wait_up(vs_bench_daemon *d, double timeout_s);
/* SIGKILL (a crash as its clients and Redis see it) and reaps it. */
void vs_bench_daemon_kill(vs_bench_daemon *d);
/* SIGTERM, then waits up to timeout_ms (SIGKILL after that). Returns the exit status: the
 * code, 128 + the signal if one killed it, -1 if it had to be killed; 0 if none was running. */
int vs_bench_daemon_stop(vs_bench_daemon *d, int timeout_ms);
/* The last `lines` lines of the daemon's log to stderr. */
void vs_bench_daemon_dump_log(const vs_bench_daemon *d, int lines);
struct vs_conn;
/* Grants one more preview credit to a job on connection c (a Credit request; a failed send
 * is ignored: the job still ends with its result). */
void vs_bench_daemon_grant(struct vs_conn *c, uint64_t job);
/* A model drafting for itself, named "self": model_dir's gpt.safetensors and vq.safetensors
 * (linked) as target, draft and VQ, made in d->tmp/self (path in dir). For the soaks'
 * speculative jobs on the micro test model. Returns 0 or -1. */
int vs_bench_self_model(const vs_bench_daemon *d, const char *model_dir, char *dir, size_t len);
/* After the daemon exited: adds what LeakSanitizer reported in its log to *leaked_bytes and
 * *leaked_allocs, and counts the other ASan and UBSan reports into *reports. */
void vs_bench_daemon_scan_log(const vs_bench_daemon *d, long *leaked_bytes, long *leaked_allocs,
                              int *reports);
/* Stops the daemon if it runs and removes the temporary directory. Returns 0 or -1. */
int vs_bench_daemon_cleanup(vs_bench_daemon *d);

/* Pings `endpoint` (a job or admin endpoint of vspecd, or a vspec-gateway front) until it
 * answers, at most timeout_s; gives up early when process `pid` (> 0) has exited (and reaps
 * it). Returns 0 or -1. */
int vs_bench_ping_until_up(const char *endpoint, pid_t pid, double timeout_s);

/* Another program run next to the daemons (vspec-gateway, redis-server): its stdout and
 * stderr appended to `log`, and SIGKILLed when the benchmark dies, however it dies. */
typedef struct vs_bench_proc {
  char path[1100]; /* the binary */
  char log[300];
  pid_t pid;       /* 0: not running */
} vs_bench_proc;

/* Forks and executes p->path with args (after argv[0], NULL-terminated). Returns 0 or -1. */
int vs_bench_proc_spawn(vs_bench_proc *p, const char *const *args);
/* Sends sig, waits up to timeout_ms, then SIGKILL; reaps it. Returns what
 * vs_bench_daemon_stop returns (0 if none was running). */
int vs_bench_proc_stop(vs_bench_proc *p, int sig, int timeout_ms);
/* 1 when it has exited (reaped: p->pid is 0 then), 0 while it runs. */
int vs_bench_proc_exited(vs_bench_proc *p);
/* The last `lines` lines of its log to stderr, under a title. */
void vs_bench_proc_dump_log(const vs_bench_proc *p, const char *title, int lines);

#endif /* VS_BENCH_DAEMON_PROC_H */
