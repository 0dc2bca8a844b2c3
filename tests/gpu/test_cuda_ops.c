/* tests/gpu/test_cuda_ops.c - every CUDA op against the CPU op on the same random inputs
 * (fp32: within 1e-5 of the CPU result, relative to its largest magnitude; only summation
 * order differs), and the bf16 linear layer against an exact host emulation of what it is
 * asked to compute (bf16-rounded weights, and activations above 8 rows). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/common/vs_math.h"
#include "tests/gpu/gpu_testutil.h"

#define RTOL 1e-5

static vspec_dev *g_gpu, *g_gpu_bf16, *g_cpu;

static int setup(void **state) {
  g_gpu = gt_gpu(VS_PRECISION_FP32);
  g_gpu_bf16 = gt_gpu(VS_PRECISION_BF16);
  g_cpu = gt_cpu();
  vs_device_info info;
  vs_dev_info(g_gpu, &info);
  printf("device: %s\n", info.name);
  return 0;
}

static int teardown(void **state) {
  vs_dev_destroy(g_gpu);
  vs_dev_destroy(g_gpu_bf16);
  vs_dev_destroy(g_cpu);
  return 0;
}

#define GPU (vs_dev_ops(g_gpu))
#define CPU (vs_dev_ops(g_cpu))

static void test_gemm(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 1, 0);
  static const int shapes[][3] = {{1, 1, 1}, {7, 5, 3}, {33, 17, 65}, {2, 129, 300}, {130, 70, 9}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
        int lda = ac + 3, ldb = bc + 1, ldc = n + 2;
        size_t na = (size_t)ar * lda, nb = (size_t)br * ldb, nc = (size_t)m * ldc;
        float *a = gt_host(na), *b = gt_host(nb), *c = gt_host(nc);
        gt_fill(&rng, a, na, -1, 1);
        gt_fill(&rng, b, nb, -1, 1);
        gt_fill(&rng, c, nc, -1, 1);
        float *da = gt_up(g_gpu, a, na), *db = gt_up(g_gpu, b, nb), *dc = gt_up(g_gpu, c, nc);
        CPU->gemm(g_cpu, ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 0.25f, c, ldc);
        GPU->gemm(g_gpu, ta, tb, m, n, k, 0.5f, da, lda, db, ldb, 0.25f, dc, ldc);
        float *got = gt_down(g_gpu, dc, nc);
        char what[64];
        snprintf(what, sizeof what, "gemm ta=%d tb=%d %dx%dx%d", ta, tb, m, n, k);
        gt_close(what, got, c, nc, RTOL, 0); /* padding columns included: must be untouched */
        GPU->free(g_gpu, da);
        GPU->free(g_gpu, db);
        GPU->free(g_gpu, dc);
        free(a), free(b), free(c), free(got);
      }
}

static void test_linear_fp32(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 2, 0);
  static const int ms[] = {1, 2, 3, 8, 9, 17, 130};
  int n_in = 96, n_out = 75;
  float *w = gt_host((size_t)n_out * n_in), *bias = gt_host((size_t)n_out);
  gt_fill(&rng, w, (size_t)n_out * n_in, -0.5f, 0.5f);
  gt_fill(&rng, bias, (size_t)n_out, -1, 1);
  float *dw = gt_up(g_gpu, w, (size_t)n_out * n_in), *dbias = gt_up(g_gpu, bias, (size_t)n_out);
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      int m = ms[i];
      float *x = gt_host((size_t)m * n_in), *y = gt_host((size_t)m * n_out);
      gt_fill(&rng, x, (size_t)m * n_in, -2, 2);
      float *dx = gt_up(g_gpu, x, (size_t)m * n_in), *dy = gt_up(g_gpu, y, (size_t)m * n_out);
      CPU->linear(g_cpu, x, m, n_in, w, n_out, with_bias ? bias : NULL, y);
      GPU->linear(g_gpu, dx, m, n_in, dw, n_out, with_bias ? dbias : NULL, dy);
      float *got = gt_down(g_gpu, dy, (size_t)m * n_out);
      char what[64];
      snprintf(what, sizeof what, "linear fp32 m=%d bias=%d", m, with_bias);
      gt_close(what, got, y, (size_t)m * n_out, RTOL, 0);
      GPU->free(g_gpu, dx);
      GPU->free(g_gpu, dy);
      free(x), free(y), free(got);
    }
  GPU->free(g_gpu, dw);
  GPU->free(g_gpu, dbias);
  free(w), free(bias);
}

/* What the bf16 path computes, in double: weights rounded to bf16, and activations too
 * above the few-row kernel's 8 rows (tensor-core GEMM). */
static void bf16_reference(const float *x, int m, int n_in, const float *w, int n_out,
                           const float *bias, float *y) {
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n_out; j++) {
      double s = 0;
      for (int k = 0; k < n_in; k++) {
        float xv = x[(size_t)i * n_in + k];
        if (m > 8) xv = vs_bf16_to_f32(vs_f32_to_bf16(xv));
        s += (double)xv * vs_bf16_to_f32(vs_f32_to_bf16(w[(size_t)j * n_in + k]));
      }
      y[(size_t)i * n_out + j] = (float)(s + (bias ? bias[j] : 0.0f));
    }
}

static void test_linear_bf16(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 3, 0);
  static const int ms[] = {1, 2, 5, 8, 9, 40};
  int n_in = 256, n_out = 300;
  const vspec_ops *o = vs_dev_ops(g_gpu_bf16);
  float *w = gt_host((size_t)n_out * n_in), *bias = gt_host((size_t)n_out);
  gt_fill(&rng, w, (size_t)n_out * n_in, -0.5f, 0.5f);
  gt_fill(&rng, bias, (size_t)n_out, -1, 1);
  /* a weight is a whole allocation (the bf16 copy is keyed by it) */
  float *dw = gt_up(g_gpu_bf16, w, (size_t)n_out * n_in);
  float *dbias = gt_up(g_gpu_bf16, bias, (size_t)n_out);
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
    int m = ms[i];
    float *x = gt_host((size_t)m * n_in), *want = gt_host((size_t)m * n_out);
    gt_fill(&rng, x, (size_t)m * n_in, -2, 2);
    float *dx = gt_up(g_gpu_bf16, x, (size_t)m * n_in);
    float *dy = (float *)o->alloc(g_gpu_bf16, (size_t)m * n_out * sizeof(float));
    o->linear(g_gpu_bf16, dx, m, n_in, dw, n_out, dbias, dy);
    bf16_reference(x, m, n_in, w, n_out, bias, want);
    float *got = gt_down(g_gpu_bf16, dy, (size_t)m * n_out);
    char what[64];
    snprintf(what, sizeof what, "linear bf16 m=%d (vs bf16 emulation)", m);
    /* fp32 accumulation over 256 terms against a double sum */
    gt_close(what, got, want, (size_t)m * n_out, 1e-5, 0);
    o->free(g_gpu_bf16, dx);
    o->free(g_gpu_bf16, dy);
    free(x), free(want), free(got);
  }
  o->free(g_gpu_bf16, dw);
  o->free(g_gpu_bf16, dbias);
  free(w), free(bias);
}

static void test_norms(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 4, 0);
  int rows = 5, dim = 333;
  size_t n = (size_t)rows * dim;
  float *x = gt_host(n), *w = gt_host((size_t)dim), *y = gt_host(n);
  gt_fill(&rng, x, n, -3, 3);
  gt_fill(&rng, w, (size_t)dim, 0.5f, 1.5f);
  float *dx = gt_up(g_gpu, x, n), *dw = gt_up(g_gpu, w, (size_t)dim), *dy = gt_up(g_gpu, y, n);
  CPU->rmsnorm(g_cpu, x, w, rows, dim, 1e-5f, y);
  GPU->rmsnorm(g_gpu, dx, dw, rows, dim, 1e-5f, dy);
  float *got = gt_down(g_gpu, dy, n);
  gt_close("rmsnorm", got, y, n, RTOL, 0);
  free(got);
  GPU->rmsnorm(g_gpu, dx, dw, rows, dim, 1e-5f, dx); /* in place */
  got = gt_down(g_gpu, dx, n);
  gt_close("rmsnorm in place", got, y, n, RTOL, 0);
  free(got);
  /* LayerNorm, affine and not, in place */
  GPU->upload(g_gpu, dx, x, n * sizeof(float));
  for (int affine = 0; affine < 2; affine++) {
    CPU->layernorm(g_cpu, x, affine ? w : NULL, affine ? w : NULL, rows, dim, 1e-6f, y);
    GPU->layernorm(g_gpu, dx, affine ? dw : NULL, affine ? dw : NULL, rows, dim, 1e-6f, dy);
    got = gt_down(g_gpu, dy, n);
    gt_close(affine ? "layernorm (affine)" : "layernorm", got, y, n, RTOL, 0);
    free(got);
  }
  /* GroupNorm with a large offset (the centring in double matters) */
  int C = 64, hw = 50, groups = 32;
  size_t ng = (size_t)C * hw;
  float *gx = gt_host(ng), *gamma = gt_host((size_t)C), *beta = gt_host((size_t)C);
  float *gy = gt_host(ng);
  gt_fill(&rng, gx, ng, 99, 101);
  gt_fill(&rng, gamma, (size_t)C, 0.5f, 2);
  gt_fill(&rng, beta, (size_t)C, -1, 1);
  float *dgx = gt_up(g_gpu, gx, ng), *dgamma = gt_up(g_gpu, gamma, (size_t)C);
  float *dbeta = gt_up(g_gpu, beta, (size_t)C), *dgy = gt_up(g_gpu, gy, ng);
  for (int affine = 0; affine < 2; affine++) {
    CPU->groupnorm(g_cpu, gx, C, hw, groups, 1e-6f, affine ? gamma : NULL, affine ? beta : NULL,
                   gy);
    GPU->groupnorm(g_gpu, dgx, C, hw, groups, 1e-6f, affine ? dgamma : NULL,
                   affine ? dbeta : NULL, dgy);
    got = gt_down(g_gpu, dgy, ng);
    gt_close(affine ? "groupnorm (affine)" : "groupnorm", got, gy, ng, RTOL, 0);
    free(got);
  }
  void *bufs[] = {dx, dw, dy, dgx, dgamma, dbeta, dgy};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) GPU->free(g_gpu, bufs[i]);
  free(x), free(w), free(y), free(gx), free(gamma), free(beta), free(gy);
}

/* Per-element ops: the shared formulas of kernels/common/vs_math.h (built with --fmad=false,
 * so products and sums round as on the CPU); only CUDA's expf / tanhf differ from glibc's,
 * by a few ulp. */
static void test_elementwise(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 5, 0);
  size_t n = 100003;
  float *a = gt_host(n), *b = gt_host(n), *y = gt_host(n);
  gt_fill(&rng, a, n, -12, 12);
  gt_fill(&rng, b, n, -3, 3);
  float *da = gt_up(g_gpu, a, n), *db = gt_up(g_gpu, b, n), *dy = gt_up(g_gpu, a, n);
  float *got;
#define ELEMENTWISE(name, cpu_call, gpu_call)         \
  do {                                                \
    memcpy(y, a, n * sizeof(float));                  \
    GPU->copy(g_gpu, dy, da, n * sizeof(float));      \
    cpu_call;                                         \
    gpu_call;                                         \
    got = gt_down(g_gpu, dy, n);                      \
    gt_close(name, got, y, n, 1e-6, 0);               \
    free(got);                                        \
  } while (0)
  ELEMENTWISE("silu", CPU->silu(g_cpu, y, n), GPU->silu(g_gpu, dy, n));
  ELEMENTWISE("gelu_tanh", CPU->gelu_tanh(g_cpu, y, n), GPU->gelu_tanh(g_gpu, dy, n));
  ELEMENTWISE("gelu (erf)", CPU->gelu(g_cpu, y, n), GPU->gelu(g_gpu, dy, n));
  ELEMENTWISE("mul", CPU->mul(g_cpu, y, b, n), GPU->mul(g_gpu, dy, db, n));
  ELEMENTWISE("add", CPU->add(g_cpu, y, b, n), GPU->add(g_gpu, dy, db, n));
  ELEMENTWISE("swiglu", CPU->swiglu(g_cpu, a, b, n, y), GPU->swiglu(g_gpu, da, db, n, dy));
  ELEMENTWISE("cfg_combine", CPU->cfg_combine(g_cpu, a, b, n, 1.5f, y),
              GPU->cfg_combine(g_gpu, da, db, n, 1.5f, dy));
#undef ELEMENTWISE
  /* upsample: [3, 5, 7] -> [3, 10, 14] */
  float *up = gt_host(3 * 10 * 14);
  float *dup = (float *)GPU->alloc(g_gpu, 3 * 10 * 14 * sizeof(float));
  CPU->upsample_nearest2x(g_cpu, a, 3, 5, 7, up);
  GPU->upsample_nearest2x(g_gpu, da, 3, 5, 7, dup);
  got = gt_down(g_gpu, dup, 3 * 10 * 14);
  gt_close("upsample_nearest2x", got, up, 3 * 10 * 14, 0, 0);
  free(got);
  GPU->free(g_gpu, da);
  GPU->free(g_gpu, db);
  GPU->free(g_gpu, dy);
  GPU->free(g_gpu, dup);
  free(a), free(b), free(y), free(up);
}

/* RoPE with positions that change between calls: the device keeps the last positions it
 * uploaded and must notice new ones. */
static void test_rope(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 6, 0);
  int n_cond = 1, grid = 8, hd = 16, heads = 3, rows = 6, stride = heads * hd + 5;
  size_t tn = (size_t)(n_cond + grid * grid) * hd;
  float *table = gt_host(tn);
  CPU->rope2d_table(n_cond, grid, hd, 10000.0f, table);
  float *dtable = gt_up(g_gpu, table, tn);
  size_t n = (size_t)rows * stride;
  float *x = gt_host(n);
  gt_fill(&rng, x, n, -1, 1);
  float *dx = gt_up(g_gpu, x, n);
  int32_t pos_a[6] = {0, 1, 9, 17, 63, 64}, pos_b[6] = {64, 2, 3, 5, 8, 13};
  const int32_t *seq[] = {pos_a, pos_b, pos_b, pos_a};
  for (int call = 0; call < 4; call++) {
    CPU->rope_apply(g_cpu, x, rows, stride, heads, hd, seq[call], table);
    GPU->rope_apply(g_gpu, dx, rows, stride, heads, hd, seq[call], dtable);
    float *got = gt_down(g_gpu, dx, n);
    gt_close("rope_apply", got, x, n, 1e-6, 0);
    free(got);
  }
  GPU->free(g_gpu, dtable);
  GPU->free(g_gpu, dx);
  free(table), free(x);
}

/* Tree-masked attention with grouped kv heads, a query that sees nothing, and masked
 * slots holding NaN (never written cache slots must not poison the output). */
static void test_attention(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 7, 0);
  int n_q = 5, H = 4, Hkv = 2, hd = 32, n_kv = 37, slots = 40, qs = H * hd + 8;
  size_t nq = (size_t)n_q * qs, nkv = (size_t)Hkv * slots * hd, no = (size_t)n_q * H * hd;
  float *q = gt_host(nq), *k = gt_host(nkv), *v = gt_host(nkv), *out = gt_host(no);
  gt_fill(&rng, q, nq, -1, 1);
  gt_fill(&rng, k, nkv, -1, 1);
  gt_fill(&rng, v, nkv, -1, 1);
  uint8_t mask[5 * 37];
  for (int i = 0; i < n_q; i++)
    for (int j = 0; j < n_kv; j++) mask[i * n_kv + j] = (uint8_t)(j < 30 || (j - 30) <= i);
  for (int j = 0; j < n_kv; j++) mask[3 * n_kv + j] = 0; /* query 3 sees nothing */
  /* slot 36 is masked for every query and holds NaN keys (a slot never written) */
  for (int g = 0; g < Hkv; g++)
    for (int c = 0; c < hd; c++) k[((size_t)g * slots + 36) * hd + c] = NAN;
  for (int i = 0; i < n_q; i++) mask[i * n_kv + 36] = 0;
  float *dq = gt_up(g_gpu, q, nq), *dk = gt_up(g_gpu, k, nkv), *dv = gt_up(g_gpu, v, nkv);
  float *dout = (float *)GPU->alloc(g_gpu, no * sizeof(float));
  CPU->attention(g_cpu, q, n_q, qs, H, Hkv, hd, k, v, slots, n_kv, mask, out);
  GPU->attention(g_gpu, dq, n_q, qs, H, Hkv, hd, dk, dv, slots, n_kv, mask, dout);
  float *masked_out = gt_down(g_gpu, dout, no);
  gt_close("attention (tree mask)", masked_out, out, no, RTOL, 0);
  for (size_t c = 0; c < (size_t)H * hd; c++)
    assert_true(masked_out[3 * (size_t)H * hd + c] == 0.0f);
  free(masked_out);
  /* no mask over the first 30 slots only */
  CPU->attention(g_cpu, q, n_q, qs, H, Hkv, hd, k, v, slots, 30, NULL, out);
  GPU->attention(g_gpu, dq, n_q, qs, H, Hkv, hd, dk, dv, slots, 30, NULL, dout);
  float *got = gt_down(g_gpu, dout, no);
  gt_close("attention (no mask)", got, out, no, RTOL, 0);
  free(got);
  GPU->free(g_gpu, dq), GPU->free(g_gpu, dk), GPU->free(g_gpu, dv), GPU->free(g_gpu, dout);
  free(q), free(k), free(v), free(out);
}

static void test_distributions(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 8, 0);
  int rows = 3, n = 1000;
  size_t total = (size_t)rows * n;
  float *x = gt_host(total);
  gt_fill(&rng, x, total, -8, 8);
  for (int i = 0; i < n; i++) x[2 * n + i] = -INFINITY; /* a row with nothing finite */
  x[5] = -INFINITY;
  for (int log = 0; log < 2; log++) {
    float *y = gt_host(total);
    memcpy(y, x, total * sizeof(float));
    float *dy = gt_up(g_gpu, x, total);
    if (log) {
      CPU->log_softmax(g_cpu, y, rows, n);
      GPU->log_softmax(g_gpu, dy, rows, n);
    } else {
      CPU->softmax(g_cpu, y, rows, n);
      GPU->softmax(g_gpu, dy, rows, n);
    }
    float *got = gt_down(g_gpu, dy, total);
    for (size_t i = 0; i < total; i++)
      if (isinf(y[i])) assert_true(isinf(got[i]) && got[i] < 0);
    for (size_t i = 0; i < total; i++)
      if (isinf(y[i])) got[i] = y[i] = 0.0f; /* compare the finite part */
    gt_close(log ? "log_softmax" : "softmax", got, y, total, RTOL, 1e-7);
    free(got), free(y);
    GPU->free(g_gpu, dy);
  }
  /* logits_to_probs / sample / argmax go through the host: identical results */
  float *probs = gt_host((size_t)n), *dl = gt_up(g_gpu, x, (size_t)n);
  float *dp = (float *)GPU->alloc(g_gpu, (size_t)n * sizeof(float));
  int nz_cpu = CPU->logits_to_probs(g_cpu, x, n, 0.9f, 50, 0.8f, probs);
  int nz_gpu = GPU->logits_to_probs(g_gpu, dl, n, 0.9f, 50, 0.8f, dp);
  assert_int_equal(nz_cpu, nz_gpu);
  float *got = gt_down(g_gpu, dp, (size_t)n);
  assert_memory_equal(got, probs, (size_t)n * sizeof(float));
  for (double u = 0.0; u < 1.0; u += 0.0625)
    assert_int_equal(GPU->sample(g_gpu, dp, n, u), CPU->sample(g_cpu, probs, n, u));
  assert_int_equal(GPU->argmax(g_gpu, dl, n), CPU->argmax(g_cpu, x, n));
  free(got), free(probs), free(x);
  GPU->free(g_gpu, dl);
  GPU->free(g_gpu, dp);
}

static void test_conv2d(void **state) {
  vspec_rng rng;
  vs_rng_init(&rng, 9, 0);
  struct { int cin, h, w, cout, k, stride, pt, pl, pb, pr, bias; } cases[] = {
      {5, 9, 11, 7, 3, 1, 1, 1, 1, 1, 1}, {4, 8, 8, 6, 3, 2, 0, 0, 1, 1, 1},
      {6, 7, 5, 3, 1, 1, 0, 0, 0, 0, 0}, {3, 16, 16, 8, 3, 1, 1, 1, 1, 1, 0}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int cin = cases[c].cin, h = cases[c].h, w = cases[c].w, cout = cases[c].cout, k = cases[c].k;
    int s = cases[c].stride, ho = (h + cases[c].pt + cases[c].pb - k) / s + 1;
    int wo = (w + cases[c].pl + cases[c].pr - k) / s + 1;
    size_t nx = (size_t)cin * h * w, nw = (size_t)cout * cin * k * k, ny = (size_t)cout * ho * wo;
    float *x = gt_host(nx), *wt = gt_host(nw), *b = gt_host((size_t)cout), *y = gt_host(ny);
    gt_fill(&rng, x, nx, -1, 1);
    gt_fill(&rng, wt, nw, -0.3f, 0.3f);
    gt_fill(&rng, b, (size_t)cout, -1, 1);
    float *dx = gt_up(g_gpu, x, nx), *dw = gt_up(g_gpu, wt, nw), *db = gt_up(g_gpu, b, (size_t)cout);
    float *dy = (float *)GPU->alloc(g_gpu, ny * sizeof(float));
    CPU->conv2d(g_cpu, x, cin, h, w, wt, cases[c].bias ? b : NULL, cout, k, k, s, cases[c].pt,
                cases[c].pl, cases[c].pb, cases[c].pr, y);
    GPU->conv2d(g_gpu, dx, cin, h, w, dw, cases[c].bias ? db : NULL, cout, k, k, s, cases[c].pt,
                cases[c].pl, cases[c].pb, cases[c].pr, dy);
    float *got = gt_down(g_gpu, dy, ny);
    char what[64];
    snprintf(what, sizeof what, "conv2d case %zu", c);
    gt_close(what, got, y, ny, RTOL, 0);
    GPU->free(g_gpu, dx), GPU->free(g_gpu, dw), GPU->free(g_gpu, db), GPU->free(g_gpu, dy);
    free(x), free(wt), free(b), free(y), free(got);
  }
}

static void test_copies(void **state) {
  size_t n = 1000;
  float *h = gt_host(n);
  for (size_t i = 0; i < n; i++) h[i] = (float)i;
  float *d = gt_up(g_gpu, h, n);
  /* overlapping copy: memmove semantics */
  GPU->copy(g_gpu, d + 10, d, 500 * sizeof(float));
  memmove(h + 10, h, 500 * sizeof(float));
  float *got = gt_down(g_gpu, d, n);
  assert_memory_equal(got, h, n * sizeof(float));
  free(got);
  /* copy3d: the KV-cache store pattern (a = head, b = node) */
  float *src = gt_host(n), *dst = gt_host(n), *ref = gt_host(n);
  for (size_t i = 0; i < n; i++) src[i] = (float)(i * 3 + 1), dst[i] = ref[i] = -1.0f;
  float *dsrc = gt_up(g_gpu, src, n), *ddst = gt_up(g_gpu, dst, n);
  size_t f = sizeof(float);
  CPU->copy3d(g_cpu, ref + 4, 100 * f, 8 * f, src + 2, 8 * f, 50 * f, 8 * f, 3, 5);
  GPU->copy3d(g_gpu, ddst + 4, 100 * f, 8 * f, dsrc + 2, 8 * f, 50 * f, 8 * f, 3, 5);
  got = gt_down(g_gpu, ddst, n);
  assert_memory_equal(got, ref, n * sizeof(float));
  free(got);
  GPU->free(g_gpu, d), GPU->free(g_gpu, dsrc), GPU->free(g_gpu, ddst);
  free(h), free(src), free(dst), free(ref);
  char err[VSPEC_ERRLEN];
  assert_int_equal(vs_dev_check(g_gpu, err, sizeof err), VSPEC_OK);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gemm),         cmocka_unit_test(test_linear_fp32),
      cmocka_unit_test(test_linear_bf16),  cmocka_unit_test(test_norms),
      cmocka_unit_test(test_elementwise),  cmocka_unit_test(test_rope),
      cmocka_unit_test(test_attention),    cmocka_unit_test(test_distributions),
      cmocka_unit_test(test_conv2d),       cmocka_unit_test(test_copies),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
