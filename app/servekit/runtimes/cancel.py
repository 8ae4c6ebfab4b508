"""The cancel flag of the request a model is computing, for models that can stop early.

A request is abandoned when its client goes away or its deadline passes while the model runs.
Python cannot stop a thread from outside, so a long-running Python model that wants to stop
early asks instead: ``servekit.runtimes.cancel.cancelled()`` is true once every request of the
current call is abandoned, and ``cancel_event()`` gives the ``threading.Event`` itself, so a
model that waits can wait on it (``cancel_event().wait(1.0)`` rather than ``time.sleep(1.0)``).
Outside a worker call (e.g. a model running inline on the loop) the flag is never set.

A context variable rather than an extra argument: a model's ``predict`` parameters are its
inputs (app/servekit/runtimes/python_hints.py), so no parameter name can be reserved for this.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar

_NEVER = threading.Event()
_CURRENT: ContextVar[threading.Event] = ContextVar("servekit_cancel", default=_NEVER)


def cancel_event() -> threading.Event:
    """The event set when the request being computed is abandoned (never set outside one)."""
    return _CURRENT.get()


def cancelled() -> bool:
    """Whether the request being computed was abandoned (its answer will not be read)."""
    return _CURRENT.get().is_set()


def running_with(event: threading.Event) -> object:
    """Make ``event`` the current cancel flag; returns the token :func:`restore` takes."""
    return _CURRENT.set(event)


def restore(token: object) -> None:
    _CURRENT.reset(token)  # type: ignore[arg-type]
