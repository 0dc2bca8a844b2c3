/*
 * kernels/cuda/cuda_dev.h - the CUDA device context and the internal op entry points of
 * the CUDA module (libvspec-cuda.so; see kernels/vs_device.h for why it is a module).
 *
 * One context per worker thread, each with its own stream and cuBLAS handle; every op
 * enqueues on that stream. Contexts of the same GPU share its memory (the memory space of
 * vs_dev_space), its allocation table and its bf16 weight cache (cuda_memory.cu).
 *
 * Streams: each context's stream is created with cudaStreamNonBlocking, and nothing in the
 * module enqueues on the legacy default stream (every memset and copy is the Async form on
 * d->stream, every launch names d->stream, the cuBLAS handle is bound to it), so one
 * context's work never waits for another's: two workers of a daemon run side by side on one
 * GPU. The flip side is that no implicit ordering joins two contexts' streams either; what
 * one context writes becomes safe for another only through the rules below.
 *
 * Synchronisation rules (what makes memory written by one context safe for another):
 *  - alloc zero-fills with cudaMemsetAsync on the allocating context's stream and waits for
 *    that stream before returning: the memory reads back zero from any stream of any
 *    context of the GPU for work enqueued after alloc returned (alloc_uninit does no fill
 *    and no wait: no stream has work on the memory, any context may write it first);
 *  - upload does not wait: a small copy (up to VS_CUDA_UP_SLOT_BYTES) goes through a slot of
 *    the context's page-locked upload ring, queued on the stream, so the caller's source may
 *    change once it returns and the host goes on; a slot is written again only after its
 *    copy ran (its event), which the ring's size makes a wait only when the host is a whole
 *    ring ahead of the GPU (counted in syncs then). A larger copy, or one on a context
 *    without the ring, waits (a sync). Another context sees an upload only after an order or
 *    a sync (model load ends with the class's sync());
 *  - download waits for its copy (and so for the stream's queued work): downloaded data is
 *    on the host on return. The download is the wait; it is not counted again in syncs;
 *  - free (cudaFree) synchronises the whole GPU, every stream included (CUDA programming
 *    guide, stream-ordered allocator), so no queued work still uses the memory afterwards;
 *  - order(dev, after) (the device class's) makes dev's stream wait for an event recorded on
 *    after's stream: what after queued before runs before what dev queues next, and the
 *    host does not wait (a cross-job batch on one context over caches that the other
 *    contexts' streams write: core/forward_gate.c orders both ways around it);
 *  - everything else is asynchronous on the context's stream.
 * Fixed per-context resources, made at open and never grown in a forward (what a CUDA graph
 * capture needs: nothing may allocate while it records): the cuBLAS workspace
 * (cublasSetWorkspace; one per handle and stream, which is also what keeps cuBLAS bit for
 * bit reproducible with several streams active), the upload ring, and a page-locked staging
 * buffer through which downloads and waited uploads of up to VS_CUDA_STAGING_BYTES go as DMA
 * copies. None counts
 * against the GPU's memory limit (like the cuBLAS handle's own state, they are the
 * context's, not a model's). The scratch grows on demand unless reserved (reserve_scratch).
 * Ops that return void record the first failure in the context (vs_cuda_fail); the host
 * reads it through the class's check() after every forward, so a failed launch fails the
 * job with a message instead of crashing. Such failures are sticky (a faulted CUDA context
 * cannot be trusted again). Running out of memory is not: alloc returns NULL, the caller
 * reports it, and the context serves the next job.
 * Weights: linear's `w` is constant while it is allocated (include/vspec/ops.h), which is
 * what lets the bf16 copy of a weight live until the weight is freed.
 * Model load: a backend may fill weights with asynchronous device copies on the loading
 * context's stream; the host calls the class's sync() when a model is loaded, before any
 * other context (a worker's stream) reads them.
 */
#ifndef VS_CUDA_DEV_H
#define VS_CUDA_DEV_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/vs_device.h"
#include "vspec/ops.h"
#include "vspec/types.h"

/* The upload ring: enough slots that a round's uploads (a forward's integers, a walk's tree,
 * a draft forward's inputs) never wait for one to come free; a slot holds a GPT-B head
 * forward's features (64 nodes x 2 rows x 768 floats is 384 KiB). */
#define VS_CUDA_UP_SLOTS 8
#define VS_CUDA_UP_SLOT_BYTES ((size_t)512 << 10)

struct vs_cuda_gpu; /* per-GPU shared state, cuda_memory.cu */

typedef struct vs_cuda_dev {
  vs_dev_head head; /* first: the host reads the class and ops table through it */
  struct vs_cuda_gpu *gpu;
  cudaStream_t stream;  /* cudaStreamNonBlocking */
  cublasHandle_t blas;  /* bound to `stream`, with the workspace below */
  void *blas_ws;        /* cuBLAS workspace (cudaMalloc; not in the allocation table) */
  size_t blas_ws_bytes;
  /* page-locked host staging for small uploads and downloads (cudaHostAlloc at open; NULL
   * if the host would not pin it: every transfer then takes the pageable path). Idle
   * between calls: every copy through it is waited for before upload/download return. */
  unsigned char *staging;
  size_t staging_bytes;
  /* The upload ring (VS_CUDA_UP_SLOTS slots of VS_CUDA_UP_SLOT_BYTES, page-locked; NULL if
   * the host would not pin it): slot i's copy was queued before up_ev[i] was recorded, and
   * up_live has bit i set while that record may still be pending. */
  unsigned char *up_ring;
  cudaEvent_t up_ev[VS_CUDA_UP_SLOTS];
  unsigned up_live;
  int up_next;
  int precision;    /* VS_PRECISION_FP32 or VS_PRECISION_BF16 */
  int tatt_generic; /* VSPEC_CUDA_ATTENTION=generic at open (cuda_module.cu) */
  int rope_epilogue; /* RoPE and stores in the few-row product (cuda_fused.cu) unless
                      * VSPEC_CUDA_ROPE=separate at open */
  int pdl;          /* programmatic dependent launch (vs_cuda_launch): sm_90+ unless
                     * VSPEC_CUDA_PDL=off at open (cuda_module.cu) */
  /* device scratch: im2col tiles, bf16 activations, uploaded positions and masks */
  void *scratch;
  size_t scratch_bytes;
  /* small host arrays the ops take (RoPE positions, attention masks) live on the device
   * after their first upload; an identical array is not uploaded again */
  int32_t *pos_dev;
  size_t pos_cap, pos_len;
  int32_t *pos_host; /* host copy of what pos_dev holds */
  uint8_t *mask_dev;
  size_t mask_cap, mask_len;
  uint8_t *mask_host;
  /* host work space for the ops that run on the host (logits_to_probs, sample, argmax) */
  float *host_f;
  size_t host_f_cap;
  void *host_work;
  size_t host_work_cap;
  int failed;
  int fail_status;
  char error[VSPEC_ERRLEN];
  /* ABI 1.5 (cuda_graph.cu): a stream capture is open on `stream`, and the first reason it
   * cannot make a graph (VSPEC_OK while none). While capturing, what would allocate, wait or
   * copy from the host is refused and a failure fails the capture, not the context: the
   * caller runs the same ops again eagerly, which reports a real fault for good. */
  unsigned scratch_gen; /* scratch reallocations so far: a graph recorded before the last
                        * one holds a freed address and is refused at launch (cuda_graph.cu) */
  int capturing;
  int capture_status;
  char capture_error[VSPEC_ERRLEN];
  /* The last allocation that failed for want of memory (not sticky: the caller gets NULL,
   * reports it, and the context serves the next job). */
  char alloc_error[VSPEC_ERRLEN];
  /* Recorded on `stream` when another context of the GPU must wait for this one's queued work
   * (the class's order: cross-job batches); made at open, without timing. */
  cudaEvent_t order_ev;
} vs_cuda_dev;

static inline vs_cuda_dev *vs_cuda(vspec_dev *dev) { return (vs_cuda_dev *)(void *)dev; }

/* Records the first failure; returns 0 when `e` is a failure, 1 otherwise. */
int vs_cuda_check_rt(vs_cuda_dev *d, cudaError_t e, const char *what);
int vs_cuda_check_blas(vs_cuda_dev *d, cublasStatus_t s, const char *what);
void vs_cuda_fail(vs_cuda_dev *d, int status, const char *fmt, ...);
/* After a kernel launch. */
#define VS_CUDA_LAUNCHED(d, what) vs_cuda_check_rt((d), cudaGetLastError(), (what))

/* Programmatic dependent launch (sm_90+): a decode step is a hundred small kernels, and
 * between two of them a GPU idles while the second launches. A kernel launched through
 * vs_cuda_launch on a context with d->pdl may be launched while the kernel before it on the
 * stream still runs; its first statement, VS_PDL_ENTER, waits until that kernel has finished
 * and its writes are visible (griddepcontrol.wait; a no-op for a kernel launched plainly),
 * then lets the next one start launching (griddepcontrol.launch_dependents). So every
 * kernel launched through vs_cuda_launch must begin with VS_PDL_ENTER. Graph capture keeps
 * the programmatic edges (CUDA 12.3+). VSPEC_CUDA_PDL=off (cuda_module.cu) turns it off. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define VS_PDL_ENTER() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define VS_PDL_ENTER() \
  do {               \
  } while (0)
#endif

/* kernel<<<grid, block, shared, d->stream>>>(args...), with programmatic dependent launch
 * where d->pdl; 1 when launched, else 0 with the failure recorded as `what`. */
template <typename... P, typename... A>
static inline int vs_cuda_launch(vs_cuda_dev *d, const char *what, void (*kernel)(P...),
                                 dim3 grid, dim3 block, size_t shared, A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = shared;
  cfg.stream = d->stream;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = d->pdl ? 1 : 0;
  return vs_cuda_check_rt(d, cudaLaunchKernelEx(&cfg, kernel, ((P)args)...), what);
}

/* Makes the context's GPU the calling thread's current device; 0 (failure recorded) when it
 * cannot. The current device is per host thread: contexts are opened on one thread (the
 * daemon's main thread) and used on another (a worker), and one thread may use contexts of
 * several GPUs, so every entry point that allocates, launches or calls cuBLAS or the
 * runtime on the context's behalf calls this first. Cheap when the device already is
 * current (a thread-local read). */
static inline int vs_cuda_enter(vs_cuda_dev *d) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) (void)cudaGetLastError();
  if (cur == d->head.index) return 1;
  return vs_cuda_check_rt(d, cudaSetDevice(d->head.index), "cudaSetDevice");
}

/* While a capture is open: fails it with `status` (the first reason kept) and returns 1, so
 * that the caller skips what a capture cannot hold (an allocation, a wait, a copy from
 * pageable host memory); 0 when no capture is open. Inline here rather than in cuda_graph.cu:
 * the memory ops refuse, and cuda_graph.cu calls them, so they must not call into it. */
static inline int vs_cuda_refuse_in_capture(vs_cuda_dev *d, int status, const char *what) {
  if (!d->capturing) return 0;
  if (d->capture_status == VSPEC_OK) {
    d->capture_status = status;
    snprintf(d->capture_error, sizeof d->capture_error, "cuda:%d: %s cannot be captured",
             d->head.index, what);
  }
  return 1;
}

/* Waits for the context's stream, counted (vs_dev_counters.syncs): what a forward costs in
 * waits is reported whatever op waits. 1 when it went well. */
static inline int vs_cuda_wait(vs_cuda_dev *d, const char *what) {
  if (vs_cuda_refuse_in_capture(d, VSPEC_EBUSY, what)) return 0;
  vs_dev_count(&d->head.counters.syncs, 1);
  return vs_cuda_check_rt(d, cudaStreamSynchronize(d->stream), what);
}

/* Transfers up to this size go through the context's page-locked staging buffer. */
#define VS_CUDA_STAGING_BYTES ((size_t)1 << 20)
/* cuBLAS workspace per context: cuBLAS's own default pool size (32 MiB from sm_90 on, 4 MiB
 * before), so that it picks the algorithms it picked with its pool. */
#define VS_CUDA_BLAS_WS_SM90 ((size_t)32 << 20)
#define VS_CUDA_BLAS_WS ((size_t)4 << 20)

/* Scratch of at least `bytes` (grows, waiting for the stream first); NULL on failure. */
void *vs_cuda_scratch(vs_cuda_dev *d, size_t bytes);
/* The same for an op that cannot run without it: out of memory is then recorded as the op's
 * failure (vs_cuda_fail, VSPEC_ENOMEM), not skipped in silence; a growth refused while
 * capturing is the capture's failure, already recorded there. */
void *vs__cuda_op_scratch(vs_cuda_dev *d, size_t bytes, const char *op);
/* Device copies of a host int32 / byte array, uploaded only when it changed. */
const int32_t *vs_cuda_stage_pos(vs_cuda_dev *d, const int32_t *host, size_t n);
const uint8_t *vs_cuda_stage_mask(vs_cuda_dev *d, const uint8_t *host, size_t n);
/* Host work buffers for host-side ops; NULL on failure. */
float *vs_cuda_host_floats(vs_cuda_dev *d, size_t n);
void *vs_cuda_host_work(vs_cuda_dev *d, size_t bytes);

/* Grid size for n elements with `block` threads, capped (kernels use grid-stride loops). */
static inline unsigned vs_cuda_grid(size_t n, unsigned block) {
  size_t g = (n + block - 1) / block;
  if (g < 1) g = 1;
  return (unsigned)(g > 65535u * 8u ? 65535u * 8u : g);
}

/* ---- the ops ---------------------------------------------------------------------------- */
/* vs_cuda_<op> for every op of include/vspec/ops_list.h, with the op's signature (one file per
 * concept: memory and copies in cuda_memory.cu, the ABI 1.4 fused ops in cuda_fused.cu,
 * sample_tokens in cuda_draw.cu, verify_walk in cuda_walk.cu, graphs (stream capture on the
 * context's stream) in cuda_graph.cu, ...). weight_format is declared but not defined: the
 * table leaves it NULL (cuda_ops.cu). */
#define VS_CUDA_DECLARE(ret, name, params, args, minor, kind) ret vs_cuda_##name params;
VSPEC_OPS(VS_CUDA_DECLARE)
#undef VS_CUDA_DECLARE

/* ---- memory (cuda_memory.cu) ------------------------------------------------------------ */
/* Per-GPU state: opened with the first context of a GPU, never freed. */
struct vs_cuda_gpu *vs_cuda_gpu_get(int index, size_t memory_limit, char *err, size_t errlen);
size_t vs_cuda_gpu_bytes_in_use(struct vs_cuda_gpu *g);
/* The bf16 copy of a weight matrix allocated on this GPU (made on first use, dropped
 * when the weight is freed); NULL when `w` is not an allocation of ours or on failure. */
const uint16_t *vs_cuda_weight_bf16(vs_cuda_dev *d, const float *w, size_t count);

/* ---- building blocks the fused ops share with the plain ones (vs__: cross-file) -------- */
/* RMSNorm of rows idx[i] of x (idx NULL: row i) for i < rows, into y (fp32) or, when y is
 * NULL, into yb as bf16 (rounded as the bf16 linear rounds its activations). 1 when launched
 * (cuda_norm.cu). */
int vs__cuda_rmsnorm_launch(vs_cuda_dev *d, const float *x, const int32_t *idx, int rows,
                            int dim, const float *w, float eps, float *y, uint16_t *yb);
/* Threads of the RMSNorm kernel's block (cuda_norm.cu): the few-row product, which normalises
 * its rows as that kernel does, bit for bit, must run as many (cuda_gemm.cu checks it). */
#define VS_CUDA_NORM_THREADS 256
/* Rows up to which bf16 linear layers run the few-row kernel (cuda_gemm.cu). */
#define VS_CUDA_SKINNY_ROWS 8
/* What the few-row kernel does with a column's sum s: y = s + bias, y += s, or (with the
 * second weight w3 and its sum u) y = silu(s) * u; or, for norm_qkv_rope, RoPE and the KV
 * stores on the sums of a pair of columns (vs__cuda_skinny_qkv_rope). */
enum { VS_SKINNY_STORE = 0, VS_SKINNY_ADD = 1, VS_SKINNY_SWIGLU = 2, VS_SKINNY_ROPE = 3 };
/* What the RoPE epilogue needs (device arrays, as norm_qkv_rope's and norm_qkv_rope_batch's):
 * positions and the table, the shape, and one session's cache, slots and node count, or
 * (es non-NULL) a batch's entries in row order. */
typedef struct vs_skinny_rope {
  const int32_t *pos;
  const float *table;
  int H, Hkv, hd;
  vspec_kv_cache kv;
  const int32_t *slots;
  int n;
  const vspec_kv_batch_entry *es;
  int count;
} vs_skinny_rope;
/* y[m, n_out] from x[m, n_in] (m <= VS_CUDA_SKINNY_ROWS) and bf16 weights (cuda_gemm.cu). 1 when
 * launched. With norm_w the kernel multiplies rmsnorm(x) * norm_w instead, normalising the
 * rows itself as vs__cuda_rmsnorm_launch would (the same bits); only where
 * vs__cuda_skinny_norms(m, n_in) says the rows fit. */
int vs__cuda_skinny_bf16(vs_cuda_dev *d, const float *x, const float *norm_w, float eps, int m,
                         int n_in, const uint16_t *w, const uint16_t *w3, int n_out,
                         const float *bias, int mode, float *y);
int vs__cuda_skinny_norms(int m, int n_in);
/* norm_qkv_rope's product on the few-row kernel with RoPE and the stores in its epilogue,
 * the same bits as the product then vs_k_rope_store (cuda_fused.cu); an even head_dim. */
int vs__cuda_skinny_qkv_rope(vs_cuda_dev *d, const float *x, const float *norm_w, float eps,
                             int m, int n_in, const uint16_t *w, const vs_skinny_rope *rope,
                             float *qkv);
/* y = xb W^T + beta y on tensor cores, bf16 operands and fp32 accumulation (cuBLAS). */
int vs__cuda_gemm_bf16(vs_cuda_dev *d, const uint16_t *xb, int m, int n_in, const uint16_t *wb,
                       int n_out, float beta, float *y);
int vs__cuda_to_bf16(vs_cuda_dev *d, uint16_t *dst, const float *src, size_t n);
/* The bf16 copy of weight w [n_out, n_in] where this context multiplies in bf16, else NULL
 * (fp32 precision, or not a weight allocation: the fp32 path). */
const uint16_t *vs__cuda_bf16_weight(vs_cuda_dev *d, const float *w, int n_out, int n_in);

/* The cache's shape as the fused kernels index it; 0 (failure recorded) when it is not
 * (cuda_fused.cu). */
int vs__cuda_kv_ok(vs_cuda_dev *d, const vspec_kv_cache *kv, const char *op);

const vspec_ops *vs_cuda_ops(void);

#endif /* VS_CUDA_DEV_H */
