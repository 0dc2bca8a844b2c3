/*
 * core/host.h - the services table (vspec_host) the host hands to plugins.
 */
#ifndef VS_HOST_H
#define VS_HOST_H

#include "vspec/plugin.h"

/* Fills `host` with the host's services and the given device ops table. */
void vs_host_init(vspec_host *host, const vspec_ops *ops);

#endif /* VS_HOST_H */
