"""A decoupled model's stream: one response per result its ``predict`` yields.

Apart from the DataPlane, which resolves the version (traffic, on-demand loading) and hands the
stream here, because a stream is accounted differently from one answer: Triton counts a
decoupled request once, a success timed from the first step to the last response. The loop is
the same for a plain decoupled model (:func:`model_stream`) and for a request kind that streams
(an MLServer runtime's ``predict_stream``, app/servekit/services/mlserver_requests.py): only
how the feed is made and how each result becomes a response differ.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from servekit.config.compiler import ModelPlan
from servekit.errors import InvalidArgument, Unavailable
from servekit.models.repository import VersionEntry
from servekit.runtimes.base import Arrays, ModelRuntime, predict_stream
from servekit.services.account import Account
from servekit.services.execution.inputs import check_request
from servekit.services.state import ServerState
from servekit.services.stats import VersionStats
from servekit.types import InferRequest, InferResponse, Tensor, TensorSpec

Prepare = Callable[[], tuple[Arrays, list[str]]]
"""The feed and the outputs asked for (it may refuse the request: it runs in its account)."""
Respond = Callable[[Arrays], InferResponse]
"""One result of the model as a response."""


async def streamed(
    name: str,
    version: VersionEntry,
    runtime: ModelRuntime,
    stats: VersionStats,
    state: ServerState,
    prepare: Prepare,
    respond: Respond,
) -> AsyncGenerator[InferResponse, None]:
    """The responses of ``runtime`` (decoupled) to one request, counted once; a server that
    starts stopping ends the stream after the next response (Unavailable)."""
    started = time.perf_counter_ns()
    with Account(stats, name, started) as account:
        account.hold(version)
        feed, names = prepare()
        input_done = time.perf_counter_ns()
        results = predict_stream(runtime, feed, names)
        async with aclosing(results):
            async for result in results:
                yield respond(result)
                if state.stopping:
                    raise Unavailable("the server is shutting down; the stream ends here")
        spent = time.perf_counter_ns() - input_done
        account.succeeded(1, 0, input_done - started, spent, 0, executed=True)


def model_stream(
    plan: ModelPlan,
    version: VersionEntry,
    runtime: ModelRuntime,
    request: InferRequest,
    stats: VersionStats,
    state: ServerState,
) -> AsyncGenerator[InferResponse, None]:
    """A plain decoupled model's responses to ``request``, checked as any request is."""
    wanted: tuple[TensorSpec, ...] = ()  # what prepare() found asked for

    def prepare() -> tuple[Arrays, list[str]]:
        nonlocal wanted
        feed, asked, classes, _ = check_request(request, runtime.signature, plan.max_batch_size)
        if classes:
            raise InvalidArgument("classification is not offered for a decoupled model")
        wanted = tuple(asked)
        return feed, [s.name for s in asked]

    def respond(result: Arrays) -> InferResponse:
        outputs = [Tensor(s.name, s.datatype, tuple(result[s.name].shape), result[s.name])
                   for s in wanted]  # fmt: skip
        return InferResponse(plan.name, str(version.version), outputs, request.id)

    return streamed(plan.name, version, runtime, stats, state, prepare, respond)
