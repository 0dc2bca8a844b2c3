/*
 * kernels/cpu/cpu_sampling.c - the distribution ops of the CPU device: the host
 * implementations of kernels/host/ on device (= host) memory, with the device's scratch
 * arena as their work space.
 */
#include "kernels/cpu/cpu_dev.h"
#include "kernels/host/host_math.h"

void vs_cpu_softmax(vspec_dev *dev, float *x, int rows, int n) { vs_host_softmax(x, rows, n); }

void vs_cpu_log_softmax(vspec_dev *dev, float *x, int rows, int n) {
  vs_host_log_softmax(x, rows, n);
}

int vs_cpu_argmax(vspec_dev *dev, const float *x, int n) { return vs_host_argmax(x, n); }

int vs_cpu_logits_to_probs(vspec_dev *dev, const float *logits, int n, float temperature,
                           int top_k, float top_p, float *probs) {
  /* Only top-k and top-p need the work space; the scratch arena is not touched otherwise. */
  void *work = NULL;
  if (n > 0 && ((top_k > 0 && top_k < n) || top_p < 1.0f))
    work = vs_scratch(dev, vs_host_probs_work_bytes(n));
  return vs_host_logits_to_probs(logits, n, temperature, top_k, top_p, probs, work);
}

int vs_cpu_sample(vspec_dev *dev, const float *probs, int n, double u) {
  return vs_host_sample(probs, n, u);
}
