/*
 * core/forward_gate.c - cross-job batching of target forwards (see forward_gate.h).
 *
 * Requests live on their callers' stacks and queue in arrival order. Whoever finds the queue
 * ready to go and a lane free leads: it takes up to max_batch requests, runs them unlocked on
 * that lane's device, marks them done and wakes everyone. A waiting thread is never left behind: each
 * one rechecks the readiness rule whenever it wakes, on every batch's end, on every
 * enter/leave, and at its own deadline.
 */
#include "core/forward_gate.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/vs_kernels.h"

enum { VS_GATE_MAX_BATCH = 64, VS_GATE_MAX_LANES = VS_FORWARD_GATE_MAX_LANES };

typedef struct vs__gate_req {
  const vs_backend_model *t;
  vspec_session *s;
  vspec_dev *dev; /* the session's */
  const vspec_forward_batch *b;
  vspec_forward_out *out;
  double arrived;
  int taken, done, rc; /* in a batch; its batch has run */
  char err[VSPEC_ERRLEN];
  struct vs__gate_req *next;
} vs__gate_req;

struct vs_forward_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int max_batch;
  double max_wait_s;
  vspec_dev *lane_dev[VS_GATE_MAX_LANES]; /* one batch at a time on each */
  int lane_busy[VS_GATE_MAX_LANES];
  int lanes, lanes_busy;
  int active;    /* jobs that entered and have not left */
  int n_queued;
  int running;   /* forwards in the batches being computed */
  vs__gate_req *head, *tail;
  vs_forward_gate_stats stats;
};

int vs_forward_gate_create(int max_batch, double max_wait_s, vspec_dev *const *devs, int lanes,
                           vs_forward_gate **out, char *err, size_t errlen) {
  *out = NULL;
  if (lanes < 1 || lanes > VS_GATE_MAX_LANES) {
    snprintf(err, errlen, "batch lanes = %d: give 1..%d", lanes, VS_GATE_MAX_LANES);
    return VSPEC_ERANGE;
  }
  for (int i = 0; i < lanes; i++)
    if (!devs[i]) {
      snprintf(err, errlen, "a forward gate needs a device per lane to compute batches on");
      return VSPEC_EINVAL;
    }
  if (max_batch < 1 || max_batch > VS_GATE_MAX_BATCH) {
    snprintf(err, errlen, "batch = %d: give 1..%d jobs per batched forward", max_batch,
             VS_GATE_MAX_BATCH);
    return VSPEC_ERANGE;
  }
  if (!(max_wait_s > 0 && max_wait_s <= 10)) {
    snprintf(err, errlen, "batch wait %g s: give more than 0 and at most 10 s", max_wait_s);
    return VSPEC_ERANGE;
  }
  vs_forward_gate *g = calloc(1, sizeof *g);
  if (!g) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  pthread_mutex_init(&g->mu, NULL);
  /* Deadlines are absolute CLOCK_MONOTONIC times: a wall-clock step must not stall a job. */
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g->cv, &ca);
  pthread_condattr_destroy(&ca);
  g->max_batch = max_batch;
  g->lanes = lanes;
  for (int i = 0; i < lanes; i++) g->lane_dev[i] = devs[i];
  g->max_wait_s = max_wait_s;
  *out = g;
  return VSPEC_OK;
}

void vs_forward_gate_destroy(vs_forward_gate **pg) {
  vs_forward_gate *g = pg ? *pg : NULL;
  if (!g) return;
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
  free(g);
  *pg = NULL;
}

void vs_forward_gate_enter(vs_forward_gate *g) {
  pthread_mutex_lock(&g->mu);
  g->active++;
  pthread_mutex_unlock(&g->mu);
}

void vs_forward_gate_leave(vs_forward_gate *g) {
  pthread_mutex_lock(&g->mu);
  if (g->active > 0) g->active--;
  /* the ones waiting may now be all there is */
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

void vs_forward_gate_get_stats(vs_forward_gate *g, vs_forward_gate_stats *out) {
  pthread_mutex_lock(&g->mu);
  *out = g->stats;
  pthread_mutex_unlock(&g->mu);
}

static double fg_mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static struct timespec fg_abs(double t) {
  struct timespec ts;
  ts.tv_sec = (time_t)t;
  ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

/* Runs requests one by one (a batch of one, a backend without forward_multi, or one that
 * refused the batch: then each request gets its own answer and error). */
static void fg_run_each(vs__gate_req **r, int n) {
  for (int i = 0; i < n; i++)
    r[i]->rc = r[i]->t->vt->forward(r[i]->s, r[i]->b, r[i]->out, r[i]->err, sizeof r[i]->err);
}

/* The sessions' devices other than the lane's, each once. */
static int fg_others(vspec_dev *lane, vs__gate_req **r, int n, vspec_dev **out) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    int seen = r[i]->dev == lane || !r[i]->dev;
    for (int j = 0; j < k && !seen; j++) seen = out[j] == r[i]->dev;
    if (!seen) out[k++] = r[i]->dev;
  }
  return k;
}

/* Returns the orders it issued. */
static int fg_run_batch(vspec_dev *dev, vs__gate_req **r, int n) {
  const vspec_backend_vtable *vt = r[0]->t->vt;
  if (n == 1 || !VSPEC_HAS_FIELD(vt, vspec_backend_vtable, forward_multi) || !vt->forward_multi) {
    fg_run_each(r, n);
    return 0;
  }
  /* A batch runs on the lane's queue over caches and buffers that the sessions' own queues
   * write (their prefills, the draft's and target's forwards of other rounds), and those
   * queues run on after it: on a GPU each is a stream of its own, so the lane waits for each
   * session's device before the batch and each waits for the lane after it (an event, no
   * host wait; on the CPU nothing to order, counted all the same: tests/test_forward_gate.c).
   * Forwards run alone (fg_run_each) are on the session's own queue and need neither. */
  vspec_dev *others[VS_GATE_MAX_BATCH];
  int n_others = fg_others(dev, r, n, others);
  for (int i = 0; i < n_others; i++) vs_dev_order(dev, others[i]);
  vspec_session *ss[VS_GATE_MAX_BATCH];
  const vspec_forward_batch *bs[VS_GATE_MAX_BATCH];
  vspec_forward_out *os[VS_GATE_MAX_BATCH];
  for (int i = 0; i < n; i++) {
    ss[i] = r[i]->s;
    bs[i] = r[i]->b;
    os[i] = r[i]->out;
  }
  char err[VSPEC_ERRLEN] = "";
  int rc = vt->forward_multi(dev, ss, bs, os, n, err, sizeof err);
  /* also after a failure: the lane may have queued work on the sessions' memory */
  for (int i = 0; i < n_others; i++) vs_dev_order(others[i], dev);
  /* On failure no session has changed (ABI): one by one, each gets its own answer. */
  if (rc) fg_run_each(r, n);
  else
    for (int i = 0; i < n; i++) r[i]->rc = VSPEC_OK;
  return 2 * n_others;
}

/* The model with the most queued requests (the oldest request's on a tie): a job's target and
 * draft forwards share the gate, and a batch is of one model. */
static const vspec_model *fg_busiest(const vs_forward_gate *g) {
  const vspec_model *best = g->head->t->model;
  int best_n = 0;
  for (const vs__gate_req *q = g->head; q; q = q->next) {
    int n = 0;
    for (const vs__gate_req *o = g->head; o; o = o->next) n += o->t->model == q->t->model;
    if (n > best_n) best = q->t->model, best_n = n;
  }
  return best;
}

/* Takes up to max_batch queued requests of the busiest model, oldest first. */
static int fg_take(vs_forward_gate *g, vs__gate_req **batch) {
  int n = 0;
  const vspec_model *model = fg_busiest(g);
  vs__gate_req **link = &g->head;
  while (*link && n < g->max_batch) {
    vs__gate_req *q = *link;
    if (q->t->model != model) {
      link = &q->next;
      continue;
    }
    batch[n++] = q;
    q->taken = 1;
    *link = q->next;
  }
  g->tail = NULL;
  for (vs__gate_req *q = g->head; q; q = q->next) g->tail = q;
  g->n_queued -= n;
  return n;
}

int vs_forward_gate_forward(vs_forward_gate *g, const vs_backend_model *t, vspec_session *s,
                            vspec_dev *dev, const vspec_forward_batch *b, vspec_forward_out *out,
                            char *err, size_t errlen) {
  /* No gate, or a backend that cannot batch: on the job's own device and thread (through the
   * gate it would only run one job at a time). */
  if (!g || !VSPEC_HAS_FIELD(t->vt, vspec_backend_vtable, forward_multi) ||
      !t->vt->forward_multi)
    return t->vt->forward(s, b, out, err, errlen);
  vs__gate_req me = {.t = t, .s = s, .dev = dev, .b = b, .out = out, .arrived = fg_mono()};
  double deadline = me.arrived + g->max_wait_s;
  struct timespec until = fg_abs(deadline);
  pthread_mutex_lock(&g->mu);
  if (g->tail) g->tail->next = &me;
  else g->head = &me;
  g->tail = &me;
  g->n_queued++;
  g->stats.forwards++;
  while (!me.done) {
    double now = fg_mono();
    /* the wait limit is for a forward still queued; once in a batch it waits for that */
    int expired = !me.taken && now >= deadline;
    /* Every job is here (queued, or in the batch that runs) or enough are. */
    int ready = g->n_queued + g->running >= g->active || g->n_queued >= g->max_batch || expired;
    if (g->lanes_busy < g->lanes && g->head && ready) {
      vs__gate_req *batch[VS_GATE_MAX_BATCH];
      int n = fg_take(g, batch), lane = 0;
      while (g->lane_busy[lane]) lane++;
      g->lane_busy[lane] = 1;
      g->lanes_busy++;
      g->stats.batches++;
      g->stats.multi += n > 1;
      g->stats.timeouts += expired && g->n_queued + g->running + n < g->active && n < g->max_batch;
      g->running += n;
      for (int i = 0; i < n; i++) g->stats.rows += (uint64_t)batch[i]->b->n_nodes;
      for (int i = 0; i < n; i++) g->stats.wait_s += now - batch[i]->arrived;
      pthread_mutex_unlock(&g->mu);
      int orders = fg_run_batch(g->lane_dev[lane], batch, n);
      pthread_mutex_lock(&g->mu);
      g->stats.orders += (uint64_t)orders;
      for (int i = 0; i < n; i++) batch[i]->done = 1;
      g->running -= n;
      g->lane_busy[lane] = 0;
      g->lanes_busy--;
      pthread_cond_broadcast(&g->cv);
      continue;
    }
    /* In a batch, past the deadline, or with a batch running: woken by a batch's end (or an
     * enter or leave); else also by the deadline. */
    if (me.taken || g->lanes_busy || expired) pthread_cond_wait(&g->cv, &g->mu);
    else if (pthread_cond_timedwait(&g->cv, &g->mu, &until) == ETIMEDOUT) continue;
  }
  pthread_mutex_unlock(&g->mu);
  if (me.rc) snprintf(err, errlen, "%s", me.err);
  return me.rc;
}
