"""OpenTelemetry traces (app/servekit/observability/tracing.py) as a collector receives them: a real
OTLP receiver (grpcio serving opentelemetry-proto's TraceService, decoding the wire format) started
here on 127.0.0.1, a real ``servekit serve`` pointed at it with the standard ``OTEL_*`` variables,
and requests sent over HTTP and gRPC with a W3C ``traceparent``."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as otlp_grpc
from pydantic import ValidationError
from servers import running_server, start_server
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from waits import wait_until

from servekit.observability.tracing import wanted

MODEL = """
import numpy as np
from opentelemetry import trace

tracer = trace.get_tracer("scaler")


class Scaler:
    def predict(self, x: np.ndarray) -> dict[str, np.ndarray]:
        with tracer.start_as_current_span("scale") as span:  # the model's own span
            span.set_attribute("scale.rows", int(x.shape[0]))
            return {"y": x * 2}
"""

CONFIG = """\
models:
  - name: scaler
    modelFormat: {name: python}
    entrypoint: 'user_model:Scaler'
    maxBatchSize: 8
    inputs: [{name: x, datatype: FP32, shape: [-1, 2]}]
    outputs: [{name: y, datatype: FP32, shape: [-1, 2]}]
"""
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
HTTP_SPAN = "POST /v2/models/{model}/infer"
INFER = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}


class Receiver(otlp_grpc.TraceServiceServicer):  # type: ignore[misc]
    """An OTLP/gRPC trace receiver: keeps every span it is sent, by name."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[Any] = []
        self.resources: list[dict[str, str]] = []

    def Export(self, request: otlp.ExportTraceServiceRequest, context: Any) -> Any:
        with self.lock:
            for resource_spans in request.resource_spans:
                attributes = {
                    a.key: a.value.string_value for a in resource_spans.resource.attributes
                }
                self.resources.append(attributes)
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(scope_spans.spans)
        return otlp.ExportTraceServiceResponse()

    def of_trace(self, trace_id: str) -> list[Any]:
        with self.lock:
            return [s for s in self.spans if s.trace_id.hex() == trace_id]


@pytest.fixture
def listening(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Receiver, int]]:
    """A receiver on a free loopback port (and its port), with no ``OTEL_*`` variable set but
    the batch processor's delay (spans leave within 50 ms)."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    receiving = Receiver()
    otlp_grpc.add_TraceServiceServicer_to_server(receiving, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield receiving, port
    finally:
        server.stop(None)


@pytest.fixture
def receiver(listening: tuple[Receiver, int], monkeypatch: pytest.MonkeyPatch) -> Receiver:
    """A receiver, and the standard variables that point servers at it."""
    receiving, port = listening
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "scaler-service")
    return receiving


def _write(tmp_path: Path) -> Path:
    (tmp_path / "user_model.py").write_text(MODEL)
    config = tmp_path / "serve.yaml"
    config.write_text(CONFIG)
    return config


def _complete(receiver: Receiver, trace_id: str) -> list[Any]:
    """The trace's spans once its request span and the model's own span have arrived."""

    def arrived() -> bool:
        names = {s.name for s in receiver.of_trace(trace_id)}
        return {"scale", "encode"} <= names and any(
            s.kind == s.SPAN_KIND_SERVER for s in receiver.of_trace(trace_id)
        )

    wait_until(arrived, timeout=30, what=f"the spans of trace {trace_id}")
    return receiver.of_trace(trace_id)


def _check_tree(spans: list[Any], parent_id: str, server_name: str) -> Any:
    """The request span is the client's span's child; decode, queue, execute and encode are
    its children; the model's own span is execute's. Returns the request span."""
    by_name = {s.name: s for s in spans}
    assert {server_name, "decode", "queue", "execute", "encode", "scale"} <= set(by_name), [
        s.name for s in spans
    ]
    request = by_name[server_name]
    assert request.kind == request.SPAN_KIND_SERVER
    assert request.parent_span_id.hex() == parent_id
    for child in ("decode", "queue", "execute", "encode"):
        assert by_name[child].parent_span_id == request.span_id, child
    execute = by_name["execute"]
    assert by_name["scale"].parent_span_id == execute.span_id
    attributes = {a.key: a.value for a in execute.attributes}
    assert attributes["servekit.model"].string_value == "scaler"
    assert attributes["servekit.batch.requests"].int_value == 1
    assert attributes["servekit.batch.rows"].int_value == 1
    assert attributes["servekit.instance"].string_value == "0"
    decode, queued, encode = by_name["decode"], by_name["queue"], by_name["encode"]
    assert decode.end_time_unix_nano <= queued.start_time_unix_nano + 1_000_000
    assert queued.end_time_unix_nano <= execute.start_time_unix_nano
    assert execute.end_time_unix_nano <= encode.start_time_unix_nano
    assert request.start_time_unix_nano <= decode.start_time_unix_nano
    assert encode.end_time_unix_nano <= request.end_time_unix_nano
    return request


@pytest.mark.slow
def test_traces_over_http_and_grpc_reach_an_otlp_receiver(
    tmp_path: Path, receiver: Receiver
) -> None:
    config = _write(tmp_path)
    with running_server(config) as server, server.http_client(timeout=20) as http:
        answer = http.post(
            "/v2/models/scaler/infer",
            json=INFER,
            headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
        )
        assert answer.status_code == 200, answer.text
        returned = answer.headers["traceparent"].split("-")
        assert returned[1] == TRACE_ID and returned[2] != PARENT_ID
        spans = _complete(receiver, TRACE_ID)
        request = _check_tree(spans, PARENT_ID, HTTP_SPAN)
        assert request.span_id.hex() == returned[2]  # the answer names the server's span
        assert "x-request-id" in answer.headers

        grpc_trace, grpc_parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        assert server.grpc_target is not None
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            message = pb.ModelInferRequest(model_name="scaler")
            tensor = message.inputs.add(name="x", datatype="FP32", shape=[1, 2])
            tensor.contents.fp32_contents.extend([1, 2])
            reply, call = stub.ModelInfer.with_call(
                message, metadata=(("traceparent", f"00-{grpc_trace}-{grpc_parent}-01"),)
            )
        assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == [2, 4]
        trailing = dict(call.trailing_metadata())
        assert trailing["traceparent"].split("-")[1] == grpc_trace
        assert trailing["x-request-id"]
        request = _check_tree(
            _complete(receiver, grpc_trace),
            grpc_parent,
            "inference.GRPCInferenceService/ModelInfer",
        )
        assert trailing["traceparent"].split("-")[2] == request.span_id.hex()
        # A request without a traceparent starts a trace of its own; health is not traced.
        fresh = http.post("/v2/models/scaler/infer", json=INFER).headers["traceparent"]
        assert fresh.split("-")[1] not in (TRACE_ID, grpc_trace)
        assert "traceparent" not in http.get("/v2/health/ready").headers
    assert {"service.name": "scaler-service"}.items() <= receiver.resources[0].items()


@pytest.mark.slow
def test_traces_under_two_workers(tmp_path: Path, receiver: Receiver) -> None:
    config = _write(tmp_path)
    server = start_server(config, grpc=False, extra=["--workers", "2"], timeout=120)
    try:
        traces = [f"{i:032x}" for i in range(1, 7)]
        for trace_id in traces:  # a new connection each: the kernel spreads them
            with server.http_client(timeout=20) as http:
                answer = http.post(
                    "/v2/models/scaler/infer",
                    json=INFER,
                    headers={"traceparent": f"00-{trace_id}-{PARENT_ID}-01"},
                )
                assert answer.status_code == 200
                assert answer.headers["traceparent"].split("-")[1] == trace_id
        for trace_id in traces:
            _check_tree(_complete(receiver, trace_id), PARENT_ID, HTTP_SPAN)
    finally:
        server.stop()


STREAM_SPAN = "inference.GRPCInferenceService/ModelStreamInfer"


def _scaler_request(*values: float) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="scaler")
    tensor = message.inputs.add(name="x", datatype="FP32", shape=[1, len(values)])
    tensor.contents.fp32_contents.extend(values)
    return message


@pytest.mark.slow
def test_stream_infer_has_decode_and_encode_spans(tmp_path: Path, receiver: Receiver) -> None:
    """ModelStreamInfer: one server span for the call (the client's span its parent), and a
    decode and an encode span per request of the stream, the call span their parent."""
    config = _write(tmp_path)
    trace_id, parent_id = "5bf92f3577b34da6a3ce929d0e0e4737", "10f067aa0ba902b8"
    with running_server(config) as server:
        assert server.grpc_target is not None
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            replies = list(
                stub.ModelStreamInfer(
                    iter([_scaler_request(1, 2), _scaler_request(3, 4)]),
                    metadata=(("traceparent", f"00-{trace_id}-{parent_id}-01"),),
                )
            )
        assert [r.error_message for r in replies] == ["", ""]

        def arrived() -> bool:
            names = [s.name for s in receiver.of_trace(trace_id)]
            return STREAM_SPAN in names and names.count("encode") == 2

        wait_until(arrived, timeout=30, what="the stream's spans")
    spans = receiver.of_trace(trace_id)
    (call,) = [s for s in spans if s.name == STREAM_SPAN]
    assert call.kind == call.SPAN_KIND_SERVER
    assert call.parent_span_id.hex() == parent_id
    for name in ("decode", "encode", "execute"):
        children = [s for s in spans if s.name == name]
        assert len(children) == 2, (name, [s.name for s in spans])
        assert all(s.parent_span_id == call.span_id for s in children), name
        assert all(call.start_time_unix_nano <= s.start_time_unix_nano for s in children)
        assert all(s.end_time_unix_nano <= call.end_time_unix_nano for s in children)
    decodes = sorted(s.end_time_unix_nano for s in spans if s.name == "decode")
    encodes = sorted(s.start_time_unix_nano for s in spans if s.name == "encode")
    assert decodes[0] <= encodes[0] and decodes[1] <= encodes[1]


WAITER = """
import time
from pathlib import Path

import numpy as np


class Waiter:
    \"\"\"Says it started (a file), then waits for the test's release file (bounded).\"\"\"

    def predict(self, x: np.ndarray) -> dict[str, np.ndarray]:
        Path("started").touch()
        deadline = time.monotonic() + 30
        while not Path("release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        Path("started").unlink()  # the test's sign that this call is over
        return {"y": x}
"""
WAITER_CONFIG = """\
models:
  - name: waiter
    modelFormat: {name: python}
    entrypoint: 'waiter:Waiter'
    inputs: [{name: x, datatype: FP32, shape: [-1, 2]}]
    outputs: [{name: y, datatype: FP32, shape: [-1, 2]}]
"""


def _address(host_port: str) -> tuple[str, int]:
    host, _, port = host_port.rpartition(":")
    return host, int(port)


def _left_span(receiver: Receiver, trace_id: str) -> Any:
    """The request span of ``trace_id`` once it arrived."""

    def server_spans() -> list[Any]:
        return [s for s in receiver.of_trace(trace_id) if s.kind == s.SPAN_KIND_SERVER]

    wait_until(lambda: bool(server_spans()), timeout=30, what=f"the request span of {trace_id}")
    (span,) = server_spans()
    return span


def _says_client_left(span: Any) -> None:
    assert span.status.code == span.status.STATUS_CODE_ERROR, span.status
    assert "client left" in span.status.message
    assert "client left" in [event.name for event in span.events]


@pytest.mark.slow
def test_a_request_whose_client_leaves_still_ends_its_span(
    tmp_path: Path, receiver: Receiver
) -> None:
    """An HTTP client that closes its connection, and a gRPC client that cancels its call,
    while the model runs: the request span still ends, says so, and reaches the collector."""
    (tmp_path / "waiter.py").write_text(WAITER)
    config = tmp_path / "serve.yaml"
    config.write_text(WAITER_CONFIG)
    started, release = tmp_path / "started", tmp_path / "release"
    http_trace, grpc_trace = "6bf92f3577b34da6a3ce929d0e0e4738", "7bf92f3577b34da6a3ce929d0e0e4739"
    try:
        with running_server(config) as server:
            body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1,2]}]}'
            head = (
                f"POST /v2/models/waiter/infer HTTP/1.1\r\nHost: {server.http_host_port}\r\n"
                f"traceparent: 00-{http_trace}-{PARENT_ID}-01\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            with socket.create_connection(_address(server.http_host_port), timeout=10) as client:
                client.sendall(head.encode() + body)
                wait_until(started.exists, timeout=30, what="the model to start")
            span = _left_span(receiver, http_trace)  # arrives while the model still runs
            assert span.parent_span_id.hex() == PARENT_ID
            _says_client_left(span)
            release.touch()  # the HTTP call ends; the next may start only after it
            wait_until(lambda: not started.exists(), timeout=30, what="the first call to end")
            release.unlink()

            assert server.grpc_target is not None
            with grpc.insecure_channel(server.grpc_target) as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                message = pb.ModelInferRequest(model_name="waiter")
                tensor = message.inputs.add(name="x", datatype="FP32", shape=[1, 2])
                tensor.contents.fp32_contents.extend([1, 2])
                call = stub.ModelInfer.future(
                    message, metadata=(("traceparent", f"00-{grpc_trace}-{PARENT_ID}-01"),)
                )
                wait_until(started.exists, timeout=30, what="the model to start")
                call.cancel()
                span = _left_span(receiver, grpc_trace)
            assert span.parent_span_id.hex() == PARENT_ID
            _says_client_left(span)
            release.touch()  # the model's call ends: the server stops at once
    finally:
        release.touch()


@pytest.mark.slow
def test_server_tracing_in_serve_yaml_exports_without_otel_variables(
    tmp_path: Path, listening: tuple[Receiver, int]
) -> None:
    """``server.tracing`` alone (no OTEL_* variable) sends the spans to its endpoint, with its
    service name and headers."""
    receiving, port = listening
    (tmp_path / "user_model.py").write_text(MODEL)
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server:\n"
        "  tracing:\n"
        "    enabled: true\n"
        f"    endpoint: http://127.0.0.1:{port}\n"
        "    serviceName: from-serve-yaml\n"
        "    headers: {x-collector-token: s3cret-token}\n" + CONFIG
    )
    trace_id = "8bf92f3577b34da6a3ce929d0e0e473a"
    with running_server(config) as server, server.http_client(timeout=20) as http:
        answer = http.post(
            "/v2/models/scaler/infer",
            json=INFER,
            headers={"traceparent": f"00-{trace_id}-{PARENT_ID}-01"},
        )
        assert answer.status_code == 200, answer.text
        _check_tree(_complete(receiving, trace_id), PARENT_ID, HTTP_SPAN)
        assert "s3cret-token" not in server.log()
    assert {"service.name": "from-serve-yaml"}.items() <= receiving.resources[0].items()


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),  # naming the service alone sends nothing
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_tracing_is_off_unless_the_otel_variables_ask(env: dict[str, str], on: bool) -> None:
    assert wanted(env) is on


TRACED_YAML = """\
server:
  tracing:
    enabled: true
    endpoint: {endpoint}
    sampleRatio: 0.25
    headers: {{x-api-key: s3cret-token}}
models: []
"""


def test_server_tracing_is_validated_with_its_line_and_hides_its_headers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``servekit validate`` names the line of a bad endpoint; a good one validates, and the
    headers' values are never printed (only their names, with a warning)."""
    from servekit.cli import main
    from servekit.config.schema import TracingConfig

    config = tmp_path / "serve.yaml"
    config.write_text(TRACED_YAML.format(endpoint="collector:4317"))
    assert main(["validate", str(config)]) == 1
    out, err = capsys.readouterr()
    assert "serve.yaml:4: server.tracing.endpoint" in err, err
    assert "http://host:port" in err and "s3cret" not in out + err

    config.write_text(TRACED_YAML.format(endpoint="http://127.0.0.1:4317"))
    assert main(["validate", str(config)]) == 0
    out, err = capsys.readouterr()
    assert "server.tracing.headers (x-api-key)" in err, err
    assert "s3cret" not in out + err

    settings = TracingConfig.model_validate(
        {"enabled": True, "headers": {"X-Api-Key": "s3cret-token"}, "sampleRatio": 0.5}
    )
    assert "s3cret" not in repr(settings) and "s3cret" not in settings.model_dump_json()
    assert settings.headers["x-api-key"].get_secret_value() == "s3cret-token"
    with pytest.raises(ValueError, match="not a header name"):
        TracingConfig.model_validate({"headers": {"bad name": "x"}})
    with pytest.raises(ValueError, match="less than or equal to 1"):
        TracingConfig.model_validate({"sampleRatio": 2})


def test_otel_variables_win_over_server_tracing() -> None:
    """``enabled`` turns tracing on; the variables that turn it off win; the exporter is given
    serve.yaml's endpoint and headers only where no variable sets them; ``repr`` hides them."""
    from servekit.observability.tracing import Settings, _otlp

    yaml = Settings(enabled=True, endpoint="http://127.0.0.1:9", headers={"k": "s3cret"})
    assert "s3cret" not in repr(yaml)
    assert wanted({}, yaml) is True
    assert wanted({"OTEL_SDK_DISABLED": "true"}, yaml) is False
    assert wanted({"OTEL_TRACES_EXPORTER": "none"}, yaml) is False
    ours = _otlp({}, yaml)
    assert ours._endpoint == "127.0.0.1:9"
    assert ("k", "s3cret") in tuple(ours._headers)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:7", "OTEL_EXPORTER_OTLP_HEADERS": "a=b"}
    theirs = _otlp(env, yaml)
    assert theirs._endpoint != "127.0.0.1:9"
    assert ("k", "s3cret") not in tuple(theirs._headers or ())


def test_the_endpoint_is_shown_without_user_info_or_query() -> None:
    """The start-up line and a refused endpoint's message show an endpoint as every URI is
    shown (servekit.shown_paths.shown_uri): no password, no token in its query."""
    from servekit.config.schema import TracingConfig
    from servekit.observability.tracing import Settings, _where

    endpoint = "https://user:Pa55word@collector:4318/?token=T0kenValue"
    where = _where({}, Settings(enabled=True, endpoint=endpoint))
    assert where == "otlp at https://collector:4318/?..."
    variable = _where({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    assert "Pa55word" not in variable and "T0kenValue" not in variable
    with pytest.raises(ValidationError) as refused:
        TracingConfig.model_validate({"endpoint": "ftp://user:Pa55word@collector/?token=T0ken"})
    message = refused.value.errors()[0]["msg"]  # what `servekit validate` and the log say
    assert "ftp://collector/?..." in message
    assert "Pa55word" not in message and "T0ken" not in message
