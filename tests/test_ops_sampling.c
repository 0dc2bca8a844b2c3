/* tests/test_ops_sampling.c - softmax family and LlamaGen's sampling
 * (autoregressive/models/generate.py, sample and top_k_top_p_filtering). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "kernels/common/vs_math.h"
#include "kernels/host/host_math.h"
#include "tests/support/kernels_testutil.h"

static vspec_dev *g_dev;
static const vspec_ops *g_ops;

static int setup(void **state) {
  g_dev = vt_dev(1);
  g_ops = vs_dev_ops(g_dev);
  return 0;
}

static int teardown(void **state) {
  vs_dev_destroy(g_dev);
  vs_host_simd_set(VS_HOST_SIMD_AVX512); /* back to the best this CPU has, if a test failed */
  return 0;
}

/* ---- softmax / log_softmax ------------------------------------------------------------ */

static void test_softmax(void **state) {
  enum { R = 3, N = 50 };
  vspec_rng rng;
  vs_rng_init(&rng, 51, 0);
  float x[R * N], y[R * N];
  double ref[R * N], lref[R * N];
  vt_fill(&rng, x, R * N, -20, 20);
  x[3] = x[7] = -INFINITY;
  x[N] = 80.0f; /* exp would overflow without the max shift */
  for (int i = 0; i < N; i++) x[2 * N + i] = -INFINITY; /* no finite entry */
  for (int r = 0; r < R; r++) {
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < N; i++) mx = fmax(mx, x[r * N + i]);
    for (int i = 0; i < N; i++) z += isinf(mx) ? 0 : exp(x[r * N + i] - mx);
    for (int i = 0; i < N; i++) {
      ref[r * N + i] = isinf(mx) ? 0 : exp(x[r * N + i] - mx) / z;
      lref[r * N + i] = isinf(mx) ? -INFINITY : x[r * N + i] - mx - log(z);
    }
  }
  memcpy(y, x, sizeof y);
  g_ops->softmax(g_dev, y, R, N);
  vt_assert_close(y, ref, R * N, 1e-5, 1e-12, "softmax");
  assert_true(y[3] == 0.0f && y[7] == 0.0f);
  memcpy(y, x, sizeof y);
  g_ops->log_softmax(g_dev, y, R, N);
  for (int i = 0; i < R * N; i++) {
    if (isinf(lref[i])) assert_true(isinf(y[i]) && y[i] < 0);
    else if (fabs(y[i] - lref[i]) > 1e-5 * fabs(lref[i]) + 2e-6)
      fail_msg("log_softmax %d: %.9g vs %.9g", i, (double)y[i], lref[i]);
  }
}

static void test_argmax(void **state) {
  float x[6] = {1, 5, NAN, 5, -INFINITY, 2};
  assert_int_equal(g_ops->argmax(g_dev, x, 6), 1);
  float y[3] = {-INFINITY, -INFINITY, -1e30f};
  assert_int_equal(g_ops->argmax(g_dev, y, 3), 2);
  float z[2] = {NAN, 3};
  assert_int_equal(g_ops->argmax(g_dev, z, 2), 1);
}

/* The exponentials and their double sum (vs_host_exp_row) in the documented order: entry i
 * into partial sum i mod 8, the eight added in the fixed tree. */
static double ref_exp_row(float *x, int n, float mx) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n; i++) {
    x[i] = vs_exp_poly(x[i] - mx);
    s[i % 8] += x[i];
  }
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* The host's softmax at every vector level (host_sampling.c): the level in force is the best
 * this CPU has; the exponentials and their double sum match the documented order bit for bit
 * (rows reaching below exp's range too); softmax rows of every length around the vector widths,
 * several rows, n = 0, -inf entries, a NaN row and an all -inf row give the scalar bits; and so
 * does logits_to_probs with top-k, top-p and a NaN logit on a 1024-token row. */
static void test_softmax_simd_levels_agree(void **state) {
  (void)state;
  enum { MAXN = 1100 };
  static float x[MAXN], want[MAXN], got[MAXN];
  vspec_rng rng;
  vs_rng_init(&rng, 77, 0);
  vt_fill(&rng, x, MAXN, -120, 30); /* reaches below vs_exp_poly's range from the maximum */
  for (int i = 0; i < MAXN; i += 7) x[i] = -INFINITY;
  int best = vs_host_simd_set(-1);
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  assert_int_equal(best, __builtin_cpu_supports("avx512f") ? VS_HOST_SIMD_AVX512
                         : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                             ? VS_HOST_SIMD_AVX2
                                                           : VS_HOST_SIMD_NONE);
#endif
  const int lens[] = {0, 1, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 1024, 1099};
  for (int level = VS_HOST_SIMD_NONE; level <= best; level++) {
    assert_int_equal(vs_host_simd_set(level), level);
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
      int n = lens[l];
      memcpy(want, x, n * sizeof(float));
      memcpy(got, x, n * sizeof(float));
      double ws = ref_exp_row(want, n, 30.0f), gs = vs_host_exp_row(got, n, 30.0f);
      if (memcmp(&ws, &gs, sizeof ws) || memcmp(want, got, n * sizeof(float)))
        fail_msg("exp row level %d length %d: sum %.17g, reference %.17g", level, n, gs, ws);
      memcpy(want, x, n * sizeof(float));
      vs_host_simd_set(VS_HOST_SIMD_NONE);
      vs_host_softmax(want, 1, n);
      memcpy(got, x, n * sizeof(float));
      vs_host_simd_set(level);
      vs_host_softmax(got, 1, n);
      for (int i = 0; i < n; i++)
        if (vs_f32_bits(got[i]) != vs_f32_bits(want[i]))
          fail_msg("softmax level %d length %d entry %d: %.9g, scalar %.9g", level, n, i,
                   (double)got[i], (double)want[i]);
    }
    /* three rows of 333 in one call: each row on its own */
    memcpy(got, x, 999 * sizeof(float));
    vs_host_softmax(got, 3, 333);
    for (int r = 0; r < 3; r++) {
      memcpy(want, x + 333 * r, 333 * sizeof(float));
      vs_host_softmax(want, 1, 333);
      assert_memory_equal(got + 333 * r, want, 333 * sizeof(float));
    }
  }
  /* a NaN poisons the row with the same bits at every level; an all -inf row becomes zeros */
  float nan_row[40], nan_want[40], inf_row[40];
  for (int level = VS_HOST_SIMD_NONE; level <= best; level++) {
    vs_host_simd_set(level);
    for (int i = 0; i < 40; i++) nan_row[i] = (float)i, inf_row[i] = -INFINITY;
    nan_row[21] = NAN;
    vs_host_softmax(nan_row, 1, 40);
    vs_host_softmax(inf_row, 1, 40);
    if (level == VS_HOST_SIMD_NONE) memcpy(nan_want, nan_row, sizeof nan_row);
    assert_memory_equal(nan_row, nan_want, sizeof nan_row);
    for (int i = 0; i < 40; i++) assert_true(isnan(nan_row[i]) && inf_row[i] == 0.0f);
  }
  static float pw[1024], pg[1024];
  char work[65536];
  assert_true(vs_host_probs_work_bytes(1024) <= sizeof work);
  x[5] = NAN; /* a NaN logit: probability 0 at every level */
  for (int level = VS_HOST_SIMD_AVX2; level <= best; level++) {
    vs_host_simd_set(VS_HOST_SIMD_NONE);
    int nw = vs_host_logits_to_probs(x, 1024, 0.9f, 300, 0.95f, pw, work);
    vs_host_simd_set(level);
    int ng = vs_host_logits_to_probs(x, 1024, 0.9f, 300, 0.95f, pg, work);
    assert_int_equal(nw, ng);
    assert_memory_equal(pw, pg, sizeof pw);
    assert_true(pw[5] == 0.0f);
  }
  vs_host_simd_set(best);
  if (best == VS_HOST_SIMD_NONE) print_message("  (no AVX2 on this CPU: the scalar loop only)\n");
}

/* ---- logits_to_probs: hand-made cases ------------------------------------------------- */

static int count_nonzero(const float *p, int n) {
  int c = 0;
  for (int i = 0; i < n; i++) c += p[i] > 0;
  return c;
}

static void test_top_k_ties(void **state) {
  const float logits[6] = {1, 3, 3, 2, 3, 0};
  float p[6];
  /* k = 2: the 2nd largest is 3, all three 3s survive */
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 6, 1.0f, 2, 1.0f, p), 3);
  for (int i = 0; i < 6; i++) {
    float want = (i == 1 || i == 2 || i == 4) ? 1.0f / 3 : 0.0f;
    assert_true(fabsf(p[i] - want) < 1e-6f);
  }
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 6, 1.0f, 1, 1.0f, p), 3);
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 6, 1.0f, 4, 1.0f, p), 4);
  assert_true(p[3] > 0 && p[0] == 0 && p[5] == 0);
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 6, 1.0f, 5, 1.0f, p), 5);
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 6, 1.0f, 100, 1.0f, p), 6);
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 6, 1.0f, 0, 1.0f, p), 6);
}

static void test_top_p_keeps_crossing_token(void **state) {
  /* probabilities 0.5, 0.3, 0.15, 0.05 stored out of order */
  float logits[4];
  logits[2] = logf(0.5f);
  logits[0] = logf(0.3f);
  logits[3] = logf(0.15f);
  logits[1] = logf(0.05f);
  float p[4];
  /* cumsum 0.5, 0.8 > 0.7: the token that crosses (0.3) is kept */
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 4, 1.0f, 0, 0.7f, p), 2);
  assert_true(fabsf(p[2] - 0.625f) < 1e-6f && fabsf(p[0] - 0.375f) < 1e-6f);
  assert_true(p[1] == 0.0f && p[3] == 0.0f);
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 4, 1.0f, 0, 0.9f, p), 3);
  assert_true(p[1] == 0.0f);
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 4, 1.0f, 0, 0.96f, p), 4);
  /* the top token survives whatever top_p is */
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 4, 1.0f, 0, 0.4f, p), 1);
  assert_true(p[2] == 1.0f);
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 4, 1.0f, 0, 0.0f, p), 1);
  assert_true(p[2] == 1.0f);
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 4, 1.0f, 0, 1.0f, p), 4);
  /* exact arithmetic: equal logits give cumsum 0.25, 0.5, 0.75, 1. The removal test is
   * strict (cumsum > top_p), so hitting top_p exactly is not crossing: with the shift the
   * token after the exact hit survives too. Ties rank by index. */
  const float flat[4] = {0, 0, 0, 0};
  assert_int_equal(g_ops->logits_to_probs(g_dev, flat, 4, 1.0f, 0, 0.5f, p), 3);
  assert_true(p[0] > 0 && p[1] > 0 && p[2] > 0 && p[3] == 0.0f);
}

static void test_top_k_before_top_p(void **state) {
  const float logits[4] = {logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f)};
  float p[4];
  /* top-p alone: 0.4, 0.7 > 0.5 -> two tokens */
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 4, 1.0f, 0, 0.5f, p), 2);
  /* after top-k 2 the softmax is 4/7, 3/7: 4/7 > 0.5 already -> one token */
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 4, 1.0f, 2, 0.5f, p), 1);
  assert_true(p[0] == 1.0f);
  /* and 4/7 < 0.6 keeps both survivors of top-k, renormalised */
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 4, 1.0f, 2, 0.6f, p), 2);
  assert_true(fabsf(p[0] - 4.0f / 7) < 1e-6f && fabsf(p[1] - 3.0f / 7) < 1e-6f);
}

static void test_greedy_and_temperature(void **state) {
  float logits[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f}, p[5];
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 5, 0.0f, 0, 1.0f, p), 1);
  for (int i = 0; i < 5; i++) assert_true(p[i] == (i == 1 ? 1.0f : 0.0f));
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 5, -2.0f, 3, 0.5f, p), 1);
  assert_true(p[1] == 1.0f);
  /* temperature divides the logits */
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 5, 2.0f, 0, 1.0f, p), 5);
  double z = 0, ref[5];
  for (int i = 0; i < 5; i++) z += exp(logits[i] / 2.0);
  for (int i = 0; i < 5; i++) ref[i] = exp(logits[i] / 2.0) / z;
  vt_assert_close(p, ref, 5, 1e-6, 1e-7, "temperature 2");
  /* a tiny positive temperature is clamped at 1e-5, not treated as greedy: the two tied
   * maxima share the mass */
  assert_int_equal(g_ops->logits_to_probs(g_dev, logits, 5, 1e-9f, 0, 1.0f, p), 2);
  assert_true(fabsf(p[1] - 0.5f) < 1e-6f && fabsf(p[3] - 0.5f) < 1e-6f);
  /* probs may alias logits */
  float inplace[5];
  memcpy(inplace, logits, sizeof inplace);
  g_ops->logits_to_probs(g_dev, inplace, 5, 2.0f, 0, 1.0f, inplace);
  vt_assert_close(inplace, ref, 5, 1e-6, 1e-7, "in place");
  memcpy(inplace, logits, sizeof inplace);
  g_ops->logits_to_probs(g_dev, inplace, 5, 0.0f, 0, 1.0f, inplace);
  assert_true(inplace[1] == 1.0f && inplace[3] == 0.0f);
}

/* ---- logits_to_probs vs an independent full-sort reference ------------------------------ */

static const float *g_sort_vals;

static int cmp_rank(const void *a, const void *b) {
  int i = *(const int *)a, j = *(const int *)b;
  float x = g_sort_vals[i], y = g_sort_vals[j];
  if (x != y) return x > y ? -1 : 1;
  return i < j ? -1 : (i > j);
}

static int ref_logits_to_probs(const float *logits, int n, float temp, int top_k, float top_p,
                               double *out) {
  float *l = vt_malloc((size_t)n * sizeof(float));
  int *order = vt_malloc((size_t)n * sizeof(int));
  float t = temp > 1e-5f ? temp : 1e-5f;
  for (int i = 0; i < n; i++) l[i] = logits[i] / t;
  g_sort_vals = l;
  if (top_k > 0) {
    int k = top_k < n ? top_k : n;
    for (int i = 0; i < n; i++) order[i] = i;
    qsort(order, n, sizeof(int), cmp_rank);
    float thr = l[order[k - 1]];
    for (int i = 0; i < n; i++)
      if (l[i] < thr) l[i] = -INFINITY;
  }
  if (top_p < 1.0f) {
    for (int i = 0; i < n; i++) order[i] = i;
    qsort(order, n, sizeof(int), cmp_rank);
    double mx = l[order[0]], z = 0, cum = 0;
    for (int r = 0; r < n; r++) z += exp((double)l[order[r]] - mx);
    int prev_over = 0; /* remove[r-1], i.e. the shifted mask */
    for (int r = 0; r < n; r++) {
      cum += exp((double)l[order[r]] - mx) / z;
      int over = (float)cum > top_p;
      if (r > 0 && prev_over) l[order[r]] = -INFINITY;
      prev_over = over;
    }
  }
  double mx = -INFINITY, z = 0;
  for (int i = 0; i < n; i++) mx = fmax(mx, l[i]);
  for (int i = 0; i < n; i++) z += exp((double)l[i] - mx);
  int nz = 0;
  for (int i = 0; i < n; i++) {
    out[i] = exp((double)l[i] - mx) / z;
    nz += out[i] > 0;
  }
  free(l);
  free(order);
  return nz;
}

static void test_random_vs_reference(void **state) {
  const int n = 16384;
  float *logits = vt_malloc(n * sizeof(float)), *p = vt_malloc(n * sizeof(float));
  double *ref = vt_malloc(n * sizeof(double));
  vspec_rng rng;
  vs_rng_init(&rng, 52, 0);
  const struct {
    float temp;
    int top_k;
    float top_p;
    int quantise; /* coarse logits -> many ties */
  } cfg[] = {
      {1.0f, 0, 1.0f, 0},    {0.7f, 2000, 1.0f, 0}, {1.0f, 0, 0.9f, 0},   {1.3f, 1000, 0.8f, 0},
      {1.0f, 0, 0.999f, 0},  {5.0f, 0, 0.99f, 0},   {1.0f, 50, 0.5f, 1},  {1.0f, 16384, 0.3f, 1},
      {1.0f, 7, 1.0f, 1},    {0.5f, 0, 0.95f, 1},   {1.0f, 1, 0.9f, 0},   {2.0f, 16383, 0.97f, 0},
  };
  for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
    for (int i = 0; i < n; i++) {
      float g = (float)vs_rng_normal(&rng) * 3.0f;
      logits[i] = cfg[c].quantise ? roundf(g * 2) / 2 : g;
    }
    int want = ref_logits_to_probs(logits, n, cfg[c].temp, cfg[c].top_k, cfg[c].top_p, ref);
    int got = g_ops->logits_to_probs(g_dev, logits, n, cfg[c].temp, cfg[c].top_k, cfg[c].top_p, p);
    if (got != want) fail_msg("config %zu: %d nonzero tokens, reference %d", c, got, want);
    for (int i = 0; i < n; i++)
      if ((p[i] > 0) != (ref[i] > 0)) fail_msg("config %zu: token %d kept differently", c, i);
    char what[32];
    snprintf(what, sizeof what, "config %zu", c);
    vt_assert_close(p, ref, n, 1e-5, 1e-12, what);
    assert_int_equal(count_nonzero(p, n), got);
  }
  free(logits);
  free(p);
  free(ref);
}

/* ---- sample ----------------------------------------------------------------------------- */

static void test_sample_edges(void **state) {
  const float a[4] = {0, 0, 0.5f, 0.5f};
  assert_int_equal(g_ops->sample(g_dev, a, 4, 0.0), 2);
  assert_int_equal(g_ops->sample(g_dev, a, 4, 0.4999), 2);
  assert_int_equal(g_ops->sample(g_dev, a, 4, 0.5), 3);
  const float b[5] = {0.25f, 0.25f, 0.5f, 0, 0};
  assert_int_equal(g_ops->sample(g_dev, b, 5, 1.0 - 1.0 / 9007199254740992.0), 2);
  assert_int_equal(g_ops->sample(g_dev, b, 5, 0.0), 0);
  assert_int_equal(g_ops->sample(g_dev, b, 5, 0.25), 1);
  /* u at or beyond 1 (a caller slip) still gives the last nonzero token */
  assert_int_equal(g_ops->sample(g_dev, b, 5, 1.0), 2);
  /* unnormalised input: the threshold scales with the sum */
  const float c[3] = {2, 0, 6};
  assert_int_equal(g_ops->sample(g_dev, c, 3, 0.24), 0);
  assert_int_equal(g_ops->sample(g_dev, c, 3, 0.26), 2);
  const float z[3] = {0, 0, 0};
  assert_int_equal(g_ops->sample(g_dev, z, 3, 0.5), -1);
}

static void test_sample_never_zero(void **state) {
  enum { N = 200 };
  vspec_rng rng;
  vs_rng_init(&rng, 53, 0);
  float p[N];
  for (int trial = 0; trial < 200; trial++) {
    for (int i = 0; i < N; i++) {
      float x = (float)vs_rng_uniform(&rng);
      p[i] = x < 0.8f ? 0.0f : (x < 0.9f ? 1e-30f : x); /* sparse, with denormal-ish mass */
    }
    p[N - 1] = 0.0f;
    for (int d = 0; d < 50; d++) {
      double u = d == 0 ? 0.0 : (d == 1 ? 1.0 - 1e-16 : vs_rng_uniform(&rng));
      int i = g_ops->sample(g_dev, p, N, u);
      if (i < 0) continue; /* all-zero draw of p */
      assert_true(i < N && p[i] > 0.0f);
    }
  }
}

static void test_sample_distribution(void **state) {
  const float p[6] = {0.1f, 0.0f, 0.2f, 0.3f, 0.0f, 0.4f};
  int counts[6] = {0};
  vspec_rng rng;
  vs_rng_init(&rng, 54, 0);
  const int draws = 200000;
  for (int d = 0; d < draws; d++) counts[g_ops->sample(g_dev, p, 6, vs_rng_uniform(&rng))]++;
  assert_int_equal(counts[1], 0);
  assert_int_equal(counts[4], 0);
  double chi2 = 0;
  for (int i = 0; i < 6; i++) {
    if (p[i] == 0) continue;
    double e = draws * (double)p[i];
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  /* 3 degrees of freedom: P(chi2 > 21.1) = 1e-4 */
  if (chi2 > 21.1)
    fail_msg("chi2 %.2f: %d %d %d %d", chi2, counts[0], counts[2], counts[3], counts[5]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_softmax),
      cmocka_unit_test(test_softmax_simd_levels_agree),
      cmocka_unit_test(test_argmax),
      cmocka_unit_test(test_top_k_ties),
      cmocka_unit_test(test_top_p_keeps_crossing_token),
      cmocka_unit_test(test_top_k_before_top_p),
      cmocka_unit_test(test_greedy_and_temperature),
      cmocka_unit_test(test_random_vs_reference),
      cmocka_unit_test(test_sample_edges),
      cmocka_unit_test(test_sample_never_zero),
      cmocka_unit_test(test_sample_distribution),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
