"""Helpers of the model repository tests: a store on disk and one client API over both transports.

Every call goes over the wire through the real ``tritonclient.http`` / ``tritonclient.grpc``
(the ``ready`` filter of the index, which tritonclient does not expose, through tritonclient's
own gRPC stub and through plain HTTP).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import onnx
import onnx.external_data_helper
import onnx.numpy_helper
import onnx_builders
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

STATUS = {
    "http": {"INVALID_ARGUMENT": "400", "NOT_FOUND": "404", "UNAVAILABLE": "503", "INTERNAL": "500",
             "RESOURCE_EXHAUSTED": "413", "PERMISSION_DENIED": "403"},
    "grpc": {c: f"StatusCode.{c}" for c in ("INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE",
                                           "INTERNAL", "RESOURCE_EXHAUSTED", "PERMISSION_DENIED")},
}  # fmt: skip

SLOW_MODEL = """
import time
import numpy as np
from numpy.typing import NDArray


def predict(x: NDArray[np.float32]) -> NDArray[np.float32]:
    time.sleep(0.4)
    return x + 1
"""


def onnx_bytes(model: onnx.ModelProto) -> bytes:
    return bytes(model.SerializeToString())


def external_data_model(location: str, weights: bytes | None = None) -> tuple[bytes, bytes]:
    """``y = x @ W`` (x: FP32 [1, 4]) with W kept in the external data file ``location``;
    returns the model file and W's bytes (or, given ``weights``, a model whose only output is
    those bytes as UINT8, read from ``location``: any file can be made the data of a model)."""
    helper = onnx.helper
    if weights is None:
        tensor = onnx.numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "W")
        x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])
        y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])
        node, inputs = helper.make_node("MatMul", ["x", "W"], ["y"]), [x]
    else:
        tensor = onnx.numpy_helper.from_array(np.frombuffer(weights, np.uint8), "W")
        y = helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, [len(weights)])
        node, inputs = helper.make_node("Identity", ["W"], ["y"]), []
    data = bytes(tensor.raw_data)
    onnx.external_data_helper.set_external_data(tensor, location, offset=0, length=len(data))
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    graph = helper.make_graph([node], "external", inputs, [y], [tensor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx_bytes(model), data


EXTERNAL_W = np.arange(16, dtype=np.float32).reshape(4, 4)
"""The W of :func:`external_data_model`: ``y = x @ EXTERNAL_W``."""


def unloadable_onnx() -> bytes:
    """A well-formed ONNX file that onnxruntime refuses (an operator that does not exist)."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    node = onnx.helper.make_node("NoSuchOperator", ["x"], ["y"])
    graph = onnx.helper.make_graph([node], "unloadable", [x], [y])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    return onnx_bytes(model)


def write_store(root: Path, extra_yaml: str = "") -> Path:
    """serve.yaml with mlp (v1, v2), add_sub, a garbage model and a slow Python model."""
    models = root / "models"
    for version in (1, 2):
        path = models / "mlp" / str(version) / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(onnx_bytes(onnx_builders.mlp(seed=version)))
    (models / "add_sub" / "1").mkdir(parents=True)
    (models / "add_sub" / "1" / "model.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    (models / "broken.onnx").write_bytes(b"this is not onnx" * 64)
    (root / "slow_model.py").write_text(SLOW_MODEL)
    config = root / "serve.yaml"
    config.write_text(  # broken on purpose: readiness must not wait for it (not strict)
        "server: {maxRequestBytes: 3000000, strictReadiness: false}\n"
        "models:\n"
        "  - {name: mlp, modelFormat: {name: onnx}, storageUri: models/mlp, "
        "versionPolicy: {all: {}}}\n"
        "  - {name: add_sub, modelFormat: {name: onnx}, storageUri: models/add_sub}\n"
        "  - {name: broken, modelFormat: {name: onnx}, storageUri: models/broken.onnx}\n"
        "  - {name: slow, modelFormat: {name: python}, entrypoint: 'slow_model:predict'}\n"
        + extra_yaml
    )
    return config


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and link under ``root`` (server logs and caches aside) with size and mtime."""
    out = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in [*files, *dirs]:
            path = Path(folder) / name
            if path.suffix == ".log":
                continue
            stat = path.lstat()
            out[str(path.relative_to(root))] = (stat.st_size, stat.st_mtime_ns)
    return out


class Repo:
    """Index/load/unload/infer over one transport, answers normalised."""

    def __init__(self, transport: str, http_url: str, grpc_target: str) -> None:
        self.transport = transport
        self.http_url = http_url
        self.grpc_target = grpc_target
        self.raw: Any = (
            httpclient.InferenceServerClient(http_url.removeprefix("http://"))
            if transport == "http"
            else grpcclient.InferenceServerClient(grpc_target)
        )

    def close(self) -> None:
        self.raw.close()

    def index(self, ready: bool = False) -> list[dict[str, str]]:
        if ready and self.transport == "http":
            rows = httpx.post(f"{self.http_url}/v2/repository/index", json={"ready": True}).json()
        elif ready:
            with grpc.insecure_channel(self.grpc_target) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                answer = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True))
            rows = [
                {"name": m.name, "version": m.version, "state": m.state, "reason": m.reason}
                for m in answer.models
            ]
        elif self.transport == "http":
            rows = self.raw.get_model_repository_index()
        else:
            rows = self.raw.get_model_repository_index(as_json=True).get("models", [])
        keys = ("name", "version", "state", "reason")
        return [{k: str(row.get(k, "")) for k in keys} for row in rows]

    def states(self) -> dict[tuple[str, str], str]:
        return {(r["name"], r["version"]): r["state"] for r in self.index()}

    def row(self, name: str, version: str = "1") -> dict[str, str]:
        return next(r for r in self.index() if r["name"] == name and r["version"] == version)

    def load(
        self,
        name: str,
        config: dict[str, Any] | str | None = None,
        files: dict[str, bytes] | None = None,
    ) -> None:
        text = json.dumps(config) if isinstance(config, dict) else config
        self.raw.load_model(name, config=text, files=files)

    def unload(self, name: str, dependents: bool = False) -> None:
        self.raw.unload_model(name, unload_dependents=dependents)

    def ready(self, name: str) -> bool:
        return bool(self.raw.is_model_ready(name))

    def metadata(self, name: str) -> dict[str, Any]:
        if self.transport == "http":
            return dict(self.raw.get_model_metadata(name))
        return dict(self.raw.get_model_metadata(name, as_json=True))

    def infer(self, name: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # type: ignore[type-arg]
        module: Any = httpclient if self.transport == "http" else grpcclient
        tensors = []
        for key, array in inputs.items():
            tensor = module.InferInput(key, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        answer = self.raw.infer(name, tensors)
        outputs = answer.get_response()["outputs"] if self.transport == "http" else None
        names = (
            [o["name"] for o in outputs]
            if outputs is not None
            else [o.name for o in answer.get_response().outputs]
        )
        return {n: answer.as_numpy(n) for n in names}

    def expect_error(self, code: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
        """``call`` must fail with core error ``code``; returns the message."""
        with pytest.raises(InferenceServerException) as info:
            call(*args, **kwargs)
        assert info.value.status() == STATUS[self.transport][code], info.value.message()
        return str(info.value.message())
