/*
 * kernels/cpu/cpu_threads.c - persistent worker pool (see cpu_threads.h).
 *
 * Protocol. The caller publishes a region (fn, ctx, ntasks, the task counter) under the
 * mutex, bumps the generation counter, opens the region and broadcasts `wake`. Threads
 * claim tasks from the counter until none are left. A helper may only touch the region
 * after joining it: `door` holds an "open" bit and the number of helpers inside, and a
 * join is a compare-and-swap that succeeds only while the bit is set. When the caller has
 * run out of tasks it clears the bit and waits for the helpers already inside; a helper
 * that arrives later finds the door shut and goes back to sleep without reading the
 * region, whose context may be gone by then (it usually lives on the caller's stack).
 *
 * Waiting. Both sides first spin for a bounded time (VS_POOL_SPIN_NS) and then block on
 * a condition variable. The linear layers of one forward follow each other within a few
 * microseconds (norms and adds in between), so a short spin saves a futex wake-up per
 * region; blocking after it matters because this runs on small shared machines where a
 * spinning thread takes a core that another thread (ours or someone else's) needs.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/cpu/cpu_threads.h"

/* How long a waiting thread polls before it blocks. The gaps between the parallel
 * regions of a forward (norms, adds, rope, small attention) are mostly a few to a few
 * tens of microseconds; longer gaps (attention over long caches) end in a sleep. */
#define VS_POOL_SPIN_NS 50000L

/* A helper that took a task and then lost its core (another process wants it: small shared
 * machines) makes the caller wait for it at the end of the region, for up to a scheduler
 * time slice, milliseconds, where the region's work is microseconds: with a busy second core
 * a VQ decode (thousands of small regions) took seconds on two threads against 10 ms on one.
 * So the caller watches its wait: a wait longer than its own share of the work and than
 * VS_POOL_STALL_NS is a stall, and after one the next regions run on the caller alone, a
 * number that doubles with each stall in a row (VS_POOL_SOLO_MIN..MAX), before helpers are
 * tried again. On an idle machine helpers finish with the caller and nothing changes. */
#define VS_POOL_STALL_NS 300000L
#define VS_POOL_SOLO_MIN 16
#define VS_POOL_SOLO_MAX 4096

#define DOOR_OPEN 1u
#define DOOR_ONE 2u /* one helper inside */

typedef struct vs_helper {
  struct vs_pool *pool;
  pthread_t tid;
} vs_helper;

struct vs_pool {
  int threads; /* counting the caller */
  int started; /* helpers actually running */
  vs_helper *helpers;

  pthread_mutex_t mu;
  pthread_cond_t wake; /* helpers: a new generation (or stop) */
  pthread_cond_t done; /* caller: the last helper left a closed region */
  atomic_uint gen;     /* region counter, bumped under mu */
  atomic_uint door;    /* DOOR_OPEN | helpers inside * DOOR_ONE */
  atomic_int next;     /* next unclaimed task */
  atomic_int stop;     /* set (with a generation bump) by vs_pool_destroy */

  /* stall backoff (caller only): regions left to run alone, and the next such run's length */
  int solo_left, solo_next;
  long stalls; /* regions that stalled, for the pool's statistics */

  /* the current region: written by the caller under mu while the door is shut */
  vs_pool_fn fn;
  void *ctx;
  int ntasks;
};

static long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Polls until gen != seen, for at most VS_POOL_SPIN_NS. The clock is only read every 64
 * polls: a vDSO clock_gettime costs more than a pause. */
static int spin_for_gen(vs_pool *p, unsigned seen) {
  long start = now_ns();
  for (unsigned it = 1;; it++) {
    if (atomic_load(&p->gen) != seen) return 1;
    cpu_relax();
    if ((it & 63) == 0 && now_ns() - start > VS_POOL_SPIN_NS) return 0;
  }
}

/* Polls until no helper is inside the (closed) region. */
static int spin_for_empty(vs_pool *p) {
  long start = now_ns();
  for (unsigned it = 1;; it++) {
    if (atomic_load(&p->door) == 0) return 1;
    cpu_relax();
    if ((it & 63) == 0 && now_ns() - start > VS_POOL_SPIN_NS) return 0;
  }
}

static void run_tasks(vs_pool *p) {
  for (;;) {
    int t = atomic_fetch_add(&p->next, 1);
    if (t >= p->ntasks) return;
    p->fn(p->ctx, t);
  }
}

/* Enters the open region, if any. */
static int join(vs_pool *p) {
  unsigned d = atomic_load(&p->door);
  while (d & DOOR_OPEN)
    if (atomic_compare_exchange_weak(&p->door, &d, d + DOOR_ONE)) return 1;
  return 0;
}

static void leave(vs_pool *p) {
  /* The last helper out of a closed region wakes the caller. Signalling under the mutex:
   * the caller checks the door under it before waiting, so the signal cannot fall
   * between its check and its wait. */
  if (atomic_fetch_sub(&p->door, DOOR_ONE) == DOOR_ONE) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_signal(&p->done);
    pthread_mutex_unlock(&p->mu);
  }
}

static void *helper_main(void *arg) {
  vs_pool *p = ((vs_helper *)arg)->pool;
  unsigned seen = 0; /* gen starts at 0; the first region makes it 1 */
  for (;;) {
    if (!spin_for_gen(p, seen)) {
      pthread_mutex_lock(&p->mu);
      while (atomic_load(&p->gen) == seen) pthread_cond_wait(&p->wake, &p->mu);
      pthread_mutex_unlock(&p->mu);
    }
    if (atomic_load(&p->stop)) return NULL;
    seen = atomic_load(&p->gen);
    if (join(p)) {
      /* Inside: the generation cannot move until we leave, so this is the region's. */
      seen = atomic_load(&p->gen);
      run_tasks(p);
      leave(p);
    }
  }
}

vs_pool *vs_pool_create(int threads) {
  if (threads < 1) threads = 1;
  vs_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->threads = threads;
  atomic_init(&p->gen, 0u);
  atomic_init(&p->door, 0u);
  atomic_init(&p->next, 0);
  atomic_init(&p->stop, 0);
  if (pthread_mutex_init(&p->mu, NULL)) {
    free(p);
    return NULL;
  }
  if (pthread_cond_init(&p->wake, NULL)) {
    pthread_mutex_destroy(&p->mu);
    free(p);
    return NULL;
  }
  if (pthread_cond_init(&p->done, NULL)) {
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p);
    return NULL;
  }
  if (threads > 1) {
    p->helpers = calloc((size_t)threads - 1, sizeof *p->helpers);
    if (!p->helpers) {
      vs_pool_destroy(p);
      return NULL;
    }
    for (int i = 0; i < threads - 1; i++) {
      p->helpers[i].pool = p;
      if (pthread_create(&p->helpers[i].tid, NULL, helper_main, &p->helpers[i])) {
        vs_pool_destroy(p); /* joins the ones already started */
        return NULL;
      }
      p->started++;
    }
  }
  return p;
}

void vs_pool_destroy(vs_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->stop, 1);
  atomic_fetch_add(&p->gen, 1u);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->started; i++) pthread_join(p->helpers[i].tid, NULL);
  pthread_cond_destroy(&p->done);
  pthread_cond_destroy(&p->wake);
  pthread_mutex_destroy(&p->mu);
  free(p->helpers);
  free(p);
}

int vs_pool_threads(const vs_pool *p) { return p ? p->threads : 1; }

void vs_pool_run(vs_pool *p, int ntasks, vs_pool_fn fn, void *ctx) {
  if (ntasks <= 0) return;
  if (!p || p->started == 0 || ntasks == 1 || (p->solo_left > 0 && p->solo_left--)) {
    for (int t = 0; t < ntasks; t++) fn(ctx, t);
    return;
  }
  /* The door is shut and nobody is inside (the previous region ended that way), so the
   * region fields are ours to write. */
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->ctx = ctx;
  p->ntasks = ntasks;
  atomic_store(&p->next, 0);
  atomic_fetch_add(&p->gen, 1u);
  atomic_store(&p->door, DOOR_OPEN);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);

  long t0 = now_ns();
  run_tasks(p);
  long t1 = now_ns();

  /* All tasks are claimed; shut the door and wait for the helpers still running theirs. */
  if (atomic_fetch_and(&p->door, ~DOOR_OPEN) != DOOR_OPEN && !spin_for_empty(p)) {
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->door) != 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
  }
  long waited = now_ns() - t1;
  if (waited > VS_POOL_STALL_NS && waited > t1 - t0) {
    p->stalls++;
    p->solo_left = p->solo_next ? p->solo_next : VS_POOL_SOLO_MIN;
    p->solo_next = p->solo_left * 2 > VS_POOL_SOLO_MAX ? VS_POOL_SOLO_MAX : p->solo_left * 2;
  } else {
    p->solo_next = 0; /* a clean region: the next stall starts the backoff again */
  }
}

long vs_pool_stalls(const vs_pool *p) { return p ? p->stalls : 0; }
