"""API-group tokens over gRPC: one server interceptor and the one table of method -> group.

The metadata key is ``authorization`` with the value ``Bearer <token>``, as over HTTP, so a
client sets it once for both (tritonclient: ``headers={"authorization": "Bearer ..."}``). The
interceptor is installed only when a group has a token. A method missing from
:data:`METHOD_GROUPS` counts as admin (fail closed), and tests/test_auth_grpc.py checks that every
method our servers register is in the table, so a new RPC has to choose its group.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from app.auth import AccessPolicy, ApiGroup
from app.errors import Unauthenticated

_INFERENCE = "/inference.GRPCInferenceService/"
_GRPS = "/grps.protos.v1.GrpsService/"

METHOD_GROUPS: dict[str, ApiGroup] = {
    # Open Inference Protocol (Triton's GRPCInferenceService)
    _INFERENCE + "ServerLive": ApiGroup.OPEN,
    _INFERENCE + "ServerReady": ApiGroup.OPEN,
    _INFERENCE + "ModelReady": ApiGroup.OPEN,
    _INFERENCE + "ServerMetadata": ApiGroup.METADATA,
    _INFERENCE + "ModelMetadata": ApiGroup.METADATA,
    _INFERENCE + "ModelInfer": ApiGroup.INFERENCE,
    _INFERENCE + "ModelStreamInfer": ApiGroup.INFERENCE,
    _INFERENCE + "ModelConfig": ApiGroup.ADMIN,
    _INFERENCE + "ModelStatistics": ApiGroup.ADMIN,
    _INFERENCE + "RepositoryIndex": ApiGroup.REPOSITORY,
    _INFERENCE + "RepositoryModelLoad": ApiGroup.REPOSITORY,
    _INFERENCE + "RepositoryModelUnload": ApiGroup.REPOSITORY,
    # grps
    _GRPS + "Predict": ApiGroup.INFERENCE,
    _GRPS + "PredictStreaming": ApiGroup.INFERENCE,
    _GRPS + "Online": ApiGroup.ADMIN,
    _GRPS + "Offline": ApiGroup.ADMIN,
    _GRPS + "CheckLiveness": ApiGroup.OPEN,
    _GRPS + "CheckReadiness": ApiGroup.OPEN,
    _GRPS + "ServerMetadata": ApiGroup.METADATA,
    _GRPS + "ModelMetadata": ApiGroup.METADATA,
    # probes and discovery
    "/grpc.health.v1.Health/Check": ApiGroup.OPEN,
    "/grpc.health.v1.Health/Watch": ApiGroup.OPEN,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": ApiGroup.METADATA,
}
"""The group of every method; anything else (e.g. the shared-memory RPCs) is admin."""


def group_of(method: str) -> ApiGroup:
    return METHOD_GROUPS.get(method, ApiGroup.ADMIN)


Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class AccessInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses a call to a protected group without its bearer token: UNAUTHENTICATED."""

    def __init__(self, policy: AccessPolicy) -> None:
        self._policy = policy

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        group = group_of(details.method)
        handler = await continuation(details)
        if handler is None or not self._policy.protects(group):
            return handler
        token = None
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                token = value
                break
        if self._policy.allows(group, token):
            return handler
        return _refusal(handler, self._policy, group, token)


def _refusal(
    handler: grpc.RpcMethodHandler, policy: AccessPolicy, group: ApiGroup, token: Any
) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that ends the call with UNAUTHENTICATED
    (checked through the policy, so the refusal is logged with the peer's address)."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        try:
            policy.check(group, token, context.peer())
        except Unauthenticated as exc:
            # Status set and returned rather than context.abort(): an abort raised from a
            # handler the interceptor made up left grpcio's poller thread running after stop.
            context.set_code(grpc.StatusCode.UNAUTHENTICATED)
            context.set_details(exc.message)

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(refuse, **kwargs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(refuse, **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
    return grpc.stream_stream_rpc_method_handler(refuse, **kwargs)
