/*
 * The LlamaGen backend's fused forward (ABI 1.4 fused ops) against its unfused forward, run
 * side by side through the plugin ABI: the same model loaded twice, once by a host whose
 * ops table lacks the fused ops. On the CPU the outputs must be bit-identical (the fused
 * ops are the unfused sequences there); on a GPU (VSPEC_TEST_DEVICE=cuda) they must agree
 * within the golden tests' tolerance, since a fused kernel may sum in another order.
 *
 * Every path of a forward is exercised: the prefill (a chain with the t2i caption rule),
 * chains, trees with random parents, batches appended to pending nodes, commits that
 * compact the cache, features and logits, 1 and 2 CFG rows, grouped-query attention. And
 * a decode step on the fused path must issue 5 ops per layer plus 3 and upload once.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "core/engine.h"
#include "core/host.h"
#include "core/models.h"
#include "core/registry.h"
#include "core/safetensors.h"
#include "core/sampling.h"
#include "kernels/vs_kernels.h"
#include "tests/support/ops_views.h"
#include "tests/support/test_device.h"
#include "tests/support/method_of.h"

static vspec_host host, host_unfused;
static vspec_dev *dev;
static vs_registry *reg;
static double tolerance; /* 0 on the CPU: bit-identical */

/* One model loaded by both hosts, and a session of each. A draft head (eagle) reads the
 * target's features with every node: the script makes them up. */
typedef struct pair {
  vs_backend_model fused, plain;
  vspec_session *s[2];
  int V, d, rows, head;
  float feat[64 * 2 * 64];
} pair;

static void pair_load_backend(pair *p, const char *backend, const char *path, const char *params) {
  char err[VSPEC_ERRLEN];
  memset(p, 0, sizeof *p);
  if (vs_backend_model_load(reg, &host, dev, backend, path, params, &p->fused, err, sizeof err) ||
      vs_backend_model_load(reg, &host_unfused, dev, backend, path, params, &p->plain, err,
                            sizeof err))
    fail_msg("%s: %s", path, err);
  p->V = p->fused.info.vocab;
  p->d = p->fused.info.feature_dim;
  p->head = strcmp(backend, "eagle") == 0;
  assert_true(p->d <= 64);
}

static void pair_load(pair *p, const char *gpt) {
  /* graphs off: the fused ops issued one by one (a GPU's default records graphs, which
   * tests/test_graph_replay.c checks) */
  pair_load_backend(p, "llamagen", gpt, "max_nodes=64,graphs=off");
}

static void pair_open(pair *p, const vspec_session_config *cfg) {
  char err[VSPEC_ERRLEN];
  const vs_backend_model *m[2] = {&p->fused, &p->plain};
  for (int i = 0; i < 2; i++)
    if (m[i]->vt->session_open(m[i]->model, dev, cfg, &p->s[i], err, sizeof err))
      fail_msg("session_open: %s", err);
  p->rows = cfg->rows;
}

static void pair_close(pair *p) {
  if (p->s[0]) p->fused.vt->session_close(p->s[0]);
  if (p->s[1]) p->plain.vt->session_close(p->s[1]);
  p->s[0] = p->s[1] = NULL;
}

static void pair_unload(pair *p) {
  pair_close(p);
  vs_backend_model_unload(&p->fused);
  vs_backend_model_unload(&p->plain);
}

static void expect_same(const char *what, const float *a, const float *b, size_t n) {
  if (tolerance == 0) {
    for (size_t i = 0; i < n; i++)
      if (memcmp(&a[i], &b[i], sizeof *a))
        fail_msg("%s: element %zu of %zu: fused %.9g, unfused %.9g", what, i, n, a[i], b[i]);
    return;
  }
  double ref = 0, diff = 0;
  for (size_t i = 0; i < n; i++) {
    ref = fmax(ref, fabs(b[i]));
    diff = fmax(diff, fabs((double)a[i] - b[i]));
  }
  if (!(diff <= tolerance * ref))
    fail_msg("%s: max |fused - unfused| %.3g over %.0e x %.3g", what, diff, tolerance, ref);
}

/* prefill (mode 0) or forward (1) on both sessions; logits and features compared. */
static void both(pair *p, int mode, vspec_forward_batch *b, const char *what) {
  int n = mode ? b->n_nodes : 1;
  if (mode && p->head) { /* made-up target features, [n, rows, d] */
    static uint32_t x = 1;
    assert_true((size_t)n * p->rows * p->d <= sizeof p->feat / sizeof p->feat[0]);
    for (int i = 0; i < n * p->rows * p->d; i++)
      p->feat[i] = (float)((x = x * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
    b->features = p->feat;
  }
  size_t nl = (size_t)n * p->rows * p->V, nf = (size_t)n * p->rows * p->d;
  float *l[2], *f[2];
  char err[VSPEC_ERRLEN];
  const vs_backend_model *m[2] = {&p->fused, &p->plain};
  for (int i = 0; i < 2; i++) {
    l[i] = malloc(nl * sizeof(float));
    f[i] = malloc(nf * sizeof(float));
    assert_non_null(l[i]);
    assert_non_null(f[i]);
    vspec_forward_out o = {.struct_size = sizeof o, .logits = l[i], .features = f[i]};
    int rc = mode ? m[i]->vt->forward(p->s[i], b, &o, err, sizeof err)
                  : m[i]->vt->prefill(p->s[i], &o, err, sizeof err);
    if (rc) fail_msg("%s: %s", what, err);
  }
  char name[96];
  snprintf(name, sizeof name, "%s logits", what);
  expect_same(name, l[0], l[1], nl);
  snprintf(name, sizeof name, "%s features", what);
  expect_same(name, f[0], f[1], nf);
  for (int i = 0; i < 2; i++) free(l[i]), free(f[i]);
}

static void commit_both(pair *p, const int32_t *path, int n) {
  char err[VSPEC_ERRLEN];
  if (p->fused.vt->commit(p->s[0], path, n, err, sizeof err) ||
      p->plain.vt->commit(p->s[1], path, n, err, sizeof err))
    fail_msg("commit: %s", err);
}

static uint32_t lcg(uint32_t *x) { return (*x = *x * 1664525u + 1013904223u) >> 8; }

/* A session's life: prefill, a chain, a tree, a batch appended to it, commits along
 * paths that move cache slots, single steps. */
static void script(pair *p, uint32_t seed) {
  int32_t tok[32], par[32], path[8];
  uint32_t x = seed;
  both(p, 0, NULL, "prefill");
  for (int i = 0; i < 3; i++) tok[i] = (int32_t)(lcg(&x) % (uint32_t)p->V), par[i] = i - 1;
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = 3, .tokens = tok, .parents = par};
  both(p, 1, &b, "chain of 3");
  path[0] = 0, path[1] = 1;
  commit_both(p, path, 2);
  b.features = NULL;
  /* a tree of 9 whose accepted path is 0 -> 2 -> 6: slots move in the commit */
  for (int i = 0; i < 9; i++) {
    tok[i] = (int32_t)(lcg(&x) % (uint32_t)p->V);
    par[i] = i == 0 ? -1 : (int32_t)(lcg(&x) % (uint32_t)i);
  }
  par[2] = 0, par[6] = 2;
  b.n_nodes = 9;
  b.features = NULL;
  both(p, 1, &b, "tree of 9");
  /* three more nodes below the pending tree (append) */
  int32_t tok2[3], par2[3] = {6, 9, 9};
  for (int i = 0; i < 3; i++) tok2[i] = (int32_t)(lcg(&x) % (uint32_t)p->V);
  vspec_forward_batch a = {.struct_size = sizeof a, .n_nodes = 3, .tokens = tok2,
                           .parents = par2, .append = 1};
  both(p, 1, &a, "appended 3");
  path[0] = 0, path[1] = 2, path[2] = 6, path[3] = 9;
  commit_both(p, path, 4);
  for (int step = 0; step < 3; step++) {
    tok[0] = (int32_t)(lcg(&x) % (uint32_t)p->V), par[0] = -1;
    b.n_nodes = 1;
    b.features = NULL;
    both(p, 1, &b, "one-token step");
    path[0] = 0;
    commit_both(p, path, 1);
  }
}

static void test_c2i_micro(void **state) {
  (void)state;
  pair p;
  pair_load(&p, "tests/golden/micro_c2i/gpt.safetensors");
  for (int rows = 1; rows <= 2; rows++) {
    vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = 3, .rows = rows,
                                .max_nodes = 16};
    pair_open(&p, &cfg);
    script(&p, 11u + (uint32_t)rows);
    pair_close(&p);
  }
  pair_unload(&p);
}

/* t2i: the caption's padding slots are hidden from every query but their own (the prefill's
 * prefix rule on the device). */
static void test_t2i_micro(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vspec_tensor_file *g;
  if (vs_st_open("tests/golden/micro_t2i/golden.safetensors", &g, err, sizeof err))
    fail_msg("%s", err);
  vspec_tensor cap = {.struct_size = sizeof cap}, mask = {.struct_size = sizeof mask};
  assert_int_equal(vs_st_find(g, "cond.caption", &cap), 0);
  assert_int_equal(vs_st_find(g, "cond.mask", &mask), 0);
  const uint8_t *m = mask.data;
  int hidden = 0;
  for (int64_t i = 0; i < mask.numel; i++) hidden += !m[i];
  assert_true(hidden > 0); /* the golden caption has padding: the rule is exercised */
  pair p;
  pair_load(&p, "tests/golden/micro_t2i/gpt.safetensors");
  vspec_session_config cfg = {.struct_size = sizeof cfg, .rows = 2, .max_nodes = 16,
                              .caption = cap.data, .caption_mask = mask.data};
  pair_open(&p, &cfg);
  script(&p, 5);
  pair_unload(&p);
  vs_st_close(g);
}

/* Grouped-query attention (n_kv_head < n_head) and deeper random GPTs. */
static void test_random_gqa(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN], path[128];
  snprintf(path, sizeof path, "/tmp/vspec-fused-%d.safetensors", (int)getpid());
  /* 3 layers, width 64, 4 query heads of 16 over 2 kv heads, vocab 40, 8x8 grid */
  if (vs_bench_write_random_gpt(path, 3, 64, 4, 2, 40, 8, 10, 7, err, sizeof err))
    fail_msg("%s", err);
  pair p;
  pair_load(&p, path);
  unlink(path);
  vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = 9, .rows = 2,
                              .max_nodes = 32};
  pair_open(&p, &cfg);
  script(&p, 99);
  pair_unload(&p);
}

/* The EAGLE head: no input norm in layer 0, features in, (node, row) order out. */
static void test_eagle_head(void **state) {
  (void)state;
  pair p;
  pair_load_backend(&p, "eagle", "tests/golden/micro_eagle/eagle.safetensors",
                    "target=tests/golden/micro_c2i/gpt.safetensors");
  for (int rows = 1; rows <= 2; rows++) {
    vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = 0, .rows = rows,
                                .max_nodes = 16};
    pair_open(&p, &cfg);
    script(&p, 3u + (uint32_t)rows);
    pair_close(&p);
  }
  pair_unload(&p);
}

/* One forward of session s; NULL feats/src where not given. */
static void head_fwd(const vs_backend_model *m, vspec_session *s, int n, const int32_t *tok,
                     const int32_t *par, int append, const float *feats, const int32_t *src,
                     float *logits, float *out_feats) {
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = n, .tokens = tok,
                           .parents = par, .features = feats, .append = append,
                           .feature_src = src};
  vspec_forward_out o = {.struct_size = sizeof o, .logits = logits, .features = out_feats};
  char err[VSPEC_ERRLEN];
  if (m->vt->forward(s, &b, &o, err, sizeof err)) fail_msg("forward: %s", err);
}

/* ABI 1.7 (vspec_forward_batch.feature_src): tree nodes fed their parents' output features
 * where the head left them on the device give the bits they give when those features are
 * downloaded and passed back as host rows (what the EAGLE drafter did before), fused and
 * unfused alike; a source that is not an earlier pending node is refused. */
static void test_eagle_feature_src(void **state) {
  (void)state;
  pair p;
  pair_load_backend(&p, "eagle", "tests/golden/micro_eagle/eagle.safetensors",
                    "target=tests/golden/micro_c2i/gpt.safetensors");
  assert_true(p.fused.info.keeps_features && p.plain.info.keeps_features);
  enum { R = 2 };
  vspec_session_config cfg = {.struct_size = sizeof cfg, .rows = R, .max_nodes = 16};
  pair_open(&p, &cfg);
  vspec_session *h; /* fed host features */
  char err[VSPEC_ERRLEN];
  if (p.fused.vt->session_open(p.fused.model, dev, &cfg, &h, err, sizeof err))
    fail_msg("%s", err);
  vspec_session *ss[3] = {p.s[0], p.s[1], h};
  const vs_backend_model *ms[3] = {&p.fused, &p.plain, &p.fused};
  int d = p.d, V = p.V;
  float *feats = malloc(sizeof(float) * 3 * R * d), *out = malloc(sizeof(float) * 3 * R * d);
  float *l[3], *f[3], *l1 = malloc(sizeof(float) * 3 * R * V);
  uint32_t x = 5;
  for (int i = 0; i < 3 * R * d; i++) feats[i] = (float)lcg(&x) / 16777216.0f - 0.5f;
  int32_t tok[3] = {4, 9, 1}, par[3] = {-1, 0, 1}, tok2[2] = {7, 3}, par2[2] = {0, 2};
  int32_t src[2] = {0, 2};
  for (int k = 0; k < 3; k++) {
    vspec_forward_out o = {.struct_size = sizeof o};
    if (ms[k]->vt->prefill(ss[k], &o, err, sizeof err)) fail_msg("%s", err);
    head_fwd(ms[k], ss[k], 3, tok, par, 0, feats, NULL, l1, k == 2 ? out : NULL);
  }
  /* the host-fed session takes the first forward's outputs at nodes 0 and 2 */
  float host_feats[2 * R * 64];
  assert_true(d <= 64);
  for (int j = 0; j < 2; j++)
    memcpy(host_feats + (size_t)j * R * d, out + (size_t)src[j] * R * d, sizeof(float) * R * d);
  for (int k = 0; k < 3; k++) {
    l[k] = malloc(sizeof(float) * 2 * R * V);
    f[k] = malloc(sizeof(float) * 2 * R * d);
    head_fwd(ms[k], ss[k], 2, tok2, par2, 1, k == 2 ? host_feats : NULL, k == 2 ? NULL : src,
             l[k], f[k]);
  }
  assert_memory_equal(l[0], l[2], sizeof(float) * 2 * R * V);
  assert_memory_equal(f[0], f[2], sizeof(float) * 2 * R * d);
  expect_same("feature_src logits", l[0], l[1], (size_t)2 * R * V);
  expect_same("feature_src features", f[0], f[1], (size_t)2 * R * d);
  /* node 5 is not pending before this batch (5 are); nothing is before a replacing batch */
  int32_t late[1] = {5}, first[1] = {0};
  vspec_forward_batch bad = {.struct_size = sizeof bad, .n_nodes = 1, .tokens = tok2,
                             .parents = par2, .append = 1, .feature_src = late};
  vspec_forward_out o = {.struct_size = sizeof o};
  assert_int_equal(p.fused.vt->forward(p.s[0], &bad, &o, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "feature_src[0] = 5"));
  bad.append = 0;
  bad.parents = par;
  bad.feature_src = first;
  assert_int_equal(p.fused.vt->forward(p.s[0], &bad, &o, err, sizeof err), VSPEC_EINVAL);
  for (int k = 0; k < 3; k++) free(l[k]), free(f[k]);
  free(feats), free(out), free(l1);
  p.fused.vt->session_close(h);
  pair_unload(&p);
}

/* The draw on the device (vspec_forward_out.sample): the token the engine's host sampler
 * draws from the same node's logits, for plain sampling, top-k, top-p, greedy and steps past
 * cfg_interval; and an AR step then downloads one int32, no logits. On a GPU the logits and
 * the sums may differ in the last bits, so a rare token at a boundary of the inverse CDF may
 * differ: at most 2 of the 60 draws. */
static void test_device_draw(void **state) {
  (void)state;
  static const vs_sampling settings[] = {
      {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 1.5f, .cfg_interval = -1},
      {.temperature = 0.7f, .top_k = 5, .top_p = 1.0f, .cfg_scale = 2.0f, .cfg_interval = -1},
      {.temperature = 1.0f, .top_k = 0, .top_p = 0.8f, .cfg_scale = 1.5f, .cfg_interval = -1},
      {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 1.5f, .cfg_interval = -1},
      {.temperature = 1.0f, .top_k = 10, .top_p = 0.9f, .cfg_scale = 3.0f, .cfg_interval = 2},
  };
  if (!vs_dev_ops(dev)->sample_tokens) { /* the CPU has it: only a GPU build may lack it */
    printf("  device %s has no sample_tokens\n", vt_test_device_name());
    assert_string_not_equal(vt_test_device_name(), "cpu");
    skip();
  }
  pair p;
  pair_load(&p, "tests/golden/micro_c2i/gpt.safetensors");
  int V = p.V, mismatches = 0, draws = 0;
  float *logits = malloc(sizeof(float) * 2 * (size_t)V), *probs = malloc(sizeof(float) * V);
  vs_sampler sp;
  assert_int_equal(vs_sampler_init(&sp, V), 0);
  char err[VSPEC_ERRLEN];
  uint32_t x = 77;
  for (size_t k = 0; k < sizeof settings / sizeof settings[0]; k++) {
    const vs_sampling *set = &settings[k];
    vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = (int)k, .rows = 2,
                                .max_nodes = 4};
    pair_open(&p, &cfg);
    both(&p, 0, NULL, "prefill");
    for (int step = 0; step < 12; step++, draws++) {
      int32_t tok = (int32_t)(lcg(&x) % (uint32_t)V), par = -1, got = -7, path0 = 0;
      vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = 1, .tokens = &tok,
                               .parents = &par};
      uint8_t guided;
      double u = (double)lcg(&x) / 16777216.0;
      vspec_sample_spec spec;
      vs_sample_spec_one(set, 2, V, step + 1, &guided, &u, &spec);
      vspec_forward_out drawn = {.struct_size = sizeof drawn, .sample = &spec, .tokens = &got};
      vspec_forward_out plain = {.struct_size = sizeof plain, .logits = logits};
      vs_dev_counters c0, c1;
      vs_dev_counters_get(dev, &c0);
      assert_int_equal(p.fused.vt->forward(p.s[0], &b, &drawn, err, sizeof err), 0);
      vs_dev_counters_get(dev, &c1);
      vs_dev_counters_sub(&c1, &c0);
      assert_int_equal(drawn.sampled, 1);
      assert_int_equal(c1.downloads, 1); /* the token, not the logits */
      assert_int_equal(c1.download_bytes, sizeof(int32_t));
      assert_int_equal(c1.uploads, 1);
      assert_int_equal(p.plain.vt->forward(p.s[1], &b, &plain, err, sizeof err), 0);
      assert_int_equal(plain.sampled, 0); /* the unfused path draws nothing */
      vs_node_distribution(&sp, logits, 2, step + 1, set, probs);
      int32_t want = set->temperature > 0.0f ? vs_draw(probs, V, u) : vs_argmax_first(probs, V);
      if (got != want) {
        mismatches++;
        printf("  setting %zu, step %d: device drew %d, the host sampler %d\n", k, step, got,
               want);
      }
      assert_int_equal(p.fused.vt->commit(p.s[0], &path0, 1, err, sizeof err), 0);
      assert_int_equal(p.plain.vt->commit(p.s[1], &path0, 1, err, sizeof err), 0);
    }
    pair_close(&p);
  }
  printf("  %d draws on the device, %d unlike the host sampler's\n", draws, mismatches);
  if (tolerance == 0) assert_int_equal(mismatches, 0);
  else assert_true(mismatches <= 2);
  vs_sampler_free(&sp);
  free(logits);
  free(probs);
  pair_unload(&p);
}

/* Whole jobs through the engine: the same tokens whether the device draws AR steps and runs
 * the fused forwards or the host does and the ops are unfused (models/fmnist, AR and SD). */
static void test_engine_same_tokens(void **state) {
  (void)state;
  static const char *const methods[] = {
      "ar", "sd:exact@standard:shape=chain,drafter=model,depth=3",
      "sd:lantern@standard:shape=dynamic,drafter=head,depth=4,top_k=4,total_tokens=8"};
  char err[VSPEC_ERRLEN];
  vs_models *m[2];
  vspec_host *hosts[2] = {&host, &host_unfused};
  for (int i = 0; i < 2; i++)
    if (vs_models_open(reg, hosts[i], dev, "models/fmnist", VS_ROLE_ALL, &m[i], err, sizeof err))
      fail_msg("%s", err);
  int N = m[0]->target.info.grid_h * m[0]->target.info.grid_w;
  int32_t *tok[2] = {malloc(sizeof(int32_t) * N), malloc(sizeof(int32_t) * N)};
  /* Walk and drafts on the device where the ops allow, as on a GPU: the host without the
   * fused ops must fall back to host drafts rather than refuse the job. */
  int set_walk = !getenv("VSPEC_WALK"), set_draw = !getenv("VSPEC_DRAFT_DRAW");
  if (set_walk) setenv("VSPEC_WALK", "device", 1);
  if (set_draw) setenv("VSPEC_DRAFT_DRAW", "device", 1);
  for (size_t k = 0; k < sizeof methods / sizeof methods[0]; k++) {
    for (int i = 0; i < 2; i++) {
      vs_job job = {.method = vs_method_of(methods[k]), .class_label = 7, .seed = 5 + k,
                    .sampling = m[i]->defaults};
      if (vs_generate(m[i], dev, &job, tok[i], NULL, err, sizeof err))
        fail_msg("%s: %s", methods[k], err);
    }
    int differ = 0;
    for (int j = 0; j < N; j++) differ += tok[0][j] != tok[1][j];
    printf("  %s: %d of %d tokens differ\n", methods[k], differ, N);
    if (tolerance == 0) assert_int_equal(differ, 0);
  }
  if (set_walk) unsetenv("VSPEC_WALK");
  if (set_draw) unsetenv("VSPEC_DRAFT_DRAW");
  free(tok[0]);
  free(tok[1]);
  vs_models_close(m[0]);
  vs_models_close(m[1]);
}

/* The fused path is the one taken: a one-token CFG step issues 5 ops per layer plus 3 and
 * one upload (tokens, positions, head rows and parents together); the unfused one more. */
static void test_fused_path_taken(void **state) {
  (void)state;
  pair p;
  pair_load(&p, "tests/golden/micro_c2i/gpt.safetensors");
  vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = 1, .rows = 2,
                              .max_nodes = 4};
  pair_open(&p, &cfg);
  both(&p, 0, NULL, "prefill");
  int32_t tok = 5, par = -1;
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = 1, .tokens = &tok, .parents = &par};
  float *logits = malloc(sizeof(float) * 2 * (size_t)p.V);
  uint64_t ops[2], uploads[2];
  const vs_backend_model *m[2] = {&p.fused, &p.plain};
  char err[VSPEC_ERRLEN];
  for (int i = 0; i < 2; i++) {
    vs_dev_counters c0, c1;
    vspec_forward_out o = {.struct_size = sizeof o, .logits = logits};
    vs_dev_counters_get(dev, &c0);
    assert_int_equal(m[i]->vt->forward(p.s[i], &b, &o, err, sizeof err), 0);
    vs_dev_counters_get(dev, &c1);
    vs_dev_counters_sub(&c1, &c0);
    ops[i] = c1.ops, uploads[i] = c1.uploads;
  }
  printf("  micro_c2i one-token CFG step: %llu ops fused, %llu unfused\n",
         (unsigned long long)ops[0], (unsigned long long)ops[1]);
  assert_int_equal(ops[0], 5 * 2 + 3); /* two layers */
  assert_int_equal(uploads[0], 1);
  assert_true(ops[1] > ops[0]);
  free(logits);
  pair_unload(&p);
}

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&host, vs_cpu_ops());
  host_unfused = host;
  host_unfused.dev_ops = vt_ops_unfused;
  dev = vt_test_device(2);
  const char *prec = getenv("VSPEC_TEST_PRECISION");
  tolerance = strcmp(vt_test_device_name(), "cpu") == 0 ? 0
              : prec && strcmp(prec, "bf16") == 0   ? 2e-2
                                                    : 1e-4;
  printf("device: %s\n", vt_test_device_name());
  if (!vspec_has_fused_ops(vs_dev_ops(dev))) { /* every device has them (ABI 1.4) */
    fprintf(stderr, "device '%s' has no fused ops\n", vt_test_device_name());
    return 1;
  }
  if (vs_registry_open(dir, &host, &reg, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_c2i_micro),
      cmocka_unit_test(test_t2i_micro),
      cmocka_unit_test(test_random_gqa),
      cmocka_unit_test(test_eagle_head),
      cmocka_unit_test(test_eagle_feature_src),
      cmocka_unit_test(test_device_draw),
      cmocka_unit_test(test_engine_same_tokens),
      cmocka_unit_test(test_fused_path_taken),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_registry_close(reg);
  vs_dev_destroy(dev);
  return rc;
}
