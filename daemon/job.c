#include "daemon/job.h"

#include <stdlib.h>
#include <string.h>

vs_djob *vs_djob_new(uint64_t id, int tokens_total) {
  vs_djob *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  size_t n = tokens_total > 0 ? (size_t)tokens_total : 1;
  j->sh.tokens = calloc(n, sizeof(int32_t));
  j->sh.status = calloc(n, 1);
  j->lp.sent_tokens = calloc(n, sizeof(int32_t));
  j->lp.sent_status = calloc(n, 1);
  if (!j->sh.tokens || !j->sh.status || !j->lp.sent_tokens || !j->lp.sent_status) {
    free(j->sh.tokens);
    free(j->sh.status);
    free(j->lp.sent_tokens);
    free(j->lp.sent_status);
    free(j);
    return NULL;
  }
  j->id = id;
  j->tokens_total = tokens_total;
  atomic_init(&j->refs, 1);
  atomic_init(&j->cancel, 0);
  atomic_init(&j->cancel_reason, VS_CANCEL_NONE);
  pthread_mutex_init(&j->mu, NULL);
  return j;
}

void vs_djob_retain(vs_djob *j) { atomic_fetch_add(&j->refs, 1); }

void vs_djob_release(vs_djob *j) {
  if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
  pthread_mutex_destroy(&j->mu);
  free(j->caption);
  free(j->caption_mask);
  free(j->sh.tokens);
  free(j->sh.status);
  free(j->sh.preview_png);
  free(j->sh.png);
  free(j->lp.sent_tokens);
  free(j->lp.sent_status);
  free(j);
}

void vs_djob_cancel(vs_djob *j, int reason) {
  int none = VS_CANCEL_NONE;
  atomic_compare_exchange_strong(&j->cancel_reason, &none, reason);
  atomic_store(&j->cancel, 1);
}
