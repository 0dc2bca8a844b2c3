/*
 * tests/test_device_walk.c - the ops' verify_walk (ABI 1.6) against the engine's host walk
 * (core/verify_walk.c) on random verified trees, for every built-in rule with a walk_rule:
 * the same path, the same next token, the same number of draws from each Philox stream, the
 * same metrics. The host walk calls the rule plugins through their vtables; the op runs the
 * rule the plugin describes (vspec_accept_vtable.walk_rule) with the shared per-element maths
 * (kernels/common/vs_walk_rules.h), which the CUDA kernel compiles too.
 *
 * Trees: chains and static trees with sampled drafts (each node's children drawn without
 * replacement from its draft distribution, sometimes a token the draft gives no mass), and
 * dynamic-tree shapes with one-hot (top-k) drafts; 1 and 2 CFG rows with a CFG interval that
 * leaves some nodes unguided; temperatures 0 (greedy), 0.6, 1 and 1.7; top-k and top-p on and
 * off. The target's logits are the draft's plus noise, so walks accept, reject and fall back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/host.h"
#include "core/params.h"
#include "core/registry.h"
#include "core/round_loop.h"
#include "kernels/common/vs_philox.h"
#include "kernels/vs_kernels.h"

#define MAXV 64
#define MAXN 24
#define TABLE_K 6

static vspec_host host;
static vs_registry *reg;
static vspec_dev *dev;

typedef struct rule {
  const char *name, *params;
} rule_case;

/* Every built-in rule with a device walk, and each of its residuals and greedy tests. */
static const rule_case rules[] = {
    {"exact", ""},
    {"uniform_rsd", ""},
    {"uniform_rsd", "omega=0.6"},
    {"uniform_rsd", "omega=3,resample=rule"},
    {"coolsd", ""},
    {"coolsd", "schedule=linear,nu=0.9,delta=1.3"},
    {"coolsd", "resample=rule,delta=0.8"},
    {"lantern", ""},
    {"lantern", "k=3,delta=0.3"},
    {"lantern", "reject=reference,k=2,delta=0.2"},
    {"lantern", "resample=optimal,delta=0.25"},
    {"lantern", "delta=1"}, /* A(x) takes every neighbour: residuals run out of mass */
    {"lanternpp", ""},
    {"lanternpp", "k=3,lambda=4"},
    {"lanternpp", "reject=set,lambda=3"},
    {"lanternpp", "resample=optimal,lambda=2.5"},
};
#define N_RULES (sizeof rules / sizeof rules[0])

/* A case's random numbers: a Philox stream of the test's own (not the engine's streams). */
static double unif(vspec_rng *r) { return vs_rng_uniform(r); }
static int below(vspec_rng *r, int n) { return (int)(unif(r) * n); }

typedef struct world {
  int V, rows, shape; /* shape 0 chain, 1 static (sampled), 2 dynamic (one-hot) */
  vs_sampling s;
  int root_index;
  vs_tree tree;
  float logits[MAXN * 2 * MAXV];
  int32_t table[MAXV * TABLE_K];
} world;

static void softmax(const float *l, int V, float *p) {
  double m = l[0], s = 0.0;
  for (int i = 1; i < V; i++) m = l[i] > m ? l[i] : m;
  for (int i = 0; i < V; i++) s += exp(l[i] - m);
  for (int i = 0; i < V; i++) p[i] = (float)(exp(l[i] - m) / s);
}

/* A token from p without the tokens in used[0..n_used) (sampling without replacement). */
static int32_t draw_without(vspec_rng *r, const float *p, int V, const int32_t *used, int n_used) {
  double tot = 0.0;
  float w[MAXV];
  for (int i = 0; i < V; i++) {
    w[i] = p[i];
    for (int j = 0; j < n_used; j++)
      if (used[j] == i) w[i] = 0.0f;
    tot += w[i];
  }
  if (!(tot > 0.0)) return -1;
  double u = unif(r) * tot, run = 0.0;
  for (int i = 0; i < V; i++)
    if (w[i] > 0.0f && (run += w[i]) > u) return i;
  return V - 1;
}

/* Some token the draft keeps (so that its distribution keeps mass). */
static int32_t node_token(const world *w, int32_t node) { return (node * 7 + 3) % w->V; }

/* Children of node: a chain has one, a tree up to 3; a child sometimes repeats nothing but
 * is a token of no draft mass (skipped by the walk). */
static void grow(world *w, vspec_rng *r, int32_t node, const float *node_logits) {
  vs_tree *t = &w->tree;
  int width = w->shape == 0 ? 1 : 1 + below(r, 3);
  float p[MAXV];
  float noisy[MAXV];
  for (int i = 0; i < w->V; i++) noisy[i] = node_logits[i] + (float)(unif(r) - 0.5) * 1.5f;
  softmax(noisy, w->V, p);
  if (w->shape != 2 && unif(r) < 0.3) { /* a draft that rules tokens out */
    for (int i = 0; i < w->V; i++)
      if (unif(r) < 0.3 && i != node_token(w, node)) p[i] = 0.0f;
  }
  float *d = w->shape == 2 ? NULL : vs_tree_new_dist(t, node);
  if (d) {
    double s = 0.0;
    for (int i = 0; i < w->V; i++) s += p[i];
    for (int i = 0; i < w->V; i++) d[i] = (float)(p[i] / s);
  }
  int32_t used[4];
  for (int c = 0; c < width && t->n < MAXN; c++) {
    int32_t x = unif(r) < 0.1 ? below(r, w->V) : draw_without(r, d ? d : p, w->V, used, c);
    if (x < 0) break;
    used[c] = x;
    vs_tree_add(t, node, x, 1.0f, 0.0f);
  }
}

static void make_world(world *w, vspec_rng *r, int shape) {
  static const float temps[] = {0.0f, 0.6f, 1.0f, 1.7f};
  w->V = below(r, 2) ? MAXV : 16;
  w->rows = 1 + below(r, 2);
  w->shape = shape;
  w->s = (vs_sampling){.temperature = temps[below(r, 4)], .top_k = (int[]){0, 0, 5, 2}[below(r, 4)],
                       .top_p = below(r, 3) ? 1.0f : 0.85f,
                       .cfg_scale = w->rows == 2 ? 2.5f : 1.0f,
                       .cfg_interval = below(r, 2) ? -1 : below(r, 4)};
  w->root_index = below(r, 5);
  w->tree.vocab = w->V; /* the dists' row stride: the vocabulary in use */
  for (int i = 0; i < MAXN * w->rows * w->V; i++)
    w->logits[i] = (float)((unif(r) - 0.5) * 6.0);
  for (int y = 0; y < w->V; y++) /* a random neighbour order, y itself excluded */
    for (int j = 0; j < TABLE_K; j++) w->table[y * TABLE_K + j] = (y + 1 + j * 2) % w->V;
  for (int y = 0; y < w->V; y++)
    for (int j = TABLE_K - 1; j > 0; j--) {
      int k = below(r, j + 1);
      int32_t tmp = w->table[y * TABLE_K + j];
      w->table[y * TABLE_K + j] = w->table[y * TABLE_K + k];
      w->table[y * TABLE_K + k] = tmp;
    }
  vs_tree_reset(&w->tree, below(r, w->V));
  w->tree.deterministic = shape == 2 || w->s.temperature <= 0.0f;
  for (int32_t node = 0; node < w->tree.n && w->tree.n < MAXN; node++) {
    int depth = w->tree.nodes[node].depth;
    if (depth >= 6 || (node > 0 && unif(r) < 0.25)) continue;
    grow(w, r, node, w->logits + (size_t)node * w->rows * w->V);
  }
}

typedef struct walked {
  int n_path, fallbacks, tried;
  int32_t path[MAXN], next;
  vspec_rng acc, tgt;
} walked;

static walked host_walk(world *w, const vspec_accept_vtable *vt, vspec_rule *rule, uint64_t seed) {
  vs_rounds c;
  memset(&c, 0, sizeof c);
  vs_metrics mt;
  memset(&mt, 0, sizeof mt);
  float q[MAXV], q_res[MAXV], q_tmp[MAXV], p_work[MAXV];
  c.tree = w->tree;
  c.V = w->V;
  c.rows = w->rows;
  c.logits = w->logits;
  c.s = &w->s;
  c.greedy = w->s.temperature <= 0.0f;
  c.rule_vt = vt;
  c.rule = rule;
  c.neighbours = w->table;
  c.neighbours_k = TABLE_K;
  c.q = q, c.q_res = q_res, c.q_tmp = q_tmp, c.p_work = p_work;
  c.mt = &mt;
  assert_int_equal(vs_sampler_init(&c.sampler, w->V), 0);
  vs_rng_init(&c.rng_accept, seed, VS_STREAM_ACCEPT);
  vs_rng_init(&c.rng_target, seed, VS_STREAM_TARGET_SAMPLE);
  walked o;
  char err[256];
  assert_int_equal(
      vs_verify_walk(&c, w->root_index, o.path, &o.n_path, &o.next, err, sizeof err), 0);
  vs_sampler_free(&c.sampler);
  o.fallbacks = (int)mt.residual_fallbacks;
  o.tried = (int)mt.siblings_tried;
  o.acc = c.rng_accept;
  o.tgt = c.rng_target;
  return o;
}

static walked device_walk(world *w, const vspec_accept_vtable *vt, vspec_rule *rule,
                          uint64_t seed) {
  const vs_tree *t = &w->tree;
  int32_t parents[MAXN], tokens[MAXN], dist[MAXN];
  uint8_t guided[MAXN];
  vs_tree_parents(t, parents);
  for (int i = 0; i < t->n; i++) {
    tokens[i] = t->nodes[i].token;
    dist[i] = t->nodes[i].dist;
    guided[i] = (uint8_t)vs_cfg_guided(&w->s, w->root_index + t->nodes[i].depth + 1);
  }
  vspec_walk_spec sp = {
      .sample = {.n = t->n, .rows = w->rows, .vocab = w->V, .top_k = w->s.top_k,
                 .cfg_scale = w->s.cfg_scale, .temperature = w->s.temperature,
                 .top_p = w->s.top_p, .guided = guided},
      .parents = parents, .tokens = tokens, .dists = t->dists,
      .dist = t->deterministic ? NULL : dist, .neighbours = w->table, .table_k = TABLE_K};
  assert_int_equal(vt->walk_rule(rule, vs_tree_max_depth(t), &sp.rule), 0);
  vs_rng_init(&sp.accept, seed, VS_STREAM_ACCEPT);
  vs_rng_init(&sp.target, seed, VS_STREAM_TARGET_SAMPLE);
  vspec_walk_result res;
  vs_dev_ops(dev)->verify_walk(dev, w->logits, &sp, &res);
  assert_int_equal(res.status, 0);
  walked o = {.n_path = res.n_path, .next = res.next, .fallbacks = res.fallbacks,
              .tried = res.tried, .acc = sp.accept, .tgt = sp.target};
  memcpy(o.path, res.path, (size_t)res.n_path * sizeof(int32_t));
  for (int i = 0; i < res.accept_draws; i++) vs_rng_uniform(&o.acc);
  for (int i = 0; i < res.target_draws; i++) vs_rng_uniform(&o.tgt);
  return o;
}

typedef struct tally {
  int cases, accepted, rejected_all, fallbacks, greedy;
} tally;

static void run_rule(const rule_case *ru, int cases, tally *tl) {
  char err[VSPEC_ERRLEN];
  vs_plugin *pl;
  if (vs_registry_acquire(reg, VSPEC_PLUGIN_ACCEPT, ru->name, &pl, err, sizeof err))
    fail_msg("%s", err);
  const vspec_accept_vtable *vt = vs_plugin_vtable(pl);
  assert_true(VSPEC_HAS_FIELD(vt, vspec_accept_vtable, walk_rule) && vt->walk_rule);
  vspec_params *p;
  assert_int_equal(vs_params_parse(ru->params, &p, err, sizeof err), 0);
  vspec_rule *rule;
  if (vt->create(&host, p, &rule, err, sizeof err))
    fail_msg("%s(%s): %s", ru->name, ru->params, err);
  vs_params_free(p);
  vspec_rng r;
  vs_rng_init(&r, 0x5eed0000u + (uint64_t)strlen(ru->params), 77);
  world *w = calloc(1, sizeof *w);
  assert_int_equal(vs_tree_init(&w->tree, MAXN, MAXN, MAXV), 0);
  for (int i = 0; i < cases; i++) {
    make_world(w, &r, i % 3);
    uint64_t seed = 1000u + (uint64_t)i;
    walked a = host_walk(w, vt, rule, seed), b = device_walk(w, vt, rule, seed);
    if (a.n_path != b.n_path || a.next != b.next ||
        memcmp(a.path, b.path, (size_t)a.n_path * sizeof(int32_t)) ||
        a.fallbacks != b.fallbacks || a.tried != b.tried || memcmp(&a.acc, &b.acc, sizeof a.acc) ||
        memcmp(&a.tgt, &b.tgt, sizeof a.tgt))
      fail_msg("%s(%s) case %d (shape %d, V %d, rows %d, T %g, top_k %d, top_p %g): host path "
               "%d next %d tried %d fb %d, device path %d next %d tried %d fb %d",
               ru->name, ru->params, i, w->shape, w->V, w->rows, w->s.temperature, w->s.top_k,
               w->s.top_p, a.n_path, a.next, a.tried, a.fallbacks, b.n_path, b.next, b.tried,
               b.fallbacks);
    tl->cases++;
    tl->accepted += a.n_path > 1;
    tl->rejected_all += a.n_path == 1 && w->tree.n > 1;
    tl->fallbacks += a.fallbacks > 0;
    tl->greedy += w->s.temperature <= 0.0f;
  }
  vs_tree_free(&w->tree);
  free(w);
  vt->destroy(rule);
  vs_plugin_release(pl);
}

/* Every rule: the walks agree, and the cases reached every branch of the walk. */
static void test_rules_match_host_walk(void **state) {
  (void)state;
  int fell_back = 0;
  for (size_t i = 0; i < N_RULES; i++) {
    tally tl = {0};
    run_rule(&rules[i], 600, &tl);
    fell_back += tl.fallbacks;
    printf("  %-11s %-34s %d cases: %d accepted a draft, %d rejected every child, %d fell back, "
           "%d greedy\n",
           rules[i].name, rules[i].params, tl.cases, tl.accepted, tl.rejected_all, tl.fallbacks,
           tl.greedy);
    assert_true(tl.accepted > 50 && tl.rejected_all > 20 && tl.greedy > 50);
  }
  assert_true(fell_back >= 10); /* the fallbacks of residuals without mass were walked too */
}

/* An AR step is the one-node tree: the op draws the host's token with one target uniform. */
static void test_ar_step(void **state) {
  (void)state;
  tally tl = {0};
  for (int i = 0; i < 200; i++) {
    vspec_rng r;
    vs_rng_init(&r, 4242, (uint64_t)i);
    world *w = calloc(1, sizeof *w);
    assert_int_equal(vs_tree_init(&w->tree, MAXN, MAXN, MAXV), 0);
    make_world(w, &r, 0);
    vs_tree_reset(&w->tree, w->tree.nodes[0].token); /* the root alone */
    char err[VSPEC_ERRLEN];
    vs_plugin *pl;
    assert_int_equal(vs_registry_acquire(reg, VSPEC_PLUGIN_ACCEPT, "exact", &pl, err, sizeof err),
                     0);
    const vspec_accept_vtable *vt = vs_plugin_vtable(pl);
    vspec_params *p;
    assert_int_equal(vs_params_parse("", &p, err, sizeof err), 0);
    vspec_rule *rule;
    assert_int_equal(vt->create(&host, p, &rule, err, sizeof err), 0);
    vs_params_free(p);
    walked a = host_walk(w, vt, rule, 9), b = device_walk(w, vt, rule, 9);
    assert_int_equal(b.n_path, 1);
    assert_int_equal(a.next, b.next);
    assert_memory_equal(&a.tgt, &b.tgt, sizeof a.tgt);
    tl.cases++;
    vt->destroy(rule);
    vs_plugin_release(pl);
    vs_tree_free(&w->tree);
    free(w);
  }
  assert_int_equal(tl.cases, 200);
}

/* A bad spec is refused with VSPEC_EINVAL, not walked. */
static void test_bad_spec(void **state) {
  (void)state;
  float logits[2 * 4] = {0.1f, 0.2f, 0.3f, 0.4f, 0.4f, 0.3f, 0.2f, 0.1f}; /* [n, rows, vocab] */
  int32_t parents[2] = {-1, 0}, tokens[2] = {0, 9};
  vspec_walk_spec sp = {.sample = {.n = 2, .rows = 1, .vocab = 4, .temperature = 1.0f,
                                   .top_p = 1.0f},
                        .parents = parents, .tokens = tokens,
                        .rule = {.kind = VSPEC_WALK_EXACT}};
  vspec_walk_result res;
  vs_dev_ops(dev)->verify_walk(dev, logits, &sp, &res); /* token 9 outside the vocabulary */
  assert_int_equal(res.status, VSPEC_EINVAL);
  tokens[1] = 2;
  parents[1] = 1; /* a node its own parent */
  vs_dev_ops(dev)->verify_walk(dev, logits, &sp, &res);
  assert_int_equal(res.status, VSPEC_EINVAL);
  parents[1] = 0;
  sp.rule.kind = 99;
  vs_dev_ops(dev)->verify_walk(dev, logits, &sp, &res);
  assert_int_equal(res.status, VSPEC_EINVAL);
  sp.rule.kind = VSPEC_WALK_EXACT;
  vs_dev_ops(dev)->verify_walk(dev, logits, &sp, &res);
  assert_int_equal(res.status, VSPEC_OK);
}

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024];
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  vs_host_init(&host, vs_cpu_ops());
  if (vs_registry_open(dir, &host, &reg, err, sizeof err) ||
      vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rules_match_host_walk),
      cmocka_unit_test(test_ar_step),
      cmocka_unit_test(test_bad_spec),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_dev_destroy(dev);
  vs_registry_close(reg);
  return rc;
}
