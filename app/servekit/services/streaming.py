"""A decoupled model's stream: one response per result its ``predict`` yields.

Apart from the DataPlane, which resolves the version (traffic, on-demand loading) and hands the
stream here, because a stream is accounted differently from one answer: Triton counts a
decoupled request once, a success timed from the first step to the last response.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing

from servekit.config.compiler import ModelPlan
from servekit.errors import InvalidArgument, Unavailable
from servekit.models.repository import VersionEntry
from servekit.runtimes.base import ModelRuntime, predict_stream
from servekit.services.account import Account
from servekit.services.execution.inputs import check_request
from servekit.services.state import ServerState
from servekit.services.stats import VersionStats
from servekit.types import InferRequest, InferResponse, Tensor


async def streamed(
    plan: ModelPlan,
    version: VersionEntry,
    runtime: ModelRuntime,
    request: InferRequest,
    stats: VersionStats,
    state: ServerState,
) -> AsyncGenerator[InferResponse, None]:
    """The responses of ``runtime`` (decoupled) to ``request``; a server that starts stopping
    ends the stream after the next response (Unavailable)."""
    started = time.perf_counter_ns()
    with Account(stats, request.model_name, started) as account:
        account.hold(version)
        feed, wanted, classes, _ = check_request(request, runtime.signature, plan.max_batch_size)
        if classes:
            raise InvalidArgument("classification is not offered for a decoupled model")
        input_done = time.perf_counter_ns()
        results = predict_stream(runtime, feed, [s.name for s in wanted])
        async with aclosing(results):
            async for result in results:
                yield InferResponse(
                    model_name=plan.name,
                    model_version=str(version.version),
                    outputs=[
                        Tensor(s.name, s.datatype, tuple(result[s.name].shape), result[s.name])
                        for s in wanted
                    ],
                    id=request.id,
                )
                if state.stopping:
                    raise Unavailable("the server is shutting down; the stream ends here")
        spent = time.perf_counter_ns() - input_done
        account.succeeded(1, 0, input_done - started, spent, 0, executed=True)
