"""When a request expires: the one rule every request kind applies (a model's call, a
pipeline's steps, a sequence's request)."""

from __future__ import annotations

import time

from servekit.errors import DeadlineExceeded, InvalidArgument
from servekit.types import InferRequest


def request_deadlines(
    request: InferRequest, deadline: float | None, cap_s: float | None
) -> tuple[float | None, float | None]:
    """When the request expires as a whole and when it must have started.

    It expires at the earliest of the client's deadline (a gRPC deadline), its ``timeout``
    parameter (microseconds from now, as Triton's clients send it; 0 or absent: none) and
    ``cap_s`` (``server.requestTimeoutSeconds``): queued or running, in a model, a sequence or a
    pipeline's steps, it is then answered DeadlineExceeded, whatever the protocol. The
    ``timeout`` parameter is also when it must have started (it does not wait a loop pass
    for company, ``ModelExecutor.run_now``)."""
    now = time.monotonic()
    if cap_s is not None:
        cap = now + cap_s
        deadline = cap if deadline is None else min(deadline, cap)
    if deadline is not None and deadline <= now:
        raise DeadlineExceeded(
            f"model {request.model_name!r}: the request's deadline had passed when it arrived"
        )
    timeout = request.parameters.get("timeout")
    if timeout is None:
        return deadline, None
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
        raise InvalidArgument(
            "parameter 'timeout' must be a whole number of microseconds (0: no timeout)"
        )
    if not timeout:
        return deadline, None
    by = now + timeout / 1e6
    return (by if deadline is None or by < deadline else deadline), by
