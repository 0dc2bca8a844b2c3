/*
 * daemon/stats.h - what vspecd counts beyond its job totals: the work done by method and the
 * preview bytes sent, for `vspec status` (StatusReply.methods, Totals.preview_bytes) and the
 * HTTP endpoint's /metrics (DESIGN.md "HTTP endpoint").
 *
 * Loop thread only, like the totals it sits next to: no lock. The counters are the raw ones
 * of core/metrics.h summed over jobs, not ratios, so that any ratio (TPF, MAL, accepted per
 * drafted) can be computed over any window by whoever reads them.
 */
#ifndef VS_DAEMON_STATS_H
#define VS_DAEMON_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/job.h" /* vs_djob_stats, and the protocol's types */

/* Distinct methods kept apart; later ones are added to "other" (a client choosing many
 * parameter spellings cannot grow the table or the metrics without bound). */
#define VS_STATS_MAX_METHODS 32

typedef struct vs_method_stats {
  char method[128];
  uint64_t jobs, completed, tokens, target_forwards, rounds, drafted, accepted, tree_nodes;
  uint64_t draft_tokens;
} vs_method_stats;

typedef struct vs_stats {
  vs_method_stats m[VS_STATS_MAX_METHODS];
  int n;
  uint64_t preview_bytes;
} vs_stats;

/* A job ended: `ran` says whether a worker ran it (then `st` holds its counters). */
void vs_stats_job_ended(vs_stats *s, const char *method, int completed, int ran,
                        const vs_djob_stats *st);
void vs_stats_preview_sent(vs_stats *s, size_t bytes);

/* StatusReply.methods: fills up to `max` messages (pointing into s) and returns how many. */
int vs_stats_to_proto(const vs_stats *s, Vspec__MethodStats *buf, Vspec__MethodStats **ptrs,
                      int max);

#endif /* VS_DAEMON_STATS_H */
