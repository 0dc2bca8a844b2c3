#include "daemon/stats.h"

#include <stdio.h>
#include <string.h>

static vs_method_stats *stats_method_row(vs_stats *s, const char *method) {
  char key[sizeof s->m[0].method];
  snprintf(key, sizeof key, "%s", method && *method ? method : "?");
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->m[i].method, key)) return &s->m[i];
  /* The last row is kept for "other" once the others are taken. */
  if (s->n < VS_STATS_MAX_METHODS - 1) {
    vs_method_stats *r = &s->m[s->n++];
    memset(r, 0, sizeof *r);
    snprintf(r->method, sizeof r->method, "%s", key);
    return r;
  }
  vs_method_stats *other = &s->m[VS_STATS_MAX_METHODS - 1];
  if (s->n < VS_STATS_MAX_METHODS) {
    memset(other, 0, sizeof *other);
    snprintf(other->method, sizeof other->method, "other");
    s->n = VS_STATS_MAX_METHODS;
  }
  return other;
}

void vs_stats_job_ended(vs_stats *s, const char *method, int completed, int ran,
                        const vs_djob_stats *st) {
  vs_method_stats *r = stats_method_row(s, method);
  r->jobs++;
  r->completed += completed != 0;
  if (!ran || !st) return;
  /* Counters of a job that stopped early are the work it did: still real forwards. */
  r->tokens += (uint64_t)(st->tokens > 0 ? st->tokens : 0);
  r->target_forwards += (uint64_t)(st->target_forwards > 0 ? st->target_forwards : 0);
  r->rounds += (uint64_t)(st->rounds > 0 ? st->rounds : 0);
  r->drafted += (uint64_t)(st->drafted > 0 ? st->drafted : 0);
  r->accepted += (uint64_t)(st->accepted > 0 ? st->accepted : 0);
  r->tree_nodes += (uint64_t)(st->tree_nodes > 0 ? st->tree_nodes : 0);
  r->draft_tokens += (uint64_t)(st->draft_tokens > 0 ? st->draft_tokens : 0);
}

void vs_stats_preview_sent(vs_stats *s, size_t bytes) { s->preview_bytes += bytes; }

int vs_stats_to_proto(const vs_stats *s, Vspec__MethodStats *buf, Vspec__MethodStats **ptrs,
                      int max) {
  int n = s->n < max ? s->n : max;
  for (int i = 0; i < n; i++) {
    const vs_method_stats *r = &s->m[i];
    Vspec__MethodStats *p = &buf[i];
    vspec__method_stats__init(p);
    p->method = (char *)r->method;
    p->has_jobs = p->has_completed = p->has_tokens = p->has_target_forwards = 1;
    p->has_rounds = p->has_drafted = p->has_accepted = p->has_tree_nodes = 1;
    p->has_draft_tokens = 1;
    p->draft_tokens = r->draft_tokens;
    p->jobs = r->jobs;
    p->completed = r->completed;
    p->tokens = r->tokens;
    p->target_forwards = r->target_forwards;
    p->rounds = r->rounds;
    p->drafted = r->drafted;
    p->accepted = r->accepted;
    p->tree_nodes = r->tree_nodes;
    ptrs[i] = p;
  }
  return n;
}
