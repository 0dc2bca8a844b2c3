/*
 * fleet/fleet_config.h - vspecd's [fleet] section (daemon/config.h) as the fleet queue's
 * options, and its checks: the fleet's part of vspecd's configuration lives with the fleet,
 * so that daemon/ needs nothing of fleet/ (DESIGN.md, "Layout").
 */
#ifndef VS_FLEET_CONFIG_H
#define VS_FLEET_CONFIG_H

#include <stddef.h>

#include "daemon/config.h"
#include "fleet/fleet_queue.h"

/* The fleet queue's options from [fleet] (consumer = server.node); strings point into c. */
void vs_fleet_config_opts(const vs_daemon_config *c, vs_fleet_opts *o);
/* With fleet mode on (fleet.redis set): the checks the queue makes when it opens, without
 * connecting, and the claim rule (VS_FLEET_CLAIM_HEARTBEATS). After vs_config_check. */
int vs_fleet_config_check(const vs_daemon_config *c, char *err, size_t errlen);

#endif /* VS_FLEET_CONFIG_H */
