/*
 * What a forward costs in ops, transfers and waits (kernels/op_counts.c): every device
 * context hands out a counting ops table, so a budget asserted here, on the CPU, holds on a
 * GPU too, where each op is a kernel launch and each transfer a trip over the bus.
 *
 * - Every op of the device's table is counted: a new op without a wrapper would escape the
 *   budget. Memory management is not counted, nor is the host-side RoPE table.
 * - Transfers count calls and bytes; a NULL device (host code's copies) counts nothing.
 * - vspecd counts the same at load and `vspec status` reports it per model.
 * - The budget of one LlamaGen forward (core/forward_timing.h, vs_count_forward) on the
 *   micro test model and on random GPTs of 2 to 4 layers, at 1, 2 and 16 nodes with 1 and 2
 *   CFG rows, on the fused ops of ABI 1.4: five ops per layer (norm + QKV + RoPE + KV store,
 *   tree attention over every CFG row, output projection + residual, norm + w1, w3 +
 *   SwiGLU, w2 + residual) and three per forward (the embedding gather, the final norm of
 *   the head rows, the head), whatever the node and row counts; one upload (tokens,
 *   positions, head rows, tree parents, cache slots and the tree's lengths together, exactly
 *   those bytes) and one download
 *   (the logits). Before the fused ops a forward issued (12 + 3 x rows) per layer plus 2 per
 *   node and row plus 2, with no upload; nothing may raise it unnoticed.
 * - Under graphs (ABI 1.5, llamagen graphs=on): a step issues one upload, one graph launch
 *   (one op) and one download, however many layers; the first forward of a node-count bucket
 *   records the budget above (counted as recorded, not issued) and launches it; after the
 *   device's scratch was reallocated a step runs eagerly (its graph is stale) and the next
 *   records again.
 * - With the verification walk on the device (ABI 1.6): one op more (the walk), one upload
 *   more (the tree) and the one download is the walk's result, not the logits.
 * - The timing of cross-job batches (costcurve --sessions) times one forward_multi of all the
 *   sessions per call.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "core/forward_timing.h"
#include "core/host.h"
#include "core/models.h"
#include "kernels/vs_kernels.h"
#include "tests/support/daemon_harness.h"

/* Members that are not work: never counted. */
static const size_t uncounted[] = {
    offsetof(vspec_ops, alloc),        offsetof(vspec_ops, free),
    offsetof(vspec_ops, upload),       offsetof(vspec_ops, download),
    offsetof(vspec_ops, reserve_scratch), offsetof(vspec_ops, rope2d_table),
    offsetof(vspec_ops, weight_format), offsetof(vspec_ops, alloc_uninit),
    offsetof(vspec_ops, graph_free),
};

static void test_table_wraps_every_op(void **state) {
  (void)state;
  vspec_dev *dev;
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err), 0);
  const vspec_ops *own = vs_cpu_ops(), *handed = vs_dev_ops(dev);
  assert_ptr_not_equal(own, handed);
  assert_int_equal(handed->struct_size, own->struct_size);
  assert_string_equal(handed->name, own->name);
  int wrapped = 0;
  for (size_t off = offsetof(vspec_ops, alloc); off + sizeof(void *) <= sizeof(vspec_ops);
       off += sizeof(void *)) {
    void *a, *b;
    memcpy(&a, (const char *)own + off, sizeof a);
    memcpy(&b, (const char *)handed + off, sizeof b);
    int skip = !a;
    for (size_t i = 0; i < sizeof uncounted / sizeof uncounted[0]; i++) skip |= off == uncounted[i];
    if (skip) {
      assert_ptr_equal(a, b); /* passed through as it is */
      continue;
    }
    if (a == b) fail_msg("the ops table member at offset %zu is not counted", off);
    wrapped++;
  }
  printf("  %d ops counted\n", wrapped);
  assert_true(wrapped >= 23);
  vs_dev_destroy(dev);
}

static void test_counts(void **state) {
  (void)state;
  vspec_dev *dev;
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err), 0);
  const vspec_ops *ops = vs_dev_ops(dev);
  vs_dev_counters c;
  float host[64] = {1}, back[64];
  float *a = ops->alloc(dev, sizeof host), *b = ops->alloc(dev, sizeof host);
  vs_dev_counters_get(dev, &c);
  assert_int_equal(c.ops + c.uploads + c.downloads + c.syncs, 0); /* allocations are free */
  ops->upload(dev, a, host, sizeof host);
  ops->upload(dev, b, host, 10 * sizeof(float));
  ops->add(dev, a, b, 64);
  ops->mul(dev, a, b, 64);
  ops->download(dev, back, a, sizeof back);
  ops->upload(dev, b, host, 0); /* nothing moves: not a transfer */
  vs_dev_counters_get(dev, &c);
  assert_int_equal(c.ops, 2);
  assert_int_equal(c.uploads, 2);
  assert_int_equal(c.upload_bytes, sizeof host + 10 * sizeof(float));
  assert_int_equal(c.downloads, 1);
  assert_int_equal(c.download_bytes, sizeof back);
  assert_int_equal(c.syncs, 0); /* the CPU never waits */
  vs_dev_counters d = c;
  ops->softmax(dev, a, 1, 64);
  vs_dev_counters_get(dev, &c);
  vs_dev_counters_sub(&c, &d);
  assert_int_equal(c.ops, 1);
  assert_int_equal(c.uploads + c.downloads, 0);
  /* The walk on the device (ABI 1.6) is one op and moves nothing: a round downloads its
   * result afterwards (a GPU's launch, with no transfer or wait inside). */
  int32_t parents[2] = {-1, 0}, toks[2] = {0, 3};
  vspec_walk_spec ws = {.sample = {.n = 2, .rows = 1, .vocab = 32, .temperature = 1.0f,
                                   .top_p = 1.0f},
                        .parents = parents, .tokens = toks, .rule = {.kind = VSPEC_WALK_EXACT}};
  vspec_walk_result wr;
  vs_dev_counters_get(dev, &d);
  ops->verify_walk(dev, a, &ws, &wr);
  vs_dev_counters_get(dev, &c);
  vs_dev_counters_sub(&c, &d);
  assert_int_equal(wr.status, VSPEC_OK);
  assert_int_equal(c.ops, 1);
  assert_int_equal(c.uploads + c.downloads + c.syncs, 0);
  vs_cpu_ops()->download(NULL, back, a, sizeof back); /* host code: no device to count on */
  ops->free(dev, a);
  ops->free(dev, b);
  vs_dev_destroy(dev);
}

typedef struct world {
  vs_fixture fx;
  vspec_host host;
  vspec_dev *dev;
  vs_registry *reg;
} world;

static int setup(void **state) {
  world *w = calloc(1, sizeof *w);
  char err[VSPEC_ERRLEN];
  vs_fixture_make(&w->fx);
  vs_host_init(&w->host, vs_cpu_ops());
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &w->dev, err, sizeof err), 0);
  assert_int_equal(vs_registry_open(w->fx.plugins, &w->host, &w->reg, err, sizeof err), 0);
  *state = w;
  return 0;
}

static int teardown(void **state) {
  world *w = *state;
  vs_registry_close(w->reg);
  vs_dev_destroy(w->dev);
  vs_fixture_remove(&w->fx);
  free(w);
  return 0;
}

/* The budget of one forward (see the top of this file). */
static uint64_t budget(int layers) { return (uint64_t)(5 * layers + 3); }

static void check_model(world *w, const vs_backend_model *t, int layers, const char *what) {
  static const int nodes[] = {1, 2, 16};
  char err[VSPEC_ERRLEN];
  for (int i = 0; i < 3; i++)
    for (int rows = 1; rows <= 2; rows++) {
      vs_dev_counters c;
      if (vs_count_forward(w->dev, t, rows, nodes[i], &c, err, sizeof err))
        fail_msg("%s: %s", what, err);
      uint64_t b = budget(layers);
      printf("  %s, %d node(s), %d row(s): %llu ops (budget %llu), %llu download(s) of %llu "
             "bytes, %llu upload(s)\n", what, nodes[i], rows, (unsigned long long)c.ops,
             (unsigned long long)b, (unsigned long long)c.downloads,
             (unsigned long long)c.download_bytes, (unsigned long long)c.uploads);
      if (c.ops > b) fail_msg("%s: %llu ops, over the budget of %llu", what,
                              (unsigned long long)c.ops, (unsigned long long)b);
      assert_int_equal(c.downloads, 1);
      assert_int_equal(c.download_bytes,
                       (uint64_t)nodes[i] * rows * t->info.vocab * sizeof(float));
      assert_int_equal(c.uploads, 1);
      /* int32 tokens and positions per row, head rows per node and row, a parent and a
       * cache slot per node, and the tree's two lengths */
      assert_int_equal(c.upload_bytes,
                       (uint64_t)((3 * rows + 2) * nodes[i] + 2) * sizeof(int32_t));
      assert_int_equal(c.syncs, 0);
    }
}

/* The micro test model (tests/golden/micro_c2i, 2 layers), its target alone. */
static vs_models *open_micro(world *w) {
  vs_models *m;
  char err[VSPEC_ERRLEN];
  if (vs_models_open(w->reg, &w->host, w->dev, "tests/golden/micro_c2i", VS_ROLE_TARGET, &m, err,
                     sizeof err))
    fail_msg("%s", err);
  return m;
}

/* vspec-bench costcurve --sessions (core/forward_timing.c, vs_time_forward_multi): each timed
 * call is one forward_multi of all S sessions (a wrapper in a copy of the backend's table
 * counts them), at least the warm-up and three timed; out-of-range counts and a backend
 * without forward_multi are refused with messages that say so. */
static const vspec_backend_vtable *g_real_vt;
static int g_multi_calls, g_multi_count;
static int counted_multi(vspec_dev *dev, vspec_session *const *ss,
                         const vspec_forward_batch *const *bs, vspec_forward_out *const *outs,
                         int32_t count, char *err, size_t errlen) {
  g_multi_calls++;
  if (g_multi_count && g_multi_count != count) g_multi_count = -1; /* not always the same */
  else g_multi_count = count;
  return g_real_vt->forward_multi(dev, ss, bs, outs, count, err, errlen);
}

static void test_time_forward_multi(void **state) {
  world *w = *state;
  vs_models *m = open_micro(w);
  vspec_backend_vtable vt = *m->target.vt;
  g_real_vt = m->target.vt;
  vt.forward_multi = counted_multi;
  vs_backend_model t = m->target;
  t.vt = &vt;
  char err[VSPEC_ERRLEN];
  double ms = 0;
  g_multi_calls = g_multi_count = 0;
  if (vs_time_forward_multi(w->dev, &t, 3, 2, 0.01, &ms, err, sizeof err)) fail_msg("%s", err);
  printf("  3 sessions of micro_c2i: %.3f ms a batch, %d batches of %d\n", ms, g_multi_calls,
         g_multi_count);
  assert_true(ms > 0);
  assert_int_equal(g_multi_count, 3);
  assert_true(g_multi_calls >= 4);
  assert_int_equal(vs_time_forward_multi(w->dev, &t, VS_TIME_MULTI_MAX + 1, 2, 0.01, &ms, err,
                                         sizeof err),
                   VSPEC_EINVAL);
  assert_non_null(strstr(err, "sessions in a batch"));
  vt.forward_multi = NULL;
  assert_int_equal(vs_time_forward_multi(w->dev, &t, 2, 2, 0.01, &ms, err, sizeof err),
                   VSPEC_ENOTSUP);
  assert_non_null(strstr(err, "no batched forward"));
  vs_models_close(m);
}

static void test_budget_micro(void **state) {
  world *w = *state;
  vs_models *m = open_micro(w);
  check_model(w, &m->target, 2, "micro_c2i");
  vs_models_close(m);
}

/* GPT-B's layer (4 heads of 16 instead of 12 of 64: the count does not depend on widths) at
 * 2, 3 and 4 layers: what the budget says per layer holds per layer. */
static void test_budget_random(void **state) {
  world *w = *state;
  char err[VSPEC_ERRLEN], path[300], what[32];
  for (int layers = 2; layers <= 4; layers++) {
    snprintf(path, sizeof path, "%s/random-%d.safetensors", w->fx.dir, layers);
    vs_backend_model bm = {0};
    if (vs_bench_write_random_gpt(path, layers, 64, 4, 4, 64, 8, 10, 1, err, sizeof err) ||
        vs_backend_model_load(w->reg, &w->host, w->dev, "llamagen", path, "max_nodes=64", &bm,
                              err, sizeof err))
      fail_msg("%s", err);
    snprintf(what, sizeof what, "random, %d layers", layers);
    check_model(w, &bm, layers, what);
    vs_backend_model_unload(&bm);
    unlink(path);
  }
}

/* The device's scratch reallocated after the graphs were recorded (a later op needed more;
 * a CUDA graph holds the old address): the next step's launch is refused as stale, so it runs
 * eagerly and drops the graph, the one after records it again, and the third replays. */
static void check_stale_graph(world *w, const vs_backend_model *bm, vspec_session *s,
                              float *logits, int layers) {
  static size_t grow = (size_t)64 << 20; /* past any scratch so far, more each time */
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_dev_ops(w->dev)->reserve_scratch(w->dev, grow), VSPEC_OK);
  grow += (size_t)16 << 20;
  int32_t tok[1] = {3}, par[1] = {-1};
  static const char *const step[3] = {"stale: eager", "recorded again", "replayed"};
  for (int k = 0; k < 3; k++) {
    vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = 1, .tokens = tok,
                             .parents = par};
    vspec_forward_out o = {.struct_size = sizeof o, .logits = logits};
    vs_dev_counters c0, c;
    vs_dev_counters_get(w->dev, &c0);
    if (bm->vt->forward(s, &b, &o, err, sizeof err)) fail_msg("%s", err);
    vs_dev_counters_get(w->dev, &c);
    vs_dev_counters_sub(&c, &c0);
    printf("  after the scratch grew, %s: %llu op(s), %llu launch(es), %llu recorded\n",
           step[k], (unsigned long long)c.ops, (unsigned long long)c.launches,
           (unsigned long long)c.recorded);
    assert_int_equal(c.ops, k == 0 ? budget(layers) : 1);
    assert_int_equal(c.launches, k == 0 ? 0 : 1);
    assert_int_equal(c.recorded, k == 1 ? budget(layers) : 0);
  }
}

/* One upload, one launch, one download a step under graphs (see the top of this file): the
 * micro model (2 layers) and a random GPT of 3, at 1, 2 and 16 nodes (each a bucket of its
 * own: no padding in the bytes) and 1 and 2 CFG rows, twice per session (the first
 * records). */
static void check_graph_steps(world *w, const char *path, int layers) {
  static const int nodes[] = {1, 2, 16};
  char err[VSPEC_ERRLEN];
  vs_backend_model bm = {0};
  if (vs_backend_model_load(w->reg, &w->host, w->dev, "llamagen", path,
                            "max_nodes=16,graphs=on", &bm, err, sizeof err))
    fail_msg("%s", err);
  int V = bm.info.vocab;
  float *logits = malloc(sizeof(float) * 16 * 2 * (size_t)V);
  int32_t tok[16] = {0}, par[16];
  for (int i = 0; i < 16; i++) par[i] = i - 1;
  for (int rows = 1; rows <= 2; rows++) {
    vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = 1, .rows = rows,
                                .max_nodes = 16};
    vspec_session *s;
    if (bm.vt->session_open(bm.model, w->dev, &cfg, &s, err, sizeof err) ||
        bm.vt->prefill(s, &(vspec_forward_out){.struct_size = sizeof(vspec_forward_out)}, err,
                       sizeof err))
      fail_msg("%s", err);
    for (int i = 0; i < 3; i++)
      for (int again = 0; again < 2; again++) {
        vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = nodes[i], .tokens = tok,
                                 .parents = par};
        vspec_forward_out o = {.struct_size = sizeof o, .logits = logits};
        vs_dev_counters c0, c;
        vs_dev_counters_get(w->dev, &c0);
        if (bm.vt->forward(s, &b, &o, err, sizeof err)) fail_msg("%s", err);
        vs_dev_counters_get(w->dev, &c);
        vs_dev_counters_sub(&c, &c0);
        printf("  %s, %d node(s), %d row(s), %s: %llu op(s), %llu launch(es), %llu recorded\n",
               path, nodes[i], rows, again ? "replayed" : "recorded",
               (unsigned long long)c.ops, (unsigned long long)c.launches,
               (unsigned long long)c.recorded);
        assert_int_equal(c.ops, 1);
        assert_int_equal(c.launches, 1);
        assert_int_equal(c.recorded, again ? 0 : budget(layers));
        assert_int_equal(c.uploads, 1);
        assert_int_equal(c.upload_bytes,
                         (uint64_t)((3 * rows + 2) * nodes[i] + 2) * sizeof(int32_t));
        assert_int_equal(c.downloads, 1);
        assert_int_equal(c.download_bytes, (uint64_t)nodes[i] * rows * V * sizeof(float));
        assert_int_equal(c.syncs, 0);
      }
    check_stale_graph(w, &bm, s, logits, layers);
    bm.vt->session_close(s);
  }
  free(logits);
  vs_backend_model_unload(&bm);
}

static void test_budget_graphs(void **state) {
  world *w = *state;
  char err[VSPEC_ERRLEN], path[300];
  check_graph_steps(w, "tests/golden/micro_c2i/gpt.safetensors", 2);
  snprintf(path, sizeof path, "%s/random-graphs.safetensors", w->fx.dir);
  if (vs_bench_write_random_gpt(path, 3, 64, 4, 4, 64, 8, 10, 1, err, sizeof err))
    fail_msg("%s", err);
  check_graph_steps(w, path, 3);
  unlink(path);
}

/* A verified round with the walk on the device (ABI 1.6, vspec_forward_out.walk): the
 * forward's budget (or, under graphs, its one launch) plus the walk, one op; two uploads (the
 * forward's integers, then the tree, its guidance flags and, for sampled drafts, its draft
 * distributions) and one download, of the walk's result instead of the logits; no wait. On
 * the micro model at 2 and 16 nodes, 1 and 2 CFG rows, eagerly and under graphs. */
static void check_walk_steps(world *w, const char *params, int graphs) {
  static const int nodes[] = {2, 16};
  char err[VSPEC_ERRLEN];
  vs_backend_model bm = {0};
  if (vs_backend_model_load(w->reg, &w->host, w->dev, "llamagen",
                            "tests/golden/micro_c2i/gpt.safetensors", params, &bm, err,
                            sizeof err))
    fail_msg("%s", err);
  int V = bm.info.vocab;
  float *logits = malloc(sizeof(float) * 16 * 2 * (size_t)V);
  float *dists = calloc(16, (size_t)V * sizeof(float));
  int32_t tok[16] = {0}, par[16], dist[16];
  for (int i = 0; i < 16; i++) par[i] = i - 1, dist[i] = i, dists[(size_t)i * V] = 1.0f;
  for (int rows = 1; rows <= 2; rows++)
    for (int i = 0; i < 2; i++)
      for (int sampled = 0; sampled <= 1; sampled++) {
        int n = nodes[i];
        vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = 1, .rows = rows,
                                    .max_nodes = 16};
        vspec_session *s;
        if (bm.vt->session_open(bm.model, w->dev, &cfg, &s, err, sizeof err) ||
            bm.vt->prefill(s, &(vspec_forward_out){.struct_size = sizeof(vspec_forward_out)},
                           err, sizeof err))
          fail_msg("%s", err);
        vspec_walk_spec ws = {.sample = {.n = n, .rows = rows, .vocab = V, .cfg_scale = 2.0f,
                                         .temperature = 1.0f, .top_p = 1.0f},
                              .parents = par, .tokens = tok, .dists = sampled ? dists : NULL,
                              .dist = sampled ? dist : NULL,
                              .rule = {.kind = VSPEC_WALK_EXACT}};
        vspec_walk_result res;
        for (int again = 0; again <= graphs; again++) {
          vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = n, .tokens = tok,
                                   .parents = par};
          vspec_forward_out o = {.struct_size = sizeof o, .logits = logits, .walk = &ws,
                                 .walk_dists = sampled ? n : 0, .walk_result = &res};
          vs_dev_counters c0, c;
          vs_dev_counters_get(w->dev, &c0);
          if (bm.vt->forward(s, &b, &o, err, sizeof err)) fail_msg("%s", err);
          vs_dev_counters_get(w->dev, &c);
          vs_dev_counters_sub(&c, &c0);
          printf("  walk, %d node(s), %d row(s), %s drafts%s: %llu op(s), %llu upload(s) of "
                 "%llu bytes, %llu download(s) of %llu bytes\n",
                 n, rows, sampled ? "sampled" : "one-hot",
                 graphs ? (again ? ", replayed" : ", recorded") : "",
                 (unsigned long long)c.ops, (unsigned long long)c.uploads,
                 (unsigned long long)c.upload_bytes, (unsigned long long)c.downloads,
                 (unsigned long long)c.download_bytes);
          assert_int_equal(o.walked, 1);
          assert_int_equal(res.status, VSPEC_OK);
          assert_int_equal(c.ops, graphs ? 2 : budget(2) + 1);
          assert_int_equal(c.uploads, 2);
          uint64_t tree = (uint64_t)(3 * sizeof(int32_t) + 1) * n +
                          (sampled ? (uint64_t)n * V * sizeof(float) : 0);
          assert_true(c.upload_bytes >= (uint64_t)((3 * rows + 2) * n + 2) * sizeof(int32_t) +
                                            tree);
          assert_int_equal(c.downloads, 1);
          assert_int_equal(c.download_bytes, sizeof(vspec_walk_result));
          assert_int_equal(c.syncs, 0);
        }
        bm.vt->session_close(s);
      }
  free(logits);
  free(dists);
  vs_backend_model_unload(&bm);
}

static void test_budget_walk(void **state) {
  world *w = *state;
  check_walk_steps(w, "max_nodes=16", 0);
  check_walk_steps(w, "max_nodes=16,graphs=on", 1);
}

/* vspecd's status reports, per model, what a step and a 16-node verify issue: the figures
 * counted here in-process for the same model, with the model's default CFG rows. */
static void test_status_reports_costs(void **state) {
  world *w = *state;
  vs_models *m = open_micro(w);
  char err[VSPEC_ERRLEN];
  int rows = m->defaults.cfg_scale > 1.0f ? 2 : 1;
  vs_dev_counters step, verify;
  assert_int_equal(vs_count_forward(w->dev, &m->target, rows, 1, &step, err, sizeof err), 0);
  assert_int_equal(vs_count_forward(w->dev, &m->target, rows, 16, &verify, err, sizeof err), 0);
  vs_models_close(m);
  vs_daemon d;
  vs_daemon_start(&d, &w->fx, "costs", NULL);
  vs_conn_event e;
  vs_client_status(d.admin_ep, &e);
  int found = 0;
  for (size_t i = 0; i < e.ev->status->n_models; i++) {
    const Vspec__ModelInfo *mi = e.ev->status->models[i];
    if (strcmp(mi->name, "micro")) continue;
    found = 1;
    assert_true(mi->has_step_ops && mi->has_step_downloads && mi->has_verify16_ops);
    assert_int_equal(mi->step_ops, step.ops);
    assert_int_equal(mi->step_downloads, 1);
    assert_int_equal(mi->verify16_ops, verify.ops);
    printf("  status: micro issues %u ops a step, %u a 16-node verify\n", mi->step_ops,
           mi->verify16_ops);
  }
  vs_conn_event_free(&e);
  assert_true(found);
  char out[8192];
  const char *args[] = {"status", "--admin", d.admin_ep, NULL};
  assert_int_equal(vs_run_tool("vspec", args, out, sizeof out), 0);
  char want[96];
  snprintf(want, sizeof want, "a forward issues %llu ops and 1 download(s) per token step",
           (unsigned long long)step.ops);
  assert_non_null(strstr(out, want));
  assert_int_equal(vs_daemon_stop(&d, 15, 20000), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table_wraps_every_op),
      cmocka_unit_test(test_counts),
      cmocka_unit_test_setup_teardown(test_budget_micro, setup, teardown),
      cmocka_unit_test_setup_teardown(test_time_forward_multi, setup, teardown),
      cmocka_unit_test_setup_teardown(test_budget_random, setup, teardown),
      cmocka_unit_test_setup_teardown(test_budget_graphs, setup, teardown),
      cmocka_unit_test_setup_teardown(test_budget_walk, setup, teardown),
      cmocka_unit_test_setup_teardown(test_status_reports_costs, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
