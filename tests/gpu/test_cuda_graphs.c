/* tests/gpu/test_cuda_graphs.c - CUDA graphs (ABI 1.5, kernels/cuda/cuda_graph.cu) replayed
 * against eager execution through the LlamaGen backend: graphs=on (tree forwards padded to
 * their node-count bucket, one captured graph per bucket and head kind) against graphs=pad
 * (the same padded forwards launched kernel by kernel), bit for bit, across KV lengths,
 * buckets 1 to 16, tree shapes, appended batches, two interleaved sessions, 1 and 2 CFG rows
 * and device draws (tests/support/graph_replay.h, which tests/test_graph_replay.c runs on the
 * CPU's recording graphs), at fp32 and bf16. A step through a graph must make one upload,
 * one launch and one download; the graphs must have been launched, not fallen back from. A
 * graph captured before the context's scratch was reallocated is refused at launch. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <unistd.h>

#include "bench/bench.h"
#include "core/host.h"
#include "tests/gpu/gpu_testutil.h"
#include "tests/support/graph_replay.h"

static vspec_host host;
static vs_registry *reg;

/* The capture of a fused op records it without running it; each launch runs it. */
static void check_semantics(vspec_dev *dev) {
  const vspec_ops *o = vs_dev_ops(dev);
  assert_true(vspec_has_graphs(o));
  assert_int_equal(o->reserve_scratch(dev, 1u << 20), 0);
  float x[4] = {1, 2, 3, 4}, w[4] = {1, 0, 0, 1}, y[4] = {0}, back[4];
  float *dx = o->alloc(dev, sizeof x), *dw = o->alloc(dev, sizeof w), *dy = o->alloc(dev, sizeof y);
  assert_int_equal(o->upload(dev, dx, x, sizeof x), 0);
  assert_int_equal(o->upload(dev, dw, w, sizeof w), 0);
  o->linear_add(dev, dx, 2, 2, dw, 2, dy); /* eager once: converts the weight if bf16 */
  assert_int_equal(o->upload(dev, dy, y, sizeof y), 0);
  vspec_graph *g = NULL;
  assert_int_equal(o->graph_launch(dev, NULL), VSPEC_ENOENT);
  assert_int_equal(o->graph_begin(dev), 0);
  o->linear_add(dev, dx, 2, 2, dw, 2, dy);
  assert_int_equal(o->graph_end(dev, &g), 0);
  assert_int_equal(o->download(dev, back, dy, sizeof back), 0);
  for (int i = 0; i < 4; i++) assert_true(back[i] == 0.0f);
  for (int k = 0; k < 2; k++) assert_int_equal(o->graph_launch(dev, g), 0);
  assert_int_equal(o->download(dev, back, dy, sizeof back), 0);
  for (int i = 0; i < 4; i++) assert_true(fabsf(back[i] - 2 * x[i]) < 1e-2f);
  /* the scratch reallocated since the capture (its kernels hold the old address): the launch
   * is refused as stale and runs nothing, the context stays good; captured again, it runs */
  assert_int_equal(o->reserve_scratch(dev, (size_t)96 << 20), 0);
  assert_int_equal(o->graph_launch(dev, g), VSPEC_ENOENT);
  o->graph_free(dev, g);
  assert_int_equal(o->graph_begin(dev), 0);
  o->linear_add(dev, dx, 2, 2, dw, 2, dy);
  assert_int_equal(o->graph_end(dev, &g), 0);
  assert_int_equal(o->graph_launch(dev, g), 0);
  assert_int_equal(o->download(dev, back, dy, sizeof back), 0);
  for (int i = 0; i < 4; i++) assert_true(fabsf(back[i] - 3 * x[i]) < 1e-2f);
  o->graph_free(dev, g);
  /* an upload inside a capture fails the capture, not the context */
  assert_int_equal(o->graph_begin(dev), 0);
  assert_int_not_equal(o->upload(dev, dy, y, sizeof y), 0);
  assert_int_not_equal(o->graph_end(dev, &g), 0);
  assert_null(g);
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_dev_check(dev, err, sizeof err), 0);
  o->free(dev, dx);
  o->free(dev, dw);
  o->free(dev, dy);
}

static void run(int precision) {
  vspec_dev *dev = gt_gpu(precision);
  check_semantics(dev);
  char err[VSPEC_ERRLEN], path[128];
  snprintf(path, sizeof path, "/tmp/vspec-cuda-graph-%d.safetensors", (int)getpid());
  if (vs_bench_write_random_gpt(path, 3, 64, 4, 2, 40, 12, 10, 7, err, sizeof err))
    fail_msg("%s", err);
  gr_check_model(reg, &host, dev, path, 9);
  unlink(path);
  assert_int_equal(vs_dev_check(dev, err, sizeof err), 0);
  vs_dev_destroy(dev);
}

static void test_graphs_fp32(void **state) {
  (void)state;
  run(VS_PRECISION_FP32);
}

static void test_graphs_bf16(void **state) {
  (void)state;
  run(VS_PRECISION_BF16);
}

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024];
  vs_dev_destroy(gt_gpu(VS_PRECISION_FP32)); /* skips (77) without a usable GPU */
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&host, vs_cpu_ops());
  if (vs_registry_open(dir, &host, &reg, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_graphs_fp32),
      cmocka_unit_test(test_graphs_bf16),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_registry_close(reg);
  return rc;
}
