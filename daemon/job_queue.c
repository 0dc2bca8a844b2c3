#include "daemon/job_queue.h"

#include <stdlib.h>

#include "vspec/types.h"

/* The turn of a client's job that a worker finished (see jq_next_turn). */
typedef struct jq_finished {
  uint64_t client, turn;
} jq_finished;

struct vs_job_queue {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  vs_djob *head; /* waiting jobs, arrival order */
  int waiting, capacity;
  vs_djob **running;
  int n_running, max_running;
  uint64_t order;
  uint64_t turn; /* the turn of the last job a worker took */
  jq_finished *finished; /* one per client whose last finished job's turn is >= turn */
  int n_finished, cap_finished;
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
  free(q->finished);
  free(q);
}

/* The turn of a new job of `client` (start-time fair queueing with one unit per job): one
 * after the latest turn its client holds, running, waiting or just finished, and never
 * before the turn being served. So each client's n-th job in line gets the n-th turn from
 * now and a worker takes the clients' jobs in rotation: a newcomer waits for at most one job
 * of each other client, not behind one peer's whole backlog. (Counting only running jobs
 * could not see that backlog: with one worker, nothing of the peer's is running when the
 * next job is picked.) A finished job counts until the turn being served passes it: clients
 * that submit one job at a time have nothing running or waiting when they submit the next,
 * and without their finished turn they would get the turn being served again and again,
 * ahead of a job that was given the next turn because its client's previous job was still
 * running; that job waited 10 and 21 s behind 7 such clients in the soak (make soak). */
static uint64_t jq_next_turn(const vs_job_queue *q, uint64_t client) {
  uint64_t turn = q->turn;
  for (int i = 0; i < q->n_running; i++)
    if (q->running[i]->client_key == client && q->running[i]->qturn + 1 > turn)
      turn = q->running[i]->qturn + 1;
  for (const vs_djob *p = q->head; p; p = p->qnext)
    if (p->client_key == client && p->qturn + 1 > turn) turn = p->qturn + 1;
  for (int i = 0; i < q->n_finished; i++)
    if (q->finished[i].client == client && q->finished[i].turn + 1 > turn)
      turn = q->finished[i].turn + 1;
  return turn;
}

/* Remembers the turn of a finished job; forgets the turns the one being served has passed,
 * which can no longer move a client's next turn, so there is at most one entry per client
 * that finished a job at or after the turn being served. Without memory for it the entry is
 * skipped: fairness degrades, nothing else. */
static void jq_remember_finished(vs_job_queue *q, const vs_djob *j) {
  int n = 0, have = 0;
  for (int i = 0; i < q->n_finished; i++) {
    jq_finished f = q->finished[i];
    if (f.client == j->client_key) {
      if (j->qturn > f.turn) f.turn = j->qturn;
      have = 1;
    }
    if (f.turn >= q->turn) q->finished[n++] = f;
  }
  q->n_finished = n;
  if (have || j->qturn < q->turn) return;
  if (q->n_finished == q->cap_finished) {
    int cap = q->cap_finished ? 2 * q->cap_finished : 16;
    jq_finished *f = realloc(q->finished, (size_t)cap * sizeof *f);
    if (!f) return;
    q->finished = f;
    q->cap_finished = cap;
  }
  q->finished[q->n_finished++] = (jq_finished){j->client_key, j->qturn};
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
  j->qturn = jq_next_turn(q, j->client_key);
  j->qnext = NULL;
  vs_djob **p = &q->head;
  while (*p) p = &(*p)->qnext;
  *p = j;
  q->waiting++;
  pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&q->mu);
  return VSPEC_OK;
}

/* 1 if a should run before b: priority, then turn, then arrival. */
static int jq_before(const vs_djob *a, const vs_djob *b) {
  if (a->priority != b->priority) return a->priority > b->priority;
  if (a->qturn != b->qturn) return a->qturn < b->qturn;
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
    if (jq_before(*p, *best)) best = p;
  vs_djob *j = *best;
  *best = j->qnext;
  j->qnext = NULL;
  q->waiting--;
  if (j->qturn > q->turn) q->turn = j->qturn;
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
  jq_remember_finished(q, j);
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
    else if (jq_before(p, j)) ahead++;
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
