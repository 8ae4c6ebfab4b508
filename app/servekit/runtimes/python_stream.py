"""Stepping through what a decoupled Python model's ``predict`` yields, without blocking the loop.

A *decoupled* model (Triton's word: ``model_transaction_policy { decoupled: true }``) answers a
request with any number of responses. In Python that is a ``predict`` that is a generator
(``yield`` in a ``def``) or an async generator (``yield`` in an ``async def``).

- A sync generator's steps run one at a time in a worker thread: a step is model code (a token
  of an LLM can take tens of milliseconds) and must not stall the event loop that serves every
  other request.
- An async generator runs on the event loop, as any ``async def`` does: its author chose to
  cooperate with the loop, and awaits inside it are how it does.

Either way the generator is *closed* when the consumer stops early (a client that cancels its
gRPC stream or drops its HTTP connection): its ``finally`` blocks run and the model instance is
free for the next request. A sync step already running in its thread cannot be interrupted, so a
cancellation waits for that one step to finish and then closes the generator (closing a
generator that is executing is an error in Python).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any

from servekit.errors import Internal

_DONE = object()


def is_generator_function(func: Callable[..., Any]) -> bool:
    """Whether ``func`` (a function, a bound method or a callable object) yields its results."""
    target: Any = func
    if not (inspect.isfunction(func) or inspect.ismethod(func)):
        target = type(func).__call__  # a callable object: its __call__ says
    return inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target)


async def steps(produced: object) -> AsyncGenerator[Any, None]:
    """Each item ``produced`` (a generator or an async generator) yields; closes it at the end,
    on an error and when the consumer closes this iterator early."""
    if isinstance(produced, AsyncIterator):
        try:
            async for item in produced:
                yield item
        finally:
            aclose = getattr(produced, "aclose", None)
            if aclose is not None:
                await aclose()
        return
    if not isinstance(produced, Iterator):
        raise Internal(
            f"a decoupled model's predict must yield its results, it returned "
            f"{type(produced).__name__}"
        )
    loop = asyncio.get_running_loop()
    try:
        while True:
            step = loop.run_in_executor(None, _next, produced)
            try:
                item = await asyncio.shield(step)
            except asyncio.CancelledError:
                await _settled(step)  # the step in flight ends before the generator can close
                raise
            if item is _DONE:
                return
            yield item
    finally:
        close = getattr(produced, "close", None)
        if close is not None:
            close()  # runs the model's own finally blocks (short cleanup, by contract)


def _next(iterator: Iterator[Any]) -> Any:
    """One step, in a worker thread (StopIteration cannot cross into a Future)."""
    return next(iterator, _DONE)


async def _settled(step: asyncio.Future[Any]) -> None:
    """Wait for a step that was shielded from a cancellation; its result no longer matters."""
    with contextlib.suppress(BaseException):  # its own error is moot once the client left
        await step
