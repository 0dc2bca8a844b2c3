"""vspec.client - a connection to vspecd (or vspec-gateway) and its jobs.

It speaks the protocol as the vspec CLI does (clients/vspec.c, clients/conn.c): one DEALER
socket, every message led by the empty delimiter frame, request ids from 1 per connection
(the replies that are not job events echo them; job events carry the submit's id and then
the job id), credit-based flow control (a submit grants 8 progress/preview events, each one
the caller has taken is granted back), heartbeats ignored, and a plain socket connection
first, so that a daemon that is not running is reported at once instead of after the
timeout.

Several jobs may be in flight on one Client: events are sorted by job into each Job's inbox
as they arrive, whichever job the caller is waiting on. A Client is not thread-safe (neither
is a ZeroMQ socket): use one per thread.
"""

import os
import time

import zmq
from zmq.utils import monitor as zmq_monitor

from . import vspec_pb2 as pb
from . import events as ev_mod
from . import keys, probe, wire
from .errors import VspecError, VspecTimeout, VspecUnreachable
from .job import Job

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"  # the CLI's default job endpoint
INITIAL_CREDIT = 8  # the CLI's: progress/preview events the daemon may send unacknowledged
PROBE_TIMEOUT_S = 2.0  # the CLI's probe before connecting
_HANDSHAKE_FAILURES = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL |
                       zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)

# Submit fields a caller may set by keyword (proto/vspec.proto, message Submit).
_SUBMIT_OPTIONS = ("temperature", "top_k", "top_p", "cfg_scale", "cfg_interval", "num_iter",
                   "cfg_schedule", "accept", "accept_params", "sched", "sched_params", "draft",
                   "preview_every_tokens", "preview_every_rounds", "deadline_ms", "priority",
                   "tag", "progress", "progress_interval_ms", "job_id", "prompt")


def _params_text(value):
    """"k=v,k=v" from a dict (or the text itself)."""
    if isinstance(value, dict):
        return ",".join("%s=%s" % (k, v) for k, v in value.items())
    return value


def _repeated(fd):
    # protobuf 6 added is_repeated and later ones dropped label
    rep = getattr(fd, "is_repeated", None)
    return rep if rep is not None else fd.label == fd.LABEL_REPEATED


def _to_dict(msg):
    """A protobuf message as plain dicts, lists and numbers (the fields that are set):
    json_format would turn every 64-bit integer into a string."""
    out = {}
    for fd, value in msg.ListFields():
        if fd.type == fd.TYPE_MESSAGE:
            if _repeated(fd):
                out[fd.name] = [_to_dict(v) for v in value]
            else:
                out[fd.name] = _to_dict(value)
        elif _repeated(fd):
            out[fd.name] = list(value)
        else:
            out[fd.name] = value
    return out


class Client:
    """A connection to a vspec job endpoint.

    endpoint: default $VSPEC_SERVER, else tcp://127.0.0.1:5555 (the CLI's). server_key: the
    server's CURVE public key (Z85) or a file holding it (default $VSPEC_CURVE_SERVER_KEY);
    client_keys: this client's key file from `vspec keygen` (default $VSPEC_CURVE_KEY), or a
    (public, secret) pair of Z85 keys. timeout: seconds without a word from the daemon
    before a call gives up (the CLI's --timeout, default 30).

    Raises VspecUnreachable at once when nothing listens on a tcp:// or ipc:// endpoint.
    """

    def __init__(self, endpoint=None, server_key=None, client_keys=None, timeout=30.0,
                 context=None):
        self.endpoint = endpoint or os.environ.get("VSPEC_SERVER") or DEFAULT_ENDPOINT
        self.timeout = float(timeout)
        if self.timeout <= 0:
            raise ValueError("timeout must be positive, not %r" % timeout)
        if server_key is None:
            server_key = os.environ.get("VSPEC_CURVE_SERVER_KEY") or None
        if client_keys is None:
            client_keys = os.environ.get("VSPEC_CURVE_KEY") or None
        # ZeroMQ would retry quietly until our timeout: say now that nobody is there.
        why = probe.probe(self.endpoint, PROBE_TIMEOUT_S)
        if why:
            raise VspecUnreachable("cannot reach %s: %s; is vspecd (or vspec-gateway) running "
                                   "there?" % (self.endpoint, why))
        self._own_ctx = context is None
        self._ctx = context or zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 200)
        self._mon = None
        try:
            # A refused CURVE key or a mechanism mismatch looks like silence to a socket;
            # the monitor lets a timeout say which it was.
            self._mon = self._sock.get_monitor_socket(_HANDSHAKE_FAILURES)
            if server_key:
                self._curve(server_key, client_keys)
            self._sock.connect(self.endpoint)
        except Exception:
            self.close()
            raise
        self._next_rid = 1
        self._jobs = {}  # job id -> Job
        self._by_rid = {}  # submit request id -> Job
        self._waiting = set()  # request ids of calls waiting for their reply
        self._replies = {}  # request id -> wire.Message

    def _curve(self, server_key, client_keys):
        if not client_keys:
            raise ValueError("CURVE needs this client's key file too (vspec keygen NAME)")
        if isinstance(client_keys, (tuple, list)):
            pub, sec = client_keys
        else:
            pub = keys.read_key(client_keys, "public")
            sec = keys.read_key(client_keys, "secret")
        self._sock.curve_serverkey = keys.key_arg(server_key, "public").encode()
        self._sock.curve_publickey = pub.encode() if isinstance(pub, str) else pub
        self._sock.curve_secretkey = sec.encode() if isinstance(sec, str) else sec

    # ---- lifecycle ---------------------------------------------------------------------

    def close(self):
        """Cancels the jobs still followed and closes the connection."""
        sock = getattr(self, "_sock", None)
        if sock is None:
            return
        for job in list(getattr(self, "_jobs", {}).values()):
            if not job._terminal_seen and not job._cancel_sent:
                self._send_cancel(job)
        if self._mon is not None:
            sock.disable_monitor()
            self._mon.close()
            self._mon = None
        sock.close()
        self._sock = None
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- jobs --------------------------------------------------------------------------

    def stream(self, class_label=None, method=None, model=None, seed=None, preview=None,
               credit=INITIAL_CREDIT, **options):
        """Submits a job and returns its Job, an iterator of typed events.

        class_label: class-conditional models (unset: class 0); or prompt="a photo of an
        ankle boot": the class in words, matched by the daemon (a number, a name in any case,
        or a text holding one; Accepted and the Result say which class). method: "ar" or
        "sd:RULE[:PARAMS][@SCHED[:PARAMS]]" (or give accept=, accept_params=, sched=,
        sched_params=, draft=). model: a model the daemon serves (unset: its default).
        seed: unset draws a fresh one in the daemon, reported in Accepted.seed and
        Result.seed (the CLI and the HTTP endpoint do the same). preview: "lut", "decode" or "tokens" for
        previews (with preview_every_tokens= or preview_every_rounds=). Other keywords are
        Submit fields: temperature, top_k, top_p, cfg_scale, cfg_interval, num_iter,
        cfg_schedule, deadline_ms, priority, tag, progress, progress_interval_ms, job_id.
        """
        sub = self._submit(class_label, method, model, seed, preview, credit, options)
        req = pb.Request()
        req.submit.CopyFrom(sub)
        rid = self._send(req)
        job = Job(self, rid)
        self._by_rid[rid] = job
        return job

    def generate(self, class_label=None, method=None, model=None, seed=None, **options):
        """Submits a job, waits for it and returns its Result (.png, .stats, .job_id, ...);
        raises VspecError when the daemon refuses or fails it."""
        with self.stream(class_label, method, model, seed, **options) as job:
            return job.wait()

    def cancel(self, job_id):
        """Cancels a job: one of this connection's, or any job through the admin endpoint.

        Returns once the daemon has answered (an operator's acknowledgement) or the job
        ended (its Failed "cancelled" event, or Done if it finished first, stays for the
        job's iterator). Raises VspecError "not-found" when there is no such running or
        queued job (of this client, on the job endpoint).
        """
        req = pb.Request()
        req.cancel.job_id = int(job_id)
        job = self._jobs.get(job_id)
        if job is not None:
            job._cancel_sent = True
        msg = self._call(req, lambda: job is not None and job._terminal_seen)
        if msg is None:
            return "job %d ended" % job_id
        if msg.event.WhichOneof("body") == "ack":
            return msg.event.ack.message or "ok"
        return "ok"

    # ---- admin-style requests (answered on the job endpoint as well) ---------------------

    def status(self):
        """The daemon's StatusReply as a dict: node, queued, queue_capacity, running,
        workers, models, plugins, totals, device, ... (the fields that are set). On the job
        endpoint (own_jobs_only: True) workers lists only this client's running jobs and
        models carry no dir; the admin endpoint answers with everything."""
        req = pb.Request()
        req.status.SetInParent()
        return _to_dict(self._call(req).event.status)

    def plugins(self):
        """The loaded plugins and (on the admin endpoint) the plugin directory, as a dict."""
        req = pb.Request()
        req.plugins.SetInParent()
        return _to_dict(self._call(req).event.plugins)

    def ping(self):
        """One round trip; returns the daemon's node name."""
        req = pb.Request()
        req.ping.SetInParent()
        return self._call(req).event.pong.node

    # ---- internals ---------------------------------------------------------------------

    def _submit(self, class_label, method, model, seed, preview, credit, options):
        unknown = sorted(set(options) - set(_SUBMIT_OPTIONS))
        if unknown:
            raise TypeError("unknown submit option(s) %s (known: %s)"
                            % (", ".join(unknown), ", ".join(_SUBMIT_OPTIONS)))
        # The CLI's usage checks, so that a mix-up is said here, before anything is sent.
        parts = [k for k in ("accept", "accept_params", "sched", "sched_params", "draft")
                 if options.get(k) is not None]
        if method is not None and parts:
            raise ValueError("give method= or %s, not both" % "/".join(parts))
        if options.get("accept") is None and parts:
            raise ValueError("%s need(s) accept=RULE" % ", ".join(parts))
        if class_label is not None and options.get("prompt") is not None:
            raise ValueError("give class_label= or prompt=, not both")
        sub = pb.Submit()
        if class_label is not None:
            sub.class_label = class_label
        if method is not None:
            sub.method = method
        if model is not None:
            sub.model = model
        if seed is not None:
            sub.seed = seed
        if preview is not None:
            if preview not in ev_mod.PREVIEW_KINDS:
                raise ValueError("preview: %r is not one of %s"
                                 % (preview, ", ".join(ev_mod.PREVIEW_KINDS)))
            sub.preview = ev_mod.PREVIEW_KINDS[preview]
        sub.credit = credit
        for k, v in options.items():
            if v is None:
                continue
            if k in ("accept_params", "sched_params"):
                v = _params_text(v)
            setattr(sub, k, v)
        return sub

    def _check_open(self):
        if self._sock is None:
            raise VspecError("closed", "the client is closed")

    def _send(self, req):
        self._check_open()
        rid = self._next_rid
        self._next_rid += 1
        self._sock.send_multipart(wire.pack_request(req, rid))
        return rid

    def _send_credit(self, job_id, grant):
        req = pb.Request()
        req.credit.job_id = job_id
        req.credit.grant = grant
        self._send(req)

    def _send_cancel(self, job):
        req = pb.Request()
        req.cancel.job_id = job.job_id
        job._cancel_sent = True
        self._send(req)

    def _forget(self, job):
        self._by_rid.pop(job.request_id, None)
        if job.job_id is not None:
            self._jobs.pop(job.job_id, None)

    def _no_answer(self):
        """The CLI's words for a daemon that said nothing, and the handshake's failure when
        the monitor saw one."""
        why = "is vspecd running there?"
        while self._mon is not None and self._mon.poll(0):
            event = zmq_monitor.recv_monitor_message(self._mon)["event"]
            if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                why = "the server refused this client's CURVE key (not on its allow-list?)"
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                why = ("the security handshake failed (CURVE on one side only, or the wrong "
                       "server key?)")
            elif why.startswith("is"):
                why = "the connection's handshake failed"
        return "no answer from %s within %.1f s: %s" % (self.endpoint, self.timeout, why)

    def _recv(self, timeout_s):
        """The next message within timeout_s, or None."""
        self._check_open()
        if not self._sock.poll(max(0, int(timeout_s * 1000))):
            return None
        return wire.unpack_event(self._sock.recv_multipart())

    def _dispatch(self, msg):
        """Sorts a received event: a call's reply, a followed job's event, or dropped."""
        ev = msg.event
        body = ev.WhichOneof("body")
        if body == "heartbeat":
            return
        rid = ev.request_id if ev.HasField("request_id") else None
        if rid in self._waiting:
            self._replies[rid] = msg
            return
        job = self._jobs.get(ev.job_id) if ev.HasField("job_id") else None
        if job is None and rid is not None:
            job = self._by_rid.get(rid)
            if job is not None and ev.HasField("job_id") and job.job_id is None:
                job.job_id = ev.job_id
                self._jobs[ev.job_id] = job
        if job is None:
            return  # a job given up on, or a reply that came after its call gave up
        terminal = body in ("result", "error")
        if job._closed:
            if terminal:
                job._terminal_seen = True
                self._forget(job)
            elif job.job_id is not None and not job._cancel_sent:
                self._send_cancel(job)
            return
        if terminal:
            job._terminal_seen = True
        job._inbox.append(msg)

    def _next_for(self, job):
        """The job's next message; VspecTimeout after `timeout` seconds in which the daemon
        said nothing at all (heartbeats count, as in the CLI)."""
        last = time.monotonic()
        while not job._inbox:
            left = self.timeout - (time.monotonic() - last)
            if left <= 0:
                job._finished = True
                self._forget(job)
                if job.job_id is None:
                    raise VspecTimeout(self._no_answer())
                raise VspecTimeout("the daemon said nothing about job %d for %.0f s"
                                   % (job.job_id, self.timeout))
            msg = self._recv(left)
            if msg is not None:
                last = time.monotonic()
                self._dispatch(msg)
        return job._inbox.popleft()

    def _call(self, req, done=None):
        """Sends req and waits up to `timeout` for the reply that echoes its request id
        (or until done() holds: then None). Raises the reply's error as VspecError."""
        rid = self._send(req)
        self._waiting.add(rid)
        try:
            end = time.monotonic() + self.timeout
            while rid not in self._replies and not (done and done()):
                left = end - time.monotonic()
                if left <= 0:
                    raise VspecTimeout(self._no_answer())
                msg = self._recv(left)
                if msg is not None:
                    self._dispatch(msg)
        finally:
            self._waiting.discard(rid)
        msg = self._replies.pop(rid, None)
        if msg is not None and msg.event.WhichOneof("body") == "error":
            raise VspecError.from_pb(msg.event.error)
        return msg
