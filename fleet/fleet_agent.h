/*
 * fleet/fleet_agent.h - the part of a vspecd in fleet mode that takes jobs from Redis and
 * puts their events back (issue 13; DESIGN.md, "Fleet mode").
 *
 * The agent is one thread and one client of its own daemon: it connects to the daemon's job
 * socket over inproc and submits each job it reads from the jobs stream exactly as a client
 * would, so fleet jobs get the same validation, fairness, credit, cancel and drain as any
 * other. Every event the daemon sends back is written to the job's event stream (the job id
 * replaced by the fleet's), and the job is acknowledged in Redis only after its terminal event
 * is there. It never holds more jobs than the daemon has workers, so a job waits in Redis, not
 * in one daemon's queue, while another daemon could run it.
 *
 * While it runs a job the agent keeps the job's claim fresh every [fleet] heartbeat_ms
 * (vs_fleet_touch) and polls its cancel flag. Every heartbeat, busy or not, it sweeps the
 * group for jobs idle for claim_idle_ms (a daemon that died): it tells each one's client
 * (a Phase "waiting", once per lost run, vs_fleet_announce_loss) and, with a free slot,
 * takes the job over (vs_fleet_claim); a job delivered more than [fleet] max_deliveries
 * times is failed as a poison job. Jobs it leaves while draining are announced and handed
 * over at once (vs_fleet_release). Redis unreachable is retried with a backoff, logged once
 * each way.
 */
#ifndef VS_FLEET_AGENT_H
#define VS_FLEET_AGENT_H

#include <stddef.h>

#include "daemon/config.h"
#include "daemon/server.h"

typedef struct vs_fleet_agent vs_fleet_agent;

/* Starts the agent's thread; `endpoint` is an endpoint of the daemon's job socket in the
 * ZeroMQ context `zctx` (an inproc one). cfg must outlive the agent. */
int vs_fleet_agent_start(const vs_daemon_config *cfg, void *zctx, const char *endpoint,
                         vs_fleet_agent **out, char *err, size_t errlen);
/* Takes no new job from now on (the daemon is draining); jobs already running go on. */
void vs_fleet_agent_drain(vs_fleet_agent *a);
/* Stops the thread after it has written what its daemon already sent (up to a few seconds),
 * frees the agent and sets *a to NULL. Jobs not finished stay pending in Redis, where another
 * daemon takes them over once they have been idle for claim_idle_ms. */
void vs_fleet_agent_stop(vs_fleet_agent **a);

/* The agent as a front of vspecd's service (daemon/server.h), on inproc://vspecd-fleet: started
 * once the service's sockets are bound, told when it drains, stopped first at close. */
extern const vs_server_front vs_fleet_front;

#endif /* VS_FLEET_AGENT_H */
