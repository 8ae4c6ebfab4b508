"""MLServer custom runtimes' requests: the request kind of a model whose ``implementation`` is
the user's ``mlserver.MLModel`` subclass (app/servekit/runtimes/mlserver_model.py).

MLServer hands such a runtime the request as the client sent it and answers what its
``predict`` returns, checking neither against the model's metadata: any input names, the
request's and each input's ``parameters`` (``content_type`` included, which the model's
``decode`` reads), any outputs with their own ``parameters``. So the request is not checked
against a signature here: it goes to the model whole, as one document
(app/servekit/runtimes/mlserver_wire.py), through the version's executor (its queue, threads,
isolation and ``timeoutSeconds``) and is accounted as any request; the answer document becomes
the response's outputs as the model wrote them. A streaming runtime (its own
``predict_stream``) is a decoupled Python model: ``DataPlane.infer_stream`` hands its requests
to :meth:`MLServerRequests.stream`, each response its ``predict_stream`` yields one answer
document.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from servekit.codecs import v2_json
from servekit.config.compiler import ModelPlan
from servekit.errors import Internal, Unimplemented
from servekit.models.repository import ModelEntry, VersionEntry
from servekit.observability.request_ids import CURRENT
from servekit.runtimes import mlserver_wire
from servekit.runtimes.base import Arrays
from servekit.runtimes.mlserver_model import SETTINGS_KEY
from servekit.runtimes.python import decoupled_refusal
from servekit.services.account import Account
from servekit.services.deadlines import request_deadlines
from servekit.services.execution.executor import ModelExecutor
from servekit.services.state import ServerState
from servekit.services.stats import Statistics
from servekit.services.streaming import streamed
from servekit.types import InferRequest, InferResponse, Tensor

PYTHON = "python"


class MLServerRequests:
    """The request kind of MLServer custom runtimes (see the module docstring)."""

    def __init__(self, statistics: Statistics, state: ServerState) -> None:
        self._statistics = statistics
        self._state = state

    def serves(self, plan: ModelPlan) -> bool:
        return plan.format_name == PYTHON and SETTINGS_KEY in plan.parameters

    async def infer(
        self,
        entry: ModelEntry,
        version: VersionEntry,
        request: InferRequest,
        deadline: float | None,
        arrived: float | None = None,
    ) -> InferResponse:
        """Run one request through the model's ``predict`` as MLServer would."""
        started = time.perf_counter_ns()
        plan = entry.plan
        stats = self._statistics.of(plan.name, version.version)
        with Account(stats, plan.name, started) as account:
            account.hold(version)
            runtime, executor = version.runtime, version.executor
            if runtime is None or not isinstance(executor, ModelExecutor):
                raise Internal(f"model {plan.name!r} lost its runtime while in use")
            if runtime.decoupled:
                raise Unimplemented(decoupled_refusal(plan.name))
            document = request_document(request, as_bytes=_over_grpc())
            feed = {mlserver_wire.REQUEST: mlserver_wire.pack(document)}
            deadline, queue_by = request_deadlines(request, deadline, self._state.request_timeout_s)
            input_done = time.perf_counter_ns()
            results, queue_ns, spent = await executor.submit(
                feed, [mlserver_wire.RESPONSE], 1, deadline, queue_by
            )
            infer_done = time.perf_counter_ns()
            response = response_of(results[mlserver_wire.RESPONSE], plan.name, version, document)
            output_ns = time.perf_counter_ns() - infer_done
            account.succeeded(1, queue_ns, input_done - started, spent, output_ns, False)
        return response

    def stream(
        self, entry: ModelEntry, version: VersionEntry, request: InferRequest
    ) -> AsyncGenerator[InferResponse, None]:
        """The responses of a streaming runtime's ``predict_stream`` to one request, each as
        the runtime wrote it (DataPlane.infer_stream's rules: counted once, a stopping server
        ends the stream after the next response)."""
        plan = entry.plan
        runtime = version.runtime
        if runtime is None:
            raise Internal(f"model {plan.name!r} lost its runtime while in use")
        document: dict[str, Any] = {}  # made in its account, as infer makes it

        def prepare() -> tuple[Arrays, list[str]]:
            document.update(request_document(request, as_bytes=_over_grpc()))
            return {mlserver_wire.REQUEST: mlserver_wire.pack(document)}, [mlserver_wire.RESPONSE]

        def respond(result: Arrays) -> InferResponse:
            return response_of(result[mlserver_wire.RESPONSE], plan.name, version, document)

        stats = self._statistics.of(plan.name, version.version)
        return streamed(plan.name, version, runtime, stats, self._state, prepare, respond)


def _over_grpc() -> bool:
    """Whether the request being answered came over gRPC (``RequestInfo.over_grpc``)."""
    info = CURRENT.get()
    return info is not None and info.over_grpc


def request_document(request: InferRequest, as_bytes: bool = False) -> dict[str, Any]:
    """The request as MLServer's InferenceRequest fields (mlserver_wire.py), as MLServer
    hands them to a runtime: BYTES elements as text when they came as JSON text, as bytes
    when ``as_bytes`` (gRPC's ``bytes_contents``); an ``id`` made up when the request has
    none (MLServer's answer carries it); ``parameters`` always (MLServer copies the request's
    headers into them, which servekit does not)."""
    inputs = [  # an input's entry has an output's fields
        {**v2_json.output_entry(t), "data": mlserver_wire.flat_data(t.data, as_bytes)}
        for t in request.inputs
    ]
    document: dict[str, Any] = {"id": request.id or str(uuid.uuid4()), "inputs": inputs}
    document["parameters"] = dict(request.parameters)  # always there, as MLServer's are
    if request.outputs:
        document["outputs"] = [
            {"name": o.name, **({"parameters": o.parameters} if o.parameters else {})}
            for o in request.outputs
        ]
    return document


def response_of(
    carried: Any, name: str, version: VersionEntry, asked: dict[str, Any]
) -> InferResponse:
    """The answer document as the response to the request document ``asked`` (its ``id``):
    each output as the model wrote it; an output whose data does not fill its shape is the
    model's error, answered 500 naming it."""
    try:
        document = mlserver_wire.unpack(carried)
    except ValueError as exc:
        raise Internal(f"model {name!r} answered no MLServer response: {exc}") from None
    outputs = []
    for item in document.get("outputs") or ():
        output = str(item.get("name"))
        datatype = str(item.get("datatype"))
        try:
            array = mlserver_wire.array_of(item.get("data"), datatype, list(item["shape"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise Internal(f"model {name!r} answered output {output!r} wrong: {exc}") from None
        parameters = item.get("parameters") or {}
        outputs.append(Tensor(output, datatype, tuple(array.shape), array, parameters))
    parameters = document.get("parameters") or {}
    return InferResponse(name, str(version.version), outputs, asked["id"], parameters)
