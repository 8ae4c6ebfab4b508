"""A request's answer run at once, in the connection's callback, with a task only if it waits.

Python 3.11's asyncio has no eager tasks (3.12's ``eager_task_factory``): every coroutine runs
in a task, and a task costs, per request, its creation, a registration in asyncio's weak set
of all tasks (Python code, and a weak reference whose callback is Python code again), a loop
turn to start it, another to run its done callbacks, and the ``current_task`` bookkeeping
around each step. The tiny model's inference answer at the connection
(app/servekit/rest/fast.py) usually never waits: the body came with the headers, and a model
measured fast runs on the loop. :func:`run` therefore takes the coroutine's first step itself;
only when that step yields (the model went to its thread, a write must drain) is the rest
handed to a task, which goes on from exactly where the step stopped.

The task that takes over is the request's task from then on: ``asyncio.current_task()`` inside
the answer names it after the first wait, cancelling it cancels what the answer waits for, as
cancelling a task started the usual way would. Before the first wait there is no task (the
answer marks its wait with :data:`servekit.rest.leaving.EAGER` instead, and the edge puts the
task in its place once it exists).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from contextvars import Context
from typing import Any


def run(
    loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, None], context: Context
) -> asyncio.Task[None] | None:
    """Take ``coroutine``'s first step now, in ``context``; None if it finished, else the task
    that runs the rest. An exception from the step is the caller's (the answer at the
    connection catches its own)."""
    try:
        waited = context.run(coroutine.send, None)
    except StopIteration:
        return None
    return loop.create_task(_rest(coroutine, waited), context=context)


async def _rest(coroutine: Coroutine[Any, Any, None], waited: Any) -> None:
    """Drive ``coroutine`` on from a step that yielded ``waited`` (a future, or None for a bare
    yield), as a task drives its own coroutine: resume it once what it waits for is done, and
    throw into it a cancellation of this task."""
    while True:
        error: BaseException | None = None
        try:
            await _Wait(waited)
        except BaseException as exc:  # this task was cancelled: the coroutine is told
            error = exc
        try:
            waited = coroutine.send(None) if error is None else coroutine.throw(error)
        except StopIteration:
            return


class _Wait:
    """Awaits a future without taking its result (the coroutine that yielded it takes it when
    resumed), or yields once (None: ``asyncio.sleep(0)``'s bare yield)."""

    __slots__ = ("future",)

    def __init__(self, future: Any) -> None:
        self.future = future

    def __await__(self) -> Generator[Any, None, None]:
        future = self.future
        if future is None or not future.done():
            # (a future's ``_asyncio_future_blocking`` is still set by the coroutine's own
            # ``await``: the task sees the same future it would have seen)
            yield future
