#include "core/log_limit.h"

#include <stdio.h>
#include <string.h>

void vs_log_limit_init(vs_log_limit *l, double interval_s) {
  memset(l, 0, sizeof *l);
  pthread_mutex_init(&l->mu, NULL);
  l->interval = interval_s;
  snprintf(l->others.key, sizeof l->others.key, "%s", VS_LOG_LIMIT_OTHERS);
}

void vs_log_limit_destroy(vs_log_limit *l) { pthread_mutex_destroy(&l->mu); }

/* The slot of `key`: its own, a free one, one whose interval passed with nothing to report
 * (reused), or the shared one. Caller holds l->mu. */
static vs_log_limit_slot *ll_slot(vs_log_limit *l, const char *key, double now) {
  vs_log_limit_slot *spare = NULL;
  for (int i = 0; i < VS_LOG_LIMIT_KEYS; i++) {
    vs_log_limit_slot *s = &l->slot[i];
    if (s->used && !strncmp(s->key, key, sizeof s->key - 1)) return s;
    int idle = !s->used || (s->suppressed == 0 && now - s->logged_at >= l->interval);
    if (idle && !spare) spare = s;
  }
  if (!spare) return &l->others;
  memset(spare, 0, sizeof *spare);
  snprintf(spare->key, sizeof spare->key, "%s", key);
  return spare;
}

int vs_log_limit_allow(vs_log_limit *l, const char *key, double now, uint64_t *suppressed) {
  pthread_mutex_lock(&l->mu);
  vs_log_limit_slot *s = ll_slot(l, key, now);
  int allow = !s->used || now - s->logged_at >= l->interval;
  if (allow) {
    *suppressed = s->suppressed;
    s->suppressed = 0;
    s->logged_at = now;
    s->used = 1;
  } else {
    s->suppressed++;
  }
  pthread_mutex_unlock(&l->mu);
  return allow;
}

int vs_log_limit_take_quiet(vs_log_limit *l, double now, char *key, size_t keylen,
                            uint64_t *count) {
  pthread_mutex_lock(&l->mu);
  int found = 0;
  for (int i = 0; i <= VS_LOG_LIMIT_KEYS && !found; i++) {
    vs_log_limit_slot *s = i < VS_LOG_LIMIT_KEYS ? &l->slot[i] : &l->others;
    if (!s->used || !s->suppressed || now - s->logged_at < l->interval) continue;
    snprintf(key, keylen, "%s", s->key);
    *count = s->suppressed;
    s->suppressed = 0;
    /* Forgotten: its next event is logged at once. The shared slot keeps its key. */
    s->used = 0;
    found = 1;
  }
  pthread_mutex_unlock(&l->mu);
  return found;
}
