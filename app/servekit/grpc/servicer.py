"""``inference.GRPCInferenceService``: the Triton / KServe V2 gRPC surface over the DataPlane.

Handlers are thin: decode with :mod:`servekit.codecs.v2_proto`, call the DataPlane (given to the
servicer at construction), encode (configuration and statistics: :mod:`servekit.grpc.triton_proto`).
Errors go through the one table in :mod:`servekit.grpc.status`. ModelStreamInfer pipelines a window
of requests but answers strictly in order, and a failing request yields its ``error_message``
without closing the stream. A decoupled model (its predict yields) answers a stream request with one
response per result, flagged as Triton flags them (``triton_final_response``; see
:mod:`servekit.codecs.v2_proto`); its requests run when the writer reaches them, so a stream's
responses stay in request order. ModelInfer refuses a decoupled model (UNIMPLEMENTED, as Triton).
The repository RPCs are delegated to :mod:`servekit.grpc.repository` when the servicer is given a
ModelControl; the system shared-memory RPCs manage the DataPlane's regions
(app/servekit/services/shared_memory.py) and the CUDA ones say why they are not offered; every other
RPC servekit does not offer answers UNIMPLEMENTED with the reason."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any, TypeAlias

import grpc

from servekit.codecs import v2_proto
from servekit.errors import InvalidArgument, NotFound, Unimplemented, shown_name
from servekit.grpc import repository as repository_rpcs
from servekit.grpc.status import guarded, status_of
from servekit.grpc.triton_proto import model_config_message, statistics_message
from servekit.observability import tracing
from servekit.observability.tracing import TRACING
from servekit.protos import grpc_service_pb2 as pb
from servekit.protos import grpc_service_pb2_grpc as pb_grpc
from servekit.services import CUDA_UNSUPPORTED, Catalog, DataPlane, ModelControl

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
STREAM_WINDOW = 64
"""Requests of one stream decoded and running ahead of the response being written."""

Context: TypeAlias = grpc.aio.ServicerContext
_Response: TypeAlias = pb.ModelStreamInferResponse
_Pending: TypeAlias = "asyncio.Future[_Response] | AsyncGenerator[_Response, None]"


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The V2 inference service of one DataPlane (and optionally its model control)."""

    def __init__(
        self,
        dataplane: DataPlane,
        control: ModelControl | None = None,
        catalog: Catalog | None = None,
    ) -> None:
        """``control`` enables the repository RPCs, ``catalog`` (the read side) the statistics
        RPC."""
        self._dataplane = dataplane
        self._control = control
        self._catalog = catalog
        self._calls = dataplane.grpc_calls
        self._as_sent = dataplane.plan.server.grpc_answers == "asSent"  # a restart setting

    # -- health and metadata ------------------------------------------------------------------
    @guarded
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context) -> Any:
        return pb.ServerLiveResponse(live=self._dataplane.live())

    @guarded
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context) -> Any:
        return pb.ServerReadyResponse(ready=self._dataplane.ready())

    @guarded
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> Any:
        try:
            ready = self._dataplane.model_ready(request.name, request.version or None)
        except NotFound:  # as Triton: an unknown model or version is "not ready", not an error
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    @guarded
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Context) -> Any:
        meta = self._dataplane.server_metadata()
        return pb.ServerMetadataResponse(
            name=meta.name, version=meta.version, extensions=meta.extensions
        )

    @guarded
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context) -> Any:
        meta = self._dataplane.model_metadata(request.name, request.version or None)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=meta.name,
            versions=meta.versions,
            platform=meta.platform,
            inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.inputs],
            outputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in meta.outputs],
        )

    # -- inference ----------------------------------------------------------------------------
    @guarded
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Context) -> Any:
        calls = self._calls
        calls.n += 1  # a batching model's request runs at once when it is alone (ServerState)
        try:
            traced = tracing.now() if TRACING.on else 0  # tracing: decode, encode spans
            infer_request = v2_proto.decode_request(request)
            if traced:
                tracing.phase("decode", traced)
            remaining = context.time_remaining()  # the client's deadline, None when it set none
            deadline = None if remaining is None else time.monotonic() + remaining
            response = await self._dataplane.infer(infer_request, deadline)
            typed_in = self._as_sent and not request.raw_input_contents
            if traced:
                return tracing.encoded(v2_proto.encode_response, infer_request, response, typed_in)
            return v2_proto.encode_response(infer_request, response, typed_in)
        finally:
            calls.n -= 1

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[pb.ModelInferRequest], context: Context
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        window: asyncio.Queue[_Pending | None] = asyncio.Queue(STREAM_WINDOW)
        reader = asyncio.create_task(self._read_stream(request_iterator, window))
        try:
            while (pending := await window.get()) is not None:
                if isinstance(pending, asyncio.Future):
                    yield await pending
                    continue
                # A decoupled request: its responses, as the model yields them. Cancelling the
                # call (the client went away) closes the generator and frees the model.
                async with aclosing(pending) as responses:
                    async for response in responses:
                        yield response
            await reader  # a failed read (not a client's half-close) surfaces here
        finally:
            reader.cancel()
            while not window.empty():
                left = window.get_nowait()
                if isinstance(left, asyncio.Future):
                    left.cancel()
                elif left is not None:
                    await left.aclose()  # never started: nothing runs, nothing is held

    async def _read_stream(
        self,
        request_iterator: AsyncIterator[pb.ModelInferRequest],
        window: asyncio.Queue[_Pending | None],
    ) -> None:
        try:
            async for message in request_iterator:
                await window.put(self._start(message))
        finally:
            await window.put(None)  # end of stream (or of a failed read) for the writer

    def _start(self, message: pb.ModelInferRequest) -> _Pending:
        """A request of the stream, started (a task: one response) or ready to run when the
        writer reaches it (a decoupled model's responses, written in request order)."""
        if self._dataplane.decoupled(message.model_name, message.model_version or None):
            return self._stream_many(message)
        return asyncio.create_task(self._stream_one(message))

    async def _stream_one(self, message: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
        try:
            traced = tracing.now() if TRACING.on else 0  # tracing: decode, encode spans
            request = v2_proto.decode_request(message)
            typed_in = self._as_sent and not message.raw_input_contents
            if traced:
                tracing.phase("decode", traced)
                response = await self._dataplane.infer(request)
                encoded = tracing.encoded(v2_proto.encode_response, request, response, typed_in)
            else:
                response = await self._dataplane.infer(request)
                encoded = v2_proto.encode_response(request, response, typed_in)
        except Exception as exc:
            return v2_proto.error_stream_response(message, status_of(exc)[1])
        return v2_proto.stream_response(encoded, final=True)

    async def _stream_many(
        self, message: pb.ModelInferRequest
    ) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
        """A decoupled request's responses, each flagged not final; an error ends them (flagged
        final); with ``triton_enable_empty_final_response`` an empty final response closes them."""
        try:
            traced = tracing.now() if TRACING.on else 0  # tracing: decode, encode spans
            request = v2_proto.decode_request(message)
            typed_in = self._as_sent and not message.raw_input_contents
            if traced:
                tracing.phase("decode", traced)
            async with aclosing(self._dataplane.infer_stream(request)) as responses:
                async for response in responses:
                    if traced:
                        encoded = tracing.encoded(
                            v2_proto.encode_response, request, response, typed_in
                        )
                    else:
                        encoded = v2_proto.encode_response(request, response, typed_in)
                    yield v2_proto.stream_response(encoded, final=False)
        except Exception as exc:
            yield v2_proto.error_stream_response(message, status_of(exc)[1])
            return
        if v2_proto.wants_empty_final(message):
            yield v2_proto.empty_final_response(message)

    # -- model configuration and statistics extensions ----------------------------------------
    @guarded
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Context) -> Any:
        config = self._dataplane.model_config(request.name, request.version or None)
        return pb.ModelConfigResponse(config=model_config_message(config))

    @guarded
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Context) -> Any:
        if self._catalog is None:
            raise Unimplemented("this gRPC server does not offer model statistics")
        rows = self._catalog.model_statistics(request.name or None, request.version or None)
        return statistics_message(rows)

    # -- model repository extension (delegated) -----------------------------------------------
    @guarded
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Context) -> Any:
        control = await self._repository(context, "RepositoryIndex")
        return await repository_rpcs.repository_index(control, request, context)

    @guarded
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Context
    ) -> Any:
        control = await self._repository(context, "RepositoryModelLoad")
        return await repository_rpcs.repository_model_load(control, request, context)

    @guarded
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context
    ) -> Any:
        control = await self._repository(context, "RepositoryModelUnload")
        return await repository_rpcs.repository_model_unload(control, request, context)

    # -- shared memory extensions (system: with server.sharedMemory; CUDA: refused) ----------
    # Same group as the repository RPCs (app/servekit/grpc/access.py); why:
    # app/servekit/rest/shared_memory.py.
    @guarded
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Context
    ) -> Any:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self._dataplane.shared_memory.status(request.name or None):
            response.regions[region.name].CopyFrom(
                _REGION(
                    name=region.name,
                    key=region.key,
                    offset=region.offset,
                    byte_size=region.byte_size,
                )
            )
        return response

    @guarded
    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Context
    ) -> Any:
        self._dataplane.shared_memory.register(
            request.name, request.key, request.offset, request.byte_size, peer=context.peer()
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @guarded
    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Context
    ) -> Any:
        self._dataplane.shared_memory.unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    @guarded
    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Context
    ) -> Any:
        if request.name:
            raise NotFound(
                f"Unable to find cuda shared memory region: {shown_name(request.name)} "
                "(servekit offers system shared memory only)"
            )
        return pb.CudaSharedMemoryStatusResponse()

    @guarded
    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Context
    ) -> Any:
        raise InvalidArgument(CUDA_UNSUPPORTED.format(name=shown_name(request.name)))

    @guarded
    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Context
    ) -> Any:
        return pb.CudaSharedMemoryUnregisterResponse()  # nothing is ever registered

    async def _repository(self, context: Context, method: str) -> ModelControl:
        if self._control is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                f"{method}: the model repository extension is not enabled on this server",
            )
        assert self._control is not None
        return self._control


_REGION = pb.SystemSharedMemoryStatusResponse.RegionStatus
_FEATURES = {
    "TraceSetting": "the trace extension",
    "LogSettings": "the logging extension",
}


def _unimplemented(method: str) -> Any:
    feature = next((f for key, f in _FEATURES.items() if method.startswith(key)), "this RPC")
    message = f"{method} is not implemented: servekit does not offer {feature}"

    async def handler(self: InferenceServicer, request: Any, context: Context) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)

    handler.__name__ = method
    return handler


IMPLEMENTED = frozenset(
    name
    for name, value in vars(InferenceServicer).items()
    if name[:1].isupper() and callable(value)
)
for _method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
    if _method.name not in IMPLEMENTED:
        setattr(InferenceServicer, _method.name, _unimplemented(_method.name))
