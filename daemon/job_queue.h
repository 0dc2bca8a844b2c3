/*
 * daemon/job_queue.h - the bounded queue between the loop thread and the workers.
 *
 * Order: higher priority first; among equal priorities the job with the earlier turn, where
 * a client's n-th job in line (running and waiting jobs both count, and a finished one until
 * the turn being served passes it) gets the n-th turn from now, so clients take turns and
 * one client's hundred queued jobs do not keep the next client's job waiting behind them;
 * then arrival order. The loop thread pushes (refusing when full: the client gets a "busy"
 * error, never a silent drop) and removes (cancel, deadline, client gone); workers pop,
 * blocking until there is work or the queue is stopped. The queue keeps a reference on each
 * job it holds, and remembers the running ones and the turns of recently finished ones for
 * the fairness rule. A client is job->client_key (vspecd: one connection).
 */
#ifndef VS_JOB_QUEUE_H
#define VS_JOB_QUEUE_H

#include "daemon/job.h"

typedef struct vs_job_queue vs_job_queue;

int vs_job_queue_open(int capacity, int max_running, vs_job_queue **out);
void vs_job_queue_close(vs_job_queue *q);

/* 0, or VSPEC_EBUSY when `capacity` jobs are waiting, or VSPEC_ECANCELED once stopped. */
int vs_job_queue_push(vs_job_queue *q, vs_djob *j);
/* Takes a waiting job out (state stays QUEUED); 1 if it was waiting, 0 if a worker has it. */
int vs_job_queue_remove(vs_job_queue *q, vs_djob *j);
/* Blocks for the next job (state RUNNING, counted as running, reference passed to the
 * caller); NULL once the queue is stopped. */
vs_djob *vs_job_queue_pop(vs_job_queue *q);
/* A worker finished j (state DONE). */
void vs_job_queue_done(vs_job_queue *q, vs_djob *j);
/* Wakes every blocked pop with NULL; later pushes fail. */
void vs_job_queue_stop(vs_job_queue *q);

int vs_job_queue_waiting(vs_job_queue *q);
int vs_job_queue_running(vs_job_queue *q);
/* Jobs that would run before j (0 = next), or -1 if j is not waiting. */
int vs_job_queue_position(vs_job_queue *q, const vs_djob *j);
/* Takes every waiting job out; fills out[] (references pass to the caller); returns the count. */
int vs_job_queue_take_all(vs_job_queue *q, vs_djob **out, int max);

#endif /* VS_JOB_QUEUE_H */
