"""The server side of ``servekit.models.infer``: a model's call to another served model.

Each call is an ordinary ``DataPlane.infer`` request (the callee's executor, batching, queue
limits and statistics), with the calling request's deadline, run on the server's event loop;
a sync ``predict`` waits for it in its worker thread, and if the calling request is abandoned
(its client left, its deadline passed) the call is cancelled too. Calls a model has in flight
are edges of a wait-for graph between models: a call that would close a circle (a model calling
itself, A calling B while B calls A) is refused at once, since each side would hold an instance
the other waits for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping

import numpy as np

from servekit.datatypes import as_bytes_array, from_numpy
from servekit.errors import InvalidArgument, ServeError, Unavailable
from servekit.models.calls import Arrays
from servekit.types import InferRequest, InferResponse, Tensor

Infer = Callable[[InferRequest, float | None], Awaitable[InferResponse]]

CANCEL_POLL_S = 0.05
"""How often a waiting sync call looks at its request's cancel flag (the flag is a
threading.Event set from the loop; waiting on both at once would need a thread per call)."""


class ModelCalls:
    """Calls between the models of one server (``servekit.models.calls.install`` makes it the
    one models reach)."""

    def __init__(self, infer: Infer) -> None:
        self._infer = infer
        self.loop: asyncio.AbstractEventLoop | None = None
        """The server's loop, known once a request has run (only a running model calls)."""
        self._waiting: Counter[tuple[str, str]] = Counter()
        self.callers: set[str] = set()
        """Models that have called another: never run on the loop as a pipeline's step (their
        sync call waits for the loop)."""
        self._lock = threading.Lock()

    def call(
        self,
        caller: str | None,
        name: str,
        inputs: Mapping[str, np.ndarray],
        version: str | None,
        deadline: float | None,
        cancelled: object,
    ) -> Arrays:
        """A sync model's call, from its worker thread."""
        if caller is not None:
            self.callers.add(caller)  # even if refused below: it must never run on the loop
        loop = self.loop
        if loop is None or loop.is_closed():
            raise Unavailable("the server is not running")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None:
            raise InvalidArgument(
                "servekit.models.infer waits for the answer and would block the server's event "
                "loop: in async code use `await servekit.models.infer_async(...)`"
            )
        call = self.call_async(caller, name, inputs, version, deadline)
        future = asyncio.run_coroutine_threadsafe(call, loop)
        flag = cancelled if isinstance(cancelled, threading.Event) else None
        while True:
            try:
                return future.result(CANCEL_POLL_S if flag is not None else None)
            except concurrent.futures.TimeoutError:
                if flag is not None and flag.is_set():
                    future.cancel()  # the caller's request was abandoned: so is this call
                    raise Unavailable(f"call to model {name!r} cancelled") from None

    async def call_async(
        self,
        caller: str | None,
        name: str,
        inputs: Mapping[str, np.ndarray],
        version: str | None,
        deadline: float | None,
    ) -> Arrays:
        """A call on the server's loop (also what a sync call runs there)."""
        edge = self._enter(caller, name)
        try:
            tensors = [_tensor(key, value) for key, value in inputs.items()]
            response = await self._infer(InferRequest(name, tensors, version), deadline)
        finally:
            if edge is not None:
                with self._lock:
                    self._waiting[edge] -= 1
                    if not self._waiting[edge]:
                        del self._waiting[edge]
        return {t.name: t.data for t in response.outputs}

    def _enter(self, caller: str | None, name: str) -> tuple[str, str] | None:
        """Record that ``caller`` waits for ``name``, refusing a wait that closes a circle."""
        if caller is None:
            return None
        self.callers.add(caller)
        if caller == name:
            raise InvalidArgument(f"model {name!r} cannot call itself")
        with self._lock:
            trail = self._trail(name, caller)
            if trail is not None:
                circle = " -> ".join([caller, *trail])
                raise InvalidArgument(f"models would wait for each other in a circle: {circle}")
            self._waiting[(caller, name)] += 1
        return (caller, name)

    def _trail(self, start: str, goal: str) -> list[str] | None:
        """Models from ``start`` to ``goal`` along calls in flight (None: no such chain)."""
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            current, trail = stack.pop()
            if current == goal:
                return trail
            if current in seen:
                continue
            seen.add(current)
            stack.extend((b, [*trail, b]) for (a, b) in self._waiting if a == current)
        return None


def _tensor(name: str, value: object) -> Tensor:
    array = np.asarray(value)
    try:
        datatype = from_numpy(array.dtype)
    except ServeError as exc:
        raise InvalidArgument(f"servekit.models.infer input {name!r}: {exc.message}") from None
    if datatype.is_bytes:  # str or bytes arrays: the object array of bytes models receive
        array = as_bytes_array(array)
    return Tensor(name, datatype.name, tuple(array.shape), array)
