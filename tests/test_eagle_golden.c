/*
 * The `eagle` draft-head backend against the float64 reference (tools/ref/eagle_ref.py):
 * every node's logits and output feature equal a from-scratch causal run of its path, across
 * a chain forward, a commit, a tree forward and an appended forward.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/host.h"
#include "core/models.h"
#include "core/safetensors.h"
#include "kernels/vs_kernels.h"
#include "tests/support/test_device.h"

static vspec_host host;
static vspec_dev *dev;
static vs_registry *reg;

static const void *tensor(vspec_tensor_file *g, const char *name, int64_t *numel) {
  vspec_tensor t = {.struct_size = sizeof t};
  if (vs_st_find(g, name, &t)) fail_msg("golden tensor '%s' missing", name);
  if (numel) *numel = t.numel;
  return t.data;
}

static void expect_close(const char *what, const float *got, const float *want, int64_t n) {
  double maxref = 0, maxdiff = 0;
  for (int64_t i = 0; i < n; i++) {
    maxref = fmax(maxref, fabs(want[i]));
    maxdiff = fmax(maxdiff, fabs((double)got[i] - want[i]));
  }
  if (!(maxdiff <= 1e-4 * maxref)) fail_msg("%s: max |diff| %.3g vs max |ref| %.3g", what, maxdiff, maxref);
}

static void run_step(vs_backend_model *bm, vspec_session *s, vspec_tensor_file *g,
                     const char *name, int append) {
  char key[64], err[VSPEC_ERRLEN];
  int64_t n, nl, nf;
  snprintf(key, sizeof key, "%s.tokens", name);
  const int32_t *tok = tensor(g, key, &n);
  snprintf(key, sizeof key, "%s.parents", name);
  const int32_t *par = tensor(g, key, NULL);
  snprintf(key, sizeof key, "%s.features_in", name);
  const float *fin = tensor(g, key, NULL);
  snprintf(key, sizeof key, "%s.logits", name);
  const float *want_l = tensor(g, key, &nl);
  snprintf(key, sizeof key, "%s.features", name);
  const float *want_f = tensor(g, key, &nf);
  float *logits = malloc((size_t)nl * sizeof(float)), *feats = malloc((size_t)nf * sizeof(float));
  vspec_forward_batch b = {.struct_size = sizeof b, .n_nodes = (int32_t)n, .tokens = tok,
                           .parents = par, .features = fin, .append = append};
  vspec_forward_out o = {.struct_size = sizeof o, .logits = logits, .features = feats};
  if (bm->vt->forward(s, &b, &o, err, sizeof err)) fail_msg("%s: %s", name, err);
  snprintf(key, sizeof key, "%s logits", name);
  expect_close(key, logits, want_l, nl);
  snprintf(key, sizeof key, "%s features", name);
  expect_close(key, feats, want_f, nf);
  free(logits);
  free(feats);
}

static void test_eagle_head(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  vs_backend_model bm;
  int rc = vs_backend_model_load(reg, &host, dev, "eagle", "tests/golden/micro_eagle/eagle.safetensors",
                                 "target=tests/golden/micro_c2i/gpt.safetensors", &bm, err,
                                 sizeof err);
  if (rc) fail_msg("%s", err);
  assert_int_equal(bm.info.feature_in_dim, 64);
  assert_int_equal(bm.info.vocab, 64);
  vspec_tensor_file *g;
  assert_int_equal(vs_st_open("tests/golden/micro_eagle/golden.safetensors", &g, err, sizeof err), 0);
  vspec_session_config cfg = {.struct_size = sizeof cfg, .rows = 2, .max_nodes = 8};
  vspec_session *s;
  assert_int_equal(bm.vt->session_open(bm.model, dev, &cfg, &s, err, sizeof err), 0);
  assert_int_equal(bm.vt->prefill(s, NULL, err, sizeof err), 0);
  /* No features: a clear error, nothing changes. */
  int32_t t0 = 1, p0 = -1;
  vspec_forward_batch nb = {.struct_size = sizeof nb, .n_nodes = 1, .tokens = &t0, .parents = &p0};
  assert_int_equal(bm.vt->forward(s, &nb, NULL, err, sizeof err), VSPEC_EINVAL);
  assert_non_null(strstr(err, "features"));
  run_step(&bm, s, g, "a", 0);
  int64_t nc;
  const int32_t *commit = tensor(g, "a.commit", &nc);
  assert_int_equal(bm.vt->commit(s, commit, (int32_t)nc, err, sizeof err), 0);
  assert_int_equal(bm.vt->committed(s), 2);
  run_step(&bm, s, g, "b", 0);
  run_step(&bm, s, g, "c", 1);
  bm.vt->session_close(s);
  vs_st_close(g);
  vs_backend_model_unload(&bm);
  /* The target is required. */
  rc = vs_backend_model_load(reg, &host, dev, "eagle", "tests/golden/micro_eagle/eagle.safetensors",
                             "", &bm, err, sizeof err);
  assert_int_equal(rc, VSPEC_EINVAL);
  assert_non_null(strstr(err, "target=FILE"));
}

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&host, vs_cpu_ops());
  dev = vt_test_device(1); /* VSPEC_TEST_DEVICE: make gpu-test runs this on CUDA */
  printf("device: %s\n", vt_test_device_name());
  if (vs_registry_open(dir, &host, &reg, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_eagle_head)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_registry_close(reg);
  vs_dev_destroy(dev);
  return rc;
}
