"""The gRPC server: one ``grpc.aio`` server on the caller's event loop, over the shared DataPlane.

It serves ``inference.GRPCInferenceService``, ``grpc.health.v1.Health`` and server reflection,
plus whatever other services callers register (e.g. grps) through ``services``. Message size
limits come from ``server.grpcMaxMessageBytes`` in both directions. SO_REUSEPORT is disabled so
that a port already in use is an error instead of two servers silently sharing it. It listens on
the addresses the HTTP listener bound (app/servekit/listen.py), over TLS when ``server.tls`` is set.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import grpc
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from servekit.config.schema import ServerConfig
from servekit.config.tls import TlsFiles
from servekit.grpc import health, servicer, tuning
from servekit.grpc.access import protect
from servekit.grpc.undecodable import SafeRegistration
from servekit.listen import PORT_ATTEMPTS, url_host
from servekit.protos import POOL
from servekit.protos import grpc_service_pb2_grpc as pb_grpc
from servekit.services import Catalog, DataPlane, ModelControl

Registrar = Callable[[grpc.aio.Server], Iterable[str]]
"""Adds services to the server and returns their full names (for health and reflection)."""


async def start_grpc_server(
    dataplane: DataPlane,
    server: ServerConfig,
    *,
    catalog: Catalog | None = None,
    control: ModelControl | None = None,
    services: Sequence[Registrar] = (),
    hosts: Sequence[str] | None = None,
    tls: TlsFiles | None = None,
    reuse_port: bool = False,
    before_statistics: Callable[[], Awaitable[None]] | None = None,
) -> tuple[grpc.aio.Server, int]:
    """Build, bind and start the gRPC server; return it and the bound port (0 -> a free one).

    ``hosts`` are the IP addresses to listen on (what the HTTP listener bound, so both agree;
    default ``server.host`` as given), all on one port; ``tls`` serves over TLS, requiring a client
    certificate when it has client CAs (mutual TLS). ``control`` enables the repository RPCs,
    ``catalog`` the statistics RPC. ``server.grpcPollerNice`` is applied here, once (it is
    restart-only). ``reuse_port`` lets the workers of ``server.workers`` share the port (and only
    they: the supervisor reserved it); ``before_statistics`` runs before each ModelStatistics call
    (a worker's refresh of the other workers' counts)."""
    addresses = list(hosts) if hosts else [server.host]
    credentials = None
    if tls is not None:
        credentials = grpc.ssl_server_credentials(
            [(tls.private_key, tls.cert_chain)],
            root_certificates=tls.client_ca,
            require_client_auth=tls.mutual,
        )
    for _ in range(PORT_ATTEMPTS):
        aio_server, health_servicer = _build(
            dataplane, server, control, services, reuse_port, before_statistics, catalog
        )
        try:
            port = _add_ports(aio_server, addresses, server.grpc_port or 0, credentials)
        except OSError:
            await aio_server.stop(None)  # release what was bound before the failure
            raise
        if port is not None:
            break
        await aio_server.stop(None)  # the port picked is taken on a later address: try another
    else:
        raise OSError(f"cannot listen for gRPC: no port free on all of {', '.join(addresses)}")
    await aio_server.start()
    tuning.lower_poller_priority(server.grpc_poller_nice)
    return GrpcServer(aio_server, health_servicer), port


def statistics_first(
    inference: servicer.InferenceServicer, before: Callable[[], Awaitable[None]]
) -> None:
    """ModelStatistics awaits ``before`` (a worker's fetch of the other workers' counts) first.

    Wrapped once on the instance, like the bearer check (app/servekit/grpc/access.py), not with
    a server interceptor: grpcio runs interceptors in Python on every call of every method, so
    one there made each inference call of a worker pay for the rare statistics read.
    """
    method = inference.ModelStatistics

    @functools.wraps(method)
    async def refreshed(request: Any, context: Any) -> Any:
        await before()
        return await method(request, context)

    inference.ModelStatistics = refreshed  # type: ignore[method-assign]


def _build(
    dataplane: DataPlane,
    server: ServerConfig,
    control: ModelControl | None,
    services: Sequence[Registrar],
    reuse_port: bool = False,
    before_statistics: Callable[[], Awaitable[None]] | None = None,
    catalog: Catalog | None = None,
) -> tuple[grpc.aio.Server, health.HealthServicer]:
    """The server with every service registered, not yet bound."""
    access = dataplane.access
    options = server_options(server)
    if reuse_port:
        options = [(k, 1 if k == "grpc.so_reuseport" else v) for k, v in options]
    aio_server = grpc.aio.server(options=options)
    # Every service registers through this stand-in, which makes undecodable requests
    # INVALID_ARGUMENT instead of grpcio's UNKNOWN plus an ERROR traceback per call.
    registry = SafeRegistration(aio_server)
    inference = servicer.InferenceServicer(dataplane, control, catalog)
    if before_statistics is not None:
        statistics_first(inference, before_statistics)
    protect(inference, servicer.SERVICE_NAME, access)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(inference, registry)  # type: ignore[no-untyped-call]
    names = [servicer.SERVICE_NAME]
    for register in services:
        names.extend(register(registry))
    health_servicer = health.HealthServicer(dataplane, names)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, registry)
    names.append(health.SERVICE_NAME)
    _register_descriptors()
    reflection.enable_server_reflection([*names, reflection.SERVICE_NAME], registry, pool=POOL)
    return aio_server, health_servicer


KEEPALIVE_TIMEOUT_MS = 20_000
"""How long a keepalive ping may go unanswered before the connection is dropped."""
MIN_CLIENT_PING_MS = 10_000
"""Clients pinging more often than this without a call in progress get GOAWAY."""


def server_options(server: ServerConfig) -> list[tuple[str, int]]:
    """grpc core's channel arguments, every limit set explicitly (``server.network``) rather
    than left to grpcio's defaults, which change between releases."""
    limit = server.grpc_max_message_bytes
    network = server.network
    metadata = network.grpc_max_metadata_bytes
    return [
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_send_message_length", limit),
        ("grpc.so_reuseport", 0),
        ("grpc.max_concurrent_streams", network.grpc_max_concurrent_streams),
        # Soft and hard metadata limits: grpc core refuses larger headers with
        # RESOURCE_EXHAUSTED before any handler runs.
        ("grpc.max_metadata_size", metadata),
        ("grpc.absolute_max_metadata_size", metadata),
        ("grpc.keepalive_time_ms", round(network.grpc_keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_MS),
        ("grpc.http2.max_ping_strikes", 2),
        # A connection's (TLS) handshake within headerTimeoutSeconds, as on the HTTP listener
        # (grpc core's default is 120 s: a silent connection held its descriptor that long).
        ("grpc.server_handshake_timeout_ms", round(network.header_timeout_seconds * 1000)),
    ]


def _add_ports(
    aio_server: grpc.aio.Server, hosts: Sequence[str], port: int, credentials: Any
) -> int | None:
    """Bind every host on one port; None when a port picked for the first host is taken on a
    later one (the caller tries again). Any other failure is an OSError naming the address."""
    chosen = port
    for index, host in enumerate(hosts):
        address = f"{url_host(host)}:{chosen}"
        try:
            if credentials is None:
                bound = aio_server.add_insecure_port(address)
            else:
                bound = aio_server.add_secure_port(address, credentials)
        except RuntimeError as exc:
            if port == 0 and index > 0:
                return None
            raise OSError(f"cannot listen for gRPC on {address}: {exc}") from None
        if bound == 0:  # older grpcio reports a failed bind this way
            if port == 0 and index > 0:
                return None
            raise OSError(f"cannot listen for gRPC on {address}")
        chosen = bound
    return chosen


class GrpcServer(grpc.aio.Server):  # type: ignore[misc]
    """The grpc.aio server, plus what its stop must do first: tell health it is shutting down
    (Watch streams end at once instead of holding the stop for the whole grace period)."""

    def __init__(self, server: grpc.aio.Server, health_servicer: health.HealthServicer) -> None:
        self._server = server
        self._health = health_servicer

    async def stop(self, grace: float | None) -> None:
        await self._health.shut_down()
        await self._server.stop(grace)

    async def start(self) -> None:
        await self._server.start()

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        done: bool = await self._server.wait_for_termination(timeout)
        return done

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self._server.add_registered_method_handlers(service, handlers)

    def add_insecure_port(self, address: str) -> int:
        port: int = self._server.add_insecure_port(address)
        return port

    def add_secure_port(self, address: str, server_credentials: Any) -> int:
        port: int = self._server.add_secure_port(address, server_credentials)
        return port


def _register_descriptors() -> None:
    """Put the health and reflection protos into our private pool, so reflection finds them.

    Reflection is given ``POOL`` (our inference and grps protos live there, not in protobuf's
    default pool); the health and reflection protos come from their packages' default-pool
    modules, so their file descriptors are copied in once.
    """
    for module in (health_pb2, reflection_pb2):
        descriptor = module.DESCRIPTOR
        try:
            POOL.FindFileByName(descriptor.name)
        except KeyError:
            proto = descriptor_pb2.FileDescriptorProto()
            descriptor.CopyToProto(proto)
            POOL.Add(proto)
