/*
 * Cross-job batching: the llamagen backend's forward_multi against separate forwards
 * (several sessions, CFG and not, trees and chains, a failing member; unfused, the CPU's
 * default, and on the fused ops, a GPU's, with their op budget, and through graphs per
 * batch shape), the gate's scheduling
 * with a counting fake backend (answers, batch limit, wait limit, a leaving job wakes the
 * waiters), and jobs generated concurrently through a gate against the same jobs alone.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/engine.h"
#include "core/forward_gate.h"
#include "core/host.h"
#include "core/metrics.h"
#include "kernels/vs_kernels.h"
#include "tests/support/ops_views.h"
#include "tests/support/method_of.h"

static vspec_host host, host_nobatch;

static vs_registry *reg;

/* ---- forward_multi against forward ----------------------------------------------------- */

enum { NS = 3, MAXN = 16 };

typedef struct multi_fixture {
  vspec_dev *dev, *batch_dev; /* the sessions', and the one batches run on (2 threads) */
  vs_models *models;
  const vs_backend_model *t;
  vspec_session *a[NS], *b[NS]; /* batched, and the reference run one by one */
  int rows[NS];
  int V, d;
  int fused_layers; /* multi=fused: the model's layers (the batch's op budget); 0: unfused */
  int batch_ops;    /* the batch runs the batch ops of ABI 1.9 (BATCH_*) */
  int graphs;       /* graphs=on: a batch of a shape seen before replays a graph */
  uint64_t last_ops; /* the ops the last batch issued on its device */
} multi_fixture;

/* How a fused batch takes its sessions' QKV and attention: the batch ops, an op per session
 * because the device's table lacks them, or because multi=sessions asks for that. */
enum { BATCH_OPS = 1, BATCH_NO_OPS = 0, BATCH_SESSIONS = 2 };

static void open_fixture(multi_fixture *f, const char *dir) {
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &f->dev, err, sizeof err), 0);
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 2, &f->batch_dev, err, sizeof err), 0);
  if (vs_models_open(reg, f->batch_ops == BATCH_NO_OPS ? &host_nobatch : &host, f->dev, dir,
                     VS_ROLE_TARGET,
                     &f->models, err, sizeof err))
    fail_msg("%s", err);
  f->t = &f->models->target;
  assert_true(VSPEC_HAS_FIELD(f->t->vt, vspec_backend_vtable, forward_multi));
  assert_non_null(f->t->vt->forward_multi);
  f->V = f->t->info.vocab;
  f->d = f->t->info.feature_dim;
  static const int rows[NS] = {2, 1, 2};
  float *logits = malloc((size_t)2 * f->V * sizeof(float));
  for (int i = 0; i < NS; i++) {
    f->rows[i] = rows[i];
    vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = i + 1,
                                .rows = rows[i], .max_nodes = MAXN};
    for (int k = 0; k < 2; k++) {
      vspec_session **s = k ? &f->b[i] : &f->a[i];
      if (f->t->vt->session_open(f->t->model, f->dev, &cfg, s, err, sizeof err))
        fail_msg("%s", err);
      vspec_forward_out o = {.struct_size = sizeof o, .logits = logits};
      if (f->t->vt->prefill(*s, &o, err, sizeof err)) fail_msg("%s", err);
    }
  }
  free(logits);
}

static void close_fixture(multi_fixture *f) {
  for (int i = 0; i < NS; i++) {
    f->t->vt->session_close(f->a[i]);
    f->t->vt->session_close(f->b[i]);
  }
  vs_models_close(f->models);
  vs_dev_destroy(f->dev);
  vs_dev_destroy(f->batch_dev);
}

static void expect_near(const char *what, int s, const float *got, const float *want, size_t n) {
  double maxref = 0, maxdiff = 0;
  for (size_t i = 0; i < n; i++) {
    maxref = fmax(maxref, fabs(want[i]));
    double d = fabs((double)got[i] - want[i]);
    if (!(d <= maxdiff)) maxdiff = d;
  }
  /* float rounding of products with more rows only */
  if (!(maxdiff <= 1e-5 * maxref))
    fail_msg("session %d %s: batched differs from alone by %.3g (max |ref| %.3g)", s, what,
             maxdiff, maxref);
}

/* One round: session members[j] runs batch[j]; batched through forward_multi on f->a, one
 * by one on f->b; logits and features must agree. */
static void round_trip(multi_fixture *f, const int *members, int count,
                       const vspec_forward_batch *batch) {
  vspec_session *ss[NS];
  const vspec_forward_batch *bs[NS];
  vspec_forward_out outs[NS], *os[NS];
  float *want_l[NS], *want_f[NS];
  char err[VSPEC_ERRLEN];
  for (int j = 0; j < count; j++) {
    int i = members[j];
    size_t rows = (size_t)batch[j].n_nodes * f->rows[i];
    outs[j] = (vspec_forward_out){.struct_size = sizeof outs[j],
                                  .logits = malloc(rows * f->V * sizeof(float)),
                                  .features = malloc(rows * f->d * sizeof(float))};
    want_l[j] = malloc(rows * f->V * sizeof(float));
    want_f[j] = malloc(rows * f->d * sizeof(float));
    vspec_forward_out o = {.struct_size = sizeof o, .logits = want_l[j], .features = want_f[j]};
    if (f->t->vt->forward(f->b[i], &batch[j], &o, err, sizeof err)) fail_msg("%s", err);
    ss[j] = f->a[i];
    bs[j] = &batch[j];
    os[j] = &outs[j];
  }
  vs_dev_counters before, after, lane0, lane;
  vs_dev_counters_get(f->dev, &before);
  vs_dev_counters_get(f->batch_dev, &lane0);
  if (f->t->vt->forward_multi(f->batch_dev, ss, bs, os, count, err, sizeof err))
    fail_msg("%s", err);
  /* on the fused ops: the embedding gather, per layer every session's norm + QKV + RoPE + KV
   * store and tree attention (one op each with the batch ops, else one per session) and three
   * ops over every row, the head rows' norm and the head; one upload */
  vs_dev_counters_get(f->batch_dev, &lane);
  vs_dev_counters_sub(&lane, &lane0);
  /* the features and the logits of every session: one download each (a wait each on a GPU) */
  assert_int_equal(lane.downloads, 2);
  f->last_ops = lane.ops;
  if (f->fused_layers) {
    uint64_t attention = f->batch_ops == BATCH_OPS ? 2 : 2 * (uint64_t)count;
    if (!f->graphs) assert_int_equal(lane.ops, 3 + (uint64_t)f->fused_layers * (attention + 3));
    assert_int_equal(lane.uploads, 1);
  }
  /* Everything the batch does runs on the batch's device: on a GPU the sessions' own devices
   * are other streams, ordered only before and after the call (core/forward_gate.c), so an op
   * issued there (a KV store) would not wait for the batch's work it reads. */
  vs_dev_counters_get(f->dev, &after);
  vs_dev_counters_sub(&after, &before);
  assert_int_equal(after.ops + after.uploads + after.downloads + after.syncs, 0);
  for (int j = 0; j < count; j++) {
    size_t rows = (size_t)batch[j].n_nodes * f->rows[members[j]];
    expect_near("logits", members[j], outs[j].logits, want_l[j], rows * f->V);
    expect_near("features", members[j], outs[j].features, want_f[j], rows * f->d);
    free(outs[j].logits);
    free(outs[j].features);
    free(want_l[j]);
    free(want_f[j]);
  }
}

static void commit_both(multi_fixture *f, int i, const int32_t *path, int n) {
  char err[VSPEC_ERRLEN];
  if (f->t->vt->commit(f->a[i], path, n, err, sizeof err)) fail_msg("%s", err);
  if (f->t->vt->commit(f->b[i], path, n, err, sizeof err)) fail_msg("%s", err);
}

/* fused_layers: 0 for the default path (unfused on the CPU), else the model's layers, run
 * with multi=fused or multi=sessions (VSPEC_MULTI, read at load); batch_ops: BATCH_*. */
static void check_forward_multi(const char *dir, int fused_layers, int batch_ops) {
  multi_fixture f = {0};
  if (fused_layers)
    setenv("VSPEC_MULTI", batch_ops == BATCH_SESSIONS ? "sessions" : "fused", 1);
  f.batch_ops = batch_ops;
  open_fixture(&f, dir);
  unsetenv("VSPEC_MULTI");
  f.fused_layers = fused_layers;
  char err[VSPEC_ERRLEN];
  /* round 1: a chain, a branching tree, a single node */
  int32_t t0[] = {5, 9, 2}, p0[] = {-1, 0, 1};
  int32_t t1[] = {7, 3, 11, 4, 8}, p1[] = {-1, 0, 0, 1, 2};
  int32_t t2[] = {6}, p2[] = {-1};
  vspec_forward_batch r1[NS] = {
      {.struct_size = sizeof r1[0], .n_nodes = 3, .tokens = t0, .parents = p0},
      {.struct_size = sizeof r1[0], .n_nodes = 5, .tokens = t1, .parents = p1},
      {.struct_size = sizeof r1[0], .n_nodes = 1, .tokens = t2, .parents = p2}};
  int all[NS] = {0, 1, 2};
  round_trip(&f, all, NS, r1);
  int32_t c0[] = {0, 1}, c1[] = {0, 2, 4}, c2[] = {0};
  commit_both(&f, 0, c0, 2);
  commit_both(&f, 1, c1, 3);
  commit_both(&f, 2, c2, 1);
  /* round 2: another order, a member left out, a tree grown by appending to a pending one */
  int32_t t3[] = {1, 2, 3, 4}, p3[] = {-1, 0, 0, 0};
  int32_t t4[] = {12, 13}, p4[] = {-1, 0};
  vspec_forward_batch r2[2] = {
      {.struct_size = sizeof r2[0], .n_nodes = 4, .tokens = t3, .parents = p3},
      {.struct_size = sizeof r2[0], .n_nodes = 2, .tokens = t4, .parents = p4}};
  int some[2] = {2, 0};
  round_trip(&f, some, 2, r2);
  int32_t t5[] = {14, 15}, p5[] = {1, 4};
  vspec_forward_batch r3[2] = {
      {.struct_size = sizeof r3[0], .n_nodes = 2, .tokens = t5, .parents = p5, .append = 1},
      {.struct_size = sizeof r3[0], .n_nodes = 1, .tokens = t2, .parents = p2}};
  int grow[2] = {2, 1};
  round_trip(&f, grow, 2, r3);
  int32_t c3[] = {0, 1, 4};
  commit_both(&f, 2, c3, 3);

  /* A member with a bad batch (a token outside the vocabulary): the call fails naming it,
   * and no session changed: session 0 keeps the node it had pending, and growing and
   * committing from there matches the reference. */
  int32_t t6[] = {3}, p6[] = {-1}, t7[] = {9}, p7[] = {0}, bad_tok[] = {f.V + 3};
  vspec_forward_batch one = {.struct_size = sizeof one, .n_nodes = 1, .tokens = t6,
                             .parents = p6};
  int first[1] = {0};
  round_trip(&f, first, 1, &one);
  vspec_forward_batch bad[2] = {
      {.struct_size = sizeof bad[0], .n_nodes = 3, .tokens = t0, .parents = p0, .append = 1},
      {.struct_size = sizeof bad[0], .n_nodes = 1, .tokens = bad_tok, .parents = p6}};
  vspec_session *ss[2] = {f.a[0], f.a[1]};
  const vspec_forward_batch *bs[2] = {&bad[0], &bad[1]};
  float *scratch = malloc((size_t)6 * f.V * sizeof(float));
  vspec_forward_out o = {.struct_size = sizeof o, .logits = scratch};
  vspec_forward_out *os[2] = {&o, &o};
  assert_int_not_equal(f.t->vt->forward_multi(f.batch_dev, ss, bs, os, 2, err, sizeof err), 0);
  assert_non_null(strstr(err, "session 1"));
  /* the same session twice is refused */
  ss[1] = f.a[0];
  bs[1] = &bad[0];
  assert_int_equal(f.t->vt->forward_multi(f.batch_dev, ss, bs, os, 2, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "twice"));
  free(scratch);
  vspec_forward_batch grow1[2] = {
      {.struct_size = sizeof grow1[0], .n_nodes = 1, .tokens = t7, .parents = p7, .append = 1},
      r1[2]};
  int pair[2] = {0, 1};
  round_trip(&f, pair, 2, grow1);
  int32_t c4[] = {0, 1};
  commit_both(&f, 0, c4, 2);
  commit_both(&f, 1, c2, 1);
  round_trip(&f, all, NS, r1);
  close_fixture(&f);
}

static void test_forward_multi_micro(void **state) {
  (void)state;
  check_forward_multi("tests/golden/micro_c2i", 0, BATCH_OPS);
}

/* The shipped model: its width takes the linear layers onto other kernels' paths. */
static void test_forward_multi_fmnist(void **state) {
  (void)state;
  check_forward_multi("models/fmnist", 0, BATCH_OPS);
}

/* On the fused ops (a GPU's default, multi=fused here): the same answers, and 5 ops per layer
 * with the batch ops whatever the sessions, 3 + 2 x sessions without them (a table that lacks
 * them, or multi=sessions), where the unfused path issues 12 + 3 x rows. */
static void test_forward_multi_fused(void **state) {
  (void)state;
  check_forward_multi("tests/golden/micro_c2i", 2, BATCH_OPS);
  check_forward_multi("models/fmnist", 8, BATCH_OPS);
  check_forward_multi("tests/golden/micro_c2i", 2, BATCH_NO_OPS);
  check_forward_multi("models/fmnist", 8, BATCH_NO_OPS);
  check_forward_multi("tests/golden/micro_c2i", 2, BATCH_SESSIONS);
}

/* Batches through graphs (multi=fused, graphs=on; gpt_multi.c): a graph per batch shape on
 * the batch's device, recorded the second time the shape comes and replayed from then on,
 * reading the sessions as uploaded for each batch: the same shape with the sessions in another
 * order, other members, another lead, caches one token longer each round. Every answer
 * as the sessions alone (round_trip); a replay issues the launch and the head, not the 13
 * ops of micro_c2i's trunk and head; multi_graphs=off keeps every batch eager. */
static void graph_rounds(multi_fixture *f, int replays_expected) {
  /* (lead first) rows 2, 1, 2: {0,1,2} and {0,2,1} are one shape (5 rows), as are {1,0}
   * and {1,2} (3 rows) */
  static const int order[][3] = {{0, 1, 2},  {0, 1, 2},  {0, 2, 1},  {0, 1, 2},
                                 {1, 0, -1}, {1, 0, -1}, {1, 2, -1}, {0, 2, 1},
                                 {0, 1, -1}, {0, 1, -1}, {0, 1, 2}};
  int32_t tok[NS], par[1] = {-1}, path[1] = {0};
  int replays = 0;
  for (size_t r = 0; r < sizeof order / sizeof order[0]; r++) {
    int count = order[r][2] < 0 ? 2 : 3;
    vspec_forward_batch b[NS];
    for (int j = 0; j < count; j++) {
      tok[j] = (int32_t)((7 * r + 3 * j + 1) % (size_t)f->V);
      b[j] = (vspec_forward_batch){.struct_size = sizeof b[0], .n_nodes = 1, .tokens = &tok[j],
                                   .parents = par};
    }
    round_trip(f, order[r], count, b);
    printf("  batch %zu of sessions %d %d %d: %llu ops\n", r, order[r][0], order[r][1],
           count > 2 ? order[r][2] : -1, (unsigned long long)f->last_ops);
    replays += f->last_ops < 13;
    for (int j = 0; j < count; j++) commit_both(f, order[r][j], path, 1);
    /* the batch device's scratch reallocated (a larger op elsewhere): graphs made before are
     * stale (ops.h, graph_launch) */
    if (r == 3)
      assert_int_equal(vs_dev_ops(f->batch_dev)->reserve_scratch(f->batch_dev, (size_t)96 << 20),
                       VSPEC_OK);
  }
  /* round 1 records the 5-row shape and launches it, 2 and 3 replay it; round 5 records the
   * 3-row shape (the 5-row graph replayed there would read a third session that is not), 6
   * replays it with another member, 8 and 9 under another lead; round 7 finds the 5-row graph
   * stale (the scratch grew after round 3) and runs eagerly, 10 records it again */
  assert_int_equal(replays, replays_expected);
}

static void test_forward_multi_graphs(void **state) {
  (void)state;
  for (int on = 1; on >= 0; on--) {
    multi_fixture f = {0};
    setenv("VSPEC_MULTI", "fused", 1);
    setenv("VSPEC_GRAPHS", "on", 1);
    setenv("VSPEC_MULTI_GRAPHS", on ? "on" : "off", 1);
    f.batch_ops = BATCH_OPS;
    open_fixture(&f, "tests/golden/micro_c2i");
    unsetenv("VSPEC_MULTI");
    unsetenv("VSPEC_GRAPHS");
    unsetenv("VSPEC_MULTI_GRAPHS");
    f.fused_layers = 2;
    f.graphs = 1;
    graph_rounds(&f, on ? 8 : 0);
    close_fixture(&f);
  }
}

/* ---- the gate's scheduling, with a fake backend ---------------------------------------- */

/* A fake backend's session: its answer to token x is 1000 * id + x + 0.5 * (forwards so far),
 * so a request answered with another session's state shows. */
struct vspec_session {
  int id, forwards;
  vspec_dev *dev; /* the job's own device, or NULL */
  atomic_int multis; /* batches of several sessions it was in */
};

static vspec_dev *fake_dev, *fake_dev2; /* the gates' batch devices (lanes) */
static atomic_int fake_multi_calls, fake_max_count, fake_sessions_in_multi;
static atomic_int fake_errors;          /* a batch on an unknown or busy lane device */
static atomic_int fake_busy[2], fake_parallel, fake_max_parallel;
static atomic_int fake_order_errors; /* a batch whose lane was not ordered after its sessions */
static uint64_t fake_lane_orders[2]; /* each lane's `orders` at its last batch's end */

static uint64_t dev_orders(vspec_dev *dev) {
  vs_dev_counters c;
  vs_dev_counters_get(dev, &c);
  return c.orders;
}

static void fake_raise(atomic_int *max, int v) {
  int m = atomic_load(max);
  while (v > m && !atomic_compare_exchange_weak(max, &m, v)) {
  }
}

static int fake_forward(vspec_session *s, const vspec_forward_batch *b, vspec_forward_out *out,
                        char *err, size_t errlen) {
  for (int i = 0; i < b->n_nodes; i++)
    out->logits[i] = 1000.0f * s->id + (float)b->tokens[i] + 0.5f * (float)s->forwards;
  s->forwards++;
  return VSPEC_OK;
}

static int fake_forward_multi(vspec_dev *dev, vspec_session *const *s,
                              const vspec_forward_batch *const *b,
                              vspec_forward_out *const *out, int32_t count, char *err,
                              size_t errlen) {
  int lane = dev == fake_dev ? 0 : dev == fake_dev2 ? 1 : -1;
  if (lane < 0) {
    atomic_fetch_add(&fake_errors, 1);
    return VSPEC_EINVAL;
  }
  if (atomic_fetch_add(&fake_busy[lane], 1) != 0) atomic_fetch_add(&fake_errors, 1);
  fake_raise(&fake_max_parallel, atomic_fetch_add(&fake_parallel, 1) + 1);
  atomic_fetch_add(&fake_multi_calls, 1);
  atomic_fetch_add(&fake_sessions_in_multi, count);
  /* The gate ordered the lane after each session's own device just before the call (one
   * order per session with a device: each job has its own here); the lane is this thread's. */
  int with_dev = 0;
  for (int i = 0; i < count; i++) with_dev += s[i]->dev != NULL;
  if (dev_orders(dev) - fake_lane_orders[lane] != (uint64_t)with_dev)
    atomic_fetch_add(&fake_order_errors, 1);
  for (int i = 0; i < count; i++) atomic_fetch_add(&s[i]->multis, 1);
  fake_raise(&fake_max_count, count);
  usleep(500); /* the compute */
  for (int i = 0; i < count; i++) fake_forward(s[i], b[i], out[i], err, errlen);
  fake_lane_orders[lane] = dev_orders(dev);
  atomic_fetch_sub(&fake_parallel, 1);
  atomic_fetch_sub(&fake_busy[lane], 1);
  return VSPEC_OK;
}

static const vspec_backend_vtable fake_vt = {.struct_size = sizeof fake_vt,
                                             .forward = fake_forward,
                                             .forward_multi = fake_forward_multi};
static vspec_model *const fake_model = (vspec_model *)&fake_vt; /* any distinct pointer */

typedef struct fake_job {
  vs_forward_gate *g;
  vs_backend_model t;
  vspec_session s;
  int forwards;
  useconds_t think_us; /* between forwards (drafting) */
  useconds_t hold_us;  /* entered, sends nothing for this long, then leaves */
  int wrong;           /* answers that were not this session's */
  double elapsed;      /* from entering the gate to leaving it */
  pthread_barrier_t *entered; /* optional: wait here once entered, until the others have */
} fake_job;

static void *fake_job_main(void *arg) {
  fake_job *j = arg;
  vs_forward_gate_enter(j->g);
  if (j->entered) pthread_barrier_wait(j->entered);
  double t0 = vs_now();
  if (j->hold_us) usleep(j->hold_us);
  for (int k = 0; k < j->forwards; k++) {
    int32_t tok = k % 7, parent = -1;
    float logit = -1;
    vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = 1, .tokens = &tok,
                             .parents = &parent};
    vspec_forward_out o = {.struct_size = sizeof o, .logits = &logit};
    char err[VSPEC_ERRLEN];
    int want_fw = j->s.forwards;
    if (vs_forward_gate_forward(j->g, &j->t, &j->s, j->s.dev, &b, &o, err, sizeof err)) {
      j->wrong++;
      continue;
    }
    j->wrong += logit != 1000.0f * j->s.id + (float)tok + 0.5f * (float)want_fw;
    /* back from the gate: the job's device was ordered after every batch it was in (and
     * after no forward it ran alone) */
    if (j->s.dev && dev_orders(j->s.dev) != (uint64_t)atomic_load(&j->s.multis))
      atomic_fetch_add(&fake_order_errors, 1);
    if (j->think_us) usleep(j->think_us + (useconds_t)(k * 37 % 50));
  }
  vs_forward_gate_leave(j->g);
  j->elapsed = vs_now() - t0;
  return NULL;
}

static void run_fake_jobs(fake_job *jobs, int n) {
  pthread_t th[8];
  for (int i = 0; i < n; i++) {
    jobs[i].t = (vs_backend_model){.vt = &fake_vt, .model = fake_model};
    jobs[i].s.id = i + 1;
    assert_int_equal(pthread_create(&th[i], NULL, fake_job_main, &jobs[i]), 0);
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static void reset_fake(void) {
  atomic_store(&fake_multi_calls, 0);
  atomic_store(&fake_max_count, 0);
  atomic_store(&fake_sessions_in_multi, 0);
  atomic_store(&fake_errors, 0);
  atomic_store(&fake_max_parallel, 0);
  atomic_store(&fake_order_errors, 0);
  fake_lane_orders[0] = dev_orders(fake_dev);
  fake_lane_orders[1] = dev_orders(fake_dev2);
}

/* Jobs in step batch together, never more than max_batch (7 jobs, batches of 3: four wait
 * while one runs), every answer is the asker's. */
static void test_gate_batches_in_step(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vs_forward_gate *g;
  assert_int_equal(vs_forward_gate_create(3, 0.5, &fake_dev, 1, &g, err, sizeof err), 0);
  reset_fake();
  fake_job jobs[7];
  memset(jobs, 0, sizeof jobs);
  for (int i = 0; i < 7; i++) jobs[i] = (fake_job){.g = g, .forwards = 40, .think_us = 200};
  run_fake_jobs(jobs, 7);
  vs_forward_gate_stats st;
  vs_forward_gate_get_stats(g, &st);
  for (int i = 0; i < 7; i++) {
    assert_int_equal(jobs[i].wrong, 0);
    assert_int_equal(jobs[i].s.forwards, 40);
  }
  assert_int_equal((int)st.forwards, 280);
  assert_true(atomic_load(&fake_max_count) <= 3);
  /* in step, almost every forward shares its batch: fewer than half as many batches */
  if (!(st.batches * 2 < st.forwards))
    fail_msg("%llu forwards in %llu batches: no batching", (unsigned long long)st.forwards,
             (unsigned long long)st.batches);
  assert_int_equal(atomic_load(&fake_sessions_in_multi) + (int)(st.batches - st.multi), 280);
  assert_int_equal(atomic_load(&fake_errors), 0);
  assert_int_equal(atomic_load(&fake_max_parallel), 1);
  vs_forward_gate_destroy(&g);
  assert_null(g);
}

/* Two lanes: batches of different jobs run at once, never two on one lane's device. */
static void test_gate_lanes(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vs_forward_gate *g;
  vspec_dev *devs[2] = {fake_dev, fake_dev2};
  assert_int_equal(vs_forward_gate_create(2, 0.5, devs, 2, &g, err, sizeof err), 0);
  reset_fake();
  fake_job jobs[4];
  memset(jobs, 0, sizeof jobs);
  for (int i = 0; i < 4; i++) jobs[i] = (fake_job){.g = g, .forwards = 40, .think_us = 200};
  run_fake_jobs(jobs, 4);
  for (int i = 0; i < 4; i++) assert_int_equal(jobs[i].wrong, 0);
  assert_int_equal(atomic_load(&fake_errors), 0);
  assert_true(atomic_load(&fake_max_count) <= 2);
  assert_int_equal(atomic_load(&fake_max_parallel), 2);
  vs_forward_gate_destroy(&g);
}

/* Jobs on devices of their own (as a daemon's GPU workers have, each its own stream): the
 * gate orders a batch's lane after every session's device before the batch and each device
 * after the lane before its job goes on (the checks in fake_forward_multi and fake_job_main),
 * and a forward that runs alone is not ordered. Counted on the CPU device, where ordering is
 * free: what a GPU is asked to do (kernels/cuda: an event wait per order, no host wait). */
static void test_gate_orders_devices(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vs_forward_gate *g;
  vspec_dev *devs[2] = {fake_dev, fake_dev2};
  assert_int_equal(vs_forward_gate_create(3, 0.5, devs, 2, &g, err, sizeof err), 0);
  reset_fake();
  fake_job jobs[5];
  memset(jobs, 0, sizeof jobs);
  for (int i = 0; i < 5; i++) {
    jobs[i] = (fake_job){.g = g, .forwards = 30, .think_us = 150};
    assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &jobs[i].s.dev, err, sizeof err), 0);
  }
  uint64_t lanes0 = dev_orders(fake_dev) + dev_orders(fake_dev2);
  run_fake_jobs(jobs, 5);
  vs_forward_gate_stats st;
  vs_forward_gate_get_stats(g, &st);
  assert_int_equal(atomic_load(&fake_order_errors), 0);
  assert_int_equal(atomic_load(&fake_errors), 0);
  assert_true(st.multi > 0);
  /* every session in a batch of several: one order on its lane, one on its own device */
  uint64_t on_jobs = 0;
  for (int i = 0; i < 5; i++) {
    assert_int_equal(jobs[i].wrong, 0);
    on_jobs += dev_orders(jobs[i].s.dev);
    vs_dev_destroy(jobs[i].s.dev);
  }
  uint64_t on_lanes = dev_orders(fake_dev) + dev_orders(fake_dev2) - lanes0;
  assert_int_equal(on_jobs, (uint64_t)atomic_load(&fake_sessions_in_multi));
  assert_int_equal(on_lanes, on_jobs);
  assert_int_equal(st.orders, on_lanes + on_jobs);
  vs_forward_gate_destroy(&g);
}

/* An idle job (entered, sends nothing for hold_us, leaves) beside one that sends `forwards`
 * forwards through a gate with the given wait limit; returns the sender's time. */
static double idle_beside_sender(double max_wait_s, useconds_t hold_us, int forwards,
                                 vs_forward_gate_stats *st) {
  char err[VSPEC_ERRLEN];
  vs_forward_gate *g;
  assert_int_equal(vs_forward_gate_create(4, max_wait_s, &fake_dev, 1, &g, err, sizeof err), 0);
  fake_job jobs[2];
  memset(jobs, 0, sizeof jobs);
  /* both in the gate before either goes on (thread start-up order is not the test) */
  pthread_barrier_t entered;
  pthread_barrier_init(&entered, NULL, 2);
  jobs[0] = (fake_job){.g = g, .forwards = 0, .hold_us = hold_us, .entered = &entered};
  jobs[1] = (fake_job){.g = g, .forwards = forwards, .entered = &entered};
  run_fake_jobs(jobs, 2);
  pthread_barrier_destroy(&entered);
  vs_forward_gate_get_stats(g, st);
  assert_int_equal(jobs[1].wrong, 0);
  vs_forward_gate_destroy(&g);
  return jobs[1].elapsed;
}

/* A job that entered but sends nothing holds the others up for max_wait_s per forward,
 * not for as long as it idles. */
static void test_gate_wait_limit(void **state) {
  (void)state;
  vs_forward_gate_stats st;
  double t = idle_beside_sender(0.03, 1500000, 4, &st);
  /* each forward waited out its limit (the idle job is in the gate all along) */
  assert_int_equal((int)st.timeouts, 4);
  if (!(t >= 0.11 && t < 1.0)) fail_msg("4 forwards with a 30 ms wait limit took %.2f s", t);
}

/* A job leaving the gate releases a forward waiting for it at once (the wait limit is long). */
static void test_gate_leave_wakes(void **state) {
  (void)state;
  vs_forward_gate_stats st;
  double t = idle_beside_sender(8.0, 200000, 1, &st);
  /* it waited for the idle job (0.2 s), not for its 8 s limit */
  if (!(t >= 0.19 && t < 4.0)) fail_msg("the waiter took %.2f s (the leave came at 0.2 s)", t);
  assert_int_equal((int)st.timeouts, 0);
}

static void test_gate_bad_config(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vs_forward_gate *g = (vs_forward_gate *)&g;
  assert_int_equal(vs_forward_gate_create(0, 0.01, &fake_dev, 1, &g, err, sizeof err), VSPEC_ERANGE);
  assert_null(g);
  assert_non_null(strstr(err, "batch = 0"));
  assert_int_equal(vs_forward_gate_create(2, 0, &fake_dev, 1, &g, err, sizeof err), VSPEC_ERANGE);
  vspec_dev *none = NULL;
  assert_int_equal(vs_forward_gate_create(2, 0.01, &none, 1, &g, err, sizeof err), VSPEC_EINVAL);
  assert_int_equal(vs_forward_gate_create(2, 0.01, &fake_dev, 0, &g, err, sizeof err),
                   VSPEC_ERANGE);
  vs_forward_gate_destroy(&g); /* NULL is fine */
  /* no gate: the backend's own forward, on the caller's thread */
  vs_backend_model t = {.vt = &fake_vt, .model = fake_model};
  vspec_session s = {.id = 9, .dev = fake_dev};
  int32_t tok = 4, parent = -1;
  float logit = -1;
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = 1, .tokens = &tok,
                           .parents = &parent};
  vspec_forward_out o = {.struct_size = sizeof o, .logits = &logit};
  reset_fake();
  assert_int_equal(vs_forward_gate_forward(NULL, &t, &s, NULL, &b, &o, err, sizeof err), 0);
  assert_true(logit == 9004.0f);
  assert_int_equal(atomic_load(&fake_multi_calls), 0);
  assert_int_equal(dev_orders(fake_dev), fake_lane_orders[0]); /* nothing to order */
}

/* ---- whole jobs through a gate ---------------------------------------------------------- */

typedef struct real_job {
  vs_models *models;
  vs_forward_gate *gate;
  const char *method;
  uint64_t seed;
  int32_t tokens[1024];
  uint64_t orders; /* its device's, at the end */
  int rc;
  char err[VSPEC_ERRLEN];
} real_job;

static void *real_job_main(void *arg) {
  real_job *j = arg;
  vspec_dev *dev;
  if ((j->rc = vs_dev_create(vs_cpu_ops(), 1, &dev, j->err, sizeof j->err))) return NULL;
  vs_job job = {.method = vs_method_of(j->method),
                .class_label = (int)(j->seed % 10), .seed = j->seed,
                .sampling = j->models->defaults, .gate = j->gate};
  vs_metrics mt;
  j->rc = vs_generate(j->models, dev, &job, j->tokens, &mt, j->err, sizeof j->err);
  j->orders = dev_orders(dev);
  vs_dev_destroy(dev);
  return NULL;
}

/* Three jobs at once through a gate give the images they give alone (token maps agree: the
 * batched logits differ from the lone ones by float rounding only, which moves a sample only
 * where it falls on a boundary; at most 2 % of tokens may differ), and they did batch.
 * fused: batches on the fused ops (multi=fused, a GPU's default), the speculative method
 * only. */
static void gate_jobs(int fused) {
  char err[VSPEC_ERRLEN];
  vspec_dev *dev, *gate_dev;
  vs_models *models;
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err), 0);
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 2, &gate_dev, err, sizeof err), 0);
  if (fused) setenv("VSPEC_MULTI", "fused", 1);
  int rc = vs_models_open(reg, &host, dev, "models/fmnist", VS_ROLE_ALL, &models, err,
                          sizeof err);
  unsetenv("VSPEC_MULTI");
  if (rc) fail_msg("%s", err);
  int N = models->target.info.grid_h * models->target.info.grid_w;
  assert_true(N <= 1024);
  /* Under the sanitizers (ten times slower) the speculative method alone: its jobs send both
   * target and draft batches through the gate. */
  const char *methods[] = {"sd:exact@standard:shape=chain,depth=3,drafter=model", "ar"};
#ifdef VSPEC_SANITIZED
  const size_t n_methods = 1;
#else
  const size_t n_methods = fused ? 1 : sizeof methods / sizeof *methods;
#endif
  for (size_t m = 0; m < n_methods; m++) {
    vs_forward_gate *g;
    assert_int_equal(vs_forward_gate_create(3, 0.2, &gate_dev, 1, &g, err, sizeof err), 0);
    uint64_t gate_orders0 = dev_orders(gate_dev);
    real_job batched[3], alone[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
      alone[i] = (real_job){.models = models, .method = methods[m], .seed = 11 + (uint64_t)i};
      batched[i] = alone[i];
      batched[i].gate = g;
      real_job_main(&alone[i]);
      if (alone[i].rc) fail_msg("%s", alone[i].err);
    }
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, real_job_main, &batched[i]);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    vs_forward_gate_stats st;
    vs_forward_gate_get_stats(g, &st);
    /* each job's device was ordered after every batch of several it was in, the batches'
     * device before each (lone jobs: never) */
    uint64_t on_jobs = 0;
    for (int i = 0; i < 3; i++) {
      assert_int_equal(alone[i].orders, 0);
      on_jobs += batched[i].orders;
    }
    assert_true(on_jobs > 0);
    assert_int_equal(st.orders, 2 * on_jobs);
    assert_int_equal(dev_orders(gate_dev) - gate_orders0, on_jobs);
    for (int i = 0; i < 3; i++) {
      if (batched[i].rc) fail_msg("%s: %s", methods[m], batched[i].err);
      int diff = 0;
      for (int k = 0; k < N; k++) diff += batched[i].tokens[k] != alone[i].tokens[k];
      if (diff * 50 > N) fail_msg("%s job %d: %d of %d tokens differ", methods[m], i, diff, N);
    }
    if (!(st.multi * 2 > st.batches))
      fail_msg("%s: %llu of %llu batches held several jobs", methods[m],
               (unsigned long long)st.multi, (unsigned long long)st.batches);
    vs_forward_gate_destroy(&g);
  }
  vs_models_close(models);
  vs_dev_destroy(dev);
  vs_dev_destroy(gate_dev);
}

static void test_gate_jobs_match_alone(void **state) {
  (void)state;
  gate_jobs(0);
}

static void test_gate_jobs_fused(void **state) {
  (void)state;
#ifdef VSPEC_SANITIZED
  /* whole jobs repeat under the sanitizers what test_forward_multi_fused checks per forward
   * (the fused ops' memory) and test_gate_jobs_match_alone per job (the gate's): make test's
   * ASan pass stays short */
  print_message("skipped under the sanitizers (the fused forwards run above)\n");
  skip();
#endif
  gate_jobs(1);
}

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&host, vs_cpu_ops());
  host_nobatch = host;
  host_nobatch.dev_ops = vt_ops_nobatch;
  if (vs_registry_open(dir, &host, &reg, err, sizeof err) ||
      vs_dev_create(vs_cpu_ops(), 1, &fake_dev, err, sizeof err) ||
      vs_dev_create(vs_cpu_ops(), 1, &fake_dev2, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forward_multi_micro),
      cmocka_unit_test(test_forward_multi_fmnist),
      cmocka_unit_test(test_forward_multi_fused),
      cmocka_unit_test(test_forward_multi_graphs),
      cmocka_unit_test(test_gate_batches_in_step),
      cmocka_unit_test(test_gate_lanes),
      cmocka_unit_test(test_gate_orders_devices),
      cmocka_unit_test(test_gate_wait_limit),
      cmocka_unit_test(test_gate_leave_wakes),
      cmocka_unit_test(test_gate_bad_config),
      cmocka_unit_test(test_gate_jobs_match_alone),
      cmocka_unit_test(test_gate_jobs_fused),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_dev_destroy(fake_dev);
  vs_dev_destroy(fake_dev2);
  vs_registry_close(reg);
  return rc;
}
