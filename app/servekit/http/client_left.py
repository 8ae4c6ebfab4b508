"""An HTTP inference request whose client went away while it waited for the model is dropped.

uvicorn lets an application see a disconnect only when it asks ``receive()``, and listening there
for every request would cost a task per request. Instead a handler marks its scope with its own task
(:data:`WAITING`) for exactly as long as it awaits the DataPlane (:func:`unless_client_leaves`), and
the edge (app/servekit/http/connection.py ``EdgeProtocol.connection_lost``) clears the mark and
cancels that task when the connection is lost: a request still in its model's queue leaves it and
never runs (a running one's cancel flag is set), as a cancelled gRPC call does. The handler then
ends with :class:`ClientLeft`, whose answer nobody receives (uvicorn drops what is sent on a lost
connection, and logs nothing for it).

One module used by every HTTP inference surface (V2 infer, V1 predict, grps, generate), and by
the edge, which cannot import the handlers' modules without importing half the REST layer.
"""

from __future__ import annotations

from asyncio import CancelledError, current_task
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

from litestar.types import Scope

T = TypeVar("T")

WAITING = "servekit.waiting"
"""Scope key holding the task of an inference request while it awaits the DataPlane (None, or
absent, otherwise). Costs the hot path two dictionary stores, no task and no wakeup."""


TASKLESS: Any = object()
"""The :data:`WAITING` mark of an answer run without a task yet (app/servekit/http/taskless.py):
the edge replaces it with the task that takes the answer over if the wait does not end at
once."""


class ClientLeft(Exception):
    """The request's client went away while it waited: there is nobody to answer.

    An exception, not a cancellation, so that it leaves a Litestar handler like any failure
    (app/servekit/rest/errors.py answers it with an empty response that is never sent) and uvicorn,
    which logs every exception that reaches it, never sees it."""


async def unless_client_leaves(scope: Scope, awaitable: Awaitable[T]) -> T:
    """``await awaitable``, cancelled if the client leaves meanwhile (then :class:`ClientLeft`).

    A cancellation from anywhere else (the server stopping) stays a cancellation. The mark is
    cleared however the wait ends (with no await between: nothing to pay for), so the edge never
    cancels a task that is answering a failure, which uvicorn would log as an error."""
    scope[WAITING] = task = current_task()  # type: ignore[literal-required]
    try:
        return await awaitable
    except CancelledError:
        if client_left(scope, task):
            raise ClientLeft from None
        raise
    finally:
        scope[WAITING] = None  # type: ignore[literal-required]


class Uncancels(Protocol):
    """A task, or what drives an answer in a task's place (app/servekit/http/taskless.py)."""

    def uncancel(self) -> int: ...


def client_left(scope: Scope, task: Uncancels | None) -> bool:
    """Whether a cancel that ended a wait marked with ``task`` was the edge's alone: the edge
    cleared the mark, and ``uncancel()`` says whether it was the only cancel (a stopping server
    may have cancelled the task as well). For a handler that marks its scope inline (the V2
    inference answer) instead of calling :func:`unless_client_leaves`."""
    return scope.get(WAITING) is None and task is not None and not task.uncancel()
