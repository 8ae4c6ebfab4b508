"""gRPC health ``Watch`` streams are bounded (issue 22, finding 10): health needs no token, and
thousands of idle Watch streams were memory for the asking. One connection may hold
``WATCHES_PER_CONNECTION`` of them and the server ``WATCHES_TOTAL``; beyond either the stream
gets RESOURCE_EXHAUSTED with a message, and the server goes on answering (Check, a Watch once
others closed, HTTP health)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from servers import running_server

from servekit.grpc.health import WATCHES_PER_CONNECTION, WATCHES_TOTAL

pytestmark = pytest.mark.slow  # a real server process and gRPC clients (tests/tiers.py)

SERVING = health_pb2.HealthCheckResponse.SERVING
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
"""Each channel its own TCP connection (grpcio otherwise shares one between channels)."""


async def _open(stub: health_pb2_grpc.HealthStub, count: int) -> list[object]:
    """``count`` Watch streams, each past its first answer (so the server holds it)."""
    calls = [stub.Watch(health_pb2.HealthCheckRequest()) for _ in range(count)]
    firsts = await asyncio.gather(*(call.read() for call in calls))  # type: ignore[attr-defined]
    assert all(first.status == SERVING for first in firsts)
    return calls


async def _refused(stub: health_pb2_grpc.HealthStub) -> grpc.aio.AioRpcError:
    call = stub.Watch(health_pb2.HealthCheckRequest())
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(call.read(), 10)
    return caught.value


async def _scenario(target: str) -> None:
    channels = [
        grpc.aio.insecure_channel(target, options=OWN_CONNECTION)
        for _ in range(WATCHES_TOTAL // WATCHES_PER_CONNECTION + 1)
    ]
    try:
        stubs = [health_pb2_grpc.HealthStub(c) for c in channels]
        first = await _open(stubs[0], WATCHES_PER_CONNECTION)
        error = await _refused(stubs[0])
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "per connection" in (error.details() or "")
        held = [first]  # (a call no longer referenced is cancelled)
        for stub in stubs[1:-1]:  # up to the server's total, one full connection at a time
            held.append(await _open(stub, WATCHES_PER_CONNECTION))
        error = await _refused(stubs[-1])
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limit" in (error.details() or "")
        # The server still answers, on a connection of its own and on a full one.
        check = await stubs[-1].Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert check.status == SERVING
        check = await stubs[0].Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert check.status == SERVING
        # A stream closed frees its place.
        first[0].cancel()  # type: ignore[attr-defined]
        for _ in range(200):  # bounded: the server hears of the cancel shortly
            call = stubs[-1].Watch(health_pb2.HealthCheckRequest())
            try:
                answer = await asyncio.wait_for(call.read(), 10)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                await asyncio.sleep(0.05)
                continue
            assert answer.status == SERVING
            call.cancel()
            break
        else:
            raise AssertionError("a closed Watch stream never freed its place")
    finally:
        await asyncio.gather(*(c.close() for c in channels))


def test_watch_streams_are_capped_per_connection_and_in_total(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("server: {strictReadiness: false}\nmodels: []\n")
    with running_server(config) as server:
        assert server.grpc_target is not None
        asyncio.run(_scenario(server.grpc_target))
        with httpx.Client(base_url=server.http_url, timeout=10) as client:
            assert client.get("/v2/health/ready").status_code == 200
        assert server.alive(), server.log()
