/*
 * Graph replay (ABI 1.5, include/vspec/ops.h graph_begin) bit-identical to eager execution,
 * on the CPU, whose graphs record the ops and replay them with the arguments they were
 * recorded with (kernels/cpu/cpu_graph.c): a faithful checker of what a CUDA graph would
 * replay. tests/support/graph_replay.h compares the LlamaGen backend with graphs=on against
 * graphs=pad (the same padded forwards run eagerly) across KV lengths, buckets 1 to 16, tree
 * shapes, appended batches, two interleaved sessions, 1 and 2 CFG rows and device draws;
 * here also whole engine jobs (AR, exact SD, LANTERN on models/fmnist) and the device
 * semantics themselves: recorded ops do not run, a launch runs them, an op that cannot be
 * recorded fails the recording, a graph older than the device's scratch is refused. VSPEC_TEST_DEVICE=cuda runs the same on a GPU
 * (tests/gpu/test_cuda_graphs.c is the GPU suite's copy).
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
#include "core/engine.h"
#include "core/host.h"
#include "core/models.h"
#include "core/registry.h"
#include "kernels/vs_kernels.h"
#include "tests/support/graph_replay.h"
#include "tests/support/test_device.h"
#include "tests/support/method_of.h"

static vspec_host host;
static vspec_dev *dev;
static vs_registry *reg;

/* Recorded ops do not run; each launch runs them once, reading memory as it is then; an op
 * the device cannot record fails the recording; no graph: VSPEC_ENOENT. */
static void test_device_semantics(void **state) {
  (void)state;
  const vspec_ops *o = vs_dev_ops(dev);
  assert_true(vspec_has_graphs(o));
  float x[4] = {1, 2, 3, 4}, w[4] = {1, 0, 0, 1}, y[4] = {0}, back[4];
  float *dx = o->alloc(dev, sizeof x), *dw = o->alloc(dev, sizeof w), *dy = o->alloc(dev, sizeof y);
  assert_int_equal(o->upload(dev, dx, x, sizeof x), 0);
  assert_int_equal(o->upload(dev, dw, w, sizeof w), 0);
  assert_int_equal(o->upload(dev, dy, y, sizeof y), 0);
  vspec_graph *g = NULL;
  assert_int_equal(o->graph_launch(dev, NULL), VSPEC_ENOENT);
  assert_int_equal(o->graph_begin(dev), 0);
  assert_int_equal(o->graph_begin(dev), VSPEC_EBUSY);
  o->linear_add(dev, dx, 2, 2, dw, 2, dy); /* y += x W^T, W = I: y += x */
  assert_int_equal(o->graph_end(dev, &g), 0);
  assert_non_null(g);
  assert_int_equal(o->download(dev, back, dy, sizeof back), 0);
  for (int i = 0; i < 4; i++) assert_true(back[i] == 0.0f); /* recorded, not run */
  x[0] = 10; /* a launch reads memory as it is when it runs */
  assert_int_equal(o->upload(dev, dx, x, sizeof x), 0);
  for (int k = 0; k < 2; k++) assert_int_equal(o->graph_launch(dev, g), 0);
  assert_int_equal(o->download(dev, back, dy, sizeof back), 0);
  for (int i = 0; i < 4; i++) assert_true(back[i] == 2 * x[i]);
  /* the device's scratch reallocated since the recording (a CUDA graph's kernels hold its
   * old address): the launch is refused as stale and runs nothing; recorded again, it runs */
  assert_int_equal(o->reserve_scratch(dev, (size_t)96 << 20), 0);
  assert_int_equal(o->graph_launch(dev, g), VSPEC_ENOENT);
  o->graph_free(dev, g);
  assert_int_equal(o->download(dev, back, dy, sizeof back), 0);
  for (int i = 0; i < 4; i++) assert_true(back[i] == 2 * x[i]); /* untouched */
  assert_int_equal(o->graph_begin(dev), 0);
  o->linear_add(dev, dx, 2, 2, dw, 2, dy);
  assert_int_equal(o->graph_end(dev, &g), 0);
  assert_int_equal(o->graph_launch(dev, g), 0);
  assert_int_equal(o->download(dev, back, dy, sizeof back), 0);
  for (int i = 0; i < 4; i++) assert_true(back[i] == 3 * x[i]);
  o->graph_free(dev, g);
  /* a transfer inside a recording: refused, not run, and the recording fails */
  assert_int_equal(o->graph_begin(dev), 0);
  o->linear_add(dev, dx, 2, 2, dw, 2, dy);
  assert_int_not_equal(o->upload(dev, dy, y, sizeof y), 0);
  assert_int_equal(o->graph_end(dev, &g), VSPEC_ENOTSUP);
  assert_null(g);
  assert_int_equal(o->download(dev, back, dy, sizeof back), 0);
  for (int i = 0; i < 4; i++) assert_true(back[i] == 3 * x[i]); /* untouched */
  assert_int_equal(o->graph_end(dev, &g), VSPEC_EINVAL); /* none open */
  o->free(dev, dx);
  o->free(dev, dw);
  o->free(dev, dy);
}

/* A random GPT with grouped-query attention, 12 x 12 tokens: room for the script's KV
 * lengths. */
static void test_replay_random_gqa(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN], path[128];
  snprintf(path, sizeof path, "/tmp/vspec-graph-%d.safetensors", (int)getpid());
  if (vs_bench_write_random_gpt(path, 3, 64, 4, 2, 40, 12, 10, 7, err, sizeof err))
    fail_msg("%s", err);
  gr_check_model(reg, &host, dev, path, 9);
  unlink(path);
}

/* Plain multi-head attention, two layers, another vocabulary. */
static void test_replay_random_mha(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN], path[128];
  snprintf(path, sizeof path, "/tmp/vspec-graph-mha-%d.safetensors", (int)getpid());
  if (vs_bench_write_random_gpt(path, 2, 32, 2, 2, 50, 12, 10, 3, err, sizeof err))
    fail_msg("%s", err);
  gr_check_model(reg, &host, dev, path, 2);
  unlink(path);
}

/* Whole jobs through the engine on models/fmnist (target, draft GPT, EAGLE head): the same
 * tokens with graphs as with the same padded forwards run eagerly. The mode comes from
 * VSPEC_GRAPHS, read when a model loads (the models' manifest names no graphs=). */
static void test_engine_jobs(void **state) {
  (void)state;
  static const char *const methods[] = {
      "ar", "sd:exact@standard:shape=chain,drafter=model,depth=3",
      "sd:lantern@standard:shape=dynamic,drafter=head,depth=4,top_k=4,total_tokens=8"};
  static const char *const modes[2] = {"on", "pad"};
  char err[VSPEC_ERRLEN];
  vs_models *m[2];
  for (int i = 0; i < 2; i++) {
    setenv("VSPEC_GRAPHS", modes[i], 1);
    if (vs_models_open(reg, &host, dev, "models/fmnist", VS_ROLE_ALL, &m[i], err, sizeof err))
      fail_msg("%s", err);
  }
  unsetenv("VSPEC_GRAPHS");
  int N = m[0]->target.info.grid_h * m[0]->target.info.grid_w;
  int32_t *tok[2] = {malloc(sizeof(int32_t) * N), malloc(sizeof(int32_t) * N)};
  for (size_t k = 0; k < sizeof methods / sizeof methods[0]; k++) {
    vs_dev_counters c0, c1;
    for (int i = 0; i < 2; i++) {
      vs_job job = {.method = vs_method_of(methods[k]), .class_label = 4, .seed = 11 + k,
                    .sampling = m[i]->defaults};
      vs_dev_counters_get(dev, &c0);
      if (vs_generate(m[i], dev, &job, tok[i], NULL, err, sizeof err))
        fail_msg("%s: %s", methods[k], err);
      vs_dev_counters_get(dev, &c1);
      vs_dev_counters_sub(&c1, &c0);
      if (i == 0) {
        printf("  %s: %llu graph launches\n", methods[k], (unsigned long long)c1.launches);
        assert_true(c1.launches > 0);
      } else {
        assert_int_equal(c1.launches, 0);
      }
    }
    for (int j = 0; j < N; j++)
      if (tok[0][j] != tok[1][j])
        fail_msg("%s: token %d: %d with graphs, %d without", methods[k], j, tok[0][j], tok[1][j]);
  }
  free(tok[0]);
  free(tok[1]);
  vs_models_close(m[0]);
  vs_models_close(m[1]);
}

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&host, vs_cpu_ops());
  dev = vt_test_device(2);
  printf("device: %s\n", vt_test_device_name());
  if (vs_registry_open(dir, &host, &reg, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_device_semantics),
      cmocka_unit_test(test_replay_random_gqa),
      cmocka_unit_test(test_replay_random_mha),
      cmocka_unit_test(test_engine_jobs),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_registry_close(reg);
  vs_dev_destroy(dev);
  return rc;
}
