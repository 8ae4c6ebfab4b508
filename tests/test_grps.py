"""The grps interface (seed 001) end to end: httpx on /grps/v1/... and a real gRPC channel with
our generated GrpsService stub, against the shared ``servekit serve`` subprocess.

Results are checked against the inputs (identity models) or against the same server's V2
answer for the same model version, never against numbers written here.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import onnx
import onnx_builders
import pytest
import yaml
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from servers import ServerProcess, identity_name, running_server

from servekit.protos import grps_pb2 as pb
from servekit.protos import grps_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

# V2 datatype -> (grps dtype, flat field, sample values at the edges of the datatype)
CARRIED: dict[str, tuple[str, str, list[Any]]] = {
    "BOOL": ("DT_UINT8", "flat_uint8", [0, 1, 1, 0]),
    "UINT8": ("DT_UINT8", "flat_uint8", [0, 1, 254, 255]),
    "UINT16": ("DT_INT32", "flat_int32", [0, 1, 65534, 65535]),
    "UINT32": ("DT_INT64", "flat_int64", [0, 1, 2**32 - 2, 2**32 - 1]),
    "UINT64": ("DT_INT64", "flat_int64", [0, 1, 2**40, 2**63 - 1]),
    "INT8": ("DT_INT8", "flat_int8", [-128, -1, 0, 127]),
    "INT16": ("DT_INT16", "flat_int16", [-32768, -1, 0, 32767]),
    "INT32": ("DT_INT32", "flat_int32", [-(2**31), -1, 0, 2**31 - 1]),
    "INT64": ("DT_INT64", "flat_int64", [-(2**63), -1, 0, 2**63 - 1]),
    "FP16": ("DT_FLOAT16", "flat_float16", [-2.5, 0.0, 0.5, 65504.0]),
    "FP32": ("DT_FLOAT32", "flat_float32", [-1.5, 0.0, 0.25, 3.0e38]),
    "FP64": ("DT_FLOAT64", "flat_float64", [-1.5, 0.0, 0.1, 1.0e300]),
    "BYTES": ("DT_STRING", "flat_string", ["", "a", "hé", "grps 中文"]),
}
PREDICT = "/grps/v1/infer/predict"
OCTETS = "application/octet-stream"


@pytest.fixture
def stub(channel: grpc.Channel, server: ServerProcess) -> Iterator[pb_grpc.GrpsServiceStub]:
    yield pb_grpc.GrpsServiceStub(channel)
    server.assert_healthy()


def ok(body: dict[str, Any]) -> dict[str, Any]:
    assert body["status"] == {"code": 200, "msg": "OK", "status": "SUCCESS"}, body
    return body


def failure(response: httpx.Response, code: int) -> str:
    assert response.status_code == code, response.text
    status = response.json()["status"]
    assert status["code"] == code and status["status"] == "FAILURE", status
    assert status["msg"]
    return str(status["msg"])


def v2_output(http: httpx.Client, model: str, version: str, rows: np.ndarray) -> np.ndarray:
    """The same server's answer over the V2 protocol, as the reference."""
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(rows.shape),
                        "data": rows.reshape(-1).tolist()}]}  # fmt: skip
    response = http.post(f"/v2/models/{model}/versions/{version}/infer", json=body)
    output = response.json()["outputs"][0]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def gtensor_body(name: str, dtype: str, shape: list[int], field: str, values: list[Any]) -> Any:
    tensor = {"name": name, "dtype": dtype, "shape": shape, field: values}
    return {"gtensors": {"tensors": [tensor]}}


def one(dtype: str, field: str, values: list[Any], shape: tuple[int, ...] = (1, 1)) -> Any:
    """A request with one gtensor called INPUT0."""
    return gtensor_body("INPUT0", dtype, list(shape), field, values)


# -- HTTP ---------------------------------------------------------------------------------------
def test_health_live_and_ready(http: httpx.Client) -> None:
    for path in ("live", "ready"):
        response = http.get(f"/grps/v1/health/{path}")
        assert response.status_code == 200
        ok(response.json())


def test_offline_drains_readiness_everywhere_and_online_restores_it(
    http: httpx.Client, channel: grpc.Channel
) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    try:
        ok(http.get("/grps/v1/health/offline").json())
        assert "offline" in failure(http.get("/grps/v1/health/ready"), 503)
        assert http.get("/v2/health/ready").status_code == 503
        reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
        ok(http.get("/grps/v1/health/live").json())  # still alive, and still serving requests
        body = {"model": identity_name("INT32"), **gtensor_body("INPUT0", "DT_INT32", [1, 1],
                                                                "flat_int32", [7])}  # fmt: skip
        assert ok(http.post(PREDICT, json=body).json())["gtensors"]["tensors"][0]["flat_int32"]
    finally:
        ok(http.post("/grps/v1/health/online", json={}).json())
    ok(http.get("/grps/v1/health/ready").json())
    assert http.get("/v2/health/ready").status_code == 200


@pytest.mark.parametrize("datatype", list(CARRIED))
def test_gtensors_round_trip_every_datatype(http: httpx.Client, datatype: str) -> None:
    dtype, field, values = CARRIED[datatype]
    body = gtensor_body("INPUT0", dtype, [2, 2], field, values)
    response = http.post(PREDICT, params={"model": identity_name(datatype)}, json=body)
    assert response.status_code == 200, response.text
    reply = ok(response.json())
    assert reply["model"] == f"{identity_name(datatype)}-1"
    (tensor,) = reply["gtensors"]["tensors"]
    assert tensor["name"] == "OUTPUT0" and tensor["dtype"] == dtype and tensor["shape"] == [2, 2]
    if datatype == "FP32":  # float32 precision: compare as float32
        assert np.array_equal(np.float32(tensor[field]), np.float32(values))
    else:
        assert tensor[field] == values  # ints come back as JSON numbers, not proto3 strings


def test_proto3_json_spellings_are_accepted(http: httpx.Client) -> None:
    """camelCase names, int64 as strings, NaN and infinities as strings (the proto3 mapping)."""
    body = {"gtensors": {"tensors": [{"dtype": "DT_INT64", "shape": [1, 2],
                                      "flatInt64": ["-5", "9223372036854775807"]}]}}  # fmt: skip
    reply = ok(http.post(PREDICT, params={"model": "identity_int64"}, json=body).json())
    assert reply["gtensors"]["tensors"][0]["flat_int64"] == [-5, 2**63 - 1]
    body = one("DT_FLOAT32", "flatFloat32", ["NaN", "Infinity", "-Infinity", 1.5], (1, 4))
    reply = ok(http.post(PREDICT, params={"model": "identity_fp32"}, json=body).json())
    assert reply["gtensors"]["tensors"][0]["flat_float32"] == ["NaN", "Infinity", "-Infinity", 1.5]
    reply = ok(http.post(PREDICT, json={"model": "identity_bytes", "strData": "camel"}).json())
    assert reply["str_data"] == "camel"


@pytest.mark.parametrize(
    ("model", "body"),
    [
        ("identity_uint8", one("DT_UINT8", "flat_uint8", [256])),
        ("identity_int32", one("DT_INT32", "flat_int32", [2**31])),
        ("identity_int32", one("DT_INT32", "flat_int32", [1.5])),
        ("identity_int32", one("DT_INT32", "flat_int32", [True])),
        ("identity_fp32", one("DT_FLOAT32", "flat_float32", [1e300])),
        ("identity_fp32", one("DT_FLOAT32", "flat_float32", [[1.0]])),
        ("identity_fp64", one("DT_FLOAT64", "flat_float64", [1.0], (1, 1)) | {"str_data": "x"}),
    ],
)
def test_values_the_json_mapping_refuses(http: httpx.Client, model: str, body: Any) -> None:
    failure(http.post(PREDICT, params={"model": model}, json=body), 400)


def test_unnamed_tensors_map_by_position_and_enum_numbers_work(http: httpx.Client) -> None:
    a = np.arange(16, dtype=np.float32)
    b = np.linspace(-1, 1, 16, dtype=np.float32)
    tensors = [{"dtype": 7, "shape": [1, 16], "flat_float32": x.tolist()} for x in (a, b)]
    reply = ok(
        http.post(PREDICT, json={"model": "add_sub", "gtensors": {"tensors": tensors}}).json()
    )
    outputs = {t["name"]: np.float32(t["flat_float32"]) for t in reply["gtensors"]["tensors"]}
    assert np.array_equal(outputs["OUTPUT0"], a + b)
    assert np.array_equal(outputs["OUTPUT1"], a - b)


def test_the_spec_examples_flat_double_spelling_is_accepted(http: httpx.Client) -> None:
    body = gtensor_body("INPUT0", "DT_FLOAT64", [1, 3], "flat_double", [1.0, 2.5, 3.0])
    reply = ok(http.post(PREDICT, params={"model": "identity_fp64"}, json=body).json())
    assert reply["gtensors"]["tensors"][0]["flat_float64"] == [1.0, 2.5, 3.0]


def test_ndarray_in_gtensors_or_ndarray_out(http: httpx.Client) -> None:
    rows = np.random.default_rng(7).standard_normal((3, 16)).astype(np.float32)
    expected = v2_output(http, "mlp", "1", rows)
    body = {"ndarray": rows.tolist()}
    reply = ok(http.post(PREDICT, params={"model": "mlp-1"}, json=body).json())
    (tensor,) = reply["gtensors"]["tensors"]
    assert tensor["shape"] == [3, 4] and tensor["dtype"] == "DT_FLOAT32"
    assert np.allclose(np.float32(tensor["flat_float32"]).reshape(3, 4), expected, atol=1e-6)
    params = {"model": "mlp-1", "return-ndarray": "true"}
    reply = ok(http.post(PREDICT, params=params, json=body).json())
    assert np.allclose(np.float32(reply["ndarray"]), expected, atol=1e-6)


def test_model_selection_name_version_payload_over_query(http: httpx.Client) -> None:
    rows = np.random.default_rng(3).standard_normal((1, 16)).astype(np.float32)
    answers = {}
    for version in ("1", "2"):
        params = {"model": "add_sub", "return-ndarray": "true"}  # the payload's model wins
        body = {"model": f"mlp-{version}", "ndarray": rows.tolist()}
        reply = ok(http.post(PREDICT, params=params, json=body).json())
        assert reply["model"] == f"mlp-{version}"
        answers[version] = np.float32(reply["ndarray"])
        assert np.allclose(answers[version], v2_output(http, "mlp", version, rows), atol=1e-6)
    assert not np.allclose(answers["1"], answers["2"])
    plain = ok(http.post(PREDICT, params={"model": "mlp"}, json={"ndarray": rows.tolist()}).json())
    assert plain["model"] == "mlp-2"  # no version: the highest ready one, as V2 picks


def test_default_model_is_the_first_in_serve_yaml(http: httpx.Client, model_store: Path) -> None:
    first = yaml.safe_load(model_store.read_text())["models"][0]
    body = gtensor_body("INPUT0", "DT_UINT8", [1, 2], "flat_uint8", [1, 0])
    reply = ok(http.post(PREDICT, json=body).json())
    assert reply["model"] == f"{first['name']}-1"
    assert reply["gtensors"]["tensors"][0]["flat_uint8"] == [1, 0]


def test_octet_stream_is_bin_data_both_ways(http: httpx.Client) -> None:
    payload = "grps\x00\x01\x7f é 中".encode()  # ONNX strings are text; bytes as they are
    response = http.post(
        PREDICT,
        params={"model": "identity_bytes"},
        content=payload,
        headers={"content-type": "application/octet-stream"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.content == payload


def test_str_data_answers_str_data(http: httpx.Client) -> None:
    body = {"model": "identity_bytes", "str_data": "hello grps 你好"}
    assert ok(http.post(PREDICT, json=body).json())["str_data"] == "hello grps 你好"


def test_gmap_in_and_out(http: httpx.Client) -> None:
    reply = ok(
        http.post(
            PREDICT, json={"model": "identity_int64", "gmap": {"s_i64": {"INPUT0": 2**62}}}
        ).json()
    )
    assert reply["gmap"] == {"s_i64": {"OUTPUT0": 2**62}}
    reply = ok(
        http.post(
            PREDICT, json={"model": "identity_bytes", "gmap": {"s_s": {"INPUT0": "k"}}}
        ).json()
    )
    assert reply["gmap"] == {"s_s": {"OUTPUT0": "k"}}


def streamed(response: httpx.Response, content_type: str) -> list[str]:
    """The str_data of each message of a chunked answer with ``content_type``."""
    assert response.status_code == 200, response.read()
    assert response.headers["transfer-encoding"] == "chunked"
    assert "content-length" not in response.headers
    assert response.headers["content-type"] == content_type
    lines = [line for line in response.iter_lines() if line]
    return [ok(json.loads(line))["str_data"] for line in lines]


def not_streamed(response: httpx.Response) -> dict[str, Any]:
    """A plain (length-delimited) JSON answer."""
    assert "transfer-encoding" not in response.headers
    assert int(response.headers["content-length"]) == len(response.content)
    assert response.headers["content-type"] == "application/json"
    return dict(response.json())


def test_streaming_answers_chunked(http: httpx.Client) -> None:
    """Default ``server.grpsStreaming``: ``?streaming=true``, application/octet-stream."""
    params = {"model": "identity_bytes", "streaming": "true"}
    with http.stream("POST", PREDICT, params=params, json={"str_data": "chunk"}) as response:
        assert streamed(response, OCTETS) == ["chunk"]
    headers = {"content-type": OCTETS}
    with http.stream("POST", PREDICT, params=params, content=b"raw", headers=headers) as response:
        assert response.headers["transfer-encoding"] == "chunked"
        assert response.read() == b"raw"
    by_header = http.post(
        PREDICT, params={"model": "identity_bytes"}, headers={"streaming": "true"}, json={}
    )
    assert "transfer-encoding" not in by_header.headers  # only the configured place counts
    failure(by_header, 400)


def streaming_store(root: Path, section: str) -> Path:
    """A serve.yaml serving identity_bytes with ``server.grpsStreaming: <section>``."""
    models = root / "models"
    models.mkdir()
    onnx.save(onnx_builders.identity("BYTES"), str(models / "identity_bytes.onnx"))
    config = root / "serve.yaml"
    config.write_text(
        f"server:\n  grpsStreaming: {section}\nmodels:\n"
        "  - {name: identity_bytes, modelFormat: {name: onnx},"
        " storageUri: models/identity_bytes.onnx}\n"
    )
    return config


def test_streaming_asked_for_by_a_header(tmp_path: Path) -> None:
    section = "{ctrlMode: header_param, ctrlKey: X-Stream, resContentType: application/x-ndjson}"
    with (
        running_server(streaming_store(tmp_path, section), grpc=False) as server,
        httpx.Client(base_url=server.http_url, timeout=30) as http,
    ):
        for value in ("true", "TRUE", "1", "yes"):
            headers = {"x-stream": value}
            with http.stream("POST", PREDICT, headers=headers, json={"str_data": value}) as reply:
                assert streamed(reply, "application/x-ndjson") == [value]
        octets = {"X-Stream": "true", "content-type": OCTETS}
        with http.stream("POST", PREDICT, headers=octets, content=b"\x00raw") as reply:
            assert reply.headers["transfer-encoding"] == "chunked"
            assert reply.headers["content-type"] == "application/x-ndjson"
            assert reply.read() == b"\x00raw"
        for params, headers in (({"streaming": "true"}, {}), ({}, {"X-Stream": "false"})):
            reply = http.post(PREDICT, params=params, headers=headers, json={"str_data": "once"})
            assert ok(not_streamed(reply))["str_data"] == "once"
        bad = http.post(PREDICT, headers={"X-Stream": "true"}, json={"str_data": 1})
        assert "transfer-encoding" not in bad.headers  # failures are never streamed
        failure(bad, 400)
        curl = subprocess.run(
            ["curl", "-sS", "-N", "-i", "--max-time", "30", "-X", "POST",
             "-H", "X-Stream: true", "-H", "Content-Type: application/json",
             "-d", '{"str_data": "from curl"}', server.http_url + PREDICT],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        head, _, payload = curl.stdout.partition("\n\n")  # text mode: CRLF read as \n
        head_lines = [line.lower() for line in head.splitlines()]
        assert head_lines[0].startswith("http/1.1 200"), curl.stdout
        assert "transfer-encoding: chunked" in head_lines
        assert "content-type: application/x-ndjson" in head_lines
        assert not any(line.startswith("content-length") for line in head_lines)
        assert ok(json.loads(payload))["str_data"] == "from curl"
        server.assert_healthy()


def test_streaming_asked_for_by_a_body_field(tmp_path: Path) -> None:
    """body_param: a top-level JSON boolean beside the GrpsMessage fields, taken out of it."""
    section = "{ctrlMode: body_param, ctrlKey: stream, resContentType: 'text/plain; charset=utf-8'}"
    with (
        running_server(streaming_store(tmp_path, section), grpc=False) as server,
        httpx.Client(base_url=server.http_url, timeout=30) as http,
    ):
        body = {"str_data": "in body", "stream": True}
        with http.stream("POST", PREDICT, json=body) as reply:
            assert streamed(reply, "text/plain; charset=utf-8") == ["in body"]
        with http.stream("POST", PREDICT, json={**body, "model": "identity_bytes-1"}) as reply:
            lines = [json.loads(line) for line in reply.iter_lines() if line]
        assert [set(line) for line in lines] == [{"status", "model", "str_data"}]  # no "stream"
        for plain in ({"str_data": "x", "stream": False}, {"str_data": "x"}):
            assert ok(not_streamed(http.post(PREDICT, json=plain)))["str_data"] == "x"
        by_query = http.post(PREDICT, params={"stream": "true"}, json={"str_data": "x"})
        assert ok(not_streamed(by_query))["str_data"] == "x"
        octets = http.post(PREDICT, content=b"raw", headers={"content-type": OCTETS})
        assert "transfer-encoding" not in octets.headers and octets.content == b"raw"
        for wrong in ("yes", 1, None, {"a": 1}):
            reply = http.post(PREDICT, json={"str_data": "x", "stream": wrong})
            assert "'stream' must be a JSON boolean" in failure(reply, 400)
        server.assert_healthy()


def test_metadata(http: httpx.Client) -> None:
    server = yaml.safe_load(ok(http.get("/grps/v1/metadata/server").json())["str_data"])
    assert server["name"] == http.get("/v2").json()["name"] and server["ready"] is True
    assert {"name": "mlp", "version": "2", "state": "READY", "reason": ""} in server["models"]
    model = ok(http.post("/grps/v1/metadata/model", json={"str_data": "mlp-1"}).json())
    assert yaml.safe_load(model["str_data"]) == http.get("/v2/models/mlp/versions/1").json()
    failure(http.post("/grps/v1/metadata/model", json={"str_data": "nope"}), 404)
    by_query = ok(http.get("/grps/v1/metadata/model", params={"model": "add_sub"}).json())
    assert yaml.safe_load(by_query["str_data"])["name"] == "add_sub"


ERRORS: list[tuple[str, dict[str, Any], Any, int, str]] = [
    ("nope", {}, {"str_data": "x"}, 404, "unknown model"),
    ("mlp-9", {}, {"ndarray": [[0.0] * 16]}, 404, "version 9 is not found"),
    ("broken_garbage", {}, {"str_data": "x"}, 503, "not"),
    ("mlp", {}, {"str_data": "x"}, 400, "single BYTES input"),
    ("mlp", {}, {}, 400, "carries no data"),
    ("mlp", {}, {"ndarray": [[1.0, 2.0], [3.0]]}, 400, "rectangular"),
    ("mlp", {}, {"ndarray": [["a"] * 16]}, 400, "numbers"),
    ("mlp", {}, {"ndarray": [[0.0] * 16], "str_data": "x"}, 400, "only one"),
    ("mlp", {}, {"ndarray": [[0.0] * 15]}, 400, "shape"),
    ("identity_int32", {}, {"ndarray": [[1.0]]}, 400, "DT_FLOAT32"),
    ("identity_int8", {}, one("DT_INT8", "flat_int8", [200]), 400, "[-128, 127]"),
    ("identity_bool", {}, one("DT_UINT8", "flat_uint8", [2]), 400, "0 or 1"),
    ("identity_int32", {}, one("DT_INT64", "flat_int64", [1]), 400, "DT_INT32"),
    ("identity_int32", {}, one("DT_INT32", "flat_int32", [1], (2, 2)), 400, "holds 4 values"),
    ("identity_int32", {}, one("DT_INT32", "flat_float32", [1]), 400, "flat_int32"),
    ("identity_int32", {}, gtensor_body("NOPE", "DT_INT32", [1], "flat_int32", [1]), 400, "NOPE"),
    ("identity_int32", {}, {"gtensors": {"tensors": [{"dtype": "DT_NOPE"}]}}, 400, "DT_INVALID"),
    ("identity_int32", {}, {"gmap": {"s_f": {"INPUT0": 1.5}}}, 400, "not a valid INT32"),
    ("identity_int32", {}, [1, 2], 400, "JSON object"),
    ("identity_int32", {"return-ndarray": "true"}, {"gmap": {"s_i32": {"INPUT0": 1}}}, 200, ""),
]  # fmt: skip


@pytest.mark.parametrize(("model", "params", "body", "code", "fragment"), ERRORS)
def test_client_mistakes_fail_with_a_status(
    http: httpx.Client, model: str, params: dict[str, str], body: Any, code: int, fragment: str
) -> None:
    response = http.post(PREDICT, params={"model": model, **params}, json=body)
    if code == 200:  # the control case: the same route does work
        ok(response.json())
        return
    assert fragment in failure(response, code)


def test_malformed_json_is_a_400(http: httpx.Client) -> None:
    response = http.post(
        PREDICT, content=b"{not json", headers={"content-type": "application/json"}
    )
    assert "malformed JSON" in failure(response, 400)


# -- gRPC ---------------------------------------------------------------------------------------
def _int32_tensor(values: list[int]) -> pb.GrpsMessage:
    tensor = pb.GenericTensor(
        name="INPUT0", dtype=pb.DT_INT32, shape=[1, len(values)], flat_int32=values
    )
    return pb.GrpsMessage(model="identity_int32-1", gtensors=pb.GenericTensorData(tensors=[tensor]))


def test_grpc_predict(stub: pb_grpc.GrpsServiceStub) -> None:
    reply = stub.Predict(_int32_tensor([3, -4, 5]), timeout=10)
    assert reply.status.status == pb.Status.SUCCESS and reply.status.code == 200
    (tensor,) = reply.gtensors.tensors
    assert list(tensor.flat_int32) == [3, -4, 5] and list(tensor.shape) == [1, 3]
    raw = b"\x00\x01grps\n"
    reply = stub.Predict(pb.GrpsMessage(model="identity_bytes", bin_data=raw), timeout=10)
    assert reply.bin_data == raw


def test_grpc_predict_streaming(stub: pb_grpc.GrpsServiceStub) -> None:
    replies = list(stub.PredictStreaming(_int32_tensor([1, 2]), timeout=10))
    assert [list(r.gtensors.tensors[0].flat_int32) for r in replies] == [[1, 2]]
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.PredictStreaming(pb.GrpsMessage(model="nope", str_data="x"), timeout=10))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_grpc_health_and_offline(stub: pb_grpc.GrpsServiceStub) -> None:
    empty = pb.GrpsMessage()
    assert stub.CheckLiveness(empty, timeout=10).status.status == pb.Status.SUCCESS
    assert stub.CheckReadiness(empty, timeout=10).status.status == pb.Status.SUCCESS
    try:
        assert stub.Offline(empty, timeout=10).status.status == pb.Status.SUCCESS
        reply = stub.CheckReadiness(empty, timeout=10)
        assert reply.status.status == pb.Status.FAILURE and reply.status.code == 503
        assert "offline" in reply.status.msg
    finally:
        assert stub.Online(empty, timeout=10).status.status == pb.Status.SUCCESS
    assert stub.CheckReadiness(empty, timeout=10).status.status == pb.Status.SUCCESS


def test_grpc_reflection_describes_grps(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    assert "grps.protos.v1.GrpsService" in set(database.get_services())
    service = DescriptorPool(database).FindServiceByName("grps.protos.v1.GrpsService")
    streaming = service.methods_by_name["PredictStreaming"]
    assert streaming.server_streaming and not streaming.client_streaming
    assert {m.name for m in service.methods} == set(pb.DESCRIPTOR.services_by_name[
        "GrpsService"].methods_by_name)  # fmt: skip


def test_grpc_metadata(stub: pb_grpc.GrpsServiceStub) -> None:
    server = yaml.safe_load(stub.ServerMetadata(pb.GrpsMessage(), timeout=10).str_data)
    assert server["ready"] is True and "mlp" in {m["name"] for m in server["models"]}
    model = yaml.safe_load(
        stub.ModelMetadata(pb.GrpsMessage(str_data="add_sub"), timeout=10).str_data
    )
    assert model["name"] == "add_sub" and [i["name"] for i in model["inputs"]] == [
        "INPUT0",
        "INPUT1",
    ]


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (pb.GrpsMessage(model="nope", str_data="x"), grpc.StatusCode.NOT_FOUND),
        (pb.GrpsMessage(model="mlp-7", str_data="x"), grpc.StatusCode.NOT_FOUND),
        (pb.GrpsMessage(model="broken_lfs", str_data="x"), grpc.StatusCode.UNAVAILABLE),
        (pb.GrpsMessage(model="mlp"), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.GrpsMessage(model="mlp", ndarray=pb.NDArrayData()), grpc.StatusCode.INVALID_ARGUMENT),
        (pb.GrpsMessage(model="mlp", str_data="x"), grpc.StatusCode.INVALID_ARGUMENT),
        (
            pb.GrpsMessage(
                model="identity_int32",
                gtensors=pb.GenericTensorData(
                    tensors=[pb.GenericTensor(dtype=pb.DT_INT32, shape=[2, 2], flat_int32=[1])]
                ),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ],
)
def test_grpc_errors_carry_a_status_code(
    stub: pb_grpc.GrpsServiceStub, message: pb.GrpsMessage, code: grpc.StatusCode
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.Predict(message, timeout=10)
    assert caught.value.code() == code
    assert caught.value.details()
