"""gRPC glue of Triton's model repository extension: RepositoryIndex, Load and Unload.

The servicer (app/servekit/grpc/servicer.py) delegates the three RPCs here and maps any ServeError
to its gRPC status through the one table (app/servekit/grpc/status.py), so these functions just
translate messages. ``file:`` parameters arrive as ``bytes_param``; a file sent as any other kind is
the client's mistake and is refused by the core with INVALID_ARGUMENT."""

from __future__ import annotations

from typing import Any

import grpc

from servekit.errors import InvalidArgument
from servekit.protos import grpc_service_pb2 as pb
from servekit.services import ModelControl


def _parameters(parameters: Any) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        if choice is None:
            raise InvalidArgument(f"parameter {key!r} has no value")
        out[key] = getattr(parameter, choice)
    return out


async def repository_index(
    control: ModelControl, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext
) -> pb.RepositoryIndexResponse:
    rows = control.index(ready_only=request.ready)
    return pb.RepositoryIndexResponse(
        models=[
            pb.RepositoryIndexResponse.ModelIndex(
                name=r.name, version=r.version, state=r.state, reason=r.reason
            )
            for r in rows
        ]
    )


async def repository_model_load(
    control: ModelControl,
    request: pb.RepositoryModelLoadRequest,
    context: grpc.aio.ServicerContext,
) -> pb.RepositoryModelLoadResponse:
    await control.load(request.model_name, _parameters(request.parameters))
    return pb.RepositoryModelLoadResponse()


async def repository_model_unload(
    control: ModelControl,
    request: pb.RepositoryModelUnloadRequest,
    context: grpc.aio.ServicerContext,
) -> pb.RepositoryModelUnloadResponse:
    params = _parameters(request.parameters)
    dependents = params.pop("unload_dependents", False)
    if not isinstance(dependents, bool):
        raise InvalidArgument("'unload_dependents' must be a bool parameter")
    await control.unload(request.model_name, unload_dependents=dependents)
    return pb.RepositoryModelUnloadResponse()
