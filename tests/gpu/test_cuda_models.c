/* tests/gpu/test_cuda_models.c - the llamagen backend and the engine on the GPU against the
 * CPU, on the micro golden model and on the shipped models/fmnist:
 *  - fp32 (parity): prefill, decode and tree-forward logits and features within 1e-4 of
 *    the CPU's (relative to the largest magnitude, the golden tests' tolerance), greedy
 *    generation with the same tokens, VQ pixels within one level;
 *  - a tree verify on the GPU equals feeding the same tokens one by one;
 *  - bf16 (the GPU default): logits and next-token distributions within twice what
 *    rounding the weights (and, above 8 rows, the layer inputs) to bf16 does to the exact
 *    float64 model, as measured by tools/ref/bf16_deviation.py on models/fmnist:
 *    max |dlogit| / max |logit| 0.0039 (<= 8 rows) and 0.0067 (more rows), TV of the
 *    CFG'd next-token distribution 0.0035 and 0.010;
 *  - the same seed gives the same tokens on the GPU, for AR and for speculative decoding;
 *  - a GPT-B-shaped random model (3 of GPT-B's layers: width 768, 12 heads, vocabulary
 *    16384, 256 tokens), fp32 and bf16, GPU against CPU after 1, 128 and 255 decode steps on
 *    the fused path, and a 64-node tree at step 128.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <unistd.h>

#include "bench/bench.h"
#include "core/engine.h"
#include "core/host.h"
#include "core/models.h"
#include "core/registry.h"
#include "tests/gpu/gpu_testutil.h"
#include "tests/support/method_of.h"

#define FP32_RTOL 1e-4
/* twice tools/ref/bf16_deviation.py's maxima on models/fmnist (see the top comment) */
#define BF16_FEW_ROWS_RTOL 0.008
#define BF16_FEW_ROWS_TV 0.007
#define BF16_MANY_ROWS_RTOL 0.015
#define BF16_MANY_ROWS_TV 0.02

static vspec_host g_host;
static vs_registry *g_reg;
static vspec_dev *g_cpu, *g_gpu, *g_gpu_bf16;

typedef struct pair {
  vs_models *cpu, *gpu;
  int V, d;
} pair;

static vs_models *open_models(vspec_dev *dev, const char *dir, unsigned roles) {
  vs_models *m = NULL;
  char err[VSPEC_ERRLEN];
  if (vs_models_open(g_reg, &g_host, dev, dir, roles, &m, err, sizeof err))
    fail_msg("%s on %s: %s", dir, vs_dev_ops(dev)->name, err);
  return m;
}

static void pair_open(pair *p, vspec_dev *gpu, const char *dir) {
  p->cpu = open_models(g_cpu, dir, VS_ROLE_TARGET);
  p->gpu = open_models(gpu, dir, VS_ROLE_TARGET);
  p->V = p->cpu->target.info.vocab;
  p->d = p->cpu->target.info.feature_dim;
}

static void pair_close(pair *p) {
  vs_models_close(p->cpu);
  vs_models_close(p->gpu);
}

static vspec_session *session(vs_models *m, vspec_dev *dev, int cls, int rows, int max_nodes) {
  vspec_session_config c = {.struct_size = sizeof c, .class_label = cls, .rows = rows,
                            .max_nodes = max_nodes};
  vspec_session *s = NULL;
  char err[VSPEC_ERRLEN];
  if (m->target.vt->session_open(m->target.model, dev, &c, &s, err, sizeof err))
    fail_msg("session_open: %s", err);
  return s;
}

static void prefill(vs_models *m, vspec_session *s, float *logits, float *feats) {
  vspec_forward_out o = {.struct_size = sizeof o, .logits = logits, .features = feats};
  char err[VSPEC_ERRLEN];
  if (m->target.vt->prefill(s, &o, err, sizeof err)) fail_msg("prefill: %s", err);
}

static void forward(vs_models *m, vspec_session *s, const int32_t *tokens, const int32_t *parents,
                    int n, float *logits, float *feats) {
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = n, .tokens = tokens,
                           .parents = parents};
  vspec_forward_out o = {.struct_size = sizeof o, .logits = logits, .features = feats};
  char err[VSPEC_ERRLEN];
  if (m->target.vt->forward(s, &b, &o, err, sizeof err)) fail_msg("forward: %s", err);
}

static void commit(vs_models *m, vspec_session *s, const int32_t *path, int n) {
  char err[VSPEC_ERRLEN];
  if (m->target.vt->commit(s, path, n, err, sizeof err)) fail_msg("commit: %s", err);
}

/* TV distance between the CFG'd (scale 1.5), temperature-1 distributions of two
 * [2, V] logit rows. */
static double cfg_tv(const float *a, const float *b, int V) {
  vs_sampler sp;
  if (vs_sampler_init(&sp, V)) abort();
  vs_sampling s = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 1.5f,
                   .cfg_interval = -1};
  float *pa = gt_host((size_t)V), *pb = gt_host((size_t)V);
  vs_node_distribution(&sp, a, 2, 1, &s, pa);
  vs_node_distribution(&sp, b, 2, 1, &s, pb);
  double tv = 0;
  for (int i = 0; i < V; i++) tv += fabs((double)pa[i] - pb[i]);
  free(pa), free(pb);
  vs_sampler_free(&sp);
  return tv / 2;
}

/* Compares n nodes x 2 rows of logits (and features if given); per node for TV. */
static void expect_logits(const char *what, const float *gpu, const float *cpu, int n, int V,
                          double rtol, double max_tv) {
  for (int i = 0; i < n; i++) {
    char w[96];
    snprintf(w, sizeof w, "%s node %d", what, i);
    gt_close(w, gpu + (size_t)i * 2 * V, cpu + (size_t)i * 2 * V, (size_t)2 * V, rtol, 0);
    if (max_tv > 0) {
      double tv = cfg_tv(gpu + (size_t)i * 2 * V, cpu + (size_t)i * 2 * V, V);
      if (!(tv <= max_tv)) fail_msg("%s: TV %.4g > %.4g", w, tv, max_tv);
    }
  }
}

/* Prefill, six decode steps, a 7-node tree, a commit and one more step: GPU vs CPU. */
static void compare_sessions(const char *dir, vspec_dev *gpu, double rtol_few, double tv_few,
                             double rtol_tree, double tv_tree) {
  pair p;
  pair_open(&p, gpu, dir);
  int V = p.V, d = p.d;
  vspec_session *sc = session(p.cpu, g_cpu, 3, 2, 16), *sg = session(p.gpu, gpu, 3, 2, 16);
  float *lc = gt_host((size_t)16 * 2 * V), *lg = gt_host((size_t)16 * 2 * V);
  float *fc = gt_host((size_t)16 * 2 * d), *fg = gt_host((size_t)16 * 2 * d);
  prefill(p.cpu, sc, lc, fc);
  prefill(p.gpu, sg, lg, fg);
  expect_logits("prefill", lg, lc, 1, V, rtol_few, tv_few);
  if (rtol_few == FP32_RTOL) gt_close("prefill features", fg, fc, (size_t)2 * d, FP32_RTOL, 0);
  vspec_rng rng;
  vs_rng_init(&rng, 77, 0);
  const int32_t root = -1, zero = 0;
  for (int step = 0; step < 6; step++) {
    int32_t t = (int32_t)(vs_rng_uniform(&rng) * V);
    forward(p.cpu, sc, &t, &root, 1, lc, fc);
    forward(p.gpu, sg, &t, &root, 1, lg, fg);
    expect_logits("decode", lg, lc, 1, V, rtol_few, tv_few);
    commit(p.cpu, sc, &zero, 1);
    commit(p.gpu, sg, &zero, 1);
  }
  int32_t tt[7], tp[7] = {-1, 0, 0, 1, 1, 2, 3}, path[3] = {0, 1, 3};
  for (int i = 0; i < 7; i++) tt[i] = (int32_t)(vs_rng_uniform(&rng) * V);
  forward(p.cpu, sc, tt, tp, 7, lc, fc);
  forward(p.gpu, sg, tt, tp, 7, lg, fg);
  expect_logits("tree", lg, lc, 7, V, rtol_tree, tv_tree);
  if (rtol_few == FP32_RTOL) gt_close("tree features", fg, fc, (size_t)7 * 2 * d, FP32_RTOL, 0);
  commit(p.cpu, sc, path, 3);
  commit(p.gpu, sg, path, 3);
  int32_t t = 5 % V;
  forward(p.cpu, sc, &t, &root, 1, lc, fc);
  forward(p.gpu, sg, &t, &root, 1, lg, fg);
  expect_logits("after commit", lg, lc, 1, V, rtol_few, tv_few);
  p.cpu->target.vt->session_close(sc);
  p.gpu->target.vt->session_close(sg);
  free(lc), free(lg), free(fc), free(fg);
  pair_close(&p);
}

static void test_fp32_micro(void **state) {
  compare_sessions("tests/golden/micro_c2i", g_gpu, FP32_RTOL, 0, FP32_RTOL, 0);
}

static void test_fp32_fmnist(void **state) {
  compare_sessions("models/fmnist", g_gpu, FP32_RTOL, 0, FP32_RTOL, 0);
}

static void test_bf16_fmnist(void **state) {
  compare_sessions("models/fmnist", g_gpu_bf16, BF16_FEW_ROWS_RTOL, BF16_FEW_ROWS_TV,
                   BF16_MANY_ROWS_RTOL, BF16_MANY_ROWS_TV);
}

/* A tree verify on the GPU gives each node the logits a sequential decode of its path
 * gives (also on the GPU). */
static void test_tree_equals_sequential(void **state) {
  vs_models *m = open_models(g_gpu, "models/fmnist", VS_ROLE_TARGET);
  int V = m->target.info.vocab;
  /* tree: 0 -> 1 -> 3 -> 5 and 0 -> 2 -> 4 */
  int32_t tt[6] = {11, 12, 13, 14, 15, 16}, tp[6] = {-1, 0, 0, 1, 2, 3};
  float *tree = gt_host((size_t)6 * 2 * V), *seq = gt_host((size_t)2 * V);
  vspec_session *st = session(m, g_gpu, 4, 2, 16);
  prefill(m, st, seq, NULL);
  forward(m, st, tt, tp, 6, tree, NULL);
  static const int paths[2][4] = {{0, 1, 3, 5}, {0, 2, 4, -1}};
  const int32_t root = -1, zero = 0;
  for (int pth = 0; pth < 2; pth++) {
    vspec_session *ss = session(m, g_gpu, 4, 2, 16);
    prefill(m, ss, seq, NULL);
    for (int j = 0; j < 4 && paths[pth][j] >= 0; j++) {
      int node = paths[pth][j];
      forward(m, ss, &tt[node], &root, 1, seq, NULL);
      commit(m, ss, &zero, 1);
      char what[64];
      snprintf(what, sizeof what, "tree node %d vs sequential", node);
      gt_close(what, tree + (size_t)node * 2 * V, seq, (size_t)2 * V, FP32_RTOL, 0);
    }
    m->target.vt->session_close(ss);
  }
  m->target.vt->session_close(st);
  free(tree), free(seq);
  vs_models_close(m);
}

static void generate(vs_models *m, vspec_dev *dev, const char *method, int cls, uint64_t seed,
                     float temperature, int32_t *tokens) {
  vs_job job = {.method = vs_method_of(method),
                .class_label = cls, .seed = seed, .sampling = m->defaults};
  job.sampling.temperature = temperature;
  char err[VSPEC_ERRLEN];
  if (vs_generate(m, dev, &job, tokens, NULL, err, sizeof err))
    fail_msg("%s on %s: %s", method, vs_dev_ops(dev)->name, err);
}

/* Greedy decoding picks the same tokens on both devices (fp32), and exact speculative
 * decoding on the GPU picks AR's. */
static void test_greedy_tokens(void **state) {
  vs_models *mc = open_models(g_cpu, "models/fmnist", VS_ROLE_ALL);
  vs_models *mg = open_models(g_gpu, "models/fmnist", VS_ROLE_ALL);
  int N = mc->target.info.grid_h * mc->target.info.grid_w;
  int32_t a[1024], b[1024], c[1024];
  for (int cls = 0; cls < 4; cls++) {
    generate(mc, g_cpu, "ar", cls, 1, 0.0f, a);
    generate(mg, g_gpu, "ar", cls, 1, 0.0f, b);
    generate(mg, g_gpu, "sd:exact@standard:shape=static", cls, 1, 0.0f, c);
    for (int i = 0; i < N; i++) {
      if (a[i] != b[i]) fail_msg("class %d: greedy token %d is %d on the CPU, %d on the GPU", cls, i, a[i], b[i]);
      if (a[i] != c[i]) fail_msg("class %d: greedy SD token %d is %d, AR's is %d", cls, i, c[i], a[i]);
    }
  }
  vs_models_close(mc);
  vs_models_close(mg);
}

static void test_same_seed_same_tokens(void **state) {
  vs_models *m = open_models(g_gpu_bf16, "models/fmnist", VS_ROLE_ALL);
  int N = m->target.info.grid_h * m->target.info.grid_w;
  static const char *const methods[] = {"ar", "sd:exact@standard:shape=static",
                                        "sd:coolsd:delta=2@standard:shape=chain,depth=3"};
  int32_t a[1024], b[1024];
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
    generate(m, g_gpu_bf16, methods[i], 6, 12345, 1.0f, a);
    generate(m, g_gpu_bf16, methods[i], 6, 12345, 1.0f, b);
    assert_memory_equal(a, b, (size_t)N * sizeof(int32_t));
  }
  vs_models_close(m);
}

/* The VQ decoder on the GPU: RGB within one level of the CPU's, and rarely off at all. */
static void test_vq_pixels(void **state) {
  pair p;
  pair_open(&p, g_gpu, "models/fmnist");
  const vs_backend_model *tc = &p.cpu->target, *tg = &p.gpu->target;
  int N = tc->info.grid_h * tc->info.grid_w;
  size_t n = (size_t)tc->info.image_h * tc->info.image_w * 3;
  uint8_t *rc = malloc(n), *rg = malloc(n);
  int32_t tokens[1024];
  vspec_rng rng;
  vs_rng_init(&rng, 5, 0);
  char err[VSPEC_ERRLEN];
  for (int img = 0; img < 4; img++) {
    for (int i = 0; i < N; i++) tokens[i] = (int32_t)(vs_rng_uniform(&rng) * p.V);
    if (tc->vt->decode(tc->model, g_cpu, tokens, rc, err, sizeof err) ||
        tg->vt->decode(tg->model, g_gpu, tokens, rg, err, sizeof err))
      fail_msg("decode: %s", err);
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
      int dlt = abs((int)rc[i] - (int)rg[i]);
      if (dlt > 1) fail_msg("image %d: pixel byte %zu is %d on the CPU, %d on the GPU", img, i, rc[i], rg[i]);
      off += dlt != 0;
    }
    if (off * 100 > n) fail_msg("image %d: %zu of %zu bytes differ by one", img, off, n);
  }
  free(rc), free(rg);
  pair_close(&p);
}

static int setup(void **state) {
  g_gpu = gt_gpu(VS_PRECISION_FP32);
  g_gpu_bf16 = gt_gpu(VS_PRECISION_BF16);
  g_cpu = gt_cpu();
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&g_host, vs_cpu_ops());
  if (vs_registry_open(dir, &g_host, &g_reg, err, sizeof err)) {
    fprintf(stderr, "registry: %s\n", err);
    return -1;
  }
  vs_device_info info;
  vs_dev_info(g_gpu, &info);
  printf("device: %s\n", info.name);
  return 0;
}

static int teardown(void **state) {
  vs_registry_close(g_reg);
  vs_dev_destroy(g_gpu);
  vs_dev_destroy(g_gpu_bf16);
  vs_dev_destroy(g_cpu);
  return 0;
}

/* One GPT-B-shaped checkpoint, written once, loaded on the CPU and on a GPU context. */
static void gptb_compare(vspec_dev *gpu, double rtol_few, double tv_few, double rtol_tree,
                         double tv_tree) {
  char err[VSPEC_ERRLEN], path[128];
  snprintf(path, sizeof path, "/tmp/vspec-gptb-%d.safetensors", (int)getpid());
  if (vs_bench_write_random_gpt(path, 3, 768, 12, 12, 16384, 16, 1000, 3, err, sizeof err))
    fail_msg("%s", err);
  vs_backend_model mc, mg;
  if (vs_backend_model_load(g_reg, &g_host, g_cpu, "llamagen", path, "max_nodes=64", &mc, err,
                            sizeof err) ||
      vs_backend_model_load(g_reg, &g_host, gpu, "llamagen", path, "max_nodes=64", &mg, err,
                            sizeof err))
    fail_msg("%s", err);
  unlink(path);
  int V = mc.info.vocab;
  vspec_session_config cfg = {.struct_size = sizeof cfg, .class_label = 207, .rows = 2,
                              .max_nodes = 64};
  vspec_session *sc, *sg;
  if (mc.vt->session_open(mc.model, g_cpu, &cfg, &sc, err, sizeof err) ||
      mg.vt->session_open(mg.model, gpu, &cfg, &sg, err, sizeof err))
    fail_msg("session_open: %s", err);
  float *lc = gt_host((size_t)64 * 2 * V), *lg = gt_host((size_t)64 * 2 * V);
  vspec_forward_out oc = {.struct_size = sizeof oc, .logits = lc};
  vspec_forward_out og = {.struct_size = sizeof og, .logits = lg};
  if (mc.vt->prefill(sc, &oc, err, sizeof err) || mg.vt->prefill(sg, &og, err, sizeof err))
    fail_msg("prefill: %s", err);
  vspec_rng rng;
  vs_rng_init(&rng, 128, 0);
  const int32_t root = -1, zero = 0;
  for (int step = 1; step <= 255; step++) {
    int32_t t = (int32_t)(vs_rng_uniform(&rng) * V);
    vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = 1, .tokens = &t,
                             .parents = &root};
    if (mc.vt->forward(sc, &b, &oc, err, sizeof err) || mg.vt->forward(sg, &b, &og, err, sizeof err))
      fail_msg("step %d: %s", step, err);
    char what[48];
    snprintf(what, sizeof what, "GPT-B shape, step %d", step);
    if (step == 1 || step == 128 || step == 255) expect_logits(what, lg, lc, 1, V, rtol_few, tv_few);
    if (step == 128) { /* a 64-node tree below the step's node, then back to the chain */
      int32_t tt[64], tp[64];
      for (int i = 0; i < 64; i++) {
        tt[i] = (int32_t)(vs_rng_uniform(&rng) * V);
        tp[i] = i == 0 ? -1 : (int32_t)(vs_rng_uniform(&rng) * i);
      }
      vspec_forward_batch tb = {.struct_size = sizeof tb, .n_nodes = 64, .tokens = tt,
                                .parents = tp};
      if (mc.vt->forward(sc, &tb, &oc, err, sizeof err) ||
          mg.vt->forward(sg, &tb, &og, err, sizeof err))
        fail_msg("tree: %s", err);
      expect_logits("GPT-B shape, 64-node tree", lg, lc, 64, V, rtol_tree, tv_tree);
      if (mc.vt->forward(sc, &b, &oc, err, sizeof err) ||
          mg.vt->forward(sg, &b, &og, err, sizeof err))
        fail_msg("step %d again: %s", step, err);
    }
    if (mc.vt->commit(sc, &zero, 1, err, sizeof err) || mg.vt->commit(sg, &zero, 1, err, sizeof err))
      fail_msg("commit: %s", err);
  }
  mc.vt->session_close(sc);
  mg.vt->session_close(sg);
  free(lc), free(lg);
  vs_backend_model_unload(&mc);
  vs_backend_model_unload(&mg);
}

static void test_gptb_shape_fp32(void **state) {
  (void)state;
  gptb_compare(g_gpu, FP32_RTOL, 0, FP32_RTOL, 0);
}

static void test_gptb_shape_bf16(void **state) {
  (void)state;
  gptb_compare(g_gpu_bf16, BF16_FEW_ROWS_RTOL, BF16_FEW_ROWS_TV, BF16_MANY_ROWS_RTOL,
               BF16_MANY_ROWS_TV);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fp32_micro),
      cmocka_unit_test(test_fp32_fmnist),
      cmocka_unit_test(test_bf16_fmnist),
      cmocka_unit_test(test_tree_equals_sequential),
      cmocka_unit_test(test_greedy_tokens),
      cmocka_unit_test(test_same_seed_same_tokens),
      cmocka_unit_test(test_vq_pixels),
      cmocka_unit_test(test_gptb_shape_fp32),
      cmocka_unit_test(test_gptb_shape_bf16),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
