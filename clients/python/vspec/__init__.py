"""vspec - the Python client of vspecd (proto/vspec.proto over ZeroMQ).

    import vspec
    with vspec.Client("tcp://127.0.0.1:5555") as c:
        r = c.generate(class_label=7, method="sd:lantern:delta=0.2", seed=1)
        open("img.png", "wb").write(r.png)
        print(r.stats.tpf, r.stats.mal, r.stats.accept_rate)

clients/python/README.md has the rest: streaming events and previews, cancel, status,
CURVE, errors.
"""

from .client import DEFAULT_ENDPOINT, Client
from .job import Job
from .errors import (VspecError, VspecProtocolError, VspecTimeout, VspecUnreachable,
                     error_name)
from .events import (Accepted, Done, Event, Failed, Notice, Phase, Preview, Progress,
                     Restarted, Result, Stats)

__all__ = ["Client", "Job", "DEFAULT_ENDPOINT", "VspecError", "VspecUnreachable",
           "VspecTimeout", "VspecProtocolError", "error_name", "Event", "Accepted",
           "Progress", "Preview", "Phase", "Notice", "Restarted", "Done", "Failed", "Result",
           "Stats"]
