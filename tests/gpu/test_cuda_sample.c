/* tests/gpu/test_cuda_sample.c - the CUDA device's sample_tokens (kernels/cuda/cuda_draw.cu)
 * against the CPU's (vs_cpu_sample_tokens: the engine's host sampler) on the same logits.
 *
 * Random cases over vocabularies of 16384, 1000 and 7 (and a few odd sizes), 1 and 2 CFG
 * rows (guidance on, off and mixed per node), temperature 0 (greedy), 0.5, 1, 1.7, top-k 0,
 * 1, 5, 100, top-p 1, 0.9, 0.5, 1 / 3 / 64 nodes, uniforms near 0, near 1 and anywhere;
 * half the cases draw logits from a coarse grid, so that many equal values sit at the
 * maximum and at the top-k and top-p thresholds. Tokens must agree exactly for greedy
 * draws, top-k 1 and empty distributions (-1); elsewhere the host and the device add their
 * double sums in other orders and compute top-p's weights with expf / vs_exp_poly, which can
 * move a draw that falls within ~1e-7 of a boundary: at most 0.5 % of draws may differ (the
 * rate is printed). A chi-square test checks the device's draws against the CPU's
 * probabilities (vocabulary 64, 20000 draws, uniforms from a fixed LCG). Every call must
 * make no upload, download or wait (kernels/vs_device.h counters). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/gpu/gpu_testutil.h"

#define MAX_MISMATCH_RATE 0.005

static vspec_dev *g_gpu, *g_cpu;

static int setup(void **state) {
  gt_open_pair(&g_gpu, &g_cpu);
  return gt_need_op(GT_HAS_OP(g_gpu, sample_tokens), "sample_tokens");
}

static int teardown(void **state) {
  gt_close_pair(g_gpu, g_cpu);
  return 0;
}

/* The tokens of spec (host arrays) on the CPU into want and on the GPU into got; the GPU
 * call must not transfer or wait. */
static void draw_both(const float *logits, const vspec_sample_spec *spec, int32_t *want,
                      int32_t *got) {
  const vspec_ops *cpu = vs_dev_ops(g_cpu), *gpu = vs_dev_ops(g_gpu);
  size_t n = (size_t)spec->n, count = n * (size_t)spec->rows * (size_t)spec->vocab;
  cpu->sample_tokens(g_cpu, logits, spec, want);

  float *dl = (float *)gt_up_bytes(g_gpu, logits, count * sizeof(float));
  uint8_t *dg = spec->guided ? (uint8_t *)gt_up_bytes(g_gpu, spec->guided, n) : NULL;
  double *du = (double *)gt_up_bytes(g_gpu, spec->u, n * sizeof(double));
  int32_t *dt = (int32_t *)gt_up_bytes(g_gpu, NULL, n * sizeof(int32_t));
  vspec_sample_spec ds = *spec;
  ds.guided = dg;
  ds.u = du;
  vs_dev_counters before, now;
  vs_dev_counters_get(g_gpu, &before);
  gpu->sample_tokens(g_gpu, dl, &ds, dt);
  vs_dev_counters_get(g_gpu, &now);
  vs_dev_counters_sub(&now, &before);
  if (now.uploads || now.downloads || now.syncs)
    fail_msg("sample_tokens: %llu uploads, %llu downloads, %llu waits (want none)",
             (unsigned long long)now.uploads, (unsigned long long)now.downloads,
             (unsigned long long)now.syncs);
  char err[VSPEC_ERRLEN] = "";
  if (vs_dev_check(g_gpu, err, sizeof err)) fail_msg("device error: %s", err);
  if (gpu->download(g_gpu, got, dt, n * sizeof(int32_t))) fail_msg("download failed");
  gpu->free(g_gpu, dl);
  if (dg) gpu->free(g_gpu, dg);
  gpu->free(g_gpu, du);
  gpu->free(g_gpu, dt);
}

/* ---- random cases ------------------------------------------------------------------------- */

typedef struct stats {
  long draws, mismatches;
} stats;

/* Logits of one case: gaussian (sd 3), or with ties from a grid (half-units over [-6, 6];
 * whole units over [-2, 2] for tiny vocabularies); special = 1 sprinkles NaN and -inf. */
static void fill_logits(vspec_rng *rng, float *x, size_t count, int V, int ties, int special) {
  for (size_t i = 0; i < count; i++) {
    double g = vs_rng_normal(rng) * 3.0;
    if (ties) x[i] = V < 32 ? (float)floor(vs_rng_uniform(rng) * 5.0) - 2.0f
                            : (float)(floor(vs_rng_uniform(rng) * 25.0) * 0.5 - 6.0);
    else x[i] = (float)g;
    if (special) {
      double s = vs_rng_uniform(rng);
      if (s < 0.01) x[i] = NAN;
      else if (s < 0.02) x[i] = -INFINITY;
    }
  }
}

/* Node i's uniform: near 0, near 1 or anywhere (i mod 3), exactly 0 now and then. */
static double node_u(vspec_rng *rng, int i) {
  double r = vs_rng_uniform(rng);
  switch (i % 3) {
  case 0: return r < 0.2 ? 0.0 : r * 1e-9;
  case 1: return 1.0 - (r + 0.001) * 1e-9;
  default: return r;
  }
}

static void run_case(vspec_rng *rng, int V, int rows, int n, float temp, int top_k, float top_p,
                     int ties, int special, int guided_mode, stats *st, const char *tag) {
  size_t count = (size_t)n * rows * V;
  float *logits = gt_host(count);
  fill_logits(rng, logits, count, V, ties, special);
  uint8_t *guided = NULL;
  if (rows == 2 && guided_mode) { /* 1: all off, 2: mixed */
    guided = (uint8_t *)malloc((size_t)n);
    for (int i = 0; i < n; i++) guided[i] = guided_mode == 2 && vs_rng_uniform(rng) < 0.6;
  }
  double *u = (double *)malloc((size_t)n * sizeof(double));
  for (int i = 0; i < n; i++) u[i] = node_u(rng, i);
  vspec_sample_spec spec = {.n = n, .rows = rows, .vocab = V, .top_k = top_k,
                            .cfg_scale = 1.0f + 4.0f * (float)vs_rng_uniform(rng),
                            .temperature = temp, .top_p = top_p, .guided = guided, .u = u};
  int32_t *want = (int32_t *)malloc((size_t)n * sizeof(int32_t));
  int32_t *got = (int32_t *)malloc((size_t)n * sizeof(int32_t));
  draw_both(logits, &spec, want, got);
  /* greedy, top-k 1 and "no mass" are exact: no sum decides them (top-k 1 draws among the
   * tied maxima, equal probabilities, at u away from their boundaries) */
  int exact = !(temp > 0.0f) || top_k == 1;
  for (int i = 0; i < n; i++) {
    st->draws++;
    if (got[i] == want[i]) continue;
    st->mismatches++;
    if (got[i] < -1 || got[i] >= V)
      fail_msg("%s node %d: token %d out of range (cpu %d)", tag, i, got[i], want[i]);
    if (exact || got[i] < 0 || want[i] < 0)
      fail_msg("%s V=%d rows=%d n=%d T=%g k=%d p=%g ties=%d node %d u=%.17g: gpu %d, cpu %d",
               tag, V, rows, n, temp, top_k, top_p, ties, i, u[i], got[i], want[i]);
    if (st->mismatches <= 10)
      print_message("  mismatch %s V=%d rows=%d T=%g k=%d p=%g ties=%d node %d u=%.17g: gpu %d, "
                    "cpu %d\n", tag, V, rows, temp, top_k, top_p, ties, i, u[i], got[i], want[i]);
  }
  free(logits), free(guided), free(u), free(want), free(got);
}

static void test_random_cases(void **state) {
  static const int vocabs[] = {16384, 1000, 7}, ns[] = {1, 3, 64}, top_ks[] = {0, 1, 5, 100};
  static const float temps[] = {0.0f, 0.5f, 1.0f, 1.7f}, top_ps[] = {1.0f, 0.9f, 0.5f};
  vspec_rng rng;
  vs_rng_init(&rng, 29, 4);
  stats st = {0, 0};
  int c = 0;
  for (int vi = 0; vi < 3; vi++)
    for (int rows = 1; rows <= 2; rows++)
      for (int ti = 0; ti < 4; ti++)
        for (int ki = 0; ki < 4; ki++)
          for (int pi = 0; pi < 3; pi++)
            for (int ties = 0; ties <= 1; ties++, c++) {
              int n = ns[(c / 2 + vi + ki) % 3];
              run_case(&rng, vocabs[vi], rows, n, temps[ti], top_ks[ki], top_ps[pi], ties,
                       c % 7 == 3, c % 3, &st, "random");
            }
  double rate = (double)st.mismatches / (double)st.draws;
  print_message("random cases: %ld draws, %ld differ from the CPU (%.3f %%)\n", st.draws,
                st.mismatches, 100.0 * rate);
  if (rate > MAX_MISMATCH_RATE)
    fail_msg("%.3f %% of the draws differ from the CPU (allowed %.1f %%)", 100.0 * rate,
             100.0 * MAX_MISMATCH_RATE);
}

/* Odd sizes (one entry, a vocabulary above the block's thread count that is not a multiple
 * of it), NaN temperature, top_p <= 0 (the first maximum alone), rows with no finite logit
 * (-1; greedy: 0) or a +inf one (-1, as the host's NaN softmax gives). */
static void test_edges(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 29, 5);
  stats st = {0, 0};
  static const int sizes[] = {1, 2, 1023, 1025, 100003};
  for (int si = 0; si < 5; si++)
    for (int ties = 0; ties <= 1; ties++) {
      run_case(&rng, sizes[si], 2, 5, 1.0f, 0, 1.0f, ties, 0, 2, &st, "edge");
      run_case(&rng, sizes[si], 1, 5, 0.8f, 3, 0.7f, ties, 1, 0, &st, "edge");
      run_case(&rng, sizes[si], 1, 4, 0.0f, 0, 1.0f, ties, 1, 0, &st, "edge");
    }
  run_case(&rng, 500, 1, 6, NAN, 5, 0.9f, 1, 0, 0, &st, "edge NaN temperature");
  run_case(&rng, 500, 2, 6, 1e-7f, 0, 1.0f, 1, 0, 2, &st, "edge tiny temperature");
  run_case(&rng, 500, 1, 6, 1.0f, 0, 0.0f, 1, 0, 0, &st, "edge top_p 0");
  run_case(&rng, 500, 1, 6, 1.0f, 0, -0.5f, 1, 0, 0, &st, "edge top_p < 0");
  run_case(&rng, 3000, 1, 6, 1.0f, 2999, 0.999f, 0, 0, 0, &st, "edge k = V - 1");

  /* rows without mass: all NaN, all -inf, a +inf entry; greedy and not */
  int V = 300, n = 3;
  float *x = gt_host((size_t)n * V);
  for (int j = 0; j < V; j++) x[j] = NAN, x[V + j] = -INFINITY, x[2 * V + j] = (float)j * 0.01f;
  x[2 * V + 17] = INFINITY;
  double u[3] = {0.5, 0.5, 0.5};
  static const float temps[] = {0.0f, 1.0f};
  for (int ti = 0; ti < 2; ti++)
    for (int k = 0; k <= 5; k += 5) {
      vspec_sample_spec spec = {.n = n, .rows = 1, .vocab = V, .top_k = k, .cfg_scale = 1.0f,
                                .temperature = temps[ti], .top_p = k ? 0.9f : 1.0f, .u = u};
      int32_t want[3], got[3];
      draw_both(x, &spec, want, got);
      for (int i = 0; i < n; i++)
        if (got[i] != want[i])
          fail_msg("no-mass row %d (T=%g k=%d): gpu %d, cpu %d", i, temps[ti], k, got[i],
                   want[i]);
      if (ti == 1 && (got[0] != -1 || got[1] != -1 || got[2] != -1))
        fail_msg("rows without mass drew %d %d %d (want -1)", got[0], got[1], got[2]);
    }
  free(x);
  if (st.mismatches * 1.0 > MAX_MISMATCH_RATE * st.draws + 1)
    fail_msg("edges: %ld of %ld draws differ", st.mismatches, st.draws);
  print_message("edge cases: %ld draws, %ld differ\n", st.draws, st.mismatches);
}

/* ---- the distribution of the draws ------------------------------------------------------ */

/* P(chi2_df > x), Wilson-Hilferty's normal approximation (good to ~1e-3 relative at df 20+). */
static double chi2_tail(double x, int df) {
  double k = df, zz = (cbrt(x / k) - (1.0 - 2.0 / (9.0 * k))) / sqrt(2.0 / (9.0 * k));
  return 0.5 * erfc(zz / sqrt(2.0));
}

static void chi2_case(int top_k, float top_p) {
  enum { V = 64, N = 20000 };
  vspec_rng rng;
  vs_rng_init(&rng, 29, 6);
  float row[V];
  for (int j = 0; j < V; j++) row[j] = (float)(vs_rng_normal(&rng) * 1.5);
  float *logits = gt_host((size_t)N * V);
  for (int i = 0; i < N; i++) memcpy(logits + (size_t)i * V, row, sizeof row);
  double *u = (double *)malloc(N * sizeof(double));
  uint64_t lcg = 12345;
  for (int i = 0; i < N; i++) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    u[i] = (double)(lcg >> 11) * (1.0 / 9007199254740992.0);
  }
  vspec_sample_spec spec = {.n = N, .rows = 1, .vocab = V, .top_k = top_k, .cfg_scale = 1.0f,
                            .temperature = 1.0f, .top_p = top_p, .u = u};
  int32_t *want = (int32_t *)malloc(N * sizeof(int32_t)), *got = (int32_t *)malloc(N * 4);
  draw_both(logits, &spec, want, got);
  float probs[V];
  vs_dev_ops(g_cpu)->logits_to_probs(g_cpu, row, V, 1.0f, top_k, top_p, probs);
  long hist[V] = {0}, differ = 0;
  for (int i = 0; i < N; i++) {
    if (got[i] < 0 || got[i] >= V) fail_msg("chi2: token %d out of range", got[i]);
    if (!(probs[got[i]] > 0.0f)) fail_msg("chi2: drew %d, which has no probability", got[i]);
    hist[got[i]]++;
    differ += got[i] != want[i];
  }
  /* bins with an expected count below 5 are pooled */
  double chi2 = 0.0, pool_e = 0.0, pool_o = 0.0;
  int bins = 0;
  for (int j = 0; j < V; j++) {
    double e = (double)probs[j] * N;
    if (!(e > 0.0)) continue;
    if (e < 5.0) {
      pool_e += e, pool_o += (double)hist[j];
      continue;
    }
    chi2 += ((double)hist[j] - e) * ((double)hist[j] - e) / e, bins++;
  }
  if (pool_e > 0.0) chi2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e, bins++;
  double p = bins > 1 ? chi2_tail(chi2, bins - 1) : 1.0;
  print_message("chi2 (top_k %d, top_p %g): %.1f over %d bins, p = %.3g; %ld of %d draws "
                "differ from the CPU\n", top_k, top_p, chi2, bins, p, differ, N);
  if (!(p > 1e-4)) fail_msg("chi2 %.1f over %d bins: p = %.3g", chi2, bins, p);
  if (differ > N * MAX_MISMATCH_RATE) fail_msg("%ld of %d draws differ from the CPU", differ, N);
  free(logits), free(u), free(want), free(got);
}

static void test_chi2(void **state) {
  chi2_case(0, 1.0f);
  chi2_case(20, 0.9f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_cases),
      cmocka_unit_test(test_edges),
      cmocka_unit_test(test_chi2),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
