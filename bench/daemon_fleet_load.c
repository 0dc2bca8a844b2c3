#include "bench/daemon_fleet_load.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <zmq.h>

#include "bench/bench.h"
#include "client/conn.h"
#include "fleet/fleet_event.h"

#define VS__CLIENTS 2
#define VS__CREDIT 8          /* a submit's credit, one grant back per event: as the CLI */
#define VS__DUP_WAIT_MS 300   /* a second terminal event would come right after the first */
#define VS__DRAIN_WAIT_S 30.0 /* a daemon's ack may wait out its Redis backoff (up to 5 s) */
#define VS__BACK_WAIT_S 60.0  /* members started again must answer within this */

typedef enum { VS__NEW = 0, VS__SENT, VS__WAIT, VS__DONE } vs__state;

typedef struct vs__job {
  uint64_t id, seed, rid; /* the client's job id; the request id of its latest submit */
  int cls, client;
  vs__state state;
  double t0, t_end, retry_at;
  int ends, ok, restarted, resubmitted, retries;
  char node[16]; /* the daemon running it, from its Accepted or Restarted */
} vs__job;

typedef struct vs__client {
  vs_conn conn;
  int open, gw;
  int *slot; /* in_flight job indices, -1 free */
} vs__client;

typedef enum {
  VS__CHAOS_DAEMON = 0, VS__CHAOS_GATEWAY, VS__CHAOS_REDIS, VS__CHAOS_REDIS_DOWN,
  VS__CHAOS_REDIS_BACK, VS__CHAOS_DONE
} vs__chaos_step;

typedef struct vs__run {
  vs_bench_fleet *f;
  const vs_bench_load_opts *o;
  vs_bench_load_result *res;
  vs__job *jobs;
  uint32_t *index; /* open addressing, job id -> index + 1 */
  size_t mask;
  vs__client cl[VS__CLIENTS];
  int next, ended;
  vs__chaos_step step;
  double t0, last_end, redis_restart_at;
} vs__run;

/* ---- jobs by id ---------------------------------------------------------------------------- */

static size_t load_bucket(const vs__run *r, uint64_t id) {
  size_t i = (size_t)((id * 0x9e3779b97f4a7c15ull) >> 20) & r->mask;
  while (r->index[i] && r->jobs[r->index[i] - 1].id != id) i = (i + 1) & r->mask;
  return i;
}

static vs__job *load_find(const vs__run *r, uint64_t id) {
  uint32_t k = r->index[load_bucket(r, id)];
  return k ? &r->jobs[k - 1] : NULL;
}

/* Random, nonzero, below 2^63 (what Submit.job_id takes), and not drawn before. */
static int load_draw_id(vs__run *r, int i) {
  for (;;) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) {
      if (errno == EINTR) continue;
      return -1;
    }
    v &= (1ull << 63) - 1;
    size_t b = load_bucket(r, v);
    if (!v || r->index[b]) continue;
    r->jobs[i].id = v;
    r->index[b] = (uint32_t)i + 1;
    return 0;
  }
}

static int load_setup(vs__run *r, char *err, size_t errlen) {
  const vs_bench_load_opts *o = r->o;
  size_t cap = 16;
  while (cap < 2 * (size_t)o->jobs) cap *= 2;
  r->mask = cap - 1;
  r->jobs = calloc((size_t)o->jobs, sizeof *r->jobs);
  r->index = calloc(cap, sizeof *r->index);
  if (!r->jobs || !r->index) goto oom;
  for (int i = 0; i < o->jobs; i++) {
    r->jobs[i].seed = o->seed0 + (uint64_t)i;
    r->jobs[i].cls = i % 10;
    if (load_draw_id(r, i)) {
      snprintf(err, errlen, "getrandom failed");
      return -1;
    }
  }
  for (int k = 0; k < VS__CLIENTS; k++) {
    r->cl[k].slot = malloc((size_t)o->in_flight * sizeof(int));
    if (!r->cl[k].slot) goto oom;
    for (int s = 0; s < o->in_flight; s++) r->cl[k].slot[s] = -1;
    r->cl[k].gw = k;
    if (vs_conn_open(&r->cl[k].conn, r->f->gw_ep[k], NULL, err, errlen)) return -1;
    r->cl[k].open = 1;
  }
  return 0;
oom:
  snprintf(err, errlen, "out of memory");
  return -1;
}

static void load_teardown(vs__run *r) {
  for (int k = 0; k < VS__CLIENTS; k++) {
    if (r->cl[k].open) vs_conn_close(&r->cl[k].conn);
    free(r->cl[k].slot);
  }
  free(r->jobs);
  free(r->index);
}

/* ---- submits ------------------------------------------------------------------------------- */

/* Every submit of a job is the same message (the gateway compares digests of it): only the
 * request around it changes. */
static int load_send(vs__run *r, vs__job *j) {
  Vspec__Submit s = VSPEC__SUBMIT__INIT;
  s.method = (char *)r->o->method;
  s.has_seed = s.has_class_label = s.has_credit = s.has_job_id = 1;
  s.seed = j->seed;
  s.class_label = j->cls;
  s.credit = VS__CREDIT;
  s.job_id = j->id;
  Vspec__Request q = VSPEC__REQUEST__INIT;
  q.body_case = VSPEC__REQUEST__BODY_SUBMIT;
  q.submit = &s;
  char err[VSPEC_ERRLEN];
  if (vs_conn_send(&r->cl[j->client].conn, &q, NULL, 0, err, sizeof err)) {
    snprintf(r->res->first_error, sizeof r->res->first_error, "send: %s", err);
    return -1;
  }
  j->rid = q.request_id;
  j->state = VS__SENT;
  if (!j->t0) j->t0 = vs_bench_now();
  return 0;
}

/* Each client's free slots get the next jobs; jobs waiting out a refusal are sent again. */
static int load_top_up(vs__run *r) {
  double now = vs_bench_now();
  for (int k = 0; k < VS__CLIENTS; k++)
    for (int s = 0; s < r->o->in_flight; s++) {
      int i = r->cl[k].slot[s];
      if (i < 0 && r->next < r->o->jobs) {
        i = r->cl[k].slot[s] = r->next++;
        r->jobs[i].client = k;
        if (load_send(r, &r->jobs[i])) return -1;
      } else if (i >= 0 && r->jobs[i].state == VS__WAIT && now >= r->jobs[i].retry_at) {
        if (load_send(r, &r->jobs[i])) return -1;
      }
    }
  return 0;
}

/* ---- events -------------------------------------------------------------------------------- */

static void load_end(vs__run *r, vs__job *j, const Vspec__Event *ev) {
  if (++j->ends > 1) return; /* a duplicate: counted at the end */
  double now = vs_bench_now();
  j->ok = ev->body_case == VSPEC__EVENT__BODY_RESULT;
  j->t_end = r->last_end = now;
  j->state = VS__DONE;
  r->ended++;
  for (int s = 0; s < r->o->in_flight; s++)
    if (r->cl[j->client].slot[s] == j - r->jobs) r->cl[j->client].slot[s] = -1;
  if (!j->ok && !r->res->first_error[0])
    snprintf(r->res->first_error, sizeof r->res->first_error, "job %llu: %s",
             (unsigned long long)j->id, ev->error->message ? ev->error->message : "?");
}

/* An error that names no job answers a submit: unavailable and busy are retried, the same
 * submit after a short sleep; anything else ends the job. */
static void load_refused(vs__run *r, int k, const Vspec__Event *ev) {
  vs__job *j = NULL;
  for (int s = 0; s < r->o->in_flight && !j; s++) {
    int i = r->cl[k].slot[s];
    if (i >= 0 && r->jobs[i].state == VS__SENT && r->jobs[i].rid == ev->request_id)
      j = &r->jobs[i];
  }
  if (!j) return;
  int code = ev->error->code;
  if (code != VSPEC__ERROR_CODE__ERR_UNAVAILABLE && code != VSPEC__ERROR_CODE__ERR_BUSY) {
    load_end(r, j, ev);
    return;
  }
  if (code == VSPEC__ERROR_CODE__ERR_UNAVAILABLE) r->res->unavailable++;
  else r->res->busy++;
  j->retries++;
  j->state = VS__WAIT;
  j->retry_at = vs_bench_now() + VS_BENCH_LOAD_RETRY_MS / 1000.0;
}

static void load_on_event(vs__run *r, int k, const Vspec__Event *ev) {
  if (!ev->has_job_id) {
    if (ev->body_case == VSPEC__EVENT__BODY_ERROR && ev->has_request_id) load_refused(r, k, ev);
    return;
  }
  vs__job *j = load_find(r, ev->job_id);
  if (!j || j->client != k) return;
  switch (ev->body_case) {
    case VSPEC__EVENT__BODY_ACCEPTED:
      if (ev->accepted->node && !vs_bench_fleet_is_gateway(r->f, ev->accepted->node))
        snprintf(j->node, sizeof j->node, "%s", ev->accepted->node);
      break;
    case VSPEC__EVENT__BODY_RESTARTED:
      j->restarted = 1;
      if (ev->restarted->node) snprintf(j->node, sizeof j->node, "%s", ev->restarted->node);
      break;
    case VSPEC__EVENT__BODY_PROGRESS:
    case VSPEC__EVENT__BODY_PREVIEW:
      if (j->state != VS__DONE) vs_bench_daemon_grant(&r->cl[k].conn, j->id);
      break;
    case VSPEC__EVENT__BODY_RESULT:
    case VSPEC__EVENT__BODY_ERROR: load_end(r, j, ev); break;
    default: break;
  }
}

/* Waits up to wait_ms for events on either connection and handles all that are there. */
static int load_pump(vs__run *r, int wait_ms) {
  zmq_pollitem_t it[VS__CLIENTS];
  for (int k = 0; k < VS__CLIENTS; k++)
    it[k] = (zmq_pollitem_t){.socket = r->cl[k].conn.sock, .events = ZMQ_POLLIN};
  if (zmq_poll(it, VS__CLIENTS, wait_ms) < 0 && errno != EINTR) {
    snprintf(r->res->first_error, sizeof r->res->first_error, "poll: %s", zmq_strerror(errno));
    return -1;
  }
  char err[VSPEC_ERRLEN];
  for (int k = 0; k < VS__CLIENTS; k++) {
    vs_conn_event e;
    int rc;
    while ((rc = vs_conn_recv(&r->cl[k].conn, 0, &e, err, sizeof err)) == 1) {
      load_on_event(r, k, e.ev);
      vs_conn_event_free(&e);
    }
    if (rc < 0) {
      snprintf(r->res->first_error, sizeof r->res->first_error, "receive: %s", err);
      return -1;
    }
  }
  return 0;
}

/* ---- chaos --------------------------------------------------------------------------------- */

/* The daemon holding most jobs in Redis (delivered, not acked), so that the kill interrupts
 * one; by the clients' view (the Accepted of unfinished jobs) if Redis cannot tell. */
static int load_victim(vs__run *r, int *holding) {
  int count[VS_BENCH_FLEET_DAEMONS] = {0}, best = 1;
  char err[VSPEC_ERRLEN];
  if (vs_bench_fleet_held(r->f, count, err, sizeof err)) {
    fprintf(stderr, "vspecd-fleet-bench: %s: the victim is chosen by the clients' view\n", err);
    for (int i = 0; i < r->next; i++) {
      const vs__job *j = &r->jobs[i];
      int d = j->state == VS__DONE ? -1 : vs_bench_fleet_daemon_index(r->f, j->node);
      if (d >= 0) count[d]++;
    }
  }
  for (int d = 0; d < VS_BENCH_FLEET_DAEMONS; d++)
    if (count[d] > count[best]) best = d;
  *holding = count[best];
  return best;
}

static int load_kill_daemon(vs__run *r, double t) {
  vs_bench_chaos_log *c = &r->res->chaos;
  int d = load_victim(r, &c->daemon_jobs);
  vs_bench_daemon_kill(&r->f->d[d]);
  snprintf(c->daemon, sizeof c->daemon, "%s", r->f->d_name[d]);
  c->daemon_at = r->ended;
  c->daemon_t = t;
  return vs_bench_fleet_spawn_daemon(r->f, d);
}

/* Gateway 0 dies: its client moves to gateway 1 and sends every unfinished job there again,
 * as it sent it first (a job waiting out a refusal goes at its retry time). */
static int load_kill_gateway(vs__run *r, double t) {
  vs_bench_chaos_log *c = &r->res->chaos;
  vs_bench_proc_stop(&r->f->gw[0], SIGKILL, 3000);
  c->gateway_at = r->ended;
  c->gateway_t = t;
  vs__client *cl = &r->cl[0];
  vs_conn_close(&cl->conn);
  cl->open = 0;
  char err[VSPEC_ERRLEN];
  if (vs_conn_open(&cl->conn, r->f->gw_ep[1], NULL, err, sizeof err)) {
    snprintf(r->res->first_error, sizeof r->res->first_error, "%s", err);
    return -1;
  }
  cl->open = 1;
  cl->gw = 1;
  for (int s = 0; s < r->o->in_flight; s++) {
    int i = cl->slot[s];
    if (i < 0) continue;
    vs__job *j = &r->jobs[i];
    j->resubmitted = 1;
    c->gateway_jobs++;
    if (j->state == VS__SENT && load_send(r, j)) return -1;
  }
  return vs_bench_fleet_spawn_gateway(r->f, 0);
}

/* One step of the plan when its moment has come. */
static int load_chaos(vs__run *r) {
  vs_bench_chaos_log *c = &r->res->chaos;
  double now = vs_bench_now(), t = now - r->t0;
  int n = r->o->jobs;
  switch (r->step) {
    case VS__CHAOS_DAEMON:
      if (r->ended < n / 4) return 0;
      r->step = VS__CHAOS_GATEWAY;
      return load_kill_daemon(r, t);
    case VS__CHAOS_GATEWAY:
      if (r->ended < n / 2) return 0;
      r->step = VS__CHAOS_REDIS;
      return load_kill_gateway(r, t);
    case VS__CHAOS_REDIS:
      if (r->ended < 3 * n / 4) return 0;
      vs_bench_redis_kill(&r->f->redis);
      c->redis_at = r->ended;
      c->redis_t = t;
      r->redis_restart_at = now + r->o->redis_down_s;
      r->step = VS__CHAOS_REDIS_DOWN;
      return 0;
    case VS__CHAOS_REDIS_DOWN:
      if (now < r->redis_restart_at) return 0;
      c->redis_restart_t = t;
      r->step = VS__CHAOS_REDIS_BACK;
      return vs_bench_redis_spawn(&r->f->redis);
    case VS__CHAOS_REDIS_BACK:
      if (!vs_bench_redis_listening(&r->f->redis)) return 0;
      c->redis_up_t = t;
      r->step = VS__CHAOS_DONE;
      return 0;
    default: return 0;
  }
}

/* ---- the run ------------------------------------------------------------------------------- */

static int load_stop_asked(const vs__run *r) { return r->o->stop && *r->o->stop; }

/* Until every job ended, nothing ended for stall_s, or a signal. */
static int load_loop(vs__run *r) {
  r->t0 = r->last_end = vs_bench_now();
  while (r->ended < r->o->jobs) {
    if (load_stop_asked(r)) {
      r->res->interrupted = 1;
      return 0;
    }
    if (vs_bench_now() - r->last_end > r->o->stall_s) {
      r->res->stalled = 1;
      return 0;
    }
    if (load_pump(r, 10) || (r->o->chaos && load_chaos(r)) || load_top_up(r)) return -1;
  }
  /* Every job ended while Redis was down (its results already read): it is started again
   * all the same, the checks below need it. */
  double end = vs_bench_now() + 10 + r->o->redis_down_s;
  while (r->step == VS__CHAOS_REDIS_DOWN || r->step == VS__CHAOS_REDIS_BACK) {
    if (load_chaos(r) || load_pump(r, 10)) return -1;
    if (vs_bench_now() > end) break;
  }
  return 0;
}

/* The jobs' events in Redis: how many daemons ran each (their Accepted) and how many
 * Restarted events it has. */
static int load_runs_of(vs__run *r, const vs__job *j, int *accepted, int *restarts) {
  char id[32], after[VS_FLEET_ID_MAX] = "0-0", err[VSPEC_ERRLEN];
  snprintf(id, sizeof id, "%llu", (unsigned long long)j->id);
  *accepted = *restarts = 0;
  for (;;) {
    vs_fleet_event ev[64];
    int n = vs_fleet_events_read(r->f->q, id, after, 0, ev, 64, err, sizeof err);
    if (n < 0) return -1;
    for (int i = 0; i < n; i++) {
      vs_wire_alloc a;
      vs_wire_alloc_init(&a, 64u << 20);
      Vspec__Event *e;
      vs_wire_blob blobs[VS_WIRE_MAX_BLOBS];
      int nb;
      if (!vs_fleet_event_decode(ev[i].data, ev[i].len, &a, &e, blobs, &nb, err, sizeof err)) {
        *accepted += e->body_case == VSPEC__EVENT__BODY_ACCEPTED &&
                     vs_bench_fleet_daemon_index(r->f, e->accepted->node) >= 0;
        *restarts += e->body_case == VSPEC__EVENT__BODY_RESTARTED;
        vs_wire_event_free(e, &a);
      }
      snprintf(after, sizeof after, "%s", ev[i].id);
      vs_fleet_event_clear(&ev[i]);
    }
    if (n < 64) return 0;
  }
}

static void load_count_runs(vs__run *r) {
  vs_bench_load_result *res = r->res;
  for (int i = 0; i < r->o->jobs; i++) {
    int accepted, restarts;
    if (load_runs_of(r, &r->jobs[i], &accepted, &restarts)) {
      res->runs = res->ran_again = res->ran_again_unexplained = -1; /* Redis did not tell */
      return;
    }
    res->runs += accepted;
    res->ran_again += accepted > 1;
    res->ran_again_unexplained += accepted > 1 + restarts;
  }
}

static void load_tally(vs__run *r) {
  vs_bench_load_result *res = r->res;
  double *lat = malloc((size_t)r->o->jobs * sizeof *lat);
  int n = 0;
  for (int i = 0; i < r->o->jobs; i++) {
    const vs__job *j = &r->jobs[i];
    res->ended += j->ends > 0;
    res->results += j->ends > 0 && j->ok;
    res->errors += j->ends > 0 && !j->ok;
    res->duplicated += j->ends > 1;
    res->restarted += j->restarted;
    res->resubmitted += j->resubmitted;
    res->retried_jobs += j->retries > 0;
    if (j->ends > 0 && j->ok && lat) lat[n++] = j->t_end - j->t0;
  }
  res->lost = res->jobs - res->ended;
  res->wall_s = r->last_end - r->t0;
  res->jobs_per_s = res->wall_s > 0 ? res->ended / res->wall_s : 0;
  res->p50_s = lat ? vs_bench_quantile(lat, n, 0.5) : 0;
  res->p99_s = lat ? vs_bench_quantile(lat, n, 0.99) : 0;
  free(lat);
}

/* After the last job: late duplicates, the stream empty, the members back, runs in Redis. */
static int load_finish(vs__run *r, char *err, size_t errlen) {
  vs_bench_load_result *res = r->res;
  double end = vs_bench_now() + VS__DUP_WAIT_MS / 1000.0;
  while (vs_bench_now() < end)
    if (load_pump(r, 10)) return -1;
  load_tally(r);
  if (res->interrupted) return 0;
  char e[VSPEC_ERRLEN];
  double took;
  int rc = vs_bench_fleet_drained(r->f, VS__DRAIN_WAIT_S, &res->left, &res->pending, &took, e,
                                  sizeof e);
  res->drain_s = vs_bench_now() - r->last_end;
  if (rc < 0) {
    snprintf(err, errlen, "the queue's depth: %s", e);
    return -1;
  }
  if (vs_bench_fleet_check_up(r->f, VS__BACK_WAIT_S, e, sizeof e)) {
    snprintf(err, errlen, "after the run: %s", e);
    return -1;
  }
  load_count_runs(r);
  return 0;
}

int vs_bench_load_run(vs_bench_fleet *f, const vs_bench_load_opts *o, vs_bench_load_result *res,
                      char *err, size_t errlen) {
  memset(res, 0, sizeof *res);
  res->jobs = o->jobs;
  res->chaos.daemon_at = res->chaos.gateway_at = res->chaos.redis_at = -1;
  res->left = res->pending = -1; /* not known until the end */
  vs__run r = {.f = f, .o = o, .res = res};
  int rc = load_setup(&r, err, errlen);
  if (!rc && load_loop(&r)) {
    snprintf(err, errlen, "%s", res->first_error);
    rc = -1;
  }
  if (!rc) rc = load_finish(&r, err, errlen);
  load_teardown(&r);
  return rc;
}

int vs_bench_load_passed(const vs_bench_load_result *res, char *why, size_t whylen) {
  size_t n = 0;
  why[0] = 0;
#define VS__WHY(cond, ...)                                                   \
  if ((cond) && n < whylen) n += (size_t)snprintf(why + n, whylen - n, __VA_ARGS__)
  VS__WHY(res->lost, "%d job(s) lost (no result%s); ", res->lost,
          res->interrupted ? ": interrupted" : res->stalled ? " after the stall timeout" : "");
  VS__WHY(res->duplicated, "%d job(s) ended more than once at their client; ", res->duplicated);
  VS__WHY(res->errors, "%d job(s) failed (first: %s); ", res->errors, res->first_error);
  VS__WHY(res->left > 0 || res->pending > 0, "the jobs stream holds %lld entries, %lld "
          "pending, %.0f s after the last result; ", res->left, res->pending, res->drain_s);
  VS__WHY(!res->lost && (res->left < 0 || res->pending < 0), "the jobs stream was not "
          "checked; ");
#undef VS__WHY
  if (n >= 2 && n < whylen) why[n - 2] = 0;
  return n == 0;
}
