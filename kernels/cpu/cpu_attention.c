/*
 * kernels/cpu/cpu_attention.c - masked multi-head attention over a KV cache (LlamaGen
 * gpt.py, Attention.forward: PyTorch scaled_dot_product_attention with a boolean mask).
 *
 * Per query head: S = Q_h K_g^T / sqrt(hd) by sgemm into scratch, masked stable softmax
 * row by row, O_h = W V_g by sgemm straight into the output. Queries are processed in
 * chunks sized to the scratch arena, so only one row of scores (n_kv floats) is ever
 * required and the arena never has to grow for realistic cache lengths.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_dev.h"

static int row_has_visible(const uint8_t *mask_row, int n_kv) {
  if (!mask_row) return 1;
  for (int j = 0; j < n_kv; j++)
    if (mask_row[j]) return 1;
  return 0;
}

/* In place on scores s[0..n_kv): masked entries -> 0, the rest -> softmax weights.
 * Returns 0 (and zeros the row) when nothing is visible. */
static int masked_softmax_row(float *s, const uint8_t *mask_row, int n_kv) {
  float mx = -INFINITY;
  int any = 0;
  for (int j = 0; j < n_kv; j++) {
    if (mask_row && !mask_row[j]) continue;
    if (!any || s[j] > mx) mx = s[j];
    any = 1;
  }
  if (!any) {
    memset(s, 0, (size_t)n_kv * sizeof(float));
    return 0;
  }
  double sum = 0.0;
  for (int j = 0; j < n_kv; j++) {
    if (mask_row && !mask_row[j]) {
      s[j] = 0.0f;
      continue;
    }
    float e = expf(s[j] - mx);
    s[j] = e;
    sum += e;
  }
  float fsum = (float)sum; /* >= 1: the maximum contributes exp(0) */
  for (int j = 0; j < n_kv; j++) s[j] /= fsum;
  return 1;
}

void vs_cpu_attention(vspec_dev *dev, const float *q, int n_q, int q_stride, int n_heads,
                      int n_kv_heads, int head_dim, const float *k, const float *v,
                      int slot_stride, int n_kv, const uint8_t *mask, float *out) {
  if (n_q <= 0 || n_heads <= 0 || head_dim <= 0) return;
  size_t out_stride = (size_t)n_heads * head_dim;
  if (n_kv <= 0) { /* nothing to attend to: every row is "fully masked" */
    memset(out, 0, (size_t)n_q * out_stride * sizeof(float));
    return;
  }
  if (n_kv_heads <= 0) n_kv_heads = n_heads;
  int group = n_heads / n_kv_heads; /* query heads per kv head (repeat_interleave) */
  if (group < 1) group = 1;
  float scale = (float)(1.0 / sqrt((double)head_dim));

  size_t row_bytes = (size_t)n_kv * sizeof(float);
  size_t fit = vs_scratch_size(dev) / row_bytes;
  int chunk = fit < 1 ? 1 : (fit < (size_t)n_q ? (int)fit : n_q);
  float *s = vs_scratch(dev, (size_t)chunk * row_bytes);

  for (int h = 0; h < n_heads; h++) {
    size_t g = (size_t)(h / group);
    const float *kh = k + g * (size_t)slot_stride * head_dim;
    const float *vh = v + g * (size_t)slot_stride * head_dim;
    for (int i0 = 0; i0 < n_q; i0 += chunk) {
      int nc = n_q - i0 < chunk ? n_q - i0 : chunk;
      const float *qh = q + (size_t)i0 * q_stride + (size_t)h * head_dim;
      float *oh = out + (size_t)i0 * out_stride + (size_t)h * head_dim;
      vs_sgemm(dev, 0, 1, nc, n_kv, head_dim, scale, qh, q_stride, kh, head_dim, 0.0f, s, n_kv);
      for (int i = 0; i < nc; i++)
        masked_softmax_row(s + (size_t)i * n_kv, mask ? mask + (size_t)(i0 + i) * n_kv : NULL,
                           n_kv);
      vs_sgemm(dev, 0, 0, nc, head_dim, n_kv, 1.0f, s, n_kv, vh, head_dim, 0.0f, oh,
               (int)out_stride);
      /* A zero weight row already gives zeros, unless a masked (e.g. never written) slot
       * holds inf/NaN, where 0 * inf poisons the sum; the contract promises zeros. */
      if (mask) {
        for (int i = 0; i < nc; i++)
          if (!row_has_visible(mask + (size_t)(i0 + i) * n_kv, n_kv))
            memset(oh + (size_t)i * out_stride, 0, (size_t)head_dim * sizeof(float));
      }
    }
  }
}
