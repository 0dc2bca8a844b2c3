"""vspec.errors - the exceptions of the Python client.

VspecError carries the daemon's ErrorCode (proto/vspec.proto) by name and number, the way
the vspec CLI prints it ("vspec: invalid: ..."); the client's own failures (nothing
listening, no answer in time, a message that does not parse) are subclasses with codes of
their own, so one `except VspecError` catches everything the client raises about the
daemon.
"""

from . import vspec_pb2 as pb

# The names the CLI prints for each ErrorCode (proto/wire.c, vs_wire_error_name).
_NAMES = {
    pb.ERR_MALFORMED: "malformed",
    pb.ERR_INVALID: "invalid",
    pb.ERR_BUSY: "busy",
    pb.ERR_CANCELLED: "cancelled",
    pb.ERR_DEADLINE: "deadline",
    pb.ERR_NOT_FOUND: "not-found",
    pb.ERR_FORBIDDEN: "forbidden",
    pb.ERR_SHUTTING_DOWN: "shutting-down",
    pb.ERR_INTERNAL: "internal",
    pb.ERR_TOO_LARGE: "too-large",
    pb.ERR_VERSION: "version",
    pb.ERR_UNAVAILABLE: "unavailable",
}


def error_name(code):
    """The CLI's name of an ErrorCode number ("unknown" for one it does not know)."""
    return _NAMES.get(code, "unknown")


class VspecError(Exception):
    """An error the daemon sent (or one of the subclasses below).

    code: the ErrorCode's name ("invalid", "busy", "cancelled", ...); code_value: its number
    (None for the client's own errors); message: the daemon's text; retry_after_ms: set
    with busy and shutting-down; job_id: the job it ended, when it ended one.
    """

    def __init__(self, code, message, code_value=None, retry_after_ms=None, job_id=None):
        self.code = code
        self.code_value = code_value
        self.message = message
        self.retry_after_ms = retry_after_ms
        self.job_id = job_id
        text = "%s: %s" % (code, message)
        if retry_after_ms is not None:
            text += " (retry after %d ms)" % retry_after_ms
        super().__init__(text)

    @classmethod
    def from_pb(cls, err, job_id=None):
        retry = err.retry_after_ms if err.HasField("retry_after_ms") else None
        return cls(error_name(err.code), err.message, err.code, retry, job_id)


class VspecUnreachable(VspecError):
    """Nothing listens on the endpoint (the CLI's exit status 3, said at once)."""

    def __init__(self, message):
        super().__init__("unreachable", message)


class VspecTimeout(VspecError):
    """The daemon said nothing for `timeout` seconds."""

    def __init__(self, message):
        super().__init__("timeout", message)


class VspecProtocolError(VspecError):
    """A message from the other end that breaks the protocol (framing, version, blobs)."""

    def __init__(self, message):
        super().__init__("protocol", message)
