"""HTTP routes of Triton's shared-memory extensions (``/v2/systemsharedmemory/...``, and the
CUDA one answered with why it is not offered).

What tritonclient.http calls: ``register_system_shared_memory(name, key, byte_size, offset)``
posts ``{"key", "offset", "byte_size"}`` to ``.../region/{name}/register``;
``get_system_shared_memory_status([name])`` reads ``[{"name", "key", "offset", "byte_size"}]``;
``unregister_system_shared_memory([name])`` unregisters one region or all. The regions live in
the DataPlane's :class:`servekit.services.shared_memory.SharedMemoryRegions`; inference reads and
writes them there, whatever transport the request came over.

Off unless ``server.sharedMemory: system``: without it the system routes answer 403 saying which
setting enables them (the CUDA routes answer as always). Registering is accepted from a client on
the server's host only (the peer uvicorn saw: loopback, or a UNIX socket), checked in the service.

API group: ``repository``. Registering makes the server open (and keep open) an object a client
names and write model outputs into it; that changes what the server holds and touches host
memory beyond the request, like loading a model, not like one inference. The operator who hands
out the repository token already trusts its holders with server state; a group of its own would
add a token setting to serve.yaml for a feature used by clients on the same host only (the
regions are local by nature), and inference with a region still needs the inference token.
Register and unregister also carry the cross-site guard of control routes.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get, post
from litestar.openapi.spec import OpenAPIType, Schema
from litestar.params import FromPath

from servekit.codecs.v2_json import loads
from servekit.config.auth import ApiGroup
from servekit.errors import InvalidArgument, NotFound, shown_name
from servekit.rest.access import cross_site_guard, group_opt
from servekit.rest.inject import Dataplane
from servekit.rest.openapi import failures, with_media
from servekit.services import CUDA_UNSUPPORTED

_SYSTEM = "/v2/systemsharedmemory"
_CUDA = "/v2/cudasharedmemory"
_GROUP = group_opt(ApiGroup.REPOSITORY)
_FAILS = failures(ApiGroup.REPOSITORY, 400, 403, 404, 409, 413)
"""What a shared-memory route can refuse (a bad key or window, an unknown or taken name, shared
memory disabled or a remote client, no room for another region)."""
_REGISTER = Schema(
    type=OpenAPIType.OBJECT,
    required=["key", "byte_size"],
    properties={
        "key": Schema(type=OpenAPIType.STRING),
        "offset": Schema(type=OpenAPIType.INTEGER, minimum=0),
        "byte_size": Schema(type=OpenAPIType.INTEGER, minimum=0),
    },
)
"""Triton's register body (system shared memory)."""


def _done() -> Response[dict[str, Any]]:
    return Response({}, status_code=200)


async def _register_body(request: Request[Any, Any, Any]) -> dict[str, Any]:
    raw = await request.body()
    body = loads(raw) if raw.strip() else {}
    if not isinstance(body, dict):
        raise InvalidArgument("shared memory register request must be a JSON object")
    for field in ("key", "byte_size"):
        if field not in body:
            raise InvalidArgument(f"Shared memory register request has no {field!r} field")
    return body


# -- system shared memory -----------------------------------------------------------------------
@get(f"{_SYSTEM}/status", opt=_GROUP, sync_to_thread=False, responses=_FAILS)
def system_status(dataplane: Dataplane) -> list[dict[str, Any]]:
    return [region.as_dict() for region in dataplane.shared_memory.status()]


@get(f"{_SYSTEM}/region/{{name:str}}/status", opt=_GROUP, sync_to_thread=False, responses=_FAILS)
def system_region_status(dataplane: Dataplane, name: FromPath[str]) -> list[dict[str, Any]]:
    return [region.as_dict() for region in dataplane.shared_memory.status(name)]


@post(
    f"{_SYSTEM}/region/{{name:str}}/register",
    opt=_GROUP,
    guards=[cross_site_guard],
    status_code=200,
    responses=_FAILS,
    operation_class=with_media(body=_REGISTER),
)
async def system_register(
    request: Request[Any, Any, Any], dataplane: Dataplane, name: FromPath[str]
) -> Response[dict[str, Any]]:
    body = await _register_body(request)
    peer = request.client.host if request.client is not None else None
    dataplane.shared_memory.register(
        name, body["key"], body.get("offset", 0), body["byte_size"], peer=peer
    )
    return _done()


@post(
    f"{_SYSTEM}/unregister",
    opt=_GROUP,
    guards=[cross_site_guard],
    status_code=200,
    responses=_FAILS,
)
async def system_unregister_all(dataplane: Dataplane) -> Response[dict[str, Any]]:
    dataplane.shared_memory.unregister()
    return _done()


@post(
    f"{_SYSTEM}/region/{{name:str}}/unregister",
    opt=_GROUP,
    guards=[cross_site_guard],
    status_code=200,
    responses=_FAILS,
)
async def system_unregister(dataplane: Dataplane, name: FromPath[str]) -> Response[dict[str, Any]]:
    dataplane.shared_memory.unregister(name)
    return _done()


# -- CUDA shared memory: not offered, said clearly ------------------------------------------------
# Status lists nothing and unregistering (nothing) succeeds, as on a Triton built without GPUs:
# Triton's examples call unregister_cuda_shared_memory() to start clean. Registering is refused.


@get(f"{_CUDA}/status", opt=_GROUP, sync_to_thread=False, responses=_FAILS)
def cuda_status() -> list[dict[str, Any]]:
    return []


@get(f"{_CUDA}/region/{{name:str}}/status", opt=_GROUP, sync_to_thread=False, responses=_FAILS)
def cuda_region_status(name: FromPath[str]) -> list[dict[str, Any]]:
    raise NotFound(
        f"Unable to find cuda shared memory region: {shown_name(name)} (servekit offers system "
        "shared memory only)"
    )


@post(
    f"{_CUDA}/region/{{name:str}}/register",
    opt=_GROUP,
    guards=[cross_site_guard],
    responses=_FAILS,
)
async def cuda_register(name: FromPath[str]) -> Response[dict[str, Any]]:
    raise InvalidArgument(CUDA_UNSUPPORTED.format(name=shown_name(name)))


@post(
    f"{_CUDA}/unregister", opt=_GROUP, guards=[cross_site_guard], status_code=200, responses=_FAILS
)
async def cuda_unregister_all() -> Response[dict[str, Any]]:
    return _done()


@post(
    f"{_CUDA}/region/{{name:str}}/unregister",
    opt=_GROUP,
    guards=[cross_site_guard],
    status_code=200,
    responses=_FAILS,
)
async def cuda_unregister(name: FromPath[str]) -> Response[dict[str, Any]]:
    return _done()


ROUTES = [
    system_status,
    system_region_status,
    system_register,
    system_unregister_all,
    system_unregister,
    cuda_status,
    cuda_region_status,
    cuda_register,
    cuda_unregister_all,
    cuda_unregister,
]
"""Mounted by the server, which names ``system_shared_memory`` in server metadata."""
