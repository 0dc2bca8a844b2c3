"""vspec.wire - one protocol message as ZeroMQ frames (proto/vspec.proto, proto/wire.c).

On a DEALER talking to a ROUTER a message is

    [empty delimiter] [Request or Event, protobuf] [blob]*

The client sends the delimiter itself (DEALER adds no envelope). Large binary data (PNG
images, token grids) rides in blob frames after the protobuf frame, each described, in
order, by one entry of the message's `blobs` (kind, size); the sizes are checked against
the frames here, before anyone looks at them.
"""

from . import vspec_pb2 as pb
from .errors import VspecProtocolError

PROTOCOL_VERSION = pb.PROTOCOL_V1
MAX_BLOBS = 4  # proto/wire.h VS_WIRE_MAX_BLOBS


def pack_request(request, request_id):
    """The frames of a Request (version and request id filled in)."""
    request.version = PROTOCOL_VERSION
    request.request_id = request_id
    return [b"", request.SerializeToString()]


class Message:
    """One received event: the parsed Event and its blob frames by kind."""

    __slots__ = ("event", "blobs")

    def __init__(self, event, blobs):
        self.event = event
        self.blobs = blobs

    def blob(self, kind):
        """The bytes of the first blob of `kind` (a BlobKind), or None."""
        return self.blobs.get(kind)


def unpack_event(frames):
    """A Message from the frames of one received multipart message, or VspecProtocolError
    saying what is wrong with them."""
    if len(frames) < 2 or len(frames[0]) != 0:
        raise VspecProtocolError("a message without the empty delimiter frame (%d frame(s))"
                                 % len(frames))
    if len(frames) - 2 > MAX_BLOBS:
        raise VspecProtocolError("%d blob frames (at most %d)" % (len(frames) - 2, MAX_BLOBS))
    ev = pb.Event()
    try:
        ev.ParseFromString(bytes(frames[1]))
    except Exception as e:  # google.protobuf.message.DecodeError and friends
        raise VspecProtocolError("an event that does not parse: %s" % e) from None
    if ev.version != PROTOCOL_VERSION:
        raise VspecProtocolError("an event of protocol version %d (this client speaks %d)"
                                 % (ev.version, PROTOCOL_VERSION))
    if len(ev.blobs) != len(frames) - 2:
        raise VspecProtocolError("%d blob descriptor(s) for %d blob frame(s)"
                                 % (len(ev.blobs), len(frames) - 2))
    blobs = {}
    for i, d in enumerate(ev.blobs):
        data = bytes(frames[2 + i])
        if d.size != len(data):
            raise VspecProtocolError("blob %d: %d bytes, its descriptor says %d"
                                     % (i, len(data), d.size))
        blobs.setdefault(d.kind, data)
    return Message(ev, blobs)
