/*
 * kernels/cuda/cuda_module.cu - the CUDA device class, the one symbol libvspec-cuda.so
 * exports (kernels/vs_device.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_dev.h"

static int cuda_count(char *err, size_t errlen) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "no CUDA device: %s%s", cudaGetErrorString(e),
             e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice
                 ? " (no NVIDIA GPU or driver on this machine?)" : "");
    (void)cudaGetLastError();
    return 0;
  }
  if (n == 0) snprintf(err, errlen, "no CUDA device: the driver reports none");
  return n;
}

static void cuda_close(vspec_dev *dev) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (!d) return;
  /* The stream, handle and buffers belong to the context's GPU, which need not be current
   * on the closing thread. */
  if (cudaSetDevice(d->head.index) != cudaSuccess) (void)cudaGetLastError();
  if (d->capturing) { /* a capture left open (graph_begin without graph_end): drop it */
    cudaGraph_t g = NULL;
    if (cudaStreamEndCapture(d->stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
    d->capturing = 0;
  }
  if (d->stream) cudaStreamSynchronize(d->stream);
  /* The context's own buffers go back through the allocation table. */
  void *bufs[] = {d->scratch, d->pos_dev, d->mask_dev};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
    if (bufs[i]) vs_cuda_free(dev, bufs[i]);
  if (d->blas) cublasDestroy(d->blas);
  /* after the handle that uses it; the stream was waited for above */
  if (d->blas_ws) cudaFree(d->blas_ws);
  if (d->order_ev) cudaEventDestroy(d->order_ev);
  if (d->stream) cudaStreamDestroy(d->stream);
  if (d->staging) cudaFreeHost(d->staging); /* idle: every copy through it was waited for */
  /* idle too: the stream, which queued the ring's copies, was waited for above */
  for (int i = 0; i < VS_CUDA_UP_SLOTS; i++)
    if (d->up_ev[i]) cudaEventDestroy(d->up_ev[i]);
  if (d->up_ring) cudaFreeHost(d->up_ring);
  free(d->pos_host);
  free(d->mask_host);
  free(d->host_f);
  free(d->host_work);
  free(d);
  (void)cudaGetLastError(); /* nothing of a closed context may surface in another one */
}

static const vs_device_class *cuda_class_ptr(void);

/* The upload ring (cuda_dev.h): page-locked slots and their events. Only a speed-up: where
 * the host will not pin the memory or an event cannot be made, uploads wait for their copy. */
static void cuda_open_up_ring(vs_cuda_dev *d) {
  void *ring = NULL;
  if (cudaHostAlloc(&ring, VS_CUDA_UP_SLOTS * VS_CUDA_UP_SLOT_BYTES, cudaHostAllocDefault) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  for (int i = 0; i < VS_CUDA_UP_SLOTS; i++)
    if (cudaEventCreateWithFlags(&d->up_ev[i], cudaEventDisableTiming) != cudaSuccess) {
      (void)cudaGetLastError();
      for (int j = 0; j < i; j++) cudaEventDestroy(d->up_ev[j]);
      memset(d->up_ev, 0, sizeof d->up_ev);
      cudaFreeHost(ring);
      return;
    }
  d->up_ring = (unsigned char *)ring;
}

/* Built with the module's -gencode list like every other kernel: whether the device can run
 * it tells whether this build has code for the GPU. */
__global__ void vs_k_probe(void) {}

/* The kernel switches, read from the environment when a device opens (A/B runs of
 * tools/gpu/check.sh): VSPEC_CUDA_ATTENTION=generic takes the generic tree-attention kernel
 * at every head size (cuda_tree_attention.cu), auto (or unset) the latency-bound one where it
 * applies; VSPEC_CUDA_PDL=off launches every kernel plainly, auto (or unset) the decode
 * kernels with programmatic dependent launch on sm_90+ (cuda_dev.h, vs_cuda_launch);
 * VSPEC_CUDA_ROPE=separate runs norm_qkv_rope's RoPE and stores as a kernel of their own,
 * auto (or unset) in the few-row product's epilogue where it applies (cuda_fused.cu).
 * Nonzero for a value none knows. */
typedef struct cuda_switch_set {
  int tatt_generic, pdl_off, rope_separate;
} cuda_switch_set;

static int cuda_switch(const char *name, const char *alt, int *on, char *err, size_t errlen) {
  const char *v = getenv(name);
  *on = v && strcmp(v, alt) == 0;
  if (!v || !*v || strcmp(v, "auto") == 0 || *on) return 0;
  snprintf(err, errlen, "%s=%s: use auto or %s", name, v, alt);
  return 1;
}

static int cuda_switches(cuda_switch_set *sw, char *err, size_t errlen) {
  return cuda_switch("VSPEC_CUDA_ATTENTION", "generic", &sw->tatt_generic, err, errlen) ||
         cuda_switch("VSPEC_CUDA_PDL", "off", &sw->pdl_off, err, errlen) ||
         cuda_switch("VSPEC_CUDA_ROPE", "separate", &sw->rope_separate, err, errlen);
}

static int cuda_open(const vs_device_options *opt, vspec_dev **out, char *err, size_t errlen) {
  *out = NULL;
  char why[VSPEC_ERRLEN] = "";
  int n = cuda_count(why, sizeof why);
  if (n <= 0) {
    snprintf(err, errlen, "%s", why);
    return VSPEC_ENOTSUP;
  }
  if (opt->index < 0 || opt->index >= n) {
    snprintf(err, errlen, "CUDA device %d does not exist: this machine has %d (cuda:0..cuda:%d)",
             opt->index, n, n - 1);
    return VSPEC_ERANGE;
  }
  if (opt->precision != VS_PRECISION_DEFAULT && opt->precision != VS_PRECISION_FP32 &&
      opt->precision != VS_PRECISION_BF16) {
    snprintf(err, errlen, "CUDA device: unknown precision %d", opt->precision);
    return VSPEC_EINVAL;
  }
  cuda_switch_set sw;
  if (cuda_switches(&sw, err, errlen)) return VSPEC_EINVAL;
  cudaError_t e = cudaSetDevice(opt->index);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* or the thread's next launch, in any context, reports it */
    snprintf(err, errlen, "cuda:%d: cannot use the device: %s", opt->index, cudaGetErrorString(e));
    return VSPEC_EDEVICE;
  }
  /* A GPU older than the build's architectures (sm_80+ by default) would open fine and
   * then fail every launch of the first forward: say so here. */
  cudaFuncAttributes fa;
  if ((e = cudaFuncGetAttributes(&fa, vs_k_probe)) != cudaSuccess) {
    (void)cudaGetLastError();
    cudaDeviceProp prop;
    int major = 0, minor = 0;
    if (cudaGetDeviceProperties(&prop, opt->index) == cudaSuccess)
      major = prop.major, minor = prop.minor;
    (void)cudaGetLastError();
    int no_image = e == cudaErrorInvalidDeviceFunction || e == cudaErrorNoKernelImageForDevice;
    if (no_image)
      snprintf(err, errlen, "cuda:%d (sm_%d%d): the CUDA module has no code for this GPU (%s); "
               "rebuild it with CUDA_ARCH naming this architecture", opt->index, major, minor,
               cudaGetErrorString(e));
    else
      snprintf(err, errlen, "cuda:%d: cannot use the device: %s", opt->index,
               cudaGetErrorString(e));
    return no_image ? VSPEC_ENOTSUP : VSPEC_EDEVICE;
  }
  vs_cuda_dev *d = (vs_cuda_dev *)calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, errlen, "out of memory");
    return VSPEC_ENOMEM;
  }
  d->head.ops = vs_cuda_ops();
  d->head.cls = cuda_class_ptr();
  d->head.index = opt->index;
  d->precision = opt->precision == VS_PRECISION_FP32 ? VS_PRECISION_FP32 : VS_PRECISION_BF16;
  d->tatt_generic = sw.tatt_generic;
  d->rope_epilogue = !sw.rope_separate;
  int cc_major = 0;
  if (cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, opt->index) !=
      cudaSuccess)
    (void)cudaGetLastError();
  /* griddepcontrol is in the kernels only where they were compiled for sm_90+ (a build
   * whose CUDA_ARCH lacks it would launch kernels that do not wait) */
  d->pdl = cc_major >= 9 && fa.ptxVersion >= 90 && !sw.pdl_off;
  if (!(d->gpu = vs_cuda_gpu_get(opt->index, opt->memory_limit, err, errlen))) {
    free(d);
    return VSPEC_ENOMEM;
  }
  /* A non-blocking stream: no implicit ordering with the legacy default stream, so that
   * this context neither waits for nor holds up the other contexts of the GPU (cuda_dev.h). */
  cublasStatus_t bs = CUBLAS_STATUS_SUCCESS;
  if ((e = cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking)) != cudaSuccess ||
      (e = cudaEventCreateWithFlags(&d->order_ev, cudaEventDisableTiming)) != cudaSuccess ||
      (bs = cublasCreate(&d->blas)) != CUBLAS_STATUS_SUCCESS ||
      (bs = cublasSetStream(d->blas, d->stream)) != CUBLAS_STATUS_SUCCESS ||
      /* parity: no TF32 and no reduced-precision reductions in fp32 products */
      (bs = cublasSetMathMode(d->blas, CUBLAS_PEDANTIC_MATH)) != CUBLAS_STATUS_SUCCESS) {
    (void)cudaGetLastError();
    snprintf(err, errlen, "cuda:%d: cannot create a stream and a cuBLAS handle: %s",
             opt->index, e != cudaSuccess ? cudaGetErrorString(e) : "cuBLAS initialisation failed");
    cuda_close((vspec_dev *)(void *)d);
    return e == cudaErrorMemoryAllocation || bs == CUBLAS_STATUS_ALLOC_FAILED ? VSPEC_ENOMEM
                                                                               : VSPEC_EDEVICE;
  }
  /* A workspace of the handle's own, so that no GEMM allocates while it runs (a graph
   * capture forbids it) and cuBLAS stays bit for bit reproducible while other contexts'
   * streams run GEMMs too (its default pool is shared between streams). After
   * cublasSetStream, which resets the workspace to the default pool. */
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, opt->index) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    major = 0;
  }
  d->blas_ws_bytes = major >= 9 ? VS_CUDA_BLAS_WS_SM90 : VS_CUDA_BLAS_WS;
  if ((e = cudaMalloc(&d->blas_ws, d->blas_ws_bytes)) != cudaSuccess ||
      (bs = cublasSetWorkspace(d->blas, d->blas_ws, d->blas_ws_bytes)) !=
          CUBLAS_STATUS_SUCCESS) {
    (void)cudaGetLastError();
    if (e != cudaSuccess) d->blas_ws = NULL;
    snprintf(err, errlen, "cuda:%d: cannot set up a %zu-byte cuBLAS workspace: %s", opt->index,
             d->blas_ws_bytes, e != cudaSuccess ? cudaGetErrorString(e) : "cublasSetWorkspace failed");
    cuda_close((vspec_dev *)(void *)d);
    return e == cudaErrorMemoryAllocation ? VSPEC_ENOMEM : VSPEC_EDEVICE;
  }
  /* Page-locked staging for small transfers (vs_cuda_upload, vs_cuda_download). Only a
   * speed-up: where the host will not pin the memory, transfers take the pageable path. */
  void *staging = NULL;
  if (cudaHostAlloc(&staging, VS_CUDA_STAGING_BYTES, cudaHostAllocDefault) == cudaSuccess) {
    d->staging = (unsigned char *)staging;
    d->staging_bytes = VS_CUDA_STAGING_BYTES;
  } else {
    (void)cudaGetLastError();
  }
  cuda_open_up_ring(d);
  *out = (vspec_dev *)(void *)d;
  return VSPEC_OK;
}

static int cuda_info(vspec_dev *dev, vs_device_info *out) {
  vs_cuda_dev *d = vs_cuda(dev);
  out->kind = VSPEC_DEVICE_CUDA;
  out->index = d->head.index;
  out->precision = d->precision;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, d->head.index) == cudaSuccess) {
    snprintf(out->name, sizeof out->name, "%s (cuda:%d, sm_%d%d)", prop.name, d->head.index,
             prop.major, prop.minor);
    out->mem_total = prop.totalGlobalMem;
  } else {
    (void)cudaGetLastError();
    snprintf(out->name, sizeof out->name, "cuda:%d", d->head.index);
  }
  out->mem_used = vs_cuda_gpu_bytes_in_use(d->gpu);
  return VSPEC_OK;
}

static int cuda_check(vspec_dev *dev, char *err, size_t errlen) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (!d->failed) {
    /* Asynchronous faults (an illegal address in a kernel) surface on the next call. */
    cudaError_t e = cudaPeekAtLastError();
    if (e != cudaSuccess) vs_cuda_check_rt(d, e, "asynchronous error");
  }
  if (!d->failed) return VSPEC_OK;
  snprintf(err, errlen, "%s", d->error);
  return d->fail_status ? d->fail_status : VSPEC_EDEVICE;
}

static int cuda_sync(vspec_dev *dev) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (!vs_cuda_enter(d)) return d->fail_status;
  return vs_cuda_wait(d, "sync") ? VSPEC_OK
                                                                       : d->fail_status;
}

static const char *cuda_alloc_error(vspec_dev *dev) { return vs_cuda(dev)->alloc_error; }

/* dev's stream waits for what after's stream holds now (cuda_dev.h's rules). The event is
 * after's: its owner thread issues nothing meanwhile (the caller owns both contexts), and
 * cudaStreamWaitEvent takes the event's state at the call, so a later record does not
 * matter. Both contexts are of one GPU (one memory space). */
static int cuda_order(vspec_dev *dev, vspec_dev *after) {
  vs_cuda_dev *d = vs_cuda(dev), *a = vs_cuda(after);
  if (a->head.index != d->head.index) {
    vs_cuda_fail(d, VSPEC_EINVAL, "order: contexts of two GPUs (cuda:%d after cuda:%d)",
                 d->head.index, a->head.index);
    return VSPEC_EINVAL;
  }
  if (!vs_cuda_enter(d)) return d->fail_status;
  if (!vs_cuda_check_rt(a, cudaEventRecord(a->order_ev, a->stream), "order (event record)") ||
      !vs_cuda_check_rt(d, cudaStreamWaitEvent(d->stream, a->order_ev, 0), "order (wait)"))
    return d->failed ? d->fail_status : a->fail_status;
  return VSPEC_OK;
}

static vs_device_class module_class = {
    sizeof(vs_device_class), VS_DEVICE_CLASS_VERSION, "cuda", VSPEC_DEVICE_CUDA, NULL,
    cuda_count, cuda_open, cuda_close, cuda_info, cuda_check, cuda_sync, cuda_alloc_error,
    cuda_order,
};

static const vs_device_class *cuda_class_ptr(void) {
  module_class.ops = vs_cuda_ops();
  return &module_class;
}

extern "C" __attribute__((visibility("default"))) const vs_device_class *vs_cuda_device_class(void) {
  return cuda_class_ptr();
}
