/*
 * daemon/workers.h - the worker threads: each owns a device context and runs one job at a
 * time with the synchronous engine (vs_generate).
 *
 * The engine's round callback turns every round into the job's newest token-map state and,
 * at the job's cadence, a preview (rendered and PNG-encoded here, on the worker, so the loop
 * thread only moves bytes); both overwrite what the loop has not taken yet. After the job the
 * worker decodes the image, encodes the PNG and hands the job to the loop thread through the
 * `post` callback (the server's mailbox + uv_async_send).
 */
#ifndef VS_WORKERS_H
#define VS_WORKERS_H

#include "core/registry.h"
#include "daemon/job_queue.h"
#include "daemon/model_set.h"
#include "kernels/vs_device.h"

typedef void (*vs_post_fn)(vs_djob *j, void *user);

typedef struct vs_workers_config {
  int count;
  int threads; /* compute threads per worker, 0 = online cores / count (at least 1) */
  int batch;   /* cross-job batching: jobs per batched forward (1 = off; logged); the gates,
                  and the devices their batches run on, live in the model sets
                  (daemon/model_set.h) */
  vs_job_queue *queue;
  vs_model_table *models;
  vs_registry *reg;
  vs_post_fn post;
  void *post_user;
  const char *node;
  char device[32];                   /* "cpu" or "cuda:N" (vs_device_open) */
  vs_device_options device_options;  /* threads are set per worker from `threads` */
} vs_workers_config;

typedef struct vs_worker_status {
  uint64_t job_id; /* 0 = idle */
  int tokens_done, tokens_total;
  uint64_t jobs_done;
} vs_worker_status;

typedef struct vs_workers vs_workers;

int vs_workers_start(const vs_workers_config *cfg, vs_workers **out, char *err, size_t errlen);
/* Joins the threads; stop the queue first so they leave their wait. */
void vs_workers_join(vs_workers *w);
int vs_workers_status(vs_workers *w, vs_worker_status *out, int max);
/* The device the workers compute on (worker 0's context; they all share its kind, index
 * and precision). VSPEC_EINVAL once the workers are joined. */
int vs_workers_device_info(vs_workers *w, vs_device_info *out);

#endif /* VS_WORKERS_H */
