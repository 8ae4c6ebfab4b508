"""The repository attack chain (tests/test_repository_attack.py) replayed with the pickled formats.

scikit-learn (joblib, pickle) and MLflow (cloudpickle) files run code when they load, so these
formats are declared in serve.yaml only. A client with the repository API open (loopback,
``modelControl: explicit``, no token) tries every way to make the server unpickle a payload
whose ``__reduce__`` creates a marker file: push it as a model of each format (servekit and
Triton config shapes), place it with an accepted ONNX push and point a model at it, point a new
model, a declared ONNX model (switching its format) and the declared scikit-learn model at a
pickle lying beside serve.yaml. Over HTTP (httpx) and gRPC (tritonclient): every answer is a
clear 4xx, refused pushes write nothing, the marker never appears, and the declared model keeps
answering with its own estimator.
"""

from __future__ import annotations

import base64
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import joblib
import numpy as np
import onnx_builders
import pytest
import tritonclient.grpc as grpcclient
from repo_helpers import external_data_model, onnx_bytes, snapshot
from servers import ServerProcess, start_server
from sklearn.linear_model import LogisticRegression
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

X = np.array([[0.0, 1.0], [1.0, 0.0], [0.2, 0.9], [0.9, 0.1]])
Y = np.array([0, 1, 0, 1])


class Payload:
    """Unpickling this calls ``open(marker, "w")``: the marker file shows code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def marker(root: Path) -> Path:
    return root.parent / f"{root.name}-PICKLE-RAN"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("tabular_attack")
    (base / "clf").mkdir()
    joblib.dump(LogisticRegression().fit(X, Y), base / "clf" / "model.joblib")
    (base / "add_sub").mkdir()
    (base / "add_sub" / "model.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    payload = pickle.dumps(Payload(marker(base)))
    # Pickles an attacker managed to place beside serve.yaml, in each format's layout.
    (base / "planted" / "1").mkdir(parents=True)
    (base / "planted" / "1" / "model.joblib").write_bytes(payload)
    (base / "planted.pkl").write_bytes(payload)
    (base / "planted_mlflow").mkdir()
    (base / "planted_mlflow" / "MLmodel").write_text(
        "flavors:\n  python_function:\n    loader_module: mlflow.pyfunc.model\n"
        "    python_model: python_model.pkl\n"
    )
    (base / "planted_mlflow" / "python_model.pkl").write_bytes(payload)
    (base / "serve.yaml").write_text(
        "server: {modelControl: explicit, strictReadiness: false}\n"
        "models:\n"
        "  - {name: clf, modelFormat: {name: sklearn}, storageUri: clf}\n"
        "  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub}\n"
    )
    return base


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[ServerProcess]:
    process = start_server(root / "serve.yaml", grpc=True)
    yield process
    assert process.stop() == 0, process.log()


def test_the_payload_runs_code_when_loaded_as_a_joblib_file(tmp_path: Path) -> None:
    """Positive control: joblib.load of the planted file runs the payload."""
    path = tmp_path / "model.joblib"
    path.write_bytes(pickle.dumps(Payload(tmp_path / "control")))
    joblib.load(path).close()
    assert (tmp_path / "control").exists()


def pushes(payload: bytes) -> list[tuple[dict[str, Any], dict[str, bytes], int]]:
    """(config, files, HTTP status): the pickle pushed as a model of each format."""
    mlmodel = b"flavors:\n  python_function:\n    python_model: python_model.pkl\n"
    return [
        ({"modelFormat": {"name": "sklearn"}}, {"file:1/model.joblib": payload}, 403),
        ({"backend": "sklearn"}, {"file:1/model.pkl": payload}, 403),
        ({"platform": "sklearn"}, {"file:1/model.joblib": payload}, 403),
        (
            {"modelFormat": {"name": "mlflow"}},
            {"file:1/MLmodel": mlmodel, "file:1/python_model.pkl": payload},
            403,
        ),
        ({"modelFormat": {"name": "xgboost"}}, {"file:1/model.json": payload}, 403),
        ({"backend": "onnxruntime"}, {"file:1/model.joblib": payload}, 400),
    ]


def pointers(root: Path, pushed: Path) -> list[tuple[str, dict[str, Any]]]:
    """(model, config): load requests pointing a model at a pickle already on disk."""
    sk = {"name": "sklearn"}
    return [
        ("evil", {"modelFormat": sk, "storageUri": "planted"}),  # a new model
        ("evil", {"modelFormat": sk, "storageUri": "planted.pkl"}),
        ("evil", {"modelFormat": {"name": "mlflow"}, "storageUri": "planted_mlflow"}),
        ("evil", {"modelFormat": sk, "storageUri": str(pushed)}),
        ("add_sub", {"modelFormat": sk, "storageUri": "planted"}),  # a declared ONNX model
        ("add_sub", {"backend": "sklearn"}),  # switching its format, files inherited
        ("clf", {"modelFormat": sk, "storageUri": "planted"}),  # the declared sklearn model
        ("clf", {"modelFormat": sk, "storageUri": str(pushed)}),
        ("clf", {"modelFormat": {"name": "mlflow"}, "storageUri": "planted_mlflow"}),
    ]


def load_body(config: dict[str, Any], files: dict[str, bytes]) -> dict[str, Any]:
    params: dict[str, Any] = {"config": json.dumps(config)}
    params.update({k: base64.b64encode(v).decode() for k, v in files.items()})
    return {"parameters": params}


def test_the_pickle_attack_chain_over_http(server: ServerProcess, root: Path) -> None:
    payload = pickle.dumps(Payload(marker(root)))
    http = httpx.Client(base_url=server.http_url, timeout=30)
    try:
        for config, files, status in pushes(payload):
            before = snapshot(root)
            answer = http.post("/v2/repository/models/evil/load", json=load_body(config, files))
            assert answer.status_code == status, (config, answer.text)
            assert "error" in answer.json()
            assert snapshot(root) == before, f"a refused push wrote something: {config}"
        # An accepted ONNX push carries the pickle as external data: it lands in storage ...
        model, data = external_data_model("model.joblib", payload)
        files = {"file:1/model.onnx": model, "file:1/model.joblib": data}
        config = {"backend": "onnxruntime"}
        answer = http.post("/v2/repository/models/carrier/load", json=load_body(config, files))
        assert answer.status_code == 200, answer.text
        pushed = next((root / ".servekit" / "storage").rglob("model.joblib")).parent
        # ... and no load request may point a model at it, or at the planted pickles.
        for name, config in pointers(root, pushed):
            answer = http.post(f"/v2/repository/models/{name}/load", json=load_body(config, {}))
            assert answer.status_code in (400, 403), (name, config, answer.text)
            assert "error" in answer.json()
            assert not marker(root).exists(), f"code ran: {name} {config}"
        # The declared model still answers with its own estimator, and reloads from serve.yaml.
        body = {
            "inputs": [
                {
                    "name": "input-0",
                    "datatype": "FP64",
                    "shape": [2, 2],
                    "data": X[:2].ravel().tolist(),
                }
            ]
        }
        answer = http.post("/v2/models/clf/infer", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [0, 1]
        assert http.post("/v2/repository/models/clf/load", json={}).status_code == 200
        assert http.post("/v2/repository/models/carrier/unload", json={}).status_code == 200
    finally:
        http.close()
    assert not marker(root).exists()
    server.assert_healthy()


def test_the_pickle_attack_chain_over_grpc(server: ServerProcess, root: Path) -> None:
    payload = pickle.dumps(Payload(marker(root)))
    assert server.grpc_target is not None
    client = grpcclient.InferenceServerClient(server.grpc_target)
    statuses = {400: "StatusCode.INVALID_ARGUMENT", 403: "StatusCode.PERMISSION_DENIED"}
    try:
        for config, files, status in pushes(payload):
            before = snapshot(root)
            with pytest.raises(InferenceServerException) as refused:
                client.load_model("evil", config=json.dumps(config), files=files)
            assert refused.value.status() == statuses[status], refused.value.message()
            assert snapshot(root) == before
        for name, config in pointers(root, root / "planted"):
            with pytest.raises(InferenceServerException) as denied:
                client.load_model(name, config=json.dumps(config))
            assert denied.value.status() in statuses.values(), denied.value.message()
            assert not marker(root).exists(), f"code ran: {name} {config}"
        x = grpcclient.InferInput("input-0", [2, 2], "FP64")
        x.set_data_from_numpy(X[:2])
        # a tabular model's 1-D output is answered [N, 1], as MLServer answers it
        assert client.infer("clf", [x]).as_numpy("predict").tolist() == [[0], [1]]
    finally:
        client.close()
    assert not marker(root).exists()
    server.assert_healthy()
