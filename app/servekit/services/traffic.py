"""Traffic between a model's versions: the version a request naming none reaches under
serve.yaml's ``traffic``, and the copies ``shadow`` sends to another version.

The DataPlane hands a request naming no version of a model with a ``Routing`` (app/servekit/
config/traffic.py) to :meth:`Traffic.infer`, for every protocol alike. The version is drawn
by the split: at random, or, when the request carries a ``servekit-traffic-key`` header (gRPC
metadata), from a hash of that key, so one user stays on one version while the split is
unchanged. A version of the split that is not ready is skipped: its requests reach the version
a request naming none would (the canary that failed to load costs no errors).

A shadow copy is sent after the answer is made, as a task of its own: at most
:data:`SHADOW_QUEUE` copies per shadow version wait or run at once, one more is dropped and
counted, and the copy's answer is only compared with the client's (``VersionStats.shadow`` of
the shadow version: agreed, disagreed, failed, dropped). The copy runs like any request of
that version (its own queue and threads, its statistics), so it never holds the answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from bisect import bisect_right
from collections.abc import Awaitable, Callable
from dataclasses import replace

import numpy as np

from servekit.config.traffic import TRAFFIC_KEY_HEADER, Routing
from servekit.models.repository import ModelEntry, State, VersionEntry
from servekit.observability.request_ids import sent_header
from servekit.services.state import ServerState
from servekit.services.stats import Statistics
from servekit.types import InferRequest, InferResponse, Tensor

SHADOW_QUEUE = 64
"""Copies one shadow version may have waiting or running at once; past it a copy is dropped
(counted ``dropped``), so a slow shadow costs the served version nothing."""
RTOL = 1e-4
ATOL = 1e-5
"""Two floating-point outputs agree when every element is within ``ATOL + RTOL * |served|``
of the served answer's (``numpy.allclose``, NaN equal to NaN); other datatypes must be equal."""
OUTCOMES = ("agreed", "disagreed", "failed", "dropped")
"""What happened to shadow copies, as statistics, metrics and the dashboard count them."""

Run = Callable[[InferRequest, float | None, float | None, bool], Awaitable[InferResponse]]
"""The DataPlane's inference of a request naming its version (request, deadline, arrived,
step)."""


def draw(key: bytes | None) -> float:
    """A point in [0, 1): from the key's hash when given (the same on every worker and after
    restarts: BLAKE2b, not Python's salted ``hash``), else at random."""
    if key is None:
        return random.random()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def choose(routing: Routing, point: float) -> int:
    """The version of the split ``point`` (in [0, 1)) falls in."""
    index = bisect_right(routing.bounds, point)
    return routing.versions[min(index, len(routing.versions) - 1)]


def agree(served: list[Tensor], shadow: list[Tensor]) -> bool:
    """Whether the shadow's answer agrees with the served one: the same outputs, shapes and
    datatypes, floating-point values within the tolerance (:data:`RTOL`, :data:`ATOL`), others
    equal."""
    theirs = {t.name: t for t in shadow}
    for tensor in served:
        other = theirs.get(tensor.name)
        if other is None or other.datatype != tensor.datatype:
            return False
        ours, their = np.asarray(tensor.data), np.asarray(other.data)
        if ours.shape != their.shape:
            return False
        if ours.dtype.kind in "fc":
            if not np.allclose(their, ours, rtol=RTOL, atol=ATOL, equal_nan=True):
                return False
        elif not np.array_equal(ours, their):
            return False
    return True


class Traffic:
    """Chooses the version of requests naming none and sends their shadow copies."""

    def __init__(self, run: Run, statistics: Statistics, state: ServerState) -> None:
        self._run = run
        self._statistics = statistics
        self._state = state
        self._waiting: dict[tuple[str, int], int] = {}
        """Copies per (model, shadow version) waiting or running."""
        self._tasks: set[asyncio.Task[None]] = set()
        """The copies' tasks (kept: the loop holds tasks weakly)."""
        state.drain_begun.append(self.cancel)

    def cancel(self) -> None:
        """Cancel the copies waiting or running (a stopping server: no client waits for them,
        so a graceful stop does not wait for them either); they are not counted."""
        for task in list(self._tasks):
            task.cancel()

    def pinned(
        self, entry: ModelEntry, serving: VersionEntry, request: InferRequest
    ) -> tuple[InferRequest, VersionEntry]:
        """``request`` naming the version it reaches, and that version: the split's choice when
        that version is ready, else ``serving``, the version a request naming none reaches."""
        routing = entry.plan.routing
        if routing is not None and routing.versions:
            number = choose(routing, draw(sent_header(TRAFFIC_KEY_HEADER)))
            found = entry.versions.get(number)
            if found is not None and found.state is State.READY:
                return replace(request, model_version=str(number)), found
        return replace(request, model_version=str(serving.version)), serving

    async def infer(
        self,
        entry: ModelEntry,
        serving: VersionEntry,
        request: InferRequest,
        deadline: float | None,
        arrived: float | None,
        step: bool,
    ) -> InferResponse:
        """Answer ``request`` (naming no version; ``serving`` is the version that reaches) by
        the version it reaches, and send its shadow copy if the share draws it."""
        routing = entry.plan.routing
        assert routing is not None  # the DataPlane sends only a routed model's requests here
        pinned, _ = self.pinned(entry, serving, request)
        shadow = routing.shadow
        copy = None
        if (
            shadow is not None
            and pinned.model_version != str(shadow)
            and not request.shared_memory
            and random.random() < routing.share
        ):
            copy = _copy(pinned, shadow)
        response = await self._run(pinned, deadline, arrived, step)
        if copy is not None and shadow is not None:
            self._send((entry.plan.name, shadow), copy, response)
        return response

    def _send(self, key: tuple[str, int], copy: InferRequest, served: InferResponse) -> None:
        """Start the shadow copy (``key``: the model and its shadow version), or drop it when
        that version has SHADOW_QUEUE copies."""
        if self._state.draining:
            return  # a stopping server starts nothing that would outlive the drain
        stats = self._statistics.of(*key)
        waiting = self._waiting.get(key, 0)
        if waiting >= SHADOW_QUEUE:
            stats.shadow["dropped"] = stats.shadow.get("dropped", 0) + 1
            return
        self._waiting[key] = waiting + 1
        task = asyncio.get_running_loop().create_task(self._shadow(key, copy, served.outputs))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _shadow(self, key: tuple[str, int], copy: InferRequest, served: list[Tensor]) -> None:
        """Run one copy and count how its answer compares with the served one (a copy
        cancelled by the loop's end is not counted)."""
        try:
            answer = await self._run(copy, None, None, False)
            outcome = "agreed" if agree(served, answer.outputs) else "disagreed"
        except Exception:  # the copy's failure is counted, never the client's
            outcome = "failed"
        finally:
            self._waiting[key] -= 1
        shadow = self._statistics.of(*key).shadow
        shadow[outcome] = shadow.get(outcome, 0) + 1


def _copy(request: InferRequest, version: int) -> InferRequest:
    """The shadow's request: the same inputs (copied when writable, so the served model cannot
    change them first) and outputs, for ``version``."""
    inputs = [
        replace(t, data=t.data.copy())
        if isinstance(t.data, np.ndarray) and t.data.flags.writeable
        else t
        for t in request.inputs
    ]
    return replace(request, inputs=inputs, model_version=str(version))
