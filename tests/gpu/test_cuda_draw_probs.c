/* tests/gpu/test_cuda_draw_probs.c - the CUDA device's draw_probs (ABI 1.8,
 * kernels/cuda/cuda_draw.cu: a draft drawn on the device, its distribution kept there) against
 * the CPU's (vs_cpu_draw_probs: the host drafter's vs_node_distribution, then vs_draw or the
 * first maximum) on the same logits. Vocabularies 16384, 1000 and 7, 1 and 2 CFG rows (guidance
 * mixed per node), temperatures 0.5, 1, 1.7, top-k 0, 5, 100, top-p 1 and 0.9, 1 / 3 / 16
 * nodes, with u and with u NULL (the first maximum); half the cases with many ties. The rows
 * must agree to 2e-6 of their largest entry (the softmax sums add in another order); the
 * tokens exactly for u NULL and otherwise but for at most 0.5 % of draws (a uniform within
 * rounding of a boundary, as sample_tokens). No upload, download or wait in the call. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/gpu/gpu_testutil.h"

static vspec_dev *g_gpu, *g_cpu;

static int setup(void **state) {
  gt_open_pair(&g_gpu, &g_cpu);
  return gt_need_op(GT_HAS_OP(g_gpu, draw_probs), "draw_probs");
}

static int teardown(void **state) {
  gt_close_pair(g_gpu, g_cpu);
  return 0;
}

static long g_draws, g_mismatches;

static void dp_case(vspec_rng *rng, int V, int rows, int n, float temp, int top_k, float top_p,
                    int ties, int with_u) {
  size_t count = (size_t)n * rows * V;
  float *logits = gt_host(count), *want = gt_host((size_t)n * V);
  for (size_t i = 0; i < count; i++)
    logits[i] = ties ? (float)(floor(vs_rng_uniform(rng) * 25.0) * 0.5 - 6.0)
                     : (float)(vs_rng_normal(rng) * 3.0);
  uint8_t guided[16];
  double u[16];
  for (int i = 0; i < n; i++) guided[i] = vs_rng_uniform(rng) < 0.7, u[i] = vs_rng_uniform(rng);
  vspec_sample_spec spec = {.n = n, .rows = rows, .vocab = V, .top_k = top_k, .cfg_scale = 3.0f,
                            .temperature = temp, .top_p = top_p, .guided = guided,
                            .u = with_u ? u : NULL};
  int32_t wt[16], gtok[16];
  const vspec_ops *cpu = vs_dev_ops(g_cpu), *gpu = vs_dev_ops(g_gpu);
  cpu->draw_probs(g_cpu, logits, &spec, want, wt);
  float *dl = gt_up(g_gpu, logits, count), *dp = (float *)gt_up_bytes(g_gpu, NULL, (size_t)n * V * 4);
  int32_t *dt = (int32_t *)gt_up_bytes(g_gpu, NULL, (size_t)n * sizeof(int32_t));
  vspec_sample_spec ds = spec;
  ds.guided = (uint8_t *)gt_up_bytes(g_gpu, guided, (size_t)n);
  ds.u = with_u ? (double *)gt_up_bytes(g_gpu, u, (size_t)n * sizeof(double)) : NULL;
  vs_dev_counters before, now;
  vs_dev_counters_get(g_gpu, &before);
  gpu->draw_probs(g_gpu, dl, &ds, dp, dt);
  vs_dev_counters_get(g_gpu, &now);
  vs_dev_counters_sub(&now, &before);
  if (now.uploads || now.downloads || now.syncs) fail_msg("draw_probs transferred or waited");
  float *got = gt_down(g_gpu, dp, (size_t)n * V);
  if (gpu->download(g_gpu, gtok, dt, (size_t)n * sizeof(int32_t))) fail_msg("download failed");
  for (int i = 0; i < n; i++) {
    gt_close("draw_probs row", got + (size_t)i * V, want + (size_t)i * V, (size_t)V, 2e-6, 0.0);
    g_draws++;
    if (gtok[i] == wt[i]) continue;
    g_mismatches++;
    if (!with_u || gtok[i] < 0 || gtok[i] >= V)
      fail_msg("V=%d rows=%d T=%g k=%d p=%g node %d: gpu token %d, cpu %d", V, rows, temp, top_k,
               top_p, i, gtok[i], wt[i]);
  }
  gpu->free(g_gpu, dl), gpu->free(g_gpu, dp), gpu->free(g_gpu, dt);
  gpu->free(g_gpu, (void *)ds.guided);
  if (ds.u) gpu->free(g_gpu, (void *)ds.u);
  free(logits), free(want), free(got);
}

static void test_against_cpu(void **state) {
  static const int vocabs[] = {16384, 1000, 7}, ns[] = {1, 3, 16}, top_ks[] = {0, 5, 100};
  static const float temps[] = {0.5f, 1.0f, 1.7f}, top_ps[] = {1.0f, 0.9f};
  vspec_rng rng;
  vs_rng_init(&rng, 29, 0);
  for (int v = 0; v < 3; v++)
    for (int t = 0; t < 3; t++)
      for (int k = 0; k < 3; k++)
        for (int p = 0; p < 2; p++)
          dp_case(&rng, vocabs[v], 1 + (t + k) % 2, ns[(v + p) % 3], temps[t], top_ks[k],
                  top_ps[p], (k + p) % 2, (t + p) % 2);
  print_message("  %ld draws, %ld differ\n", g_draws, g_mismatches);
  assert_true(g_mismatches <= g_draws / 200);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_cpu)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
