"""``grpc.health.v1.Health`` (what Kubernetes gRPC probes call) and server reflection.

Health is checked with grpcio-health-checking's own stub; reflection with grpcio-reflection's
client-side ``ProtoReflectionDescriptorDatabase``, the way grpcurl-style tools discover a server.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from servers import BROKEN_MODELS, start_server

pytestmark = pytest.mark.slow

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def check(channel: grpc.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    status: int = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status
    return status


@pytest.mark.parametrize("service", ["", "inference.GRPCInferenceService", "mlp", "add_sub"])
def test_serving(channel: grpc.Channel, service: str) -> None:
    assert check(channel, service) == SERVING


@pytest.mark.parametrize("model", sorted(BROKEN_MODELS))
def test_a_model_that_failed_to_load_is_not_serving(channel: grpc.Channel, model: str) -> None:
    assert check(channel, model) == NOT_SERVING


def test_unknown_service_is_not_found(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as info:
        check(channel, "no_such_model")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "no_such_model" in info.value.details()


def test_watch_sends_the_current_status(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    for service, expected in [
        ("mlp", SERVING),
        ("broken_lfs", NOT_SERVING),
        ("no_such_model", health_pb2.HealthCheckResponse.SERVICE_UNKNOWN),
    ]:
        call = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=10)
        try:
            assert next(call).status == expected
        finally:
            call.cancel()


def test_reflection_lists_and_describes_the_services(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert {
        "inference.GRPCInferenceService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= services
    pool = DescriptorPool(database)
    inference = pool.FindServiceByName("inference.GRPCInferenceService")
    methods = {m.name for m in inference.methods}
    assert {"ModelInfer", "ModelStreamInfer", "ModelConfig", "ModelStatistics"} <= methods
    request = pool.FindMessageTypeByName("inference.ModelInferRequest")
    assert request.fields_by_name["raw_input_contents"].number == 7
    config = pool.FindMessageTypeByName("inference.ModelConfig")
    assert config.fields_by_name["max_batch_size"].number == 4
    for name in services:  # every listed service resolves to a file
        assert pool.FindServiceByName(name).methods


def test_watchers_see_not_serving_and_do_not_hold_up_a_stop(model_store: Path) -> None:
    """SIGTERM while a Watch is open: the watcher gets NOT_SERVING, its stream ends, and the
    server exits without waiting out its grace period for the watcher."""
    own = start_server(model_store, grpc=True)
    try:
        assert own.grpc_target is not None
        with grpc.insecure_channel(own.grpc_target) as opened:
            stub = health_pb2_grpc.HealthStub(opened)
            call = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
            assert next(call).status == SERVING
            started = time.monotonic()
            own.process.send_signal(signal.SIGTERM)
            assert [r.status for r in call] == [NOT_SERVING]
            assert own.process.wait(timeout=8) == 0
            assert time.monotonic() - started < 8
    finally:
        own.stop()
