/*
 * kernels/vs_kernels.h - internal entry points of the compute layer (not part of the ABI).
 *
 * A device context (vspec_dev) belongs to one worker thread. The host creates one per
 * worker with vs_dev_create and hands its ops table to plugins through vspec_host.ops.
 */
#ifndef VS_KERNELS_H
#define VS_KERNELS_H

#include "vspec/ops.h"

/* The CPU ops table (CBLAS/BLIS + C loops). */
const vspec_ops *vs_cpu_ops(void);

/* Creates a device context for `ops` with `threads` compute threads (0 = one per online
 * core); the CPU device starts threads - 1 helper threads that live until
 * vs_dev_destroy. (The products the CPU device still hands to BLIS use `threads` BLIS
 * threads, or BLIS's own default for 0.) Returns 0 or a negative vspec_status with a
 * message. */
int vs_dev_create(const vspec_ops *ops, int threads, vspec_dev **out, char *err, size_t errlen);
void vs_dev_destroy(vspec_dev *dev);
const vspec_ops *vs_dev_ops(const vspec_dev *dev);

#endif /* VS_KERNELS_H */
