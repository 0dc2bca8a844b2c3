/*
 * kernels/cuda/cuda_attention.cu - masked multi-head attention of a few queries over the
 * KV cache (the semantics of vspec_ops.attention; PyTorch scaled_dot_product_attention with
 * a boolean mask, as LlamaGen's gpt.py calls it).
 *
 * One block per (query, head): the block scores every visible slot into shared memory,
 * takes a stable softmax (sum in double, as the CPU) and sums the weighted values, one
 * thread per output channel. Masked slots never contribute, also when they hold inf or NaN
 * (never written); a query that sees no slot yields zeros. Split-K over the slots
 * (flash-decoding) is the next step for long caches; at LlamaGen's few hundred slots per
 * image one block per (query, head) keeps the kernel simple.
 */
#include <math.h>

#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_reduce.h"

#define VS_ATT_THREADS 128
/* Scores live in shared memory: 12k slots fit the default 48 KiB. */
#define VS_ATT_MAX_SLOTS 12000

__global__ void vs_k_attention(const float *q, int q_stride, int n_heads, int group,
                               int head_dim, const float *k, const float *v, int slot_stride,
                               int n_kv, const uint8_t *mask, float scale, float *out) {
  extern __shared__ float s[]; /* [n_kv] */
  __shared__ float fred[32];
  __shared__ double dred[32];
  int i = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  size_t g = (size_t)(h / group);
  const float *qh = q + (size_t)i * q_stride + (size_t)h * head_dim;
  const float *kh = k + g * (size_t)slot_stride * head_dim;
  const float *vh = v + g * (size_t)slot_stride * head_dim;
  const uint8_t *mrow = mask ? mask + (size_t)i * n_kv : NULL;
  float *oh = out + (size_t)i * n_heads * head_dim + (size_t)h * head_dim;

  float local_max = -INFINITY;
  for (int j = threadIdx.x; j < n_kv; j += blockDim.x) {
    if (mrow && !mrow[j]) {
      s[j] = -INFINITY;
      continue;
    }
    const float *kj = kh + (size_t)j * head_dim;
    float dot = 0.0f;
    for (int c = 0; c < head_dim; c++) dot += qh[c] * kj[c];
    s[j] = scale * dot;
    local_max = fmaxf(local_max, s[j]);
  }
  float mx = vs_block_max(local_max, fred);
  if (mx == -INFINITY) { /* nothing visible (a NaN score also ends here, as -inf) */
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) oh[c] = 0.0f;
    return;
  }
  double local_sum = 0.0;
  for (int j = threadIdx.x; j < n_kv; j += blockDim.x) {
    float e = (mrow && !mrow[j]) ? 0.0f : expf(s[j] - mx);
    s[j] = e;
    local_sum += e;
  }
  float fsum = (float)vs_block_dsum(local_sum, dred); /* >= 1: the maximum gives exp(0) */
  for (int j = threadIdx.x; j < n_kv; j += blockDim.x) s[j] /= fsum;
  __syncthreads();
  for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < n_kv; j++)
      if (!mrow || mrow[j]) acc += s[j] * vh[(size_t)j * head_dim + c];
    oh[c] = acc;
  }
}

void vs_cuda_attention(vspec_dev *dev, const float *q, int n_q, int q_stride, int n_heads,
                       int n_kv_heads, int head_dim, const float *k, const float *v,
                       int slot_stride, int n_kv, const uint8_t *mask, float *out) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (n_q <= 0 || n_heads <= 0 || head_dim <= 0 || d->failed || !vs_cuda_enter(d)) return;
  if (n_kv <= 0) {
    vs_cuda_check_rt(d, cudaMemsetAsync(out, 0, (size_t)n_q * n_heads * head_dim * sizeof(float),
                                        d->stream), "attention (no slots)");
    return;
  }
  if (n_kv > VS_ATT_MAX_SLOTS) {
    vs_cuda_fail(d, VSPEC_ERANGE, "cuda:%d: attention over %d slots exceeds the kernel's %d",
                 d->head.index, n_kv, VS_ATT_MAX_SLOTS);
    return;
  }
  if (n_kv_heads <= 0) n_kv_heads = n_heads;
  int group = n_heads / n_kv_heads;
  if (group < 1) group = 1;
  const uint8_t *mask_dev = NULL;
  if (mask && !(mask_dev = vs_cuda_stage_mask(d, mask, (size_t)n_q * n_kv))) return;
  float scale = (float)(1.0 / sqrt((double)head_dim));
  vs_k_attention<<<(unsigned)n_q * n_heads, VS_ATT_THREADS, (size_t)n_kv * sizeof(float),
                   d->stream>>>(q, q_stride, n_heads, group, head_dim, k, v, slot_stride, n_kv,
                                mask_dev, scale, out);
  VS_CUDA_LAUNCHED(d, "attention");
}
