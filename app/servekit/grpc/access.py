"""API-group tokens over gRPC: one server interceptor and the one table of method -> group.

The metadata key is ``authorization`` with the value ``Bearer <token>``, as over HTTP, so a client
sets it once for both (tritonclient: ``headers={"authorization": "Bearer ..."}``). :func:`protect`
wraps the servicers' methods when they are registered, only when a group has a token or is closed (a
public bind without its token: config/auth.py ``close_public_groups``). The ``:authority`` header is
not checked against ``server.allowedHosts``: DNS rebinding is a browser's attack, and no page can
speak gRPC (app/servekit/config/hosts.py). A method missing from :data:`METHOD_GROUPS` counts as
admin (fail closed), and tests/test_auth_unit.py checks that every method our servicers implement is
in the table, so a new RPC has to choose its group. Server reflection stays open, like the OpenAPI
document: it describes the protocol, not the models."""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import grpc

from servekit.config.auth import AccessPolicy, ApiGroup
from servekit.errors import PermissionDenied, Unauthenticated

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
    # shared memory: the repository's group, as over HTTP (why: app/servekit/rest/shared_memory.py)
    _INFERENCE + "SystemSharedMemoryStatus": ApiGroup.REPOSITORY,
    _INFERENCE + "SystemSharedMemoryRegister": ApiGroup.REPOSITORY,
    _INFERENCE + "SystemSharedMemoryUnregister": ApiGroup.REPOSITORY,
    _INFERENCE + "CudaSharedMemoryStatus": ApiGroup.REPOSITORY,
    _INFERENCE + "CudaSharedMemoryRegister": ApiGroup.REPOSITORY,
    _INFERENCE + "CudaSharedMemoryUnregister": ApiGroup.REPOSITORY,
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
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": ApiGroup.OPEN,
}
"""The group of every method; anything else (e.g. trace and log settings) is admin."""


def group_of(method: str) -> ApiGroup:
    return METHOD_GROUPS.get(method, ApiGroup.ADMIN)


def protect(servicer: object, service: str, policy: AccessPolicy) -> None:
    """Put the bearer check in front of each method of ``servicer`` (the implementation of
    gRPC service ``service``) whose group has a token or is closed; others are left untouched.

    Done once at registration, on the instance, instead of with a server interceptor: grpcio
    runs interceptors in Python for every call of every method, which cost about 4% of the
    gRPC inference rate (docs/performance.md), while a wrapped method costs one metadata read
    and only where a token is required. Every method the servicer defines is considered,
    listed in :data:`METHOD_GROUPS` or not (then admin), so a new RPC is never left open.
    """
    if not policy.enabled:
        return
    for name in _rpc_names(servicer):
        group = group_of(f"/{service}/{name}")
        if policy.guards(group):
            setattr(servicer, name, _checked(getattr(servicer, name), policy, group))


def _rpc_names(servicer: object) -> list[str]:
    """The servicer's RPC methods: public callables named like RPCs (CamelCase)."""
    return [
        name
        for name in dir(type(servicer))
        if name[:1].isupper() and callable(getattr(servicer, name, None))
    ]


def _checked(method: Any, policy: AccessPolicy, group: ApiGroup) -> Any:
    """``method`` behind the check; an async generator (a streaming answer) stays one."""
    if inspect.isasyncgenfunction(method):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if _refused(context, policy, group):
                return
            async with aclosing(method(request, context)) as replies:  # closed if cancelled
                async for reply in replies:
                    yield reply

        return functools.wraps(method)(stream)

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if _refused(context, policy, group):
            return None
        return await method(request, context)

    return functools.wraps(method)(unary)


def _refused(context: grpc.aio.ServicerContext, policy: AccessPolicy, group: ApiGroup) -> bool:
    """Whether the call lacks its token; if so its status is set to UNAUTHENTICATED.

    The status is set and the handler returns, rather than ``context.abort()``: an abort here
    left grpcio's poller thread running after the server of a notebook stopped."""
    token = None
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            token = value
            break
    if policy.allows(group, token):
        return False
    try:
        policy.check(group, token, context.peer())  # raises; logs with the peer's address
    except Unauthenticated as exc:
        context.set_code(grpc.StatusCode.UNAUTHENTICATED)
        context.set_details(exc.message)
        return True
    except PermissionDenied as exc:  # a group closed on a public bind (config/auth.py)
        context.set_code(grpc.StatusCode.PERMISSION_DENIED)
        context.set_details(exc.message)
        return True
    return False
