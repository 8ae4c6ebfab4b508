"""The server's load, as the executor reads it: the one answer to "why did my request run on
the loop, in a thread, or wait for company?".

Both listeners feed it: the HTTP listener registers its set of requests in progress (uvicorn's
one task per request, and the plain inference requests its edge reads itself,
app/servekit/http/connection.py) and notes each plain inference request it reads
(:meth:`Load.note_read`); the gRPC servicer counts the unary inference calls it holds
(:attr:`Load.grpc_calls`). A version's executor (app/servekit/services/execution/executor.py)
asks two things, and nothing else about the load:

- :meth:`Load.in_progress`: how many requests the listeners hold right now (the one asking
  included). A batching model runs a request at once when it is the only one, and otherwise
  lets the others catch up with it (``ModelExecutor.run_now`` and ``_may_wait``); a model
  measured fast runs a lone request on the loop and sends it to a thread when others are in
  progress (``ModelExecutor.run_inline``).
- :meth:`Load.read_together`: 1 while the HTTP listener reads several plain inference requests
  a loop pass, else 0. Requests read in one pass are answered one after the other, each alone
  in progress when it reaches the model (the one before it already answered on the loop, the
  next still in its socket's buffer): counted only by what the listener held, every request at
  64 in flight ran on the loop by itself and batches never formed (medium model, REST binary:
  1.6 rows per model run). A pass that reads several says the load is there, and so does the
  next pass that reads any. An unbatched model measured fast then runs the pass's requests back
  to back at its end (``ModelExecutor._gathers``); a batching one counts it as one more request
  in progress.

Counting reads costs one ``call_soon`` per loop pass that reads any (about 2-3% of a tiny
request's instructions at one in flight), so it starts only once something asks
(:meth:`Load.read_together`: a request for a model placed on the loop, a pipeline's step); a
server whose models all run in their threads never pays. With no listener (in process) both
answers are 0: never alone, batching as usual.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection


class CallCount:
    """A count a listener keeps of the calls it holds (one attribute: the hot path adds one
    to it and takes one away)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


class Load:
    """The requests the listeners hold and read (see the module docstring)."""

    __slots__ = ("_http", "grpc_calls", "last", "now", "watched")

    def __init__(self) -> None:
        self._http: Collection[object] = ()
        self.grpc_calls = CallCount()
        """Unary gRPC inference calls the servicer holds (app/servekit/grpc/servicer.py)."""
        self.now = 0
        """Plain inference requests the HTTP listener read in this loop pass."""
        self.last = 0
        """The same, in the last pass that read any."""
        self.watched = False
        """Reads are counted (someone asked :meth:`read_together`)."""

    def listen_http(self, requests: Collection[object]) -> None:
        """The HTTP listener's requests in progress (uvicorn's task set, where the edge puts
        the requests it answers itself too), set once it listens."""
        self._http = requests

    def note_read(self, loop: asyncio.AbstractEventLoop) -> None:
        """The HTTP edge read one plain inference request in this loop pass."""
        if self.watched:
            if not self.now:
                loop.call_soon(self._next_pass)
            self.now += 1

    def _next_pass(self) -> None:
        self.last = self.now
        self.now = 0

    def read_together(self) -> int:
        """1 when this pass or the last that read any read more than one request, else 0.
        The first call starts the counting."""
        if self.now > 1 or self.last > 1:
            return 1
        self.watched = True
        return 0

    def in_progress(self) -> int:
        """Requests the listeners hold now: HTTP requests in progress (counted up to two: only
        whether a request is alone is asked), unary gRPC calls, and one more while the HTTP
        listener reads several a pass (:meth:`read_together`)."""
        held = len(self._http)
        if held > 1:
            held = _unfinished(self._http)
        return held + self.grpc_calls.n + self.read_together()


def _unfinished(requests: Collection[object]) -> int:
    """The requests of ``requests`` still in progress, up to two. A uvicorn task that has
    answered stays in its listener's set until its done callback runs, which asyncio schedules
    for a later step: a request read in the same step must not count it, or after a
    ``GET /metrics`` a batching model's lone request waited a loop pass for company."""
    count = 0
    for request in requests:
        if type(request) is not asyncio.Task or not request.done():
            count += 1
            if count == 2:
                break
    return count
