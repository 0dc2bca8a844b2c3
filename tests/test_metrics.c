/*
 * The acceptance figures of core/metrics.h (DESIGN.md "Metrics"): accept_rate = accepted /
 * every draft token the target scored (vLLM's draft acceptance rate), walk_accept_rate =
 * accepted / depths the verification walk examined. On hand-built counters, and on engine
 * runs over a micro table model whose rounds are counted independently from the round
 * callback (the drafted tree of every verified round, the tokens it accepted).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "core/engine.h"
#include "core/metrics.h"
#include "core/tree.h"
#include "tests/support/table_model.h"
#include "tests/support/method_of.h"

/* 2 accepted of 4 depths examined, in trees of 10 draft tokens in all: the two figures differ
 * by a factor 2.5, so swapping them fails. */
static void test_hand_built(void **state) {
  (void)state;
  vs_metrics m;
  memset(&m, 0, sizeof m);
  m.draft_tokens = 10;
  m.drafted = 4;
  m.accepted = 2;
  assert_true(fabs(vs_metrics_accept_rate(&m) - 0.2) < 1e-12);
  assert_true(fabs(vs_metrics_walk_accept_rate(&m) - 0.5) < 1e-12);
  /* totals add the new counter too */
  vs_metrics t;
  memset(&t, 0, sizeof t);
  vs_metrics_add(&t, &m);
  vs_metrics_add(&t, &m);
  assert_int_equal(t.draft_tokens, 20);
  assert_true(fabs(vs_metrics_accept_rate(&t) - 0.2) < 1e-12);
  /* nothing drafted (AR): 0, not a division by zero */
  memset(&m, 0, sizeof m);
  assert_true(vs_metrics_accept_rate(&m) == 0.0);
  assert_true(vs_metrics_walk_accept_rate(&m) == 0.0);
}

typedef struct counted {
  int64_t draft_nodes, accepted, verified_rounds;
} counted;

static void count_round(void *user, const vs_round_info *info) {
  counted *c = user;
  if (info->skipped || info->round == 0) return;
  c->verified_rounds++;
  if (info->tree) c->draft_nodes += info->tree->n - 1;
  c->accepted += info->accepted_len;
}

/* Runs `method` over `n` seeds; returns the summed metrics and the independent counts. */
static vs_metrics run(vs_table_world *w, const char *method, int n, counted *c) {
  int32_t tokens[8];
  char err[VSPEC_ERRLEN];
  vs_metrics total;
  memset(&total, 0, sizeof total);
  memset(c, 0, sizeof *c);
  for (int i = 0; i < n; i++) {
    vs_job job = {.method = vs_method_of(method), .seed = 1000u + (uint64_t)i, .sampling = w->s,
                  .on_round = count_round, .user = c};
    vs_metrics mt;
    if (vs_generate(w->models, w->dev, &job, tokens, &mt, err, sizeof err))
      fail_msg("%s: %s", method, err);
    vs_metrics_add(&total, &mt);
  }
  return total;
}

/* Greedy, the draft equal to the target: the walk accepts the first child at every depth it
 * examines (walk rate 1), while a tree of top-4 candidates scores 3 more tokens per depth that
 * were never accepted, so vLLM's rate is well below 1: accepted / all tree nodes. */
static void test_tree_greedy_exact_draft(void **state) {
  (void)state;
  vs_table_world w;
  vs_sampling s = {.temperature = 0.0f, .top_p = 1.0f, .cfg_scale = 1.0f, .cfg_interval = -1};
  vs_table_world_open(&w, 6, 6, 77, 0.6, 0.0, &s);
  counted c;
  vs_metrics t = run(&w, "sd:exact@standard:shape=dynamic,top_k=4,depth=3,total_tokens=12,"
                         "drafter=model", 8, &c);
  assert_true(c.verified_rounds > 0);
  assert_int_equal(t.draft_tokens, c.draft_nodes);
  assert_int_equal(t.accepted, c.accepted);
  assert_int_equal(t.draft_tokens, t.tree_nodes - t.rounds); /* one root per round */
  assert_true(t.drafted < t.draft_tokens);
  assert_true(vs_metrics_walk_accept_rate(&t) == 1.0);
  assert_true(fabs(vs_metrics_accept_rate(&t) - (double)c.accepted / (double)c.draft_nodes) <
              1e-12);
  assert_true(vs_metrics_accept_rate(&t) < 0.5);
  vs_table_world_close(&w);
}

/* Sampled, a noisy draft, chains of 4: a rejection at depth d leaves 4 - d scored tokens the
 * walk never examined, so draft_tokens counts every chain node and exceeds drafted. */
static void test_chain_sampled(void **state) {
  (void)state;
  vs_table_world w;
  vs_sampling s = {.temperature = 1.0f, .top_p = 1.0f, .cfg_scale = 1.0f, .cfg_interval = -1};
  vs_table_world_open(&w, 6, 6, 78, 1.2, 1.0, &s);
  counted c;
  vs_metrics t = run(&w, "sd:exact@standard:shape=chain,depth=4,drafter=model", 30, &c);
  assert_int_equal(t.draft_tokens, c.draft_nodes);
  assert_int_equal(t.accepted, c.accepted);
  assert_true(t.accepted > 0 && t.accepted < t.drafted);
  assert_true(t.drafted < t.draft_tokens);
  double a = vs_metrics_accept_rate(&t), wa = vs_metrics_walk_accept_rate(&t);
  assert_true(fabs(a - (double)c.accepted / (double)c.draft_nodes) < 1e-12);
  assert_true(fabs(wa - (double)t.accepted / (double)t.drafted) < 1e-12);
  assert_true(a < wa);
  vs_table_world_close(&w);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_hand_built),
                                     cmocka_unit_test(test_tree_greedy_exact_draft),
                                     cmocka_unit_test(test_chain_sampled)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
