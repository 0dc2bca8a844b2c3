/*
 * core/forward_timing.h - what one target forward costs on this device: the cost curve
 * against tree nodes that size=auto (core/autotune.h) and vspec-bench costcurve measure.
 */
#ifndef VS_FORWARD_TIMING_H
#define VS_FORWARD_TIMING_H

#include "core/models.h"
#include "kernels/vs_kernels.h"

/* Median latency (ms) of one forward of an n-node binary tree (n <= 64) after a committed
 * half-image prefix, with `rows` CFG rows; measured for at least min_time seconds (and at
 * least three forwards). VSPEC_ENOTSUP for a continuous-token (MAR) target. */
int vs_time_forward(vspec_dev *dev, const vs_backend_model *t, int rows, int n,
                    double min_time, double *median_ms, char *err, size_t errlen);
/* The same on another clock (seconds, e.g. the calling thread's CPU time, which a loaded
 * machine disturbs less than the wall clock); NULL: the wall clock. */
int vs_time_forward_clock(vspec_dev *dev, const vs_backend_model *t, int rows, int n,
                          double min_time, double (*clock)(void), double *median_ms, char *err,
                          size_t errlen);
/* Median latency (ms) of one batched forward (the backend's forward_multi, as the daemon's
 * cross-job batches run it: core/forward_gate.c) of `sessions` sessions, each a one-node step
 * with `rows` CFG rows after its own half-image prefix. VSPEC_ENOTSUP for a backend without
 * forward_multi. */
#define VS_TIME_MULTI_MAX 16
int vs_time_forward_multi(vspec_dev *dev, const vs_backend_model *t, int sessions, int rows,
                          double min_time, double *median_ms, char *err, size_t errlen);
/* What one such forward issues on its device: ops, transfers and waits (kernels/vs_device.h,
 * vs_dev_counters); right after the prefill (the counts do not depend on the cache). */
int vs_count_forward(vspec_dev *dev, const vs_backend_model *t, int rows, int n,
                     vs_dev_counters *out, char *err, size_t errlen);

#endif /* VS_FORWARD_TIMING_H */
