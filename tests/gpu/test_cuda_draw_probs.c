/* tests/gpu/test_cuda_draw_probs.c - the CUDA device's draw_probs (ABI 1.8,
 * kernels/cuda/cuda_draw.cu: a draft drawn on the device, its distribution kept there) against
 * the CPU's (vs_cpu_draw_probs: the host drafter's vs_node_distribution, then vs_draw or the
 * first maximum) on the same logits. Vocabularies 16384, 1000 and 7, 1 and 2 CFG rows (guidance
 * mixed per node), temperatures 0.5, 1, 1.7, top-k 0, 5, 100, top-p 1 and 0.9, 1 / 3 / 16
 * nodes, with u and with u NULL (the first maximum); half the cases with many ties. The rows
 * must agree to 2e-6 of their largest entry (the softmax sums add in another order); the
 * tokens exactly for u NULL and otherwise but for at most 0.5 % of draws (a uniform within
 * rounding of a boundary, as sample_tokens). No upload, download or wait in the call.
 * Also draw_children (ABI 1.10: a static tree's children without replacement) against the
 * CPU's on the same rows: the tokens, which were drawn, and the uniforms taken; a row may
 * differ where a draw's uniform falls within rounding of a boundary (at most 1 % of rows). */
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

/* draw_children on rows with full, small and empty supports, some rows below a child that
 * ran out (all their children absent), up to 6 children a row; sampled and greedy (u NULL,
 * which the GPU must match exactly: no uniform near a boundary). */
static void test_children_against_cpu(void **state) {
  enum { N = 12, K = 72 };
  static const int vocabs[] = {16384, 1000, 7};
  if (!GT_HAS_OP(g_gpu, draw_children)) skip();
  const vspec_ops *cpu = vs_dev_ops(g_cpu), *gpu = vs_dev_ops(g_gpu);
  vspec_rng rng;
  vs_rng_init(&rng, 31, 0);
  char err[VSPEC_ERRLEN] = "";
  long rows_seen = 0, rows_differ = 0, absent = 0;
  for (int trial = 0; trial < 30; trial++) {
    int V = vocabs[trial % 3], total = 0;
    float *probs = gt_host((size_t)N * V);
    int32_t counts[N], first[N], node[N], want[K], got[K], wc = 0, gc = 0;
    uint8_t wd[K], gd[K];
    double u[K];
    for (int i = 0; i < N; i++) {
      int support = trial % 4 == 0 ? V : (int)(vs_rng_uniform(&rng) * 5); /* 0: an empty row */
      for (int y = 0; y < V; y++) probs[(size_t)i * V + y] = 0.0f;
      for (int j = 0; j < support; j++)
        probs[(size_t)i * V + (int)(vs_rng_uniform(&rng) * V)] = (float)vs_rng_uniform(&rng);
      counts[i] = (int)(vs_rng_uniform(&rng) * 7);
      first[i] = total;
      node[i] = i == 0 || total == 0 ? -1 : (int)(vs_rng_uniform(&rng) * total);
      total += counts[i];
    }
    for (int k = 0; k < total; k++) u[k] = vs_rng_uniform(&rng);
    int greedy = trial % 3 == 2; /* u NULL: the first maximum of what is left */
    vspec_children_spec cs = {.n = N, .vocab = V, .max_count = 6, .counts = counts,
                              .first = first, .node = node, .u = greedy ? NULL : u,
                              .cursor = &wc, .drawn = wd};
    cpu->draw_children(g_cpu, probs, &cs, want);
    vspec_children_spec ds = cs;
    ds.counts = (int32_t *)gt_up_bytes(g_gpu, counts, sizeof counts);
    ds.first = (int32_t *)gt_up_bytes(g_gpu, first, sizeof first);
    ds.node = (int32_t *)gt_up_bytes(g_gpu, node, sizeof node);
    ds.u = greedy ? NULL : (double *)gt_up_bytes(g_gpu, u, sizeof u);
    ds.cursor = (int32_t *)gt_up_bytes(g_gpu, &gc, sizeof gc);
    ds.drawn = (uint8_t *)gt_up_bytes(g_gpu, NULL, K);
    float *dp = gt_up(g_gpu, probs, (size_t)N * V);
    int32_t *dt = (int32_t *)gt_up_bytes(g_gpu, NULL, K * sizeof(int32_t));
    vs_dev_counters before, now;
    vs_dev_counters_get(g_gpu, &before);
    gpu->draw_children(g_gpu, dp, &ds, dt);
    vs_dev_counters_get(g_gpu, &now);
    vs_dev_counters_sub(&now, &before);
    if (now.uploads || now.downloads || now.syncs) fail_msg("draw_children transferred or waited");
    if (gpu->download(g_gpu, got, dt, K * sizeof(int32_t)) ||
        gpu->download(g_gpu, gd, ds.drawn, K) ||
        gpu->download(g_gpu, &gc, ds.cursor, sizeof gc) || vs_dev_check(g_gpu, err, sizeof err))
      fail_msg("draw_children failed on the GPU: %s", err);
    int differ = 0;
    for (int i = 0; i < N; i++) {
      size_t a = (size_t)first[i], n = (size_t)counts[i];
      rows_seen++;
      int same = !memcmp(got + a, want + a, n * sizeof(int32_t)) && !memcmp(gd + a, wd + a, n);
      rows_differ += !same;
      differ |= !same;
      for (size_t j = 0; j < n; j++) absent += !wd[a + j];
    }
    if (!differ) assert_int_equal(gc, wc);
    if (greedy && differ) fail_msg("V=%d: greedy children differ from the CPU's", V);
    const void *bufs[] = {ds.counts, ds.first, ds.node, ds.u, ds.cursor, ds.drawn, dp, dt};
    for (size_t b = 0; b < sizeof bufs / sizeof bufs[0]; b++)
      if (bufs[b]) gpu->free(g_gpu, (void *)bufs[b]);
    free(probs);
  }
  print_message("  draw_children: %ld rows, %ld differ, %ld absent children\n", rows_seen,
                rows_differ, absent);
  assert_true(absent > 0 && rows_differ <= rows_seen / 100);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_cpu),
                                     cmocka_unit_test(test_children_against_cpu)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
