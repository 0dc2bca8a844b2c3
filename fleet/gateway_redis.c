/*
 * fleet/gateway_redis.c - vspec-gateway's Redis (fleet/gateway_state.h): whether to ask it now,
 * the backoff while it is unreachable, each change logged once, and the jobs stream's depth.
 * A leaf: the loop, the job requests and the relay all ask through it.
 */
#include "fleet/gateway_state.h"

#include <stdio.h>
#include <string.h>

#include "core/log.h"

int vs_gw_redis_ready(const vs_gw *g, double now) { return !g->down || now >= g->retry_at; }

int vs_gw_redis_note(vs_gw *g, int rc, const char *err) {
  if (rc == VSPEC_EIO) {
    if (!g->down)
      vs_log(VSPEC_LOG_WARN, "gateway", "redis at %s unreachable: %s (submits are refused "
             "meanwhile; trying again after 100 ms doubling to 2 s)", g->where, err);
    g->backoff = g->down ? (g->backoff * 2 > 2.0 ? 2.0 : g->backoff * 2) : 0.1;
    g->down = 1;
    g->retry_at = vs_now() + g->backoff;
    snprintf(g->redis_err, sizeof g->redis_err, "%s", err);
  } else if (g->down && (rc >= 0 || rc == VS_FLEET_EREDIS || rc == VSPEC_EFORMAT)) {
    vs_log(VSPEC_LOG_INFO, "gateway", "redis at %s is back", g->where);
    g->down = 0;
  }
  return rc;
}

/* XLEN and XPENDING. A Redis without the daemons' group (none has come up yet, or Redis
 * restarted empty) has no pending count: the group is made as a daemon makes it. */
int vs_gw_depth(vs_gw *g, long long *len, long long *pend, char *err, size_t errlen) {
  int rc = vs_gw_redis_note(g, vs_fleet_depth(g->q, len, pend, err, errlen), err);
  if (rc == VS_FLEET_EREDIS && strstr(err, "NOGROUP")) {
    rc = vs_gw_redis_note(g, vs_fleet_ensure_group(g->q, err, errlen), err);
    if (!rc) rc = vs_gw_redis_note(g, vs_fleet_depth(g->q, len, pend, err, errlen), err);
  }
  return rc;
}
