"""OpenAI-compatible routes under ``/openai/v1/`` (KServe's prefix: ``/v1/models`` is KServe
V1's): ``GET /models``, ``GET /models/{id}``, ``POST /chat/completions``, ``/completions``,
``/embeddings``.

A thin adapter: the body is read and checked by :mod:`servekit.codecs.openai`, turned into the
tensors the model's ``openai.kind`` fixes, and run by ``DataPlane.infer_stream`` (a generator
model streams; any other answers once through ``DataPlane.infer``) or ``DataPlane.infer``
(embeddings), so every request goes through the model's executor: dynamic batching, queue
limits, deadlines, statistics, access log and traces as on the V2 routes. An embeddings request
with more items than ``maxBatchSize`` is sent as several requests of at most that many, which
the executor may batch with others.

Every route is in the ``inference`` token group (the OpenAI client sends one key as
``Authorization: Bearer``). Errors are OpenAI's shape, ``{"error": {"message", "type",
"param", "code"}}``, with the status the same failure has on the V2 routes; a streamed
answer that fails after its first chunk ends with one ``data: {"error": ...}`` event and
``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from contextlib import aclosing
from typing import Any, TypedDict, TypeVar, cast

import numpy as np
import orjson
from litestar import Request, Response, Router, get, post
from litestar.exceptions import HTTPException
from litestar.openapi.spec import OpenAPIType, Schema
from litestar.params import FromPath
from litestar.response import Stream
from litestar.types import Scope

from servekit.codecs import openai as codec
from servekit.codecs import v2_json
from servekit.config.auth import ApiGroup
from servekit.config.openai import PARAMETERS, OpenAISettings
from servekit.errors import (
    HTTP_STATUS,
    ErrorCode,
    NotFound,
    ServeError,
    internal_error,
)
from servekit.http.bodies import read_body
from servekit.http.client_left import ClientLeft, unless_client_leaves
from servekit.observability.request_ids import CURRENT
from servekit.rest.access import group_opt
from servekit.rest.errors import CHALLENGE, client_left_handler
from servekit.rest.event_stream import EVENT_STREAM, first_response
from servekit.rest.inject import Catalog, Dataplane
from servekit.rest.openapi import failures, with_media
from servekit.services import Catalog as CatalogService
from servekit.services import DataPlane
from servekit.types import InferRequest, InferResponse, ModelSignature

log = logging.getLogger("servekit.openai")
PREFIX = codec.PREFIX
DONE = b"data: [DONE]\n\n"
AnyRequest = Request[Any, Any, Any]
Answer = Response[dict[str, Any]]
T = TypeVar("T")


class OpenAIError(TypedDict):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(TypedDict):
    """OpenAI's error answer."""

    error: OpenAIError


class OpenAIModel(TypedDict):
    id: str
    object: str
    created: int
    owned_by: str


class OpenAIModelList(TypedDict):
    object: str
    data: list[OpenAIModel]


# -- errors -----------------------------------------------------------------------------------
class ModelNotFound(NotFound):
    """404 ``model_not_found``: no such model, or one not declared for these routes."""

    param = "model"
    openai_code = "model_not_found"


def _error(
    status: int, message: str, exc: object = None, headers: dict[str, str] | None = None
) -> Response[dict[str, Any]]:
    param = getattr(exc, "param", None)
    code = getattr(exc, "openai_code", None)
    body = codec.error_body(status, message, param, code)
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def _serve_error(_: AnyRequest, exc: ServeError) -> Response[dict[str, Any]]:
    headers = CHALLENGE if exc.code is ErrorCode.UNAUTHENTICATED else None
    if exc.retry_after_seconds is not None:
        headers = {"Retry-After": str(exc.retry_after_seconds)}
    return _error(HTTP_STATUS[exc.code], exc.message, exc, headers)


def _http_error(_: AnyRequest, exc: HTTPException) -> Response[dict[str, Any]]:
    extra = getattr(exc, "extra", None)
    message = f"{exc.detail}: {extra}" if extra else str(exc.detail)
    return _error(exc.status_code, message, None, dict(exc.headers or {}))


def _unexpected(request: AnyRequest, exc: Exception) -> Response[dict[str, Any]]:
    return _error(500, internal_error(log, exc, f"{request.method} {request.url.path}"))


EXCEPTION_HANDLERS: dict[Any, Any] = {
    ServeError: _serve_error,
    HTTPException: _http_error,
    ClientLeft: client_left_handler,
    Exception: _unexpected,
}


# -- the model a request names ----------------------------------------------------------------
def _model(
    dataplane: DataPlane, catalog: CatalogService, name: str, kind: str
) -> tuple[OpenAISettings, ModelSignature]:
    """The model's ``openai:`` settings and signature, checked against the route's kind."""
    info = CURRENT.get()
    if info is not None:  # the access log and traces name the model the body names
        info.model = name
    settings = _settings(catalog, name)
    if settings.kind != kind:
        route = {"chat": "chat/completions", "completion": "completions"}.get(
            settings.kind, "embeddings"
        )
        raise codec.OpenAIInvalid(
            f"model {name!r} serves {settings.kind}s: use {PREFIX}/{route}", "model"
        )
    signature = dataplane.signature_of(name)
    codec.check_model(kind, name, signature.inputs, signature.outputs)
    return settings, signature


def _settings(catalog: CatalogService, name: str) -> OpenAISettings:
    try:
        view = catalog.model(name)
    except NotFound:
        raise ModelNotFound(f"the model {name!r} does not exist") from None
    config = view.plan.config
    settings = config.openai if config is not None else None
    if settings is None:
        raise ModelNotFound(
            f"model {name!r} is not served on the OpenAI routes (serve.yaml: openai: {{kind: "
            "chat|completion|embedding}})"
        )
    return settings


async def _read(request: AnyRequest) -> tuple[object, float]:
    arrived = time.monotonic()  # before the body: see DataPlane.infer
    body = await read_body(request.scope, request.receive, request.app.state.fast_path.json_limit)
    return v2_json.loads(body), arrived


def _json(obj: dict[str, Any]) -> Answer:
    return cast("Answer", Response(orjson.dumps(obj), media_type="application/json"))


# -- models -----------------------------------------------------------------------------------
def _entries(catalog: CatalogService) -> list[OpenAIModel]:
    created = int(catalog.started_at)
    return [
        cast("OpenAIModel", codec.model_entry(view.name, created))
        for view in catalog.models()
        if view.plan.config is not None and view.plan.config.openai is not None
    ]


# -- chat and completions ---------------------------------------------------------------------
async def _texts(
    request: AnyRequest, dataplane: DataPlane, catalog: CatalogService, kind: str
) -> Response[Any]:
    obj, arrived = await _read(request)
    decoded = codec.decode_chat(obj) if kind == "chat" else codec.decode_completion(obj)
    settings, signature = _model(dataplane, catalog, decoded.model, kind)
    codec.check_size(
        decoded.texts, settings.max_input_bytes, "messages" if kind == "chat" else "prompt"
    )
    takes = PARAMETERS in signature.input_index
    codec.refuse_unused(decoded, takes)
    calls = [codec.text_request(decoded, t, signature.inputs, takes) for t in decoded.texts]
    reply = codec.Reply(kind, decoded.model)
    if decoded.stream:
        return await _stream(request.scope, dataplane, decoded, reply, calls, arrived)
    made = await unless_client_leaves(
        request.scope, _all_choices(dataplane, calls, decoded.n, arrived)
    )
    n = decoded.n
    texts = [text for text, _ in made]
    finishes = [codec.finish_reason(text, chunks, decoded.max_tokens) for text, chunks in made]
    echoed = [decoded.texts[i // n] for i in range(len(texts))] if decoded.echo else None
    return _json(codec.answer(reply, texts, sum(decoded.prompt_words), echoed, finishes))


async def _all_choices(
    dataplane: DataPlane, calls: list[InferRequest], n: int, arrived: float
) -> list[tuple[str, int]]:
    """Every prompt's choices, in order, each as its text and its count of chunks (the
    prompts run at once: the executor may batch)."""
    if len(calls) == 1:
        return await _choices(dataplane, calls[0], n, arrived)
    done = await _together([_choices(dataplane, c, n, arrived) for c in calls])
    return [choice for choices in done for choice in choices]


async def _together(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Every call's result, in order; the first failure is raised as it is (not wrapped in
    an ExceptionGroup, so it keeps its status) and the other calls are cancelled."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


async def _choices(
    dataplane: DataPlane, call: InferRequest, n: int, arrived: float
) -> list[tuple[str, int]]:
    """One call's ``n`` texts, a generator model's chunks joined, and how many non-empty
    chunks made each (what :func:`codec.finish_reason` counts)."""
    texts = [""] * n
    chunks = [0] * n
    async with aclosing(dataplane.infer_stream(call, arrived=arrived)) as responses:
        async for response in responses:
            for index, piece in enumerate(codec.choices_of(response, n)):
                if piece:
                    texts[index] += piece
                    chunks[index] += 1
    return list(zip(texts, chunks, strict=True))


async def _stream(
    scope: Scope,
    dataplane: DataPlane,
    decoded: codec.TextRequest,
    reply: codec.Reply,
    calls: list[InferRequest],
    arrived: float,
) -> Response[Any]:
    """Server-Sent Events; a failure before the first response is an ordinary error."""
    responses = dataplane.infer_stream(calls[0], arrived=arrived)
    first = await first_response(scope, responses)
    events = _events(dataplane, decoded, reply, calls, arrived, first, responses)
    return Stream(events, media_type=EVENT_STREAM, headers={"Cache-Control": "no-cache"})


async def _events(
    dataplane: DataPlane,
    decoded: codec.TextRequest,
    reply: codec.Reply,
    calls: list[InferRequest],
    arrived: float,
    first: InferResponse | None,
    responses: AsyncGenerator[InferResponse, None],
) -> AsyncIterator[bytes]:
    n, usage = decoded.n, decoded.include_usage
    written: list[str] = []
    try:
        for number, call in enumerate(calls):  # a list of prompts: one after the other
            if number:
                responses, first = dataplane.infer_stream(call, arrived=arrived), None
            texts = [""] * n
            chunks = [0] * n
            base = number * n
            async with aclosing(responses):  # a client that disconnects stops the model
                if reply.kind == "chat":
                    for index in range(n):
                        yield _event(codec.chunk(reply, base + index, "", None, True, usage))
                elif decoded.echo:  # the prompt first, as OpenAI streams it
                    for index in range(n):
                        prompt = decoded.texts[number]
                        yield _event(codec.chunk(reply, base + index, prompt, None, False, usage))
                pending = [first] if first is not None else []
                while True:
                    if pending:
                        response = pending.pop()
                    else:
                        next_one = await anext(responses, None)
                        if next_one is None:
                            break
                        response = next_one
                    for index, piece in enumerate(codec.choices_of(response, n)):
                        if piece:
                            texts[index] += piece
                            chunks[index] += 1
                            yield _event(
                                codec.chunk(reply, base + index, piece, None, False, usage)
                            )
            for index in range(n):
                finish = codec.finish_reason(texts[index], chunks[index], decoded.max_tokens)
                yield _event(codec.chunk(reply, base + index, None, finish, False, usage))
            written.extend(texts)
        if usage:
            yield _event(codec.usage_chunk(reply, sum(decoded.prompt_words), codec.words(written)))
    except ServeError as exc:  # the status line is gone: say so in-band
        status = HTTP_STATUS[exc.code]
        yield _event(
            codec.error_body(
                status, exc.message, getattr(exc, "param", None), getattr(exc, "openai_code", None)
            )
        )
    except Exception as exc:
        yield _event(codec.error_body(500, internal_error(log, exc, "an OpenAI stream")))
    yield DONE


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


# -- embeddings -------------------------------------------------------------------------------
async def _embeddings(request: AnyRequest, dataplane: DataPlane, catalog: CatalogService) -> Answer:
    obj, arrived = await _read(request)
    decoded = codec.decode_embeddings(obj)
    settings, signature = _model(dataplane, catalog, decoded.model, "embedding")
    codec.check_size(decoded.texts, settings.max_input_bytes, "input")
    largest = catalog.model(decoded.model).plan.max_batch_size or len(decoded.texts)
    parts = [
        codec.EmbeddingRequest(
            decoded.model, decoded.texts[i : i + largest], decoded.encoding_format, None, 0
        )
        for i in range(0, len(decoded.texts), largest)
    ]
    calls = [codec.embedding_request(part, signature.inputs) for part in parts]
    answers = await unless_client_leaves(request.scope, _run_all(dataplane, calls, arrived))
    matrix = np.concatenate(
        [
            codec.embeddings_of(answer, len(part.texts), decoded.dimensions, settings.dimensions)
            for answer, part in zip(answers, parts, strict=True)
        ]
    )
    return _json(
        codec.embeddings_answer(decoded.model, matrix, decoded.encoding_format, decoded.words)
    )


async def _run_all(
    dataplane: DataPlane, calls: list[InferRequest], arrived: float
) -> list[InferResponse]:
    if len(calls) == 1:
        return [await dataplane.infer(calls[0], arrived=arrived)]
    return await _together([dataplane.infer(c, arrived=arrived) for c in calls])


# -- routes -----------------------------------------------------------------------------------
_CODES = (400, 401, 404, 413, 429, 500, 501, 504)
_FAILURES = failures(ApiGroup.INFERENCE, *_CODES, **{f"s{c}": OpenAIErrorBody for c in _CODES})
_GROUP = group_opt(ApiGroup.INFERENCE)
_BODY = Schema(
    type=OpenAPIType.OBJECT,
    required=["model"],
    properties={"model": Schema(type=OpenAPIType.STRING, description="A served model's name.")},
    description="OpenAI's request body for this route (see OpenAI's API reference).",
)
_POST: dict[str, Any] = {
    "opt": _GROUP,
    "status_code": 200,
    "responses": _FAILURES,
    "operation_class": with_media(body=_BODY),
}


@get("/models", opt=_GROUP, responses=failures(ApiGroup.INFERENCE, 401, s401=OpenAIErrorBody))
async def list_models(catalog: Catalog) -> OpenAIModelList:
    """The models served on these routes (serve.yaml ``openai:``)."""
    return {"object": "list", "data": _entries(catalog)}


@get(
    "/models/{model:str}",
    opt=_GROUP,
    responses=failures(ApiGroup.INFERENCE, 401, 404, s401=OpenAIErrorBody, s404=OpenAIErrorBody),
)
async def retrieve_model(catalog: Catalog, model: FromPath[str]) -> OpenAIModel:
    """One model of ``/models``."""
    _settings(catalog, model)
    found = [entry for entry in _entries(catalog) if entry["id"] == model]
    return found[0]


@post("/chat/completions", **_POST)
async def chat_completions(
    request: AnyRequest, dataplane: Dataplane, catalog: Catalog
) -> Response[Any]:
    """A chat model's answer to ``messages`` (Server-Sent Events with ``stream: true``)."""
    return await _texts(request, dataplane, catalog, "chat")


@post("/completions", **_POST)
async def completions(request: AnyRequest, dataplane: Dataplane, catalog: Catalog) -> Response[Any]:
    """A completion model's answer to ``prompt`` (Server-Sent Events with ``stream: true``)."""
    return await _texts(request, dataplane, catalog, "completion")


@post("/embeddings", **_POST)
async def embeddings(request: AnyRequest, dataplane: Dataplane, catalog: Catalog) -> Answer:
    """An embedding model's vectors for ``input`` (floats, or base64 of float32)."""
    return await _embeddings(request, dataplane, catalog)


ROUTES = [
    Router(
        PREFIX,
        route_handlers=[list_models, retrieve_model, chat_completions, completions, embeddings],
        exception_handlers=EXCEPTION_HANDLERS,
    )
]
"""The OpenAI routes as one Router: its error handlers answer OpenAI's error shape."""
