/* tests/gpu/test_cuda_concurrent.c - several device contexts on one GPU, as the workers of a
 * daemon have them (kernels/cuda/cuda_dev.h: non-blocking streams, the synchronisation
 * rules, the fixed cuBLAS workspace and page-locked staging of each context).
 *
 *  - Two contexts of one GPU, each driven by its own thread (opened on the main thread,
 *    used on another, as a daemon opens them), run the same sequence of ops many times at
 *    once: alloc and alloc_uninit, uploads, linear (cuBLAS and, at bf16, the few-row kernel,
 *    with a weight allocated and converted in every round), rmsnorm, rope_apply and
 *    attention with host arrays, the ABI 1.4 fused ops over a KV cache from alloc, argmax,
 *    downloads, free. Every round's results equal, bit for bit, what one of the contexts
 *    computed alone beforehand, and so do its transfer counts; at fp32 and at bf16.
 *  - Memory from alloc reads back zero from the other context right after alloc returns,
 *    even while the allocating context's stream is still busy with earlier work and the
 *    memory was filled with other bytes before it was last freed.
 *  - The transfer counters count as they always have: one upload or download and its bytes
 *    per call, small (staged through pinned memory) or large, and the uploads ops make of
 *    changed host arrays; the data arrives intact either way.
 * Without a usable GPU the binary exits 77 (skipped). */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/gpu/gpu_testutil.h"

#define ROUNDS 150

/* ---- shapes -------------------------------------------------------------------------------- */
enum {
  DIM = 256,   /* model width, = H * HD */
  NOUT = 384,  /* linear outputs and FFN hidden */
  M = 16,      /* rows of the cuBLAS-sized products (above the few-row kernel's 8) */
  MS = 3,      /* rows of the few-row products */
  H = 4,       /* heads */
  HKV = 2,     /* kv heads */
  HD = 64,     /* head_dim */
  NQ = 8,      /* attention queries */
  NKV = 40,    /* attention slots */
  SLOT = 48,   /* slot stride of the attention operands */
  VOCAB = 50,  /* rows of the embedding gather_rows reads */
  ROWS = 2,    /* CFG rows of the fused forward */
  NODES = 8,   /* nodes per CFG row */
  SLOTS = 32,  /* cache slots */
  FIRST = 12,  /* committed slots (zero from alloc) and the first slot the forward writes */
  NPREFIX = 5, /* slots under the prefix rule */
  NCOND = 3,   /* RoPE table: condition rows */
  GRID = 8,    /* RoPE table: grid */
  QKVW = (H + 2 * HKV) * HD
};
#define NTABLE ((size_t)(NCOND + GRID * GRID) * HD)
#define NCACHE ((size_t)ROWS * HKV * SLOTS * HD)

/* Host inputs, and the device weights every context reads (allocated and uploaded by the
 * first context, as a model is loaded once and served by every worker). */
typedef struct inputs {
  float x[M * DIM], w[NOUT * DIM], bias[NOUT], wtmp[NOUT * DIM], nw[DIM];
  float kv_k[HKV * SLOT * HD], kv_v[HKV * SLOT * HD], table[NTABLE];
  float emb[VOCAB * DIM], wqkv[QKVW * DIM], wo[DIM * DIM], w1[NOUT * DIM], w3[NOUT * DIM];
  uint8_t mask[2][NQ * NKV];
  int32_t pos[2][NQ];
  int32_t idx[ROWS * NODES], fpos[ROWS * NODES], parents[NODES], slots[NODES], lens[2];
  uint8_t prefix[NPREFIX];
} inputs;

typedef struct weights {
  float *w, *bias, *nw, *k, *v, *table, *emb, *wqkv, *wo, *w1, *w3;
  int32_t *idx, *fpos, *parents, *slots, *lens;
  uint8_t *prefix;
} weights;

/* What a round downloads, in this order (sizes in floats; argmax as an int's bits). */
static const size_t g_parts[] = {
    (size_t)M * NOUT,  /* linear, M rows */
    (size_t)MS * NOUT, /* linear, MS rows */
    (size_t)MS * NOUT, /* linear, MS rows, the round's own weight */
    (size_t)M * DIM,   /* rmsnorm */
    (size_t)NQ * DIM,  /* rope_apply twice (two position arrays) */
    (size_t)NQ * DIM,  /* attention, mask 0 */
    (size_t)NQ * DIM,  /* attention, mask 1 */
    (size_t)ROWS * NODES * DIM,  /* rmsnorm_rows */
    (size_t)ROWS * NODES * QKVW, /* norm_qkv_rope: qkv */
    NCACHE, NCACHE,              /* norm_qkv_rope: the caches */
    (size_t)ROWS * NODES * DIM,  /* tree_attention */
    (size_t)ROWS * NODES * DIM,  /* gather_rows, then linear_add of the attention */
    (size_t)ROWS * NODES * NOUT, /* norm_swiglu, 16 rows */
    (size_t)MS * NOUT,           /* norm_swiglu, MS rows */
    1,                           /* argmax */
};
#define NPARTS (sizeof g_parts / sizeof g_parts[0])

static size_t out_floats(void) {
  size_t n = 0;
  for (size_t i = 0; i < NPARTS; i++) n += g_parts[i];
  return n;
}

static inputs *g_in;

static void make_inputs(void) {
  g_in = (inputs *)calloc(1, sizeof *g_in);
  if (!g_in) abort();
  inputs *in = g_in;
  vspec_rng rng;
  vs_rng_init(&rng, 29, 3);
  gt_fill(&rng, in->x, sizeof in->x / sizeof(float), -2, 2);
  gt_fill(&rng, in->w, sizeof in->w / sizeof(float), -0.3f, 0.3f);
  gt_fill(&rng, in->bias, NOUT, -1, 1);
  gt_fill(&rng, in->wtmp, sizeof in->wtmp / sizeof(float), -0.3f, 0.3f);
  gt_fill(&rng, in->nw, DIM, 0.5f, 1.5f);
  gt_fill(&rng, in->kv_k, sizeof in->kv_k / sizeof(float), -1, 1);
  gt_fill(&rng, in->kv_v, sizeof in->kv_v / sizeof(float), -1, 1);
  gt_fill(&rng, in->emb, sizeof in->emb / sizeof(float), -2, 2);
  gt_fill(&rng, in->wqkv, sizeof in->wqkv / sizeof(float), -0.2f, 0.2f);
  gt_fill(&rng, in->wo, sizeof in->wo / sizeof(float), -0.2f, 0.2f);
  gt_fill(&rng, in->w1, sizeof in->w1 / sizeof(float), -0.2f, 0.2f);
  gt_fill(&rng, in->w3, sizeof in->w3 / sizeof(float), -0.2f, 0.2f);
  for (int t = 0; t < 2; t++) {
    for (int i = 0; i < NQ * NKV; i++) in->mask[t][i] = (uint8_t)(vs_rng_uniform(&rng) < 0.6);
    for (int i = 0; i < NQ; i++) {
      in->mask[t][i * NKV + i] = 1; /* every query sees a slot */
      in->pos[t][i] = (int32_t)(vs_rng_uniform(&rng) * (NCOND + GRID * GRID));
    }
  }
  for (int i = 0; i < ROWS * NODES; i++) {
    in->idx[i] = (int32_t)(vs_rng_uniform(&rng) * VOCAB);
    in->fpos[i] = (int32_t)(vs_rng_uniform(&rng) * (NCOND + GRID * GRID));
  }
  for (int a = 0; a < NODES; a++)
    in->parents[a] = a == 0 || vs_rng_uniform(&rng) < 0.2 ? -1 : (int32_t)(vs_rng_uniform(&rng) * a);
  for (int s = 0; s < NPREFIX; s++) in->prefix[s] = (uint8_t)(vs_rng_uniform(&rng) < 0.6);
  for (int j = 0; j < NODES; j++) in->slots[j] = FIRST + j; /* after the committed slots */
  in->lens[0] = FIRST; /* committed */
  in->lens[1] = 0;     /* base */
}

static void *up_bytes(vspec_dev *dev, const void *host, size_t bytes) {
  const vspec_ops *o = vs_dev_ops(dev);
  void *d = o->alloc(dev, bytes);
  if (!d || o->upload(dev, d, host, bytes)) abort();
  return d;
}

static void weights_load(vspec_dev *dev, weights *w) {
  const inputs *in = g_in;
  vs_dev_ops(dev)->rope2d_table(NCOND, GRID, HD, 10000.0f, g_in->table);
  w->w = up_bytes(dev, in->w, sizeof in->w);
  w->bias = up_bytes(dev, in->bias, sizeof in->bias);
  w->nw = up_bytes(dev, in->nw, sizeof in->nw);
  w->k = up_bytes(dev, in->kv_k, sizeof in->kv_k);
  w->v = up_bytes(dev, in->kv_v, sizeof in->kv_v);
  w->table = up_bytes(dev, in->table, sizeof in->table);
  w->emb = up_bytes(dev, in->emb, sizeof in->emb);
  w->wqkv = up_bytes(dev, in->wqkv, sizeof in->wqkv);
  w->wo = up_bytes(dev, in->wo, sizeof in->wo);
  w->w1 = up_bytes(dev, in->w1, sizeof in->w1);
  w->w3 = up_bytes(dev, in->w3, sizeof in->w3);
  w->idx = up_bytes(dev, in->idx, sizeof in->idx);
  w->fpos = up_bytes(dev, in->fpos, sizeof in->fpos);
  w->parents = up_bytes(dev, in->parents, sizeof in->parents);
  w->prefix = up_bytes(dev, in->prefix, sizeof in->prefix);
  w->slots = up_bytes(dev, in->slots, sizeof in->slots);
  w->lens = up_bytes(dev, in->lens, sizeof in->lens);
}

static void weights_free(vspec_dev *dev, weights *w) {
  const vspec_ops *o = vs_dev_ops(dev);
  void *p[] = {w->w,  w->bias, w->nw, w->k,   w->v,   w->table,   w->emb,   w->wqkv,
               w->wo, w->w1,   w->w3, w->idx, w->fpos, w->parents, w->prefix,
               w->slots, w->lens};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) o->free(dev, p[i]);
}

/* ---- one round: the sequence every context runs ---------------------------------------- */

/* Runs the sequence on dev into out (out_floats() floats); its transfer counts into *c.
 * 0, or -1 with a message in err. Safe on any thread: no cmocka calls. */
static int round_run(vspec_dev *dev, const weights *w, float *out, vs_dev_counters *c,
                     char *err, size_t errlen) {
  const vspec_ops *o = vs_dev_ops(dev);
  const inputs *in = g_in;
  const size_t f = sizeof(float);
  vs_dev_counters before;
  vs_dev_counters_get(dev, &before);
  /* activations: some zero-filled, some not (each written before it is read) */
  float *x = (float *)o->alloc_uninit(dev, sizeof in->x);
  float *wtmp = (float *)o->alloc(dev, sizeof in->wtmp);
  float *y16 = (float *)o->alloc_uninit(dev, (size_t)M * NOUT * f);
  float *y3 = (float *)o->alloc(dev, (size_t)MS * NOUT * f);
  float *yt = (float *)o->alloc_uninit(dev, (size_t)MS * NOUT * f);
  float *yr = (float *)o->alloc_uninit(dev, (size_t)M * DIM * f);
  float *q = (float *)o->alloc_uninit(dev, (size_t)NQ * DIM * f);
  float *att = (float *)o->alloc(dev, (size_t)2 * NQ * DIM * f);
  float *xg = (float *)o->alloc_uninit(dev, (size_t)ROWS * NODES * DIM * f);
  float *xr = (float *)o->alloc_uninit(dev, (size_t)ROWS * NODES * DIM * f);
  float *qkv = (float *)o->alloc_uninit(dev, (size_t)ROWS * NODES * QKVW * f);
  float *kc = (float *)o->alloc(dev, NCACHE * f); /* committed slots: zeros from alloc */
  float *vc = (float *)o->alloc(dev, NCACHE * f);
  float *tatt = (float *)o->alloc_uninit(dev, (size_t)ROWS * NODES * DIM * f);
  float *ff = (float *)o->alloc_uninit(dev, (size_t)ROWS * NODES * NOUT * f);
  float *ff3 = (float *)o->alloc_uninit(dev, (size_t)MS * NOUT * f);
  void *all[] = {x, wtmp, y16, y3, yt, yr, q, att, xg, xr, qkv, kc, vc, tatt, ff, ff3};
  const size_t nall = sizeof all / sizeof all[0];
  int rc = -1;
  for (size_t i = 0; i < nall; i++)
    if (!all[i]) {
      snprintf(err, errlen, "allocation %zu failed: %s", i, vs_dev_alloc_error(dev));
      goto done;
    }
  if (o->upload(dev, x, in->x, sizeof in->x) || o->upload(dev, wtmp, in->wtmp, sizeof in->wtmp) ||
      o->upload(dev, q, in->x, (size_t)NQ * DIM * f)) {
    snprintf(err, errlen, "upload failed");
    goto done;
  }
  o->linear(dev, x, M, DIM, w->w, NOUT, w->bias, y16);
  o->linear(dev, x, MS, DIM, w->w, NOUT, w->bias, y3);
  o->linear(dev, x, MS, DIM, wtmp, NOUT, NULL, yt); /* a new weight (bf16: a new copy) */
  o->rmsnorm(dev, x, w->nw, M, DIM, 1e-5f, yr);
  /* host arrays that change between calls: each call uploads its array */
  o->rope_apply(dev, q, NQ, DIM, H, HD, in->pos[0], w->table);
  o->rope_apply(dev, q, NQ, DIM, H, HD, in->pos[1], w->table);
  for (int t = 0; t < 2; t++)
    o->attention(dev, q, NQ, DIM, H, HKV, HD, w->k, w->v, SLOT, NKV, in->mask[t],
                 att + (size_t)t * NQ * DIM);
  /* the fused forward of ROWS x NODES nodes */
  o->gather_rows(dev, w->emb, w->idx, ROWS * NODES, DIM, xg);
  o->rmsnorm_rows(dev, w->emb, w->idx, ROWS * NODES, DIM, w->nw, 1e-5f, xr);
  vspec_kv_cache kv = {.k = kc, .v = vc, .rows = ROWS, .n_heads = H, .kv_heads = HKV,
                       .head_dim = HD, .slots = SLOTS};
  o->norm_qkv_rope(dev, xg, NODES, DIM, w->nw, 1e-5f, w->wqkv, w->fpos, w->table, &kv,
                   w->slots, qkv);
  vspec_kv_tree_view view = {.n = NODES, .n_prefix = NPREFIX, .lens = w->lens,
                             .parents = w->parents, .prefix = w->prefix};
  o->tree_attention(dev, qkv, &kv, &view, tatt);
  o->linear_add(dev, tatt, ROWS * NODES, DIM, w->wo, DIM, xg);
  o->norm_swiglu(dev, xg, ROWS * NODES, DIM, w->nw, 1e-5f, w->w1, w->w3, NOUT, ff);
  o->norm_swiglu(dev, xg, MS, DIM, w->nw, 1e-5f, w->w1, w->w3, NOUT, ff3);
  int am = o->argmax(dev, y16, NOUT);
  if (vs_dev_check(dev, err, errlen)) goto done;
  const float *parts[] = {y16, y3, yt, yr, q, att, att + (size_t)NQ * DIM, xr, qkv, kc, vc,
                          tatt, xg, ff, ff3};
  size_t at = 0;
  for (size_t i = 0; i + 1 < NPARTS; i++) {
    if (o->download(dev, out + at, parts[i], g_parts[i] * f)) {
      snprintf(err, errlen, "download %zu failed", i);
      goto done;
    }
    at += g_parts[i];
  }
  memcpy(out + at, &am, sizeof am);
  rc = 0;
done:
  for (size_t i = 0; i < nall; i++) o->free(dev, all[i]);
  if (rc == 0 && vs_dev_check(dev, err, errlen)) rc = -1;
  vs_dev_counters_get(dev, c);
  vs_dev_counters_sub(c, &before);
  return rc;
}

static int counts_equal(const vs_dev_counters *a, const vs_dev_counters *b) {
  return a->uploads == b->uploads && a->upload_bytes == b->upload_bytes &&
         a->downloads == b->downloads && a->download_bytes == b->download_bytes &&
         a->ops == b->ops;
}

/* ---- two contexts at once ------------------------------------------------------------------- */

typedef struct worker {
  vspec_dev *dev;
  const weights *w;
  const float *ref;
  const vs_dev_counters *ref_counts;
  pthread_barrier_t *start;
  int rounds_done;
  int failed;
  char msg[VSPEC_ERRLEN + 128];
} worker;

static void *worker_main(void *arg) {
  worker *k = (worker *)arg;
  size_t n = out_floats();
  float *out = (float *)malloc(n * sizeof(float));
  if (!out) abort();
  pthread_barrier_wait(k->start);
  for (int r = 0; r < ROUNDS && !k->failed; r++) {
    char err[VSPEC_ERRLEN] = "";
    vs_dev_counters c;
    memset(out, 0xa5, n * sizeof(float));
    if (round_run(k->dev, k->w, out, &c, err, sizeof err)) {
      snprintf(k->msg, sizeof k->msg, "round %d: %s", r, err);
      k->failed = 1;
      break;
    }
    if (memcmp(out, k->ref, n * sizeof(float)) != 0) {
      size_t i = 0, part = 0, base = 0;
      while (i < n && memcmp(&out[i], &k->ref[i], sizeof(float)) == 0) i++;
      while (part < NPARTS && base + g_parts[part] <= i) base += g_parts[part++];
      snprintf(k->msg, sizeof k->msg,
               "round %d: result differs from the lone context's at float %zu (part %zu, "
               "element %zu): %.9g, want %.9g", r, i, part, i - base, out[i], k->ref[i]);
      k->failed = 1;
      break;
    }
    if (!counts_equal(&c, k->ref_counts)) {
      snprintf(k->msg, sizeof k->msg,
               "round %d: %llu ops, %llu uploads (%llu bytes), %llu downloads (%llu bytes); "
               "alone: %llu, %llu (%llu), %llu (%llu)", r, (unsigned long long)c.ops,
               (unsigned long long)c.uploads, (unsigned long long)c.upload_bytes,
               (unsigned long long)c.downloads, (unsigned long long)c.download_bytes,
               (unsigned long long)k->ref_counts->ops,
               (unsigned long long)k->ref_counts->uploads,
               (unsigned long long)k->ref_counts->upload_bytes,
               (unsigned long long)k->ref_counts->downloads,
               (unsigned long long)k->ref_counts->download_bytes);
      k->failed = 1;
      break;
    }
    k->rounds_done = r + 1;
  }
  free(out);
  return NULL;
}

static void concurrent_case(int precision) {
  vspec_dev *a = gt_gpu(precision), *b = gt_gpu(precision);
  assert_int_equal(vs_dev_space(a), vs_dev_space(b)); /* one GPU */
  const vspec_ops *o = vs_dev_ops(a);
  assert_non_null(o->alloc_uninit); /* ABI 1.3 on CUDA */
  assert_true(vspec_has_fused_ops(o));
  weights w;
  weights_load(a, &w);
  size_t n = out_floats();
  float *ref = gt_host(n), *again = gt_host(n);
  char err[VSPEC_ERRLEN] = "";
  vs_dev_counters ref_counts, c;
  /* one context alone, twice: the second round is the reference (the first makes the bf16
   * weight copies and grows the scratch); both must agree */
  if (round_run(a, &w, again, &c, err, sizeof err) ||
      round_run(a, &w, ref, &ref_counts, err, sizeof err))
    fail_msg("the lone context: %s", err);
  assert_memory_equal(ref, again, n * sizeof(float));
  assert_true(counts_equal(&c, &ref_counts));
  /* what a round transfers: 3 uploads, 2 arrays for rope_apply and 2 masks staged inside
   * ops; 14 downloads and argmax's */
  assert_int_equal(ref_counts.uploads, 3 + 2 + 2);
  assert_int_equal(ref_counts.upload_bytes,
                   sizeof g_in->x + sizeof g_in->wtmp + (size_t)NQ * DIM * sizeof(float) +
                       2 * NQ * sizeof(int32_t) + 2 * (size_t)NQ * NKV);
  assert_int_equal(ref_counts.downloads, NPARTS);
  assert_int_equal(ref_counts.download_bytes, out_floats() * sizeof(float) -
                   sizeof(float) + NOUT * sizeof(float));
  /* the two contexts at once */
  pthread_barrier_t start;
  assert_int_equal(pthread_barrier_init(&start, NULL, 2), 0);
  worker k[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    memset(&k[i], 0, sizeof k[i]);
    k[i] = (worker){.dev = i ? b : a, .w = &w, .ref = ref, .ref_counts = &ref_counts,
                    .start = &start};
    assert_int_equal(pthread_create(&th[i], NULL, worker_main, &k[i]), 0);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&start);
  printf("  %s: %d and %d rounds at once, results as alone\n",
         precision == VS_PRECISION_BF16 ? "bf16" : "fp32", k[0].rounds_done, k[1].rounds_done);
  for (int i = 0; i < 2; i++)
    if (k[i].failed) fail_msg("context %c: %s", i ? 'B' : 'A', k[i].msg);
  weights_free(a, &w);
  free(ref), free(again);
  vs_dev_destroy(a);
  vs_dev_destroy(b);
}

static void test_concurrent_fp32(void **state) { concurrent_case(VS_PRECISION_FP32); }
static void test_concurrent_bf16(void **state) { concurrent_case(VS_PRECISION_BF16); }

/* ---- alloc's zeros, seen from the other context --------------------------------------------- */

static void test_alloc_zero_other_context(void **state) {
  vspec_dev *ctx[2] = {gt_gpu(VS_PRECISION_FP32), gt_gpu(VS_PRECISION_FP32)};
  const size_t bytes = (size_t)64 << 20, nf = bytes / sizeof(float);
  const int busy_n = 4096;
  size_t nb = (size_t)busy_n * busy_n;
  unsigned char *junk = (unsigned char *)malloc(bytes);
  float *host = gt_host(nf), *ones = gt_host(nb);
  if (!junk) abort();
  memset(junk, 0x7f, bytes); /* 0x7f7f7f7f: a large float, not zero */
  for (size_t i = 0; i < nb; i++) ones[i] = 1.0f;
  float *busy[2][3]; /* per context: a, b and c of a product */
  for (int c = 0; c < 2; c++)
    for (int t = 0; t < 3; t++) busy[c][t] = gt_up(ctx[c], ones, nb);
  int reused = 0;
  for (int round = 0; round < 8; round++) {
    int ac = round & 1; /* allocating context; the other one reads */
    vspec_dev *alloc_dev = ctx[ac], *read_dev = ctx[!ac];
    const vspec_ops *ao = vs_dev_ops(alloc_dev), *ro = vs_dev_ops(read_dev);
    float *dst = (float *)ro->alloc_uninit(read_dev, bytes);
    assert_non_null(dst);
    /* memory that held other bytes, freed: the next allocation of its size likely gets it */
    void *old = ao->alloc(alloc_dev, bytes);
    assert_non_null(old);
    assert_int_equal(ao->upload(alloc_dev, old, junk, bytes), VSPEC_OK);
    ao->free(alloc_dev, old);
    /* the allocating context's stream busy with a product of milliseconds: a fill queued
     * behind it and not waited for would reach the memory after the read below */
    ao->gemm(alloc_dev, 0, 0, busy_n, busy_n, busy_n, 1.0f, busy[ac][0], busy_n, busy[ac][1],
             busy_n, 0.0f, busy[ac][2], busy_n);
    float *fresh = (float *)ao->alloc(alloc_dev, bytes);
    assert_non_null(fresh);
    reused += (void *)fresh == old; /* the junk is under it: the check has teeth */
    /* right away, on the other context's stream */
    assert_int_equal(ro->copy(read_dev, dst, fresh, bytes), VSPEC_OK);
    char err[VSPEC_ERRLEN] = "";
    assert_int_equal(vs_dev_check(read_dev, err, sizeof err), VSPEC_OK);
    assert_int_equal(ro->download(read_dev, host, dst, bytes), VSPEC_OK);
    for (size_t i = 0; i < nf; i++)
      if (host[i] != 0.0f || signbit(host[i]))
        fail_msg("round %d: float %zu of memory alloc'd by context %d reads %g from context %d",
                 round, i, ac, host[i], !ac);
    ao->free(alloc_dev, fresh);
    ro->free(read_dev, dst);
    assert_int_equal(vs_dev_check(alloc_dev, err, sizeof err), VSPEC_OK);
  }
  printf("  8 rounds, zeros seen from the other context; %d of them on reused memory that "
         "held junk\n", reused);
  for (int c = 0; c < 2; c++)
    for (int t = 0; t < 3; t++) vs_dev_ops(ctx[c])->free(ctx[c], busy[c][t]);
  free(junk), free(host), free(ones);
  vs_dev_destroy(ctx[0]);
  vs_dev_destroy(ctx[1]);
}

/* ---- the transfer counters -------------------------------------------------------------------- */

static void expect_counts(vspec_dev *dev, const vs_dev_counters *before, uint64_t up,
                          uint64_t up_bytes, uint64_t down, uint64_t down_bytes, const char *what) {
  vs_dev_counters now;
  vs_dev_counters_get(dev, &now);
  vs_dev_counters_sub(&now, before);
  if (now.uploads != up || now.upload_bytes != up_bytes || now.downloads != down ||
      now.download_bytes != down_bytes)
    fail_msg("%s: %llu uploads (%llu bytes), %llu downloads (%llu bytes); want %llu (%llu), "
             "%llu (%llu)", what, (unsigned long long)now.uploads,
             (unsigned long long)now.upload_bytes, (unsigned long long)now.downloads,
             (unsigned long long)now.download_bytes, (unsigned long long)up,
             (unsigned long long)up_bytes, (unsigned long long)down,
             (unsigned long long)down_bytes);
}

static void test_transfer_counts(void **state) {
  vspec_dev *dev = gt_gpu(VS_PRECISION_FP32);
  const vspec_ops *o = vs_dev_ops(dev);
  /* around the staging size (1 MiB): staged, exactly staged, and the pageable path */
  static const size_t sizes[] = {4, 1000, 65536, (size_t)1 << 20, ((size_t)1 << 20) + 4,
                                 (size_t)3 << 20, 12};
  vs_dev_counters before;
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t bytes = sizes[s];
    unsigned char *src = (unsigned char *)malloc(bytes), *back = (unsigned char *)malloc(bytes);
    if (!src || !back) abort();
    for (size_t i = 0; i < bytes; i++) src[i] = (unsigned char)(i * 131 + s * 7 + 1);
    memset(back, 0, bytes);
    void *d = o->alloc(dev, bytes);
    assert_non_null(d);
    vs_dev_counters_get(dev, &before);
    assert_int_equal(o->upload(dev, d, src, bytes), VSPEC_OK);
    expect_counts(dev, &before, 1, bytes, 0, 0, "upload");
    vs_dev_counters_get(dev, &before);
    assert_int_equal(o->download(dev, back, d, bytes), VSPEC_OK);
    expect_counts(dev, &before, 0, 0, 1, bytes, "download");
    assert_memory_equal(back, src, bytes);
    /* a source changed right after upload returned does not change what arrived */
    vs_dev_counters_get(dev, &before);
    assert_int_equal(o->upload(dev, d, src, bytes), VSPEC_OK);
    memset(src, 0, bytes);
    assert_int_equal(o->download(dev, back, d, bytes), VSPEC_OK);
    expect_counts(dev, &before, 1, bytes, 1, bytes, "upload then download");
    assert_int_not_equal(memcmp(back, src, bytes), 0);
    for (size_t i = 0; i < bytes; i++)
      if (back[i] != (unsigned char)(i * 131 + s * 7 + 1))
        fail_msg("%zu bytes: byte %zu came back as %u", bytes, i, back[i]);
    o->free(dev, d);
    free(src), free(back);
  }
  /* empty transfers count nothing; alloc and free count nothing */
  vs_dev_counters_get(dev, &before);
  void *d = o->alloc(dev, 4096), *u = o->alloc_uninit(dev, 4096);
  unsigned char tiny[4] = {0};
  assert_int_equal(o->upload(dev, d, tiny, 0), VSPEC_OK);
  assert_int_equal(o->download(dev, tiny, d, 0), VSPEC_OK);
  o->free(dev, d), o->free(dev, u);
  expect_counts(dev, &before, 0, 0, 0, 0, "alloc, empty transfers, free");
  /* uploads inside ops: a host array is uploaded when it changed, not otherwise */
  float table[(NCOND + GRID * GRID) * HD], x[NQ * DIM];
  o->rope2d_table(NCOND, GRID, HD, 10000.0f, table);
  for (int i = 0; i < NQ * DIM; i++) x[i] = (float)(i % 17) * 0.25f - 2.0f;
  float *dt = gt_up(dev, table, sizeof table / sizeof(float)), *dx = gt_up(dev, x, NQ * DIM);
  int32_t pos[NQ] = {0, 5, 9, 11, 20, 30, 40, 66};
  vs_dev_counters_get(dev, &before);
  o->rope_apply(dev, dx, NQ, DIM, H, HD, pos, dt);
  expect_counts(dev, &before, 1, sizeof pos, 0, 0, "rope_apply, new positions");
  vs_dev_counters_get(dev, &before);
  o->rope_apply(dev, dx, NQ, DIM, H, HD, pos, dt);
  expect_counts(dev, &before, 0, 0, 0, 0, "rope_apply, the same positions");
  pos[3] = 12;
  vs_dev_counters_get(dev, &before);
  o->rope_apply(dev, dx, NQ, DIM, H, HD, pos, dt);
  expect_counts(dev, &before, 1, sizeof pos, 0, 0, "rope_apply, changed positions");
  /* downloads inside ops: argmax reads the row on the host */
  vs_dev_counters_get(dev, &before);
  int am = o->argmax(dev, dx, NQ * DIM);
  expect_counts(dev, &before, 0, 0, 1, (uint64_t)NQ * DIM * sizeof(float), "argmax");
  float *h = gt_down(dev, dx, NQ * DIM);
  int want = 0;
  for (int i = 1; i < NQ * DIM; i++)
    if (h[i] > h[want]) want = i;
  assert_int_equal(am, want);
  free(h);
  o->free(dev, dt), o->free(dev, dx);
  vs_dev_destroy(dev);
}

int main(void) {
  make_inputs();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_transfer_counts),
      cmocka_unit_test(test_alloc_zero_other_context),
      cmocka_unit_test(test_concurrent_fp32),
      cmocka_unit_test(test_concurrent_bf16),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  free(g_in);
  return rc;
}
