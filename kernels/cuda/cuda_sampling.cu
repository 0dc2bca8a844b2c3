/*
 * kernels/cuda/cuda_sampling.cu - the softmax family on the device; LlamaGen's logit
 * processing, sampling and argmax through the host.
 *
 * The engine samples on the host from downloaded logits (core/sampling.c), or, for an AR
 * step, has the backend draw on the device with sample_tokens (cuda_draw.cu: CFG mix,
 * temperature, top-k and top-p thresholds by radix select, softmax and the inverse-CDF draw
 * in one launch, no round trip). The ops here serve plugins that call them on device data.
 * logits_to_probs, sample and argmax download their input, run the one host implementation
 * (kernels/host/host_sampling.c) and, for logits_to_probs, upload the result: the same bits
 * as the CPU ops, at the price of a round trip (sample_tokens' kernel could serve them
 * without one where that round trip matters).
 */
#include <math.h>

#include "kernels/cuda/cuda_dev.h"
#include "kernels/cuda/cuda_reduce.h"
#include "kernels/host/host_math.h"

#define VS_SOFTMAX_THREADS 256

/* One block per row. as_log = 0: softmax (a row with no finite entry becomes zeros);
 * as_log = 1: log-softmax (such a row stays -inf). expf in float, sums in double; the host's
 * softmax (kernels/host/host_sampling.c) uses vs_exp_poly, so the two agree within a few ulps,
 * not bit for bit (tests/gpu/test_cuda_ops.c compares them with a tolerance). */
__global__ void vs_k_softmax(float *x, int n, int as_log) {
  __shared__ float fred[32];
  __shared__ double dred[32];
  float *xr = x + (size_t)blockIdx.x * n;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, xr[i]);
  mx = vs_block_max(mx, fred);
  if (!(mx > -INFINITY)) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] = as_log ? -INFINITY : 0.0f;
    return;
  }
  double sum = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    if (as_log) {
      sum += exp((double)(xr[i] - mx));
    } else {
      float e = expf(xr[i] - mx);
      xr[i] = e;
      sum += e;
    }
  }
  sum = vs_block_dsum(sum, dred);
  if (as_log) {
    float lsum = (float)::log(sum);
    for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] = (xr[i] - mx) - lsum;
  } else {
    float fsum = (float)sum;
    for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] /= fsum;
  }
}

static void cs_softmax(vspec_dev *dev, float *x, int rows, int n, int log) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (rows <= 0 || n <= 0 || d->failed || !vs_cuda_enter(d)) return;
  vs_k_softmax<<<rows, VS_SOFTMAX_THREADS, 0, d->stream>>>(x, n, log);
  VS_CUDA_LAUNCHED(d, log ? "log_softmax" : "softmax");
}

void vs_cuda_softmax(vspec_dev *dev, float *x, int rows, int n) { cs_softmax(dev, x, rows, n, 0); }

void vs_cuda_log_softmax(vspec_dev *dev, float *x, int rows, int n) {
  cs_softmax(dev, x, rows, n, 1);
}

int vs_cuda_logits_to_probs(vspec_dev *dev, const float *logits, int n, float temperature,
                            int top_k, float top_p, float *probs) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (n <= 0) return 0;
  float *h = vs_cuda_host_floats(d, 2 * (size_t)n);
  void *work = vs_cuda_host_work(d, vs_host_probs_work_bytes(n));
  if (!h || !work) {
    vs_cuda_fail(d, VSPEC_ENOMEM, "cuda:%d: logits_to_probs: out of host memory", d->head.index);
    return 0;
  }
  if (vs_cuda_download(dev, h, logits, (size_t)n * sizeof(float))) return 0;
  int nonzero = vs_host_logits_to_probs(h, n, temperature, top_k, top_p, h + n, work);
  if (vs_cuda_upload(dev, probs, h + n, (size_t)n * sizeof(float))) return 0;
  return nonzero;
}

int vs_cuda_sample(vspec_dev *dev, const float *probs, int n, double u) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (n <= 0) return -1;
  float *h = vs_cuda_host_floats(d, (size_t)n);
  if (!h) vs_cuda_fail(d, VSPEC_ENOMEM, "cuda:%d: sample: out of host memory", d->head.index);
  if (!h || vs_cuda_download(dev, h, probs, (size_t)n * sizeof(float))) return -1;
  return vs_host_sample(h, n, u);
}

int vs_cuda_argmax(vspec_dev *dev, const float *x, int n) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (n <= 0) return -1;
  float *h = vs_cuda_host_floats(d, (size_t)n);
  if (!h) vs_cuda_fail(d, VSPEC_ENOMEM, "cuda:%d: argmax: out of host memory", d->head.index);
  if (!h || vs_cuda_download(dev, h, x, (size_t)n * sizeof(float))) return 0;
  return vs_host_argmax(h, n);
}
