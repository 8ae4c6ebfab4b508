"""The chain that once ran a client's code inside the server, replayed against a real server.

An unauthenticated client on a server with the repository API open (``modelControl:
explicit``, no token: the loopback default) (1) pushed an "ONNX model" carrying a pickle through
``POST /v2/repository/models/{m}/load``, (2) read the pushed file's absolute path from the
dashboard's JSON, and (3) reloaded a declared Python model (same entrypoint, so allowed) with a
config whose ``parameters`` pointed the model's ordinary ``load()`` at that pickle.

The pickle here creates a marker file when unpickled (a positive control proves it does). Every
step is tried the ways a client could: over HTTP with plain httpx and over gRPC with
tritonclient, with the Triton and the servekit config shapes, and step 3 even with a pickle whose
path the client knows for sure. The marker never appears, refused pushes write nothing, every
answer is a clear 4xx, and the declared model keeps serving with its serve.yaml parameters.
"""

from __future__ import annotations

import base64
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx_builders
import pytest
import tritonclient.grpc as grpcclient
from repo_helpers import external_data_model, onnx_bytes, snapshot
from servers import ServerProcess, start_server
from tritonclient.utils import InferenceServerException

from servekit.shown_paths import GENERATION

pytestmark = pytest.mark.slow

USER_MODULE = '''
import pickle

import numpy as np
from numpy.typing import NDArray


class Unpickler:
    """An ordinary model: load() reads its weights with pickle, as many models do."""

    def load(self, path="weights.pkl"):
        with open(path, "rb") as fh:
            self.offset = pickle.load(fh)["offset"]

    def predict(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        return x + self.offset
'''


class Payload:
    """Unpickling this calls ``open(marker, "w")``: the marker file shows code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("attack")
    (base / "attack_models.py").write_text(USER_MODULE)
    (base / "weights.pkl").write_bytes(pickle.dumps({"offset": 3.0}))
    (base / "add_sub").mkdir()
    (base / "add_sub" / "model.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    (base / "serve.yaml").write_text(
        "server: {modelControl: explicit, strictReadiness: false}\n"
        "models:\n"
        "  - {name: unpickler, modelFormat: {name: python}, entrypoint: 'attack_models:Unpickler',"
        " parameters: {path: weights.pkl}}\n"
        "  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub}\n"
    )
    return base


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[ServerProcess]:
    process = start_server(root / "serve.yaml", grpc=True)
    yield process
    assert process.stop() == 0, process.log()


def marker(root: Path) -> Path:
    return root.parent / f"{root.name}-CODE-RAN"


def storage(root: Path) -> Path:
    return root / ".servekit" / "storage"


def load_body(config: dict[str, Any], files: dict[str, bytes]) -> dict[str, Any]:
    params: dict[str, Any] = {"config": json.dumps(config)}
    params.update({k: base64.b64encode(v).decode() for k, v in files.items()})
    return {"parameters": params}


def test_the_payload_runs_code_when_unpickled(tmp_path: Path) -> None:
    """Positive control: the detector works (the payload really executes on unpickling)."""
    control = tmp_path / "control-marker"
    handle = pickle.loads(pickle.dumps(Payload(control)))
    handle.close()
    assert control.exists()


def test_the_attack_chain_over_http(server: ServerProcess, root: Path) -> None:
    payload = pickle.dumps(Payload(marker(root)))
    add_sub = onnx_bytes(onnx_builders.add_sub())
    onnx_config = {"backend": "onnxruntime"}
    http = httpx.Client(base_url=server.http_url, timeout=30)
    try:
        # (1) Push the pickle beside a model, in every disguise: refused, nothing written.
        disguises = [
            {"file:1/model.onnx": add_sub, "file:1/payload.pkl": payload},
            {"file:1/model.onnx": add_sub, "file:1/sub/payload.pkl": payload},
            {"file:1/model.onnx": add_sub, "file:1/payload.onnx": payload},
            {"file:1/model.onnx": payload},
            {"file:1/model.onnx": add_sub, "file:2/model.onnx": payload},
            {"file:1/model.onnx": add_sub, "file:1/model.onnx.data": payload},
        ]
        for files in disguises:
            before = snapshot(root)
            answer = http.post(
                "/v2/repository/models/evil/load", json=load_body(onnx_config, files)
            )
            assert answer.status_code == 400, answer.text
            assert "error" in answer.json()
            assert snapshot(root) == before, f"a refused push wrote something: {list(files)}"
        assert not storage(root).exists() or not any(storage(root).iterdir())

        # The one push that carries the pickle legitimately: as the external data of a model that
        # reads it as a tensor. It is accepted (it is a model and its data) ...
        model, data = external_data_model("weights.bin", payload)
        files = {"file:1/model.onnx": model, "file:1/weights.bin": data}
        answer = http.post("/v2/repository/models/evil/load", json=load_body(onnx_config, files))
        assert answer.status_code == 200, answer.text

        # (2) ... but nothing the server answers says where it lies.
        texts = [
            http.get("/dashboard/api/models/evil").text,
            http.get("/dashboard/api/models").text,
            http.get("/dashboard/api/overview").text,
            http.post("/v2/repository/index", json={}).text,
            http.get("/v2/models/evil/config").text,
        ]
        assert json.loads(texts[0])["storage_uri"] == "(pushed files)"
        for text in texts:
            assert str(root) not in text and str(root.resolve()) not in text
            assert ".servekit" not in text and not GENERATION.search(text), text

        # (3) Point the declared Python model's load() at the pickle (the test knows the exact
        # path of the pushed copy, as if step 2 had leaked it, and writes another one beside
        # serve.yaml): every shape of config is refused before anything loads.
        pushed_copy = next(storage(root).rglob("weights.bin"))
        planted = root / "planted.pkl"
        planted.write_bytes(payload)
        for path in (str(pushed_copy), str(planted), "planted.pkl"):
            for config, name in attempts(path):
                answer = http.post(f"/v2/repository/models/{name}/load", json=load_body(config, {}))
                assert answer.status_code == 403, (config, answer.text)
                message = answer.json()["error"]
                assert "Python model" in message, message
                assert not marker(root).exists(), "the pickle was loaded: code ran"

        # The declared model still serves with its serve.yaml parameters.
        infer = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}
        answer = http.post("/v2/models/unpickler/infer", json=infer)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [4.0, 5.0]
        assert http.post("/v2/repository/models/unpickler/load", json={}).status_code == 200

        # Unloading the pushed model deletes its files.
        assert http.post("/v2/repository/models/evil/unload", json={}).status_code == 200
        assert not any(storage(root).rglob("*.bin"))
    finally:
        http.close()
    assert not marker(root).exists()
    server.assert_healthy()


def attempts(path: str) -> list[tuple[dict[str, Any], str]]:
    """Configs that would make the server unpickle ``path``, with the model they target."""
    entry = {"modelFormat": {"name": "python"}, "parameters": {"path": path}}
    same_code = {**entry, "entrypoint": "attack_models:Unpickler"}
    triton = {"parameters": {"path": {"string_value": path}}}
    return [
        (entry, "unpickler"),
        (same_code, "unpickler"),
        (triton, "unpickler"),
        ({**triton, "backend": "python"}, "unpickler"),
        ({**triton, "backend": "python", "instance_group": [{"count": 2}]}, "unpickler"),
        (same_code, "evil_twin"),  # a new model with the declared code
        (same_code, "add_sub"),  # an ONNX model turned into the declared code
    ]


def test_the_attack_chain_over_grpc(server: ServerProcess, root: Path) -> None:
    payload = pickle.dumps(Payload(marker(root)))
    add_sub = onnx_bytes(onnx_builders.add_sub())
    assert server.grpc_target is not None
    client = grpcclient.InferenceServerClient(server.grpc_target)
    try:
        before = snapshot(root)
        for files in (
            {"file:1/model.onnx": add_sub, "file:1/payload.pkl": payload},
            {"file:1/model.onnx": payload},
        ):
            with pytest.raises(InferenceServerException) as refused:
                client.load_model("evil", config='{"backend": "onnxruntime"}', files=files)
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert snapshot(root) == before
        planted = root / "planted_grpc.pkl"
        planted.write_bytes(payload)
        for config, name in attempts(str(planted)):
            with pytest.raises(InferenceServerException) as denied:
                client.load_model(name, config=json.dumps(config))
            assert denied.value.status() == "StatusCode.PERMISSION_DENIED", denied.value.message()
            assert not marker(root).exists()
        x = grpcclient.InferInput("x", [1], "FP32")
        x.set_data_from_numpy(np.array([1.0], np.float32))
        assert client.infer("unpickler", [x]).as_numpy("output").tolist() == [4.0]
    finally:
        client.close()
    assert not marker(root).exists()
    server.assert_healthy()
