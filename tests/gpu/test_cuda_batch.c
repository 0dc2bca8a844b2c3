/* tests/gpu/test_cuda_batch.c - cross-job batching on one GPU (issue 29 item 6): sessions of
 * several contexts (a daemon's workers, each with its own stream) batched through a forward
 * gate on a context of its own (the gate's lane), which core/forward_gate.c orders after each
 * session's stream before the batch and each session's stream after it (vs_dev_order: an
 * event wait, no host wait).
 *  - A GPT-B-shaped random model (3 of GPT-B's layers, fp32 parity): three threads, each with
 *    its own context and session, run rounds in which the session first forwards a 48-node
 *    tree alone asking for no output (its keys and values are still being written on its
 *    stream when the thread goes on: only the upload before the layers waits), then sends 8
 *    nodes appended to that tree through the gate, which batches the three on the lane. The
 *    logits equal those of the same rounds run alone on one context, within the fp32
 *    tolerance of the other GPU tests (products with more rows round differently). Without
 *    the ordering the lane would read caches that the sessions' streams are still writing.
 *    Both ways a batch runs (multi=fused, the GPU's default, and multi=unfused).
 *  - Counters: a batched forward adds one order to its session's context and no wait there;
 *    the lane gets one order per session of the batch.
 *  - Whole jobs on models/fmnist, AR and exact SD with the draft GPT: three at once through a
 *    gate, each on its own context, give the tokens they give alone (at most 2 % differ: the
 *    batched logits differ by rounding only) and did batch.
 * Without a usable GPU the binary exits 77 (skipped). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <unistd.h>

#include "bench/bench.h"
#include "core/engine.h"
#include "core/forward_gate.h"
#include "core/host.h"
#include "core/metrics.h"
#include "core/models.h"
#include "core/registry.h"
#include "tests/gpu/gpu_testutil.h"
#include "tests/support/method_of.h"

#define FP32_RTOL 1e-4

enum { NJ = 3, ROUNDS = 4, TREE = 48, APPEND = 8, MAXN = 128, PATH = 6 };

static vspec_host g_host;
static vs_registry *g_reg;

static uint64_t orders_of(vspec_dev *dev, uint64_t *syncs) {
  vs_dev_counters c;
  vs_dev_counters_get(dev, &c);
  if (syncs) *syncs = c.syncs;
  return c.orders;
}

/* Round r of job j: the alone tree (a binary tree of TREE nodes), the appended nodes (children
 * of the tree's last nodes) and the committed path (the tree's leftmost chain). */
static void round_inputs(int j, int r, int V, int32_t *tree_tok, int32_t *tree_par,
                         int32_t *app_tok, int32_t *app_par) {
  vspec_rng rng;
  vs_rng_init(&rng, 1000 + 17 * (uint64_t)j + (uint64_t)r, 0);
  for (int i = 0; i < TREE; i++) {
    tree_tok[i] = (int32_t)(vs_rng_uniform(&rng) * V);
    tree_par[i] = i == 0 ? -1 : (i - 1) / 2;
  }
  for (int i = 0; i < APPEND; i++) {
    app_tok[i] = (int32_t)(vs_rng_uniform(&rng) * V);
    app_par[i] = TREE - 1 - i; /* indices into the pending tree */
  }
}

static const int32_t k_path[PATH] = {0, 1, 3, 7, 15, 31};

typedef struct batch_job {
  const vs_backend_model *t;
  vs_forward_gate *g;   /* NULL: the reference, alone */
  vspec_dev *dev;
  vspec_session *s;
  int j, V;
  float *logits;        /* [ROUNDS][APPEND * 2 * V] */
  int batched, bad_counts;
  char err[VSPEC_ERRLEN];
  int rc;
} batch_job;

static int bj_round(batch_job *b, int r) {
  int32_t tt[TREE], tp[TREE], at[APPEND], ap[APPEND];
  round_inputs(b->j, r, b->V, tt, tp, at, ap);
  const vspec_backend_vtable *vt = b->t->vt;
  vspec_forward_batch tree = {.struct_size = sizeof tree, .n_nodes = TREE, .tokens = tt,
                              .parents = tp};
  vspec_forward_out none = {.struct_size = sizeof none};
  int rc = vt->forward(b->s, &tree, &none, b->err, sizeof b->err);
  if (rc) return rc;
  vspec_forward_batch app = {.struct_size = sizeof app, .n_nodes = APPEND, .tokens = at,
                             .parents = ap, .append = 1};
  vspec_forward_out o = {.struct_size = sizeof o,
                         .logits = b->logits + (size_t)r * APPEND * 2 * b->V};
  uint64_t s0, s1, o0 = orders_of(b->dev, &s0);
  rc = vs_forward_gate_forward(b->g, b->t, b->s, b->dev, &app, &o, b->err, sizeof b->err);
  if (rc) return rc;
  uint64_t o1 = orders_of(b->dev, &s1);
  /* in a batch of several: ordered once after the lane, and never waited for */
  if (o1 - o0 == 1) b->batched++, b->bad_counts += s1 != s0;
  else b->bad_counts += o1 != o0;
  return vt->commit(b->s, k_path, PATH, b->err, sizeof b->err);
}

static void *bj_main(void *arg) {
  batch_job *b = arg;
  if (b->g) vs_forward_gate_enter(b->g);
  for (int r = 0; r < ROUNDS && !b->rc; r++) b->rc = bj_round(b, r);
  if (b->g) vs_forward_gate_leave(b->g);
  return NULL;
}

static vspec_session *bj_session(const vs_backend_model *t, vspec_dev *dev, int j) {
  vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = 100 + j, .rows = 2,
                              .max_nodes = MAXN};
  vspec_session *s = NULL;
  char err[VSPEC_ERRLEN];
  if (t->vt->session_open(t->model, dev, &cfg, &s, err, sizeof err)) fail_msg("%s", err);
  float *l = gt_host((size_t)2 * t->info.vocab);
  vspec_forward_out o = {.struct_size = sizeof o, .logits = l};
  if (t->vt->prefill(s, &o, err, sizeof err)) fail_msg("prefill: %s", err);
  free(l);
  return s;
}

static void gptb_batches(const char *multi) {
  char err[VSPEC_ERRLEN], path[128], params[64];
  snprintf(params, sizeof params, "max_nodes=128,multi=%s", multi);
  snprintf(path, sizeof path, "/tmp/vspec-gptb-batch-%d.safetensors", (int)getpid());
  if (vs_bench_write_random_gpt(path, 3, 768, 12, 12, 16384, 16, 1000, 5, err, sizeof err))
    fail_msg("%s", err);
  vspec_dev *load = gt_gpu(VS_PRECISION_FP32), *lane = gt_gpu(VS_PRECISION_FP32);
  vs_backend_model t;
  if (vs_backend_model_load(g_reg, &g_host, load, "llamagen", path, params, &t, err,
                            sizeof err))
    fail_msg("%s", err);
  unlink(path);
  vs_dev_sync(load); /* the weights, before other contexts read them (cuda_dev.h) */
  int V = t.info.vocab;
  size_t per = (size_t)ROUNDS * APPEND * 2 * V;
  batch_job ref[NJ], bat[NJ];
  for (int j = 0; j < NJ; j++) {
    ref[j] = (batch_job){.t = &t, .dev = load, .j = j, .V = V, .logits = gt_host(per)};
    ref[j].s = bj_session(&t, load, j);
    bj_main(&ref[j]);
    if (ref[j].rc) fail_msg("alone, job %d: %s", j, ref[j].err);
  }
  vs_forward_gate *g;
  assert_int_equal(vs_forward_gate_create(NJ, 2.0, &lane, 1, &g, err, sizeof err), 0);
  uint64_t lane0 = orders_of(lane, NULL);
  pthread_t th[NJ];
  for (int j = 0; j < NJ; j++) {
    vspec_dev *dev = gt_gpu(VS_PRECISION_FP32);
    bat[j] = (batch_job){.t = &t, .g = g, .dev = dev, .j = j, .V = V, .logits = gt_host(per)};
    bat[j].s = bj_session(&t, dev, j);
  }
  for (int j = 0; j < NJ; j++) pthread_create(&th[j], NULL, bj_main, &bat[j]);
  for (int j = 0; j < NJ; j++) pthread_join(th[j], NULL);
  vs_forward_gate_stats st;
  vs_forward_gate_get_stats(g, &st);
  int batched = 0;
  for (int j = 0; j < NJ; j++) {
    if (bat[j].rc) fail_msg("batched, job %d: %s", j, bat[j].err);
    assert_int_equal(bat[j].bad_counts, 0);
    batched += bat[j].batched;
    if (vs_dev_check(bat[j].dev, err, sizeof err)) fail_msg("device error: %s", err);
    gt_close("batched logits against alone", bat[j].logits, ref[j].logits, per, FP32_RTOL, 0);
  }
  printf("multi=%s: %d of %d forwards batched with others; %llu batches, %llu orders\n", multi,
         batched, NJ * ROUNDS, (unsigned long long)st.batches, (unsigned long long)st.orders);
  assert_true(st.multi > 0 && batched > 0);
  assert_int_equal(orders_of(lane, NULL) - lane0, (uint64_t)batched);
  assert_int_equal(st.orders, 2 * (uint64_t)batched);
  vs_forward_gate_destroy(&g);
  for (int j = 0; j < NJ; j++) {
    t.vt->session_close(ref[j].s);
    t.vt->session_close(bat[j].s);
    vs_dev_destroy(bat[j].dev);
    free(ref[j].logits);
    free(bat[j].logits);
  }
  vs_backend_model_unload(&t);
  vs_dev_destroy(lane);
  vs_dev_destroy(load);
}

static void test_gptb_batches_fused(void **state) {
  (void)state;
  gptb_batches("fused");
}

static void test_gptb_batches_unfused(void **state) {
  (void)state;
  gptb_batches("unfused");
}

/* ---- whole jobs ------------------------------------------------------------------------- */

typedef struct real_job {
  vs_models *models;
  vs_forward_gate *gate;
  const char *method;
  uint64_t seed;
  int32_t tokens[1024];
  uint64_t orders;
  int rc;
  char err[VSPEC_ERRLEN];
} real_job;

static void *real_job_main(void *arg) {
  real_job *j = arg;
  vspec_dev *dev = gt_gpu(VS_PRECISION_FP32); /* a worker's context: a stream of its own */
  vs_job job = {.method = vs_method_of(j->method), .class_label = (int)(j->seed % 10),
                .seed = j->seed, .sampling = j->models->defaults, .gate = j->gate};
  vs_metrics mt;
  j->rc = vs_generate(j->models, dev, &job, j->tokens, &mt, j->err, sizeof j->err);
  j->orders = orders_of(dev, NULL);
  vs_dev_destroy(dev);
  return NULL;
}

static void test_fmnist_jobs_match_alone(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vspec_dev *load = gt_gpu(VS_PRECISION_FP32), *lane = gt_gpu(VS_PRECISION_FP32);
  vs_models *models;
  if (vs_models_open(g_reg, &g_host, load, "models/fmnist", VS_ROLE_ALL, &models, err,
                     sizeof err))
    fail_msg("%s", err);
  vs_dev_sync(load);
  int N = models->target.info.grid_h * models->target.info.grid_w;
  assert_true(N <= 1024);
  const char *methods[] = {"ar", "sd:exact@standard:shape=chain,depth=3,drafter=model"};
  for (size_t m = 0; m < sizeof methods / sizeof *methods; m++) {
    vs_forward_gate *g;
    assert_int_equal(vs_forward_gate_create(NJ, 0.2, &lane, 1, &g, err, sizeof err), 0);
    real_job batched[NJ], alone[NJ];
    pthread_t th[NJ];
    for (int i = 0; i < NJ; i++) {
      alone[i] = (real_job){.models = models, .method = methods[m], .seed = 21 + (uint64_t)i};
      batched[i] = alone[i];
      batched[i].gate = g;
      real_job_main(&alone[i]);
      if (alone[i].rc) fail_msg("%s alone: %s", methods[m], alone[i].err);
    }
    for (int i = 0; i < NJ; i++) pthread_create(&th[i], NULL, real_job_main, &batched[i]);
    for (int i = 0; i < NJ; i++) pthread_join(th[i], NULL);
    vs_forward_gate_stats st;
    vs_forward_gate_get_stats(g, &st);
    uint64_t on_jobs = 0;
    for (int i = 0; i < NJ; i++) {
      if (batched[i].rc) fail_msg("%s batched: %s", methods[m], batched[i].err);
      int diff = 0;
      for (int k = 0; k < N; k++) diff += batched[i].tokens[k] != alone[i].tokens[k];
      if (diff * 50 > N) fail_msg("%s job %d: %d of %d tokens differ", methods[m], i, diff, N);
      on_jobs += batched[i].orders;
    }
    printf("%s: %llu forwards in %llu batches (%llu of several), %llu orders\n", methods[m],
           (unsigned long long)st.forwards, (unsigned long long)st.batches,
           (unsigned long long)st.multi, (unsigned long long)st.orders);
    assert_true(st.multi > 0);
    assert_int_equal(st.orders, 2 * on_jobs);
    vs_forward_gate_destroy(&g);
  }
  vs_models_close(models);
  vs_dev_destroy(lane);
  vs_dev_destroy(load);
}

static int setup(void **state) {
  (void)state;
  vs_dev_destroy(gt_gpu(VS_PRECISION_FP32)); /* skips (77) without a GPU */
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&g_host, vs_cpu_ops());
  if (vs_registry_open(dir, &g_host, &g_reg, err, sizeof err)) {
    fprintf(stderr, "registry: %s\n", err);
    return -1;
  }
  return 0;
}

static int teardown(void **state) {
  (void)state;
  vs_registry_close(g_reg);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gptb_batches_fused),
      cmocka_unit_test(test_gptb_batches_unfused),
      cmocka_unit_test(test_fmnist_jobs_match_alone),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
