/*
 * proto/endpoint_probe.h - is anything listening on a ZeroMQ endpoint? A plain socket
 * connect, before ZeroMQ is involved.
 *
 * A ZeroMQ connect never fails: it retries in the background, so a client of a daemon that
 * is not running learns it only when its own timeout runs out. The CLI probes first and says
 * at once what is wrong (nothing listening, no such socket file, no route); vspecd probes its
 * ipc endpoints before binding them, because binding an ipc path that another process serves
 * silently takes it over.
 */
#ifndef VS_ENDPOINT_PROBE_H
#define VS_ENDPOINT_PROBE_H

#include <stddef.h>

/* For tcp://HOST:PORT and ipc://PATH (not abstract ones): 1 when a connection was accepted,
 * 0 when nothing listens there (err says what happened: refused, no such file, not a socket,
 * no answer within timeout_ms), VS_PROBE_DENIED when an ipc socket file exists but this
 * process may not connect to it (err names its owner, group and mode), a negative status
 * when the endpoint cannot be probed (another transport, a wildcard host; err empty), so the
 * caller carries on as before. */
#define VS_PROBE_DENIED 2
int vs_endpoint_probe(const char *endpoint, int timeout_ms, char *err, size_t errlen);

/* The security mechanism a ZeroMQ peer at a tcp:// or ipc:// endpoint announces in its ZMTP
 * greeting ("NULL", "CURVE", "PLAIN"), read by sending a greeting of our own: 1 when mech
 * was filled, 0 when no greeting came within timeout_ms. For telling a wrong CURVE server
 * key (the peer speaks CURVE) from a plaintext peer when libzmq's handshake events say
 * neither. */
int vs_endpoint_mechanism(const char *endpoint, int timeout_ms, char mech[21]);

#endif /* VS_ENDPOINT_PROBE_H */
