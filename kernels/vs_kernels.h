/*
 * kernels/vs_kernels.h - internal entry points of the compute layer (not part of the ABI).
 *
 * A device context (vspec_dev) belongs to one worker thread. The host opens one per worker
 * (vs_device_open, or vs_dev_create for the CPU) and hands plugins the ops table of the
 * device they run on (vspec_host.dev_ops, which is vs_dev_ops). Each device has its own
 * ops table: device pointers go only to the ops of their device, and data crosses to the
 * host by an explicit download.
 */
#ifndef VS_KERNELS_H
#define VS_KERNELS_H

#include "kernels/vs_device.h"
#include "vspec/ops.h"

/* The CPU ops table (BLIS + C loops). */
const vspec_ops *vs_cpu_ops(void);

/* Host memory the CPU device did not allocate but may read as a weight (a tensor mapped from
 * its file, kernels/cpu/cpu_weights.h): lend registers it, so that bf16 precision may keep a
 * converted copy of it; release drops every copy made from memory in [p, p + bytes), and
 * must be called before that memory is unmapped or reused. */
void vs_cpu_memory_lend(const void *p, size_t bytes);
void vs_cpu_memory_release(const void *p, size_t bytes);

/* Opens a device named by `spec`: "cpu", "cuda" (= cuda:0) or "cuda:N". opt may be NULL
 * (defaults: all cores, no memory limit, the device's default precision); opt->index is
 * replaced by the spec's. Errors name the problem: a build without CUDA, a module that
 * cannot be loaded, no GPU, a device index that does not exist. */
int vs_device_open(const char *spec, const vs_device_options *opt, vspec_dev **out, char *err,
                   size_t errlen);
/* Parses "cpu" / "cuda" / "cuda:N" into a kind and an index. */
int vs_device_parse(const char *spec, uint32_t *kind, int *index, char *err, size_t errlen);

/* Creates a CPU device context with `threads` compute threads (0 = one per online core);
 * the CPU device starts threads - 1 helper threads that live until vs_dev_destroy. (The
 * products the CPU device still hands to BLIS use `threads` BLIS threads, or BLIS's own
 * default for 0.) `ops` must be vs_cpu_ops(). Returns 0 or a negative vspec_status with a
 * message. */
int vs_dev_create(const vspec_ops *ops, int threads, vspec_dev **out, char *err, size_t errlen);
/* Closes a device of any kind; NULL is a no-op. */
void vs_dev_destroy(vspec_dev *dev);
const vspec_ops *vs_dev_ops(const vspec_dev *dev);
/* The first error a device met, if any (vs_device_class.check); the round loop calls it
 * after every target forward so that a failed kernel fails the job with a message. */
int vs_dev_check(vspec_dev *dev, char *err, size_t errlen);
/* Why the device's last failed allocation failed, or "" (for error messages). */
const char *vs_dev_alloc_error(vspec_dev *dev);
/* Waits for the device's queued work (a no-op on the CPU): what it wrote is then visible
 * to every device of its memory space. */
int vs_dev_sync(vspec_dev *dev);
/* Orders two contexts of one memory space: the work `dev` queues from now on runs after
 * everything `after` queued so far (vs_device_class.order), without the host waiting; counted
 * in dev's `orders` on every device (so that CPU tests see what a GPU is asked to do). A no-op
 * when dev is after or either is NULL. Cross-job batches need it: a batch runs on one
 * context's queue over caches that other contexts' queues write (core/forward_gate.c). */
int vs_dev_order(vspec_dev *dev, vspec_dev *after);
/* Name, memory and precision of a device. */
int vs_dev_info(vspec_dev *dev, vs_device_info *out);
/* Devices with the same memory space share pointers: what one allocated, the ops of the
 * other may use (the CPU is space 0, cuda:N is 0x100 + N). */
uint32_t vs_dev_space(const vspec_dev *dev);

/* The device's counters so far (kernels/vs_device.h, vs_dev_counters); a - b into a. */
int vs_dev_counters_get(const vspec_dev *dev, vs_dev_counters *out);
void vs_dev_counters_sub(vs_dev_counters *a, const vs_dev_counters *b);
/* internal (kernels/op_counts.c): the counting copy of a class's ops table, which every
 * device context's head points to (kernels/device.c, kernels/cpu/cpu_device.c). */
const vspec_ops *vs__counted_ops(const vs_device_class *cls);

#endif /* VS_KERNELS_H */
