"""Python models: functions and classes by import path, beside ONNX models, over both transports.

A real server serves a user module written beside serve.yaml: a typed function (metadata from
its hints), a class with load/predict and declared metadata, a function taking one dict, a
function that raises (its message comes back as a clean error, the server lives on), and broken
entries that are UNAVAILABLE with a reason. In-memory objects (the notebook path) are served
through ``ModelControl.add`` in an in-process server, queried with tritonclient.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import numpy as np
import onnx_builders
import pytest
from numpy.typing import NDArray
from repo_helpers import Repo, onnx_bytes
from servers import ServerProcess, start_server

from servekit.cli import load_plan
from servekit.config.schema import ModelConfig, ModelFormat, TensorOverride

pytestmark = pytest.mark.slow

USER_MODULE = """
from typing import Annotated, TypedDict

import numpy as np
from numpy.typing import NDArray


def scale(
    x: Annotated[NDArray[np.float32], (-1, 3)], factor: NDArray[np.float32]
) -> NDArray[np.float32]:
    return x * factor


class Stats(TypedDict):
    total: NDArray[np.float64]
    label: list[str]


def summary(values: NDArray[np.int64]) -> Stats:
    return {"total": np.array([values.sum()]), "label": ["big" if values.sum() > 10 else "small"]}


def from_dict(inputs):
    return {"y": inputs["a"] + inputs["b"]}


def explode(x: NDArray[np.float32]) -> NDArray[np.float32]:
    raise ValueError("the model refuses negative numbers")


class Greeter:
    def load(self, greeting="hello"):
        self.greeting = greeting.encode()

    def predict(self, inputs):
        return {"text": np.array([self.greeting + b" " + n for n in inputs["name"]], dtype=object)}


class BrokenLoad:
    def load(self):
        raise RuntimeError("weights are missing")

    def predict(self, inputs):
        return inputs
"""

# Some models are broken on purpose: readiness must not wait for them (not strict).
CONFIG = """\
server: {strictReadiness: false}
models:
  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub.onnx}
  - {name: scale, modelFormat: {name: python}, entrypoint: "user_models:scale"}
  - {name: summary, modelFormat: {name: python}, entrypoint: "user_models:summary"}
  - name: from_dict
    modelFormat: {name: python}
    entrypoint: "user_models:from_dict"
    inputs: [{name: a, datatype: INT32, shape: [-1]}, {name: b, datatype: INT32, shape: [-1]}]
    outputs: [{name: y, datatype: INT32, shape: [-1]}]
  - {name: explode, modelFormat: {name: python}, entrypoint: "user_models:explode"}
  - name: greeter
    modelFormat: {name: python}
    entrypoint: "user_models:Greeter"
    instances: 2
    parameters: {greeting: bonjour}
    inputs: [{name: name, datatype: BYTES, shape: [-1]}]
    outputs: [{name: text, datatype: BYTES, shape: [-1]}]
  - {name: broken_load, modelFormat: {name: python}, entrypoint: "user_models:BrokenLoad",
     inputs: [{name: x, datatype: FP32}], outputs: [{name: x, datatype: FP32}]}
  - {name: missing_module, modelFormat: {name: python}, entrypoint: "no_such_module:fn"}
  - {name: untyped, modelFormat: {name: python}, entrypoint: "user_models:from_dict"}
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("python_models")
    (root / "user_models.py").write_text(USER_MODULE)
    (root / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    (root / "serve.yaml").write_text(CONFIG)
    return root


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[ServerProcess]:
    process = start_server(folder / "serve.yaml", grpc=True)
    yield process
    assert process.stop() == 0, process.log()


def test_function_with_type_hints(repo: Repo) -> None:
    meta = repo.metadata("scale")
    assert meta["platform"] == "python"
    shapes = {t["name"]: (t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]}
    assert shapes == {"x": ("FP32", [-1, 3]), "factor": ("FP32", [-1])}
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = repo.infer("scale", {"x": x, "factor": np.array([2.0], np.float32)})
    np.testing.assert_array_equal(out["output"], x * 2)
    assert out["output"].dtype == np.float32


def test_typed_dict_outputs_and_bytes(repo: Repo) -> None:
    out = repo.infer("summary", {"values": np.array([5, 6, 7], np.int64)})
    assert out["total"].dtype == np.float64 and out["total"].tolist() == [18.0]
    assert [v.decode() if isinstance(v, bytes) else v for v in out["label"].tolist()] == ["big"]


def test_function_taking_one_dict_with_declared_metadata(repo: Repo) -> None:
    a, b = np.array([1, 2, 3], np.int32), np.array([10, 20, 30], np.int32)
    out = repo.infer("from_dict", {"a": a, "b": b})
    np.testing.assert_array_equal(out["y"], a + b)
    assert out["y"].dtype == np.int32  # int64 sums are cast to the declared INT32


def test_class_with_load_parameters_and_instances(repo: Repo) -> None:
    names = np.array([b"ada", b"alan"], dtype=object)
    out = repo.infer("greeter", {"name": names})
    texts = [v if isinstance(v, bytes) else v.encode() for v in out["text"].tolist()]
    assert texts == [b"bonjour ada", b"bonjour alan"]


def test_user_exception_is_a_clean_error(repo: Repo) -> None:
    message = repo.expect_error("INTERNAL", repo.infer, "explode", {"x": np.ones(2, np.float32)})
    assert "ValueError: the model refuses negative numbers" in message
    out = repo.infer(
        "add_sub", {"INPUT0": np.ones((1, 16), np.float32), "INPUT1": np.ones((1, 16), np.float32)}
    )
    np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 16), 2, np.float32))


def test_broken_python_models_are_unavailable_with_reasons(repo: Repo) -> None:
    reasons = {r["name"]: (r["state"], r["reason"]) for r in repo.index()}
    assert reasons["broken_load"][0] == "UNAVAILABLE"
    assert "RuntimeError: weights are missing" in reasons["broken_load"][1]
    assert "cannot import 'no_such_module'" in reasons["missing_module"][1]
    assert "declare the inputs" in reasons["untyped"][1]
    for name in ("scale", "summary", "from_dict", "greeter", "explode", "add_sub"):
        assert reasons[name] == ("READY", ""), name


def test_python_model_reload_picks_up_edited_code(repo: Repo, folder: Path) -> None:
    module = folder / "user_models.py"
    original = module.read_text()
    try:
        module.write_text(original.replace("return x * factor", "return x * factor + 1"))
        repo.load("scale")
        x = np.ones((1, 3), np.float32)
        out = repo.infer("scale", {"x": x, "factor": np.array([2.0], np.float32)})
        np.testing.assert_array_equal(out["output"], np.full((1, 3), 3.0))
    finally:
        module.write_text(original)
        repo.load("scale")


# -- in-memory objects (the notebook API's path) ------------------------------------------------
def doubler(x: NDArray[np.float32]) -> NDArray[np.float32]:
    return x * 2


class Counter:
    """An instance handed over as it is: its state is the user's."""

    def __init__(self) -> None:
        self.calls = 0

    def predict(self, x: Annotated[NDArray[np.int64], (-1,)]) -> NDArray[np.int64]:
        self.calls += 1
        return x + self.calls


def _query(url: str, counter: Counter) -> None:
    """tritonclient.http (gevent) lives in one thread: create and use it here."""
    client = Repo("http", url, "")
    try:
        x = np.array([1.5, 2.5], np.float32)
        np.testing.assert_array_equal(client.infer("doubler", {"x": x})["output"], x * 2)
        assert client.infer("counter", {"x": np.array([10])})["count"].tolist() == [11]
        assert counter.calls == 1
        rows = {r["name"]: r["state"] for r in client.index()}
        assert rows["doubler"] == "READY" and rows["counter"] == "READY"
    finally:
        client.close()


def test_in_memory_objects_through_model_control(folder: Path) -> None:
    from servekit.server import ServeKit

    plan = load_plan(
        str(folder / "serve.yaml"), {"http_port": 0, "grpc_port": None, "host": "127.0.0.1"}
    )

    async def scenario() -> None:
        server = ServeKit(plan)
        addresses = await server.start(wait_for_models=True)
        try:
            python = ModelFormat(name="python")
            await server.control.add(
                ModelConfig(name="doubler", model_format=python, entrypoint="in:memory"), doubler
            )
            counter = Counter()
            await server.control.add(
                ModelConfig(
                    name="counter",
                    model_format=python,
                    entrypoint="in:memory",
                    outputs=[TensorOverride(name="count")],
                ),
                counter,
            )
            await asyncio.to_thread(_query, addresses.http_url, counter)
            await server.control.remove("doubler")
            assert "doubler" not in {r.name for r in server.control.index()}
        finally:
            await server.stop()

    # Its own thread and loop, as the notebook API runs it (and immune to a loop some other
    # library left running in the main thread).
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, scenario()).result(timeout=90)
