"""One request's account: its statistics, its error and its hold on the version it runs.

Every path that runs a model (``DataPlane.infer``, a pipeline's step, a pipeline as a whole, a
sequence model's request, a decoupled model's stream) wraps the run in an :class:`Account`, so
that what a request costs and how it fails is written once: a ServeError is counted as a
failure and passed on, any other exception (a runtime's bug) is counted, logged under a
reference and becomes a clean Internal error (its text may hold paths or secrets), and a
request cancelled or abandoned (its client left: CancelledError, GeneratorExit) is neither.
The version the request holds (``VersionEntry.enter``: unload and drain wait for it) is let go
whatever happens. Success is recorded by the path itself (``succeeded``, ``clocks``), since
only it knows how the model ran (on the loop, in its threads, batched).
"""

from __future__ import annotations

import logging
import time
from types import TracebackType

from servekit.errors import Internal, ServeError, internal_error
from servekit.models.repository import VersionEntry
from servekit.services.stats import VersionStats

log = logging.getLogger("servekit.dataplane")


class Account:
    """A request's account (see the module docstring); ``with Account(...) as account:``."""

    __slots__ = ("held", "model", "started", "stats")

    def __init__(
        self,
        stats: VersionStats,
        model: str,
        started: int,
        held: VersionEntry | None = None,
    ) -> None:
        """``started``: ``time.perf_counter_ns()`` when the request began (the caller has
        read it already). ``held``: a version the request has entered, to leave at the end."""
        self.stats = stats
        self.model = model
        self.started = started
        self.held = held

    def hold(self, version: VersionEntry) -> None:
        """The request starts using ``version`` now (left when the account closes). A call
        that runs to its answer with no await need not: nothing can see the count between."""
        version.enter()
        self.held = version

    def succeeded(
        self,
        rows: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        executed: bool,
        ended: int | None = None,
    ) -> None:
        """Count a success by its durations (``VersionStats.record_success``). ``executed``:
        the model run is counted here too (no executor thread counted it)."""
        self.stats.record_success(rows, queue_ns, input_ns, infer_ns, output_ns, executed, ended)

    def clocks(self, rows: int, input_done: int, infer_done: int, ended: int) -> None:
        """Count a success run on the loop by its clocks (``VersionStats.record_clocks``: no
        arithmetic), the model run with it."""
        self.stats.record_clocks(rows, 0, self.started, input_done, infer_done, ended)

    def __enter__(self) -> Account:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        held = self.held
        if held is not None:
            held.leave()
        if error is None or not isinstance(error, Exception):
            return  # answered, or cancelled/abandoned: neither a success nor a failure here
        self.stats.record_failure(time.perf_counter_ns() - self.started)
        if isinstance(error, ServeError):
            return
        # A runtime's bug: a clean error for the client, raised at once (kept in a local of a
        # frame the traceback holds, a disconnected SSE client's model generator was seen to
        # stay open: tests/test_decoupled.py).
        where = f"model {self.model!r}"
        raise Internal(f"{where} failed: {internal_error(log, error, where)}") from error
