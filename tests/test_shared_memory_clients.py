"""System shared memory, classification and input formats end to end: a real ``servekit serve``
driven by tritonclient (HTTP and gRPC) making the calls Triton's example programs make
(simple_{http,grpc}_shm_client, the string variants, image_client's class_count).

The flows: clear regions (system and CUDA), create objects with ``utils.shared_memory``,
register them, infer with inputs and outputs in regions, read the results from the regions,
status, unregister; then the errors a client can make, the token of the repository group, and
classification with labels. Objects are made under keys unique to this run and destroyed after.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils as utils
import tritonclient.utils.shared_memory as shm
from servers import ServerProcess, start_server
from shm_models import SERVE_YAML
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

SIXTEEN = 16 * 4
TOKEN = "shm-repo-t0ken"


def _store(root: Path, server: str = "sharedMemory: system") -> Path:
    """serve.yaml with ``server`` as its server section (shared memory is off by default)."""
    shutil.copy(Path(__file__).with_name("shm_models.py"), root / "shm_models.py")
    text = SERVE_YAML.replace("server: {strictReadiness: true}", f"server: {{{server}}}")
    (root / "serve.yaml").write_text(text)
    return root / "serve.yaml"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = start_server(_store(tmp_path_factory.mktemp("shm")))
    yield process
    assert process.stop() == 0, process.log()


Client = Any  # tritonclient.http or tritonclient.grpc InferenceServerClient


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Client]:
    if request.param == "http":
        made: Client = httpclient.InferenceServerClient(server.http_url.split("//", 1)[1])
    else:
        made = grpcclient.InferenceServerClient(server.grpc_target)
    made.unregister_system_shared_memory()  # as the examples start: nothing registered
    made.unregister_cuda_shared_memory()
    yield made
    made.unregister_system_shared_memory()
    made.close()
    server.assert_healthy()


def _module(client: Client) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


class Objects:
    def __init__(self) -> None:
        self.handles: list[Any] = []

    def make(self, size: int) -> tuple[str, Any]:
        key = f"/servekit-e2e-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.handles.append(shm.create_shared_memory_region(key[1:], key, size))
        return key, self.handles[-1]


@pytest.fixture
def objects() -> Iterator[Objects]:
    made = Objects()
    yield made
    for handle in made.handles:
        shm.destroy_shared_memory_region(handle)


def test_int32_inputs_and_outputs_in_regions(client: Client, objects: Objects) -> None:
    lib = _module(client)
    out_key, out_handle = objects.make(2 * SIXTEEN)
    client.register_system_shared_memory("output_data", out_key, 2 * SIXTEEN)
    in_key, in_handle = objects.make(2 * SIXTEEN)
    a, b = np.arange(16, dtype=np.int32), np.ones(16, dtype=np.int32)
    shm.set_shared_memory_region(in_handle, [a])
    shm.set_shared_memory_region(in_handle, [b], offset=SIXTEEN)
    client.register_system_shared_memory("input_data", in_key, 2 * SIXTEEN)

    inputs = [
        lib.InferInput("INPUT0", [1, 16], "INT32"),
        lib.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory("input_data", SIXTEEN)
    inputs[1].set_shared_memory("input_data", SIXTEEN, offset=SIXTEEN)
    binary = {"binary_data": True} if lib is httpclient else {}
    outputs = [lib.InferRequestedOutput("OUTPUT0", **binary),
               lib.InferRequestedOutput("OUTPUT1", **binary)]  # fmt: skip
    outputs[0].set_shared_memory("output_data", SIXTEEN)
    outputs[1].set_shared_memory("output_data", SIXTEEN, offset=SIXTEEN)
    result = client.infer("simple", inputs, outputs=outputs)

    for name, offset, expected in (("OUTPUT0", 0, a + b), ("OUTPUT1", SIXTEEN, a - b)):
        output = result.get_output(name)
        datatype, shape = _datatype_shape(output)
        assert (datatype, shape) == ("INT32", [1, 16])
        data = shm.get_contents_as_numpy(out_handle, np.int32, shape, offset=offset)
        assert (data[0] == expected).all()
        if isinstance(output, dict):  # the bytes are in the region, not in the answer
            assert "data" not in output and "binary_data_size" not in output.get("parameters", {})
        else:
            assert result.get_response().raw_output_contents[offset // SIXTEEN] == b""

    status = client.get_system_shared_memory_status()
    names = _status_names(status)
    assert names == {"output_data", "input_data"}
    one = client.get_system_shared_memory_status("input_data")
    assert _status_names(one) == {"input_data"}
    client.unregister_system_shared_memory("input_data")
    assert _status_names(client.get_system_shared_memory_status()) == {"output_data"}
    client.unregister_system_shared_memory()
    assert _status_names(client.get_system_shared_memory_status()) == set()


def _datatype_shape(output: Any) -> tuple[str, list[int]]:
    if isinstance(output, dict):
        return output["datatype"], list(output["shape"])
    return output.datatype, list(output.shape)


def _status_names(status: Any) -> set[str]:
    if isinstance(status, list):
        return {region["name"] for region in status}
    return set(status.regions)


def test_string_tensors_in_regions(client: Client, objects: Objects) -> None:
    lib = _module(client)
    numbers = np.array([str(i).encode() for i in range(16)], dtype=np.object_).reshape(1, 16)
    ones = np.array([b"1"] * 16, dtype=np.object_).reshape(1, 16)
    expected_sum = [str(i + 1).encode() for i in range(16)]
    expected_diff = [str(i - 1).encode() for i in range(16)]
    out_sizes = [
        utils.serialized_byte_size(utils.serialize_byte_tensor(np.array(e, dtype=np.object_)))
        for e in (expected_sum, expected_diff)
    ]
    out_handles = []
    for name, size in zip(("output0_data", "output1_data"), out_sizes, strict=True):
        key, handle = objects.make(size)
        client.register_system_shared_memory(name, key, size)
        out_handles.append(handle)
    inputs = []
    for index, (region, tensor) in enumerate((("input0_data", numbers), ("input1_data", ones))):
        serialized = utils.serialize_byte_tensor(tensor)
        size = utils.serialized_byte_size(serialized)
        key, handle = objects.make(size)
        shm.set_shared_memory_region(handle, [serialized])
        client.register_system_shared_memory(region, key, size)
        inputs.append(lib.InferInput(f"INPUT{index}", [1, 16], "BYTES"))
        inputs[-1].set_shared_memory(region, size)
    outputs = [lib.InferRequestedOutput("OUTPUT0"), lib.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("output0_data", out_sizes[0])
    outputs[1].set_shared_memory("output1_data", out_sizes[1])
    result = client.infer("simple_string", inputs, outputs=outputs)
    for name, handle, expected in zip(
        ("OUTPUT0", "OUTPUT1"), out_handles, (expected_sum, expected_diff), strict=True
    ):
        datatype, shape = _datatype_shape(result.get_output(name))
        data = shm.get_contents_as_numpy(handle, utils.triton_to_np_dtype(datatype), shape)
        assert list(data[0]) == expected
    assert len(_status_names(client.get_system_shared_memory_status())) == 4


def test_inputs_in_a_region_outputs_in_the_answer(client: Client, objects: Objects) -> None:
    """Regions for the inputs only: the outputs come back as usual (JSON over HTTP)."""
    lib = _module(client)
    key, handle = objects.make(2 * SIXTEEN)
    a = np.arange(16, dtype=np.int32)
    shm.set_shared_memory_region(handle, [a, a])
    client.register_system_shared_memory("both", key, 2 * SIXTEEN)
    inputs = [
        lib.InferInput("INPUT0", [1, 16], "INT32"),
        lib.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory("both", SIXTEEN)
    inputs[1].set_shared_memory("both", SIXTEEN, offset=SIXTEEN)
    binary = {"binary_data": False} if lib is httpclient else {}
    result = client.infer("simple", inputs, outputs=[lib.InferRequestedOutput("OUTPUT0", **binary)])
    assert (result.as_numpy("OUTPUT0")[0] == 2 * a).all()


def _error(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


def _status(error: InferenceServerException) -> str:
    """The gRPC status name of an error, or the one an HTTP status stands for."""
    names = {"400": "INVALID_ARGUMENT", "404": "NOT_FOUND", "409": "ALREADY_EXISTS"}
    status = str(error.status())
    return f"StatusCode.{names[status]}" if status in names else status


@pytest.mark.parametrize("key", ["../../etc/passwd", "/a/b", "/..", "/dev/shm/x"])
def test_path_like_keys_are_refused(client: Client, key: str) -> None:
    error = _error(lambda: client.register_system_shared_memory("r", key, 8))
    assert _status(error) == "StatusCode.INVALID_ARGUMENT"
    assert "invalid shm key" in error.message()


def test_registration_errors(client: Client, objects: Objects) -> None:
    key, _ = objects.make(64)
    error = _error(lambda: client.register_system_shared_memory("r", key, 128))
    assert _status(error) == "StatusCode.INVALID_ARGUMENT"
    assert "Unable to open shared memory region" in error.message()
    assert "at least offset + byte_size (128) bytes" in error.message()
    absent = f"/servekit-absent-{uuid.uuid4().hex}"
    error = _error(lambda: client.register_system_shared_memory("r", absent, 8))
    assert "Unable to open shared memory region" in error.message()
    client.register_system_shared_memory("r", key, 64)
    error = _error(lambda: client.register_system_shared_memory("r", key, 64))
    assert _status(error) == "StatusCode.ALREADY_EXISTS"
    error = _error(lambda: client.get_system_shared_memory_status("nope"))
    assert _status(error) == "StatusCode.NOT_FOUND"
    assert "Unable to find system shared memory region: 'nope'" in error.message()


def test_infer_errors(client: Client, objects: Objects) -> None:
    lib = _module(client)
    key, _ = objects.make(2 * SIXTEEN)
    client.register_system_shared_memory("in", key, 2 * SIXTEEN)

    def infer(region: str, size: int, offset: int = 0) -> InferenceServerException:
        inputs = [lib.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in range(2)]
        inputs[0].set_shared_memory("in", SIXTEEN)
        inputs[1].set_shared_memory(region, size, offset=offset)
        return _error(lambda: client.infer("simple", inputs))

    unknown = infer("nowhere", SIXTEEN)
    assert _status(unknown) == "StatusCode.NOT_FOUND"
    assert "Unable to find shared memory region: 'nowhere'" in unknown.message()
    past = infer("in", SIXTEEN, offset=2 * SIXTEEN)
    assert _status(past) == "StatusCode.INVALID_ARGUMENT"
    assert "Invalid offset for shared memory region: 'in'" in past.message()
    over = infer("in", SIXTEEN, offset=SIXTEEN + 4)
    assert "Invalid offset + byte size for shared memory region: 'in'" in over.message()
    short = infer("in", 8)
    assert _status(short) == "StatusCode.INVALID_ARGUMENT" and "needs 64 bytes" in short.message()


def test_cuda_shared_memory_is_refused_clearly(client: Client) -> None:
    assert _status_names(client.get_cuda_shared_memory_status()) == set()
    error = _error(lambda: client.register_cuda_shared_memory("gpu", b"\0" * 64, 0, 64))
    assert _status(error) == "StatusCode.INVALID_ARGUMENT"
    assert "GPUs not supported" in error.message() and "system shared memory" in error.message()


def test_metadata_names_the_extensions(client: Client) -> None:
    metadata = client.get_server_metadata()
    extensions = metadata["extensions"] if isinstance(metadata, dict) else metadata.extensions
    assert {"system_shared_memory", "classification"} <= set(extensions)


def test_classification_with_labels(client: Client) -> None:
    lib = _module(client)
    image = lib.InferInput("image", [2, 3, 2, 2], "FP32")
    image.set_data_from_numpy(np.zeros((2, 3, 2, 2), np.float32))
    result = client.infer(
        "scores", [image], outputs=[lib.InferRequestedOutput("scores", class_count=3)]
    )
    top = result.as_numpy("scores")
    assert top.shape == (2, 3)
    assert list(top[0]) == [b"0.700000:1:dog", b"0.700000:3:fox", b"0.150000:4:owl"]


def test_input_format_in_the_config(client: Client) -> None:
    if isinstance(client, httpclient.InferenceServerClient):
        config = client.get_model_config("scores")
        assert config["input"][0]["format"] == "FORMAT_NCHW"
    else:
        message = client.get_model_config("scores").config
        assert message.input[0].format == grpcclient.model_config_pb2.ModelInput.FORMAT_NCHW


def test_the_repository_token_guards_the_regions(tmp_path: Path) -> None:
    server = start_server(_store(tmp_path, f"sharedMemory: system, auth: {{repository: {TOKEN}}}"))
    try:
        with httpx.Client(base_url=server.http_url, timeout=10) as http:
            refused = http.get("/v2/systemsharedmemory/status")
            assert refused.status_code == 401
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            assert http.get("/v2/systemsharedmemory/status", headers=bearer).json() == []
            posted = http.post(
                "/v2/systemsharedmemory/region/r/register",
                content=b'{"key": "/x", "byte_size": 8}',
                headers={**bearer, "Content-Type": "text/plain"},
            )
            assert posted.status_code == 403  # the cross-site guard of control routes
        assert server.grpc_target is not None
        grpc = grpcclient.InferenceServerClient(server.grpc_target)
        error = _error(lambda: grpc.register_system_shared_memory("r", "/x", 8))
        assert error.status() == "StatusCode.UNAUTHENTICATED"
        regions = grpc.get_system_shared_memory_status(headers={"authorization": f"Bearer {TOKEN}"})
        assert list(regions.regions) == []
        grpc.close()
    finally:
        assert server.stop() == 0, server.log()
