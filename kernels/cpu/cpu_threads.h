/*
 * kernels/cpu/cpu_threads.h - the persistent worker pool of a CPU device.
 *
 * A device with `threads` compute threads owns threads - 1 helper threads, created with
 * the device and joined when it is destroyed. Ops hand the pool one parallel region at a
 * time (vs_pool_run). Starting threads per call (what BLIS 0.9 does) costs tens of
 * microseconds a call and, with its spinning barrier, whole milliseconds on an
 * oversubscribed machine; a region here costs one wake-up.
 *
 * A region is a set of independent tasks that the calling thread and the helpers claim
 * one at a time. Claiming instead of a fixed split matters on the small shared machines
 * this runs on: when a helper's core is taken by another process, the caller (and any
 * other helper) does that helper's share instead of waiting for it, and a helper that
 * wakes up after all tasks are gone does not hold the region up at all. Which thread runs
 * a task varies from run to run; what a task computes must not depend on it.
 */
#ifndef VS_CPU_THREADS_H
#define VS_CPU_THREADS_H

typedef struct vs_pool vs_pool;

/* One task of a parallel region, task in [0, ntasks). */
typedef void (*vs_pool_fn)(void *ctx, int task);

/* A pool of `threads` threads counting the caller (threads - 1 helpers). NULL when memory
 * or a thread could not be had. threads <= 1 gives a valid pool without helpers. */
vs_pool *vs_pool_create(int threads);
/* Stops and joins the helpers. NULL is fine. Never call while a region runs. */
void vs_pool_destroy(vs_pool *pool);
/* Threads counting the caller; 1 for NULL. */
int vs_pool_threads(const vs_pool *pool);
/* Runs fn(ctx, task) exactly once for every task in [0, ntasks), on the caller and on
 * whichever helpers join in, and returns when all have finished. A NULL pool or
 * ntasks == 1 runs everything on the caller. Not reentrant: fn must not use the pool. */
void vs_pool_run(vs_pool *pool, int ntasks, vs_pool_fn fn, void *ctx);
/* Regions whose caller waited for a stalled helper (one that lost its core): after each the
 * pool runs the next regions on the caller alone for a while (cpu_threads.c says why). */
long vs_pool_stalls(const vs_pool *pool);

#endif /* VS_CPU_THREADS_H */
