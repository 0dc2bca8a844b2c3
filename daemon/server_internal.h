/*
 * daemon/server_internal.h - what the files of vspecd's job service share (not a public API).
 *
 * The service is one libuv loop thread that owns every structure below; worker threads touch
 * jobs only under the job's lock and post them back (server_events.c). It is split by concern:
 *   server.c           lifecycle: open (the sockets, the workers, the fronts), run, close
 *   server_requests.c  requests: submit, cancel, credit, ping; the dispatch table
 *   server_admin.c     admin requests: status, plugins, reload; SIGHUP's plugin rescan
 *   server_tick.c      the loop's callbacks: the tick (deadlines, retries, heartbeats), the
 *                      workers' wake-up, the signals, drain and stop
 *   server_events.c    events to clients: sending, credit, Accepted, terminal events,
 *                      progress and previews, the workers' news
 *   server_clients.c   the client registry and the job table
 * each calling only the files below it in this list. Internal functions shared between them
 * are vs__ names declared here.
 */
#ifndef VS_SERVER_INTERNAL_H
#define VS_SERVER_INTERNAL_H

#include "daemon/server.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <uv.h>
#include <zmq.h>

#include "core/metrics.h" /* vs_now */
#include "core/host.h"
#include "core/log.h"
#include "core/names.h"
#include "core/text.h"
#include "core/registry.h"
#include "daemon/job_queue.h"
#include "daemon/model_set.h"
#include "daemon/plugin_ref.h"
#include "daemon/router.h"
#include "daemon/sd_notify.h"
#include "daemon/stats.h"
#include "daemon/submit.h"
#include "daemon/workers.h"
#include "daemon/zap.h"
#include "daemon/zsock_watch.h"
#include "kernels/vs_kernels.h"
#include "proto/curve_keys.h"
#include "proto/endpoint_probe.h"
#include "proto/wire.h"

enum { VS_SOCK_JOB = 0, VS_SOCK_ADMIN = 1 };
#define VS_BUCKETS 1024
#define VS_TICK_MS 20

/* A client is one connection on one socket: the routing id the ROUTER knows it by (the first
 * routing frame, which is the ROUTER's, not the peer's to add to) and, with CURVE, the key it
 * authenticated with. Routing frames after the first come from the peer (a proxy puts its
 * client's id there, but any DEALER can put anything there): they route a job's events back
 * (vs_djob.lp.env) and decide who owns it, but never make one connection several clients, so
 * queue.per_client, limits.max_clients and the queue's fairness count connections. A peer
 * can choose its own routing id (ZMQ_ROUTING_ID) and so claim another's once that one has
 * disconnected, but it cannot present another's key. Without CURVE the routing id is all
 * there is (DESIGN.md, "Security"). */
typedef struct vs_client {
  vs_wire_envelope env; /* the connection: the first routing frame alone */
  char user_id[VS_WIRE_MAX_USER_ID + 1]; /* ZAP user id (CURVE public key), "" without */
  int sock;
  uint64_t key;
  struct vs_client *hnext;
  vs_djob *jobs;
  int n_jobs;
  int gone;
  char text[112]; /* short routing id and allow-list name, for logs */
} vs_client;

typedef struct vs_totals {
  uint64_t submitted, completed, failed, cancelled, rejected_busy, clients_lost, malformed, tokens;
} vs_totals;

typedef struct vs_reload_work {
  uv_work_t req;
  struct vs_server *s;
  vs_wire_envelope env;
  int sock;
  uint64_t request_id;
  char backend[64];
  int rc;
  char err[VSPEC_ERRLEN];
  char names[VS_CONF_MAX_MODELS][64];
  int n_names;
} vs_reload_work;

struct vs_server {
  vs_daemon_config cfg;
  uv_loop_t loop;
  void *zctx;
  void *sock[2];
  char ipc_file[2][VS_CONF_PATH]; /* ipc socket files bound, to remove at exit */
  vs_zwatch watch[2];
  int watches_open;
  uv_async_t async;
  uv_timer_t tick;
  uv_timer_cb on_tick; /* the tick's callback (server_tick.c), registered at open */
  uv_signal_t sig_term, sig_int, sig_hup;
  int tick_running;

  vspec_host host;
  vs_registry *reg;
  vspec_dev *load_dev;
  vs_model_table *models;
  vs_job_queue *queue;
  vs_workers *workers;
  vs_zap *zap;
  vs_submit_ctx submit;

  pthread_mutex_t mail_mu;
  vs_djob *mail;

  vs_client *clients[VS_BUCKETS];
  int n_clients, n_gone;
  vs_djob *jobs[VS_BUCKETS]; /* live jobs by id: accepted, terminal event not yet sent */
  int n_jobs;
  vs_djob *outbox;           /* terminal events waiting for a full peer queue */
  uint64_t next_id;

  vs_totals totals;
  vs_stats stats; /* work by method, preview bytes (daemon/stats.h) */
  vs_server_front fronts[VS_SERVER_MAX_FRONTS]; /* clients inside vspecd (daemon/server.h) */
  void *front[VS_SERVER_MAX_FRONTS];            /* their state */
  int n_fronts;
  double started_at, last_heartbeat;
  int draining, hard_cancel, stopping;
  double drain_started;
  vs_reload_work *reload; /* a backend reload in flight */
  vs_registry_refresh_report hup; /* SIGHUP: changed backends still to reload, in order */
  int hup_next;
  int hup_reloading; /* systemd was told RELOADING=1: READY=1 once the last backend is done */
  int exit_code;
};

/* server_clients.c */
vs_client *vs__client_add(vs_server *s, int sock, const vs_wire_msg *m);
vs_client *vs__client_find(vs_server *s, int sock, const vs_wire_msg *m);
uint64_t vs__client_key(int sock, const vs_wire_msg *m);
void vs__count(vs_server *s, vs_djob *j);
vs_djob *vs__job_find(vs_server *s, uint64_t id);
/* Whether the sender of m owns job j (cancel, credit, and its own jobs in a status). */
int vs__job_owned_by(const vs_djob *j, int sock, const vs_wire_msg *m);
void vs__job_link(vs_server *s, vs_djob *j, vs_client *c, const vs_wire_envelope *env);
void vs__job_unlink(vs_server *s, vs_djob *j);

/* server_events.c */
void vs__client_lost(vs_server *s, vs_client *c);
void vs__drain_mail(vs_server *s);
void vs__finish_unstarted(vs_server *s, vs_djob *j, int reason);
int vs__job_send(vs_server *s, vs_djob *j, Vspec__Event *ev, vs_wire_blob *blobs,
                 int n_blobs);
void vs__post(vs_djob *j, void *user);
void vs__pump(vs_server *s, vs_djob *j);
void vs__reap(vs_server *s);
void vs__reply_error(vs_server *s, int sock, const vs_wire_envelope *env,
                     uint64_t request_id, int code, const char *msg, int retry_ms);
int vs__send(vs_server *s, int sock, const vs_wire_envelope *env, Vspec__Event *ev,
             vs_wire_blob *blobs, int n_blobs);
int vs__send_accepted(vs_server *s, vs_djob *j);
int vs__send_terminal(vs_server *s, vs_djob *j);
/* Arms the tick (s->on_tick) unless it runs or the loop is stopping. */
void vs__start_tick(vs_server *s);

/* server_requests.c */
int vs__on_read(vs_zwatch *w, void *user);

/* server_admin.c */
void vs__handle_plugins(vs_server *s, int sock, const vs_wire_envelope *env,
                        uint64_t rid);
void vs__handle_reload(vs_server *s, int sock, const vs_wire_envelope *env,
                       const Vspec__Request *r);
/* On the job endpoint the asker's own jobs and aggregate counts, no paths (DESIGN.md,
 * "Security"); everything on the admin endpoint. */
void vs__handle_status(vs_server *s, int sock, const vs_wire_msg *m, uint64_t rid);
void vs__on_sighup(uv_signal_t *h, int signum);

/* server_tick.c: the loop's callbacks, which server.c registers */
void vs__on_tick(uv_timer_t *h);
void vs__on_async(uv_async_t *h);
void vs__on_signal(uv_signal_t *h, int signum);
/* Stops the loop once a drain has nothing left to wait for. */
void vs__check_drained(vs_server *s);

#endif /* VS_SERVER_INTERNAL_H */
