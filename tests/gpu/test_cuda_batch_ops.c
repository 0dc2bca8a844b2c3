/* tests/gpu/test_cuda_batch_ops.c - the CUDA device's ABI 1.9 batch ops (norm_qkv_rope_batch,
 * tree_attention_batch; kernels/cuda/cuda_fused.cu, cuda_tree_attention.cu) against the
 * CPU's, which run each session's fused op in turn (tests/test_forward_gate.c holds those to
 * each session alone). Batches of one to four sessions with their own caches, trees, slots,
 * lengths, slot counts and caption prefixes, 1 and 2 CFG rows, head_dim 16 (attention session
 * by session), 32, 64 and 128 (the batched kernel), a cache too long for its shared memory
 * (session by session again), and the generic kernel forced (VSPEC_CUDA_ATTENTION=generic):
 * q, k, v, the outputs and every cache within 1e-5 of the largest magnitude at fp32, 2e-2 at
 * bf16 (bf16 weights); at bf16 on the few-row path (at most 8 rows) also bit for bit the GPU's
 * own per-session ops, since the product computes each row alike at any row count and
 * normalises it as the norm kernel does. Unwritten slots hold NaN, which must stay out of
 * every output. Neither op may upload, download or wait once the weights are converted and
 * scratch has grown (a first call warms both). VSPEC_TEST_DEVICE=cpu runs the fp32
 * part against a second CPU device (a check of this file's own bookkeeping). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/gpu/gpu_testutil.h"

#define RTOL 1e-5
#define RTOL_BF16_CPU 2e-2
enum { H = 4, HKV = 2, DIM = 96, MAX_S = 4, POSITIONS = 64 };

static vspec_dev *g_dev, *g_bf16, *g_generic, *g_cpu;

typedef struct sess_case {
  int rows, n, committed, base, slots, n_prefix;
} sess_case;

/* One session's arrays on the host (the CPU's) and on the device under test, twice there:
 * the batch ops' caches and the per-session ops' (ref). */
typedef struct sess {
  float *k, *v, *dk, *dv, *rk, *rv;
  int32_t *parents, lens[2], *slots;
  uint8_t *prefix;
  void *dparents, *dlens, *dslots, *dprefix;
  size_t cache;
  int kv_len;
} sess;

static void sess_make(vspec_dev *dev, vspec_rng *rng, const sess_case *c, int hd, sess *s) {
  int pending = c->base + c->n;
  s->kv_len = c->committed + pending;
  s->cache = (size_t)c->rows * HKV * c->slots * hd;
  s->k = gt_host(s->cache);
  s->v = gt_host(s->cache);
  gt_fill(rng, s->k, s->cache, -1, 1);
  gt_fill(rng, s->v, s->cache, -1, 1);
  for (size_t g = 0; g < (size_t)c->rows * HKV; g++) /* never written: must stay unseen */
    for (int slot = s->kv_len; slot < c->slots; slot++)
      for (int ch = 0; ch < hd; ch++)
        s->k[(g * c->slots + slot) * hd + ch] = s->v[(g * c->slots + slot) * hd + ch] = NAN;
  s->parents = malloc((size_t)pending * sizeof(int32_t));
  s->slots = malloc((size_t)c->n * sizeof(int32_t));
  s->prefix = malloc((size_t)(c->n_prefix ? c->n_prefix : 1));
  for (int a = 0; a < pending; a++)
    s->parents[a] = (a == 0 || vs_rng_uniform(rng) < 0.25) ? -1
                                                            : (int32_t)(vs_rng_uniform(rng) * a);
  for (int j = 0; j < c->n; j++) s->slots[j] = c->committed + c->base + j;
  for (int j = 0; j < c->n_prefix; j++) s->prefix[j] = (uint8_t)(vs_rng_uniform(rng) < 0.7);
  s->lens[0] = c->committed;
  s->lens[1] = c->base;
  s->dk = gt_up(dev, s->k, s->cache);
  s->dv = gt_up(dev, s->v, s->cache);
  s->rk = gt_up(dev, s->k, s->cache);
  s->rv = gt_up(dev, s->v, s->cache);
  s->dparents = gt_up_bytes(dev, s->parents, (size_t)pending * sizeof(int32_t));
  s->dlens = gt_up_bytes(dev, s->lens, sizeof s->lens);
  s->dslots = gt_up_bytes(dev, s->slots, (size_t)c->n * sizeof(int32_t));
  s->dprefix = c->n_prefix ? gt_up_bytes(dev, s->prefix, (size_t)c->n_prefix) : NULL;
}

static void sess_free(vspec_dev *dev, sess *s) {
  const vspec_ops *o = vs_dev_ops(dev);
  o->free(dev, s->dk), o->free(dev, s->dv), o->free(dev, s->rk), o->free(dev, s->rv);
  o->free(dev, s->dparents), o->free(dev, s->dlens), o->free(dev, s->dslots);
  if (s->dprefix) o->free(dev, s->dprefix);
  free(s->k), free(s->v), free(s->parents), free(s->slots), free(s->prefix);
}

/* The session's entry: the CPU's arrays (where 0), the device's (1) or the device's
 * reference caches (2). */
static vspec_kv_batch_entry entry(const sess_case *c, const sess *s, int hd, int row0,
                                  int where) {
  int dev = where > 0;
  return (vspec_kv_batch_entry){
      .kv = {.k = where == 2 ? s->rk : dev ? s->dk : s->k,
             .v = where == 2 ? s->rv : dev ? s->dv : s->v,
             .rows = c->rows, .n_heads = H, .kv_heads = HKV, .head_dim = hd,
             .slots = c->slots},
      .tree = {.n = c->n, .n_prefix = c->n_prefix,
               .lens = dev ? (const int32_t *)s->dlens : s->lens,
               .parents = dev ? (const int32_t *)s->dparents : s->parents,
               .prefix = !c->n_prefix ? NULL : dev ? (const uint8_t *)s->dprefix : s->prefix},
      .slots = dev ? (const int32_t *)s->dslots : s->slots,
      .row0 = row0};
}

/* got against want (n floats of the device): within rtol, or bit for bit with rtol < 0. */
static void expect(const char *what, vspec_dev *dev, const float *dgot, const float *want,
                   size_t n, double rtol) {
  float *got = gt_down(dev, dgot, n);
  if (rtol < 0) assert_memory_equal(got, want, n * sizeof(float));
  else gt_close(what, got, want, n, rtol, 0);
  free(got);
}

static void batch_case(vspec_dev *dev, vspec_rng *rng, int hd, const sess_case *cs, int count) {
  const vspec_ops *o = vs_dev_ops(dev), *C = vs_dev_ops(g_cpu);
  int bf16 = dev == g_bf16, qkv_w = (H + 2 * HKV) * hd, m = 0, max_slots = 0;
  sess ss[MAX_S];
  vspec_kv_batch_entry ce[MAX_S], de[MAX_S];
  for (int i = 0; i < count; i++) {
    sess_make(dev, rng, &cs[i], hd, &ss[i]);
    ce[i] = entry(&cs[i], &ss[i], hd, m, 0);
    de[i] = entry(&cs[i], &ss[i], hd, m, 1);
    m += cs[i].rows * cs[i].n;
    if (cs[i].slots > max_slots) max_slots = cs[i].slots;
  }
  size_t nx = (size_t)m * DIM, nw = (size_t)qkv_w * DIM, nt = (size_t)POSITIONS * hd;
  size_t nq = (size_t)m * qkv_w, no = (size_t)m * H * hd;
  float *x = gt_host(nx), *norm = gt_host(DIM), *w = gt_host(nw), *table = gt_host(nt);
  int32_t *pos = malloc((size_t)m * sizeof(int32_t));
  gt_fill(rng, x, nx, -2, 2);
  gt_fill(rng, norm, DIM, 0.5f, 1.5f);
  gt_fill(rng, w, nw, -0.2f, 0.2f);
  gt_fill(rng, table, nt, -1, 1);
  for (int r = 0; r < m; r++) pos[r] = (int32_t)(vs_rng_uniform(rng) * POSITIONS);
  /* the CPU's batch ops: each session's fused op in turn */
  float *qkv = gt_host(nq), *out = gt_host(no);
  vspec_kv_batch cb = {.count = count, .m = m, .max_slots = max_slots, .entries = ce,
                       .entries_dev = ce};
  C->norm_qkv_rope_batch(g_cpu, x, DIM, norm, 1e-5f, w, pos, table, &cb, qkv);
  C->tree_attention_batch(g_cpu, qkv, &cb, out);
  /* the device's, from its copies of the same inputs */
  float *dx = gt_up(dev, x, nx), *dnorm = gt_up(dev, norm, DIM), *dw = gt_up(dev, w, nw);
  float *dtable = gt_up(dev, table, nt);
  int32_t *dpos = gt_up_bytes(dev, pos, (size_t)m * sizeof(int32_t));
  float *dqkv = o->alloc(dev, nq * sizeof(float)), *dout = o->alloc(dev, no * sizeof(float));
  vspec_kv_batch_entry *dentries = gt_up_bytes(dev, de, (size_t)count * sizeof de[0]);
  vspec_kv_batch db = {.count = count, .m = m, .max_slots = max_slots, .entries = de,
                       .entries_dev = dentries};
  /* Once to warm: a bf16 device converts a weight at its first use and scratch grows, each
   * with a wait (a model does both at its prefill). The second call, which stores the same
   * values into the caches, is the one counted and compared. */
  o->norm_qkv_rope_batch(dev, dx, DIM, dnorm, 1e-5f, dw, dpos, dtable, &db, dqkv);
  o->tree_attention_batch(dev, dqkv, &db, dout);
  vs_dev_counters before, after;
  vs_dev_counters_get(dev, &before);
  o->norm_qkv_rope_batch(dev, dx, DIM, dnorm, 1e-5f, dw, dpos, dtable, &db, dqkv);
  o->tree_attention_batch(dev, dqkv, &db, dout);
  vs_dev_counters_get(dev, &after);
  vs_dev_counters_sub(&after, &before);
  assert_int_equal(after.uploads + after.downloads + after.syncs, 0);
  assert_int_equal(after.ops, 2);
  double tol = bf16 ? RTOL_BF16_CPU : RTOL;
  char what[160];
  snprintf(what, sizeof what, "%s hd %d, %d sessions: q, k, v", bf16 ? "bf16" : "fp32", hd, count);
  expect(what, dev, dqkv, qkv, nq, tol);
  snprintf(what, sizeof what, "%s hd %d, %d sessions: attention", bf16 ? "bf16" : "fp32", hd, count);
  expect(what, dev, dout, out, no, tol);
  for (int i = 0; i < count; i++) /* every cache, the slots up to kv_len (NaN after) */
    for (int kv = 0; kv < 2; kv++) {
      float *g = gt_down(dev, kv ? ss[i].dv : ss[i].dk, ss[i].cache);
      const float *want = kv ? ss[i].v : ss[i].k;
      for (size_t rg = 0; rg < (size_t)cs[i].rows * HKV; rg++) {
        size_t at = rg * cs[i].slots * hd;
        snprintf(what, sizeof what, "hd %d, session %d: %s cache", hd, i, kv ? "v" : "k");
        gt_close(what, g + at, want + at, (size_t)ss[i].kv_len * hd, tol, 0);
      }
      free(g);
    }
  if (bf16 && m <= 8) { /* the few-row path: bit for bit the per-session ops */
    float *rqkv = o->alloc(dev, nq * sizeof(float)), *rout = o->alloc(dev, no * sizeof(float));
    for (int i = 0; i < count; i++) {
      vspec_kv_batch_entry e = entry(&cs[i], &ss[i], hd, de[i].row0, 2);
      size_t r0 = (size_t)e.row0;
      o->norm_qkv_rope(dev, dx + r0 * DIM, e.tree.n, DIM, dnorm, 1e-5f, dw, dpos + r0, dtable,
                       &e.kv, e.slots, rqkv + r0 * qkv_w);
      o->tree_attention(dev, rqkv + r0 * qkv_w, &e.kv, &e.tree, rout + r0 * H * hd);
    }
    float *want = gt_down(dev, rqkv, nq);
    expect("bf16 batch against per session: q, k, v", dev, dqkv, want, nq, -1);
    free(want);
    want = gt_down(dev, rout, no);
    expect("bf16 batch against per session: attention", dev, dout, want, no, -1);
    free(want);
    o->free(dev, rqkv), o->free(dev, rout);
  }
  o->free(dev, dx), o->free(dev, dnorm), o->free(dev, dw), o->free(dev, dtable);
  o->free(dev, dpos), o->free(dev, dqkv), o->free(dev, dout), o->free(dev, dentries);
  for (int i = 0; i < count; i++) sess_free(dev, &ss[i]);
  free(x), free(norm), free(w), free(table), free(pos), free(qkv), free(out);
}

/* rows n committed base slots n_prefix */
static const sess_case mixed[] = {
    {2, 3, 20, 0, 40, 0}, {2, 5, 7, 2, 30, 4}, {1, 1, 33, 0, 64, 1}, {2, 16, 0, 0, 24, 16}};
static const sess_case ar[] = {{2, 1, 50, 0, 60, 1}, {2, 1, 12, 0, 60, 1}, {2, 1, 1, 0, 60, 1}};
/* 11296 slots: past the batched kernel's shared memory at head_dim 64 */
static const sess_case longer[] = {{1, 2, 11200, 0, 11296, 0}, {2, 1, 40, 0, 64, 0}};

static void test_batch_ops(void **state) {
  (void)state;
  vspec_rng rng;
  vs_rng_init(&rng, 1909, 0);
  static const int hds[] = {16, 32, 64, 128};
  for (size_t k = 0; k < sizeof hds / sizeof hds[0]; k++) {
    batch_case(g_dev, &rng, hds[k], mixed, 4);
    batch_case(g_dev, &rng, hds[k], ar, 3);
    batch_case(g_dev, &rng, hds[k], mixed + 1, 1);
  }
  batch_case(g_dev, &rng, 64, longer, 2);
}

/* bf16 weights: against the CPU at fp32, and on the few-row path against the GPU's own
 * per-session ops bit for bit. */
static void test_batch_ops_bf16(void **state) {
  (void)state;
  if (!g_bf16) skip();
  vspec_rng rng;
  vs_rng_init(&rng, 1910, 0);
  batch_case(g_bf16, &rng, 64, ar, 3);      /* 6 rows: the few-row path */
  batch_case(g_bf16, &rng, 64, mixed, 4);   /* 49 rows: tensor cores */
  batch_case(g_bf16, &rng, 32, mixed + 2, 1);
}

/* The generic attention kernel forced at open: the same answers. */
static void test_batch_ops_generic(void **state) {
  (void)state;
  if (!g_generic) skip();
  vspec_rng rng;
  vs_rng_init(&rng, 1911, 0);
  batch_case(g_generic, &rng, 64, mixed, 4);
  batch_case(g_generic, &rng, 64, ar, 3);
}

int main(void) {
  const char *spec = getenv("VSPEC_TEST_DEVICE");
  int on_cpu = spec && strcmp(spec, "cpu") == 0;
  g_dev = on_cpu ? gt_cpu() : gt_gpu(VS_PRECISION_FP32);
  if (!on_cpu) {
    g_bf16 = gt_gpu(VS_PRECISION_BF16);
    setenv("VSPEC_CUDA_ATTENTION", "generic", 1);
    g_generic = gt_gpu(VS_PRECISION_FP32);
    unsetenv("VSPEC_CUDA_ATTENTION");
  }
  g_cpu = gt_cpu();
  if (!vspec_has_batch_ops(vs_dev_ops(g_dev))) {
    fprintf(stderr, "the device has no batch ops\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_batch_ops),
                                     cmocka_unit_test(test_batch_ops_bf16),
                                     cmocka_unit_test(test_batch_ops_generic)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_dev_destroy(g_dev);
  if (g_bf16) vs_dev_destroy(g_bf16);
  if (g_generic) vs_dev_destroy(g_generic);
  vs_dev_destroy(g_cpu);
  return rc;
}
