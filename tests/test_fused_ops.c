/*
 * tests/test_fused_ops.c - the ABI 1.4 fused ops on the CPU (kernels/cpu/cpu_fused.c).
 *
 * - The tree visibility rule (kernels/common/vs_tree_visible.h) is the one of the backends'
 *   byte masks: vs_kv_tree_mask (plugins/backend/kv_tree.h) on random trees with and without
 *   a prefix rule over committed slots, LlamaGen's prefill mask (a chain under the caption
 *   rule), and the rule as ops.h words it where the prefix reaches pending slots.
 * - A transformer layer run with the fused ops gives the same bits as the unfused sequence
 *   the LlamaGen backend issues (lg__run_layers, lg__head, vs_kv_store): the qkv rows, the
 *   KV cache, the attention output, the residual stream, the FFN's hidden rows and the
 *   gathered and normalised head rows, compared with memcmp. Head dims 8, 16 and 64, with and
 *   without GQA, 1 and 2 CFG rows, 1 to 16 nodes, a prefill, trees over a committed sequence,
 *   an appended batch; 1 and 2 threads at every ISA level of this CPU, fp32 and bf16.
 * - Through the counting table each fused op is one op, and a device without fused ops
 *   keeps NULL entries (vspec_has_fused_ops is false for it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "kernels/common/vs_tree_visible.h"
#include "kernels/cpu/cpu_linear_skinny.h"
#include "plugins/backend/kv_tree.h"
#include "tests/support/kernels_testutil.h"

static const int all_isas[] = {VS_ISA_SCALAR, VS_ISA_AVX2, VS_ISA_AVX512};
#define N_ISAS ((int)(sizeof all_isas / sizeof all_isas[0]))

/* A CPU device at `isa` and `precision`; NULL when this CPU cannot run it. */
static vspec_dev *dev_at(int threads, int isa, int precision) {
  vs_device_options opt = {.threads = threads, .precision = precision};
  char err[VSPEC_ERRLEN] = "";
  vspec_dev *dev = NULL;
  if (vs_device_open("cpu", &opt, &dev, err, sizeof err) != VSPEC_OK) return NULL;
  if (vs_cpu_set_isa(dev, isa) != VSPEC_OK ||
      (precision == VS_PRECISION_BF16 && isa < VS_ISA_AVX2 && !dev->amx)) {
    vs_dev_destroy(dev);
    return NULL;
  }
  return dev;
}

static int rand_int(vspec_rng *rng, int n) { return (int)(vs_rng_next_u32(rng) % (uint32_t)n); }

/* Parents of `count` pending nodes: an earlier node or -1, and depths from them. */
static void random_tree(vspec_rng *rng, int count, int32_t *parents, int32_t *depth) {
  for (int j = 0; j < count; j++) {
    parents[j] = rand_int(rng, j + 1) - 1;
    depth[j] = parents[j] < 0 ? 0 : depth[parents[j]] + 1;
  }
}

/* ---- the visibility rule ---------------------------------------------------------------- */

/* vspec_kv_tree_view's rule word for word (include/vspec/ops.h). */
static int ref_visible(const vspec_kv_tree_view *t, int i, int s) {
  int L = t->lens[0], base = t->lens[1], self = L + base + i, seen = s < L;
  for (int a = base + i; !seen && a >= 0; a = t->parents[a]) seen = s - L == a;
  return seen && (s >= t->n_prefix || t->prefix[s] || s == self);
}

static void check_rule(vspec_rng *rng, int committed, int base, int n, int n_prefix) {
  int32_t parents[64], depth[64];
  uint8_t prefix[128], row[128], want[64 * 128];
  random_tree(rng, base + n, parents, depth);
  for (int s = 0; s < n_prefix; s++) prefix[s] = (uint8_t)(rand_int(rng, 3) != 0);
  int32_t lens[2] = {committed, base};
  vspec_kv_tree_view t = {.n = n, .n_prefix = n_prefix, .lens = lens, .parents = parents,
                          .prefix = n_prefix ? prefix : NULL};
  int kv = vs_tree_kv_len(&t);
  if (n_prefix <= committed) { /* the backends' mask covers the prefix of committed slots */
    vs_kv_tree tree = {.committed = committed, .parents = parents};
    vs_kv_tree_mask(&tree, base, n, n_prefix ? prefix : NULL, n_prefix, want);
  } else {
    for (int i = 0; i < n; i++)
      for (int s = 0; s < kv; s++) want[(size_t)i * kv + s] = (uint8_t)ref_visible(&t, i, s);
  }
  for (int i = 0; i < n; i++) {
    memset(row, 0xee, sizeof row);
    vs_tree_mask_row(&t, i, row);
    if (memcmp(row, want + (size_t)i * kv, (size_t)kv) != 0)
      fail_msg("mask row %d differs (committed %d base %d n %d n_prefix %d)", i, committed, base,
               n, n_prefix);
    assert_int_equal(row[kv], 0xee); /* nothing written past the row */
  }
}

static void test_tree_mask_rule(void **state) {
  (void)state;
  vspec_rng rng;
  vs_rng_init(&rng, 2901, 0);
  for (int trial = 0; trial < 400; trial++) {
    int committed = rand_int(&rng, 20), base = rand_int(&rng, 12), n = 1 + rand_int(&rng, 40);
    check_rule(&rng, committed, base, n, 0);
    check_rule(&rng, committed, base, n, committed ? 1 + rand_int(&rng, committed) : 0);
    /* a prefix rule reaching pending slots: only the ABI's own words say what it does */
    check_rule(&rng, committed, base, n, committed + base + 1 + rand_int(&rng, n));
  }
  /* LlamaGen's prefill (lg_prefill): causal, caption columns by validity, the diagonal on */
  for (int T = 1; T <= 40; T++) {
    int32_t chain[40];
    uint8_t valid[40], row[40];
    for (int i = 0; i < T; i++) {
      chain[i] = i - 1;
      valid[i] = (uint8_t)(rand_int(&rng, 4) != 0);
    }
    int32_t lens[2] = {0, 0};
    vspec_kv_tree_view t = {.n = T, .n_prefix = T, .lens = lens, .parents = chain,
                            .prefix = valid};
    for (int i = 0; i < T; i++) {
      vs_tree_mask_row(&t, i, row);
      for (int j = 0; j < T; j++)
        assert_int_equal(row[j], (uint8_t)(j <= i && (valid[j] || j == i)));
    }
  }
}

/* ---- one layer, fused and unfused ----------------------------------------------------- */

enum { SC_PREFILL, SC_TREE, SC_COMMITTED, SC_APPEND, SC_COUNT };
static const char *const sc_names[] = {"prefill", "tree", "tree after commit", "appended batch"};

typedef struct layer {
  int hd, H, Hkv, rows, n, dim, hidden, qkv_w, slots, m, n_head_rows;
  vspec_kv_tree_view view;
  int32_t lens[2];  /* the view's committed and base */
  int32_t *slot_of; /* the cache slot of each node */
  /* inputs */
  float *x, *attn_norm, *wqkv, *table, *wo, *resid, *ffn_norm, *w1, *w3, *out_norm;
  float *k0, *v0; /* the cache before the layer: the committed and earlier pending slots */
  int32_t *pos, *parents, *idx;
  uint8_t *prefix, *mask; /* mask: the unfused path's byte mask, as the backend builds it */
} layer;

/* What a layer leaves: compared byte for byte. */
typedef struct result {
  float *qkv, *k, *v, *att, *resid, *ff, *rows, *head;
} result;

#define LAYER_DIM 72
#define LAYER_HIDDEN 88
/* wide enough that the products split over the device's threads (cpu_linear_skinny.c) */
#define WIDE_DIM 384
#define WIDE_HIDDEN 512
#define ROPE_COND 4
#define ROPE_GRID 8

static float *dev_floats(const vspec_ops *ops, vspec_dev *dev, vspec_rng *rng, size_t n,
                         float lo, float hi) {
  float *p = ops->alloc(dev, n * sizeof(float));
  assert_non_null(p);
  if (rng) vt_fill(rng, p, n, lo, hi);
  return p;
}

/* The tree of a scenario, its positions (committed + depth; a prefill's are 0..n-1) and the
 * byte mask the backend builds for it (lg_prefill's, or vs_kv_tree_mask). */
static void layer_tree(layer *l, vspec_rng *rng, int scenario) {
  int n = l->n, committed = scenario >= SC_COMMITTED ? 7 : 0, base = scenario == SC_APPEND ? 3 : 0;
  /* the caption rule: over the whole prefill, over part of the committed slots later */
  int n_prefix = scenario == SC_PREFILL ? n : scenario == SC_TREE ? 0 : 5;
  int32_t depth[64];
  l->parents = vt_malloc((size_t)(base + n) * sizeof(int32_t));
  l->prefix = vt_malloc((size_t)(n_prefix ? n_prefix : 1));
  if (scenario == SC_PREFILL) {
    for (int j = 0; j < n; j++) {
      l->parents[j] = j - 1;
      depth[j] = j;
    }
  } else {
    random_tree(rng, base + n, l->parents, depth);
  }
  for (int s = 0; s < n_prefix; s++) l->prefix[s] = (uint8_t)(s != 2 && rand_int(rng, 4) != 0);
  l->lens[0] = committed, l->lens[1] = base;
  l->view = (vspec_kv_tree_view){.n = n, .n_prefix = n_prefix, .lens = l->lens,
                                 .parents = l->parents, .prefix = n_prefix ? l->prefix : NULL};
  l->slot_of = vt_malloc((size_t)n * sizeof(int32_t));
  for (int j = 0; j < n; j++) l->slot_of[j] = committed + base + j;
  int kv = vs_tree_kv_len(&l->view);
  l->slots = kv + 3; /* slots past the forward's: must stay as they were */
  l->mask = vt_malloc((size_t)n * kv);
  if (scenario == SC_PREFILL) {
    for (int i = 0; i < n; i++)
      for (int j = 0; j < kv; j++)
        l->mask[(size_t)i * kv + j] = (uint8_t)(j <= i && (l->prefix[j] || j == i));
  } else {
    vs_kv_tree tree = {.committed = committed, .parents = l->parents};
    vs_kv_tree_mask(&tree, base, n, n_prefix ? l->prefix : NULL, n_prefix, l->mask);
  }
  l->pos = vt_malloc((size_t)l->rows * n * sizeof(int32_t));
  for (int r = 0; r < l->rows; r++)
    for (int i = 0; i < n; i++)
      l->pos[r * n + i] = scenario == SC_PREFILL ? i : committed + depth[base + i];
}

static void layer_init(layer *l, const vspec_ops *ops, vspec_dev *dev, vspec_rng *rng, int hd,
                       int H, int Hkv, int rows, int n, int scenario, int wide) {
  memset(l, 0, sizeof *l);
  l->hd = hd, l->H = H, l->Hkv = Hkv, l->rows = rows, l->n = n;
  l->dim = wide ? WIDE_DIM : LAYER_DIM, l->hidden = wide ? WIDE_HIDDEN : LAYER_HIDDEN;
  l->qkv_w = (H + 2 * Hkv) * hd, l->m = rows * n;
  layer_tree(l, rng, scenario);
  size_t m = (size_t)l->m, d = (size_t)l->dim, cache = (size_t)rows * Hkv * l->slots * hd;
  l->x = dev_floats(ops, dev, rng, m * d, -2.0f, 2.0f);
  l->attn_norm = dev_floats(ops, dev, rng, d, 0.5f, 1.5f);
  l->wqkv = dev_floats(ops, dev, rng, (size_t)l->qkv_w * d, -0.3f, 0.3f);
  l->wo = dev_floats(ops, dev, rng, d * H * hd, -0.3f, 0.3f);
  l->resid = dev_floats(ops, dev, rng, m * d, -1.0f, 1.0f);
  l->ffn_norm = dev_floats(ops, dev, rng, d, 0.5f, 1.5f);
  l->w1 = dev_floats(ops, dev, rng, (size_t)l->hidden * d, -0.3f, 0.3f);
  l->w3 = dev_floats(ops, dev, rng, (size_t)l->hidden * d, -0.3f, 0.3f);
  l->out_norm = dev_floats(ops, dev, rng, d, 0.5f, 1.5f);
  l->k0 = dev_floats(ops, dev, rng, cache, -1.0f, 1.0f);
  l->v0 = dev_floats(ops, dev, rng, cache, -1.0f, 1.0f);
  size_t table = (size_t)(ROPE_COND + ROPE_GRID * ROPE_GRID) * hd;
  l->table = dev_floats(ops, dev, NULL, table, 0, 0);
  float *host = vt_malloc(table * sizeof(float));
  ops->rope2d_table(ROPE_COND, ROPE_GRID, hd, 10000.0f, host);
  ops->upload(dev, l->table, host, table * sizeof(float));
  free(host);
  /* head rows as lg__head picks them: some nodes of each CFG row, repeats allowed */
  l->n_head_rows = 1 + rand_int(rng, l->m);
  l->idx = vt_malloc((size_t)l->n_head_rows * sizeof(int32_t));
  for (int i = 0; i < l->n_head_rows; i++) l->idx[i] = rand_int(rng, l->m);
}

static void layer_free(layer *l, const vspec_ops *ops, vspec_dev *dev) {
  float *bufs[] = {l->x,  l->attn_norm, l->wqkv, l->wo, l->resid, l->ffn_norm,
                   l->w1, l->w3,        l->out_norm, l->k0, l->v0, l->table};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ops->free(dev, bufs[i]);
  free(l->pos);
  free(l->parents);
  free(l->slot_of);
  free(l->idx);
  free(l->prefix);
  free(l->mask);
}

static void result_init(result *o, const layer *l, const vspec_ops *ops, vspec_dev *dev) {
  size_t m = (size_t)l->m, cache = (size_t)l->rows * l->Hkv * l->slots * l->hd;
  o->qkv = dev_floats(ops, dev, NULL, m * l->qkv_w, 0, 0);
  o->k = dev_floats(ops, dev, NULL, cache, 0, 0);
  o->v = dev_floats(ops, dev, NULL, cache, 0, 0);
  ops->copy(dev, o->k, l->k0, cache * sizeof(float));
  ops->copy(dev, o->v, l->v0, cache * sizeof(float));
  o->att = dev_floats(ops, dev, NULL, m * l->H * l->hd, 0, 0);
  o->resid = dev_floats(ops, dev, NULL, m * l->dim, 0, 0);
  ops->copy(dev, o->resid, l->resid, m * l->dim * sizeof(float));
  o->ff = dev_floats(ops, dev, NULL, m * l->hidden, 0, 0);
  o->rows = dev_floats(ops, dev, NULL, (size_t)l->n_head_rows * l->dim, 0, 0);
  o->head = dev_floats(ops, dev, NULL, (size_t)l->n_head_rows * l->dim, 0, 0);
}

static void result_free(result *o, const vspec_ops *ops, vspec_dev *dev) {
  float *bufs[] = {o->qkv, o->k, o->v, o->att, o->resid, o->ff, o->rows, o->head};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ops->free(dev, bufs[i]);
}

/* The LlamaGen backend's sequence today (lg__run_layers, vs_kv_store, lg__head) with the
 * layer's weights; h and up are its work buffers. */
static void run_unfused(const layer *l, const vspec_ops *ops, vspec_dev *dev, result *o) {
  int m = l->m, d = l->dim, hd = l->hd, H = l->H, Hkv = l->Hkv, qkv_w = l->qkv_w;
  float eps = 1e-5f;
  float *h = dev_floats(ops, dev, NULL, (size_t)m * (d > l->hidden ? d : l->hidden), 0, 0);
  float *up = dev_floats(ops, dev, NULL, (size_t)m * l->hidden, 0, 0);
  ops->rmsnorm(dev, l->x, l->attn_norm, m, d, eps, h);
  ops->linear(dev, h, m, d, l->wqkv, qkv_w, NULL, o->qkv);
  ops->rope_apply(dev, o->qkv, m, qkv_w, H, hd, l->pos, l->table);
  ops->rope_apply(dev, o->qkv + (size_t)H * hd, m, qkv_w, Hkv, hd, l->pos, l->table);
  vs_kv_tree kv = {.ops = ops, .dev = dev, .layers = 1, .rows = l->rows, .kv_heads = Hkv,
                   .head_dim = hd, .slots = l->slots, .k = o->k, .v = o->v};
  int first = l->lens[0] + l->lens[1], n = l->n;
  vs_kv_store(&kv, 0, n, first, o->qkv, qkv_w, H * hd, (H + Hkv) * hd);
  for (int r = 0; r < l->rows; r++)
    ops->attention(dev, o->qkv + (size_t)r * n * qkv_w, n, qkv_w, H, Hkv, hd,
                   vs_kv_at(&kv, kv.k, 0, r, 0), vs_kv_at(&kv, kv.v, 0, r, 0), l->slots,
                   first + n, l->mask, o->att + (size_t)r * n * H * hd);
  ops->linear(dev, o->att, m, H * hd, l->wo, d, NULL, h);
  ops->add(dev, o->resid, h, (size_t)m * d);
  ops->rmsnorm(dev, o->resid, l->ffn_norm, m, d, eps, h);
  ops->linear(dev, h, m, d, l->w1, l->hidden, NULL, o->ff);
  ops->linear(dev, h, m, d, l->w3, l->hidden, NULL, up);
  ops->swiglu(dev, o->ff, up, (size_t)m * l->hidden, o->ff);
  size_t row = (size_t)d * sizeof(float);
  for (int i = 0; i < l->n_head_rows; i++) /* embedding-style gather, then lg__head's */
    ops->copy(dev, o->rows + (size_t)i * d, l->x + (size_t)l->idx[i] * d, row);
  for (int i = 0; i < l->n_head_rows; i++)
    ops->copy(dev, o->head + (size_t)i * d, o->resid + (size_t)l->idx[i] * d, row);
  ops->rmsnorm(dev, o->head, l->out_norm, l->n_head_rows, d, eps, o->head);
  ops->free(dev, h);
  ops->free(dev, up);
}

/* Runs `call` and checks it was one op of the counting table, with no transfer. */
#define ONE_OP(dev, call)                                                   \
  do {                                                                      \
    vs_dev_counters c0_, c1_;                                               \
    vs_dev_counters_get(dev, &c0_);                                         \
    call;                                                                   \
    vs_dev_counters_get(dev, &c1_);                                         \
    vs_dev_counters_sub(&c1_, &c0_);                                        \
    if (c1_.ops != 1 || c1_.uploads || c1_.downloads || c1_.syncs)          \
      fail_msg("%s counted %d ops", #call, (int)c1_.ops);                   \
  } while (0)

static void run_fused(const layer *l, const vspec_ops *ops, vspec_dev *dev, result *o) {
  float eps = 1e-5f;
  vspec_kv_cache kv = {.k = o->k, .v = o->v, .rows = l->rows, .n_heads = l->H,
                       .kv_heads = l->Hkv, .head_dim = l->hd, .slots = l->slots};
  ONE_OP(dev, ops->norm_qkv_rope(dev, l->x, l->n, l->dim, l->attn_norm, eps, l->wqkv, l->pos,
                                 l->table, &kv, l->slot_of, o->qkv));
  ONE_OP(dev, ops->tree_attention(dev, o->qkv, &kv, &l->view, o->att));
  ONE_OP(dev, ops->linear_add(dev, o->att, l->m, l->H * l->hd, l->wo, l->dim, o->resid));
  ONE_OP(dev, ops->norm_swiglu(dev, o->resid, l->m, l->dim, l->ffn_norm, eps, l->w1, l->w3,
                               l->hidden, o->ff));
  ONE_OP(dev, ops->gather_rows(dev, l->x, l->idx, l->n_head_rows, l->dim, o->rows));
  ONE_OP(dev, ops->rmsnorm_rows(dev, o->resid, l->idx, l->n_head_rows, l->dim, l->out_norm, eps,
                                o->head));
}

static void compare(const result *a, const result *b, const layer *l, const char *where) {
  size_t m = (size_t)l->m, cache = (size_t)l->rows * l->Hkv * l->slots * l->hd;
  struct {
    const char *name;
    const float *x, *y;
    size_t n;
  } parts[] = {
      {"qkv", a->qkv, b->qkv, m * l->qkv_w},
      {"k cache", a->k, b->k, cache},
      {"v cache", a->v, b->v, cache},
      {"attention", a->att, b->att, m * l->H * l->hd},
      {"residual (linear_add)", a->resid, b->resid, m * l->dim},
      {"norm_swiglu", a->ff, b->ff, m * l->hidden},
      {"gather_rows", a->rows, b->rows, (size_t)l->n_head_rows * l->dim},
      {"rmsnorm_rows", a->head, b->head, (size_t)l->n_head_rows * l->dim},
  };
  for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++) {
    if (memcmp(parts[p].x, parts[p].y, parts[p].n * sizeof(float)) == 0) continue;
    size_t i = 0;
    while (i < parts[p].n && memcmp(&parts[p].x[i], &parts[p].y[i], sizeof(float)) == 0) i++;
    fail_msg("%s: %s differs at %zu: fused %.9g unfused %.9g", where, parts[p].name, i,
             (double)parts[p].x[i], (double)parts[p].y[i]);
  }
}

/* One layer of the shape, fused and unfused; fails where they differ. */
static void check_layer(vspec_dev *dev, vspec_rng *rng, const char *name, int hd, int H,
                        int Hkv, int rows, int n, int sc, int wide) {
  const vspec_ops *ops = vs_dev_ops(dev);
  layer l;
  layer_init(&l, ops, dev, rng, hd, H, Hkv, rows, n, sc, wide);
  result fused, unfused;
  result_init(&fused, &l, ops, dev);
  result_init(&unfused, &l, ops, dev);
  run_unfused(&l, ops, dev, &unfused);
  run_fused(&l, ops, dev, &fused);
  char where[200];
  snprintf(where, sizeof where, "%s, dim %d, head_dim %d, H %d/%d, %d rows, %d nodes, %s", name,
           l.dim, hd, H, Hkv, rows, n, sc_names[sc]);
  compare(&fused, &unfused, &l, where);
  result_free(&fused, ops, dev);
  result_free(&unfused, ops, dev);
  layer_free(&l, ops, dev);
}

/* Every shape and scenario on one device; returns the layers compared. */
static int check_device(vspec_dev *dev, const char *name, uint64_t seed) {
  static const int hds[] = {8, 16, 64}, ns[] = {1, 2, 5, 16};
  static const int heads[][2] = {{2, 2}, {4, 2}, {3, 3}, {2, 1}}; /* (H, Hkv) */
  assert_true(vspec_has_fused_ops(vs_dev_ops(dev)));
  vspec_rng rng;
  vs_rng_init(&rng, seed, 0);
  int done = 0;
  for (size_t a = 0; a < sizeof hds / sizeof hds[0]; a++)
    for (size_t b = 0; b < sizeof heads / sizeof heads[0]; b++)
      for (int rows = 1; rows <= 2; rows++)
        for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++)
          for (int sc = 0; sc < SC_COUNT; sc++, done++)
            check_layer(dev, &rng, name, hds[a], heads[b][0], heads[b][1], rows, ns[c], sc, 0);
  for (int sc = 0; sc < SC_COUNT; sc++, done += 2) {
    check_layer(dev, &rng, name, 64, 4, 2, 2, 16, sc, 1);
    check_layer(dev, &rng, name, 64, 6, 6, 1, 5, sc, 1);
  }
  return done;
}

/* Each level again with BLIS for more than 4 rows; the scalar level does that anyway, and the
 * sanitizer build, three times slower, leaves the repeat out. */
#ifdef VSPEC_SANITIZED
#define BLIS_PASS 0
#else
#define BLIS_PASS 1
#endif

static void check_precision(int precision, const char *pname) {
  int devices = 0;
  for (int s = 0; s < N_ISAS; s++)
    for (int threads = 1; threads <= 2; threads++) {
      vspec_dev *dev = dev_at(threads, all_isas[s], precision);
      if (!dev) {
        print_message("  %s %s: not supported here, skipped\n", pname,
                      vs_isa_name(all_isas[s]));
        break;
      }
      char name[64];
      snprintf(name, sizeof name, "%s %s, %d thread%s", pname, vs_isa_name(all_isas[s]),
               threads, threads > 1 ? "s" : "");
      int layers = check_device(dev, name, 29000 + 10 * (uint64_t)s + (uint64_t)threads);
      print_message("  %s: %d layers identical\n", name, layers);
      devices++;
      /* a smaller skinny threshold sends the larger products through BLIS too */
      if (BLIS_PASS && dev->skinny_max_m > 4) {
        dev->skinny_max_m = 4;
        check_device(dev, name, 29100 + (uint64_t)s);
      }
      vs_dev_destroy(dev);
    }
  if (precision == VS_PRECISION_FP32) assert_true(devices >= 2);
}

static void test_fused_layer_fp32(void **state) {
  (void)state;
  check_precision(VS_PRECISION_FP32, "fp32");
}

static void test_fused_layer_bf16(void **state) {
  (void)state;
  check_precision(VS_PRECISION_BF16, "bf16");
}

/* ---- the counting table ---------------------------------------------------------------- */

/* A device class whose table lacks the fused ops (a GPU before its kernels): the counting
 * copy must lack them too, or vspec_has_fused_ops would send a backend through NULL. */
static void test_counting_keeps_null(void **state) {
  (void)state;
  static vspec_ops partial;
  static vs_device_class cls;
  partial = *vs_cpu_ops();
  partial.gather_rows = NULL;
  partial.rmsnorm_rows = NULL;
  partial.linear_add = NULL;
  partial.norm_swiglu = NULL;
  partial.norm_qkv_rope = NULL;
  partial.tree_attention = NULL;
  cls = *vs_cpu_device_class();
  cls.ops = &partial;
  const vspec_ops *counted = vs__counted_ops(&cls);
  assert_ptr_not_equal(counted, &partial);
  assert_null(counted->gather_rows);
  assert_null(counted->rmsnorm_rows);
  assert_null(counted->linear_add);
  assert_null(counted->norm_swiglu);
  assert_null(counted->norm_qkv_rope);
  assert_null(counted->tree_attention);
  assert_false(vspec_has_fused_ops(counted));
  assert_ptr_not_equal(counted->linear, partial.linear); /* the rest still counts */

  vspec_dev *dev = vt_dev(1);
  const vspec_ops *own = vs_cpu_ops(), *ops = vs_dev_ops(dev);
  assert_true(vspec_has_fused_ops(own));
  assert_true(vspec_has_fused_ops(ops));
  assert_ptr_not_equal(ops->tree_attention, own->tree_attention);
  assert_ptr_not_equal(ops->norm_qkv_rope, own->norm_qkv_rope);
  vs_dev_destroy(dev);
}

/* Slots that do not follow one another (a captured graph's padding, or any caller): each
 * node's keys and values land in its own slot, the same numbers as with consecutive slots
 * (whose copies the layer tests compare with the unfused stores). */
static void test_scattered_slots(void **state) {
  (void)state;
  enum { ROWS = 2, N = 5, H = 2, HKV = 1, HD = 8, DIM = 16, SLOTS = 12 };
  int qkv_w = (H + 2 * HKV) * HD;
  vspec_rng rng;
  vs_rng_init(&rng, 2903, 0);
  vspec_dev *dev = vt_dev(1);
  const vspec_ops *ops = vs_dev_ops(dev);
  size_t cache = (size_t)ROWS * HKV * SLOTS * HD;
  float *x = dev_floats(ops, dev, &rng, (size_t)ROWS * N * DIM, -1, 1);
  float *nw = dev_floats(ops, dev, &rng, DIM, 0.5f, 1.5f);
  float *w = dev_floats(ops, dev, &rng, (size_t)qkv_w * DIM, -0.3f, 0.3f);
  float *table = ops->alloc(dev, (size_t)(1 + ROPE_GRID * ROPE_GRID) * HD * sizeof(float));
  ops->rope2d_table(1, ROPE_GRID, HD, 10000.0f, table);
  float *qkv = dev_floats(ops, dev, NULL, (size_t)ROWS * N * qkv_w, 0, 0);
  float *k[2], *v[2];
  for (int c = 0; c < 2; c++) {
    k[c] = dev_floats(ops, dev, NULL, cache, 0, 0);
    v[c] = dev_floats(ops, dev, NULL, cache, 0, 0);
  }
  int32_t pos[ROWS * N], run[N], scattered[N] = {9, 2, 11, 0, 5};
  for (int i = 0; i < ROWS * N; i++) pos[i] = 1 + i % N;
  for (int j = 0; j < N; j++) run[j] = 3 + j;
  const int32_t *slots[2] = {run, scattered};
  for (int c = 0; c < 2; c++) {
    vspec_kv_cache kv = {.k = k[c], .v = v[c], .rows = ROWS, .n_heads = H, .kv_heads = HKV,
                         .head_dim = HD, .slots = SLOTS};
    ops->norm_qkv_rope(dev, x, N, DIM, nw, 1e-5f, w, pos, table, &kv, slots[c], qkv);
  }
  for (int r = 0; r < ROWS; r++)
    for (int j = 0; j < N; j++) {
      size_t a = ((size_t)r * SLOTS + run[j]) * HD, b = ((size_t)r * SLOTS + scattered[j]) * HD;
      assert_memory_equal(k[0] + a, k[1] + b, HD * sizeof(float));
      assert_memory_equal(v[0] + a, v[1] + b, HD * sizeof(float));
    }
  float *bufs[] = {x, nw, w, table, qkv, k[0], k[1], v[0], v[1]};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ops->free(dev, bufs[i]);
  vs_dev_destroy(dev);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tree_mask_rule),
      cmocka_unit_test(test_fused_layer_fp32),
      cmocka_unit_test(test_fused_layer_bf16),
      cmocka_unit_test(test_counting_keeps_null),
      cmocka_unit_test(test_scattered_slots),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
