"""vspec.probe - is anything listening on a ZeroMQ endpoint? (proto/endpoint_probe.c)

A ZeroMQ connect never fails: it retries in the background, so a client of a daemon that
is not running would learn it only when its timeout ran out. The vspec CLI makes a plain
socket connection first (2 s at most) and says at once what is wrong; this does the same,
with the same messages.
"""

import errno
import os
import socket


def _connect(family, addr, timeout_s):
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout_s)
        s.connect(addr)
        return 0
    except socket.timeout:
        return errno.ETIMEDOUT
    except OSError as e:
        return e.errno or errno.EIO
    finally:
        s.close()


def _probe_ipc(path, timeout_s):
    e = _connect(socket.AF_UNIX, path, timeout_s)
    if e == 0:
        return None
    if e == errno.ENOENT:
        return "no socket file %s" % path
    if e == errno.ECONNREFUSED:
        return "nothing listening on %s (a socket file left by a process that is gone)" % path
    return "cannot connect to %s: %s" % (path, os.strerror(e))


def _probe_tcp(hostport, timeout_s):
    host, sep, port = hostport.rpartition(":")
    # "iface;host:port" (a source address), a bind wildcard: left to ZeroMQ, as in C
    if not sep or not host or ";" in hostport or host == "*":
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return "cannot resolve %s: %s" % (host, e.strerror)
    err = errno.ECONNREFUSED
    for family, _, _, _, addr in infos:
        err = _connect(family, addr, timeout_s)
        if err == 0:
            return None
    if err == errno.ECONNREFUSED:
        return "nothing listening on %s (connection refused)" % hostport
    if err == errno.ETIMEDOUT:
        return "no answer from %s within %d ms" % (hostport, int(timeout_s * 1000))
    return "cannot connect to %s: %s" % (hostport, os.strerror(err))


def probe(endpoint, timeout_s=2.0):
    """None when something accepted a connection on `endpoint` (or it cannot be probed:
    another transport, an abstract ipc name, a wildcard), else what went wrong."""
    if endpoint.startswith("ipc://") and len(endpoint) > 6 and endpoint[6] != "@":
        return _probe_ipc(endpoint[6:], timeout_s)
    if endpoint.startswith("tcp://"):
        return _probe_tcp(endpoint[6:], timeout_s)
    return None
