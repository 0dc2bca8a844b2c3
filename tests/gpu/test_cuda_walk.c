/* tests/gpu/test_cuda_walk.c - the CUDA device's verify_walk (kernels/cuda/cuda_walk.cu)
 * against the CPU's (kernels/cpu/cpu_walk.c, which tests/test_device_walk.c holds to the
 * engine's host walk) on the same trees, logits and streams.
 *
 * Random cases: vocabularies 16384, 1000 and 64; 1 and 2 CFG rows (guidance mixed per node);
 * temperature 0 (greedy), 0.6, 1, 1.7; top-k 0 and 20; top-p 1 and 0.9; chains and trees of up
 * to 32 nodes with sampled drafts (each node's draft distribution a noisy copy of the target's,
 * children drawn from it) or one-hot drafts; every rule kind: exact, omega (uniform, per depth,
 * optimal and vanilla residual), proximity (set, reference, optimal; a neighbour table of 8).
 * Path, next token, draws, tried candidates and fallbacks must agree exactly for greedy walks;
 * elsewhere the device normalises with block-wide sums in another order than the CPU's
 * sequential ones, which can move a decision that falls within rounding of a boundary: at most
 * 1 % of the sampled walks may differ (the rate is printed). The call makes no upload,
 * download or wait (kernels/vs_device.h counters). VSPEC_WALK_CASES sets the cases per rule
 * (default 150; tools/gpu/check.sh runs fewer under compute-sanitizer). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/gpu/gpu_testutil.h"

#define MAX_MISMATCH_RATE 0.01
#define MAXN 32
#define TK 8

static vspec_dev *g_gpu, *g_cpu;

static int setup(void **state) {
  gt_open_pair(&g_gpu, &g_cpu);
  return gt_need_op(GT_HAS_OP(g_gpu, verify_walk), "verify_walk");
}

static int teardown(void **state) {
  gt_close_pair(g_gpu, g_cpu);
  return 0;
}

/* One case's host data. */
typedef struct walk_case {
  vspec_walk_spec sp;
  float *logits, *dists;
  int32_t parents[MAXN], tokens[MAXN], dist[MAXN], *table;
  uint8_t guided[MAXN];
} walk_case;

static void softmax_noisy(vspec_rng *r, const float *l, int V, float *p) {
  double m = -INFINITY, s = 0.0;
  for (int i = 0; i < V; i++) m = l[i] > m ? l[i] : m;
  for (int i = 0; i < V; i++) s += (p[i] = (float)exp(l[i] + vs_rng_normal(r) * 0.7 - m));
  for (int i = 0; i < V; i++) p[i] = (float)(p[i] / s);
}

static int32_t draw(vspec_rng *r, const float *p, int V) {
  double u = vs_rng_uniform(r), run = 0.0;
  for (int i = 0; i < V; i++)
    if ((run += p[i]) > u) return i;
  return V - 1;
}

static void make_case(vspec_rng *r, walk_case *c, const vspec_walk_rule *rule) {
  static const int vocabs[] = {16384, 1000, 64};
  static const float temps[] = {0.0f, 0.6f, 1.0f, 1.7f};
  int V = vocabs[(int)(vs_rng_uniform(r) * 3)], rows = 1 + (vs_rng_uniform(r) < 0.5);
  int n = 1 + (int)(vs_rng_uniform(r) * MAXN), chain = vs_rng_uniform(r) < 0.3;
  int onehot = vs_rng_uniform(r) < 0.3;
  float temp = temps[(int)(vs_rng_uniform(r) * 4)];
  c->logits = gt_host((size_t)n * rows * V);
  c->dists = gt_host((size_t)n * V);
  c->table = (int32_t *)malloc((size_t)V * TK * sizeof(int32_t));
  for (size_t i = 0; i < (size_t)n * rows * V; i++) c->logits[i] = (float)(vs_rng_normal(r) * 2.5);
  for (int y = 0; y < V; y++)
    for (int j = 0; j < TK; j++) c->table[y * TK + j] = (y + 1 + j * 5) % V;
  for (int j = 0; j < n; j++) {
    c->parents[j] = j == 0 ? -1 : chain ? j - 1 : (int)(vs_rng_uniform(r) * j);
    c->guided[j] = vs_rng_uniform(r) < 0.8;
    c->dist[j] = onehot ? -1 : j;
    softmax_noisy(r, c->logits + (size_t)j * rows * V, V, c->dists + (size_t)j * V);
    c->tokens[j] = j == 0 ? 0 : draw(r, c->dists + (size_t)c->parents[j] * V, V);
  }
  c->sp = (vspec_walk_spec){
      .sample = {.n = n, .rows = rows, .vocab = V, .top_k = vs_rng_uniform(r) < 0.3 ? 20 : 0,
                 .cfg_scale = 3.0f, .temperature = temp,
                 .top_p = vs_rng_uniform(r) < 0.3 ? 0.9f : 1.0f, .guided = c->guided},
      .parents = c->parents, .tokens = c->tokens, .dists = c->dists,
      .dist = onehot ? NULL : c->dist, .neighbours = c->table, .table_k = TK, .rule = *rule};
  uint64_t seed = (uint64_t)(vs_rng_uniform(r) * 1e9);
  vs_rng_init(&c->sp.accept, seed, 3);
  vs_rng_init(&c->sp.target, seed, 1);
}

static void free_case(walk_case *c) {
  free(c->logits);
  free(c->dists);
  free(c->table);
}

/* The CPU's result and the GPU's for one case; nonzero when they differ. */
static int walk_both(const walk_case *c, vspec_walk_result *want, vspec_walk_result *got) {
  const vspec_ops *gpu = vs_dev_ops(g_gpu);
  const vspec_walk_spec *sp = &c->sp;
  int n = sp->sample.n, V = sp->sample.vocab, rows = sp->sample.rows;
  vs_dev_ops(g_cpu)->verify_walk(g_cpu, c->logits, sp, want);
  vspec_walk_spec ds = *sp;
  float *dl = gt_up_bytes(g_gpu, c->logits, (size_t)n * rows * V * sizeof(float));
  ds.sample.guided = gt_up_bytes(g_gpu, c->guided, (size_t)n);
  ds.parents = gt_up_bytes(g_gpu, c->parents, (size_t)n * sizeof(int32_t));
  ds.tokens = gt_up_bytes(g_gpu, c->tokens, (size_t)n * sizeof(int32_t));
  ds.dists = gt_up_bytes(g_gpu, c->dists, (size_t)n * V * sizeof(float));
  ds.dist = sp->dist ? gt_up_bytes(g_gpu, c->dist, (size_t)n * sizeof(int32_t)) : NULL;
  ds.neighbours = gt_up_bytes(g_gpu, c->table, (size_t)V * TK * sizeof(int32_t));
  vspec_walk_result *dr = gt_up_bytes(g_gpu, NULL, sizeof *dr);
  gpu->reserve_scratch(g_gpu, 4 * (size_t)V * sizeof(float));
  vs_dev_counters before, now;
  vs_dev_counters_get(g_gpu, &before);
  gpu->verify_walk(g_gpu, dl, &ds, dr);
  vs_dev_counters_get(g_gpu, &now);
  vs_dev_counters_sub(&now, &before);
  if (now.uploads || now.downloads || now.syncs)
    fail_msg("verify_walk: %llu uploads, %llu downloads, %llu waits (want none)",
             (unsigned long long)now.uploads, (unsigned long long)now.downloads,
             (unsigned long long)now.syncs);
  char err[VSPEC_ERRLEN] = "";
  if (vs_dev_check(g_gpu, err, sizeof err)) fail_msg("device error: %s", err);
  if (gpu->download(g_gpu, got, dr, sizeof *got)) fail_msg("download failed");
  void *bufs[] = {dl, (void *)ds.sample.guided, (void *)ds.parents, (void *)ds.tokens,
                  (void *)ds.dists, (void *)ds.dist, (void *)ds.neighbours, dr};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) gpu->free(g_gpu, bufs[i]);
  return want->status != got->status || want->n_path != got->n_path ||
         want->next != got->next || want->accept_draws != got->accept_draws ||
         want->target_draws != got->target_draws || want->tried != got->tried ||
         want->fallbacks != got->fallbacks ||
         memcmp(want->path, got->path, (size_t)want->n_path * sizeof(int32_t));
}

static void rule_cases(const char *tag, const vspec_walk_rule *rule) {
  const char *env = getenv("VSPEC_WALK_CASES");
  int cases = env ? atoi(env) : 150;
  vspec_rng r;
  vs_rng_init(&r, 0xa11c0de, (uint64_t)rule->kind * 16 + (uint64_t)rule->optimal * 4 +
                                 (uint64_t)rule->reference * 2);
  long sampled = 0, mismatched = 0, accepted = 0;
  for (int i = 0; i < cases; i++) {
    walk_case c;
    make_case(&r, &c, rule);
    vspec_walk_result want, got;
    int differ = walk_both(&c, &want, &got);
    int greedy = !(c.sp.sample.temperature > 0.0f);
    if (differ && greedy)
      fail_msg("%s case %d (greedy, V %d, n %d): cpu path %d next %d, gpu path %d next %d", tag, i,
               c.sp.sample.vocab, c.sp.sample.n, want.n_path, want.next, got.n_path, got.next);
    if (differ)
      printf("  %s case %d (V %d, n %d, T %g): cpu path %d next %d tried %d, gpu path %d next "
             "%d tried %d\n",
             tag, i, c.sp.sample.vocab, c.sp.sample.n, c.sp.sample.temperature, want.n_path,
             want.next, want.tried, got.n_path, got.next, got.tried);
    sampled += !greedy;
    mismatched += differ;
    accepted += want.n_path > 1;
    free_case(&c);
  }
  double rate = sampled ? (double)mismatched / (double)sampled : 0.0;
  printf("  %-22s %d cases, %ld accepted a draft, %ld of %ld sampled walks differ (%.2f %%)\n",
         tag, cases, accepted, mismatched, sampled, 100.0 * rate);
  assert_true(rate <= MAX_MISMATCH_RATE);
}

static void test_rules(void **state) {
  vspec_walk_rule r = {.kind = VSPEC_WALK_EXACT};
  rule_cases("exact", &r);
  r = (vspec_walk_rule){.kind = VSPEC_WALK_OMEGA, .optimal = 1};
  for (int d = 0; d <= VSPEC_WALK_MAX_DEPTH; d++) r.omega[d] = 2.0;
  rule_cases("omega 2 optimal", &r);
  r.optimal = 0;
  for (int d = 0; d <= VSPEC_WALK_MAX_DEPTH; d++) r.omega[d] = 1.6 / (1.0 + 0.3 * d);
  rule_cases("omega by depth, rule", &r);
  r.optimal = 1;
  rule_cases("omega by depth, G*", &r);
  r = (vspec_walk_rule){.kind = VSPEC_WALK_PROXIMITY, .k = 5, .budget_abs = 0.2};
  rule_cases("lantern set", &r);
  r.reference = 1;
  rule_cases("lantern reference", &r);
  r = (vspec_walk_rule){.kind = VSPEC_WALK_PROXIMITY, .k = 6, .budget_rel = 1.0, .reference = 1};
  rule_cases("lanternpp reference", &r);
  r.optimal = 1;
  rule_cases("lanternpp optimal", &r);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_rules)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
