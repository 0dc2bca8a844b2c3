"""vspec.events - the typed events of a job's stream and the result of a finished job.

Client.stream() yields, in order: Accepted (always first), then Progress and Preview as
the job runs, Phase while it does something else for a while (size=auto tuning, a model
loading, a fleet job waiting for another daemon), Notice for what its user should read once
(size=auto's choice, a fallback to AR), Restarted in fleet mode, and last exactly one Done
(with the Result) or Failed (with the VspecError). Every event has the job's id and its
sequence number (from 0, no gaps in what the daemon sent).
"""

import struct
from dataclasses import dataclass, field
from typing import List, Optional

from . import vspec_pb2 as pb
from .errors import VspecError

PREVIEW_KINDS = {"none": pb.PREVIEW_NONE, "tokens": pb.PREVIEW_TOKENS, "lut": pb.PREVIEW_LUT,
                 "decode": pb.PREVIEW_DECODE}
_PREVIEW_NAMES = {v: k for k, v in PREVIEW_KINDS.items()}


def _opt(msg, name):
    return getattr(msg, name) if msg.HasField(name) else None


@dataclass
class Stats:
    """What the job cost (docs/DESIGN.md "Metrics": the CLI's and the bench's definitions)."""

    tokens: int = 0
    target_forwards: int = 0
    rounds: int = 0
    drafted: int = 0  # depths the verification walk examined
    accepted: int = 0
    draft_tokens: int = 0  # every draft token the target scored (tree nodes but the roots)
    tpf: float = 0.0  # tokens per target forward
    mal: float = 0.0  # mean accepted length
    accept_rate: float = 0.0  # accepted / draft_tokens (vLLM's draft acceptance rate)
    walk_accept_rate: float = 0.0  # accepted / drafted (per depth the walk examined)
    generate_s: float = 0.0  # engine wall time, previews included
    decode_s: float = 0.0  # final image decode + PNG
    queue_s: float = 0.0  # accepted -> started
    preview_s: float = 0.0
    previews: int = 0
    skipped_rounds: int = 0
    unverified_tokens: int = 0
    rule_version: Optional[str] = None
    sched_version: Optional[str] = None
    model_generation: int = 0
    seed: Optional[int] = None  # the seed the job ran with (drawn by the daemon if unset)
    latency_s: float = 0.0  # submit to result, as this client saw it

    @classmethod
    def from_pb(cls, st, seed, latency_s):
        s = cls(seed=seed, latency_s=latency_s)
        for f in ("tokens", "target_forwards", "rounds", "drafted", "accepted", "draft_tokens",
                  "tpf", "mal", "accept_rate", "walk_accept_rate", "generate_s", "decode_s", "queue_s", "preview_s", "previews",
                  "skipped_rounds", "unverified_tokens", "model_generation"):
            setattr(s, f, getattr(st, f))
        s.rule_version = _opt(st, "rule_version")
        s.sched_version = _opt(st, "sched_version")
        return s


@dataclass
class Result:
    """A finished job: the PNG file's bytes, its stats and the token grid."""

    job_id: int
    png: bytes
    stats: Stats
    width: int = 0
    height: int = 0
    grid_h: int = 0
    grid_w: int = 0
    seed: Optional[int] = None
    describe: Optional[str] = None  # "model=... method=... seed=..." (also in the PNG)
    node: Optional[str] = None
    tokens: List[int] = field(default_factory=list)  # raster order (all 0: continuous model)
    token_status: bytes = b""  # one TokenStatus per token
    notes: List[str] = field(default_factory=list)  # what the job's Notice events said
    class_label: Optional[int] = None  # as the job's Accepted said (prompt= is matched there)
    class_name: Optional[str] = None

    def save(self, path):
        """Writes the PNG to `path`."""
        with open(path, "wb") as f:
            f.write(self.png)


@dataclass
class Event:
    job_id: int
    seq: int


@dataclass
class Accepted(Event):
    queue_position: int = 0  # 0 = starts now
    model: Optional[str] = None  # None: a fleet gateway queued it; a daemon's Accepted follows
    method: Optional[str] = None  # canonical spelling
    node: Optional[str] = None
    tokens_total: int = 0
    grid_h: int = 0
    grid_w: int = 0
    seed: Optional[int] = None
    # class-conditional models: the class the job draws (class_label=, prompt='s match, or
    # 0) and its name when the model names its classes
    class_label: Optional[int] = None
    class_name: Optional[str] = None


@dataclass
class Progress(Event):
    round: int = 0  # -1 while queued
    tokens_done: int = 0
    tokens_total: int = 0
    tpf: float = 0.0
    mal: float = 0.0
    accept_rate: float = 0.0
    elapsed_s: float = 0.0
    queue_position: int = 0
    # the token-map delta since the previous progress event (positions, their tokens and
    # TokenStatus); coalesced when the client is slow: the newest state wins
    positions: List[int] = field(default_factory=list)
    tokens: List[int] = field(default_factory=list)
    status: List[int] = field(default_factory=list)
    coalesced: int = 0


@dataclass
class Preview(Event):
    kind: str = "lut"  # tokens | lut | decode
    round: int = 0
    tokens_done: int = 0
    tokens_total: int = 0
    width: int = 0
    height: int = 0
    png: Optional[bytes] = None


@dataclass
class Restarted(Event):
    """Fleet mode: run again from the start on `node`; an Accepted follows."""

    delivery: int = 0
    node: Optional[str] = None


@dataclass
class Phase(Event):
    """A phase other than generating: "tuning", "loading", "waiting" (fleet mode). Sent when
    it starts, as it advances and with done = 1 when it ends; a client's ETA should count
    the generation only."""

    name: Optional[str] = None
    message: Optional[str] = None  # for people: "size=auto: tuning sd:exact (3 of 9)"
    done: Optional[float] = None  # share done, 0..1; None: unknown
    eta_s: Optional[float] = None  # seconds it should still take; None: unknown


@dataclass
class Notice(Event):
    """Something about how the job runs to tell its user once (Result.notes repeats it)."""

    kind: Optional[str] = None  # "autotune", "fallback", ...
    message: Optional[str] = None


@dataclass
class Done(Event):
    result: Optional[Result] = None


@dataclass
class Failed(Event):
    error: Optional[VspecError] = None


def _tokens_i32(data):
    n = len(data) // 4
    return list(struct.unpack("<%di" % n, data[: 4 * n])) if n else []


def from_message(msg, latency_s):
    """The typed event of a received job event (None for one a client ignores)."""
    ev = msg.event
    kind = ev.WhichOneof("body")
    job, seq = ev.job_id, ev.seq
    if kind == "accepted":
        a = ev.accepted
        return Accepted(job, seq, a.queue_position, _opt(a, "model"), _opt(a, "method"),
                        _opt(a, "node"), a.tokens_total, a.grid_h, a.grid_w, _opt(a, "seed"),
                        _opt(a, "class_label"), _opt(a, "class_name"))
    if kind == "progress":
        p = ev.progress
        return Progress(job, seq, p.round, p.tokens_done, p.tokens_total, p.tpf, p.mal,
                        p.accept_rate, p.elapsed_s, p.queue_position, list(p.positions),
                        list(p.tokens), list(p.status), p.coalesced)
    if kind == "preview":
        p = ev.preview
        return Preview(job, seq, _PREVIEW_NAMES.get(p.kind, str(p.kind)), p.round,
                       p.tokens_done, p.tokens_total, p.width, p.height, msg.blob(pb.BLOB_PNG))
    if kind == "restarted":
        return Restarted(job, seq, ev.restarted.delivery, _opt(ev.restarted, "node"))
    if kind == "phase":
        p = ev.phase
        return Phase(job, seq, _opt(p, "name"), _opt(p, "message"), _opt(p, "done"),
                     _opt(p, "eta_s"))
    if kind == "notice":
        return Notice(job, seq, _opt(ev.notice, "kind"), _opt(ev.notice, "message"))
    if kind == "error":
        return Failed(job, seq, VspecError.from_pb(ev.error, job or None))
    if kind == "result":
        r = ev.result
        seed = _opt(r, "seed")
        res = Result(job_id=job, png=msg.blob(pb.BLOB_PNG) or b"",
                     stats=Stats.from_pb(r.stats, seed, latency_s), width=r.width,
                     height=r.height, grid_h=r.grid_h, grid_w=r.grid_w, seed=seed,
                     describe=_opt(r, "describe"), node=_opt(r, "node"),
                     tokens=_tokens_i32(msg.blob(pb.BLOB_TOKENS_I32LE) or b""),
                     token_status=msg.blob(pb.BLOB_STATUS_U8) or b"", notes=list(r.notes))
        return Done(job, seq, res)
    return None
