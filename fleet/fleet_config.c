/*
 * fleet/fleet_config.c - vspecd's [fleet] section as the fleet queue's options, and its checks
 * (fleet/fleet_config.h).
 */
#include "fleet/fleet_config.h"

#include <stdio.h>

#include "vspec/types.h"

void vs_fleet_config_opts(const vs_daemon_config *c, vs_fleet_opts *o) {
  vs_fleet_opts_defaults(o);
  o->url = c->fleet_redis;
  o->stream = c->fleet_stream;
  o->group = c->fleet_group;
  o->consumer = c->node;
  o->events_prefix = c->fleet_events_prefix;
  o->events_ttl_ms = c->fleet_events_ttl_s * 1000;
  /* Payloads come from gateways, which apply the client-facing limits; a daemon reads
   * whatever they let through (a smaller bound here would drop a job the client was told was
   * accepted) up to Redis's own limit on a value. */
  o->max_payload = 512u << 20;
}

/* The rule that links the two (DESIGN.md, "Fleet mode"): a claim time shorter than a few
 * heartbeats lets a live daemon's jobs be taken over. */
static int fc_check_claim(const vs_daemon_config *c, char *err, size_t errlen) {
  long long least = (long long)VS_FLEET_CLAIM_HEARTBEATS * c->fleet_heartbeat_ms;
  if (c->fleet_claim_idle_ms >= least) return VSPEC_OK;
  snprintf(err, errlen, "fleet.claim_idle_ms = %d is less than %d x fleet.heartbeat_ms (%d): "
           "another daemon would take over the jobs of a live daemon whose refreshes are a "
           "little late; set claim_idle_ms to at least %lld or heartbeat_ms to at most %d",
           c->fleet_claim_idle_ms, VS_FLEET_CLAIM_HEARTBEATS, c->fleet_heartbeat_ms, least,
           c->fleet_claim_idle_ms / VS_FLEET_CLAIM_HEARTBEATS);
  return VSPEC_EINVAL;
}

int vs_fleet_config_check(const vs_daemon_config *c, char *err, size_t errlen) {
  if (!c->fleet_redis[0]) return VSPEC_OK; /* fleet mode off: the keys are not used */
  /* The same checks the queue makes when it opens, without connecting. */
  vs_fleet_opts o;
  vs_fleet_queue *q = NULL;
  vs_fleet_config_opts(c, &o);
  int rc = vs_fleet_queue_open(&o, &q, err, errlen);
  vs_fleet_queue_destroy(&q);
  if (rc) return rc;
  return fc_check_claim(c, err, errlen);
}
