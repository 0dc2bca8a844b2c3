/* tests/gpu/test_cuda_sd_exact.c - exact speculative decoding on the GPU samples the
 * target's distribution.
 *
 * The micro golden GPT (vocabulary 64, 16 tokens) with its EAGLE head on the device, CFG
 * 2, temperature 1. The exact distributions of image tokens 1 and 2 (marginalised over the
 * tokens before them) are computed from the target on the same device: 1 + 64 + 64*64
 * one-token forwards. SAMPLES images are generated with exact SD over a static tree; the
 * counts of tokens 1 and 2 must pass Pearson's chi-square (p > 1e-3). The deliberately
 * wrong rule that accepts with min(1, 3 q/p) must fail the same test, which shows the
 * test can fail at this sample size.
 *
 * The same with a chain of the head drafted on the device (ABI 1.8: drafts, their
 * distributions and the target's features never cross to the host), whose rounds must also
 * wait once each, as must a static tree's drawn there (ABI 1.10; on a GPU the static tree
 * above is drawn there too, VSPEC_DRAFT_DRAW's default).
 *
 * And in bf16 (marginals, head and target all in bf16) with a static tree drawn on the device
 * (ABI 1.10: draw_children), exact and the wrong rule.
 *
 * VSPEC_TEST_DEVICE=cpu runs the same test on the CPU (how it was calibrated without a
 * GPU); make gpu-test runs it on cuda.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <unistd.h>

#include "core/engine.h"
#include "core/host.h"
#include "core/models.h"
#include "core/registry.h"
#include "core/tree.h"
#include "tests/gpu/gpu_testutil.h"
#include "tests/support/stats.h"
#include "tests/support/method_of.h"

#define SAMPLES 8000
#define P_MIN 1e-3
#define TREE "shape=static,tree=0/1/2/0.0/0.1/1.0/0.0.0"
#define CHAIN "shape=chain,depth=3,drafter=head"

static vspec_host g_host;
static vs_registry *g_reg;
static vspec_dev *g_dev;
static vs_models *g_models;
static char g_dir[256];
static vs_sampling g_s = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 2.0f,
                          .cfg_interval = -1};

/* A model directory with the micro target and its EAGLE head (links to the goldens). */
static void make_model_dir(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/vspec-gpu-sd-XXXXXX");
  if (!mkdtemp(g_dir)) abort();
  char cwd[512], a[1024], b[1024];
  if (!getcwd(cwd, sizeof cwd)) abort();
  snprintf(a, sizeof a, "%s/tests/golden/micro_c2i/gpt.safetensors", cwd);
  snprintf(b, sizeof b, "%s/gpt.safetensors", g_dir);
  if (symlink(a, b)) abort();
  snprintf(a, sizeof a, "%s/tests/golden/micro_eagle/eagle.safetensors", cwd);
  snprintf(b, sizeof b, "%s/eagle.safetensors", g_dir);
  if (symlink(a, b)) abort();
  snprintf(b, sizeof b, "%s/vspec-model.json", g_dir);
  FILE *f = fopen(b, "w");
  if (!f) abort();
  fprintf(f, "{\"name\": \"micro\", \"target\": {\"backend\": \"llamagen\", \"gpt\": "
             "\"gpt.safetensors\"}, \"eagle\": {\"backend\": \"eagle\", \"weights\": "
             "\"eagle.safetensors\", \"target\": \"gpt.safetensors\"}}\n");
  fclose(f);
}

/* Exact distributions of image tokens 1 and 2 under the target on g_dev. */
static void exact_marginals(double *p1, double *p2) {
  const vs_backend_model *t = &g_models->target;
  int V = t->info.vocab;
  vs_sampler sp;
  if (vs_sampler_init(&sp, V)) abort();
  float *logits = gt_host((size_t)2 * V), *q0 = gt_host((size_t)V), *q1 = gt_host((size_t)V);
  float *q2 = gt_host((size_t)V);
  char err[VSPEC_ERRLEN];
  for (int v = 0; v < V; v++) p1[v] = p2[v] = 0.0;
  vspec_session_config c = {.struct_size = sizeof c, .class_label = 0, .rows = 2, .max_nodes = 4};
  const int32_t root = -1, zero = 0;
  vspec_forward_out o = {.struct_size = sizeof o, .logits = logits};
  for (int t0 = -1; t0 < V; t0++) {
    vspec_session *s = NULL;
    if (t->vt->session_open(t->model, g_dev, &c, &s, err, sizeof err) ||
        t->vt->prefill(s, &o, err, sizeof err))
      fail_msg("%s", err);
    vs_node_distribution(&sp, logits, 2, 0, &g_s, q0);
    if (t0 < 0) { /* first pass: only q0 is needed, and it is the same in every session */
      t->vt->session_close(s);
      continue;
    }
    vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = 1, .tokens = &t0, .parents = &root};
    if (t->vt->forward(s, &b, &o, err, sizeof err) || t->vt->commit(s, &zero, 1, err, sizeof err))
      fail_msg("%s", err);
    vs_node_distribution(&sp, logits, 2, 1, &g_s, q1);
    for (int t1 = 0; t1 < V; t1++) {
      double w01 = (double)q0[t0] * q1[t1];
      p1[t1] += w01;
      if (w01 == 0.0) continue;
      vspec_forward_batch b1 = {.struct_size = sizeof b1, .n_nodes = 1, .tokens = &t1,
                                .parents = &root};
      if (t->vt->forward(s, &b1, &o, err, sizeof err)) fail_msg("%s", err); /* not committed */
      vs_node_distribution(&sp, logits, 2, 2, &g_s, q2);
      for (int t2 = 0; t2 < V; t2++) p2[t2] += w01 * q2[t2];
    }
    t->vt->session_close(s);
  }
  free(logits), free(q0), free(q1), free(q2);
  vs_sampler_free(&sp);
}

/* Chi-square p-values of tokens 1 and 2 over SAMPLES images generated with `method`. */
static void sample_n_pvalues(const char *method, int samples, const double *p1, const double *p2,
                             double *pv1, double *pv2) {
  int V = g_models->target.info.vocab;
  int64_t *c1 = calloc((size_t)V, sizeof *c1), *c2 = calloc((size_t)V, sizeof *c2);
  int32_t tokens[64];
  char err[VSPEC_ERRLEN];
  vs_metrics total;
  memset(&total, 0, sizeof total);
  for (int i = 0; i < samples; i++) {
    vs_job job = {.method = vs_method_of(method),
                  .class_label = 0, .seed = 7000003ull + (uint64_t)i,
                  .sampling = g_s};
    vs_metrics mt;
    if (vs_generate(g_models, g_dev, &job, tokens, &mt, err, sizeof err))
      fail_msg("%s: %s", method, err);
    vs_metrics_add(&total, &mt);
    c1[tokens[1]]++;
    c2[tokens[2]]++;
  }
  double stat1, stat2;
  int dof1, dof2;
  *pv1 = vs_chi2_test(c1, p1, V, samples, 5.0, &stat1, &dof1);
  *pv2 = vs_chi2_test(c2, p2, V, samples, 5.0, &stat2, &dof2);
  printf("  %-62s token 1: chi2 %7.1f dof %2d p %.3g; token 2: chi2 %7.1f dof %2d p %.3g; "
         "TPF %.2f\n", method, stat1, dof1, *pv1, stat2, dof2, *pv2, vs_metrics_tpf(&total));
  free(c1), free(c2);
}

static void sample_pvalues(const char *method, const double *p1, const double *p2, double *pv1,
                           double *pv2) {
  sample_n_pvalues(method, SAMPLES, p1, p2, pv1, pv2);
}

static void test_exact_sd_matches_target(void **state) {
  int V = g_models->target.info.vocab;
  double *p1 = calloc((size_t)V, sizeof *p1), *p2 = calloc((size_t)V, sizeof *p2);
  exact_marginals(p1, p2);
  double s1 = 0, s2 = 0;
  for (int v = 0; v < V; v++) s1 += p1[v], s2 += p2[v];
  assert_true(fabs(s1 - 1.0) < 1e-4 && fabs(s2 - 1.0) < 1e-4);
  double a, b;
  sample_pvalues("ar", p1, p2, &a, &b);
  if (!(a > P_MIN && b > P_MIN)) fail_msg("AR does not sample its own target (p %.3g, %.3g)", a, b);
  sample_pvalues("sd:exact@standard:" TREE, p1, p2, &a, &b);
  if (!(a > P_MIN && b > P_MIN)) fail_msg("exact SD failed the chi-square test (p %.3g, %.3g)", a, b);
  /* the wrong rule must be caught by the very same test */
  sample_pvalues("sd:uniform_rsd:omega=3,resample=rule@standard:" TREE, p1, p2, &a, &b);
  if (!(a < P_MIN || b < P_MIN))
    fail_msg("the wrong rule passed the chi-square test (p %.3g, %.3g)", a, b);
  free(p1), free(p2);
}

/* Drafts drawn on the device (ABI 1.8, core/draft_device.c): a chain of the head, its
 * drafts, distributions and the target's features kept where they were computed, waiting
 * once a round, still samples the target; the wrong rule still fails the same test. */
static int64_t g_rounds, g_over;
static vs_dev_counters g_last;

static void count_waits(void *user, const vs_round_info *in) {
  (void)user;
  vs_dev_counters now, d;
  vs_dev_counters_get(g_dev, &now);
  d = now;
  vs_dev_counters_sub(&d, &g_last);
  g_last = now;
  if (in->round == 0 || !in->tree || in->tree->n == 1) return;
  g_rounds++;
  g_over += d.downloads + d.syncs != 1;
}

static void test_device_chain_matches_target(void **state) {
  int V = g_models->target.info.vocab;
  double *p1 = calloc((size_t)V, sizeof *p1), *p2 = calloc((size_t)V, sizeof *p2);
  exact_marginals(p1, p2);
  setenv("VSPEC_WALK", "device", 1);
  setenv("VSPEC_DRAFT_DRAW", "device", 1);
  /* one job of each shape, its rounds' waits counted (a static tree: ABI 1.10) */
  static const char *const shapes[] = {"sd:exact@standard:" CHAIN,
                                       "sd:exact@standard:" TREE ",drafter=head"};
  for (int i = 0; i < 2; i++) {
    int32_t tokens[64];
    char err[VSPEC_ERRLEN];
    vs_metrics mt;
    vs_job job = {.method = vs_method_of(shapes[i]), .seed = 5, .sampling = g_s,
                  .on_round = count_waits};
    g_rounds = g_over = 0;
    vs_dev_counters_get(g_dev, &g_last);
    if (vs_generate(g_models, g_dev, &job, tokens, &mt, err, sizeof err)) fail_msg("%s", err);
    printf("  %s: %lld rounds, %lld waited more than once\n", shapes[i], (long long)g_rounds,
           (long long)g_over);
    assert_true(g_rounds > 0);
    assert_int_equal(g_over, 0);
  }
  double a, b;
  /* half the samples: the suite's time on a GPU; the wrong rule's p-values stay far below */
  sample_n_pvalues("sd:exact@standard:" CHAIN, SAMPLES / 2, p1, p2, &a, &b);
  if (!(a > P_MIN && b > P_MIN))
    fail_msg("exact SD drafted on the device failed the chi-square test (p %.3g, %.3g)", a, b);
  sample_n_pvalues("sd:uniform_rsd:omega=3,resample=rule@standard:" CHAIN, SAMPLES / 2, p1, p2,
                   &a, &b);
  if (!(a < P_MIN || b < P_MIN))
    fail_msg("the wrong rule passed the chi-square test (p %.3g, %.3g)", a, b);
  unsetenv("VSPEC_WALK");
  unsetenv("VSPEC_DRAFT_DRAW");
  free(p1), free(p2);
}

/* The same in bf16 (the GPU's default precision): the target's marginals computed in bf16
 * on the device, a static tree of the head drawn there (ABI 1.10), the wrong rule caught. */
static void test_bf16_device_tree_matches_target(void **state) {
  const char *spec = getenv("VSPEC_TEST_DEVICE");
  vspec_dev *dev = NULL, *dev32 = g_dev;
  vs_models *models = NULL, *models32 = g_models;
  char err[VSPEC_ERRLEN];
  if (spec && strcmp(spec, "cpu") == 0) {
    vs_device_options opt = {.threads = 1, .precision = VS_PRECISION_BF16};
    if (vs_device_open("cpu", &opt, &dev, err, sizeof err)) fail_msg("%s", err);
  } else {
    dev = gt_gpu(VS_PRECISION_BF16);
  }
  if (vs_models_open(g_reg, &g_host, dev, g_dir, VS_ROLE_ALL, &models, err, sizeof err))
    fail_msg("%s", err);
  g_dev = dev;
  g_models = models;
  int V = g_models->target.info.vocab;
  double *p1 = calloc((size_t)V, sizeof *p1), *p2 = calloc((size_t)V, sizeof *p2);
  exact_marginals(p1, p2);
  setenv("VSPEC_WALK", "device", 1);
  setenv("VSPEC_DRAFT_DRAW", "device", 1);
  double a, b;
  /* a quarter of the samples: the suite's time on a GPU (the wrong rule's p-values stay below
   * 1e-20 at this size on the CPU) */
  sample_n_pvalues("sd:exact@standard:" TREE ",drafter=head", SAMPLES / 4, p1, p2, &a, &b);
  int exact_ok = a > P_MIN && b > P_MIN;
  double wa, wb;
  sample_n_pvalues("sd:uniform_rsd:omega=3,resample=rule@standard:" TREE ",drafter=head",
                   SAMPLES / 4, p1, p2, &wa, &wb);
  unsetenv("VSPEC_WALK");
  unsetenv("VSPEC_DRAFT_DRAW");
  g_dev = dev32;
  g_models = models32;
  vs_models_close(models);
  vs_dev_destroy(dev);
  free(p1), free(p2);
  if (!exact_ok)
    fail_msg("bf16 exact SD, tree drawn on the device, failed the chi-square test (p %.3g, %.3g)",
             a, b);
  if (!(wa < P_MIN || wb < P_MIN))
    fail_msg("the wrong rule passed the chi-square test in bf16 (p %.3g, %.3g)", wa, wb);
}

static int setup(void **state) {
  const char *spec = getenv("VSPEC_TEST_DEVICE");
  g_dev = spec && strcmp(spec, "cpu") == 0 ? gt_cpu() : gt_gpu(VS_PRECISION_FP32);
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&g_host, vs_cpu_ops());
  make_model_dir();
  if (vs_registry_open(dir, &g_host, &g_reg, err, sizeof err) ||
      vs_models_open(g_reg, &g_host, g_dev, g_dir, VS_ROLE_ALL, &g_models, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return -1;
  }
  vs_device_info info;
  vs_dev_info(g_dev, &info);
  printf("device: %s\n", info.name);
  return 0;
}

static int teardown(void **state) {
  vs_models_close(g_models);
  vs_registry_close(g_reg);
  vs_dev_destroy(g_dev);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_exact_sd_matches_target),
                                     cmocka_unit_test(test_device_chain_matches_target),
                                     cmocka_unit_test(test_bf16_device_tree_matches_target)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
