"""Python models written the grps way (``predict(GrpsMessage) -> GrpsMessage``), driven with
grps' protocol (our generated grps protos over gRPC, and grps' JSON over HTTP) the way grps'
template clients do: str_data, bin_data, gtensors, gmap and ndarray to one model in turn.

Also grps' leniency (unknown JSON fields ignored) and string versions (``name-1.0.0``) named
by serve.yaml's ``versionLabels``.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from servers import ServerProcess, running_server

from servekit.protos import grps_pb2 as pb
from servekit.protos import grps_pb2_grpc as pb_grpc

pytestmark = pytest.mark.slow

MODULE = '''
from servekit.protos.grps_pb2 import GrpsMessage


class EchoKinds:
    """Says which kind of data it got, and hands the data back (gtensors doubled)."""

    def predict(self, message: GrpsMessage) -> GrpsMessage:
        kind = message.WhichOneof("data_oneof")
        out = GrpsMessage()
        if kind == "str_data":
            out.str_data = "str_data: " + message.str_data
        elif kind == "bin_data":
            out.bin_data = message.bin_data[::-1]
        elif kind == "gtensors":
            for tensor in message.gtensors.tensors:
                doubled = out.gtensors.tensors.add()
                doubled.CopyFrom(tensor)
                doubled.ClearField("flat_float32")
                doubled.flat_float32.extend(2 * v for v in tensor.flat_float32)
        elif kind == "gmap":
            out.gmap.CopyFrom(message.gmap)
            out.gmap.s_s["seen"] = "gmap"
        else:
            out.str_data = "no data"
        return out


def hello(message):
    """grps' template model: whatever comes, 'hello grps.' (declared grpsMessage: true)."""
    return "hello grps."
'''

CONFIG = """
server: {name: grps-messages}
models:
  - name: your_model
    modelFormat: {name: python}
    entrypoint: "grps_models:EchoKinds"
    versionLabels: {"1.0.0": 1}
  - name: template
    modelFormat: {name: python}
    entrypoint: "grps_models:hello"
    grpsMessage: true
"""
PREDICT = "/grps/v1/infer/predict"
GTENSORS = {"tensors": [{"name": "inp", "dtype": "DT_FLOAT32", "shape": [2, 3],
                         "flat_float32": [1, 2, 3, 4, 5, 6]}]}  # fmt: skip


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("grps_messages")
    (folder / "grps_models.py").write_text(MODULE)
    (folder / "serve.yaml").write_text(CONFIG)
    with running_server(folder / "serve.yaml") as server:
        yield server


@pytest.fixture
def http(served: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.http_url, timeout=30) as client:
        yield client


@pytest.fixture
def stub(served: ServerProcess) -> Iterator[pb_grpc.GrpsServiceStub]:
    assert served.grpc_target is not None
    with grpc.insecure_channel(served.grpc_target) as channel:
        yield pb_grpc.GrpsServiceStub(channel)


def ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["status"] == {"code": 200, "msg": "OK", "status": "SUCCESS"}, body
    return body


def test_every_kind_over_http_to_one_model(http: httpx.Client) -> None:
    """The template HTTP client's sequence (the first model in serve.yaml is the default)."""
    assert ok(http.post(PREDICT, json={"str_data": "hello grps."}))["str_data"] == (
        "str_data: hello grps."
    )
    reply = ok(http.post(PREDICT, json={"gtensors": GTENSORS}))
    (tensor,) = reply["gtensors"]["tensors"]
    assert tensor["shape"] == [2, 3] and tensor["flat_float32"] == [2, 4, 6, 8, 10, 12]
    gmap = {"s_s": {"key": "value"}, "s_b": {"key": base64.b64encode(b"hi").decode()},
            "s_i32": {"key": 1}, "s_i64": {"key": 1}, "s_f": {"key": 1.0}, "s_d": {"key": 1.0},
            "s_t": {"key": {"dtype": "DT_FLOAT32", "shape": [2, 3],
                            "flat_float32": [1, 2, 3, 4, 5, 6]}}}  # fmt: skip
    reply = ok(http.post(PREDICT, json={"gmap": gmap}))
    assert reply["gmap"]["s_s"] == {"key": "value", "seen": "gmap"}
    assert reply["gmap"]["s_i64"] == {"key": 1} and reply["gmap"]["s_d"] == {"key": 1.0}
    assert reply["gmap"]["s_b"] == {"key": base64.b64encode(b"hi").decode()}
    assert "s_t" not in reply["gmap"]  # grps' protocol has no s_t: ignored, as grps does
    answer = http.post(PREDICT, params={"return-ndarray": "true"},
                       json={"ndarray": [[1, 2, 3], [4, 5, 6]]})  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["ndarray"] == [[2, 4, 6], [8, 10, 12]]
    answer = http.post(PREDICT, content=b"hello grps.",
                       headers={"content-type": "application/octet-stream"})  # fmt: skip
    assert answer.status_code == 200 and answer.content == b"hello grps."[::-1]


def test_every_kind_over_grpc_to_one_model(stub: pb_grpc.GrpsServiceStub) -> None:
    """The template gRPC client's sequence."""
    reply = stub.Predict(pb.GrpsMessage(str_data="hello grps."), timeout=30)
    assert reply.status.status == pb.Status.SUCCESS and reply.str_data == "str_data: hello grps."
    assert reply.model == "your_model-1"
    request = pb.GrpsMessage()
    request.gtensors.tensors.add(name="inp", dtype=pb.DT_FLOAT32, shape=[2, 3],
                                 flat_float32=[1, 2, 3, 4, 5, 6])  # fmt: skip
    reply = stub.Predict(request, timeout=30)
    assert list(reply.gtensors.tensors[0].flat_float32) == [2, 4, 6, 8, 10, 12]
    assert stub.Predict(pb.GrpsMessage(bin_data=b"abc"), timeout=30).bin_data == b"cba"
    request = pb.GrpsMessage()
    request.gmap.s_s["key"] = "hello grps."
    request.gmap.s_b["key"] = b"hello grps."
    request.gmap.s_i32["key"] = 1
    request.gmap.s_i64["key"] = 1
    request.gmap.s_f["key"] = 1.0
    request.gmap.s_d["key"] = 1.0
    reply = stub.Predict(request, timeout=30)
    assert dict(reply.gmap.s_s) == {"key": "hello grps.", "seen": "gmap"}
    assert reply.gmap.s_b["key"] == b"hello grps." and reply.gmap.s_i64["key"] == 1
    streamed = list(stub.PredictStreaming(pb.GrpsMessage(str_data="x"), timeout=30))
    assert [r.str_data for r in streamed] == ["str_data: x"]


def test_a_model_declared_grps_message_in_serve_yaml(
    http: httpx.Client, stub: pb_grpc.GrpsServiceStub
) -> None:
    for body in ({"str_data": "hi"}, {"gtensors": GTENSORS}, {"ndarray": [[1.0]]}):
        reply = ok(http.post(PREDICT, params={"model": "template"}, json=body))
        assert reply["str_data"] == "hello grps."
    reply = stub.Predict(pb.GrpsMessage(model="template", bin_data=b"x"), timeout=30)
    assert reply.str_data == "hello grps." and reply.model == "template-1"
    # as grps: return-ndarray of a reply without a numeric gtensor is the model's failure
    answer = http.post(PREDICT, params={"model": "template", "return-ndarray": "true"},
                       json={"ndarray": [[1.0, 2.0]]})  # fmt: skip
    assert answer.status_code == 500
    assert "the model answered str_data" in answer.json()["status"]["msg"]


def test_unknown_json_fields_are_ignored(http: httpx.Client) -> None:
    body = {"str_data": "hi", "trace_id": "abc", "extra": {"nested": [1, 2]}}
    assert ok(http.post(PREDICT, json=body))["str_data"] == "str_data: hi"


def test_string_versions_named_by_serve_yaml(
    http: httpx.Client, stub: pb_grpc.GrpsServiceStub
) -> None:
    body = {"model": "your_model-1.0.0", "str_data": "versioned"}
    assert ok(http.post(PREDICT, json=body))["str_data"] == "str_data: versioned"
    assert ok(http.post(PREDICT, params={"model": "your_model-1.0.0"}, json={"str_data": "q"}))
    reply = stub.Predict(pb.GrpsMessage(model="your_model-1.0.0", str_data="g"), timeout=30)
    assert reply.str_data == "str_data: g"
    # the label works on the V2 surface as well, and an unknown one says what there is
    assert http.get("/v2/models/your_model/versions/1.0.0").json()["versions"] == ["1"]
    answer = http.get("/v2/models/your_model/versions/2.0.0")
    assert answer.status_code == 400
    message = answer.json()["error"]
    assert message.startswith("failed to get model version from specified version string '2.0.0'")
    assert "'1.0.0'" in message
    failed = http.post(PREDICT, json={"model": "your_model-2.0.0", "str_data": "x"})
    assert failed.status_code == 400 and failed.json()["status"]["status"] == "FAILURE"


def test_whole_message_model_metadata_and_v2(http: httpx.Client) -> None:
    meta = http.get("/v2/models/your_model").json()
    assert meta["inputs"] == [{"name": "GRPS_MESSAGE", "datatype": "BYTES", "shape": [1]}]
    assert meta["outputs"] == [{"name": "GRPS_MESSAGE", "datatype": "BYTES", "shape": [1]}]
    serialized = pb.GrpsMessage(str_data="over v2").SerializeToString()
    body = {"inputs": [{"name": "GRPS_MESSAGE", "datatype": "BYTES", "shape": [1],
                        "data": [base64.b64encode(serialized).decode()]}]}  # fmt: skip
    del body  # V2 JSON carries BYTES as UTF-8 text: send the message as binary data instead
    header = (
        b'{"inputs":[{"name":"GRPS_MESSAGE","datatype":"BYTES","shape":[1],'
        b'"parameters":{"binary_data_size":%d}}],'
        b'"outputs":[{"name":"GRPS_MESSAGE","parameters":{"binary_data":true}}]}'
        % (len(serialized) + 4)
    )
    content = header + len(serialized).to_bytes(4, "little") + serialized
    answer = http.post(
        "/v2/models/your_model/infer",
        content=content,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert answer.status_code == 200, answer.text
    json_length = int(answer.headers["inference-header-content-length"])
    raw = answer.content[json_length + 4 :]
    reply = pb.GrpsMessage.FromString(raw)
    assert reply.str_data == "str_data: over v2"
    assert np.frombuffer(answer.content[json_length : json_length + 4], "<u4")[0] == len(raw)


def test_model_errors_stay_clear(tmp_path: Path) -> None:
    folder = tmp_path
    (folder / "bad.py").write_text(
        "from servekit.protos.grps_pb2 import GrpsMessage\n"
        "def predict(message: GrpsMessage):\n    return 42\n"
    )
    (folder / "serve.yaml").write_text(
        "models:\n  - {name: bad, modelFormat: {name: python}, entrypoint: 'bad:predict'}\n"
    )
    with running_server(folder / "serve.yaml", grpc=False) as server:
        answer = httpx.post(server.http_url + PREDICT, json={"str_data": "x"}, timeout=30)
        assert answer.status_code == 500
        assert "returns a GrpsMessage, a str (str_data) or bytes" in answer.json()["status"]["msg"]
