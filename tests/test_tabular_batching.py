"""Row-wise models (scikit-learn, XGBoost, LightGBM) stack the requests waiting for them into one
call by default, MLServer project folders included, and every request gets exactly the answer it
gets alone; ``maxBatchSize`` without ``dynamicBatching`` turns it off. In process, through the
DataPlane (no listener)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest

from servekit.config.compiler import compile_plan
from servekit.config.loader import parse_config
from servekit.config.overrides import load_plan
from servekit.runtimes.python import register_object
from servekit.server import ServeKit
from servekit.services.dataplane import DataPlane
from servekit.services.execution.executor import ModelExecutor
from servekit.services.execution.jobs import ROW_BATCH, ExecutorSettings
from servekit.types import InferRequest, InferResponse, Tensor


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn import datasets

    digits = datasets.load_digits()
    return digits.images.reshape(len(digits.images), -1), digits.target


def _request(model: str, rows: np.ndarray, *outputs: str) -> InferRequest:
    from servekit.types import RequestedOutput

    tensor = Tensor("predict", "FP32", tuple(rows.shape), rows.astype(np.float32))
    wanted = [RequestedOutput(name) for name in outputs]
    return InferRequest(model, [tensor], outputs=wanted)


def _answer(response: InferResponse) -> list[tuple[str, str, tuple[int, ...], Any]]:
    return [(o.name, o.datatype, tuple(o.shape), np.asarray(o.data)) for o in response.outputs]


async def _started(plan: Any) -> ServeKit:
    kit = ServeKit(plan)  # services only, no listener
    await kit.control.start()
    return kit


async def _together_then_alone(
    dataplane: DataPlane, requests: list[InferRequest]
) -> tuple[list[InferResponse], list[InferResponse]]:
    together = await asyncio.gather(*(dataplane.infer(r) for r in requests))
    alone = [await dataplane.infer(r) for r in requests]
    return list(together), alone


def _same(together: list[InferResponse], alone: list[InferResponse]) -> None:
    for mine, single in zip(together, alone, strict=True):
        for (name, datatype, shape, data), want in zip(_answer(mine), _answer(single), strict=True):
            assert (name, datatype, shape) == want[:3]
            np.testing.assert_array_equal(data, want[3])  # bit for bit, not approximately


def test_an_mlserver_sklearn_folder_stacks_the_requests_waiting(tmp_path: Path) -> None:
    """MLServer's sklearn example (no ``max_batch_size``): 20 requests of 1-3 rows arriving
    together take one call, and each answer is the SVC's own for its rows."""
    from sklearn import svm

    x, y = _digits()
    half = len(x) // 2
    classifier = svm.SVC(gamma=0.001).fit(x[:half], y[:half])
    joblib.dump(classifier, tmp_path / "mnist-svm.joblib")
    (tmp_path / "settings.json").write_text(json.dumps({"debug": "true"}))
    settings = {"name": "mnist-svm", "implementation": "mlserver_sklearn.SKLearnModel",
                "parameters": {"uri": "./mnist-svm.joblib", "version": "v0.1.0"}}  # fmt: skip
    (tmp_path / "model-settings.json").write_text(json.dumps(settings))
    rows = [x[half + 3 * i : half + 3 * i + 1 + i % 3] for i in range(20)]

    async def scenario() -> None:
        kit = await _started(load_plan(tmp_path))
        stats = kit.dataplane.statistics.of("mnist-svm", 1)
        together, alone = await _together_then_alone(
            kit.dataplane, [_request("mnist-svm", r) for r in rows]
        )
        assert stats.execution_count == 1 + len(rows)  # all 20 in one call, then one by one
        assert stats.inference_count == 2 * sum(len(r) for r in rows)  # rows, as Triton counts
        for part, response in zip(rows, together, strict=True):
            (output,) = response.outputs
            assert output.shape == [len(part), 1] or tuple(output.shape) == (len(part), 1)
            assert np.asarray(output.data).ravel().tolist() == classifier.predict(part).tolist()
        _same(together, alone)
        await kit.stop()

    asyncio.run(scenario())


def _forest(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    from sklearn.ensemble import RandomForestClassifier

    joblib.dump(RandomForestClassifier(n_estimators=20, random_state=0).fit(x, y), path)


def _xgboost(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    import xgboost as xgb

    params = {"max_depth": 3, "objective": "multi:softprob", "num_class": 10}
    xgb.train(params, xgb.DMatrix(x, label=y), 5).save_model(str(path))


def _lightgbm(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    import lightgbm as lgb

    params = {"objective": "multiclass", "num_class": 10, "verbose": -1}
    lgb.train(params, lgb.Dataset(x, label=y), num_boost_round=5).save_model(str(path))


@pytest.mark.parametrize(
    ("fmt", "file", "fit", "outputs"),
    [
        ("sklearn", "model.joblib", _forest, ("predict", "predict_proba")),
        ("xgboost", "model.json", _xgboost, ("predict",)),
        ("lightgbm", "model.txt", _lightgbm, ("predict",)),
    ],
    ids=["forest", "xgboost", "lightgbm"],
)
def test_each_request_of_a_stacked_call_gets_its_answer_bit_for_bit(
    tmp_path: Path, fmt: str, file: str, fit: Any, outputs: tuple[str, ...]
) -> None:
    x, y = _digits()
    fit(tmp_path / file, x[:600], y[:600])
    config = f"models:\n  - {{name: m, modelFormat: {{name: {fmt}}}, storageUri: ./{file}}}\n"
    rows = [x[700 + 4 * i : 700 + 4 * i + 1 + i % 4] for i in range(16)]

    async def scenario() -> None:
        kit = await _started(compile_plan(parse_config(config), tmp_path))
        requests = [_request("m", r, *outputs) for r in rows]
        together, alone = await _together_then_alone(kit.dataplane, requests)
        assert kit.dataplane.statistics.of("m", 1).execution_count == 1 + len(rows)
        _same(together, alone)
        await kit.stop()

    asyncio.run(scenario())


def _settings(config: str, tmp_path: Path) -> ExecutorSettings:
    (plan,) = compile_plan(parse_config("models:\n" + config), tmp_path).models
    return ExecutorSettings.of(plan, 0)


def test_row_wise_formats_batch_unless_max_batch_size_says_otherwise(tmp_path: Path) -> None:
    for fmt in ("sklearn", "xgboost", "lightgbm"):
        given = f"  - {{name: m, modelFormat: {{name: {fmt}}}, storageUri: ./m"
        assert _settings(given + "}", tmp_path).batch_rows == ROW_BATCH
        assert _settings(given + ", convert: onnx}", tmp_path).batch_rows == ROW_BATCH
        # Triton's meaning of maxBatchSize alone: rows are bounded, nothing is stacked
        assert _settings(given + ", maxBatchSize: 8}", tmp_path).batch_rows == 0
        with_batching = given + ", maxBatchSize: 8, dynamicBatching: {}}"
        assert _settings(with_batching, tmp_path).batch_rows == 8
    for fmt in ("onnx", "mlflow"):  # an ONNX model's dimensions, a pyfunc's code: unknown
        given = f"  - {{name: m, modelFormat: {{name: {fmt}}}, storageUri: ./m}}"
        assert _settings(given, tmp_path).batch_rows == 0


def test_a_lone_request_of_a_batching_model_in_threads_starts_without_a_loop_pass(
    tmp_path: Path,
) -> None:
    """Alone on the server, a request for a batching model that runs in its threads starts its
    call at once (at one connection, a loop pass spent waiting for company nobody brings);
    with others in progress it waits that one pass for them."""
    release = threading.Event()

    def gate(x: Any) -> Any:
        assert release.wait(10)
        return x

    config = (
        "models:\n  - name: m\n    modelFormat: {name: python}\n"
        f"    entrypoint: {register_object(gate)}\n"
        "    inputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
        "    outputs: [{name: y, datatype: FP32, shape: [-1]}]\n"
        "    maxBatchSize: 8\n    dynamicBatching: {}\n"
    )
    request = InferRequest("m", [Tensor("x", "FP32", (1,), np.ones(1, np.float32))])

    async def scenario() -> None:
        kit = await _started(compile_plan(parse_config(config), tmp_path))
        _, version = kit.repository.resolve("m", None)
        executor = version.executor
        assert isinstance(executor, ModelExecutor)
        for held, seen in ((1, (0, 1)), (3, (1, 0))):  # (queued, running) one pass later
            kit.state.requests_in_progress = lambda held=held: held  # type: ignore[misc]
            release.clear()
            task = asyncio.ensure_future(kit.dataplane.infer(request))
            await asyncio.sleep(0)  # the request's first step runs: it reaches the executor
            assert executor.load() == seen
            release.set()
            assert np.asarray((await task).outputs[0].data).tolist() == [1.0]
        await kit.stop()

    asyncio.run(scenario())
