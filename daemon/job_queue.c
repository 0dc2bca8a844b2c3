#include "daemon/job_queue.h"

#include <stdlib.h>

#include "vspec/types.h"

struct vs_job_queue {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  vs_djob *head; /* waiting jobs, arrival order */
  int waiting, capacity;
  vs_djob **running;
  int n_running, max_running;
  uint64_t order;
  int stopped;
};

int vs_job_queue_open(int capacity, int max_running, vs_job_queue **out) {
  vs_job_queue *q = calloc(1, sizeof *q);
  if (!q) return VSPEC_ENOMEM;
  q->running = calloc((size_t)max_running, sizeof *q->running);
  if (!q->running) {
    free(q);
    return VSPEC_ENOMEM;
  }
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->cv, NULL);
  q->capacity = capacity;
  q->max_running = max_running;
  *out = q;
  return VSPEC_OK;
}

void vs_job_queue_close(vs_job_queue *q) {
  if (!q) return;
  while (q->head) {
    vs_djob *j = q->head;
    q->head = j->qnext;
    vs_djob_release(j);
  }
  pthread_mutex_destroy(&q->mu);
  pthread_cond_destroy(&q->cv);
  free(q->running);
  free(q);
}

int vs_job_queue_push(vs_job_queue *q, vs_djob *j) {
  pthread_mutex_lock(&q->mu);
  if (q->stopped) {
    pthread_mutex_unlock(&q->mu);
    return VSPEC_ECANCELED;
  }
  if (q->waiting >= q->capacity) {
    pthread_mutex_unlock(&q->mu);
    return VSPEC_EBUSY;
  }
  vs_djob_retain(j);
  j->state = VS_JOB_QUEUED;
  j->qorder = ++q->order;
  j->qnext = NULL;
  vs_djob **p = &q->head;
  while (*p) p = &(*p)->qnext;
  *p = j;
  q->waiting++;
  pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&q->mu);
  return VSPEC_OK;
}

static int vs__running_of(const vs_job_queue *q, uint64_t client) {
  int n = 0;
  for (int i = 0; i < q->n_running; i++) n += q->running[i]->client_key == client;
  return n;
}

/* 1 if a should run before b. */
static int vs__before(const vs_job_queue *q, const vs_djob *a, const vs_djob *b) {
  if (a->priority != b->priority) return a->priority > b->priority;
  int ra = vs__running_of(q, a->client_key), rb = vs__running_of(q, b->client_key);
  if (ra != rb) return ra < rb;
  return a->qorder < b->qorder;
}

vs_djob *vs_job_queue_pop(vs_job_queue *q) {
  pthread_mutex_lock(&q->mu);
  while (!q->stopped && (!q->head || q->n_running >= q->max_running))
    pthread_cond_wait(&q->cv, &q->mu);
  if (q->stopped) {
    pthread_mutex_unlock(&q->mu);
    return NULL;
  }
  vs_djob **best = &q->head;
  for (vs_djob **p = &q->head; *p; p = &(*p)->qnext)
    if (vs__before(q, *p, *best)) best = p;
  vs_djob *j = *best;
  *best = j->qnext;
  j->qnext = NULL;
  q->waiting--;
  j->state = VS_JOB_RUNNING;
  q->running[q->n_running++] = j;
  pthread_mutex_unlock(&q->mu);
  return j; /* the queue's reference passes to the worker */
}

void vs_job_queue_done(vs_job_queue *q, vs_djob *j) {
  pthread_mutex_lock(&q->mu);
  for (int i = 0; i < q->n_running; i++)
    if (q->running[i] == j) {
      q->running[i] = q->running[--q->n_running];
      break;
    }
  j->state = VS_JOB_DONE;
  pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

int vs_job_queue_remove(vs_job_queue *q, vs_djob *j) {
  pthread_mutex_lock(&q->mu);
  for (vs_djob **p = &q->head; *p; p = &(*p)->qnext)
    if (*p == j) {
      *p = j->qnext;
      j->qnext = NULL;
      q->waiting--;
      pthread_mutex_unlock(&q->mu);
      vs_djob_release(j);
      return 1;
    }
  pthread_mutex_unlock(&q->mu);
  return 0;
}

void vs_job_queue_stop(vs_job_queue *q) {
  pthread_mutex_lock(&q->mu);
  q->stopped = 1;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
}

int vs_job_queue_waiting(vs_job_queue *q) {
  pthread_mutex_lock(&q->mu);
  int n = q->waiting;
  pthread_mutex_unlock(&q->mu);
  return n;
}

int vs_job_queue_running(vs_job_queue *q) {
  pthread_mutex_lock(&q->mu);
  int n = q->n_running;
  pthread_mutex_unlock(&q->mu);
  return n;
}

int vs_job_queue_position(vs_job_queue *q, const vs_djob *j) {
  pthread_mutex_lock(&q->mu);
  int found = 0, ahead = 0;
  for (vs_djob *p = q->head; p; p = p->qnext) {
    if (p == j) found = 1;
    else if (vs__before(q, p, j)) ahead++;
  }
  pthread_mutex_unlock(&q->mu);
  return found ? ahead : -1;
}

int vs_job_queue_take_all(vs_job_queue *q, vs_djob **out, int max) {
  pthread_mutex_lock(&q->mu);
  int n = 0;
  while (q->head && n < max) {
    vs_djob *j = q->head;
    q->head = j->qnext;
    j->qnext = NULL;
    q->waiting--;
    out[n++] = j;
  }
  pthread_mutex_unlock(&q->mu);
  return n;
}
