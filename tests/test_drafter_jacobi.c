/*
 * The Jacobi drafter plugin (plugins/drafter/jacobi.c) through the drafter ABI alone: after
 * a round, the next window's drafts past the accepted path are samples of the target's
 * distributions at the verified nodes that predicted them, and each carries that very
 * distribution (SJD's carry: y[n:] with q = p[n:], upstream's SpeculativeSampler.__call__;
 * tools/ref/sjd_ref.py, sjd_iteration); the maximal coupling keeps a draft its new
 * distribution still allows; SJD-PAC's tree offers the same candidates below every node of a
 * level; an AR step moves the window by one. The exactness of the whole is
 * tests/test_sd_exact.c's subject; this test pins the bookkeeping a statistical test could
 * miss (a window shifted by one position is still exact, only slower).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/host.h"
#include "core/params.h"
#include "core/registry.h"
#include "kernels/vs_kernels.h"

#define V 5
#define MAXN 64

static vspec_host host;
static vs_registry *reg;

/* The engine's side, in miniature: a tree the plugin builds, distributions it fills. */
typedef struct tree {
  int n;
  int32_t token[MAXN], parent[MAXN], depth[MAXN];
  float p_cond[MAXN];
  float dist[MAXN][V];
  int has_dist[MAXN];
} tree;

static int32_t t_add(void *ctx, int32_t parent, int32_t token, float p_cond) {
  tree *t = ctx;
  if (t->n == MAXN || parent < 0 || parent >= t->n) return -1;
  int i = t->n++;
  t->token[i] = token;
  t->parent[i] = parent;
  t->depth[i] = t->depth[parent] + 1;
  t->p_cond[i] = p_cond;
  return i;
}

static float *t_dist(void *ctx, int32_t node) {
  tree *t = ctx;
  t->has_dist[node] = 1;
  return t->dist[node];
}

static void t_reset(tree *t, int32_t root) {
  memset(t, 0, sizeof *t);
  t->n = 1;
  t->token[0] = root;
  t->parent[0] = -1;
}

/* The target's distribution at verified node i: one-hot at (3 i + 1) mod V, so the carried
 * drafts are known in advance whatever the RNG draws. */
static float target[MAXN][V];
static int t_target(void *ctx, int32_t node, float *probs) {
  (void)ctx;
  memcpy(probs, target[node], sizeof target[node]);
  return VSPEC_OK;
}

typedef struct jd {
  vs_plugin *plugin;
  const vspec_drafter_vtable *vt;
  vspec_drafter *d;
} jd;

static void jd_open(jd *j, const char *params, int greedy) {
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_registry_acquire(reg, VSPEC_PLUGIN_DRAFTER, "jacobi", &j->plugin, err,
                                       sizeof err), 0);
  j->vt = vs_plugin_vtable(j->plugin);
  vspec_params *p = NULL;
  assert_int_equal(vs_params_parse(params, &p, err, sizeof err), 0);
  vspec_drafter_job job = {.struct_size = sizeof job, .vocab = V, .n_image = 32,
                           .max_depth = 32, .greedy = greedy, .seed = 7};
  int rc = j->vt->create(&host, p, &job, &j->d, err, sizeof err);
  vs_params_free(p);
  if (rc) fail_msg("%s", err);
  assert_int_equal(j->vt->start(j->d, 1, err, sizeof err), 0);
}

static void jd_close(jd *j) {
  j->vt->destroy(j->d);
  vs_plugin_release(j->plugin);
}

static void propose(jd *j, tree *t, int32_t root_index, int32_t root_token, int depth) {
  char err[VSPEC_ERRLEN];
  t_reset(t, root_token);
  vspec_draft_builder b = {.struct_size = sizeof b, .ctx = t, .add = t_add, .dist = t_dist};
  if (j->vt->propose(j->d, root_index, depth, &b, err, sizeof err)) fail_msg("%s", err);
}

/* Ends the round of tree t: n drafts accepted along the first children, then next_root. The
 * target scores one-hot distributions, or uniform ones when `uniform`. */
static void end_with(jd *j, const tree *t, int32_t root_index, int n, int32_t next_root,
                     int uniform) {
  char err[VSPEC_ERRLEN];
  int32_t path[MAXN] = {0};
  for (int k = 1; k <= n; k++) path[k] = path[k - 1] + 1; /* a chain: node k at depth k */
  for (int i = 0; i < t->n; i++) {
    for (int v = 0; v < V; v++) target[i][v] = uniform ? 1.0f / V : 0.0f;
    if (!uniform) target[i][(3 * i + 1) % V] = 1.0f;
  }
  vspec_round_result r = {.struct_size = sizeof r, .root_index = root_index, .n_accepted = n,
                          .path = path, .next_root = next_root, .n_nodes = t->n,
                          .tokens = t->token, .parents = t->parent, .depth = t->depth,
                          .target_dist = t_target};
  if (j->vt->end(j->d, &r, err, sizeof err)) fail_msg("%s", err);
}

static void end(jd *j, const tree *t, int32_t root_index, int n, int32_t next_root) {
  end_with(j, t, root_index, n, next_root, 0);
}

static void expect_chain(const tree *t, int len) {
  assert_int_equal(t->n, len + 1);
  for (int i = 1; i <= len; i++) assert_int_equal(t->parent[i], i - 1);
}

static void test_window_carry(void **state) {
  (void)state;
  jd j;
  tree t;
  jd_open(&j, "", 0);
  /* Round 1: every position is new, drawn uniformly and judged against the uniform. */
  propose(&j, &t, 0, 1, 4);
  expect_chain(&t, 4);
  for (int i = 0; i < 4; i++)
    for (int v = 0; v < V; v++) assert_true(t.dist[i][v] == 1.0f / V);
  /* One draft accepted, then a residual token: image index 2 is the new root. Nodes at depth
   * 2, 3, 4 scored image indices 3, 4, 5: the next window, in that order. */
  end(&j, &t, 0, 1, 3);
  propose(&j, &t, 2, 3, 4);
  expect_chain(&t, 4);
  for (int k = 0; k < 3; k++) { /* tree node k holds the distribution of node k + 1's draft */
    int scored_by = k + 2;
    assert_memory_equal(t.dist[k], target[scored_by], sizeof target[0]);
    assert_int_equal(t.token[k + 1], (3 * scored_by + 1) % V);
    assert_true(t.p_cond[k + 1] == 1.0f);
  }
  /* the window's last position is new again */
  for (int v = 0; v < V; v++) assert_true(t.dist[3][v] == 1.0f / V);
  /* An AR step (a round the drafter sat out) emits index 3: the window starts one later. */
  char err[VSPEC_ERRLEN];
  assert_int_equal((j.vt->skip)(j.d, 4, err, sizeof err), 0); /* cmocka has a skip() macro */
  propose(&j, &t, 3, 4, 2);
  assert_memory_equal(t.dist[0], target[3], sizeof target[0]);
  assert_memory_equal(t.dist[1], target[4], sizeof target[0]);
  /* a round at the wrong image index is refused */
  t_reset(&t, 0);
  vspec_draft_builder b = {.struct_size = sizeof b, .ctx = &t, .add = t_add, .dist = t_dist};
  assert_int_equal(j.vt->propose(j.d, 9, 2, &b, err, sizeof err), VSPEC_EINVAL);
  jd_close(&j);
}

static void test_all_accepted(void **state) {
  (void)state;
  jd j;
  tree t;
  jd_open(&j, "init=random", 0);
  propose(&j, &t, 0, 1, 3);
  /* SJD's random initialisation: each first draft is judged as a deterministic token */
  for (int i = 0; i < 3; i++) {
    assert_true(t.dist[i][t.token[i + 1]] == 1.0f);
    assert_true(t.p_cond[i + 1] == 1.0f);
  }
  /* everything accepted, a bonus token: nothing carries over, all new */
  end(&j, &t, 0, 3, 2);
  propose(&j, &t, 4, 2, 3);
  expect_chain(&t, 3);
  for (int i = 0; i < 3; i++) assert_true(t.dist[i][t.token[i + 1]] == 1.0f);
  jd_close(&j);
}

/* Drafts whose distribution did not move: the maximal coupling keeps every one (probability
 * min(1, q_new / q_old) = 1); independent redraws change most of them. */
static int kept_after_still_round(const char *params) {
  jd j;
  tree t, again;
  jd_open(&j, params, 0);
  propose(&j, &t, 0, 1, 6);
  end_with(&j, &t, 0, 0, 1, 1); /* rejected at once, uniform scores everywhere */
  propose(&j, &again, 1, 1, 6);
  int kept = 0;
  for (int k = 1; k <= 5; k++) kept += again.token[k] == t.token[k + 1]; /* indices 2..6 */
  jd_close(&j);
  return kept;
}

static void test_maximal_keeps(void **state) {
  (void)state;
  assert_int_equal(kept_after_still_round("coupling=maximal"), 5);
  assert_true(kept_after_still_round("coupling=none") < 5);
}

static void test_pac_tree(void **state) {
  (void)state;
  jd j;
  tree t;
  jd_open(&j, "continue=3x3", 0);
  propose(&j, &t, 0, 1, 4);
  /* 1 root + 3 + 9 tree nodes for indices 1 and 2, then the chain for 3 and 4 below the
   * first node of the last level */
  assert_int_equal(t.n, 1 + 3 + 9 + 2);
  int32_t first_level[3], k = 0;
  for (int i = 1; i < t.n; i++)
    if (t.parent[i] == 0) first_level[k++] = i;
  assert_int_equal(k, 3);
  /* distinct candidates, drawn without replacement from the uniform: p_cond 1/5, 1/4, 1/3 */
  assert_true(t.token[first_level[0]] != t.token[first_level[1]]);
  assert_true(t.token[first_level[1]] != t.token[first_level[2]]);
  assert_true(t.token[first_level[0]] != t.token[first_level[2]]);
  assert_float_equal(t.p_cond[first_level[1]], 0.25f, 1e-6f);
  assert_float_equal(t.p_cond[first_level[2]], 1.0f / 3.0f, 1e-6f);
  /* every node of the first level offers the same candidates for index 2 */
  int32_t cand[3][3];
  for (int a = 0; a < 3; a++) {
    int c = 0;
    for (int i = 1; i < t.n; i++)
      if (t.parent[i] == first_level[a] && t.depth[i] == 2) cand[a][c++] = t.token[i];
    assert_int_equal(c, 3);
  }
  assert_memory_equal(cand[0], cand[1], sizeof cand[0]);
  assert_memory_equal(cand[0], cand[2], sizeof cand[0]);
  /* the chain hangs below the first candidate of the last level */
  int32_t chain = t.n - 2;
  assert_int_equal(t.depth[chain], 3);
  assert_int_equal(t.parent[t.parent[chain]], first_level[0]);
  jd_close(&j);
}

static void test_bad_parameters(void **state) {
  (void)state;
  static const char *const bad[] = {"coupling=fancy", "continue=1x3", "continue=3x9",
                                    "continue=3", "init=zero", "width=2"};
  char err[VSPEC_ERRLEN];
  vs_plugin *pl;
  assert_int_equal(vs_registry_acquire(reg, VSPEC_PLUGIN_DRAFTER, "jacobi", &pl, err,
                                       sizeof err), 0);
  const vspec_drafter_vtable *vt = vs_plugin_vtable(pl);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    vspec_params *p = NULL;
    assert_int_equal(vs_params_parse(bad[i], &p, err, sizeof err), 0);
    vspec_drafter_job job = {.struct_size = sizeof job, .vocab = V, .n_image = 8,
                             .max_depth = 32, .seed = 1};
    vspec_drafter *d = NULL;
    err[0] = 0;
    int rc = vt->create(&host, p, &job, &d, err, sizeof err);
    vs_params_free(p);
    if (rc == 0) fail_msg("'%s' was accepted", bad[i]);
    assert_true(err[0] != 0);
  }
  vs_plugin_release(pl);
}

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&host, vs_cpu_ops());
  if (vs_registry_open(dir, &host, &reg, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_window_carry), cmocka_unit_test(test_all_accepted),
      cmocka_unit_test(test_maximal_keeps), cmocka_unit_test(test_pac_tree),
      cmocka_unit_test(test_bad_parameters),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_registry_close(reg);
  return rc;
}
