"""Triton's four sequence example programs, run unmodified against ``servekit serve`` (issue 29).

The programs (tests/triton_examples/, vendored byte for byte with their license; their SHA-256
is checked here) send three sequences of eight requests each to ``simple_sequence``: two with
integer correlation IDs, one with a string (a UUID), synchronously over HTTP and gRPC, and
interleaved on one bidirectional stream (ModelStreamInfer, with the sync and the asyncio gRPC
clients). Each exits 0 and prints its ``PASS`` line only when every answer is right. Their
model repository is a serve.yaml: the Python stand-in of Triton's docs example model
(tests/sequence_models.py), and that model's ONNX graph itself, whose control inputs START
and READY the server fills.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from sequence_models import EXAMPLES_CONFIG, write_project
from servers import ServerProcess, start_server

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).parent / "triton_examples"
PROGRAMS = {
    "simple_grpc_sequence_stream_infer_client.py": "grpc",
    "simple_grpc_aio_sequence_stream_infer_client.py": "grpc",
    "simple_grpc_sequence_sync_infer_client.py": "grpc",
    "simple_http_sequence_sync_infer_client.py": "http",
}

ONNX_CONFIG = """
models:
  - name: simple_sequence
    modelFormat: {name: onnx}
    storageUri: ./simple_sequence.onnx
    maxBatchSize: 8
    sequenceBatching:
      controlInputs:
        - {name: START, control: [{kind: CONTROL_SEQUENCE_START, int32FalseTrue: [0, 1]}]}
        - {name: READY, control: [{kind: CONTROL_SEQUENCE_READY, int32FalseTrue: [0, 1]}]}
"""


def simple_sequence_onnx() -> onnx.ModelProto:
    """Triton's docs/examples simple_sequence graph: OUTPUT = Cast(READY * (INPUT + START))."""
    io = [
        helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 1])
        for n in ("INPUT", "START", "READY")
    ]
    out = helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, ["batch", 1])
    nodes = [
        helper.make_node("Add", ["INPUT", "START"], ["sum"]),
        helper.make_node("Mul", ["READY", "sum"], ["ready"]),
        helper.make_node("Cast", ["ready"], ["OUTPUT"], to=TensorProto.INT32),
    ]
    graph = helper.make_graph(nodes, "onnx_sequence_int32", io, [out])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture(scope="module", params=["python", "onnx"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp(f"sequence-{request.param}")
    if request.param == "python":
        config = write_project(root, EXAMPLES_CONFIG)
    else:
        onnx.save(simple_sequence_onnx(), root / "simple_sequence.onnx")
        config = root / "serve.yaml"
        config.write_text(ONNX_CONFIG)
    process = start_server(config)
    yield process
    assert process.stop() == 0, process.log()


def test_the_programs_are_the_vendored_ones_unmodified() -> None:
    listed = dict(
        re.findall(
            r"\| `([\w.]+\.py)` \| `([0-9a-f]{64})` \|", (EXAMPLES / "README.md").read_text()
        )
    )
    assert set(listed) == set(PROGRAMS)
    for name, digest in listed.items():
        text = (EXAMPLES / name).read_bytes()
        assert hashlib.sha256(text).hexdigest() == digest, name
        assert b"Copyright" in text[:200] and b"Redistribution and use" in text[:600]


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_triton_sequence_example_passes(server: ServerProcess, program: str) -> None:
    url = server.http_host_port if PROGRAMS[program] == "http" else server.grpc_target
    assert url is not None
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / program), "-u", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{server.log()[-3000:]}"
    assert re.search(r"^PASS: (Sequence|grpc aio sequence stream)$", run.stdout, re.M)
    # the three sequences' eight rows each, as the program prints them
    assert re.search(r"^\[7\] 1 : -1 : -1$", run.stdout, re.M), run.stdout


def test_the_config_shows_the_controls_and_hides_them_from_metadata(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_host_port) as http:
        config = http.get_model_config("simple_sequence")
        metadata = http.get_model_metadata("simple_sequence")
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT"]
    batching = config["sequence_batching"]
    assert [c["name"] for c in batching["control_input"]] == ["START", "READY"]
    assert batching["control_input"][0]["control"][0]["kind"] == "CONTROL_SEQUENCE_START"
    assert batching["control_input"][0]["control"][0]["int32_false_true"] == [0, 1]
    assert "direct" in batching
    assert server.grpc_target is not None
    with grpcclient.InferenceServerClient(server.grpc_target) as grpc_client:
        proto = grpc_client.get_model_config("simple_sequence").config
    controls = proto.sequence_batching.control_input
    assert [c.name for c in controls] == ["START", "READY"]
    assert list(controls[1].control[0].int32_false_true) == [0, 1]
    assert proto.sequence_batching.HasField("direct")
    assert [i.name for i in proto.input] == ["INPUT"]


def test_requests_without_a_sequence_are_refused_with_tritons_words(server: ServerProcess) -> None:
    import numpy as np
    from tritonclient.utils import InferenceServerException

    with httpclient.InferenceServerClient(server.http_host_port) as http:
        tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.zeros((1, 1), np.int32))
        with pytest.raises(
            InferenceServerException, match="must specify a non-zero or non-empty correlation ID"
        ):
            http.infer("simple_sequence", [tensor])
        with pytest.raises(
            InferenceServerException, match="must specify the START flag on the first request"
        ):
            http.infer("simple_sequence", [tensor], sequence_id=424242)
