"""A request's answer run at once, in the connection's callback, with no task even if it waits.

Python 3.11's asyncio has no eager tasks (3.12's ``eager_task_factory``): every coroutine runs in a
task, and a task costs, per request, its creation, a registration in asyncio's weak set of all tasks
(Python code, and a weak reference whose callback is Python code again), a loop turn to start it,
another to run its done callbacks, and the ``current_task`` bookkeeping around each step. The tiny
model's inference answer at the connection (app/servekit/http/inference_lane.py) usually never
waits: the body came with the headers, and a model measured fast runs on the loop. :func:`run`
therefore takes the coroutine's first step itself.

An answer that does wait (a batched request until its batch has run, a model in its thread, a
write to drain) is driven on by a :class:`Resumed`: the future it waits for wakes it through a
done callback in the request's context, as a task's wake-up would, but with none of a task's
other costs. With the medium model batched at 64 in flight, a task that took over cost about
15,000 instructions per request, 5% of it (``python bench/instructions.py new=. --batching
--concurrency 64 --body "REST binary"``: 287,328 with a task, 272,498 without).

What a task gives that a :class:`Resumed` keeps: the coroutine goes on from where it stopped,
with what it waited for; ``cancel()`` cancels the future it waits for (so the coroutine sees
CancelledError there, as under a task) or, between waits, throws CancelledError at its next
step; ``uncancel()`` counts cancels as a task's does (``client_left`` in
app/servekit/http/client_left.py); done callbacks run when it ends (the edge's count of requests in
flight). What it does not: it is not ``asyncio.current_task()``, which is None in the answer
(:data:`RUNNING` names the driver instead); it is not in ``asyncio.all_tasks()``; and no
asyncio primitive that needs a task (``asyncio.timeout``) may be used on the answer's path.
An answer that declines after a wait hands the request to the application the ASGI way under
the same driver, as one that declines at once always did in the first step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from contextvars import Context
from typing import Any


def run(
    loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, None], context: Context
) -> Resumed | None:
    """Take ``coroutine``'s first step now, in ``context``; None if it finished, else the
    :class:`Resumed` that drives the rest. An exception from the step is the caller's (the
    answer at the connection catches its own)."""
    try:
        waited = context.run(coroutine.send, None)
    except StopIteration:
        return None
    resumed = Resumed(loop, coroutine, context)
    resumed.wait(waited)
    return resumed


RUNNING: Resumed | None = None
"""The :class:`Resumed` whose step runs now (``asyncio.current_task()`` is None then): what
the answer asks for the task it would otherwise have asked ``current_task()`` for."""


class Resumed:
    """Drives a coroutine on from where its first step stopped, as a task would, without
    being one (see the module docstring for what it keeps of a task and what it does not)."""

    __slots__ = (
        "_callbacks",
        "_cancels",
        "_context",
        "_coroutine",
        "_done",
        "_loop",
        "_throw",
        "_waiting",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        coroutine: Coroutine[Any, Any, None],
        context: Context,
    ) -> None:
        self._loop = loop
        self._coroutine = coroutine
        self._context = context
        self._waiting: Any = None
        self._cancels = 0
        self._throw = False
        self._callbacks: list[Callable[[Resumed], object]] = []
        self._done = False

    def wait(self, waited: Any) -> None:
        """Resume when ``waited`` (what the step yielded) is done: a future awaited the usual
        way (its ``_asyncio_future_blocking`` set, cleared here as a task clears it), or None,
        a bare yield; anything else is thrown back as a RuntimeError, as a task does."""
        if waited is None:  # a bare yield (asyncio.sleep(0)): once round the loop
            self._loop.call_soon(self._step, None, context=self._context)
        elif getattr(waited, "_asyncio_future_blocking", False):
            waited._asyncio_future_blocking = False
            self._waiting = waited
            waited.add_done_callback(self._step, context=self._context)
        else:  # what a task refuses too
            self._throw_soon(RuntimeError(f"the answer yielded {waited!r}, not a future"))

    def _throw_soon(self, error: BaseException) -> None:
        self._loop.call_soon(self._step, None, error, context=self._context)

    def _step(self, _: Any, error: BaseException | None = None) -> None:
        """One step of the coroutine (a future's done callback, or a call soon): what a task's
        step does, and how a task ends (a failure goes to the loop's exception handler, as an
        unretrieved task exception would, but at once)."""
        global RUNNING
        self._waiting = None
        if self._throw and error is None:
            self._throw = False
            error = asyncio.CancelledError()
        RUNNING = self
        try:
            coroutine = self._coroutine
            waited = coroutine.send(None) if error is None else coroutine.throw(error)
        except StopIteration:
            self._finish()
            return
        except (KeyboardInterrupt, SystemExit):
            self._finish()
            raise
        except asyncio.CancelledError:
            self._finish()
            return
        except BaseException as exc:  # a task would keep it for nobody: say it now
            self._finish()
            self._loop.call_exception_handler({"message": "the answer failed", "exception": exc})
            return
        finally:
            RUNNING = None
        self.wait(waited)
        waiting = self._waiting
        if self._throw and waiting is not None and waiting.cancel():  # cancelled in the step
            self._throw = False

    def _finish(self) -> None:
        self._done = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, callback: Callable[[Resumed], object]) -> None:
        """Call ``callback(self)`` when the coroutine has ended (at once if it has)."""
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    def cancel(self, msg: Any = None) -> bool:
        """Cancel what the coroutine waits for (it then raises CancelledError there), or, with
        nothing cancellable awaited, throw CancelledError into its next step."""
        if self._done:
            return False
        self._cancels += 1
        waiting = self._waiting
        if waiting is not None and waiting.cancel(msg=msg):
            return True
        self._throw = True
        return True

    def uncancel(self) -> int:
        """One cancel fewer; the cancels left (``Task.uncancel``'s meaning)."""
        if self._cancels > 0:
            self._cancels -= 1
        return self._cancels
