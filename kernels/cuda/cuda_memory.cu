/*
 * kernels/cuda/cuda_memory.cu - device memory: allocation with a per-GPU limit and table,
 * copies, scratch, staged host arrays, and the bf16 copies of weight matrices.
 *
 * Every allocation of a GPU is recorded in its table (pointer -> size), shared by all the
 * contexts of that GPU: it is how the memory limit is enforced, how `vspec status` reports
 * the bytes in use, and how the bf16 fast path finds the fp32 weight it was given. A weight
 * is whatever a backend passes as the `w` of linear: it must stay constant while it is
 * allocated (include/vspec/ops.h), so its bf16 copy, made on first use, stays valid until
 * the weight is freed, which drops the copy.
 */
#include <mutex>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unordered_map>

#include "kernels/common/vs_math.h"
#include "kernels/cuda/cuda_dev.h"

namespace {

struct allocation {
  size_t bytes;
  uint16_t *bf16; /* bf16 copy of a weight, or nullptr */
  size_t bf16_bytes;
};

}  // namespace

struct vs_cuda_gpu {
  int index;
  std::mutex lock;
  std::unordered_map<void *, allocation> table;
  size_t in_use;
  size_t limit; /* 0 = none */
};

#define VS_CUDA_MAX_GPUS 64
static std::mutex cm_gpus_lock;
static vs_cuda_gpu *cm_gpus[VS_CUDA_MAX_GPUS];

vs_cuda_gpu *vs_cuda_gpu_get(int index, size_t memory_limit, char *err, size_t errlen) {
  if (index < 0 || index >= VS_CUDA_MAX_GPUS) {
    snprintf(err, errlen, "CUDA device index %d is out of range (0..%d)", index,
             VS_CUDA_MAX_GPUS - 1);
    return nullptr;
  }
  std::lock_guard<std::mutex> g(cm_gpus_lock);
  if (!cm_gpus[index]) {
    cm_gpus[index] = new (std::nothrow) vs_cuda_gpu();
    if (!cm_gpus[index]) {
      snprintf(err, errlen, "out of memory");
      return nullptr;
    }
    cm_gpus[index]->index = index;
    cm_gpus[index]->in_use = 0;
    cm_gpus[index]->limit = 0;
  }
  vs_cuda_gpu *gpu = cm_gpus[index];
  /* The strictest limit asked for wins: several contexts share one GPU's budget. */
  std::lock_guard<std::mutex> l(gpu->lock);
  if (memory_limit && (!gpu->limit || memory_limit < gpu->limit)) gpu->limit = memory_limit;
  return gpu;
}

size_t vs_cuda_gpu_bytes_in_use(vs_cuda_gpu *g) {
  if (!g) return 0;
  std::lock_guard<std::mutex> l(g->lock);
  return g->in_use;
}

/* ---- failures ------------------------------------------------------------------------------ */

void vs_cuda_fail(vs_cuda_dev *d, int status, const char *fmt, ...) {
  if (d->failed) return;
  if (d->capturing) { /* fails the capture only: the eager run after it meets it for good */
    if (d->capture_status == VSPEC_OK) {
      d->capture_status = status ? status : VSPEC_EDEVICE;
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(d->capture_error, sizeof d->capture_error, fmt, ap);
      va_end(ap);
    }
    return;
  }
  d->failed = 1;
  d->fail_status = status;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->error, sizeof d->error, fmt, ap);
  va_end(ap);
}

int vs_cuda_check_rt(vs_cuda_dev *d, cudaError_t e, const char *what) {
  if (e == cudaSuccess) return 1;
  /* A failed runtime call also sets the thread's last error. Clear it (a sticky error stays
   * sticky regardless), or the next launch of any context used by this thread would report
   * this failure as its own, and check() of another context would see it. */
  (void)cudaGetLastError();
  vs_cuda_fail(d, e == cudaErrorMemoryAllocation ? VSPEC_ENOMEM : VSPEC_EDEVICE,
               "cuda:%d: %s: %s", d->head.index, what, cudaGetErrorString(e));
  return 0;
}

int vs_cuda_check_blas(vs_cuda_dev *d, cublasStatus_t s, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS) return 1;
  vs_cuda_fail(d, s == CUBLAS_STATUS_ALLOC_FAILED ? VSPEC_ENOMEM : VSPEC_EDEVICE,
               "cuda:%d: %s: cuBLAS status %d", d->head.index, what, (int)s);
  return 0;
}

/* ---- allocation ------------------------------------------------------------------------------ */

/* cudaMalloc, recorded in the table; with `zero`, filled with zeros on the context's stream
 * and waited for. Ordering guaranteed to callers (cuda_dev.h): when alloc returns, the fill
 * has completed on the device, so work that any context of the GPU enqueues afterwards, on
 * any stream, reads zeros. The wait is this stream's only (the memory is new: no other
 * stream can have work on it), and it is not counted as a forward's wait (allocations are
 * outside forwards; test_op_counts: "allocations are free"). */
static void *cm_alloc(vs_cuda_dev *d, size_t bytes, int zero) {
  vs_cuda_gpu *g = d->gpu;
  size_t n = bytes ? bytes : 1;
  if (vs_cuda_refuse_in_capture(d, VSPEC_EBUSY, "alloc")) return nullptr;
  if (!vs_cuda_enter(d)) return nullptr;
  {
    std::lock_guard<std::mutex> l(g->lock);
    if (g->limit && g->in_use + n > g->limit) {
      /* Not a device failure: the caller gets NULL and says what it was allocating; the
       * context stays usable for the next job. */
      snprintf(d->alloc_error, sizeof d->alloc_error, "cuda:%d: allocating %zu bytes would "
               "pass the memory limit (%zu of %zu bytes in use)", g->index, n, g->in_use,
               g->limit);
      return nullptr;
    }
    g->in_use += n; /* reserved now, so that two contexts cannot both pass the check */
  }
  void *p = nullptr;
  cudaError_t e = cudaMalloc(&p, n);
  if (e == cudaSuccess && zero) {
    e = cudaMemsetAsync(p, 0, n, d->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(d->stream);
  }
  std::lock_guard<std::mutex> l(g->lock);
  if (e != cudaSuccess) {
    g->in_use -= n;
    if (p) cudaFree(p);
    (void)cudaGetLastError(); /* an allocation failure is not sticky; clear it */
    /* Out of memory leaves the context usable (the caller gets NULL and reports it); any
     * other failure means the device already failed (a sticky fault fails cudaMalloc too). */
    if (e == cudaErrorMemoryAllocation)
      snprintf(d->alloc_error, sizeof d->alloc_error, "cuda:%d: cannot allocate %zu bytes: %s",
               g->index, n, cudaGetErrorString(e));
    else
      vs_cuda_fail(d, VSPEC_EDEVICE, "cuda:%d: cannot allocate %zu bytes: %s", g->index, n,
                   cudaGetErrorString(e));
    return nullptr;
  }
  g->table[p] = allocation{n, nullptr, 0};
  return p;
}

void *vs_cuda_alloc(vspec_dev *dev, size_t bytes) { return cm_alloc(vs_cuda(dev), bytes, 1); }

/* ABI 1.3: no fill and no wait. No stream has work on the memory when it returns, so any
 * context may be the first to write it; the contents are unspecified until then (ops.h). */
void *vs_cuda_alloc_uninit(vspec_dev *dev, size_t bytes) {
  return cm_alloc(vs_cuda(dev), bytes, 0);
}

void vs_cuda_free(vspec_dev *dev, void *ptr) {
  if (!ptr) return;
  vs_cuda_dev *d = vs_cuda(dev);
  vs_cuda_gpu *g = d->gpu;
  uint16_t *bf16 = nullptr;
  /* cudaFree waits for the whole GPU, which a capture cannot hold: it fails the capture (and
   * runs, so that the memory is not lost) */
  (void)vs_cuda_refuse_in_capture(d, VSPEC_EBUSY, "free");
  (void)vs_cuda_enter(d); /* cudaFree below either way: the table entry goes */
  {
    std::lock_guard<std::mutex> l(g->lock);
    auto it = g->table.find(ptr);
    if (it == g->table.end()) {
      vs_cuda_fail(d, VSPEC_EINVAL, "cuda:%d: free of %p, which this GPU did not allocate",
                   g->index, ptr);
      return;
    }
    g->in_use -= it->second.bytes + it->second.bf16_bytes;
    bf16 = it->second.bf16;
    g->table.erase(it);
  }
  /* cudaFree synchronises the GPU across all its streams, non-blocking ones included (CUDA
   * programming guide, "Stream-Ordered Memory Allocator"): no stream of any context still
   * uses the memory afterwards. */
  vs_cuda_check_rt(d, cudaFree(ptr), "cudaFree");
  if (bf16) vs_cuda_check_rt(d, cudaFree(bf16), "cudaFree (bf16 weight copy)");
}

/* ---- copies ----------------------------------------------------------------------------------- */

/* A free slot of the upload ring for `bytes`, or NULL (too large, no ring, a failed context:
 * the caller copies and waits). Waits for the slot's last copy only when it has not run yet,
 * the host being a whole ring ahead of the stream (counted as a sync). */
static unsigned char *cm_up_slot(vs_cuda_dev *d, size_t bytes) {
  if (!d->up_ring || bytes > VS_CUDA_UP_SLOT_BYTES || d->failed) return nullptr;
  int i = d->up_next;
  if (d->up_live & (1u << i)) {
    cudaError_t e = cudaEventQuery(d->up_ev[i]);
    if (e == cudaErrorNotReady) {
      /* not an error, but the runtime may keep it as the thread's last one, which the next
       * launch's check would read: cleared, as PyTorch's event query does */
      (void)cudaGetLastError();
      vs_dev_count(&d->head.counters.syncs, 1);
      e = cudaEventSynchronize(d->up_ev[i]);
    }
    if (!vs_cuda_check_rt(d, e, "upload (ring slot)")) return nullptr;
    d->up_live &= ~(1u << i);
  }
  return d->up_ring + (size_t)i * VS_CUDA_UP_SLOT_BYTES;
}

int vs_cuda_upload(vspec_dev *dev, void *dst, const void *src_host, size_t bytes) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (bytes == 0) return VSPEC_OK;
  if (!dst || !src_host) return VSPEC_EINVAL;
  /* A captured copy would replay the staging buffer's later contents: uploads come before a
   * graph's launch (ops.h, graph_begin). */
  if (vs_cuda_refuse_in_capture(d, VSPEC_ENOTSUP, "upload")) return VSPEC_ENOTSUP;
  if (!vs_cuda_enter(d)) return d->fail_status;
  vs_dev_count_transfer(dev, 0, bytes); /* one upload of `bytes`, whichever path */
  /* Small: queued from a ring slot (cuda_dev.h), no wait. */
  unsigned char *slot = cm_up_slot(d, bytes);
  if (slot) {
    int i = d->up_next;
    memcpy(slot, src_host, bytes);
    if (!vs_cuda_check_rt(d, cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice,
                                             d->stream), "upload") ||
        !vs_cuda_check_rt(d, cudaEventRecord(d->up_ev[i], d->stream), "upload (event)"))
      return d->fail_status;
    d->up_live |= 1u << i;
    d->up_next = (i + 1) % VS_CUDA_UP_SLOTS;
    return VSPEC_OK;
  }
  /* Otherwise the copy is waited for (a sync): through the staging buffer when it fits (a
   * DMA), else from the caller's pageable memory. */
  const void *from = src_host;
  if (d->staging && bytes <= d->staging_bytes && !d->failed) {
    memcpy(d->staging, src_host, bytes);
    from = d->staging;
  }
  if (!vs_cuda_check_rt(d, cudaMemcpyAsync(dst, from, bytes, cudaMemcpyHostToDevice,
                                           d->stream), "upload") ||
      !vs_cuda_wait(d, "upload (wait)"))
    return d->fail_status;
  return VSPEC_OK;
}

int vs_cuda_download(vspec_dev *dev, void *dst_host, const void *src, size_t bytes) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (bytes == 0) return VSPEC_OK;
  if (!dst_host || !src) return VSPEC_EINVAL;
  if (vs_cuda_refuse_in_capture(d, VSPEC_ENOTSUP, "download")) return VSPEC_ENOTSUP;
  /* A context that has failed hands back nothing it computed after the failure. */
  if (d->failed) return d->fail_status;
  if (!vs_cuda_enter(d)) return d->fail_status;
  vs_dev_count_transfer(dev, 1, bytes); /* one download of `bytes`, whichever path */
  /* Small: a DMA into the staging buffer, then a host copy once the stream is done. The
   * download is the wait: not counted again in syncs. */
  int staged = d->staging && bytes <= d->staging_bytes;
  if (!vs_cuda_check_rt(d, cudaMemcpyAsync(staged ? (void *)d->staging : dst_host, src, bytes,
                                           cudaMemcpyDeviceToHost, d->stream), "download") ||
      !vs_cuda_check_rt(d, cudaStreamSynchronize(d->stream), "download (wait)"))
    return d->fail_status;
  if (staged) memcpy(dst_host, d->staging, bytes);
  return VSPEC_OK;
}

int vs_cuda_copy(vspec_dev *dev, void *dst, const void *src, size_t bytes) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (bytes == 0) return VSPEC_OK;
  if (!dst || !src) return VSPEC_EINVAL;
  if (dst == src) return VSPEC_OK;
  if (!vs_cuda_enter(d)) return d->fail_status;
  /* cudaMemcpy's overlapping copies are undefined; the ops contract is memmove. */
  const char *s = (const char *)src;
  char *t = (char *)dst;
  if (t < s + bytes && s < t + bytes) {
    void *tmp = vs__cuda_op_scratch(d, bytes, "copy (overlapping)");
    if (!tmp) return d->fail_status ? d->fail_status : VSPEC_ENOMEM;
    if (!vs_cuda_check_rt(d, cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice,
                                             d->stream), "copy (overlap, 1/2)"))
      return d->fail_status;
    src = tmp;
  }
  if (!vs_cuda_check_rt(d, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, d->stream),
                        "copy"))
    return d->fail_status;
  return VSPEC_OK;
}

/* One thread per 4-byte word of the blocks; the KV caches' blocks are head_dim floats. */
__global__ void vs_k_copy3d_words(uint32_t *dst, size_t dst_a, size_t dst_b,
                                  const uint32_t *src, size_t src_a, size_t src_b, size_t words,
                                  int na, int nb) {
  size_t total = (size_t)na * nb * words;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t w = i % words, blk = i / words;
    size_t b = blk % (size_t)nb, a = blk / (size_t)nb;
    dst[a * dst_a + b * dst_b + w] = src[a * src_a + b * src_b + w];
  }
}

int vs_cuda_copy3d(vspec_dev *dev, void *dst, size_t dst_a, size_t dst_b, const void *src,
                   size_t src_a, size_t src_b, size_t width, int na, int nb) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (width == 0 || na <= 0 || nb <= 0) return VSPEC_OK;
  if (!dst || !src) return VSPEC_EINVAL;
  if (!vs_cuda_enter(d)) return d->fail_status;
  int aligned = ((uintptr_t)dst | (uintptr_t)src | dst_a | dst_b | src_a | src_b | width) % 4 == 0;
  if (aligned) {
    size_t words = width / 4, total = (size_t)na * nb * words;
    vs_k_copy3d_words<<<vs_cuda_grid(total, 256), 256, 0, d->stream>>>(
        (uint32_t *)dst, dst_a / 4, dst_b / 4, (const uint32_t *)src, src_a / 4, src_b / 4, words,
        na, nb);
    return VS_CUDA_LAUNCHED(d, "copy3d") ? VSPEC_OK : d->fail_status;
  }
  /* Unaligned (no user in the project): one 2-D copy per outer index. With one block per
   * row the b strides are never used and may be anything (0 included), but cudaMemcpy2D
   * rejects pitches below the width. */
  if (nb == 1) dst_b = src_b = width;
  for (int a = 0; a < na; a++)
    if (!vs_cuda_check_rt(d, cudaMemcpy2DAsync((char *)dst + a * dst_a, dst_b,
                                               (const char *)src + a * src_a, src_b, width, nb,
                                               cudaMemcpyDeviceToDevice, d->stream),
                          "copy3d"))
      return d->fail_status;
  return VSPEC_OK;
}

/* ---- scratch and staged host arrays ----------------------------------------------------------- */

/* A buffer of the context's own (scratch, staged arrays) of at least `bytes`. Growing is
 * safe with other contexts on the GPU: the buffer is only ever used on this context's
 * stream, which is waited for before the old buffer goes (cudaFree then synchronises the
 * GPU, which stalls the other contexts for a moment: reserve_scratch at session open is how
 * a backend keeps growth, and the wait, out of its forwards). The new buffer needs no zero
 * fill (its users write before they read), so it costs no memset and no second wait. */
static int cm_grow(vs_cuda_dev *d, void **buf, size_t *cap, size_t bytes) {
  if (bytes <= *cap) return 1;
  /* a capture records no allocation: scratch is reserved before (reserve_scratch) */
  if (vs_cuda_refuse_in_capture(d, VSPEC_EBUSY, "scratch grow")) return 0;
  size_t want = bytes + bytes / 2, old = *cap;
  /* The old buffer may still be read by queued work: wait before freeing it. */
  if (*buf) {
    vs_cuda_wait(d, "scratch grow (wait)");
    vs_cuda_free((vspec_dev *)(void *)d, *buf);
    *buf = nullptr;
    *cap = 0;
  }
  *buf = cm_alloc(d, want, 0);
  *cap = *buf ? want : 0;
  if (!*buf && old && (*buf = cm_alloc(d, old, 0))) /* too big: keep what was reserved */
    *cap = old;
  return *cap >= bytes;
}

void *vs_cuda_scratch(vs_cuda_dev *d, size_t bytes) {
  void *old = d->scratch;
  int ok = cm_grow(d, &d->scratch, &d->scratch_bytes, bytes);
  if (d->scratch != old) d->scratch_gen++; /* graphs recorded before hold `old` */
  return ok ? d->scratch : nullptr;
}

void *vs__cuda_op_scratch(vs_cuda_dev *d, size_t bytes, const char *op) {
  void *s = vs_cuda_scratch(d, bytes);
  if (!s && !d->capturing && !d->failed)
    vs_cuda_fail(d, VSPEC_ENOMEM, "cuda:%d: %s: no room for %zu bytes of scratch",
                 d->head.index, op, bytes);
  return s;
}

int vs_cuda_reserve_scratch(vspec_dev *dev, size_t bytes) {
  vs_cuda_dev *d = vs_cuda(dev);
  if (!vs_cuda_enter(d)) return d->fail_status;
  return vs_cuda_scratch(d, bytes) ? VSPEC_OK : VSPEC_ENOMEM;
}

/* Uploads n elements of `size` bytes unless the device copy already holds them. */
static const void *cm_stage(vs_cuda_dev *d, void **dev_buf, size_t *cap, void **host_copy,
                            size_t *len, const void *host, size_t bytes) {
  if (bytes == 0) return *dev_buf;
  /* a host array of the op's call would be baked into the graph (ops.h: device arrays) */
  if (vs_cuda_refuse_in_capture(d, VSPEC_ENOTSUP, "staged host array")) return nullptr;
  if (*len == bytes && *host_copy && memcmp(*host_copy, host, bytes) == 0) return *dev_buf;
  if (bytes > *cap) {
    free(*host_copy);
    *host_copy = malloc(bytes + bytes / 2);
    if (!*host_copy || !cm_grow(d, dev_buf, cap, bytes)) {
      free(*host_copy);
      *host_copy = nullptr;
      *len = 0;
      vs_cuda_fail(d, VSPEC_ENOMEM, "cuda:%d: cannot stage %zu bytes of op input",
                   d->head.index, bytes);
      return nullptr;
    }
  }
  memcpy(*host_copy, host, bytes);
  *len = bytes;
  /* From pageable memory the copy is staged before cudaMemcpyAsync returns, so the source
   * may change right after. The source is our own malloc'd copy, not the caller's array:
   * were that page-locked (cudaHostAlloc, cudaHostRegister), the copy would be a real DMA
   * at some later point of the stream, and a caller that refills its mask for the next
   * forward would change what this one reads. */
  vs_dev_count_transfer((vspec_dev *)(void *)d, 0, bytes); /* an upload inside an op */
  if (!vs_cuda_check_rt(d, cudaMemcpyAsync(*dev_buf, *host_copy, bytes, cudaMemcpyHostToDevice,
                                           d->stream), "stage op input")) {
    *len = 0;
    return nullptr;
  }
  return *dev_buf;
}

const int32_t *vs_cuda_stage_pos(vs_cuda_dev *d, const int32_t *host, size_t n) {
  return (const int32_t *)cm_stage(d, (void **)&d->pos_dev, &d->pos_cap, (void **)&d->pos_host,
                                   &d->pos_len, host, n * sizeof(int32_t));
}

const uint8_t *vs_cuda_stage_mask(vs_cuda_dev *d, const uint8_t *host, size_t n) {
  return (const uint8_t *)cm_stage(d, (void **)&d->mask_dev, &d->mask_cap,
                                   (void **)&d->mask_host, &d->mask_len, host, n);
}

float *vs_cuda_host_floats(vs_cuda_dev *d, size_t n) {
  if (n > d->host_f_cap) {
    free(d->host_f);
    d->host_f = (float *)malloc(n * sizeof(float));
    d->host_f_cap = d->host_f ? n : 0;
  }
  return d->host_f;
}

void *vs_cuda_host_work(vs_cuda_dev *d, size_t bytes) {
  if (bytes > d->host_work_cap) {
    free(d->host_work);
    d->host_work = malloc(bytes);
    d->host_work_cap = d->host_work ? bytes : 0;
  }
  return d->host_work;
}

/* ---- bf16 weight copies -------------------------------------------------------------------------- */

__global__ void vs_k_to_bf16(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = vs_f32_to_bf16(src[i]);
}

const uint16_t *vs_cuda_weight_bf16(vs_cuda_dev *d, const float *w, size_t count) {
  vs_cuda_gpu *g = d->gpu;
  std::lock_guard<std::mutex> l(g->lock);
  auto it = g->table.find((void *)w);
  /* Only whole allocations are weights: a pointer into the middle of one (an activation
   * slice) has no entry and takes the fp32 path. */
  if (it == g->table.end() || it->second.bytes < count * sizeof(float)) return nullptr;
  size_t bytes = count * sizeof(uint16_t);
  /* The copy was made for the count of its first use: a later call that names more of the
   * allocation must not read past it (fp32 then). */
  if (it->second.bf16) return it->second.bf16_bytes >= bytes ? it->second.bf16 : nullptr;
  if (g->limit && g->in_use + bytes > g->limit) return nullptr; /* fp32 still works */
  /* converting allocates and waits: a capture fails here, the eager run converts (weights
   * are converted at their first eager use: a session's prefill, before any capture) */
  if (vs_cuda_refuse_in_capture(d, VSPEC_EBUSY, "bf16 weight conversion")) return nullptr;
  uint16_t *copy = nullptr;
  if (cudaMalloc(&copy, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  vs_k_to_bf16<<<vs_cuda_grid(count, 256), 256, 0, d->stream>>>(copy, w, count);
  /* Other contexts of this GPU may use the copy on their streams: finish it first. */
  if (!VS_CUDA_LAUNCHED(d, "bf16 weight conversion") ||
      !vs_cuda_wait(d, "bf16 weight conversion (wait)")) {
    cudaFree(copy);
    return nullptr;
  }
  it->second.bf16 = copy;
  it->second.bf16_bytes = bytes;
  g->in_use += bytes;
  return copy;
}
