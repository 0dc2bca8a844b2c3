/*
 * The `gsd` acceptance rule (Grouped Speculative Decoding, arXiv 2508.07747; code:
 * junhyukso/GSD scheduler/jacobi_iteration_lumina_mgpt.py, SpeculativeSampler.__call__):
 *  - the group, the ratio, the fallbacks, the filters, the residual and the greedy test on a
 *    hand-made vocabulary of 6, values worked out by hand from plugins/accept/gsd.c's header;
 *  - against the authors' acceptance as transcribed in tools/ref/gsd_ref.py: the fixture
 *    tests/golden/gsd_ref/cases.txt holds, per case, a neighbour table, a target and a draft
 *    distribution (sampled or one-hot) and six drafted tokens, each with upstream's accept
 *    probability and normalised residual. The test checks that the comparison has power:
 *    exact SD's acceptance and the rule without its latent filter differ from the fixture.
 * The statistical check through the engine is in tests/test_sd_relaxed.c.
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

#define FIXTURE "tests/golden/gsd_ref/cases.txt"
#define MAXV 32
#define NX 8

typedef vs_test_rule rule; /* tests/support/accept_rule.h */

static int create_error(const char *params) {
  char err[VSPEC_ERRLEN];
  int rc = vs_test_rule_create_error("gsd", params, err, sizeof err);
  if (rc) printf("  gsd:%s refused: %s\n", params, err);
  return rc;
}

/* ---- hand-worked cases ------------------------------------------------------------------ */

/* Vocabulary of 6; each code's neighbours in the order listed. */
static const int32_t nbr[6 * 3] = {
    1, 2, 3, /* 0 */
    0, 2, 4, /* 1 */
    1, 0, 5, /* 2 */
    4, 0, 1, /* 3 */
    3, 5, 1, /* 4 */
    4, 2, 3, /* 5 */
};
/* Ascending by (q, code): 1 (0.05), 2 (0.10), 5 (0.10), 4 (0.20), 3 (0.25), 0 (0.30); the
 * tie 2 / 5 goes by code index. Ranks: 1:0 2:1 5:2 4:3 3:4 0:5. */
static const float q[6] = {0.30f, 0.05f, 0.10f, 0.25f, 0.20f, 0.10f};
static const float p[6] = {0.10f, 0.10f, 0.10f, 0.10f, 0.50f, 0.10f};

static vspec_accept_input input(int32_t x, const float *pp) {
  vspec_accept_input in = {.struct_size = sizeof in, .vocab = 6, .token = x, .depth = 1,
                           .max_depth = 1, .p_x = pp ? pp[x] : 1.0f, .p = pp, .q = q,
                           .neighbours = nbr + x * 3, .n_neighbours = 3,
                           .neighbour_table = nbr, .table_k = 3};
  return in;
}

static double acc(const char *params, int32_t x, const float *pp) {
  rule r = vs_test_rule_make("gsd", params);
  vspec_accept_input in = input(x, pp);
  double a = r.vt->accept_prob(r.r, &in);
  vs_test_rule_drop(&r);
  return a;
}

static int greedy(const char *params, int32_t x) {
  rule r = vs_test_rule_make("gsd", params);
  vspec_accept_input in = input(x, NULL);
  int ok = r.vt->greedy_accept(r.r, &in);
  vs_test_rule_drop(&r);
  return ok;
}

static void test_group_ratio(void **state) {
  (void)state;
  /* x = 4, rank 3, window 2: slice ranks [1, 5) = {2, 5, 4, 3}; |q - 0.20| < 0.15 for all:
   * q(G) = 0.65, p(G) = 0.80, accept 0.8125 where exact SD accepts q(4)/p(4) = 0.4. */
  const char *off = "window=2,latent=off";
  assert_float_equal(acc(off, 4, p), 0.65 / 0.80, 1e-6);
  assert_float_equal(acc("window=0", 4, p), 0.4, 1e-6); /* window 0: exact SD */
  assert_float_equal(acc("window=2,p_thr=0", 4, p), 0.4, 1e-6); /* group {x}: exact SD */
  /* the default window 7 exceeds rank 3 of 6: the empty slice, exact SD */
  assert_float_equal(acc("latent=off", 4, p), 0.4, 1e-6);
  /* one-hot draft: p(G) = 1, accept q(G) = 0.65 (exact: q(4) = 0.20) */
  assert_float_equal(acc(off, 4, NULL), 0.65, 1e-6);
  /* the top of the ranking: x = 0, rank 5: slice [3, 7) clamps to {4, 3, 0}:
   * q(G) = 0.75 > p(G) = 0.70, accept 1 */
  assert_float_equal(acc(off, 0, p), 1.0, 1e-6);
  /* a group can also lower acceptance: x = 5, rank 2: slice {1, 2, 5, 4}, q(G) = 0.45,
   * p(G) = 0.80 against exact 0.10/0.10 = 1 */
  assert_float_equal(acc(off, 5, p), 0.45 / 0.80, 1e-6);
}

static void test_empty_slice(void **state) {
  (void)state;
  /* rank < window: upstream's slice is empty and the code falls back to min(1, q(x)/p(x)).
   * x = 1 (rank 0): 0.05 / 0.10; x = 2 (rank 1): 0.10 / 0.10 */
  assert_float_equal(acc("window=2,latent=off", 1, p), 0.5, 1e-6);
  assert_float_equal(acc("window=2,latent=off", 2, p), 1.0, 1e-6);
  assert_float_equal(acc("window=2,latent=off", 1, NULL), 0.05, 1e-6);
  /* window 1: x = 2 has rank 1, slice [0, 2) = {1, 2}: q(G) = 0.15, p(G) = 0.20. Were the
   * tie 2 / 5 broken the other way, x = 2 would have rank 2 and the slice {5, 2}: 1. */
  assert_float_equal(acc("window=1,latent=off", 2, p), 0.75, 1e-6);
  /* x = 5 (rank 2): slice [1, 3) = {2, 5}: q(G) = p(G) = 0.20 */
  assert_float_equal(acc("window=1,latent=off", 5, p), 1.0, 1e-6);
}

static void test_filters(void **state) {
  (void)state;
  /* x = 4, slice {2, 5, 4, 3}. Probability filter 0.08: |0.10 - 0.20| fails for 2 and 5,
   * |0.25 - 0.20| passes: G = {4, 3}, q 0.45, p 0.60. */
  assert_float_equal(acc("window=2,p_thr=0.08,latent=off", 4, p), 0.75, 1e-6);
  /* Latent filter, x = 4's neighbours 3, 5, 1: k = 1 keeps {4, 3}; k = 2 keeps {4, 5, 3}
   * (q 0.55, p 0.70); k = 3 (the table) keeps the same, 2 is not a neighbour. */
  assert_float_equal(acc("window=2,k=1", 4, p), 0.75, 1e-6);
  assert_float_equal(acc("window=2,k=2", 4, p), 0.55 / 0.70, 1e-6);
  assert_float_equal(acc("window=2,k=3", 4, p), 0.55 / 0.70, 1e-6);
  assert_float_equal(acc("window=2", 4, p), 0.55 / 0.70, 1e-6); /* k clamped to the table */
  /* both filters: p_thr 0.08 leaves {4, 3}, k = 2 keeps 3 */
  assert_float_equal(acc("window=2,p_thr=0.08,k=2", 4, p), 0.75, 1e-6);
  /* no neighbour table (a model without a codebook): no latent filter */
  rule r = vs_test_rule_make("gsd", "window=2,k=1");
  vspec_accept_input in = input(4, p);
  in.neighbours = in.neighbour_table = NULL;
  in.n_neighbours = in.table_k = 0;
  assert_float_equal(r.vt->accept_prob(r.r, &in), 0.8125, 1e-6);
  vs_test_rule_drop(&r);
}

static void test_residual_and_greedy(void **state) {
  (void)state;
  rule r = vs_test_rule_make("gsd", "window=2,latent=off");
  float out[6];
  vspec_accept_input in = input(4, p);
  assert_int_equal(r.vt->residual(r.r, &in, out), 0);
  const float want[6] = {0.20f, 0.0f, 0.0f, 0.15f, 0.0f, 0.0f}; /* max(0, q - p) */
  for (int y = 0; y < 6; y++) assert_float_equal(out[y], want[y], 1e-6);
  in = input(4, NULL);
  assert_int_equal(r.vt->residual(r.r, &in, out), 0);
  for (int y = 0; y < 6; y++) assert_float_equal(out[y], y == 4 ? 0.0f : q[y], 1e-7);
  vs_test_rule_drop(&r);
  /* Greedy: accept x when the target's argmax (0) is x or in G(x). x = 3 (rank 4): slice
   * {5, 4, 3, 0}, |0.30 - 0.25| < 0.15. */
  assert_true(greedy("window=2,latent=off", 0));
  assert_true(greedy("window=2,latent=off", 3));
  assert_false(greedy("window=2,p_thr=0.04,latent=off", 3)); /* 0 filtered out */
  assert_false(greedy("window=2,latent=off", 4));            /* 0 not in the slice */
  assert_false(greedy("window=2,k=1", 3)); /* 3's nearest is 4, not 0 */
  assert_true(greedy("window=2,k=2", 3));
  assert_false(greedy("window=0", 3)); /* exact: argmax only */
}

static void test_params(void **state) {
  (void)state;
  assert_int_equal(create_error("window=65"), VSPEC_ERANGE);
  assert_int_equal(create_error("p_thr=1.5"), VSPEC_ERANGE);
  assert_int_equal(create_error("latent=embed"), VSPEC_EINVAL);
  assert_int_not_equal(create_error("d_thr=0.5"), 0);
  assert_int_equal(create_error("window=7,p_thr=0.15,latent=knn,k=1000"), 0);
}

/* ---- against upstream (tools/ref/gsd_ref.py) ---------------------------------------------- */

typedef struct fcase {
  char params[96];
  int V, sampled, nx;
  int32_t table[MAXV * MAXV];
  float q[MAXV], p[MAXV];
  int32_t x[NX];
  double acp[NX], res[NX][MAXV];
} fcase;

static int read_floats(FILE *f, double *v, int n) {
  for (int i = 0; i < n; i++)
    if (fscanf(f, "%lf", &v[i]) != 1) return -1;
  return 0;
}

/* Reads the next case; 0 at the end of the file, -1 on a malformed file. */
static int read_case(FILE *f, fcase *c) {
  char tag[16];
  double v[MAXV];
  memset(c, 0, sizeof *c);
  if (fscanf(f, " case %95s %d %d %d", c->params, &c->V, &c->sampled, &c->nx) != 4)
    return feof(f) ? 0 : -1;
  if (c->V > MAXV || c->nx > NX || fscanf(f, " %15s", tag) != 1 || strcmp(tag, "table"))
    return -1;
  for (int i = 0; i < c->V * (c->V - 1); i++)
    if (fscanf(f, "%d", &c->table[i]) != 1) return -1;
  if (fscanf(f, " %15s", tag) != 1 || strcmp(tag, "q") || read_floats(f, v, c->V)) return -1;
  for (int y = 0; y < c->V; y++) c->q[y] = (float)v[y];
  if (c->sampled) {
    if (fscanf(f, " %15s", tag) != 1 || strcmp(tag, "p") || read_floats(f, v, c->V)) return -1;
    for (int y = 0; y < c->V; y++) c->p[y] = (float)v[y];
  }
  for (int s = 0; s < c->nx; s++)
    if (fscanf(f, " x %d %lf", &c->x[s], &c->acp[s]) != 2 || read_floats(f, c->res[s], c->V))
      return -1;
  return 1;
}

static vspec_accept_input case_input(const fcase *c, int s) {
  int W = c->V - 1;
  int32_t x = c->x[s];
  vspec_accept_input in = {.struct_size = sizeof in, .vocab = c->V, .token = x, .depth = 1,
                           .max_depth = 1, .p_x = c->sampled ? c->p[x] : 1.0f,
                           .p = c->sampled ? c->p : NULL, .q = c->q,
                           .neighbours = c->table + x * W, .n_neighbours = W,
                           .neighbour_table = c->table, .table_k = W};
  return in;
}

static void test_matches_upstream(void **state) {
  (void)state;
  FILE *f = fopen(FIXTURE, "r");
  if (!f) fail_msg("cannot open %s (run from the repository root)", FIXTURE);
  char line[256];
  assert_non_null(fgets(line, sizeof line, f)); /* header comment */
  static fcase c;
  int n = 0, judged = 0, rc, exact_differs = 0, above_exact = 0, fallbacks = 0;
  int knn = 0, knn_differs = 0;
  while ((rc = read_case(f, &c)) == 1) {
    rule r = vs_test_rule_make("gsd", c.params), ex = vs_test_rule_make("exact", "");
    /* the same rule without its latent filter: "window=W,p_thr=P,k=K" -> ",latent=off" */
    const char *kpos = strstr(c.params, ",k=");
    int is_knn = kpos != NULL;
    char off[128];
    snprintf(off, sizeof off, "%.*s,latent=off", is_knn ? (int)(kpos - c.params) : 0,
             c.params);
    rule ro = vs_test_rule_make("gsd", is_knn ? off : c.params);
    for (int s = 0; s < c.nx; s++) {
      vspec_accept_input in = case_input(&c, s);
      double a = r.vt->accept_prob(r.r, &in);
      if (fabs(a - c.acp[s]) > 2e-5 * fmax(1.0, c.acp[s]))
        fail_msg("case %d (gsd:%s, %s), x %d: accept %.7f, upstream %.7f", n, c.params,
                 c.sampled ? "sampled" : "one-hot", c.x[s], a, c.acp[s]);
      float out[MAXV];
      assert_int_equal(r.vt->residual(r.r, &in, out), 0);
      double mass = 0.0;
      for (int y = 0; y < c.V; y++) mass += out[y];
      for (int y = 0; y < c.V; y++) {
        double got = mass > 0.0 ? out[y] / mass : 0.0;
        if (fabs(got - c.res[s][y]) > 2e-5)
          fail_msg("case %d, x %d: residual[%d] %.7f, upstream %.7f", n, c.x[s], y, got,
                   c.res[s][y]);
      }
      double e = ex.vt->accept_prob(ex.r, &in);
      exact_differs += fabs(e - a) > 1e-4;
      above_exact += a > e + 1e-4;
      fallbacks += fabs(e - a) <= 1e-7;
      if (is_knn) {
        knn++;
        knn_differs += fabs(ro.vt->accept_prob(ro.r, &in) - a) > 1e-4;
      }
      judged++;
    }
    vs_test_rule_drop(&r);
    vs_test_rule_drop(&ex);
    vs_test_rule_drop(&ro);
    n++;
  }
  fclose(f);
  assert_int_equal(rc, 0);
  printf("  %d cases, %d drafts match upstream; exact SD's acceptance differs in %d (%d "
         "higher), equals it in %d; without the latent filter %d of %d knn drafts differ\n",
         n, judged, exact_differs, above_exact, fallbacks, knn_differs, knn);
  assert_true(n >= 72 && judged >= 400);
  assert_true(exact_differs >= judged / 4 && above_exact > 0);
  assert_true(fallbacks > 0);
  assert_true(knn_differs > 0);
}

int main(void) {
  if (vs_test_rules_open()) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_group_ratio),         cmocka_unit_test(test_empty_slice),
      cmocka_unit_test(test_filters),             cmocka_unit_test(test_residual_and_greedy),
      cmocka_unit_test(test_params),              cmocka_unit_test(test_matches_upstream),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_test_rules_close();
  return rc;
}
