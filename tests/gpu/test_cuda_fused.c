/* tests/gpu/test_cuda_fused.c - the CUDA device's ABI 1.4 fused ops (kernels/cuda/cuda_fused.cu)
 * against the CPU's unfused sequence each one stands for (include/vspec/ops.h), on random
 * inputs and shapes: head_dim 64 and 16, grouped and plain kv heads, 1 and 2 CFG rows, 1 to 64
 * nodes, random trees over committed slots, a chain prefill whose caption rule hides slots.
 *
 * fp32: within 1e-5 of the CPU (relative to the largest magnitude; summation order is all
 * that differs). bf16: within 1e-5 of the GPU's own unfused ops at bf16 (the same kernels and
 * roundings: fusing must not change the numbers) and within 2e-2 of the CPU at fp32 (bf16
 * weights). Every fused call must make no upload, download or wait (kernels/vs_device.h
 * counters): the arrays it reads are already on the device. Also the few-row bf16 linear
 * kernel at 1..8 rows and odd sizes against a double emulation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/common/vs_math.h"
#include "kernels/common/vs_tree_visible.h"
#include "tests/gpu/gpu_testutil.h"

#define RTOL 1e-5
#define RTOL_BF16_CPU 2e-2

static vspec_dev *g_gpu, *g_gpu_bf16, *g_cpu;

static int setup(void **state) {
  g_gpu = gt_gpu(VS_PRECISION_FP32);
  g_gpu_bf16 = gt_gpu(VS_PRECISION_BF16);
  g_cpu = gt_cpu();
  /* scratch grown once here, so that no fused call below grows it (a grow waits) */
  for (int i = 0; i < 2; i++) {
    vspec_dev *g = i ? g_gpu_bf16 : g_gpu;
    if (vs_dev_ops(g)->reserve_scratch(g, 16u << 20) != VSPEC_OK) {
      fprintf(stderr, "cannot reserve 16 MiB of scratch\n");
      return -1;
    }
    if (!vspec_has_fused_ops(vs_dev_ops(g))) {
      fprintf(stderr, "the CUDA device has no fused ops\n");
      return -1;
    }
  }
  return 0;
}

static int teardown(void **state) {
  vs_dev_destroy(g_gpu);
  vs_dev_destroy(g_gpu_bf16);
  vs_dev_destroy(g_cpu);
  return 0;
}

#define CPU (vs_dev_ops(g_cpu))

static void *up_bytes(vspec_dev *dev, const void *host, size_t bytes) {
  const vspec_ops *o = vs_dev_ops(dev);
  void *d = o->alloc(dev, bytes ? bytes : 1);
  if (!d || o->upload(dev, d, host, bytes)) abort();
  return d;
}

/* ---- counting: a fused call may not move data or wait ------------------------------------ */

static vs_dev_counters g_before;

static void count_start(vspec_dev *dev) { vs_dev_counters_get(dev, &g_before); }

static void count_check(vspec_dev *dev, const char *what) {
  vs_dev_counters now;
  vs_dev_counters_get(dev, &now);
  vs_dev_counters_sub(&now, &g_before);
  if (now.uploads || now.downloads || now.syncs)
    fail_msg("%s: %llu uploads, %llu downloads, %llu waits (want none)", what,
             (unsigned long long)now.uploads, (unsigned long long)now.downloads,
             (unsigned long long)now.syncs);
}

/* The precisions each op runs at: fp32 against the CPU, bf16 against the GPU's unfused ops. */
static vspec_dev *gpu_at(int bf16) { return bf16 ? g_gpu_bf16 : g_gpu; }

/* Checks a bf16 result against the GPU's unfused bf16 result and the CPU's fp32 one, or an
 * fp32 result against the CPU's. On the few-row path (m rows, at most 8) the fused op must
 * give the unfused ops' bits: the product there normalises its rows as the norm kernel does
 * and computes each row alike, whatever else it fuses. */
static void check(const char *what, int bf16, int m, const float *got, const float *gpu_unfused,
                  const float *cpu, size_t n) {
  char label[160];
  if (bf16) {
    snprintf(label, sizeof label, "%s (bf16 vs unfused bf16)", what);
    gt_close(label, got, gpu_unfused, n, m <= 8 ? 0.0 : RTOL, 0);
    snprintf(label, sizeof label, "%s (bf16 vs cpu fp32)", what);
    gt_close(label, got, cpu, n, RTOL_BF16_CPU, 0);
  } else {
    snprintf(label, sizeof label, "%s (fp32)", what);
    gt_close(label, got, cpu, n, RTOL, 0);
  }
}

/* ---- gather_rows, rmsnorm_rows ------------------------------------------------------------ */

static void test_gather_rmsnorm_rows(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 21, 0);
  int src_rows = 37, dim = 333, n = 16;
  size_t ns = (size_t)src_rows * dim, nd = (size_t)n * dim;
  float *src = gt_host(ns), *w = gt_host((size_t)dim), *g = gt_host(nd), *y = gt_host(nd);
  gt_fill(&rng, src, ns, -2, 2);
  gt_fill(&rng, w, (size_t)dim, 0.5f, 1.5f);
  int32_t idx[16];
  for (int i = 0; i < n; i++) idx[i] = (int32_t)(vs_rng_uniform(&rng) * src_rows); /* repeats */
  idx[0] = src_rows - 1;
  /* the unfused sequence: a copy per row, then rmsnorm */
  for (int i = 0; i < n; i++)
    CPU->copy(g_cpu, g + (size_t)i * dim, src + (size_t)idx[i] * dim, (size_t)dim * sizeof(float));
  CPU->rmsnorm(g_cpu, g, w, n, dim, 1e-5f, y);
  const vspec_ops *o = vs_dev_ops(g_gpu);
  float *dsrc = gt_up(g_gpu, src, ns), *dw = gt_up(g_gpu, w, (size_t)dim);
  int32_t *didx = up_bytes(g_gpu, idx, sizeof idx);
  float *dg = (float *)o->alloc(g_gpu, nd * sizeof(float));
  float *dy = (float *)o->alloc(g_gpu, nd * sizeof(float));
  count_start(g_gpu);
  o->gather_rows(g_gpu, dsrc, didx, n, dim, dg);
  o->rmsnorm_rows(g_gpu, dsrc, didx, n, dim, dw, 1e-5f, dy);
  count_check(g_gpu, "gather_rows, rmsnorm_rows");
  float *got = gt_down(g_gpu, dg, nd);
  assert_memory_equal(got, g, nd * sizeof(float));
  free(got);
  got = gt_down(g_gpu, dy, nd);
  gt_close("rmsnorm_rows", got, y, nd, RTOL, 0);
  free(got);
  o->free(g_gpu, dsrc), o->free(g_gpu, dw), o->free(g_gpu, didx), o->free(g_gpu, dg);
  o->free(g_gpu, dy);
  free(src), free(w), free(g), free(y);
}

/* ---- linear_add ------------------------------------------------------------------------------ */

static void linear_add_case(vspec_rng *rng, int bf16, int m, int n_in, int n_out) {
  vspec_dev *gpu = gpu_at(bf16);
  const vspec_ops *o = vs_dev_ops(gpu);
  size_t nx = (size_t)m * n_in, nw = (size_t)n_out * n_in, ny = (size_t)m * n_out;
  float *x = gt_host(nx), *w = gt_host(nw), *y = gt_host(ny), *t = gt_host(ny);
  gt_fill(rng, x, nx, -2, 2);
  gt_fill(rng, w, nw, -0.5f, 0.5f);
  gt_fill(rng, y, ny, -3, 3);
  float *dx = gt_up(gpu, x, nx), *dw = gt_up(gpu, w, nw), *dy = gt_up(gpu, y, ny);
  float *ref = NULL;
  if (bf16) { /* the GPU's unfused pair, which also makes the weight's bf16 copy */
    float *dr = gt_up(gpu, y, ny), *dt = (float *)o->alloc(gpu, ny * sizeof(float));
    o->linear(gpu, dx, m, n_in, dw, n_out, NULL, dt);
    o->add(gpu, dr, dt, ny);
    ref = gt_down(gpu, dr, ny);
    o->free(gpu, dr), o->free(gpu, dt);
  }
  CPU->linear(g_cpu, x, m, n_in, w, n_out, NULL, t);
  CPU->add(g_cpu, y, t, ny);
  count_start(gpu);
  o->linear_add(gpu, dx, m, n_in, dw, n_out, dy);
  count_check(gpu, "linear_add");
  float *got = gt_down(gpu, dy, ny);
  char what[96];
  snprintf(what, sizeof what, "linear_add m=%d %dx%d", m, n_in, n_out);
  check(what, bf16, m, got, ref, y, ny);
  o->free(gpu, dx), o->free(gpu, dw), o->free(gpu, dy);
  free(x), free(w), free(y), free(t), free(got), free(ref);
}

static void test_linear_add(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 22, 0);
  static const int ms[] = {1, 2, 3, 8, 9, 32};
  for (int bf16 = 0; bf16 < 2; bf16++)
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
      linear_add_case(&rng, bf16, ms[i], 256, 300); /* 16-byte loads */
      linear_add_case(&rng, bf16, ms[i], 97, 75);   /* odd: one weight at a time */
    }
}

/* ---- norm_swiglu ------------------------------------------------------------------------------ */

/* The unfused sequence on `dev` (host or device pointers as dev wants): rmsnorm, w1, w3,
 * swiglu, with h, g, u work rows. */
static void swiglu_unfused(vspec_dev *dev, const float *x, int m, int dim, const float *nw,
                           const float *w1, const float *w3, int hidden, float *h, float *g,
                           float *u, float *y) {
  const vspec_ops *o = vs_dev_ops(dev);
  o->rmsnorm(dev, x, nw, m, dim, 1e-5f, h);
  o->linear(dev, h, m, dim, w1, hidden, NULL, g);
  o->linear(dev, h, m, dim, w3, hidden, NULL, u);
  o->swiglu(dev, g, u, (size_t)m * hidden, y);
}

static void norm_swiglu_case(vspec_rng *rng, int bf16, int m, int dim, int hidden) {
  vspec_dev *gpu = gpu_at(bf16);
  const vspec_ops *o = vs_dev_ops(gpu);
  size_t nx = (size_t)m * dim, nw = (size_t)hidden * dim, ny = (size_t)m * hidden;
  float *x = gt_host(nx), *nrm = gt_host((size_t)dim), *w1 = gt_host(nw), *w3 = gt_host(nw);
  float *h = gt_host(nx), *g = gt_host(ny), *u = gt_host(ny), *y = gt_host(ny);
  gt_fill(rng, x, nx, -2, 2);
  gt_fill(rng, nrm, (size_t)dim, 0.5f, 1.5f);
  gt_fill(rng, w1, nw, -0.3f, 0.3f);
  gt_fill(rng, w3, nw, -0.3f, 0.3f);
  float *dx = gt_up(gpu, x, nx), *dn = gt_up(gpu, nrm, (size_t)dim);
  float *dw1 = gt_up(gpu, w1, nw), *dw3 = gt_up(gpu, w3, nw);
  float *dy = (float *)o->alloc(gpu, ny * sizeof(float)), *ref = NULL;
  if (bf16) {
    float *dh = (float *)o->alloc(gpu, nx * sizeof(float));
    float *dg = (float *)o->alloc(gpu, ny * sizeof(float));
    float *du = (float *)o->alloc(gpu, ny * sizeof(float));
    swiglu_unfused(gpu, dx, m, dim, dn, dw1, dw3, hidden, dh, dg, du, dg);
    ref = gt_down(gpu, dg, ny);
    o->free(gpu, dh), o->free(gpu, dg), o->free(gpu, du);
  }
  swiglu_unfused(g_cpu, x, m, dim, nrm, w1, w3, hidden, h, g, u, y);
  count_start(gpu);
  o->norm_swiglu(gpu, dx, m, dim, dn, 1e-5f, dw1, dw3, hidden, dy);
  count_check(gpu, "norm_swiglu");
  float *got = gt_down(gpu, dy, ny);
  char what[96];
  snprintf(what, sizeof what, "norm_swiglu m=%d dim=%d hidden=%d", m, dim, hidden);
  check(what, bf16, m, got, ref, y, ny);
  o->free(gpu, dx), o->free(gpu, dn), o->free(gpu, dw1), o->free(gpu, dw3), o->free(gpu, dy);
  free(x), free(nrm), free(w1), free(w3), free(h), free(g), free(u), free(y), free(got);
  free(ref);
}

static void test_norm_swiglu(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 23, 0);
  static const int ms[] = {1, 2, 5, 8, 9, 32};
  for (int bf16 = 0; bf16 < 2; bf16++)
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
      norm_swiglu_case(&rng, bf16, ms[i], 128, 344);
      norm_swiglu_case(&rng, bf16, ms[i], 60, 37);
    }
}

/* ---- norm_qkv_rope ----------------------------------------------------------------------------- */

typedef struct qkv_case {
  int rows, H, Hkv, hd, n, dim, slots, first;
} qkv_case;

/* The unfused sequence on `dev`: rmsnorm, linear, rope_apply on q and on k (host positions),
 * then per CFG row one copy3d for the keys and one for the values (vs_kv_store's pattern). */
static void qkv_unfused(vspec_dev *dev, const qkv_case *c, const float *x, const float *nw,
                        const float *wqkv, const int32_t *pos_host, const float *table,
                        float *h, float *qkv, float *k, float *v) {
  const vspec_ops *o = vs_dev_ops(dev);
  int m = c->rows * c->n, hd = c->hd, qkv_w = (c->H + 2 * c->Hkv) * hd;
  size_t f = sizeof(float);
  o->rmsnorm(dev, x, nw, m, c->dim, 1e-5f, h);
  o->linear(dev, h, m, c->dim, wqkv, qkv_w, NULL, qkv);
  o->rope_apply(dev, qkv, m, qkv_w, c->H, hd, pos_host, table);
  o->rope_apply(dev, qkv + (size_t)c->H * hd, m, qkv_w, c->Hkv, hd, pos_host, table);
  for (int r = 0; r < c->rows; r++) {
    size_t cache = ((size_t)r * c->Hkv * c->slots + (size_t)c->first) * hd;
    const float *src = qkv + (size_t)r * c->n * qkv_w + (size_t)c->H * hd;
    for (int kvp = 0; kvp < 2; kvp++)
      assert_int_equal(o->copy3d(dev, (kvp ? v : k) + cache, (size_t)c->slots * hd * f, hd * f,
                                 src + (size_t)kvp * c->Hkv * hd, hd * f, qkv_w * f, hd * f,
                                 c->Hkv, c->n),
                       VSPEC_OK);
  }
}

static void norm_qkv_rope_case(vspec_rng *rng, int bf16, const qkv_case *c) {
  vspec_dev *gpu = gpu_at(bf16);
  const vspec_ops *o = vs_dev_ops(gpu);
  int m = c->rows * c->n, qkv_w = (c->H + 2 * c->Hkv) * c->hd, n_cond = 3, grid = 8;
  size_t nx = (size_t)m * c->dim, nw = (size_t)qkv_w * c->dim, nq = (size_t)m * qkv_w;
  size_t nc = (size_t)c->rows * c->Hkv * c->slots * c->hd;
  size_t nt = (size_t)(n_cond + grid * grid) * c->hd;
  float *x = gt_host(nx), *nrm = gt_host((size_t)c->dim), *w = gt_host(nw), *h = gt_host(nx);
  float *qkv = gt_host(nq), *k = gt_host(nc), *v = gt_host(nc), *table = gt_host(nt);
  int32_t *pos = (int32_t *)malloc((size_t)m * sizeof(int32_t));
  gt_fill(rng, x, nx, -2, 2);
  gt_fill(rng, nrm, (size_t)c->dim, 0.5f, 1.5f);
  gt_fill(rng, w, nw, -0.3f, 0.3f);
  gt_fill(rng, k, nc, -1, 1); /* slots the op must leave alone */
  gt_fill(rng, v, nc, -1, 1);
  for (int i = 0; i < m; i++) pos[i] = (int32_t)(vs_rng_uniform(rng) * (n_cond + grid * grid));
  CPU->rope2d_table(n_cond, grid, c->hd, 10000.0f, table);
  float *dx = gt_up(gpu, x, nx), *dn = gt_up(gpu, nrm, (size_t)c->dim), *dw = gt_up(gpu, w, nw);
  float *dtable = gt_up(gpu, table, nt), *dk = gt_up(gpu, k, nc), *dv = gt_up(gpu, v, nc);
  float *dq = (float *)o->alloc(gpu, nq * sizeof(float));
  int32_t *dpos = up_bytes(gpu, pos, (size_t)m * sizeof(int32_t));
  int32_t *slot_of = (int32_t *)malloc((size_t)c->n * sizeof(int32_t));
  for (int j = 0; j < c->n; j++) slot_of[j] = c->first + j;
  int32_t *dslots = up_bytes(gpu, slot_of, (size_t)c->n * sizeof(int32_t));
  free(slot_of);
  float *ref[3] = {NULL, NULL, NULL}; /* qkv, k, v of the GPU's unfused bf16 sequence */
  if (bf16) {
    float *rk = gt_up(gpu, k, nc), *rv = gt_up(gpu, v, nc);
    float *rh = (float *)o->alloc(gpu, nx * sizeof(float));
    float *rq = (float *)o->alloc(gpu, nq * sizeof(float));
    qkv_unfused(gpu, c, dx, dn, dw, pos, dtable, rh, rq, rk, rv);
    ref[0] = gt_down(gpu, rq, nq), ref[1] = gt_down(gpu, rk, nc), ref[2] = gt_down(gpu, rv, nc);
    o->free(gpu, rk), o->free(gpu, rv), o->free(gpu, rh), o->free(gpu, rq);
  }
  qkv_unfused(g_cpu, c, x, nrm, w, pos, table, h, qkv, k, v);
  vspec_kv_cache kv = {.k = dk, .v = dv, .rows = c->rows, .n_heads = c->H,
                       .kv_heads = c->Hkv, .head_dim = c->hd, .slots = c->slots};
  count_start(gpu);
  o->norm_qkv_rope(gpu, dx, c->n, c->dim, dn, 1e-5f, dw, dpos, dtable, &kv, dslots, dq);
  count_check(gpu, "norm_qkv_rope");
  char what[128];
  const char *names[3] = {"qkv", "k cache", "v cache"};
  float *devs[3] = {dq, dk, dv}, *cpus[3] = {qkv, k, v};
  size_t ns[3] = {nq, nc, nc};
  for (int t = 0; t < 3; t++) {
    float *got = gt_down(gpu, devs[t], ns[t]);
    snprintf(what, sizeof what, "norm_qkv_rope %s rows=%d H=%d/%d hd=%d n=%d first=%d", names[t],
             c->rows, c->H, c->Hkv, c->hd, c->n, c->first);
    check(what, bf16, m, got, ref[t], cpus[t], ns[t]);
    free(got), free(ref[t]);
  }
  o->free(gpu, dx), o->free(gpu, dn), o->free(gpu, dw), o->free(gpu, dtable);
  o->free(gpu, dk), o->free(gpu, dv), o->free(gpu, dq), o->free(gpu, dpos), o->free(gpu, dslots);
  free(x), free(nrm), free(w), free(h), free(qkv), free(k), free(v), free(table), free(pos);
}

static void test_norm_qkv_rope(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 24, 0);
  static const qkv_case cases[] = {
      /* rows H Hkv hd  n  dim slots first */
      {1, 2, 2, 64, 1, 64, 8, 0},     {2, 4, 2, 16, 1, 96, 20, 19},
      {2, 4, 2, 16, 2, 96, 20, 7},    {2, 4, 1, 64, 16, 128, 40, 11},
      {1, 3, 3, 16, 64, 80, 70, 3},   {2, 8, 2, 64, 64, 256, 64, 0},
  };
  for (int bf16 = 0; bf16 < 2; bf16++)
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
      norm_qkv_rope_case(&rng, bf16, &cases[i]);
}

/* ---- tree_attention ---------------------------------------------------------------------------- */

typedef struct tree_case {
  int rows, H, Hkv, hd, n, base, committed, n_prefix, chain;
} tree_case;

static void tree_attention_case(vspec_rng *rng, const tree_case *c) {
  const vspec_ops *o = vs_dev_ops(g_gpu);
  int m = c->rows * c->n, hd = c->hd, qkv_w = (c->H + 2 * c->Hkv) * hd;
  int pending = c->base + c->n, kv_len = c->committed + pending, slots = kv_len + 5;
  size_t nq = (size_t)m * qkv_w, nc = (size_t)c->rows * c->Hkv * slots * hd;
  size_t no = (size_t)m * c->H * hd;
  float *qkv = gt_host(nq), *k = gt_host(nc), *v = gt_host(nc), *out = gt_host(no);
  int32_t *parents = (int32_t *)malloc((size_t)pending * sizeof(int32_t));
  uint8_t *prefix = (uint8_t *)malloc((size_t)(c->n_prefix ? c->n_prefix : 1));
  uint8_t *mask = (uint8_t *)malloc((size_t)c->n * kv_len);
  gt_fill(rng, qkv, nq, -1, 1);
  gt_fill(rng, k, nc, -1, 1);
  gt_fill(rng, v, nc, -1, 1);
  /* slots past the forward's are never written: NaN must not reach the output */
  for (size_t g = 0; g < (size_t)c->rows * c->Hkv; g++)
    for (size_t s = (size_t)kv_len; s < (size_t)slots; s++)
      for (int ch = 0; ch < hd; ch++) k[(g * slots + s) * hd + ch] = v[(g * slots + s) * hd + ch] = NAN;
  for (int a = 0; a < pending; a++) /* random trees: a root, or an earlier node */
    parents[a] = c->chain ? a - 1
                 : (a == 0 || vs_rng_uniform(rng) < 0.2) ? -1
                                                          : (int32_t)(vs_rng_uniform(rng) * a);
  for (int s = 0; s < c->n_prefix; s++) prefix[s] = (uint8_t)(vs_rng_uniform(rng) < 0.7);
  int32_t lens[2] = {c->committed, c->base};
  vspec_kv_tree_view view = {.n = c->n, .n_prefix = c->n_prefix, .lens = lens,
                             .parents = parents, .prefix = c->n_prefix ? prefix : NULL};
  for (int i = 0; i < c->n; i++) vs_tree_mask_row(&view, i, mask + (size_t)i * kv_len);
  /* a slot no query sees (a hidden caption slot, a pending node off every query's path)
   * must contribute exactly nothing: NaN there would show */
  for (int s = 0; s < kv_len; s++) {
    int seen = 0;
    for (int i = 0; i < c->n && !seen; i++) seen = mask[(size_t)i * kv_len + s];
    for (size_t g = 0; !seen && g < (size_t)c->rows * c->Hkv; g++)
      for (int ch = 0; ch < hd; ch++) k[(g * slots + s) * hd + ch] = v[(g * slots + s) * hd + ch] = NAN;
  }
  for (int r = 0; r < c->rows; r++) { /* the unfused sequence: one attention per CFG row */
    size_t head0 = (size_t)r * c->Hkv * slots * hd;
    CPU->attention(g_cpu, qkv + (size_t)r * c->n * qkv_w, c->n, qkv_w, c->H, c->Hkv, hd,
                   k + head0, v + head0, slots, kv_len, mask, out + (size_t)r * c->n * c->H * hd);
  }
  float *dq = gt_up(g_gpu, qkv, nq), *dk = gt_up(g_gpu, k, nc), *dv = gt_up(g_gpu, v, nc);
  float *dout = (float *)o->alloc(g_gpu, no * sizeof(float));
  int32_t *dpar = up_bytes(g_gpu, parents, (size_t)pending * sizeof(int32_t));
  uint8_t *dpre = c->n_prefix ? up_bytes(g_gpu, prefix, (size_t)c->n_prefix) : NULL;
  vspec_kv_cache kv = {.k = dk, .v = dv, .rows = c->rows, .n_heads = c->H,
                       .kv_heads = c->Hkv, .head_dim = hd, .slots = slots};
  vspec_kv_tree_view dview = view;
  dview.parents = dpar;
  dview.prefix = dpre;
  int32_t *dlens = up_bytes(g_gpu, lens, sizeof lens);
  dview.lens = dlens;
  count_start(g_gpu);
  o->tree_attention(g_gpu, dq, &kv, &dview, dout);
  count_check(g_gpu, "tree_attention");
  float *got = gt_down(g_gpu, dout, no);
  char what[160];
  snprintf(what, sizeof what,
           "tree_attention rows=%d H=%d/%d hd=%d n=%d base=%d committed=%d prefix=%d chain=%d",
           c->rows, c->H, c->Hkv, hd, c->n, c->base, c->committed, c->n_prefix, c->chain);
  gt_close(what, got, out, no, RTOL, 0);
  o->free(g_gpu, dq), o->free(g_gpu, dk), o->free(g_gpu, dv), o->free(g_gpu, dout);
  o->free(g_gpu, dpar), o->free(g_gpu, dlens);
  if (dpre) o->free(g_gpu, dpre);
  free(qkv), free(k), free(v), free(out), free(parents), free(prefix), free(mask), free(got);
}

static void test_tree_attention(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 25, 0);
  static const tree_case cases[] = {
      /* rows H Hkv hd  n  base committed n_prefix chain */
      {1, 2, 2, 64, 1, 0, 0, 0, 0},     {2, 4, 2, 16, 1, 0, 9, 0, 0},
      {2, 4, 2, 16, 2, 0, 9, 10, 0},     {1, 4, 4, 64, 16, 0, 30, 0, 0},
      {2, 8, 2, 64, 16, 3, 30, 12, 0},  {2, 4, 1, 16, 64, 5, 120, 120, 0},
      {1, 2, 1, 64, 64, 0, 0, 0, 0},    {2, 4, 2, 64, 2, 14, 40, 0, 0},
      /* chain prefills (committed 0), the caption rule hiding some slots */
      {2, 4, 2, 64, 16, 0, 0, 16, 1},   {2, 2, 1, 16, 64, 0, 0, 40, 1},
      {1, 4, 4, 16, 1, 0, 0, 1, 1},
      /* head_dim 32, 64 and 128 take the latency-bound kernel (vs_k_tree_attention_hd),
       * the others the generic one: both, a 64-node chain whose ancestors are walked in
       * shared memory, a long cache, and one too long for the first kernel's shared memory
       * (11296 slots at head_dim 64), which falls back to the generic kernel */
      {2, 4, 2, 128, 4, 1, 50, 0, 0},   {1, 8, 8, 32, 16, 0, 70, 3, 0},
      {2, 4, 2, 64, 64, 0, 10, 5, 1},   {1, 2, 1, 64, 2, 0, 3000, 0, 0},
      {1, 2, 1, 64, 1, 0, 11290, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    tree_attention_case(&rng, &cases[i]);
}

/* Lengths past the cache (committed and base are device values a graph replays, so the
 * kernels check them, not the host): every output is zero, for the generic kernel (head_dim
 * 16) and the latency-bound one (64), and nothing else is written. */
static void test_tree_attention_bad_lengths(void **state) {
  (void)state;
  const vspec_ops *o = vs_dev_ops(g_gpu);
  for (int hd = 16; hd <= 64; hd += 48) {
    enum { ROWS = 2, HQ = 4, HK = 2, N = 2, SLOTS = 40 };
    int qkv_w = (HQ + 2 * HK) * hd;
    size_t nq = (size_t)ROWS * N * qkv_w, nc = (size_t)ROWS * HK * SLOTS * hd;
    size_t no = (size_t)ROWS * N * HQ * hd;
    vspec_rng rng;
    vs_rng_init(&rng, 404, 0);
    float *qkv = gt_host(nq), *kc = gt_host(nc), *out = gt_host(no);
    gt_fill(&rng, qkv, nq, -1, 1);
    gt_fill(&rng, kc, nc, -1, 1);
    for (size_t i = 0; i < no; i++) out[i] = 7.0f; /* overwritten with zeros */
    int32_t parents[N] = {-1, 0}, lens[2] = {SLOTS - 1, 0}; /* committed + n > slots */
    float *dq = gt_up(g_gpu, qkv, nq), *dk = gt_up(g_gpu, kc, nc), *dv = gt_up(g_gpu, kc, nc);
    float *dout = gt_up(g_gpu, out, no);
    int32_t *dpar = up_bytes(g_gpu, parents, sizeof parents);
    int32_t *dlens = up_bytes(g_gpu, lens, sizeof lens);
    vspec_kv_cache kv = {.k = dk, .v = dv, .rows = ROWS, .n_heads = HQ, .kv_heads = HK,
                         .head_dim = hd, .slots = SLOTS};
    vspec_kv_tree_view view = {.n = N, .lens = dlens, .parents = dpar};
    o->tree_attention(g_gpu, dq, &kv, &view, dout);
    float *got = gt_down(g_gpu, dout, no);
    for (size_t i = 0; i < no; i++)
      if (got[i] != 0.0f) fail_msg("head_dim %d: output %zu is %g, not 0", hd, i, got[i]);
    o->free(g_gpu, dq), o->free(g_gpu, dk), o->free(g_gpu, dv), o->free(g_gpu, dout);
    o->free(g_gpu, dpar), o->free(g_gpu, dlens);
    free(qkv), free(kc), free(out), free(got);
  }
}

/* ---- the few-row bf16 linear kernel ---------------------------------------------------------- */

/* What it computes, in double: bf16-rounded weights, fp32 activations. */
/* Slots that do not follow one another (a graph's padding, any caller): each node's keys and
 * values land in its own slot, as the CPU's fused op puts them (test_fused_ops compares that
 * with the unfused stores); a slot outside the cache is not written. fp32. */
static void test_norm_qkv_rope_scattered(void **state) {
  (void)state;
  enum { ROWS = 2, N = 5, H = 4, HKV = 2, HD = 64, DIM = 128, SLOTS = 16, GRID = 8 };
  const vspec_ops *o = vs_dev_ops(g_gpu), *C = vs_dev_ops(g_cpu);
  int qkv_w = (H + 2 * HKV) * HD;
  size_t nx = (size_t)ROWS * N * DIM, nw = (size_t)qkv_w * DIM, nq = (size_t)ROWS * N * qkv_w;
  size_t nc = (size_t)ROWS * HKV * SLOTS * HD, nt = (size_t)(1 + GRID * GRID) * HD;
  vspec_rng rng;
  vs_rng_init(&rng, 2904, 0);
  float *x = gt_host(nx), *nrm = gt_host(DIM), *w = gt_host(nw), *table = gt_host(nt);
  float *k = gt_host(nc), *v = gt_host(nc), *qkv = gt_host(nq);
  gt_fill(&rng, x, nx, -2, 2);
  gt_fill(&rng, nrm, DIM, 0.5f, 1.5f);
  gt_fill(&rng, w, nw, -0.3f, 0.3f);
  gt_fill(&rng, k, nc, -1, 1);
  gt_fill(&rng, v, nc, -1, 1);
  float *k0 = gt_host(nc); /* the cache as it was, for the slot nothing may write */
  memcpy(k0, k, nc * sizeof(float));
  C->rope2d_table(1, GRID, HD, 10000.0f, table);
  int32_t pos[ROWS * N], slots[N] = {9, 2, 15, 0, 99}; /* 99: outside, not written */
  for (int i = 0; i < ROWS * N; i++) pos[i] = 1 + (i * 7) % (GRID * GRID);
  float *dx = gt_up(g_gpu, x, nx), *dn = gt_up(g_gpu, nrm, DIM), *dw = gt_up(g_gpu, w, nw);
  float *dt = gt_up(g_gpu, table, nt), *dk = gt_up(g_gpu, k, nc), *dv = gt_up(g_gpu, v, nc);
  float *dq = (float *)o->alloc(g_gpu, nq * sizeof(float));
  int32_t *dpos = up_bytes(g_gpu, pos, sizeof pos), *dslots = up_bytes(g_gpu, slots, sizeof slots);
  vspec_kv_cache dkv = {.k = dk, .v = dv, .rows = ROWS, .n_heads = H, .kv_heads = HKV,
                        .head_dim = HD, .slots = SLOTS};
  vspec_kv_cache ckv = dkv;
  ckv.k = k, ckv.v = v;
  slots[4] = 3; /* the CPU op would write slot 99 out of bounds: give it a slot, then undo */
  C->norm_qkv_rope(g_cpu, x, N, DIM, nrm, 1e-5f, w, pos, table, &ckv, slots, qkv);
  count_start(g_gpu);
  o->norm_qkv_rope(g_gpu, dx, N, DIM, dn, 1e-5f, dw, dpos, dt, &dkv, dslots, dq);
  count_check(g_gpu, "norm_qkv_rope, scattered slots");
  float *gk = gt_down(g_gpu, dk, nc), *gv = gt_down(g_gpu, dv, nc), *gq = gt_down(g_gpu, dq, nq);
  gt_close("scattered: qkv", gq, qkv, nq, RTOL, 0);
  for (int r = 0; r < ROWS; r++)
    for (int g = 0; g < HKV; g++)
      for (int j = 0; j < 4; j++) { /* nodes 0-3: their own slots */
        size_t at = (((size_t)r * HKV + g) * SLOTS + slots[j]) * HD;
        gt_close("scattered: k slot", gk + at, k + at, HD, RTOL, 0);
        gt_close("scattered: v slot", gv + at, v + at, HD, RTOL, 0);
      }
  /* node 4's slot 99 is outside: slot 3 keeps what it held on the GPU (the CPU wrote it) */
  for (int r = 0; r < ROWS; r++)
    for (int g = 0; g < HKV; g++) {
      size_t at = (((size_t)r * HKV + g) * SLOTS + 3) * HD;
      assert_memory_equal(gk + at, k0 + at, HD * sizeof(float));
    }
  free(k0), free(gk), free(gv), free(gq);
  float *dev_bufs[] = {dx, dn, dw, dt, dk, dv, dq};
  for (size_t i = 0; i < sizeof dev_bufs / sizeof dev_bufs[0]; i++) o->free(g_gpu, dev_bufs[i]);
  o->free(g_gpu, dpos), o->free(g_gpu, dslots);
  free(x), free(nrm), free(w), free(table), free(k), free(v), free(qkv);
}

static void skinny_reference(const float *x, int m, int n_in, const float *w, int n_out,
                             const float *bias, float *y) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n_out; j++) {
      double s = 0;
      for (int k = 0; k < n_in; k++)
        s += (double)x[(size_t)i * n_in + k] *
             vs_bf16_to_f32(vs_f32_to_bf16(w[(size_t)j * n_in + k]));
      y[(size_t)i * n_out + j] = (float)(s + bias[j]);
    }
}

static void test_linear_skinny_bf16(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 26, 0);
  /* 16-byte loads with one warp a column, split over warps (few outputs), odd sizes (one
   * weight at a time), and an activation pointer off 16-byte alignment */
  static const int shapes[][3] = {{256, 300, 0}, {2048, 40, 0}, {4096, 5, 0},
                                  {333, 77, 0},  {1001, 3, 0},  {512, 64, 1}};
  const vspec_ops *o = vs_dev_ops(g_gpu_bf16);
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int n_in = shapes[s][0], n_out = shapes[s][1], off = shapes[s][2];
    size_t nw = (size_t)n_out * n_in;
    float *w = gt_host(nw), *bias = gt_host((size_t)n_out);
    gt_fill(&rng, w, nw, -0.5f, 0.5f);
    gt_fill(&rng, bias, (size_t)n_out, -1, 1);
    float *dw = gt_up(g_gpu_bf16, w, nw), *db = gt_up(g_gpu_bf16, bias, (size_t)n_out);
    for (int m = 1; m <= 8; m++) {
      size_t nx = (size_t)m * n_in, ny = (size_t)m * n_out;
      float *x = gt_host(nx + 1), *want = gt_host(ny);
      gt_fill(&rng, x, nx + 1, -2, 2);
      float *dx = gt_up(g_gpu_bf16, x, nx + 1), *dy = (float *)o->alloc(g_gpu_bf16, ny * 4);
      o->linear(g_gpu_bf16, dx + off, m, n_in, dw, n_out, db, dy);
      skinny_reference(x + off, m, n_in, w, n_out, bias, want);
      float *got = gt_down(g_gpu_bf16, dy, ny);
      char what[96];
      snprintf(what, sizeof what, "linear bf16 m=%d %dx%d offset %d", m, n_in, n_out, off);
      /* fp32 fused multiply-adds over up to 4096 terms against a double sum */
      gt_close(what, got, want, ny, n_in > 1024 ? 1e-4 : 2e-5, 0);
      o->free(g_gpu_bf16, dx), o->free(g_gpu_bf16, dy);
      free(x), free(want), free(got);
    }
    o->free(g_gpu_bf16, dw), o->free(g_gpu_bf16, db);
    free(w), free(bias);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gather_rmsnorm_rows), cmocka_unit_test(test_linear_add),
      cmocka_unit_test(test_norm_swiglu),         cmocka_unit_test(test_norm_qkv_rope),
      cmocka_unit_test(test_tree_attention),      cmocka_unit_test(test_linear_skinny_bf16),
      cmocka_unit_test(test_tree_attention_bad_lengths),
      cmocka_unit_test(test_norm_qkv_rope_scattered),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
