/*
 * kernels/vs_device.h - device classes: how the host opens, describes and closes a device
 * of one kind (internal to the host; plugins only see vspec_dev and its ops table).
 *
 * The CPU class is built into libvspec. The CUDA class lives in a module of its own,
 * libvspec-cuda.so (kernels/cuda/), which kernels/device.c loads with dlopen the first time
 * a CUDA device is asked for: binaries do not depend on the CUDA libraries at link time, a
 * build without nvcc has no module and says so, and a machine without a GPU gets a clear
 * error instead of a loader failure. In the manner of nginx's module signature, the module
 * exports one symbol returning its class, whose struct_size and version the host checks
 * before use; a loaded module is never closed (it holds device code and driver state).
 *
 * Every device context starts with a vs_dev_head, so the host can find its class and ops
 * table whatever the kind.
 */
#ifndef VS_DEVICE_H
#define VS_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "vspec/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Weight precision of a device's linear layers. */
enum {
  VS_PRECISION_DEFAULT = 0, /* the device's default: fp32 on the CPU, bf16 on CUDA */
  VS_PRECISION_FP32 = 1,    /* fp32 weights and arithmetic (parity with the CPU) */
  VS_PRECISION_BF16 = 2     /* bf16 weights, fp32 accumulation */
};

typedef struct vs_device_options {
  int index;           /* device ordinal (cuda:N); 0 for the CPU */
  int threads;         /* CPU compute threads, 0 = one per online core */
  size_t memory_limit; /* bytes the device may allocate, 0 = no limit of our own */
  int precision;       /* VS_PRECISION_* */
} vs_device_options;

typedef struct vs_device_info {
  uint32_t kind;       /* vspec_device_kind */
  int index;
  char name[128];      /* "cpu (avx512, 2 threads)", "NVIDIA H100 80GB HBM3" */
  size_t mem_total;    /* bytes; 0 when unknown (CPU) */
  size_t mem_used;     /* bytes this process holds on the device; 0 when unknown */
  int precision;       /* VS_PRECISION_FP32 or VS_PRECISION_BF16 */
} vs_device_info;

/* 2: vs_dev_head holds the counters; 3: and graphs'; 4: order, and its counter */
#define VS_DEVICE_CLASS_VERSION 4
#define VS_CUDA_CLASS_SYMBOL "vs_cuda_device_class"

typedef struct vs_device_class {
  uint32_t struct_size; /* sizeof(vs_device_class) as the module was built */
  uint32_t version;     /* VS_DEVICE_CLASS_VERSION */
  const char *name;     /* "cpu", "cuda" */
  uint32_t kind;        /* vspec_device_kind */
  const vspec_ops *ops;
  /* Devices of this kind present (0 with a message when none can be used). */
  int (*count)(char *err, size_t errlen);
  int (*open)(const vs_device_options *opt, vspec_dev **out, char *err, size_t errlen);
  void (*close)(vspec_dev *dev);
  int (*info)(vspec_dev *dev, vs_device_info *out);
  /* The first error the device met since it was opened (ops that return void cannot
   * report one: a failed launch or allocation inside them is recorded here), as a
   * negative status and a message; VSPEC_OK when none. Errors are sticky. */
  int (*check)(vspec_dev *dev, char *err, size_t errlen);
  /* Waits until everything queued on this context has run, so that another context of
   * the same memory space sees its writes (called after a model load). */
  int (*sync)(vspec_dev *dev);
  /* Why the last allocation that returned NULL failed (a memory limit, the device's own
   * memory), or "" (allocations that fail for want of memory are not device failures). */
  const char *(*alloc_error)(vspec_dev *dev);
  /* (version 4) Makes the work `dev` queues from now on wait for everything `after` (another
   * context of the same memory space) has queued so far, without the host waiting: on a GPU
   * an event recorded on after's stream that dev's stream waits for. NULL where every op has
   * run when it returns (the CPU): there is nothing to order. The caller owns both contexts
   * for the call (their threads are not issuing work). */
  int (*order)(vspec_dev *dev, vspec_dev *after);
} vs_device_class;

/* What a device context has done since it was opened: every call of its ops table
 * (kernels/op_counts.c counts them, whatever the device) and the transfers and waits a device
 * makes inside an op (a GPU uploads an attention mask, waits for its stream). What one
 * forward costs is the difference of two readings (vs_dev_counters_get). Counted with
 * relaxed atomic adds: a context belongs to one thread at a time, but readers may be others. */
typedef struct vs_dev_counters {
  uint64_t ops;            /* work issued: every ops-table call but memory management and
                              the host-side RoPE table (on a GPU, about one launch each) */
  uint64_t uploads, upload_bytes;     /* host -> device: the upload op, and inside ops */
  uint64_t downloads, download_bytes; /* device -> host */
  uint64_t syncs;          /* waits until the device's queued work is done, besides the
                              downloads (each waits for its copy; an upload does not): the
                              host's waits are downloads + syncs (syncs 0 on the CPU) */
  uint64_t launches;       /* graph launches (ABI 1.5), each also one of `ops` */
  uint64_t recorded;       /* ops called while a graph was recorded: recorded, not issued,
                              so not in `ops` */
  uint64_t orders;         /* times this context's queue was made to wait for another
                              context's (vs_dev_order: an event wait on a GPU, no host wait;
                              counted on every device, the CPU included, where it is free) */
} vs_dev_counters;

/* The first member of every device context. */
typedef struct vs_dev_head {
  const vspec_ops *ops; /* what the host hands out: the counting table (kernels/op_counts.c) */
  const vs_device_class *cls; /* cls->ops: the device's own table */
  int index;
  vs_dev_counters counters;
  int recording; /* between graph_begin and graph_end (the counting table's graph ops) */
} vs_dev_head;

/* Adds n to a counter of the head (any thread). */
static inline void vs_dev_count(uint64_t *counter, uint64_t n) {
  __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

/* Counts one host <-> device transfer of `bytes` (down: to the host). Devices call it where
 * they copy, so that a transfer an op makes inside (a GPU's sampler downloading logits) counts
 * as the upload and download ops' do. dev may be NULL (host code's copies: not counted). */
static inline void vs_dev_count_transfer(vspec_dev *dev, int down, size_t bytes) {
  if (!dev) return;
  vs_dev_counters *c = &((vs_dev_head *)(void *)dev)->counters;
  vs_dev_count(down ? &c->downloads : &c->uploads, 1);
  vs_dev_count(down ? &c->download_bytes : &c->upload_bytes, bytes);
}

typedef const vs_device_class *(*vs_device_class_fn)(void);

/* The CPU class (kernels/cpu/cpu_device.c). */
const vs_device_class *vs_cpu_device_class(void);

#ifdef __cplusplus
}
#endif
#endif /* VS_DEVICE_H */
