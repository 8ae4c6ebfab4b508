"""Logs as ops read them, from real ``servekit serve`` processes: JSON lines from every source,
one access-log line per request or call (REST, gRPC, streams, errors, two workers), request
IDs taken from the client or made, returned on every answer and written in the log."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import onnx
import onnx_builders
import pytest
from servers import ServerProcess, running_server, start_server
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

MODELS = """
from collections.abc import Iterator
from typing import TypedDict

import numpy as np


class Token(TypedDict):
    text_output: str


def words(text_input: list[str]) -> Iterator[Token]:
    value = text_input[0]
    for word in (value.decode() if isinstance(value, bytes) else str(value)).split():
        yield {"text_output": word}


def boom(x: np.ndarray) -> dict[str, np.ndarray]:
    raise RuntimeError("the model broke on purpose")
"""

CONFIG = """\
server: {{logging: {{format: {fmt}, accessLog: {access}}}}}
models:
  - {{name: ident, modelFormat: {{name: onnx}}, storageUri: ident.onnx}}
  - {{name: words, modelFormat: {{name: python}}, entrypoint: 'user_models:words'}}
  - name: boom
    modelFormat: {{name: python}}
    entrypoint: 'user_models:boom'
    inputs: [{{name: x, datatype: FP32, shape: [-1]}}]
    outputs: [{{name: y, datatype: FP32, shape: [-1]}}]
"""
GENERATED = re.compile(r"^[0-9a-f]{12}-[0-9a-f]+$")
INFER = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}


def write_folder(root: Path, fmt: str = "json", access: str = "on") -> Path:
    onnx.save(onnx_builders.identity("FP32"), str(root / "ident.onnx"))
    (root / "user_models.py").write_text(MODELS)
    config = root / "serve.yaml"
    config.write_text(CONFIG.format(fmt=fmt, access=access))
    return config


def records(server: ServerProcess) -> list[dict[str, Any]]:
    """Every line the stopped server wrote (stdout and stderr), each parsed as JSON: a line
    that is not JSON fails the test, naming it."""
    lines = [*server.stdout_lines, *server.log_path.read_text().splitlines()]
    out = []
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
        assert isinstance(record, dict), line
        for key in ("time", "level", "logger", "message"):
            assert key in record, f"{key} missing from {line}"
        out.append(record)
    return out


def access_lines(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["logger"] == "servekit.access"]


def rid(value: str) -> dict[str, str]:
    return {"X-Request-ID": value}


def grpc_request(model: str = "ident") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "INPUT0", "FP32"
    tensor.shape.extend([1, 2])
    request.raw_input_contents.append(np.float32([1, 2]).tobytes())
    return request


@pytest.fixture
def json_server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = start_server(write_folder(tmp_path), grpc=True)
    try:
        yield server
    finally:
        server.stop()


def test_json_lines_access_log_and_request_ids_over_rest_grpc_streams_and_errors(
    json_server: ServerProcess,
) -> None:
    server = json_server
    answers: dict[str, str] = {}  # what each request was answered with, by a label
    with server.http_client(timeout=20) as http:
        sent = http.post("/v2/models/ident/infer", json=INFER, headers={"X-Request-ID": "rest-1"})
        assert sent.status_code == 200, sent.text
        answers["rest sent"] = sent.headers["x-request-id"]
        made = http.post("/v2/models/ident/infer", json=INFER)
        answers["rest made"] = made.headers["x-request-id"]
        body_id = http.post("/v2/models/ident/infer", json={**INFER, "id": "body-7"})
        answers["rest body id"] = body_id.headers["x-request-id"]
        too_long = http.post(
            "/v2/models/ident/infer", json=INFER, headers={"X-Request-ID": "x" * 200}
        )
        answers["rest too long"] = too_long.headers["x-request-id"]
        missing = http.post(
            "/v2/models/nope/infer", json=INFER, headers={"X-Request-ID": "rest-404"}
        )
        assert missing.status_code == 404
        answers["rest error"] = missing.headers["x-request-id"]
        broken = http.post(
            "/v2/models/boom/infer",
            json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1]}]},
            headers={"X-Request-ID": "rest-500"},
        )
        assert broken.status_code == 500
        answers["rest 500"] = broken.headers["x-request-id"]
        with http.stream(
            "POST", "/v2/models/words/generate_stream", json={"text_input": "a b c"},
            headers={"X-Request-ID": "sse-1"},
        ) as stream:  # fmt: skip
            assert stream.status_code == 200
            answers["rest stream"] = stream.headers["x-request-id"]
            assert sum(1 for line in stream.iter_lines() if line.startswith("data:")) == 3
        answers["health"] = http.get("/v2/health/ready").headers["x-request-id"]
    assert server.grpc_target is not None
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        _, call = stub.ModelInfer.with_call(grpc_request(), metadata=(("x-request-id", "g-1"),))
        answers["grpc sent"] = dict(call.trailing_metadata())["x-request-id"]
        _, call = stub.ModelInfer.with_call(grpc_request())
        answers["grpc made"] = dict(call.trailing_metadata())["x-request-id"]
        with pytest.raises(grpc.RpcError) as failed:
            stub.ModelInfer(grpc_request("nope"), metadata=(("x-request-id", "g-404"),))
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
        answers["grpc error"] = dict(failed.value.trailing_metadata())["x-request-id"]
        replies = stub.ModelStreamInfer(
            iter([grpc_request(), grpc_request()]), metadata=(("x-request-id", "gs-1"),)
        )
        answers["grpc stream"] = dict(replies.initial_metadata())["x-request-id"]
        assert len(list(replies)) == 2
    assert server.stop(signal.SIGTERM) == 0

    assert answers["rest sent"] == "rest-1"
    assert answers["rest body id"] == "body-7"
    assert answers["rest error"] == "rest-404"
    assert answers["rest 500"] == "rest-500"
    assert answers["rest stream"] == "sse-1"
    assert answers["grpc sent"] == "g-1"
    assert answers["grpc error"] == "g-404"
    assert answers["grpc stream"] == "gs-1"
    for made_label in ("rest made", "rest too long", "health", "grpc made"):
        assert GENERATED.match(answers[made_label]), (made_label, answers[made_label])
    assert len(set(answers.values())) == len(answers)  # every request its own ID

    rows = records(server)  # every line of stdout and stderr is JSON
    access = access_lines(rows)
    by_id: dict[str, list[dict[str, Any]]] = {}
    for row in access:
        by_id.setdefault(row["request_id"], []).append(row)
    for label, request_id in answers.items():
        assert len(by_id.get(request_id, [])) == 1, (label, request_id, access)
    # one line per request or call, none twice (and the start-up readiness polls)
    ours = [row for row in access if row["request_id"] in answers.values()]
    assert len(ours) == len(answers)
    assert all(row["path"] == "/v2/health/ready" for row in access if row not in ours)
    rest = by_id["rest-1"][0]
    assert rest["protocol"] == "HTTP" and rest["method"] == "POST"
    assert rest["path"] == "/v2/models/ident/infer" and rest["status"] == 200
    assert rest["model"] == "ident" and rest["bytes_in"] > 0 and rest["bytes_out"] > 0
    assert rest["client"].startswith("127.0.0.1:") and rest["duration_ms"] >= 0
    assert by_id["rest-404"][0]["status"] == 404
    assert by_id["sse-1"][0]["model"] == "words" and by_id["sse-1"][0]["bytes_out"] > 0
    grpc_row = by_id["g-1"][0]
    assert grpc_row["protocol"] == "gRPC" and grpc_row["method"] == "ModelInfer"
    assert grpc_row["status"] == "OK" and grpc_row["model"] == "ident"
    assert grpc_row["bytes_in"] > 0 and grpc_row["bytes_out"] > 0
    assert by_id["g-404"][0]["status"] == "NOT_FOUND"
    assert by_id["gs-1"][0]["method"] == "ModelStreamInfer" and by_id["gs-1"][0]["status"] == "OK"
    # the model's failure is logged with the request it failed
    errors = [r for r in rows if r["level"] == "ERROR" and r.get("request_id") == "rest-500"]
    assert errors and "error" in errors[0], rows
    # the listening line on stdout is a JSON record with the addresses as fields
    listening = [r for r in rows if r["message"].startswith("servekit: listening")]
    assert listening and listening[0]["http"] == server.http_url


def test_text_format_and_access_log_of_errors_only(tmp_path: Path) -> None:
    with running_server(write_folder(tmp_path, fmt="text", access="errors")) as server:
        with server.http_client(timeout=20) as http:
            ok = http.post("/v2/models/ident/infer", json=INFER, headers={"X-Request-ID": "ok-1"})
            assert ok.status_code == 200
            bad = http.post("/v2/models/nope/infer", json=INFER, headers={"X-Request-ID": "bad-1"})
            assert bad.status_code == 404
        server.stop()
        log = server.log_path.read_text()
    lines = [line for line in log.splitlines() if " servekit.access: " in line]
    assert len(lines) == 1, log
    assert "POST /v2/models/nope/infer 404" in lines[0] and "id=bad-1" in lines[0]
    assert "ok-1" not in log
    assert not any(line.startswith("{") for line in log.splitlines())


def test_access_log_under_two_workers(tmp_path: Path) -> None:
    config = write_folder(tmp_path)
    server = start_server(config, grpc=True, extra=["--workers", "2"], timeout=120)
    sent: list[str] = []
    try:
        for i in range(8):  # new connections: the kernel spreads them over both workers
            with server.http_client(timeout=20) as http:
                rid = f"w-rest-{i}"
                answer = http.post(
                    "/v2/models/ident/infer", json=INFER, headers={"X-Request-ID": rid}
                )
                assert answer.status_code == 200 and answer.headers["x-request-id"] == rid
                sent.append(rid)
        assert server.grpc_target is not None
        for i in range(4):
            with grpc.insecure_channel(server.grpc_target) as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                rid = f"w-grpc-{i}"
                _, call = stub.ModelInfer.with_call(
                    grpc_request(), metadata=(("x-request-id", rid),)
                )
                assert dict(call.trailing_metadata())["x-request-id"] == rid
                sent.append(rid)
    finally:
        assert server.stop() == 0, server.log()
    rows = records(server)
    access = access_lines(rows)
    ids = [row["request_id"] for row in access if row["request_id"].startswith("w-")]
    assert sorted(ids) == sorted(sent), access
    assert all(row.get("worker") in (0, 1) for row in access)


def test_a_request_id_is_returned_with_access_log_off(tmp_path: Path) -> None:
    with running_server(write_folder(tmp_path, fmt="text", access="off"), grpc=True) as server:
        with server.http_client(timeout=20) as http:
            answer = http.post("/v2/models/ident/infer", json=INFER, headers={"X-Request-ID": "z"})
            assert answer.headers["x-request-id"] == "z"
            assert GENERATED.match(http.get("/v2/health/live").headers["x-request-id"])
            bad = httpx.post(f"{server.http_url}/v2/models/ident/infer", content=b"{")
            assert bad.status_code == 400 and GENERATED.match(bad.headers["x-request-id"])
        # gRPC's unary wrapper without the access log (app/servekit/grpc/request_ids.py's
        # _unary, written out for the hot path): made, sent, the V2 id, and on an error.
        assert server.grpc_target is not None
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            made = [
                dict(stub.ModelInfer.with_call(grpc_request())[1].trailing_metadata())
                for _ in range(2)
            ]
            ids = [m["x-request-id"] for m in made]
            assert all(GENERATED.match(i) for i in ids) and ids[0] != ids[1], ids
            _, call = stub.ModelInfer.with_call(grpc_request(), metadata=(("x-request-id", "g"),))
            assert dict(call.trailing_metadata())["x-request-id"] == "g"
            with_id = grpc_request()
            with_id.id = "body-g"
            _, call = stub.ModelInfer.with_call(with_id)
            assert dict(call.trailing_metadata())["x-request-id"] == "body-g"
            bad_header = (("x-request-id", "has space"),)
            _, call = stub.ModelInfer.with_call(with_id, metadata=bad_header)
            assert dict(call.trailing_metadata())["x-request-id"] == "body-g"
            with pytest.raises(grpc.RpcError) as failed:
                stub.ModelInfer(grpc_request("nope"))
            assert GENERATED.match(dict(failed.value.trailing_metadata())["x-request-id"])
        server.stop()
        assert "servekit.access" not in server.log_path.read_text()
