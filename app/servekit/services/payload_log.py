"""Which requests the payload log records, and what it writes of them.

``DataPlane.infer`` is wrapped (:func:`with_payload_log`) only when serve.yaml has a
``server.payloadLog`` (restart-only), so a server without one runs no code of this module on
any request. With one, every request of every protocol passes here once, whatever adapter it
came through: a request for a model marked ``payloadLog: true`` is drawn at the sampled share,
and a drawn one offers the log (app/servekit/observability/payloads.py) its request event and,
answered without error, its answer event, both named by the request's ID (``X-Request-ID``,
gRPC's ``x-request-id``, the V2 body's ``id``, or the one made for it). Events are offered once
the request is answered, so the request event carries the version that served it; their JSON is
made in the log's thread. Only the V2 request and answer are written, never a header.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from servekit.codecs import v2_json
from servekit.config.payload_log import PayloadLogConfig
from servekit.errors import ServeError
from servekit.models.repository import ModelRepository
from servekit.observability.payloads import (
    REQUEST,
    RESPONSE,
    FileSink,
    HttpSink,
    PayloadEvent,
    PayloadLog,
    Sink,
)
from servekit.observability.request_ids import CURRENT, new_id
from servekit.services.shared_memory import Infer
from servekit.services.state import ServerState
from servekit.types import InferRequest, InferResponse, Tensor


def payload_log_of(state: ServerState) -> PayloadLog | None:
    """The payload log ``server.payloadLog`` asks for (None: no payload log)."""
    settings = state.plan.server.payload_log
    if settings is None:
        return None
    return PayloadLog(sink_of(settings, state.plan.base_dir), lambda: source_of(state))


def sink_of(settings: PayloadLogConfig, base_dir: Path) -> Sink:
    if settings.sink == "http":
        assert settings.url is not None  # (the schema's check)
        return HttpSink(settings.url)
    assert settings.path is not None
    return FileSink(base_dir / settings.path, settings.max_bytes, settings.backup_count)


def source_of(state: ServerState) -> str:
    """``Ce-Source``: the server's HTTP address on this machine, as KServe's agent names its
    own (``http://localhost:<port>/``)."""
    listening = state.listening
    return f"http://localhost:{listening.http_port}/" if listening else "http://localhost/"


def with_payload_log(state: ServerState, repository: ModelRepository, infer: Infer) -> Infer:
    """``infer`` recording the marked models' sampled requests, or ``infer`` itself without
    ``server.payloadLog`` (restart-only: decided once); the log made is ``state.payloads``."""
    payloads = state.payloads = payload_log_of(state)
    return infer if payloads is None else recording(state, repository, payloads, infer)


def recording(
    state: ServerState, repository: ModelRepository, payloads: PayloadLog, infer: Infer
) -> Infer:
    """``infer`` recording the marked models' sampled requests (see the module docstring).
    ``server.payloadLog`` is restart-only, so its settings are read once, here."""
    settings = state.plan.server.payload_log
    assert settings is not None  # with_payload_log wraps only when it is set
    ratio, per_request = settings.sample_ratio, settings.inputs + settings.outputs

    async def logged(
        request: InferRequest,
        deadline: float | None = None,
        arrived: float | None = None,
        step: bool = False,
    ) -> InferResponse:
        if not _marked(repository, request.model_name):
            return await infer(request, deadline, arrived, step)
        if random.random() >= ratio or not payloads.admits(per_request):
            return await infer(request, deadline, arrived, step)
        info = CURRENT.get()
        request_id = info.id if info is not None else (request.id or new_id())
        occurred = time.time()
        try:
            response = await infer(request, deadline, arrived, step)
        except Exception:
            if settings.inputs:
                payloads.offer(_request_event(request, request_id, None, occurred))
            raise
        if settings.inputs:
            version = response.model_version
            payloads.offer(_request_event(request, request_id, version, occurred))
        if settings.outputs:
            payloads.offer(
                PayloadEvent(
                    RESPONSE,
                    request_id,
                    response.model_name,
                    response.model_version,
                    time.time(),
                    lambda: response_json(response),
                )
            )
        return response

    return logged


def _marked(repository: ModelRepository, name: str) -> bool:
    """Whether serve.yaml (or the config a notebook added the model with) marks the model
    ``payloadLog: true``: read on use, so an edit applies to the next request."""
    try:
        config = repository.get(name).plan.config
    except ServeError:  # unknown: the request itself answers why
        return False
    return config is not None and config.payload_log


def _request_event(
    request: InferRequest, request_id: str, version: str | None, occurred: float
) -> PayloadEvent:
    return PayloadEvent(
        REQUEST,
        request_id,
        request.model_name,
        version if version is not None else request.model_version,
        occurred,
        lambda: request_json(request),
    )


def request_json(request: InferRequest) -> bytes:
    """The V2 JSON of a request as the server decoded it (binary tensors as JSON data)."""
    body: dict[str, Any] = {}
    if request.id:
        body["id"] = request.id
    if request.parameters:
        body["parameters"] = request.parameters
    body["inputs"] = [_tensor(t) for t in request.inputs]
    if request.outputs:
        body["outputs"] = [
            {"name": o.name, "parameters": o.parameters} if o.parameters else {"name": o.name}
            for o in request.outputs
        ]
    return v2_json.dumps(body)


def response_json(response: InferResponse) -> bytes:
    """The V2 JSON of an answer (every output as JSON data, whatever the client asked)."""
    body = v2_json.response_header(response, [_tensor(t) for t in response.outputs])
    return v2_json.dumps(body)


def _tensor(tensor: Tensor) -> dict[str, Any]:
    """A tensor's V2 JSON entry (v2_json's), its BYTES as text with bytes that are not UTF-8
    escaped: a log keeps what the answer held, where a JSON answer would refuse it."""
    data = tensor.data
    if tensor.datatype == "BYTES" or data.dtype == np.object_:
        values: Any = [
            x.decode("utf-8", "backslashreplace") if isinstance(x, bytes) else str(x)
            for x in data.ravel().tolist()
        ]
    else:
        values = v2_json.output_json_data(tensor)
    return {**v2_json.output_entry(tensor), "data": values}
