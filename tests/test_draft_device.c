/*
 * tests/test_draft_device.c - a chain's drafts drawn on the device (ABI 1.8,
 * core/draft_device.c): the draft model draws each draft where its logits are (draw_probs),
 * feeds it to its next forward and the target from device memory (token_dev), the walk reads
 * the drafts' distributions there (walk_probs) and brings their tokens back with its result
 * (walk_tokens). Whole models/fmnist jobs on the CPU device, where the device is the host's
 * memory and draw_probs the host drafter's code, give the tokens and the metrics of the same
 * jobs drafted on the host (VSPEC_DRAFT_DRAW=host, the walk on the device both ways), for the
 * built-in rules, sampled (with CFG, top-k, top-p, a CFG interval) and greedy, with 1 and 2 CFG
 * rows; and a chain round then waits once: the walk's result is its one download. The same for
 * static trees (ABI 1.10, draw_children: a level a forward), sampled and greedy, also where
 * top-k 2 makes rows run out of tokens (absent drafts: the draft stream, draft_tokens and
 * siblings_tried as the host's).
 * Also: draw_probs against the engine's host sampler, row by row, on random logits, and
 * draw_children against the host drafter's sampling without replacement.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine.h"
#include "core/forward_gate.h"
#include "core/host.h"
#include "core/sampling.h"
#include "core/tree.h"
#include "kernels/common/vs_philox.h"
#include "kernels/vs_kernels.h"
#include "tests/support/method_of.h"

#define N_TOK 64

static vspec_host host;
static vs_registry *reg;
static vspec_dev *dev;
static vs_models *models;

static const char *const methods[] = {
    "sd:exact@standard:shape=chain,depth=4,drafter=model",
    "sd:coolsd:delta=2@standard:shape=chain,depth=5,drafter=model",
    "sd:lantern:k=8,delta=0.3@standard:shape=chain,depth=3,drafter=model",
    "sd:lanternpp:resample=optimal,k=6@standard:shape=chain,depth=2,drafter=model",
    /* the EAGLE head: its input features are the target's, read where the target left them */
    "sd:exact@standard:shape=chain,depth=4,drafter=head",
    "sd:coolsd:delta=2@standard:shape=chain,depth=3,drafter=head",
    /* rounds without drafts first (pre-filling): the head's features come to the host */
    "sd:lantern:k=8,delta=0.3@standard:shape=chain,depth=3,drafter=head,prefill=0.2",
    /* static trees (ABI 1.10: draw_children), sampled and greedy */
    "sd:exact@standard:shape=static,drafter=head",
    "sd:coolsd:delta=2@standard:shape=static,tree=0/1/0.0/0.1/0.2/1.0/0.0.0,drafter=model",
    "sd:lanternpp:k=6@standard:shape=static,tree=0/1/2/0.0/0.1/1.0/2.0,drafter=head",
    /* a tree cut at the image's end (depth_limit below the tree's depth) */
    "sd:exact@standard:shape=static,tree=0/0.0/0.0.0/0.0.0.0/0.0.0.0.0/1,drafter=model",
    /* under top-k 2 whole levels run out: the host drafts fewer levels than the device */
    "sd:exact@standard:shape=static,tree=0/1/2/1.0/2.0/1.0.0,drafter=head",
};
#define N_METHODS (sizeof methods / sizeof methods[0])

static const vs_sampling samplings[] = {
    {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 2.0f, .cfg_interval = -1},
    {.temperature = 0.8f, .top_k = 100, .top_p = 0.9f, .cfg_scale = 3.0f, .cfg_interval = 20},
    {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 1.0f, .cfg_interval = -1},
    {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .cfg_scale = 2.0f, .cfg_interval = -1},
    /* two tokens a distribution: a static tree's rows run out (absent drafts), sampled and
     * greedy (the walk judges an absent draft again) */
    {.temperature = 1.0f, .top_k = 2, .top_p = 1.0f, .cfg_scale = 2.0f, .cfg_interval = -1},
    {.temperature = 0.0f, .top_k = 2, .top_p = 1.0f, .cfg_scale = 2.0f, .cfg_interval = -1},
};
#define N_SAMPLINGS (sizeof samplings / sizeof samplings[0])

typedef struct run {
  int32_t tokens[N_TOK];
  vs_metrics m;
  vs_dev_counters last;
  int rounds, over; /* verified rounds past AR steps, and those that waited more than once */
  char first_bad[160];
} run;

static void count_round(void *user, const vs_round_info *in) {
  run *r = user;
  vs_dev_counters now, d;
  vs_dev_counters_get(dev, &now);
  d = now;
  vs_dev_counters_sub(&d, &r->last);
  r->last = now;
  if (in->round == 0 || in->skipped || !in->tree || in->tree->n == 1) return;
  r->rounds++;
  if (d.downloads + d.syncs != 1) {
    r->over++;
    if (!r->first_bad[0])
      snprintf(r->first_bad, sizeof r->first_bad, "round %lld: %llu downloads, %llu syncs",
               (long long)in->round, (unsigned long long)d.downloads,
               (unsigned long long)d.syncs);
  }
}

static void generate(const char *draw, const char *method, const vs_sampling *s, uint64_t seed,
                     run *out) {
  char err[VSPEC_ERRLEN];
  setenv("VSPEC_WALK", "device", 1);
  setenv("VSPEC_DRAFT_DRAW", draw, 1);
  vs_job job = {.method = vs_method_of(method), .class_label = (int32_t)(seed % 10), .seed = seed,
                .sampling = *s, .on_round = count_round, .user = out};
  vs_dev_counters_get(dev, &out->last);
  int rc = vs_generate(models, dev, &job, out->tokens, &out->m, err, sizeof err);
  unsetenv("VSPEC_WALK");
  unsetenv("VSPEC_DRAFT_DRAW");
  if (rc) fail_msg("%s (VSPEC_DRAFT_DRAW=%s): %s", method, draw, err);
}

/* The grid in the plain build; under the sanitizers each method once. */
#ifdef VSPEC_SANITIZED
#define FULL_GRID 0
#else
#define FULL_GRID 1
#endif

static void test_jobs_match_host_drafts(void **state) {
  (void)state;
  for (size_t i = 0; i < N_METHODS; i++) {
    int rounds = 0;
    int64_t accepted = 0;
    for (size_t k = 0; k < N_SAMPLINGS; k++)
      for (uint64_t seed = 0; seed < 2; seed++) {
        if (!FULL_GRID && (k != i % N_SAMPLINGS || seed > 0)) continue;
        run *h = calloc(1, sizeof *h), *d = calloc(1, sizeof *d);
        generate("host", methods[i], &samplings[k], seed * 5 + k, h);
        generate("device", methods[i], &samplings[k], seed * 5 + k, d);
        if (memcmp(h->tokens, d->tokens, sizeof h->tokens))
          fail_msg("%s, sampling %zu, seed %llu: the tokens differ", methods[i], k,
                   (unsigned long long)seed);
        const vs_metrics *a = &h->m, *b = &d->m;
        assert_int_equal(a->rounds, b->rounds);
        assert_int_equal(a->accepted, b->accepted);
        assert_int_equal(a->drafted, b->drafted);
        assert_int_equal(a->draft_tokens, b->draft_tokens);
        /* a static tree drawn on the device expands its absent drafts too (draft_device.c) */
        if (strstr(methods[i], "shape=static")) assert_true(b->draft_forwards >= a->draft_forwards);
        else assert_int_equal(a->draft_forwards, b->draft_forwards);
        assert_int_equal(a->siblings_tried, b->siblings_tried);
        assert_int_equal(a->residual_fallbacks, b->residual_fallbacks);
        assert_memory_equal(a->reached, b->reached, sizeof a->reached);
        assert_memory_equal(a->accepted_at, b->accepted_at, sizeof a->accepted_at);
        /* drafted on the device, a round waits once; on the host once per forward */
        if (d->over) fail_msg("%s: %d rounds waited more than once; %s", methods[i], d->over,
                              d->first_bad);
        assert_true(d->rounds > 0 && h->over == h->rounds);
        rounds += d->rounds;
        accepted += a->accepted;
        free(h);
        free(d);
      }
    printf("  %-72s %d rounds; %lld accepted\n", methods[i], rounds,
           (long long)accepted);
    assert_true(accepted > 0);
  }
}

/* ---- jobs batched through a forward gate ------------------------------------------------ */

/* The target's forward_multi, counting the requests that fed tokens drawn on the device. */
static const vspec_backend_vtable *real_vt;
static vspec_backend_vtable wrap_vt;
static pthread_mutex_t wrap_mu = PTHREAD_MUTEX_INITIALIZER;
static int wrap_batches, wrap_dev_tokens;

static int wrapped_multi(vspec_dev *d, vspec_session *const *ss, const vspec_forward_batch *const *bs,
                         vspec_forward_out *const *outs, int32_t count, char *err, size_t errlen) {
  int rc = real_vt->forward_multi(d, ss, bs, outs, count, err, errlen);
  pthread_mutex_lock(&wrap_mu);
  for (int i = 0; !rc && count > 1 && i < count; i++) wrap_dev_tokens += bs[i]->token_dev != NULL;
  wrap_batches += !rc && count > 1;
  pthread_mutex_unlock(&wrap_mu);
  return rc;
}

typedef struct gate_job {
  vs_models *models;
  vs_forward_gate *gate;
  const char *method;
  vs_sampling sampling;
  uint64_t seed;
  int32_t tokens[N_TOK];
  vs_metrics m;
  int rc;
  char err[VSPEC_ERRLEN];
} gate_job;

static void *gate_job_main(void *arg) {
  gate_job *j = arg;
  vspec_dev *d;
  if ((j->rc = vs_dev_create(vs_cpu_ops(), 1, &d, j->err, sizeof j->err))) return NULL;
  vs_job job = {.method = vs_method_of(j->method), .class_label = (int)(j->seed % 10),
                .seed = j->seed, .sampling = j->sampling, .gate = j->gate};
  j->rc = vs_generate(j->models, d, &job, j->tokens, &j->m, j->err, sizeof j->err);
  vs_dev_destroy(d);
  return NULL;
}

/* Chains and a static tree drawn on the device, several jobs at once through a gate that
 * batches their verifies on the fused ops (VSPEC_MULTI=fused: the tokens drawn on the device
 * and the head's features kept there go into the batch), give the tokens each gets alone: the
 * draft forwards go alone, the verifies are batched. Where the batched products round
 * otherwise than the lone ones, at most 2 % of the tokens may differ (a token fed wrong from
 * the device changes every round after it). */
static void test_gate_jobs(void **state) {
  (void)state;
#ifdef VSPEC_SANITIZED
  print_message("skipped under the sanitizers (whole batched jobs: the same code as above)\n");
  skip();
#endif
  enum { NJ = 3 };
  static const char *const jm[NJ] = {
      "sd:exact@standard:shape=chain,depth=4,drafter=model",
      "sd:coolsd:delta=2@standard:shape=chain,depth=3,drafter=head",
      "sd:lantern:k=8,delta=0.3@standard:shape=static,tree=0/1/0.0/1.0/0.0.0,drafter=model"};
  char err[VSPEC_ERRLEN];
  vspec_dev *ldev, *gate_dev;
  vs_models *fm;
  setenv("VSPEC_MULTI", "fused", 1);
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 1, &ldev, err, sizeof err), 0);
  assert_int_equal(vs_dev_create(vs_cpu_ops(), 2, &gate_dev, err, sizeof err), 0);
  if (vs_models_open(reg, &host, ldev, "models/fmnist", VS_ROLE_ALL, &fm, err, sizeof err))
    fail_msg("%s", err);
  unsetenv("VSPEC_MULTI");
  real_vt = fm->target.vt;
  wrap_vt = *real_vt;
  wrap_vt.forward_multi = wrapped_multi;
  fm->target.vt = &wrap_vt;
  gate_job alone[NJ], batched[NJ];
  vs_forward_gate *g;
  assert_int_equal(vs_forward_gate_create(NJ, 0.5, &gate_dev, 1, &g, err, sizeof err), 0);
  setenv("VSPEC_WALK", "device", 1);
  setenv("VSPEC_DRAFT_DRAW", "device", 1);
  for (int i = 0; i < NJ; i++) {
    alone[i] = (gate_job){.models = fm, .method = jm[i], .sampling = samplings[i],
                          .seed = 11 + (uint64_t)i};
    batched[i] = alone[i];
    batched[i].gate = g;
    gate_job_main(&alone[i]);
  }
  pthread_t th[NJ];
  for (int i = 0; i < NJ; i++) pthread_create(&th[i], NULL, gate_job_main, &batched[i]);
  for (int i = 0; i < NJ; i++) pthread_join(th[i], NULL);
  unsetenv("VSPEC_WALK");
  unsetenv("VSPEC_DRAFT_DRAW");
  int n = fm->target.info.grid_h * fm->target.info.grid_w;
  for (int i = 0; i < NJ; i++) {
    if (alone[i].rc || batched[i].rc) fail_msg("%s: %s%s", jm[i], alone[i].err, batched[i].err);
    int diff = 0;
    for (int k = 0; k < n; k++) diff += alone[i].tokens[k] != batched[i].tokens[k];
    printf("  %-62s %d of %d tokens differ batched\n", jm[i], diff, n);
    if (diff * 50 > n) fail_msg("%s: %d of %d tokens differ", jm[i], diff, n);
  }
  printf("  %d batches of several, %d of their verifies fed tokens drawn on the device\n",
         wrap_batches, wrap_dev_tokens);
  assert_true(wrap_batches > 0 && wrap_dev_tokens > 0);
  vs_forward_gate_destroy(&g);
  fm->target.vt = real_vt;
  vs_models_close(fm);
  vs_dev_destroy(ldev);
  vs_dev_destroy(gate_dev);
}

/* draw_probs gives, row by row, the host drafter's distribution and its token: the same
 * floats, the draw at u or the first maximum. Random logits with ties and -inf entries. */
static void test_draw_probs_op(void **state) {
  (void)state;
  enum { V = 97, N = 6 };
  const vspec_ops *ops = vs_dev_ops(dev);
  float logits[N * 2 * V], probs[N * V], want[V];
  int32_t tokens[N];
  double u[N];
  uint8_t guided[N];
  vs_sampler sp;
  assert_int_equal(vs_sampler_init(&sp, V), 0);
  vspec_rng rng;
  vs_rng_init(&rng, 3, 0);
  for (int trial = 0; trial < 24; trial++) {
    for (int j = 0; j < N * 2 * V; j++) {
      double x = vs_rng_uniform(&rng);
      logits[j] = x < 0.05 ? -INFINITY : x < 0.15 ? 1.0f : (float)(8.0 * x - 4.0);
    }
    for (int i = 0; i < N; i++) u[i] = vs_rng_uniform(&rng), guided[i] = (uint8_t)(i % 3 != 1);
    vs_sampling s = {.temperature = trial % 4 == 3 ? 1.0f : 0.5f + 0.25f * (trial % 3),
                     .top_k = trial % 2 ? 10 : 0, .top_p = trial % 3 ? 0.85f : 1.0f,
                     .cfg_scale = 2.5f, .cfg_interval = -1};
    int rows = 1 + trial % 2, greedy = trial % 4 == 3;
    vspec_sample_spec spec = {.n = N, .rows = rows, .vocab = V, .top_k = s.top_k,
                              .cfg_scale = s.cfg_scale, .temperature = s.temperature,
                              .top_p = s.top_p, .guided = guided, .u = greedy ? NULL : u};
    ops->draw_probs(dev, logits, &spec, probs, tokens);
    for (int i = 0; i < N; i++) {
      /* vs_node_distribution's guidance: rows 2 and a guided node (cfg_interval -1: all) */
      vs_sampling si = s;
      if (!guided[i]) si.cfg_scale = 1.0f;
      float mixed[2 * V];
      memcpy(mixed, logits + (size_t)i * rows * V, (size_t)rows * V * sizeof(float));
      vs_node_distribution(&sp, mixed, guided[i] ? rows : 1, 1, &si, want);
      assert_memory_equal(probs + (size_t)i * V, want, sizeof want);
      int32_t tok = greedy ? vs_argmax_first(want, V) : vs_draw(want, V, u[i]);
      assert_int_equal(tokens[i], tok);
    }
  }
  vs_sampler_free(&sp);
}

/* draw_children against the host drafter's sampling without replacement
 * (core/draft_tree.c dt_sample_children: vs_draw over what is left, unnormalised, the
 * uniforms in row order; greedy: vs_argmax_first of what is left), with rows whose mass runs
 * out before their children do (absent: the row's first child repeated) and rows below an
 * absent child (all absent). */
static void test_draw_children_op(void **state) {
  (void)state;
  enum { V = 53, N = 6, K = 48 };
  const vspec_ops *ops = vs_dev_ops(dev);
  float probs[N * V], left[V];
  int32_t counts[N], first[N], node[N], tokens[K], cursor;
  uint8_t drawn[K];
  double u[K];
  vspec_rng rng;
  vs_rng_init(&rng, 11, 0);
  int spent = 0, below = 0;
  for (int trial = 0; trial < 60; trial++) {
    int total = 0;
    for (int i = 0; i < N; i++) {
      int support = 1 + (int)(vs_rng_uniform(&rng) * (trial % 3 ? V : 6));
      for (int y = 0; y < V; y++) probs[i * V + y] = 0.0f;
      for (int j = 0; j < support; j++)
        probs[i * V + (int)(vs_rng_uniform(&rng) * V)] = (float)vs_rng_uniform(&rng) + 1e-3f;
      counts[i] = (int)(vs_rng_uniform(&rng) * 8);
      first[i] = total;
      /* row i is the distribution of an earlier row's child, or of the root */
      node[i] = i == 0 || total == 0 ? -1 : (int)(vs_rng_uniform(&rng) * first[i]);
      total += counts[i];
    }
    for (int k = 0; k < total; k++) u[k] = vs_rng_uniform(&rng);
    cursor = 0;
    int greedy = trial % 4 == 3; /* u NULL: each child the first maximum of what is left */
    vspec_children_spec spec = {.n = N, .vocab = V, .max_count = 7, .counts = counts,
                                .first = first, .node = node, .u = greedy ? NULL : u,
                                .cursor = &cursor, .drawn = drawn};
    memset(tokens, 0xff, sizeof tokens);
    ops->draw_children(dev, probs, &spec, tokens);
    int at = 0; /* the host drafter's stream */
    uint8_t want[K];
    for (int i = 0; i < N; i++) {
      memcpy(left, probs + i * V, sizeof left);
      int j = 0, live = node[i] < 0 || want[node[i]];
      below += !live && counts[i] > 0;
      for (; j < counts[i] && live; j++) { /* the host drafter's loop */
        int32_t x = greedy ? vs_argmax_first(left, V) : vs_draw(left, V, u[at]);
        if (x < 0 || !(left[x] > 0.0f)) break;
        at += !greedy;
        assert_int_equal(tokens[first[i] + j], x);
        want[first[i] + j] = 1;
        left[x] = 0.0f;
      }
      spent += live && j < counts[i];
      for (int k = j; k < counts[i]; k++) {
        want[first[i] + k] = 0;
        assert_int_equal(tokens[first[i] + k], j > 0 ? tokens[first[i]] : 0);
      }
    }
    assert_int_equal(cursor, at);
    assert_memory_equal(drawn, want, (size_t)total);
  }
  assert_true(spent > 0 && below > 0); /* the trials reached both kinds of absent rows */
}

/* A greedy tree whose node has a draft distribution without mass: draw_children leaves its
 * children absent (token 0), and the walk, given the tree's rows as the engine gives them
 * (core/verify_device.c), skips them where judging them could accept token 0: the host makes
 * the node a leaf and draws the target's argmax after it. */
static void test_massless_row_skipped(void **state) {
  (void)state;
  enum { V = 8, N = 5 };
  const vspec_ops *ops = vs_dev_ops(dev);
  float probs[2 * V] = {0}, logits[N * V];
  probs[3] = 1.0f; /* the root's row: all on token 3; node 1's row: no mass */
  int32_t counts[2] = {1, 3}, first[2] = {0, 1}, node[2] = {-1, 0}, drafts[4], cursor = 0;
  uint8_t drawn[4];
  vspec_children_spec cs = {.n = 1, .vocab = V, .max_count = 3, .counts = counts,
                            .first = first, .node = node, .cursor = &cursor, .drawn = drawn};
  ops->draw_children(dev, probs, &cs, drafts); /* the root's level, then node 1's */
  cs.counts++, cs.first++, cs.node++;
  ops->draw_children(dev, probs + V, &cs, drafts);
  assert_int_equal(drafts[0], 3);
  for (int j = 1; j < 4; j++) assert_true(drafts[j] == 0 && !drawn[j]);
  /* the target: argmax 3 after the root, 0 after node 1 */
  for (int i = 0; i < N * V; i++) logits[i] = 0.0f;
  logits[3] = 5.0f;
  logits[V + 0] = 5.0f;
  int32_t parents[N] = {-1, 0, 1, 1, 1}, toks[N] = {1, 3, 0, 0, 0}, dist[N] = {0, 1, -1, -1, -1};
  vspec_walk_spec sp = {.sample = {.n = N, .rows = 1, .vocab = V, .temperature = 0.0f,
                                   .top_p = 1.0f, .cfg_scale = 1.0f},
                        .parents = parents, .tokens = toks, .dists = probs, .dist = dist,
                        .rule = {.kind = VSPEC_WALK_EXACT}};
  vspec_walk_result r;
  ops->verify_walk(dev, logits, &sp, &r);
  assert_int_equal(r.status, VSPEC_OK);
  assert_int_equal(r.n_path, 2); /* root, node 1: its children skipped */
  assert_int_equal(r.next, 0);
  assert_int_equal(r.tried, 1);
}

int main(void) {
  char err[VSPEC_ERRLEN], dir[1024], cache[] = "/tmp/vspec-draft-device-XXXXXX";
  const char *b = getenv("VSPEC_BUILD");
  snprintf(dir, sizeof dir, "%s/plugins", b ? b : "build");
  if (!mkdtemp(cache)) return 1;
  setenv("VSPEC_CACHE_DIR", cache, 1); /* the neighbour table is built, not read from $HOME */
  vs_host_init(&host, vs_cpu_ops());
  if (vs_registry_open(dir, &host, &reg, err, sizeof err) ||
      vs_dev_create(vs_cpu_ops(), 1, &dev, err, sizeof err) ||
      vs_models_open(reg, &host, dev, "models/fmnist", VS_ROLE_ALL, &models, err, sizeof err)) {
    fprintf(stderr, "setup: %s\n", err);
    return 1;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_draw_probs_op),
                                     cmocka_unit_test(test_draw_children_op),
                                     cmocka_unit_test(test_massless_row_skipped),
                                     cmocka_unit_test(test_jobs_match_host_drafts),
                                     cmocka_unit_test(test_gate_jobs)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_models_close(models);
  vs_dev_destroy(dev);
  vs_registry_close(reg);
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
  if (system(cmd)) rc |= 0;
  return rc;
}
