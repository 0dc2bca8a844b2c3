/*
 * core/forward_gate.h - cross-job batching: target forwards of concurrent jobs on one model
 * run as one batched forward (the backend's forward_multi), so a busy server reads the
 * weights once for the trees of several images.
 *
 * Each job runs on its own thread as before (vs_generate is synchronous). A job that enters
 * the gate sends its target forwards, and its draft model's, through it: a forward waits
 * until every job in the gate has one ready or running (they fall into step: all draft, then
 * all verify), or until max_batch are ready, or until max_wait_s has passed; then one of the
 * waiting threads runs a batch of one model (the one most of them wait for) on a free lane's
 * device and wakes the others. A backend without forward_multi (EAGLE's) is not batched:
 * its forwards run on the job's own device and thread, as without a gate.
 *
 * Results equal unbatched forwards up to float rounding (the products run with more rows),
 * so with batching a seed's image can differ from the same seed generated alone in a token
 * where rounding moves a sample across a boundary.
 */
#ifndef VS_FORWARD_GATE_H
#define VS_FORWARD_GATE_H

#include <stdint.h>

#include "core/models.h"

typedef struct vs_forward_gate vs_forward_gate;

/* Most lanes (batches at once) a gate can have. */
#define VS_FORWARD_GATE_MAX_LANES 16

typedef struct vs_forward_gate_stats {
  uint64_t forwards;     /* forwards that went through the gate */
  uint64_t batches;      /* batched forwards run (forwards / batches = mean batch) */
  uint64_t multi;        /* batches of more than one session */
  uint64_t timeouts;     /* batches started because a forward waited max_wait_s */
  uint64_t rows;         /* tree nodes forwarded (rows / batches = nodes per batch) */
  double wait_s;         /* total time forwards waited for others (not their compute) */
  uint64_t orders;       /* vs_dev_order calls around batches (two per session whose device is
                            not the lane's: on a GPU an event wait each, no host wait) */
} vs_forward_gate_stats;

/* max_batch: most sessions in one batched forward (>= 1); max_wait_s: the longest a ready
 * forward waits for the other jobs' (> 0); devs[lanes]: the devices batches compute on, one
 * batch at a time on each (not owned; nothing else uses them meanwhile), of the sessions'
 * memory space. With several lanes, batches of different jobs run at once (each lane a
 * share of the cores); with one, one batch takes every core. */
int vs_forward_gate_create(int max_batch, double max_wait_s, vspec_dev *const *devs, int lanes,
                           vs_forward_gate **out, char *err, size_t errlen);
/* Frees the gate and sets *g to NULL; no job may be inside. */
void vs_forward_gate_destroy(vs_forward_gate **g);

/* A job starts (after its prefill) or stops sending forwards: a ready forward waits only for
 * jobs that have entered and not left. */
void vs_forward_gate_enter(vs_forward_gate *g);
void vs_forward_gate_leave(vs_forward_gate *g);

/* The forward of `s` (a session of t, opened on `dev`), batched with other jobs' ready
 * forwards. Same contract as t->vt->forward, which it is when g is NULL (a job that is not
 * batched). A batch runs on a lane's device, ordered after the work each session's device
 * has queued and before what it queues next (vs_dev_order both ways, counted in the devices'
 * `orders`: a lane's gets one per other device in the batch, each other device one), so
 * that sessions of several contexts of one GPU, each with its own stream, batch safely. */
int vs_forward_gate_forward(vs_forward_gate *g, const vs_backend_model *t, vspec_session *s,
                            vspec_dev *dev, const vspec_forward_batch *b, vspec_forward_out *out,
                            char *err, size_t errlen);

void vs_forward_gate_get_stats(vs_forward_gate *g, vs_forward_gate_stats *out);

#endif /* VS_FORWARD_GATE_H */
