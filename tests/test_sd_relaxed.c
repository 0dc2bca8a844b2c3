/*
 * Relaxed acceptance rules against their fidelity guarantees, on micro table models
 * (tests/support/table_model.h), through the whole engine.
 *
 * LANTERN: with one deterministic candidate, the emitted token's distribution differs from
 * the target's by exactly the neighbour mass pooled onto the candidate, at most delta in
 * total variation (LANTERN, arXiv 2410.03355 §4.3). With several candidates each one tried
 * can move at most delta of the residual mass, so the bound is delta x E[candidates tried].
 *
 * Cool-SD: the TV distance of the whole sequence is at most the sum over positions of the
 * expected one-step TV (Cool-SD, arXiv 2601.09212, Theorem 2, Eq. (8), in our own
 * restatement: the hybrid argument bounds the sequence TV by
 *   sum_i E_{x<i ~ target}[ max over the depths d the token may be drafted at of tau_d ],
 *   tau_d = 1/2 || p f_d + (1 - beta_d) G_d - q ||_1,  beta_d = sum_y p(y) f_d(y)
 * with G_d the resampling distribution; for G* the one-step term is sum_y [p f_d - q]+).
 * And at equal acceptance the optimal resampling gives no larger TV than the rule's own.
 *
 * GSD (arXiv 2508.07747; plugins/accept/gsd.c): one drafted token x ~ p judged with
 * a(x) = min(1, q(G(x)) / p(G(x))) and the exact residual r = norm(max(0, q - p)) emits
 * o = p a + (1 - beta) r, beta = sum_y p(y) a(y). With exact SD's a*(y) = min(1, q(y)/p(y)),
 * which emits q = min(p, q) + (1 - beta*) r, the difference is o - q = d - (sum d) r with
 * d(y) = p(y) (a(y) - a*(y)), so (our own derivation, r summing to 1)
 *   TV(o, q) <= 1/2 (sum_y |d(y)| + |sum_y d(y)|),
 * the acceptance mass the group moves away from exact SD's. For one deterministic draft
 * (p one-hot at x) this is a(x) - q(x) = min(1, q(G(x))) - q(x): the target mass of the rest
 * of the group, pooled onto x, as LANTERN's. The test computes the groups itself.
 *
 * Each check is shown to be able to fail: a rule with a larger budget than the one checked
 * against exceeds the bound.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine.h"
#include "core/host.h"
#include "core/neighbours.h"
#include "kernels/vs_kernels.h"
#include "tests/support/stats.h"
#include "tests/support/table_model.h"
#include "tests/support/method_of.h"

/* The sanitizer build is several times slower; its run checks memory and the bounds, the plain
 * run also that the deliberately wrong rules break them (which needs the larger sample). */
#ifdef VSPEC_SANITIZED
#define SAMPLES 50000
#define CHECK_POWER 0
#else
#define SAMPLES 200000
#define CHECK_POWER 1
#endif

typedef vs_table_world world;

static void world_open(world *w, int vocab, int len, uint64_t seed, double noise) {
  vs_sampling s = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 2.0f,
                   .cfg_interval = -1};
  vs_table_world_open(w, vocab, len, seed, 1.2, noise, &s);
}

static void world_close(world *w) { vs_table_world_close(w); }

/* Empirical joint of `n` sequences; returns the summed metrics. */
static vs_metrics sample_joint(world *w, const char *method, int n, double *joint) {
  int32_t tokens[16];
  char err[VSPEC_ERRLEN];
  vs_metrics total;
  memset(&total, 0, sizeof total);
  memset(joint, 0, (size_t)w->cells * sizeof(double));
  for (int i = 0; i < n; i++) {
    vs_job job = {.method = vs_method_of(method),
                  .seed = 777ull * 1000003 + (uint64_t)i, .sampling = w->s};
    vs_metrics mt;
    if (vs_generate(w->models, w->dev, &job, tokens, &mt, err, sizeof err))
      fail_msg("%s: %s", method, err);
    vs_metrics_add(&total, &mt);
    int64_t code = 0;
    for (int l = 0; l < w->tm.len; l++) code = code * w->tm.vocab + tokens[l];
    joint[code] += 1.0 / n;
  }
  return total;
}

/* ---- LANTERN ---------------------------------------------------------------------------- */

/* Largest TV over first-token contexts seen at least min_count times: the second token's
 * empirical distribution against the target's q(. | t0). -1 when no context was seen that
 * often (a check of nothing, which the callers reject). */
static double lantern_context_tv(world *w, const double *joint, int n, int min_count) {
  int V = w->tm.vocab;
  double worst = -1.0;
  double *q = malloc((size_t)V * sizeof(double)), *emp = malloc((size_t)V * sizeof(double));
  for (int32_t t0 = 0; t0 < V; t0++) {
    double mass = 0.0;
    for (int t1 = 0; t1 < V; t1++)
      for (int t2 = 0; t2 < V; t2++) mass += joint[((int64_t)t0 * V + t1) * V + t2];
    if (mass * n < min_count) continue;
    for (int t1 = 0; t1 < V; t1++) {
      emp[t1] = 0.0;
      for (int t2 = 0; t2 < V; t2++) emp[t1] += joint[((int64_t)t0 * V + t1) * V + t2] / mass;
    }
    vs_table_dist(&w->tm, w->tm.target, &t0, 1, &w->s, q);
    double tv = vs_tv(emp, q, V);
    if (tv > worst) worst = tv;
  }
  free(q);
  free(emp);
  return worst;
}

static void test_lantern_tv_within_delta(void **state) {
  (void)state;
  world w;
  /* A poor draft (large noise) so that LANTERN's pooling matters. */
  world_open(&w, 8, 3, 21, 2.0);
  double *joint = malloc((size_t)w.cells * sizeof(double));
  const double delta = 0.1;
  const int min_count = SAMPLES / 10;
  /* Sampling tolerance: E[TV] of an empirical distribution of n draws over V outcomes is
   * below 1/2 sum sqrt(q/n) <= 1/2 sqrt(V/n); three times that. */
  double tol = 1.5 * sqrt(8.0 / min_count);

  /* One deterministic candidate: TV <= delta. */
  sample_joint(&w, "sd:lantern:k=4,delta=0.1@standard:shape=dynamic,top_k=1,depth=1,"
               "total_tokens=1,drafter=model", SAMPLES, joint);
  double tv1 = lantern_context_tv(&w, joint, SAMPLES, min_count);
  printf("  lantern delta=0.1, 1 candidate:   worst context TV %.4f (bound %.4f + tol %.4f)\n",
         tv1, delta, tol);
  assert_true(tv1 >= 0.0 && tv1 <= delta + tol);

  /* Three candidates: TV <= delta x E[candidates tried]. */
  vs_metrics mt = sample_joint(&w, "sd:lantern:k=4,delta=0.1@standard:shape=dynamic,top_k=3,"
                               "depth=1,total_tokens=3,drafter=model", SAMPLES, joint);
  double tried = (double)mt.siblings_tried / (double)mt.drafted;
  double tv3 = lantern_context_tv(&w, joint, SAMPLES, min_count);
  printf("  lantern delta=0.1, 3 candidates:  worst context TV %.4f (bound %.4f = delta x %.2f "
         "tried + tol %.4f)\n", tv3, delta * tried, tried, tol);
  assert_true(tv3 >= 0.0 && tv3 <= delta * tried + tol);

  /* The check can fail: a rule pooling up to 0.5 breaks the 0.1 bound. */
  if (CHECK_POWER) {
    sample_joint(&w, "sd:lantern:k=4,delta=0.5@standard:shape=dynamic,top_k=1,depth=1,"
                 "total_tokens=1,drafter=model", SAMPLES, joint);
    double tv_wrong = lantern_context_tv(&w, joint, SAMPLES, min_count);
    printf("  lantern delta=0.5 against the 0.1 bound: worst context TV %.4f\n", tv_wrong);
    assert_true(tv_wrong > delta + tol);
  }
  free(joint);
  world_close(&w);
}

/* ---- Cool-SD ------------------------------------------------------------------------------ */

/* omega_i of coolsd's exp schedule, written independently: delta e^{-nu i} / mean e^{-nu j}. */
static double coolsd_omega(double delta, double nu, int i, int L) {
  double sum = 0.0;
  for (int j = 1; j <= L; j++) sum += exp(-nu * j);
  return delta * exp(-nu * i) * L / sum;
}

/* One-step TV of a relaxed step with f = min(1, omega q/p) and the given resampling. */
static double step_tv(const double *q, const double *p, int V, double omega, int optimal) {
  double beta = 0.0, pf[64], g[64], gz = 0.0;
  for (int y = 0; y < V; y++) {
    double f = p[y] > 0 ? fmin(1.0, omega * q[y] / p[y]) : 0.0;
    pf[y] = p[y] * f;
    beta += pf[y];
    g[y] = optimal ? fmax(q[y] - pf[y], 0.0) : fmax(q[y] - p[y], 0.0);
    gz += g[y];
  }
  double tv = 0.0;
  for (int y = 0; y < V; y++) {
    double pi = pf[y] + (gz > 0 ? (1.0 - beta) * g[y] / gz : (1.0 - beta) * q[y]);
    tv += fabs(pi - q[y]);
  }
  return 0.5 * tv;
}

/* Exact output distribution of chain relaxed SD, enumerated independently of the engine,
 * and the bound sum_i E[tau] over the same process (every emitted token that a judged
 * step produced contributes the probability of reaching that step times tau). */
typedef struct dp {
  world *w;
  int depth;          /* the scheduler's chain depth */
  int optimal;
  int uniform;        /* omega constant (uniform_rsd) instead of coolsd's schedule */
  double delta, nu;
  double *joint;      /* [cells] */
  double bound;
} dp;

static double dp_omega(const dp *s, int d, int L) {
  return s->uniform ? s->delta : coolsd_omega(s->delta, s->nu, d, L);
}

static void dp_round(dp *s, int32_t *prefix, int n, double prob);

static void dp_walk(dp *s, int32_t *prefix, int n, int d, int L, double prob) {
  world *w = s->w;
  int V = w->tm.vocab;
  double q[64], p[64];
  vs_table_dist(&w->tm, w->tm.target, prefix, n, &w->s, q);
  if (d > L) { /* bonus token: exact */
    for (int y = 0; y < V; y++) {
      prefix[n] = y;
      dp_round(s, prefix, n + 1, prob * q[y]);
    }
    return;
  }
  vs_table_dist(&w->tm, w->tm.draft, prefix, n, &w->s, p);
  double omega = dp_omega(s, d, L), beta = 0.0, g[64], gz = 0.0, a[64];
  for (int y = 0; y < V; y++) {
    a[y] = p[y] * fmin(1.0, omega * q[y] / p[y]);
    beta += a[y];
    g[y] = s->optimal ? fmax(q[y] - a[y], 0.0) : fmax(q[y] - p[y], 0.0);
    gz += g[y];
  }
  s->bound += prob * step_tv(q, p, V, omega, s->optimal);
  for (int y = 0; y < V; y++) {
    prefix[n] = y;
    if (a[y] > 0) dp_walk(s, prefix, n + 1, d + 1, L, prob * a[y]);
    double r = (1.0 - beta) * (gz > 0 ? g[y] / gz : q[y]);
    if (r > 0) dp_round(s, prefix, n + 1, prob * r);
  }
}

/* A round starts with the root (the last emitted token) at index n - 1. */
static void dp_round(dp *s, int32_t *prefix, int n, double prob) {
  world *w = s->w;
  int rem = w->tm.len - n;
  if (rem == 0) {
    int64_t code = 0;
    for (int l = 0; l < n; l++) code = code * w->tm.vocab + prefix[l];
    s->joint[code] += prob;
    return;
  }
  int L = s->depth < rem - 1 ? s->depth : rem - 1;
  dp_walk(s, prefix, n, 1, L, prob);
}

static void dp_run(dp *s) {
  world *w = s->w;
  int V = w->tm.vocab;
  double q[64];
  int32_t prefix[16];
  memset(s->joint, 0, (size_t)w->cells * sizeof(double));
  s->bound = 0.0;
  vs_table_dist(&w->tm, w->tm.target, prefix, 0, &w->s, q); /* token 0: the prefill */
  for (int y = 0; y < V; y++) {
    prefix[0] = y;
    dp_round(s, prefix, 1, q[y]);
  }
}

static double tv_to_target(world *w, const double *joint) {
  double *target = malloc((size_t)w->cells * sizeof(double));
  vs_table_joint(&w->tm, &w->s, target);
  double tv = vs_tv(joint, target, (int)w->cells);
  free(target);
  return tv;
}

static double chi2_against(world *w, const double *emp, const double *prob, int n) {
  int64_t *counts = malloc((size_t)w->cells * sizeof *counts);
  for (int64_t c = 0; c < w->cells; c++) counts[c] = llround(emp[c] * n);
  double stat;
  int dof;
  double pv = vs_chi2_test(counts, prob, (int)w->cells, n, 5.0, &stat, &dof);
  free(counts);
  return pv;
}

static void test_coolsd_tv_bound(void **state) {
  (void)state;
  world w;
  world_open(&w, 4, 4, 31, 1.5);
  double *emp = malloc((size_t)w.cells * sizeof(double));
  double *exact = malloc((size_t)w.cells * sizeof(double));
  /* Sampling tolerance: E[TV] of n draws over C cells <= 1/2 sqrt(C/n); twice that. */
  double tol = sqrt((double)w.cells / SAMPLES);
  struct { double delta; int optimal; const char *method; } runs[] = {
      {2.0, 1, "sd:coolsd:delta=2,resample=optimal@standard:shape=chain,depth=3,drafter=model"},
      {2.0, 0, "sd:coolsd:delta=2,resample=rule@standard:shape=chain,depth=3,drafter=model"},
      {1.1, 1, "sd:coolsd:delta=1.1,resample=optimal@standard:shape=chain,depth=3,drafter=model"},
      {1.1, 0, "sd:coolsd:delta=1.1,resample=rule@standard:shape=chain,depth=3,drafter=model"},
  };
  double exact_tv[4], acc[4], bound[4];
  for (int r = 0; r < 4; r++) {
    dp s = {.w = &w, .depth = 3, .optimal = runs[r].optimal, .delta = runs[r].delta, .nu = 0.7,
            .joint = exact};
    dp_run(&s);
    vs_metrics mt = sample_joint(&w, runs[r].method, SAMPLES, emp);
    double pv = chi2_against(&w, emp, exact, SAMPLES);
    exact_tv[r] = tv_to_target(&w, exact);
    bound[r] = s.bound;
    acc[r] = vs_metrics_walk_accept_rate(&mt); /* per judgement, as before issue 14 */
    double tv_emp = tv_to_target(&w, emp);
    printf("  %-72s TV %.4f (exact %.4f) bound %.4f  engine vs exact p %.3g  accept %.3f\n",
           runs[r].method, tv_emp, exact_tv[r], bound[r], pv, acc[r]);
    /* The engine produces exactly the relaxed process we enumerated ... */
    assert_true(pv > 1e-3);
    /* ... whose distance to the target respects the bound, measured and exact. */
    assert_true(exact_tv[r] <= bound[r] + 1e-12);
    assert_true(tv_emp <= bound[r] + tol);
  }
  /* At equal acceptance (same acceptance function, only the resampling differs) the
   * optimal resampling gives no larger TV; with delta = 1.1 some omega_i < 1, where G*
   * differs from the vanilla residual. */
  for (int r = 0; r < 4; r += 2) {
    assert_true(fabs(acc[r] - acc[r + 1]) < 0.01);
    assert_true(exact_tv[r] <= exact_tv[r + 1] + 1e-12);
    assert_true(bound[r] <= bound[r + 1] + 1e-12);
  }
  assert_true(exact_tv[2] < exact_tv[3] - 0.01);
  /* The checks can fail: the engine running uniform omega = 4 is not the process of
   * Cool-SD delta = 1.1, and breaks its bound. */
  if (CHECK_POWER) {
    dp s = {.w = &w, .depth = 3, .optimal = 1, .delta = 1.1, .nu = 0.7, .joint = exact};
    dp_run(&s);
    sample_joint(&w, "sd:uniform_rsd:omega=4,resample=rule@standard:shape=chain,depth=3,"
                 "drafter=model", SAMPLES, emp);
    double pv = chi2_against(&w, emp, exact, SAMPLES), tv_wrong = tv_to_target(&w, emp);
    printf("  uniform_rsd omega=4 against Cool-SD delta=1.1: p %.3g, TV %.4f vs bound %.4f\n",
           pv, tv_wrong, s.bound);
    assert_true(pv < 1e-3);
    assert_true(tv_wrong > s.bound + tol);
  }
  free(emp);
  free(exact);
  world_close(&w);
}

/* ---- GSD ------------------------------------------------------------------------------------ */

typedef struct gsd_cfg {
  int window, k;
  double p_thr;
} gsd_cfg;

/* a(x) = min(1, q(G(x)) / p(G(x))) by GSD's group, written independently of the plugin: a
 * full ascending sort by (q, code), the slice of ranks [r - w, r + w) (empty when r < w:
 * exact SD's ratio), the probability filter and x's first k neighbours in row `nb`. */
static double gsd_a(const double *q, const double *p, int V, int x, const int32_t *nb,
                    gsd_cfg c) {
  int order[64], rank = -1;
  for (int i = 0; i < V; i++) order[i] = i;
  for (int i = 1; i < V; i++)
    for (int j = i; j > 0 && (q[order[j]] < q[order[j - 1]] ||
                              (q[order[j]] == q[order[j - 1]] && order[j] < order[j - 1]));
         j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  for (int i = 0; i < V; i++)
    if (order[i] == x) rank = i;
  if (rank < c.window) return fmin(1.0, q[x] / p[x]);
  double sq = 0.0, sp = 0.0;
  for (int i = rank - c.window; i < rank + c.window && i < V; i++) {
    int j = order[i], near = j == x;
    for (int m = 0; m < c.k; m++) near |= nb[m] == j;
    if (fabs(q[j] - q[x]) < c.p_thr && near) sq += q[j], sp += p[j];
  }
  return fmin(1.0, sq / sp);
}

/* The bound above for one context: p the draft distribution, or NULL for the one
 * deterministic draft x0 (the draft's argmax). */
static double gsd_bound(const double *q, const double *p, int V, int x0, const int32_t *table,
                        int tk, gsd_cfg c) {
  double sum_abs = 0.0, sum = 0.0;
  for (int y = 0; y < V; y++) {
    double py = p ? p[y] : y == x0;
    if (py <= 0.0) continue;
    double one[64];
    for (int i = 0; i < V; i++) one[i] = i == y;
    double d = py * (gsd_a(q, p ? p : one, V, y, table + y * tk, c) - fmin(1.0, q[y] / py));
    sum_abs += fabs(d);
    sum += d;
  }
  return 0.5 * (sum_abs + fabs(sum));
}

/* Largest excess of a first-token context's TV (second token, empirical against q(. | t0))
 * over that context's bound, over contexts seen at least min_count times; *tv_out gets the
 * largest TV, *bound_out the largest bound. */
static double gsd_context_excess(world *w, const double *joint, int n, int min_count,
                                 int sampled, gsd_cfg c, double *tv_out, double *bound_out) {
  int V = w->tm.vocab, tk;
  double worst = -1.0;
  int32_t *table = vs_neighbours_build(w->tm.codebook, V, 2, V - 1, &tk);
  assert_non_null(table);
  *tv_out = *bound_out = 0.0;
  double q[64], p[64], emp[64];
  for (int32_t t0 = 0; t0 < V; t0++) {
    double mass = 0.0;
    for (int t1 = 0; t1 < V; t1++)
      for (int t2 = 0; t2 < V; t2++) mass += joint[((int64_t)t0 * V + t1) * V + t2];
    if (mass * n < min_count) continue;
    for (int t1 = 0; t1 < V; t1++) {
      emp[t1] = 0.0;
      for (int t2 = 0; t2 < V; t2++) emp[t1] += joint[((int64_t)t0 * V + t1) * V + t2] / mass;
    }
    vs_table_dist(&w->tm, w->tm.target, &t0, 1, &w->s, q);
    vs_table_dist(&w->tm, w->tm.draft, &t0, 1, &w->s, p);
    int x0 = 0;
    for (int y = 1; y < V; y++)
      if (p[y] > p[x0]) x0 = y;
    double tv = vs_tv(emp, q, V), b = gsd_bound(q, sampled ? p : NULL, V, x0, table, tk, c);
    if (tv - b > worst) worst = tv - b;
    if (tv > *tv_out) *tv_out = tv;
    if (b > *bound_out) *bound_out = b;
  }
  free(table);
  return worst;
}

static void test_gsd_tv_bound(void **state) {
  (void)state;
  world w;
  world_open(&w, 8, 3, 21, 2.0);
  double *joint = malloc((size_t)w.cells * sizeof(double));
  const int min_count = SAMPLES / 10;
  double tol = 1.5 * sqrt(8.0 / min_count); /* as LANTERN's above */
  const gsd_cfg c = {.window = 3, .k = 5, .p_thr = 0.5};
  struct { int sampled; const char *method; } runs[] = {
      {0, "sd:gsd:window=3,p_thr=0.5,k=5@standard:shape=dynamic,top_k=1,depth=1,"
          "total_tokens=1,drafter=model"},
      {1, "sd:gsd:window=3,p_thr=0.5,k=5@standard:shape=chain,depth=1,drafter=model"},
  };
  for (int r = 0; r < 2; r++) {
    sample_joint(&w, runs[r].method, SAMPLES, joint);
    double tv, bound, ex = gsd_context_excess(&w, joint, SAMPLES, min_count, runs[r].sampled,
                                              c, &tv, &bound);
    printf("  %s: worst context TV %.4f, largest bound %.4f, worst TV - bound %.4f (tol "
           "%.4f)\n", runs[r].method, tv, bound, ex, tol);
    assert_true(ex > -1.0 && ex <= tol);
    assert_true(bound > 2 * tol); /* the groups matter in this world */
  }
  /* The check can fail: larger groups (window 7, any probability, every neighbour) against
   * the bound of the smaller ones. */
  if (CHECK_POWER) {
    sample_joint(&w, "sd:gsd:window=7,p_thr=1,latent=off@standard:shape=chain,depth=1,"
                 "drafter=model", SAMPLES, joint);
    double tv, bound, ex = gsd_context_excess(&w, joint, SAMPLES, min_count, 1, c, &tv, &bound);
    printf("  gsd window=7,p_thr=1,latent=off against window=3,p_thr=0.5,k=5: worst TV - "
           "bound %.4f\n", ex);
    assert_true(ex > tol);
  }
  free(joint);
  world_close(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lantern_tv_within_delta),
      cmocka_unit_test(test_coolsd_tv_bound),
      cmocka_unit_test(test_gsd_tv_bound),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
