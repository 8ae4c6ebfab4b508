"""``grps.protos.v1.GrpsService`` (seed 001) over the one DataPlane.

Handlers are thin: the select -> decode -> infer -> encode sequence lives in
:mod:`servekit.services.grps`, shared with the HTTP routes. Failures end the call with the gRPC
status of the one error table (:mod:`servekit.grpc.status`): INVALID_ARGUMENT, NOT_FOUND,
UNAVAILABLE, ... with the message. CheckReadiness is a question, not a failure: a server that is
not ready answers OK with a FAILURE status (code 503) and the reason, as over HTTP.
PredictStreaming is server streaming: one message per result of a decoupled model (a Python
predict that yields), one message for any other model; an error ends the stream with the mapped
status, before or after messages were sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import TypeAlias

import grpc

from servekit.codecs import grps_reply
from servekit.grpc.access import protect
from servekit.grpc.status import guarded, status_of
from servekit.protos import grps_pb2 as pb
from servekit.protos import grps_pb2_grpc as pb_grpc
from servekit.services import Catalog, DataPlane, grps_calls

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GrpsService"].full_name
Context: TypeAlias = grpc.aio.ServicerContext
Message: TypeAlias = pb.GrpsMessage


class GrpsServicer(pb_grpc.GrpsServiceServicer):
    """The grps service of one DataPlane (and its Catalog, for the server's metadata)."""

    def __init__(self, dataplane: DataPlane, catalog: Catalog) -> None:
        self._dataplane = dataplane
        self._catalog = catalog

    @guarded
    async def Predict(self, request: Message, context: Context) -> Message:
        kind, response = await grps_calls.predict(self._dataplane, request)
        return grps_reply.encode_response(response, kind)

    async def PredictStreaming(self, request: Message, context: Context) -> AsyncIterator[Message]:
        try:
            kind, responses = grps_calls.start_stream(self._dataplane, request)
            async with aclosing(responses):  # a cancelled call closes the model's generator
                async for response in responses:
                    yield grps_reply.encode_response(response, kind)
        except Exception as exc:
            code, message = status_of(exc)
            await context.abort(code, message)

    @guarded
    async def Online(self, request: Message, context: Context) -> Message:
        self._dataplane.set_online(True)
        return grps_reply.ok()

    @guarded
    async def Offline(self, request: Message, context: Context) -> Message:
        self._dataplane.set_online(False)
        return grps_reply.ok()

    @guarded
    async def CheckLiveness(self, request: Message, context: Context) -> Message:
        return grps_reply.ok()

    @guarded
    async def CheckReadiness(self, request: Message, context: Context) -> Message:
        return grps_calls.readiness(self._dataplane)

    @guarded
    async def ServerMetadata(self, request: Message, context: Context) -> Message:
        return grps_reply.ok(str_data=grps_calls.server_metadata(self._dataplane, self._catalog))

    @guarded
    async def ModelMetadata(self, request: Message, context: Context) -> Message:
        """The request's str_data names the model (else its model field, else the default)."""
        selector = request.str_data or request.model
        return grps_reply.ok(str_data=grps_calls.model_metadata(self._dataplane, selector))


def registrar(dataplane: DataPlane, catalog: Catalog) -> Callable[[grpc.aio.Server], list[str]]:
    """What :func:`servekit.grpc.server.start_grpc_server` takes in ``services``."""

    def register(server: grpc.aio.Server) -> list[str]:
        grps = GrpsServicer(dataplane, catalog)
        protect(grps, SERVICE_NAME, dataplane.access)
        pb_grpc.add_GrpsServiceServicer_to_server(grps, server)  # type: ignore[no-untyped-call]
        return [SERVICE_NAME]

    return register
