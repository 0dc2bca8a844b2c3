/*
 * tests/support/daemon_harness.h - running vspecd (and vspec-gateway, vspec) from tests.
 *
 * Every test daemon lives in its own temporary directory with its own ipc endpoints, plugin
 * directory and model directories, so tests never share a port or a file, and removing the
 * directory cleans everything up. The binaries come from $VSPEC_BUILD (build/ or build/asan/),
 * so the ASan run exercises the ASan daemon; a daemon that leaks or trips a sanitizer exits
 * non-zero on SIGTERM and the test that stops it fails, with its log printed.
 *
 * The fixture directory holds:
 *   plugins/        every plugin of $VSPEC_BUILD/plugins, plus accept_testrule.so (the v1
 *                   test rule, accept_prob 0.1 * scale) and sched_slow.so (sleeps per round)
 *   self/           the micro test model drafting for itself (a manifest with a draft role)
 *   job.sock, admin.sock, *.log
 * Models served: "micro" (tests/golden/micro_c2i, AR only) and "self" (speculative).
 */
#ifndef VS_DAEMON_HARNESS_H
#define VS_DAEMON_HARNESS_H

#include <stdint.h>
#include <sys/types.h>

#include "client/conn.h"

typedef struct vs_fixture {
  char dir[128];
  char plugins[200];
  char self_model[200];
  char micro_model[1100];
} vs_fixture;

typedef struct vs_daemon {
  pid_t pid;
  char name[32];
  char job_ep[256];
  char admin_ep[256];
  char log[256];
} vs_daemon;

const char *vs_harness_build(void); /* $VSPEC_BUILD or "build" */
void vs_fixture_make(vs_fixture *f);
void vs_fixture_remove(vs_fixture *f);
/* Copies a built test plugin (relative to $VSPEC_BUILD/tests/plugins) into the fixture's
 * plugin directory as `as`, replacing the file (a new inode, as `make` would). */
void vs_fixture_install(vs_fixture *f, const char *built, const char *as);

/* Starts vspecd named `name` with the fixture's endpoints, plugins and models and the extra
 * arguments (NULL-terminated, may be NULL); waits until it answers a ping. The default
 * size=auto is off (defaults.auto_size=false; extra may turn it on). */
void vs_daemon_start(vs_daemon *d, const vs_fixture *f, const char *name,
                     const char *const *extra);
/* Sends `sig` and waits up to timeout_ms; returns the exit status (128+n if killed by signal
 * n, -1 if it had to be killed). */
int vs_daemon_stop(vs_daemon *d, int sig, int timeout_ms);
/* Prints the last lines of the daemon's log (on failures). */
void vs_daemon_dump_log(const vs_daemon *d);
int vs_daemon_alive(const vs_daemon *d);

/* The end of a test that ran one daemon over its own fixture: stops the daemon if it runs
 * (SIGTERM; its log printed when it did not stop cleanly) and removes the fixture. */
void vs_daemon_finish(vs_daemon *d, vs_fixture *f);

/* A fixture and the daemon `name` over it, for cmocka's setup (vs_daemon_fixture_start) and
 * teardown (vs_daemon_fixture_stop: vs_daemon_finish, then the struct freed). */
typedef struct vs_daemon_fixture {
  vs_fixture fx;
  vs_daemon d;
} vs_daemon_fixture;
vs_daemon_fixture *vs_daemon_fixture_start(const char *name);
void vs_daemon_fixture_stop(vs_daemon_fixture *f);

/* Runs a program from $VSPEC_BUILD with arguments; stdout into out (may be NULL); returns its
 * exit status. */
int vs_run_tool(const char *tool, const char *const *args, char *out, size_t outlen);
/* Starts a program from $VSPEC_BUILD in the background (stderr to log). */
pid_t vs_spawn_tool(const char *tool, const char *const *args, const char *log);
int vs_wait_pid(pid_t pid, int timeout_ms);

/* A raw client: a DEALER connected to ep. */
void vs_client_open(vs_conn *c, const char *ep);
/* Sends a Submit (fields set by the caller) and returns the request id. */
uint64_t vs_client_submit(vs_conn *c, Vspec__Submit *s);
/* Next event that is not a heartbeat, or fails the test after timeout_ms. */
void vs_client_next(vs_conn *c, int timeout_ms, vs_conn_event *e);
/* Reads events until the terminal event of `job` (or of request `rid` when job is 0); the
 * terminal event is left in *e. Returns the number of events of the job before it. Checks
 * that sequence numbers increase by one. */
int vs_client_until_end(vs_conn *c, uint64_t rid, uint64_t *job, int timeout_ms,
                        vs_conn_event *e);
void vs_client_cancel(vs_conn *c, uint64_t job);
void vs_client_credit(vs_conn *c, uint64_t job, uint32_t grant);
/* Status through the admin endpoint. */
void vs_client_status(const char *admin_ep, vs_conn_event *e);
/* One Ping on c: 1 when a Pong came within timeout_ms (its node into node, when not NULL),
 * else 0. */
int vs_client_ping(vs_conn *c, int timeout_ms, char *node, size_t cap);

double vs_harness_now(void);
void vs_harness_sleep_ms(int ms);

#endif /* VS_DAEMON_HARNESS_H */
