/*
 * Acceptance-rule plugins: the math of each rule on small hand-made distributions, and
 * parameter validation. The values are worked out by hand from the formulas stated in the
 * plugins' headers (exact: Leviathan et al., arXiv 2211.17192; LANTERN: arXiv 2410.03355
 * §4.2-4.3; LANTERN++: arXiv 2502.06352; Cool-SD: arXiv 2601.09212 §3.2).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/accept_rule.h"

typedef vs_test_rule rule; /* tests/support/accept_rule.h */

/* Vocabulary of 6; neighbour table: each code's neighbours in the order listed. */
static const int32_t nbr[6 * 3] = {
    1, 2, 3, /* 0 */
    0, 2, 4, /* 1 */
    1, 0, 5, /* 2 */
    4, 0, 1, /* 3 */
    3, 5, 1, /* 4 */
    4, 2, 3, /* 5 */
};
static const float q[6] = {0.30f, 0.05f, 0.10f, 0.25f, 0.20f, 0.10f};
static const float p[6] = {0.10f, 0.40f, 0.10f, 0.10f, 0.20f, 0.10f};

static vspec_accept_input input(int32_t x, const float *pp, float px, int depth, int max_depth) {
  vspec_accept_input in = {.struct_size = sizeof in, .vocab = 6, .token = x, .depth = depth,
                           .max_depth = max_depth, .p_x = px, .p = pp, .q = q,
                           .neighbours = nbr + x * 3, .n_neighbours = 3,
                           .neighbour_table = nbr, .table_k = 3};
  return in;
}

static void expect_vec(const float *got, const double *want, int n, const char *what) {
  for (int i = 0; i < n; i++)
    if (fabs(got[i] - want[i]) > 1e-6)
      fail_msg("%s[%d] = %.7f, expected %.7f", what, i, got[i], want[i]);
}

static void test_exact(void **state) {
  (void)state;
  rule r = vs_test_rule_make("exact", "");
  vspec_accept_input in = input(1, p, p[1], 1, 1);
  /* min(1, q/p) = 0.05 / 0.4 */
  assert_float_equal(r.vt->accept_prob(r.r, &in), 0.125, 1e-7);
  in = input(0, p, p[0], 1, 1);
  assert_float_equal(r.vt->accept_prob(r.r, &in), 1.0, 1e-7);
  float out[6];
  in = input(1, p, p[1], 1, 1);
  assert_int_equal(r.vt->residual(r.r, &in, out), 0);
  double want[6] = {0.20, 0.0, 0.0, 0.15, 0.0, 0.0}; /* max(0, q - p) */
  expect_vec(out, want, 6, "exact residual");
  /* deterministic draft: p is one-hot, accept q(x), residual q without x */
  in = input(3, NULL, 1.0f, 1, 1);
  assert_float_equal(r.vt->accept_prob(r.r, &in), 0.25, 1e-7);
  assert_int_equal(r.vt->residual(r.r, &in, out), 0);
  double want2[6] = {0.30, 0.05, 0.10, 0.0, 0.20, 0.10};
  expect_vec(out, want2, 6, "exact one-hot residual");
  vs_test_rule_drop(&r);
}

static void test_lantern(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  /* x = 1: neighbours 0 (0.30), 2 (0.10), 4 (0.20). delta 0.35: S_1 = 0.30 <= 0.35,
   * S_2 = 0.40 > 0.35, so A = {1, 0}, pooled 0.35; with p(x) = 0.4: accept 0.875. */
  rule r = vs_test_rule_make("lantern", "k=3,delta=0.35");
  vspec_accept_input in = input(1, p, p[1], 1, 1);
  assert_float_equal(r.vt->accept_prob(r.r, &in), 0.35 / 0.40, 1e-6);
  float out[6];
  assert_int_equal(r.vt->residual(r.r, &in, out), 0);
  /* rule: max(0, q - p) with x and A(x) = {0} removed */
  double want[6] = {0.0, 0.0, 0.0, 0.15, 0.0, 0.0};
  expect_vec(out, want, 6, "lantern set residual");
  /* the max(0, .) matters outside x and A(x) too: x = 5, delta 0.25 pools neighbour 4
   * (0.20; +0.10 of neighbour 2 exceeds), and q - p is -0.35 at token 1, which is neither */
  vs_test_rule_drop(&r);
  r = vs_test_rule_make("lantern", "k=3,delta=0.25");
  vspec_accept_input in5 = input(5, p, p[5], 1, 1);
  assert_float_equal(r.vt->accept_prob(r.r, &in5), 1.0, 1e-6); /* min(1, 0.30 / 0.10) */
  assert_int_equal(r.vt->residual(r.r, &in5, out), 0);
  double want5[6] = {0.20, 0.0, 0.0, 0.15, 0.0, 0.0};
  expect_vec(out, want5, 6, "lantern set residual, negative q - p outside A(x)");
  /* delta = 0.25 is below q(0): nothing pooled at x = 1 */
  assert_float_equal(r.vt->accept_prob(r.r, &in), 0.05 / 0.40, 1e-6);
  vs_test_rule_drop(&r);
  /* k limits the search: k = 1 and delta 1 pools only neighbour 0 */
  r = vs_test_rule_make("lantern", "k=1,delta=1");
  assert_float_equal(r.vt->accept_prob(r.r, &in), 0.35 / 0.40, 1e-6);
  vs_test_rule_drop(&r);
  /* reference variant: A(x) = {0} is non-empty, so the first k+1 = 2 neighbours (0, 2)
   * are zeroed in p and keep their target mass in max(0, q - p') */
  r = vs_test_rule_make("lantern", "k=1,delta=1,reject=reference");
  assert_int_equal(r.vt->residual(r.r, &in, out), 0);
  double want_ref[6] = {0.30, 0.0, 0.10, 0.15, 0.0, 0.0};
  expect_vec(out, want_ref, 6, "lantern reference residual");
  /* one-hot draft (dynamic tree): x and its first k+1 neighbours zeroed in q */
  vspec_accept_input in1 = input(1, NULL, 1.0f, 1, 1);
  assert_int_equal(r.vt->residual(r.r, &in1, out), 0);
  double want_ref1[6] = {0.0, 0.0, 0.0, 0.25, 0.20, 0.10};
  expect_vec(out, want_ref1, 6, "lantern reference one-hot residual");
  vs_test_rule_drop(&r);
  /* optimal residual: q - min(p, q(A(y))) per y, delta = 0.35 */
  r = vs_test_rule_make("lantern", "k=3,delta=0.35,resample=optimal");
  assert_int_equal(r.vt->residual(r.r, &in, out), 0);
  /* pools: y0: nbrs 1(.05),2(.10),3(.25) -> .05+.10=.15 <= .35, +.25 > .35 -> .45; min(p=.1,.45)=.1 -> .2
   * y1: .35 -> min(.4,.35) = .35 -> q - .35 < 0 -> 0
   * y2: nbrs 1(.05),0(.30) -> .35 ok, 5(.10) -> .45 no: pool .10+.35 = .45; min(.1, .45) -> 0
   * y3: nbrs 4(.20),0(.30) -> .20 ok, .50 no: pool .45; min(.1,.45) = .1 -> .15
   * y4: nbrs 3(.25),5(.10) -> .35 ok, 1 -> .40 no: pool .55; min(.2,.55) = .2 -> 0
   * y5: nbrs 4(.20),2(.10) -> .30 ok, 3 -> .55 no: pool .40; min(.1,.4) = .1 -> 0 */
  double want_opt[6] = {0.20, 0.0, 0.0, 0.15, 0.0, 0.0};
  expect_vec(out, want_opt, 6, "lantern optimal residual");
  vs_test_rule_drop(&r);
  /* greedy: x = 4 pooled with 3 and 5 (delta 0.35) = 0.55 beats max other q (0.30) */
  r = vs_test_rule_make("lantern", "k=3,delta=0.35");
  in = input(4, NULL, 1.0f, 1, 1);
  assert_true(r.vt->greedy_accept(r.r, &in));
  in = input(2, NULL, 1.0f, 1, 1); /* 0.10 + 0.05 (nbr 1); +0.30 exceeds */
  assert_false(r.vt->greedy_accept(r.r, &in));
  vs_test_rule_drop(&r);
  assert_int_equal(vs_test_rule_create_error("lantern", "delta=1.5", err, sizeof err),
                   VSPEC_ERANGE);
  assert_non_null(strstr(err, "'delta'"));
  assert_non_null(strstr(err, "[0, 1]"));
  assert_int_equal(vs_test_rule_create_error("lantern", "k=0", err, sizeof err), VSPEC_ERANGE);
  assert_non_null(strstr(err, "'k'"));
  assert_int_equal(vs_test_rule_create_error("lantern", "resample=best", err, sizeof err),
                   VSPEC_EINVAL);
  assert_non_null(strstr(err, "rule|optimal"));
}

static void test_lanternpp(void **state) {
  (void)state;
  char err[VSPEC_ERRLEN];
  /* x = 3 (q 0.25), lambda 2: budget 0.25; neighbours 4 (0.20) ok, 0 (0.30) -> 0.50 no.
   * pooled 0.45 <= 2 x 0.25; accept min(1, 0.45 / 0.1) = 1 */
  rule r = vs_test_rule_make("lanternpp", "lambda=2,k=3");
  vspec_accept_input in = input(3, p, p[3], 1, 1);
  assert_float_equal(r.vt->accept_prob(r.r, &in), 1.0, 1e-7);
  /* x = 1 (q 0.05), lambda 2: budget 0.05 < q(0): nothing pooled: 0.05 / 0.4 */
  in = input(1, p, p[1], 1, 1);
  assert_float_equal(r.vt->accept_prob(r.r, &in), 0.125, 1e-6);
  /* lambda 10 at x = 1: budget 0.45: 0 (.30), 2 (.10) -> .40 ok, 4 -> .60 no: pooled .45 */
  vs_test_rule_drop(&r);
  r = vs_test_rule_make("lanternpp", "lambda=10,k=3");
  assert_float_equal(r.vt->accept_prob(r.r, &in), 1.0, 1e-7); /* 0.45 / 0.40, capped at 1 */
  /* rule residual: p' zero at the first k+1 neighbours (not renormalised), q - p' */
  float out[6];
  assert_int_equal(r.vt->residual(r.r, &in, out), 0);
  double want[6] = {0.30, 0.0, 0.10, 0.15, 0.20, 0.0};
  expect_vec(out, want, 6, "lanternpp rule residual");
  vs_test_rule_drop(&r);
  /* reject=set: x and A(x) = {0, 2} removed from max(0, q - p) */
  r = vs_test_rule_make("lanternpp", "lambda=10,k=3,reject=set");
  assert_int_equal(r.vt->residual(r.r, &in, out), 0);
  double want_set[6] = {0.0, 0.0, 0.0, 0.15, 0.0, 0.0};
  expect_vec(out, want_set, 6, "lanternpp set residual");
  /* x = 5 (q 0.10), budget 0.9 pools all three neighbours 4, 2, 3; q - p < 0 at token 1,
   * outside A(x): max(0, .) keeps it 0 */
  vspec_accept_input in5 = input(5, p, p[5], 1, 1);
  assert_int_equal(r.vt->residual(r.r, &in5, out), 0);
  double want_set5[6] = {0.20, 0.0, 0.0, 0.0, 0.0, 0.0};
  expect_vec(out, want_set5, 6, "lanternpp set residual, negative q - p outside A(x)");
  vs_test_rule_drop(&r);
  /* one-hot draft (dynamic tree), reference: x and its first k+1 = 3 neighbours (0, 2, 4)
   * zeroed in q, as upstream's evaluate_posterior does for lambda > 1 */
  r = vs_test_rule_make("lanternpp", "lambda=10,k=2");
  in = input(1, NULL, 1.0f, 1, 1);
  assert_int_equal(r.vt->residual(r.r, &in, out), 0);
  double want_1h[6] = {0.0, 0.0, 0.0, 0.25, 0.0, 0.10};
  expect_vec(out, want_1h, 6, "lanternpp reference one-hot residual");
  vs_test_rule_drop(&r);
  assert_int_equal(vs_test_rule_create_error("lanternpp", "reject=all", err, sizeof err),
                   VSPEC_EINVAL);
  assert_non_null(strstr(err, "reference|set"));
  assert_int_equal(vs_test_rule_create_error("lanternpp", "lambda=0.5", err, sizeof err),
                   VSPEC_ERANGE);
  assert_non_null(strstr(err, "'lambda'"));
}

static void test_uniform_rsd(void **state) {
  (void)state;
  rule r = vs_test_rule_make("uniform_rsd", "omega=2,resample=rule");
  vspec_accept_input in = input(1, p, p[1], 1, 1);
  assert_float_equal(r.vt->accept_prob(r.r, &in), 0.25, 1e-6); /* 2 x 0.05 / 0.4 */
  vs_test_rule_drop(&r);
  /* omega 0.5 < 1: optimal residual max(q - p, (1 - omega) q) */
  r = vs_test_rule_make("uniform_rsd", "omega=0.5,resample=optimal");
  float out[6];
  assert_int_equal(r.vt->residual(r.r, &in, out), 0);
  double want[6];
  for (int y = 0; y < 6; y++) want[y] = fmax(q[y] - p[y], 0.5 * q[y]);
  expect_vec(out, want, 6, "uniform_rsd optimal residual");
  vs_test_rule_drop(&r);
  r = vs_test_rule_make("uniform_rsd", "omega=0.5,resample=rule");
  assert_int_equal(r.vt->residual(r.r, &in, out), 0);
  for (int y = 0; y < 6; y++) want[y] = fmax(q[y] - p[y], 0.0);
  expect_vec(out, want, 6, "uniform_rsd rule residual");
  vs_test_rule_drop(&r);
}

static void test_coolsd_schedule(void **state) {
  (void)state;
  /* exp schedule, nu 0.7, normalised so that the mean omega equals delta (coolsd.c):
   * L=5, delta=1.1 -> [2.855, 1.418, 0.704, 0.350, 0.174]; L=4 -> [2.358, 1.171, 0.582, 0.289] */
  const double w5[5] = {2.855, 1.418, 0.704, 0.350, 0.174}, w4[4] = {2.358, 1.171, 0.582, 0.289};
  rule r = vs_test_rule_make("coolsd", "delta=1.1");
  /* With a one-hot draft and q(x) = 0.10, acceptance = min(1, omega x 0.10). */
  for (int i = 1; i <= 5; i++) {
    vspec_accept_input in = input(2, NULL, 1.0f, i, 5);
    assert_float_equal(r.vt->accept_prob(r.r, &in), fmin(1.0, w5[i - 1] * 0.10), 2e-3 * 0.1);
  }
  for (int i = 1; i <= 4; i++) {
    vspec_accept_input in = input(2, NULL, 1.0f, i, 4);
    assert_float_equal(r.vt->accept_prob(r.r, &in), fmin(1.0, w4[i - 1] * 0.10), 2e-3 * 0.1);
  }
  vs_test_rule_drop(&r);
  /* linear schedule: mean of omega_i over the draft depth equals delta */
  r = vs_test_rule_make("coolsd", "delta=1.5,schedule=linear,nu=0.3");
  double sum = 0.0;
  for (int i = 1; i <= 4; i++) {
    vspec_accept_input in = input(2, NULL, 1.0f, i, 4);
    sum += r.vt->accept_prob(r.r, &in) / 0.10; /* omega x 0.1 < 1 here */
  }
  assert_float_equal(sum / 4, 1.5, 1e-6);
  vs_test_rule_drop(&r);
}

/* Every rule's residual, in every mode, is a sub-measure: no negative or non-finite entry
 * on random target and draft distributions (sampled and one-hot drafts, every token as x,
 * every depth of a 3-deep draft), where q - p is negative at tokens that neither x nor its
 * pooled neighbours cover. The walk normalises what the rule returns and samples from it,
 * so a negative entry would be a negative probability. */
static void test_residuals_nonnegative(void **state) {
  (void)state;
  const char *rules[][2] = {
      {"exact", ""},
      {"lantern", "k=3,delta=0.1"},
      {"lantern", "k=2,delta=0.3,reject=reference"},
      {"lantern", "k=3,delta=0.2,resample=optimal"},
      {"lanternpp", "lambda=2,k=3,reject=set"},
      {"lanternpp", "lambda=3,k=2"},
      {"lanternpp", "lambda=2,k=3,resample=optimal"},
      {"uniform_rsd", "omega=2,resample=rule"},
      {"uniform_rsd", "omega=0.5,resample=optimal"},
      {"coolsd", "delta=1.1,resample=rule"},
      {"coolsd", "delta=1.1,resample=optimal"},
      {"gsd", "window=2,k=2"},
      {"gsd", "window=1,p_thr=0.5,latent=off"},
  };
  uint64_t st = 88172645463325252ull; /* xorshift64 */
  int negatives_seen = 0;
  for (size_t k = 0; k < sizeof rules / sizeof rules[0]; k++) {
    rule r = vs_test_rule_make(rules[k][0], rules[k][1]);
    for (int trial = 0; trial < 300; trial++) {
      float qq[6], pp[6], out[6];
      double sq = 0.0, sp = 0.0;
      for (int y = 0; y < 6; y++) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        qq[y] = (float)((st >> 11) % 1000) + 1.0f;
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        pp[y] = (float)((st >> 11) % 1000) + 1.0f;
        sq += qq[y], sp += pp[y];
      }
      for (int y = 0; y < 6; y++) qq[y] = (float)(qq[y] / sq), pp[y] = (float)(pp[y] / sp);
      int32_t x = trial % 6;
      for (int y = 0; y < 6; y++)
        negatives_seen += y != x && qq[y] < pp[y];
      for (int oh = 0; oh < 2; oh++) {
        vspec_accept_input in = input(x, oh ? NULL : pp, oh ? 1.0f : pp[x], 1 + trial % 3, 3);
        in.q = qq;
        assert_int_equal(r.vt->residual(r.r, &in, out), 0);
        for (int y = 0; y < 6; y++)
          if (!(out[y] >= 0.0f) || !isfinite(out[y]))
            fail_msg("%s:%s, %s draft, x %d: residual[%d] = %g", rules[k][0], rules[k][1],
                     oh ? "one-hot" : "sampled", x, y, out[y]);
      }
    }
    vs_test_rule_drop(&r);
  }
  assert_true(negatives_seen > 1000);
}

int main(void) {
  if (vs_test_rules_open()) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact),          cmocka_unit_test(test_lantern),
      cmocka_unit_test(test_lanternpp),      cmocka_unit_test(test_uniform_rsd),
      cmocka_unit_test(test_coolsd_schedule), cmocka_unit_test(test_residuals_nonnegative),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_test_rules_close();
  return rc;
}
