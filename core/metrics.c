#include "core/metrics.h"

#include <time.h>

double vs_metrics_tpf(const vs_metrics *m) {
  return m->target_forwards ? (double)m->tokens / (double)m->target_forwards : 0.0;
}

double vs_metrics_mal(const vs_metrics *m) {
  return m->rounds ? (double)m->tokens / (double)m->rounds : 0.0;
}

double vs_metrics_accept_rate(const vs_metrics *m) {
  return m->draft_tokens ? (double)m->accepted / (double)m->draft_tokens : 0.0;
}

double vs_metrics_walk_accept_rate(const vs_metrics *m) {
  return m->drafted ? (double)m->accepted / (double)m->drafted : 0.0;
}

double vs_metrics_accept_at(const vs_metrics *m, int depth) {
  if (depth < 1 || depth > VS_MAX_DEPTH || !m->reached[depth]) return 0.0;
  return (double)m->accepted_at[depth] / (double)m->reached[depth];
}

void vs_metrics_add(vs_metrics *a, const vs_metrics *b) {
  a->tokens += b->tokens;
  a->target_forwards += b->target_forwards;
  a->rounds += b->rounds;
  a->draft_tokens += b->draft_tokens;
  a->drafted += b->drafted;
  a->accepted += b->accepted;
  a->siblings_tried += b->siblings_tried;
  a->draft_forwards += b->draft_forwards;
  a->draft_nodes += b->draft_nodes;
  a->tree_nodes += b->tree_nodes;
  a->residual_fallbacks += b->residual_fallbacks;
  for (int d = 0; d <= VS_MAX_DEPTH; d++) {
    a->reached[d] += b->reached[d];
    a->accepted_at[d] += b->accepted_at[d];
  }
  a->wall_s += b->wall_s;
  a->draft_s += b->draft_s;
  a->verify_s += b->verify_s;
  a->accept_s += b->accept_s;
  a->skipped_rounds += b->skipped_rounds;
  a->unverified_tokens += b->unverified_tokens;
  a->residual_rounds += b->residual_rounds;
}

double vs_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
