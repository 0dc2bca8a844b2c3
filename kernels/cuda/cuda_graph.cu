/*
 * kernels/cuda/cuda_graph.cu - ABI 1.5 graphs on CUDA (include/vspec/ops.h, graph_begin):
 * stream capture on the context's non-blocking stream, one cudaGraphExec_t per graph.
 *
 * A decode step at batch 1 is bound by launches (about 10 per layer with the fused ops of
 * ABI 1.4); one cudaGraphLaunch replays them all (CUDA programming guide, "CUDA Graphs").
 * The capture is thread-local (cudaStreamCaptureModeThreadLocal): other workers' threads
 * keep allocating and synchronising while this one records, and this thread's own unsafe
 * calls fail its capture. Nothing a captured op does may allocate, wait or copy from the
 * host: the fused ops read every per-step value from device memory, the scratch and cuBLAS
 * workspace are fixed before (reserve_scratch, cuda_module.cu), the bf16 weights are
 * converted at their first eager use, and each place that would allocate or wait refuses
 * while capturing (vs_cuda_refuse_in_capture) so that graph_end reports why instead of the
 * context failing for good.
 */
#include <stdlib.h>

#include "kernels/cuda/cuda_dev.h"

typedef struct vs_cuda_graph {
  cudaGraphExec_t exec;
  unsigned scratch_gen; /* the context's at the capture: its kernels hold that scratch */
} vs_cuda_graph;

int vs_cuda_graph_begin(vspec_dev *dev) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (d->capturing) return VSPEC_EBUSY;
  if (d->failed) return d->fail_status;
  if (!vs_cuda_enter(d)) return d->fail_status;
  cudaError_t e = cudaStreamBeginCapture(d->stream, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* no capture: the caller runs eagerly, the context is fine */
    return VSPEC_ENOTSUP;
  }
  d->capturing = 1;
  d->capture_status = VSPEC_OK;
  d->capture_error[0] = '\0';
  return VSPEC_OK;
}

int vs_cuda_graph_end(vspec_dev *dev, vspec_graph **graph) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (graph) *graph = NULL;
  if (!d->capturing) return VSPEC_EINVAL;
  (void)vs_cuda_enter(d);
  cudaGraph_t g = NULL;
  cudaError_t e = cudaStreamEndCapture(d->stream, &g);
  d->capturing = 0;
  int rc = d->capture_status;
  if (rc == VSPEC_OK && e != cudaSuccess) rc = VSPEC_ENOTSUP; /* invalidated */
  cudaGraphExec_t exec = NULL;
  if (rc == VSPEC_OK && graph) {
    e = cudaGraphInstantiate(&exec, g, 0);
    if (e != cudaSuccess) rc = e == cudaErrorMemoryAllocation ? VSPEC_ENOMEM : VSPEC_ENOTSUP;
  }
  if (g) cudaGraphDestroy(g); /* the executable graph keeps what it needs */
  if (e != cudaSuccess) (void)cudaGetLastError(); /* a failed capture is not the context's */
  if (rc == VSPEC_OK && !graph) rc = VSPEC_EINVAL;
  vs_cuda_graph *h = NULL;
  if (rc == VSPEC_OK && !(h = (vs_cuda_graph *)malloc(sizeof *h))) rc = VSPEC_ENOMEM;
  if (rc != VSPEC_OK) {
    if (exec) cudaGraphExecDestroy(exec);
    return rc;
  }
  h->exec = exec;
  h->scratch_gen = d->scratch_gen; /* a growth would have failed the capture (cm_grow) */
  *graph = (vspec_graph *)(void *)h;
  return VSPEC_OK;
}

int vs_cuda_graph_launch(vspec_dev *dev, vspec_graph *graph) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (!graph) return VSPEC_ENOENT;
  if (d->capturing) return VSPEC_EBUSY;
  if (d->failed) return d->fail_status;
  if (!vs_cuda_enter(d)) return d->fail_status;
  const vs_cuda_graph *h = (const vs_cuda_graph *)(const void *)graph;
  /* The scratch it was captured with has been freed since (a larger op grew it): its kernels
   * would read and write freed memory. The caller frees it and records again. */
  if (h->scratch_gen != d->scratch_gen) return VSPEC_ENOENT;
  if (!vs_cuda_check_rt(d, cudaGraphLaunch(h->exec, d->stream), "cudaGraphLaunch"))
    return d->fail_status;
  return VSPEC_OK;
}

void vs_cuda_graph_free(vspec_dev *dev, vspec_graph *graph) {
  vs_cuda_dev *d = vs_cuda(dev);
  vs_cuda_graph *h = (vs_cuda_graph *)(void *)graph;
  if (!h) return;
  /* a launch still queued must not outlive its graph: wait (at session close, not a step);
   * not for a stale one, whose launches all ran before the scratch grew (cm_grow waited) */
  if (h->scratch_gen == d->scratch_gen && vs_cuda_enter(d))
    (void)vs_cuda_wait(d, "graph free (wait)");
  if (cudaGraphExecDestroy(h->exec) != cudaSuccess) (void)cudaGetLastError();
  free(h);
}
