"""The deadlines of an HTTP connection, on one lazy timer.

One ``call_at`` timer per connection re-arms itself when the deadline moved later, so the hot
path only assigns a float; a deadline set nearer than the timer re-arms it at once (the nearer
timer wins). What it watches, by phase: the whole header block within
``headerTimeoutSeconds`` of its first byte (or of connecting; over TLS, of accept: the
handshake counts); no pause between body reads longer than ``bodyTimeoutSeconds``; and the
whole body within ``bodyDeadlineSeconds`` of the headers' end, or past that at
``bodyMinBytesPerSecond`` on average (a body dripped a byte at a time never pauses long, and is
cut here); past one the client gets 408 and the connection is closed. uvicorn's keep-alive
timeout runs on the same timer (phase ``IDLE``) instead of a timer made and cancelled per
response. A body the application has not asked for yet (uvicorn paused reading) is not the
client's delay: its clocks move on.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from servekit.http.limits import EdgeState
from servekit.http.private_apis import HttpToolsProtocol

HEADER, BODY, UNWATCHED, IDLE = 1, 2, 3, 4
"""Phases of a connection's deadline: reading headers, reading a body (until the request's
last byte: ``cycle.more_body`` false), none to watch, idle between requests (uvicorn's
keep-alive timeout, on the same lazy timer instead of a timer per response)."""


class Deadlines(HttpToolsProtocol):
    """uvicorn's httptools protocol with a connection's deadlines (the edge's protocol,
    app/servekit/http/connection.py, is one)."""

    edge: ClassVar[EdgeState]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = HEADER
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        """When the timer fires (a deadline set earlier than this re-arms it: the nearer wins)."""
        self._body_began = 0.0
        self._body_in = 0
        """When the current request's headers ended, and its body bytes read since."""

    def _watch(self, phase: int, seconds: float) -> None:
        """Enter ``phase`` with a deadline ``seconds`` from now (one timer, re-armed lazily)."""
        self._phase = phase
        deadline = self._deadline = self.loop.time() + seconds
        if self._timer is None or deadline < self._timer_at:
            self._arm(deadline)

    def _arm(self, at: float) -> None:
        """Make the timer fire at ``at``: the first, or a deadline nearer than the one it was
        set for (a later one needs nothing: the timer re-arms itself when it fires early)."""
        timer = self._timer
        if timer is not None:
            timer.cancel()
        self._timer = self.loop.call_at(at, self._on_deadline)
        self._timer_at = at

    def _on_deadline(self) -> None:
        self._timer = None
        if self._phase == UNWATCHED or self.transport is None or self.transport.is_closing():
            return
        if self._phase == BODY and not self.cycle.more_body:
            return  # the whole request arrived: the application's time is not the client's
        now = self.loop.time()
        if self._phase == IDLE:  # uvicorn's keep-alive timeout
            if now < self._deadline:
                self._arm(self._deadline)
            else:
                self.transport.close()
            return
        limits = self.edge.limits
        if self._phase == BODY:
            if self.flow is not None and self.flow.read_paused:
                # The application has not asked for more yet: not the client's delay.
                self._deadline = now + limits.body_timeout_seconds
                self._body_began = max(self._body_began, now - limits.body_deadline_seconds)
            elif now >= self._deadline:
                seconds = limits.body_timeout_seconds
                self._close_with(408, f"request body not received within {seconds:g} s")
                return
            # The whole body: within bodyDeadlineSeconds, or past it at the minimum rate. The
            # next look is when the average would fall below that rate if nothing more came.
            rate = limits.body_min_bytes_per_second
            due = max(
                self._body_began + limits.body_deadline_seconds,
                self._body_began + self._body_in / rate,
            )
            if now >= due:
                self._close_with(
                    408,
                    f"request body not received within {limits.body_deadline_seconds:g} s "
                    f"(nor at {rate} bytes/s)",
                )
                return
            self._arm(min(self._deadline, due))
            return
        if now < self._deadline:
            self._arm(self._deadline)
            return
        seconds = limits.header_timeout_seconds
        self._close_with(408, f"request headers not received within {seconds:g} s")

    def _close_with(self, status: int, message: str) -> None:
        """Answer ``status`` (unless a response already started) and close the connection:
        the connection's own (``EdgeProtocol._close_with`` in connection.py), declared here
        because the timers call it; this base class is never used alone."""
        raise NotImplementedError
