"""vspec.job - one submitted job followed by its Client: the iterator of its events.

The Client sorts received events into each Job's inbox (several jobs may be in flight on
one connection); the Job turns them into typed events (vspec.events), gives credit back
as they are taken, and remembers the result or the error.
"""

import collections
import time

from . import events as ev_mod
from .errors import VspecError


class Job:
    """A submitted job's events, as an iterator of typed events (vspec.events).

    Iterating takes the job's events in order: Accepted, Progress/Preview/Phase/Notice/
    Restarted, then Done or Failed, after which the iteration stops. Credit for each progress
    or preview event is given back when the next event is asked for, so a slow consumer slows
    the events down instead of piling them up (the daemon keeps only the newest state);
    phases and notices take no credit.
    close() (or leaving a `with` block) before the end cancels the job.
    """

    def __init__(self, client, request_id):
        self._client = client
        self.request_id = request_id
        self.job_id = None
        self.result = None  # the Result once Done was taken
        self._class = (None, None)  # the daemon's Accepted: (class_label, class_name)
        self.error = None  # the VspecError once Failed was taken
        self._inbox = collections.deque()
        self._terminal_seen = False  # a result or error is in the inbox (or was taken)
        self._finished = False  # the terminal event was taken, or the job was given up
        self._closed = False
        self._cancel_sent = False
        self._owed_credit = 0
        self._t0 = time.monotonic()

    def __iter__(self):
        return self

    def __next__(self):
        while not self._finished:
            if self._owed_credit and self.job_id is not None:
                self._client._send_credit(self.job_id, self._owed_credit)
                self._owed_credit = 0
            msg = self._client._next_for(self)
            e = ev_mod.from_message(msg, time.monotonic() - self._t0)
            if e is None:
                continue
            if isinstance(e, (ev_mod.Progress, ev_mod.Preview)):
                self._owed_credit += 1
            elif isinstance(e, ev_mod.Accepted) and e.model is not None:
                self._class = (e.class_label, e.class_name)
            elif isinstance(e, ev_mod.Done):
                self.result = e.result
                self.result.class_label, self.result.class_name = self._class
                self._end()
            elif isinstance(e, ev_mod.Failed):
                self.error = e.error
                self._end()
            return e
        raise StopIteration

    def wait(self):
        """Takes the remaining events; the Result, or raises the job's VspecError."""
        for _ in self:
            pass
        if self.error is not None:
            raise self.error
        return self.result

    def cancel(self):
        """Asks the daemon to cancel this job (Client.cancel)."""
        if self.job_id is None:
            raise VspecError("not-found", "the job has not been accepted yet")
        return self._client.cancel(self.job_id)

    def close(self):
        """Stops following the job; one not finished yet is cancelled (once its id is
        known), and its further events are dropped."""
        if self._finished:
            return
        self._closed = True
        self._finished = True
        self._inbox.clear()
        if self.job_id is not None and not self._terminal_seen:
            self._client._send_cancel(self)
        if self._terminal_seen:
            self._client._forget(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _end(self):
        self._finished = True
        self._client._forget(self)
