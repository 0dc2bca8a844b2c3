/* tests/gpu/test_cuda_batch_ops.c - the CUDA device's ABI 1.9 batch ops (norm_qkv_rope_batch,
 * tree_attention_batch; kernels/cuda/cuda_fused.cu, cuda_tree_attention.cu) against the
 * CPU's, which run each session's fused op in turn (tests/test_forward_gate.c holds those to
 * each session alone). Three or four sessions with their own caches, trees, slots, lengths and
 * slot counts, 1 and 2 CFG rows, head_dim 64 (the batched kernels) and 16 (attention session
 * by session), fp32 within 1e-5 of the largest magnitude: q, k, v, the outputs and every
 * cache. Unwritten slots hold NaN, which must stay out of every output. Neither op may
 * upload, download or wait. VSPEC_TEST_DEVICE=cpu runs the same against a second CPU device
 * (a check of this file's own bookkeeping). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/gpu/gpu_testutil.h"

#define RTOL 1e-5
enum { H = 4, HKV = 2, DIM = 96, MAX_S = 4 };

static vspec_dev *g_dev, *g_cpu;

typedef struct sess_case {
  int rows, n, committed, base, slots;
} sess_case;

/* One session's arrays on the host (the CPU's) and on the device under test. */
typedef struct sess {
  float *k, *v, *dk, *dv;
  int32_t *parents, lens[2], *slots;
  void *dparents, *dlens, *dslots;
  size_t cache;
  int kv_len;
} sess;

static void sess_make(vspec_rng *rng, const sess_case *c, int hd, sess *s) {
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
  for (int a = 0; a < pending; a++)
    s->parents[a] = (a == 0 || vs_rng_uniform(rng) < 0.25) ? -1
                                                            : (int32_t)(vs_rng_uniform(rng) * a);
  for (int j = 0; j < c->n; j++) s->slots[j] = c->committed + c->base + j;
  s->lens[0] = c->committed;
  s->lens[1] = c->base;
  s->dk = gt_up(g_dev, s->k, s->cache);
  s->dv = gt_up(g_dev, s->v, s->cache);
  s->dparents = gt_up_bytes(g_dev, s->parents, (size_t)pending * sizeof(int32_t));
  s->dlens = gt_up_bytes(g_dev, s->lens, sizeof s->lens);
  s->dslots = gt_up_bytes(g_dev, s->slots, (size_t)c->n * sizeof(int32_t));
}

static void sess_free(sess *s) {
  const vspec_ops *o = vs_dev_ops(g_dev);
  o->free(g_dev, s->dk), o->free(g_dev, s->dv), o->free(g_dev, s->dparents);
  o->free(g_dev, s->dlens), o->free(g_dev, s->dslots);
  free(s->k), free(s->v), free(s->parents), free(s->slots);
}

/* The session's entry: the CPU's arrays, or the device's. */
static vspec_kv_batch_entry entry(const sess_case *c, const sess *s, int hd, int row0, int dev) {
  return (vspec_kv_batch_entry){
      .kv = {.k = dev ? s->dk : s->k, .v = dev ? s->dv : s->v, .rows = c->rows, .n_heads = H,
             .kv_heads = HKV, .head_dim = hd, .slots = c->slots},
      .tree = {.n = c->n, .lens = dev ? (const int32_t *)s->dlens : s->lens,
               .parents = dev ? (const int32_t *)s->dparents : s->parents},
      .slots = dev ? (const int32_t *)s->dslots : s->slots,
      .row0 = row0};
}

static void batch_case(vspec_rng *rng, int hd, const sess_case *cs, int count) {
  const vspec_ops *o = vs_dev_ops(g_dev), *C = vs_dev_ops(g_cpu);
  int qkv_w = (H + 2 * HKV) * hd, m = 0, max_slots = 0, positions = 64;
  sess ss[MAX_S];
  vspec_kv_batch_entry ce[MAX_S], de[MAX_S];
  for (int i = 0; i < count; i++) {
    sess_make(rng, &cs[i], hd, &ss[i]);
    ce[i] = entry(&cs[i], &ss[i], hd, m, 0);
    de[i] = entry(&cs[i], &ss[i], hd, m, 1);
    m += cs[i].rows * cs[i].n;
    if (cs[i].slots > max_slots) max_slots = cs[i].slots;
  }
  size_t nx = (size_t)m * DIM, nw = (size_t)qkv_w * DIM, nt = (size_t)positions * hd;
  size_t nq = (size_t)m * qkv_w, no = (size_t)m * H * hd;
  float *x = gt_host(nx), *norm = gt_host(DIM), *w = gt_host(nw), *table = gt_host(nt);
  int32_t *pos = malloc((size_t)m * sizeof(int32_t));
  gt_fill(rng, x, nx, -2, 2);
  gt_fill(rng, norm, DIM, 0.5f, 1.5f);
  gt_fill(rng, w, nw, -0.2f, 0.2f);
  gt_fill(rng, table, nt, -1, 1);
  for (int r = 0; r < m; r++) pos[r] = (int32_t)(vs_rng_uniform(rng) * positions);
  /* the CPU's batch ops: each session's fused op in turn */
  float *qkv = gt_host(nq), *out = gt_host(no);
  vspec_kv_batch cb = {.count = count, .m = m, .max_slots = max_slots, .entries = ce,
                       .entries_dev = ce};
  C->norm_qkv_rope_batch(g_cpu, x, DIM, norm, 1e-5f, w, pos, table, &cb, qkv);
  C->tree_attention_batch(g_cpu, qkv, &cb, out);
  /* the device's, from its copies of the same inputs */
  float *dx = gt_up(g_dev, x, nx), *dnorm = gt_up(g_dev, norm, DIM), *dw = gt_up(g_dev, w, nw);
  float *dtable = gt_up(g_dev, table, nt);
  int32_t *dpos = gt_up_bytes(g_dev, pos, (size_t)m * sizeof(int32_t));
  float *dqkv = o->alloc(g_dev, nq * sizeof(float)), *dout = o->alloc(g_dev, no * sizeof(float));
  vspec_kv_batch_entry *dentries = gt_up_bytes(g_dev, de, (size_t)count * sizeof de[0]);
  vspec_kv_batch db = {.count = count, .m = m, .max_slots = max_slots, .entries = de,
                       .entries_dev = dentries};
  vs_dev_counters before, after;
  vs_dev_counters_get(g_dev, &before);
  o->norm_qkv_rope_batch(g_dev, dx, DIM, dnorm, 1e-5f, dw, dpos, dtable, &db, dqkv);
  o->tree_attention_batch(g_dev, dqkv, &db, dout);
  vs_dev_counters_get(g_dev, &after);
  vs_dev_counters_sub(&after, &before);
  assert_int_equal(after.uploads + after.downloads + after.syncs, 0);
  assert_int_equal(after.ops, 2);
  char what[160];
  float *got = gt_down(g_dev, dqkv, nq);
  snprintf(what, sizeof what, "hd %d, %d sessions: q, k, v", hd, count);
  gt_close(what, got, qkv, nq, RTOL, 0);
  free(got);
  got = gt_down(g_dev, dout, no);
  snprintf(what, sizeof what, "hd %d, %d sessions: attention", hd, count);
  gt_close(what, got, out, no, RTOL, 0);
  free(got);
  for (int i = 0; i < count; i++) { /* every cache, the slots up to kv_len (NaN after) */
    for (int kv = 0; kv < 2; kv++) {
      float *g = gt_down(g_dev, kv ? ss[i].dv : ss[i].dk, ss[i].cache);
      const float *want = kv ? ss[i].v : ss[i].k;
      for (size_t rg = 0; rg < (size_t)cs[i].rows * HKV; rg++) {
        size_t at = rg * cs[i].slots * hd;
        snprintf(what, sizeof what, "hd %d, session %d: %s cache", hd, i, kv ? "v" : "k");
        gt_close(what, g + at, want + at, (size_t)ss[i].kv_len * hd, RTOL, 0);
      }
      free(g);
    }
  }
  o->free(g_dev, dx), o->free(g_dev, dnorm), o->free(g_dev, dw), o->free(g_dev, dtable);
  o->free(g_dev, dpos), o->free(g_dev, dqkv), o->free(g_dev, dout), o->free(g_dev, dentries);
  for (int i = 0; i < count; i++) sess_free(&ss[i]);
  free(x), free(norm), free(w), free(table), free(pos), free(qkv), free(out);
}

static void test_batch_ops(void **state) {
  (void)state;
  vspec_rng rng;
  vs_rng_init(&rng, 1909, 0);
  /* rows n committed base slots */
  static const sess_case mixed[] = {
      {2, 3, 20, 0, 40}, {2, 5, 7, 2, 30}, {1, 1, 33, 0, 64}, {2, 16, 0, 0, 24}};
  static const sess_case ar[] = {{2, 1, 50, 0, 60}, {2, 1, 12, 0, 60}, {2, 1, 1, 0, 60}};
  for (int hd = 16; hd <= 64; hd += 48) {
    batch_case(&rng, hd, mixed, 4);
    batch_case(&rng, hd, ar, 3);
    batch_case(&rng, hd, mixed + 1, 1);
  }
}

int main(void) {
  const char *spec = getenv("VSPEC_TEST_DEVICE");
  g_dev = spec && strcmp(spec, "cpu") == 0 ? gt_cpu() : gt_gpu(VS_PRECISION_FP32);
  g_cpu = gt_cpu();
  if (!vspec_has_batch_ops(vs_dev_ops(g_dev))) {
    fprintf(stderr, "the device has no batch ops\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_batch_ops)};
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  vs_dev_destroy(g_dev);
  vs_dev_destroy(g_cpu);
  return rc;
}
