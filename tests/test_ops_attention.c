/* tests/test_ops_attention.c - masked multi-head attention with GQA (LlamaGen gpt.py,
 * Attention.forward; kv head = h / (H / Hkv), repeat_interleave). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "kernels/cpu/cpu_dev.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/support/kernels_testutil.h"

typedef struct {
  int n_q, q_stride, n_heads, n_kv_heads, hd, slot_stride, n_kv;
} shape;

static void ref_attention(const shape *s, const float *q, const float *k, const float *v,
                          const uint8_t *mask, double *out) {
  int group = s->n_heads / s->n_kv_heads;
  double *w = vt_malloc((size_t)s->n_kv * sizeof(double));
  for (int i = 0; i < s->n_q; i++) {
    for (int h = 0; h < s->n_heads; h++) {
      int g = h / group;
      const float *qi = q + (size_t)i * s->q_stride + (size_t)h * s->hd;
      double *o = out + ((size_t)i * s->n_heads + h) * s->hd;
      double mx = -INFINITY;
      int any = 0;
      for (int j = 0; j < s->n_kv; j++) {
        if (mask && !mask[(size_t)i * s->n_kv + j]) continue;
        const float *kj = k + ((size_t)g * s->slot_stride + j) * s->hd;
        double d = 0;
        for (int t = 0; t < s->hd; t++) d += (double)qi[t] * kj[t];
        w[j] = d / sqrt((double)s->hd);
        if (!any || w[j] > mx) mx = w[j];
        any = 1;
      }
      for (int t = 0; t < s->hd; t++) o[t] = 0;
      if (!any) continue;
      double z = 0;
      for (int j = 0; j < s->n_kv; j++) {
        if (mask && !mask[(size_t)i * s->n_kv + j]) continue;
        w[j] = exp(w[j] - mx);
        z += w[j];
      }
      for (int j = 0; j < s->n_kv; j++) {
        if (mask && !mask[(size_t)i * s->n_kv + j]) continue;
        const float *vj = v + ((size_t)g * s->slot_stride + j) * s->hd;
        for (int t = 0; t < s->hd; t++) o[t] += w[j] / z * vj[t];
      }
    }
  }
  free(w);
}

enum { MASK_NONE, MASK_RANDOM, MASK_CAUSAL };

static void check(const shape *s, int mask_kind, uint64_t seed) {
  vspec_dev *dev = vt_dev(1);
  vspec_rng rng;
  vs_rng_init(&rng, seed, 0);
  size_t nq = (size_t)s->n_q * s->q_stride;
  size_t nk = (size_t)s->n_kv_heads * s->slot_stride * s->hd;
  size_t no = (size_t)s->n_q * s->n_heads * s->hd;
  float *q = vt_malloc(nq * sizeof(float)), *k = vt_malloc(nk * sizeof(float));
  float *v = vt_malloc(nk * sizeof(float)), *out = vt_malloc(no * sizeof(float));
  double *ref = vt_malloc(no * sizeof(double));
  vt_fill(&rng, q, nq, -2, 2);
  vt_fill(&rng, k, nk, -2, 2);
  vt_fill(&rng, v, nk, -1, 1);
  uint8_t *mask = NULL;
  if (mask_kind != MASK_NONE) {
    mask = vt_malloc((size_t)s->n_q * s->n_kv);
    for (int i = 0; i < s->n_q; i++)
      for (int j = 0; j < s->n_kv; j++)
        mask[(size_t)i * s->n_kv + j] = mask_kind == MASK_CAUSAL
                                            ? (j <= s->n_kv - s->n_q + i)
                                            : (vs_rng_uniform(&rng) < 0.6);
    if (mask_kind == MASK_RANDOM && s->n_q > 2) /* one fully masked row */
      memset(mask + (size_t)1 * s->n_kv, 0, s->n_kv);
  }
  for (size_t i = 0; i < no; i++) out[i] = NAN; /* out is output only */
  ref_attention(s, q, k, v, mask, ref);
  vs_dev_ops(dev)->attention(dev, q, s->n_q, s->q_stride, s->n_heads, s->n_kv_heads, s->hd, k, v,
                             s->slot_stride, s->n_kv, mask, out);
  char what[96];
  snprintf(what, sizeof what, "attention nq %d H %d Hkv %d hd %d nkv %d mask %d", s->n_q,
           s->n_heads, s->n_kv_heads, s->hd, s->n_kv, mask_kind);
  vt_assert_close_scaled(out, ref, no, 1e-5, what);
  if (mask_kind == MASK_RANDOM && s->n_q > 2)
    for (int t = 0; t < s->n_heads * s->hd; t++)
      assert_true(out[(size_t)1 * s->n_heads * s->hd + t] == 0.0f);
  free(q);
  free(k);
  free(v);
  free(out);
  free(ref);
  free(mask);
  vs_dev_destroy(dev);
}

static void test_mha(void **state) {
  shape a = {1, 64, 4, 4, 16, 40, 33}; /* one decode query */
  for (int m = 0; m < 3; m++) check(&a, m, 1);
  shape b = {17, 4 * 16 + 3, 4, 4, 16, 40, 40}; /* padded q rows */
  for (int m = 0; m < 3; m++) check(&b, m, 2);
  shape c = {5, 2 * 64, 2, 2, 64, 264, 201};
  for (int m = 0; m < 3; m++) check(&c, m, 3);
}

static void test_gqa(void **state) {
  shape a = {6, 4 * 8, 4, 2, 8, 30, 25};
  for (int m = 0; m < 3; m++) check(&a, m, 4);
  shape b = {6, 4 * 8, 4, 1, 8, 30, 25};
  for (int m = 0; m < 3; m++) check(&b, m, 5);
  shape c = {9, 6 * 12 + 1, 6, 3, 12, 16, 16};
  for (int m = 0; m < 3; m++) check(&c, m, 6);
}

/* more score rows than the default 16 MiB scratch holds: the query loop must tile */
static void test_chunked(void **state) {
  shape a = {1100, 8, 1, 1, 8, 4096, 4096};
  check(&a, MASK_RANDOM, 7);
}

/* fully masked rows are zero even when the masked slots hold inf/NaN garbage */
static void test_fully_masked(void **state) {
  vspec_dev *dev = vt_dev(1);
  float q[2 * 8], k[4 * 8], v[4 * 8], out[2 * 8];
  for (int i = 0; i < 16; i++) q[i] = 1.0f;
  for (int i = 0; i < 32; i++) {
    k[i] = INFINITY;
    v[i] = NAN;
  }
  uint8_t mask[2 * 4] = {0};
  vs_dev_ops(dev)->attention(dev, q, 2, 8, 2, 1, 4, k, v, 4, 4, mask, out);
  for (int i = 0; i < 16; i++) assert_true(out[i] == 0.0f);
  /* n_kv = 0: nothing to attend */
  for (int i = 0; i < 16; i++) out[i] = NAN;
  vs_dev_ops(dev)->attention(dev, q, 2, 8, 2, 1, 4, k, v, 4, 0, NULL, out);
  for (int i = 0; i < 16; i++) assert_true(out[i] == 0.0f);
  vs_dev_destroy(dev);
}

/* a masked slot whose key is huge must not take part in the softmax's max shift */
static void test_masked_huge_key(void **state) {
  vspec_dev *dev = vt_dev(1);
  float q[4] = {1, 1, 1, 1}, k[2 * 4] = {0.5f, 0, 0, 0, INFINITY, 1e30f, 1e30f, 1e30f};
  float v[2 * 4] = {1, 2, 3, 4, 100, 100, 100, 100}, out[4];
  uint8_t mask[2] = {1, 0};
  vs_dev_ops(dev)->attention(dev, q, 1, 4, 1, 1, 4, k, v, 2, 2, mask, out);
  for (int t = 0; t < 4; t++) assert_true(out[t] == v[t]);
  vs_dev_destroy(dev);
}

/* LlamaGen's condition tokens have zero q and k (zero RoPE rows): scores are 0, so the
 * output is the plain average of the visible values */
static void test_zero_query_averages(void **state) {
  vspec_dev *dev = vt_dev(1);
  float q[4] = {0}, k[3 * 4] = {0}, v[3 * 4], out[4];
  for (int i = 0; i < 12; i++) v[i] = (float)i;
  uint8_t mask[3] = {1, 0, 1};
  vs_dev_ops(dev)->attention(dev, q, 1, 4, 1, 1, 4, k, v, 3, 3, mask, out);
  for (int t = 0; t < 4; t++) assert_true(fabsf(out[t] - (v[t] + v[8 + t]) / 2) < 1e-6f);
  vs_dev_destroy(dev);
}

/* head_dim 64 takes the vector loops of W V: every instruction set agrees with the scalar loop
 * (up to the scores, whose sums are ordered per instruction set), and a masked slot holding
 * NaN (a slot never written) is never read. */
static void test_isas_agree(void **state) {
  enum { NQ = 5, H = 2, HD = 64, NKV = 37 };
  static float q[NQ * H * HD], k[NKV * HD], v[NKV * HD], out[3][NQ * H * HD];
  uint8_t mask[NQ * NKV];
  vspec_rng rng;
  vs_rng_init(&rng, 71, 0);
  vt_fill(&rng, q, NQ * H * HD, -1, 1);
  vt_fill(&rng, k, NKV * HD, -1, 1);
  vt_fill(&rng, v, NKV * HD, -2, 2);
  for (int i = 0; i < NQ; i++)
    for (int j = 0; j < NKV; j++) mask[i * NKV + j] = (uint8_t)(j != 7 && (j + i) % 5 != 0);
  for (int d = 0; d < HD; d++) v[7 * HD + d] = NAN, k[7 * HD + d] = INFINITY;
  const int isas[] = {VS_ISA_SCALAR, VS_ISA_AVX2, VS_ISA_AVX512};
  int ran = 0;
  for (int t = 0; t < 3; t++) {
    vspec_dev *dev = vt_dev(1);
    if (vs_cpu_set_isa(dev, isas[t]) == VSPEC_OK) {
      vs_dev_ops(dev)->attention(dev, q, NQ, H * HD, H, 1, HD, k, v, NKV, NKV, mask, out[t]);
      for (int i = 0; i < NQ * H * HD; i++) assert_true(isfinite(out[t][i]));
      for (int i = 0; ran && i < NQ * H * HD; i++)
        assert_true(fabsf(out[t][i] - out[0][i]) <= 1e-5f * (1.0f + fabsf(out[0][i])));
      ran++;
    }
    vs_dev_destroy(dev);
  }
}

/* With exact scores (q and k in quarters, so every dot product and the scale are exact in any
 * order), every instruction set gives the scalar loops' bits: the softmax (vs_exp_poly, 16
 * partial sums added in a fixed tree) and W V (slot order, one fused multiply-add each), for
 * a group of four rows and a remainder, rows seeing different slots, and a tail of the row
 * shorter than a vector. head_dim 64 and 32 take the four-row loops on AVX-512; 256 and 16
 * the one-row loop in blocks of 64 and of 8 dimensions. The dot products are exact, and
 * every path multiplies each by the scale 1 / sqrt(head_dim) once (a power of two except
 * at 32), so the scores agree. head_dim 96 (a
 * block of 64, one of 32) has no exact scale: its queries are zero (every score 0, equal
 * weights), which still checks W V. */
static void check_isas_bitwise_n(int hd, int zero_q, int NKV) {
  enum { NQ = 6, H = 2, HD_MAX = 256, NKV_MAX = 203 };
  static float q[NQ * H * HD_MAX], k[NKV_MAX * HD_MAX], v[NKV_MAX * HD_MAX],
      out[3][NQ * H * HD_MAX];
  uint8_t mask[NQ * NKV_MAX];
  assert_true(NKV <= NKV_MAX && NKV > 7);
  vspec_rng rng;
  vs_rng_init(&rng, 72, 0);
  vt_fill(&rng, v, NKV * hd, -2, 2);
  for (int i = 0; i < NQ * H * hd; i++)
    q[i] = zero_q ? 0.0f : (float)((int)(vs_rng_uniform(&rng) * 9) - 4) / 4;
  for (int i = 0; i < NKV * hd; i++) k[i] = (float)((int)(vs_rng_uniform(&rng) * 9) - 4) / 4;
  for (int i = 0; i < NQ; i++)
    for (int j = 0; j < NKV; j++)
      mask[i * NKV + j] = (uint8_t)(j <= NKV - 7 + i && (j * 7 + i) % 6 != 0);
  const int isas[] = {VS_ISA_SCALAR, VS_ISA_AVX2, VS_ISA_AVX512};
  size_t n_out = (size_t)NQ * H * hd;
  int ran = 0;
  for (int t = 0; t < 3; t++) {
    vspec_dev *dev = vt_dev(1);
    if (vs_cpu_set_isa(dev, isas[t]) == VSPEC_OK) {
      vs_dev_ops(dev)->attention(dev, q, NQ, H * hd, H, 1, hd, k, v, NKV, NKV, mask, out[t]);
      if (ran) assert_memory_equal(out[t], out[0], n_out * sizeof(float));
      ran++;
    }
    vs_dev_destroy(dev);
  }
  assert_true(ran >= 1);
}

/* Rows of 203 entries take the long softmax loops; 64 and fewer (37, 16: a whole vector;
 * 9: a tail alone) the short one that keeps a row in registers. */
static void check_isas_bitwise(int hd, int zero_q) {
  const int lengths[] = {203, 64, 37, 16, 9};
  for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++)
    check_isas_bitwise_n(hd, zero_q, lengths[i]);
}

static void test_isas_agree_bitwise(void **state) {
  (void)state;
  check_isas_bitwise(64, 0);
  check_isas_bitwise(32, 0);
  check_isas_bitwise(256, 0);
  check_isas_bitwise(16, 0);
  check_isas_bitwise(96, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_mha),          cmocka_unit_test(test_gqa),
      cmocka_unit_test(test_chunked),      cmocka_unit_test(test_fully_masked),
      cmocka_unit_test(test_masked_huge_key),
      cmocka_unit_test(test_zero_query_averages),
      cmocka_unit_test(test_isas_agree),
      cmocka_unit_test(test_isas_agree_bitwise),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
