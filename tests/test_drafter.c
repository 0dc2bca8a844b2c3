/*
 * The drafter's session stays in step with the emitted sequence: every draft distribution
 * a round holds (the root's and each expanded node's) is the draft model's distribution at
 * the emitted prefix plus the node's path. A plain draft model keeps the KV entries of the
 * accepted nodes it fed while drafting instead of feeding them again (core/drafter.h); a
 * wrong kept slot, a kept node that was never fed or a token fed twice shifts the prefix
 * the draft model sees, and the distributions stop matching. Exact speculative decoding
 * would still sample the target's distribution with a broken drafter, so the statistical
 * tests cannot see this; this test compares the distributions themselves.
 *
 * The model is a micro table model (tests/support/table_model.h), whose session computes
 * every node's logits from its committed tokens and the node's ancestors.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/engine.h"
#include "core/tree.h"
#include "tests/support/table_model.h"
#include "tests/support/method_of.h"

typedef struct check {
  const vs_table_model *tm;
  const vs_sampling *s;
  int compared;   /* distributions compared */
  int mismatches;
  double worst;
} check;

/* The draft distribution of node `i` against the table's at the emitted prefix up to the
 * root (root_index inclusive) followed by the node's path. */
static void check_node(check *c, const vs_round_info *in, int root_index, int32_t i) {
  const vs_tree *t = in->tree;
  if (t->nodes[i].dist < 0) return;
  int32_t prefix[64];
  int depth = t->nodes[i].depth, n = root_index + 1 + depth;
  if (n >= c->tm->len) return; /* the model has no next token there */
  memcpy(prefix, in->tokens, (size_t)(root_index + 1) * sizeof(int32_t));
  for (int32_t a = i; a > 0; a = t->nodes[a].parent) prefix[root_index + t->nodes[a].depth] = t->nodes[a].token;
  double want[64];
  vs_table_dist(c->tm, c->tm->draft, prefix, n, c->s, want);
  const float *got = vs_tree_dist(t, i);
  double d = 0;
  for (int v = 0; v < c->tm->vocab; v++) d = fmax(d, fabs(want[v] - (double)got[v]));
  c->compared++;
  if (d > 1e-5) c->mismatches++;
  if (d > c->worst) c->worst = d;
}

static void on_round(void *user, const vs_round_info *in) {
  check *c = user;
  if (!in->tree || in->prepended) return;
  /* This round emitted the accepted drafts and, unless it skipped the target, one more. */
  int root_index = in->n_tokens - in->accepted_len - (in->skipped ? 1 : 2);
  if (root_index < 0) return;
  for (int32_t i = 0; i < in->tree->n; i++) check_node(c, in, root_index, i);
}

static void run_method(const char *method, int seeds) {
  char err[VSPEC_ERRLEN];
  vs_table_world w;
  vs_sampling s = {.temperature = 1.0f, .top_p = 1.0f, .cfg_scale = 2.0f, .cfg_interval = -1};
  vs_table_world_open(&w, 5, 7, 23, 0.8, 0.6, &s);
  check c = {.tm = &w.tm, .s = &s};
  for (int seed = 0; seed < seeds; seed++) {
    int32_t tokens[7];
    vs_metrics mt;
    vs_job job = {.method = vs_method_of(method),
                  .seed = (uint64_t)seed, .sampling = s, .on_round = on_round,
                  .user = &c};
    if (vs_generate(w.models, w.dev, &job, tokens, &mt, err, sizeof err))
      fail_msg("%s: %s", method, err);
  }
  printf("  %s: %d distributions, %d mismatched, worst %.3g\n", method, c.compared,
         c.mismatches, c.worst);
  assert_true(c.compared > seeds); /* more than the roots of round 1 */
  assert_int_equal(c.mismatches, 0);
  vs_table_world_close(&w);
}

static void test_chain(void **state) {
  (void)state;
  run_method("sd:exact@standard:shape=chain,depth=3,drafter=model", 200);
  run_method("sd:coolsd:delta=2@standard:shape=chain,depth=4,drafter=model", 200);
}

static void test_static_tree(void **state) {
  (void)state;
  run_method("sd:exact@standard:shape=static,tree=0/1/2/0.0/0.1/1.0/0.0.0,drafter=model", 200);
}

static void test_dynamic_tree(void **state) {
  (void)state;
  run_method("sd:exact@standard:shape=dynamic,top_k=3,depth=3,total_tokens=8,drafter=model",
             200);
}

/* Skipped rounds end the drafter's round without a target forward (VVS). */
static void test_skipped_rounds(void **state) {
  (void)state;
  run_method("sd:exact@vvs:skip=uniform,interval=2,warmup=0,drafter=model,shape=chain,depth=3",
             200);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chain),
      cmocka_unit_test(test_static_tree),
      cmocka_unit_test(test_dynamic_tree),
      cmocka_unit_test(test_skipped_rounds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
