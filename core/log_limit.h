/*
 * core/log_limit.h - at most one log line per key per interval, with a count of the rest.
 *
 * For events a peer can cause as fast as it likes (a refused CURVE client retries every
 * 100 ms; issue 32, finding 5): the first event of a key (a peer's address) is logged, the
 * ones after it within `interval` seconds are only counted, and the next line of that key
 * (or a summary once the key went quiet, vs_log_limit_take_quiet) says how many were not
 * logged. At most VS_LOG_LIMIT_KEYS keys are tracked; past that, new keys share one slot
 * (key VS_LOG_LIMIT_OTHERS), so a crowd of peers is limited as one. Times are the caller's
 * (any monotonic clock in seconds), so the limiter is testable without waiting. Thread-safe.
 */
#ifndef VS_LOG_LIMIT_H
#define VS_LOG_LIMIT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define VS_LOG_LIMIT_KEYS 64
#define VS_LOG_LIMIT_OTHERS "(other peers)"

typedef struct vs_log_limit_slot {
  char key[64];
  double logged_at;    /* when this key's last line was allowed */
  uint64_t suppressed; /* events since then, not logged */
  int used;
} vs_log_limit_slot;

typedef struct vs_log_limit {
  pthread_mutex_t mu;
  double interval;
  vs_log_limit_slot slot[VS_LOG_LIMIT_KEYS];
  vs_log_limit_slot others;
} vs_log_limit;

void vs_log_limit_init(vs_log_limit *l, double interval_s);
void vs_log_limit_destroy(vs_log_limit *l);
/* One event of `key` at `now`: 1 when it should be logged, with *suppressed the events of
 * this key (or of the shared slot) not logged since its previous line; 0 when it is only
 * counted. */
int vs_log_limit_allow(vs_log_limit *l, const char *key, double now, uint64_t *suppressed);
/* Takes one key whose interval has passed by `now` with events not logged: 1 with its key
 * and count (the key is forgotten), 0 when there is none. Called now and then, so that the
 * count of a peer that stopped is not lost; with now = INFINITY it takes every count (at
 * exit). */
int vs_log_limit_take_quiet(vs_log_limit *l, double now, char *key, size_t keylen,
                            uint64_t *count);

#endif /* VS_LOG_LIMIT_H */
