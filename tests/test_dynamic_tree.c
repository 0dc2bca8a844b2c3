/*
 * EAGLE-2's dynamic tree (core/draft_tree.c) keeps the authors' tree while feeding the drafter
 * only the pool nodes that can still reach it.
 *
 * The reference here is a transcription of the authors' pool (Model.topK_genrate in
 * SafeAILab/EAGLE eagle/model/cnets.py, as LANTERN's cnets_llamagen.py runs it): the root's
 * top_k children, then `depth` steps that each expand the top_k best new nodes by cumulative
 * log-probability into their own top_k children, and finally the total_tokens best pool
 * nodes as the tree, in creation order. It grows the whole pool from the draft table (no
 * pruning) for every round the engine ran, at the same emitted prefix, and the two trees
 * must be the same tokens under the same parents in the same order.
 *
 * The pruning must also pay: with total_tokens below top_k the engine feeds far fewer
 * drafter nodes than the unpruned pool expands. Rounds whose reference ranking hinges on two
 * scores closer than float rounding (the engine ranks float probabilities, the reference
 * double ones) are counted and left out; they must be rare.
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
#include "core/tree.h"
#include "tests/support/table_model.h"
#include "tests/support/method_of.h"

#define VOCAB 6
#define LEN 7
#define TOP_K 3
#define STEPS 3
#define POOL 1024
#define TIE 1e-5 /* score gaps below this are float-rounding ties */

typedef struct ref_pool {
  int n;
  int32_t token[POOL], parent[POOL], depth[POOL];
  float score[POOL];
} ref_pool;

typedef struct check {
  const vs_table_model *tm;
  const vs_sampling *s;
  int total;
  int rounds, compared, mismatches, ties;
  int64_t ref_expanded;     /* pool nodes the unpruned reference expands */
  int64_t engine_nodes;     /* nodes the engine's drafter forwarded (roots included) */
  int64_t last_draft_nodes;
} check;

/* The draft distribution's log-probabilities below pool node i (its path after prefix). */
static void node_logp(const check *c, const ref_pool *p, const int32_t *prefix, int n0, int i,
                      float *lp) {
  int32_t seq[LEN + 8];
  memcpy(seq, prefix, (size_t)n0 * sizeof(int32_t));
  int d = p->depth[i];
  for (int a = i; a > 0; a = p->parent[a]) seq[n0 + p->depth[a] - 1] = p->token[a];
  double q[VOCAB];
  vs_table_dist(c->tm, c->tm->draft, seq, n0 + d, c->s, q);
  for (int v = 0; v < VOCAB; v++) lp[v] = q[v] > 0.0 ? logf((float)q[v]) : -INFINITY;
}

/* Indices of the k largest of v[0..n) (descending, ties by index); *tie set when the k-th
 * and the (k+1)-th are closer than TIE. */
static int top_k(const float *v, int n, int k, int *out, int *tie) {
  int used[POOL] = {0}, m = 0;
  for (; m < k && m < n; m++) {
    int best = -1;
    for (int i = 0; i < n; i++)
      if (!used[i] && v[i] > -INFINITY && (best < 0 || v[i] > v[best])) best = i;
    if (best < 0) break;
    used[best] = 1;
    out[m] = best;
  }
  for (int i = 0; m > 0 && m == k && i < n; i++)
    if (!used[i] && fabsf(v[i] - v[out[m - 1]]) < TIE) *tie = 1;
  return m;
}

static int add(ref_pool *p, int parent, int token, float score) {
  p->token[p->n] = token;
  p->parent[p->n] = parent;
  p->depth[p->n] = parent < 0 ? 0 : p->depth[parent] + 1;
  p->score[p->n] = score;
  return p->n++;
}

/* The authors' pool for the round at prefix[0..n0), then its kept tree as (token, parent)
 * in tree order; returns the tree's size (root included) or -1 on a tie. */
static int reference_tree(check *c, const int32_t *prefix, int n0, int depth_limit,
                          int32_t *tok, int32_t *par) {
  static ref_pool p;
  float lp[VOCAB];
  int top[POOL], frontier[TOP_K], nf = 0, tie = 0;
  p.n = 0;
  add(&p, -1, prefix[n0 - 1], 0.0f);
  node_logp(c, &p, prefix, n0, 0, lp);
  int m = top_k(lp, VOCAB, TOP_K, top, &tie);
  for (int j = 0; j < m && depth_limit >= 1; j++) frontier[nf++] = add(&p, 0, top[j], lp[top[j]]);
  for (int step = 1; step <= STEPS && nf > 0; step++) {
    if (p.depth[frontier[0]] >= depth_limit) break;
    int first_new = p.n;
    for (int f = 0; f < nf; f++) {
      node_logp(c, &p, prefix, n0, frontier[f], lp);
      c->ref_expanded++;
      m = top_k(lp, VOCAB, TOP_K, top, &tie);
      for (int j = 0; j < m; j++) add(&p, frontier[f], top[j], p.score[frontier[f]] + lp[top[j]]);
    }
    m = top_k(p.score + first_new, p.n - first_new, TOP_K, top, &tie);
    nf = 0;
    for (int j = 0; j < m; j++) frontier[nf++] = first_new + top[j];
  }
  /* the total best non-root nodes, then in creation order */
  int keep = p.n - 1 < c->total ? p.n - 1 : c->total, kept[POOL], in[POOL] = {0};
  m = top_k(p.score + 1, p.n - 1, keep, kept, &tie);
  for (int j = 0; j < m; j++) in[kept[j] + 1] = 1;
  int32_t map[POOL];
  int n = 1;
  tok[0] = p.token[0];
  par[0] = -1;
  map[0] = 0;
  for (int i = 1; i < p.n; i++) {
    if (!in[i]) continue;
    map[i] = n;
    tok[n] = p.token[i];
    par[n++] = map[p.parent[i]];
  }
  return tie ? -1 : n;
}

static void on_round(void *user, const vs_round_info *in) {
  check *c = user;
  int64_t fed = in->metrics->draft_nodes - c->last_draft_nodes;
  c->last_draft_nodes = in->metrics->draft_nodes;
  if (!in->tree || in->prepended || in->skipped || in->tree->n < 1) return;
  int root_index = in->n_tokens - in->accepted_len - 2;
  if (root_index < 0) return;
  c->rounds++;
  c->engine_nodes += fed;
  int32_t tok[POOL], par[POOL];
  int depth_limit = LEN - root_index - 2;
  int n = reference_tree(c, in->tokens, root_index + 1, depth_limit, tok, par);
  if (n < 0) {
    c->ties++;
    return;
  }
  c->compared++;
  const vs_tree *t = in->tree;
  int same = t->n == n;
  for (int i = 0; same && i < n; i++)
    same = t->nodes[i].token == tok[i] && t->nodes[i].parent == par[i];
  if (!same && c->mismatches++ < 3) {
    printf("  round at %d: engine tree of %d nodes, reference %d:", root_index, t->n, n);
    for (int i = 0; i < t->n; i++) printf(" %d<%d", t->nodes[i].token, t->nodes[i].parent);
    printf(" | ");
    for (int i = 0; i < n; i++) printf(" %d<%d", tok[i], par[i]);
    printf("\n");
  }
}

static void run_total(int total, int greedy) {
  char err[VSPEC_ERRLEN], method[160];
  vs_table_world w;
  vs_sampling s = {.temperature = greedy ? 0.0f : 1.0f, .top_p = 1.0f, .cfg_scale = 2.0f,
                   .cfg_interval = -1};
  vs_table_world_open(&w, VOCAB, LEN, 41, 1.2, 0.6, &s);
  /* The engine ranks children by the drafter's softmax even when sampling greedily. */
  vs_sampling ranked = s;
  if (greedy) ranked.temperature = 1.0f;
  check c = {.tm = &w.tm, .s = &ranked, .total = total};
  snprintf(method, sizeof method, "sd:exact@standard:shape=dynamic,top_k=%d,depth=%d,"
           "total_tokens=%d,drafter=model", TOP_K, STEPS, total);
  for (int seed = 0; seed < 150; seed++) {
    int32_t tokens[LEN];
    vs_metrics mt;
    c.last_draft_nodes = 0;
    vs_job job = {.method = vs_method_of(method),
                  .seed = (uint64_t)seed, .sampling = s, .on_round = on_round,
                  .user = &c};
    if (vs_generate(w.models, w.dev, &job, tokens, &mt, err, sizeof err))
      fail_msg("%s: %s", method, err);
  }
  printf("  total_tokens=%d%s: %d rounds, %d compared, %d mismatched, %d ties; drafter nodes "
         "%lld, unpruned pool expansions %lld\n", total, greedy ? " (greedy)" : "", c.rounds,
         c.compared, c.mismatches, c.ties, (long long)c.engine_nodes, (long long)c.ref_expanded);
  assert_int_equal(c.mismatches, 0);
  assert_true(c.compared >= 200);
  assert_true(c.ties * 20 <= c.rounds);
  /* Below top_k the pruned drafter forwards (roots and catch-up included) fewer nodes than
   * the unpruned pool expands alone. */
  if (total < TOP_K) assert_true(2 * c.engine_nodes < c.ref_expanded);
  vs_table_world_close(&w);
}

static void test_small_trees(void **state) {
  (void)state;
  run_total(1, 0);
  run_total(2, 0);
  run_total(4, 0);
}

static void test_large_trees(void **state) {
  (void)state;
  run_total(8, 0);
  run_total(40, 0); /* more than the pool: nothing to prune */
}

static void test_greedy(void **state) {
  (void)state;
  run_total(3, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_small_trees),
      cmocka_unit_test(test_large_trees),
      cmocka_unit_test(test_greedy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
