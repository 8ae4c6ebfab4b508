"""Models calling models: ``servekit.models.infer(name, inputs, version=None)`` from a Python
model's ``predict``.

The call stays in the server's process: it is an ordinary inference request for the other
model through the server's DataPlane (its executor, batching, queue limits and statistics), the
arrays handed over as they are, with the calling request's deadline. A sync ``predict`` (in its
worker thread) calls :func:`infer` and waits; async code on the server's loop awaits
:func:`infer_async`. A model calling itself, or models calling each other round in a circle,
is refused (each would wait for an instance the other holds). Which server answers is set by
the server (app/servekit/services/composition/model_calls.py installs it): this module is
only the door.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from servekit.errors import Unavailable
from servekit.runtimes.base import CALL_DEADLINE, CALLING_MODEL
from servekit.runtimes.cancel import cancel_event

Arrays = dict[str, np.ndarray]


class Calls(Protocol):
    """What a server offers its models (app/servekit/services/composition/model_calls.py)."""

    def call(
        self,
        caller: str | None,
        name: str,
        inputs: Mapping[str, np.ndarray],
        version: str | None,
        deadline: float | None,
        cancelled: object,
    ) -> Arrays: ...

    async def call_async(
        self,
        caller: str | None,
        name: str,
        inputs: Mapping[str, np.ndarray],
        version: str | None,
        deadline: float | None,
    ) -> Arrays: ...


_server: list[Calls] = []
"""The server whose models call (the latest installed: one server per process in practice)."""


def install(calls: Calls) -> None:
    """Make ``calls`` the server models reach (done by the server's DataPlane)."""
    _server[:] = [calls]


def _calls() -> Calls:
    if not _server:
        raise Unavailable("servekit.models.infer works inside a model a servekit server serves")
    return _server[0]


def infer(name: str, inputs: Mapping[str, np.ndarray], version: str | int | None = None) -> Arrays:
    """Run served model ``name`` (optionally at ``version``) on ``inputs`` (input name ->
    array) and return its outputs (output name -> array), from a model's sync ``predict``.

    Errors are the other model's (a ServeError: let it through and the client gets it); the
    calling request's deadline bounds the call."""
    shown = None if version is None else str(version)
    deadline = CALL_DEADLINE.get()
    return _calls().call(CALLING_MODEL.get(), name, inputs, shown, deadline, cancel_event())


async def infer_async(
    name: str, inputs: Mapping[str, np.ndarray], version: str | int | None = None
) -> Arrays:
    """:func:`infer` for async code running on the server's loop."""
    shown = None if version is None else str(version)
    deadline = CALL_DEADLINE.get()
    return await _calls().call_async(CALLING_MODEL.get(), name, inputs, shown, deadline)
