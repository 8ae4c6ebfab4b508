"""Which models may run on the event loop: ONNX Runtime sessions and the tabular libraries' own
models measured fast, never Python code.

In process (fast tier), through the DataPlane: a Python model stays in its worker threads however
fast it is measured, batching or not, as does a pickled estimator holding a function of the
user's, while an ONNX model or a scikit-learn estimator made of scikit-learn's own classes
measured fast moves onto the loop (the hot path). That a blocked Python call cannot hold the
liveness probes of a real server is tests/test_liveness_e2e.py.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import joblib
import lightgbm
import numpy as np
import onnx
import pytest
import xgboost
from onnx_builders import mlp
from sklearn.compose import make_column_selector, make_column_transformer
from sklearn.ensemble import RandomForestClassifier, VotingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, OneHotEncoder, StandardScaler
from sklearn.svm import SVC

from servekit.config.compiler import compile_plan
from servekit.config.loader import parse_config
from servekit.models.repository import VersionEntry
from servekit.runtimes.onnx import OnnxModel
from servekit.runtimes.python import PythonModel, register_object
from servekit.runtimes.sklearn import library_code_only
from servekit.server import ServeKit
from servekit.services.execution import placement
from servekit.services.execution.executor import ModelExecutor
from servekit.services.execution.placement import Mode
from servekit.types import InferRequest, Tensor

ROOMY = "server: {inlineBelowMicroseconds: 100000}\n"
"""A bound no call of these tiny models reaches, even on a busy machine: were a Python model
allowed onto the loop, it would get there."""
BATCHING = "    maxBatchSize: 8\n    dynamicBatching: {maxQueueDelayMicroseconds: 100}\n"


def test_the_runtimes_say_whether_they_may_run_inline() -> None:
    assert OnnxModel.may_run_inline is True
    assert PythonModel.may_run_inline is False


def _executor(kit: ServeKit, name: str) -> ModelExecutor:
    version: VersionEntry = kit.repository.resolve(name, None)[1]
    assert isinstance(version.executor, ModelExecutor)
    return version.executor


@pytest.mark.parametrize("extra", ["", BATCHING], ids=["unbatched", "batching"])
def test_a_fast_python_model_never_runs_on_the_loop(tmp_path: Path, extra: str) -> None:
    threads: list[str] = []

    def fast(x: Any) -> Any:
        threads.append(threading.current_thread().name)
        return x * 2

    entry = (
        f"  - name: fast\n    modelFormat: {{name: python}}\n    entrypoint: "
        f"{register_object(fast)}\n"
        "    inputs: [{name: x, datatype: FP32, shape: [-1]}]\n"
        "    outputs: [{name: y, datatype: FP32, shape: [-1]}]\n" + extra
    )

    async def scenario() -> None:
        kit = ServeKit(compile_plan(parse_config(ROOMY + "models:\n" + entry), tmp_path))
        await kit.control.start()
        kit.state.requests_in_progress = lambda: 1  # alone: a batching lone request may go inline
        try:
            x = np.ones(2, np.float32)
            for _ in range(placement.LEARN_SLOW + 5):
                answer = await kit.dataplane.infer(
                    InferRequest("fast", [Tensor("x", "FP32", (2,), x)])
                )
                assert answer.outputs[0].data.tolist() == [2.0, 2.0]
            assert _executor(kit, "fast").mode is Mode.THREADS
            assert threading.current_thread().name not in threads
        finally:
            await kit.stop()

    asyncio.run(scenario())


def test_a_fast_onnx_model_moves_onto_the_loop(tmp_path: Path) -> None:
    onnx.save(mlp(16, 8, 4), tmp_path / "m.onnx")
    entry = "  - name: m\n    modelFormat: {name: onnx}\n    storageUri: ./m.onnx\n"

    async def scenario() -> None:
        kit = ServeKit(compile_plan(parse_config(ROOMY + "models:\n" + entry), tmp_path))
        await kit.control.start()
        try:
            x = np.ones((1, 16), np.float32)
            for _ in range(placement.LEARN_FAST + 1):
                await kit.dataplane.infer(InferRequest("m", [Tensor("input", "FP32", x.shape, x)]))
            assert _executor(kit, "m").mode is Mode.INLINE
        finally:
            await kit.stop()

    asyncio.run(scenario())


CALLED_FROM: list[str] = []
"""The threads ``_recorded`` ran in (a module-level function, so a pickle can name it)."""


def _recorded(x: Any) -> Any:
    CALLED_FROM.append(threading.current_thread().name)
    return x


class _OwnRegression(LogisticRegression):  # type: ignore[misc]
    """An estimator class of the user's: its code could do anything."""


@pytest.mark.parametrize(
    ("estimator", "library_only"),
    [
        (SVC(), True),
        (make_pipeline(StandardScaler(), LogisticRegression()), True),
        (make_pipeline(OneHotEncoder(), LogisticRegression()), True),  # dtype=np.float64
        (FunctionTransformer(np.log1p), True),  # a numpy ufunc
        (make_column_transformer((StandardScaler(), make_column_selector(float))), True),
        (VotingClassifier([("a", LogisticRegression()), ("b", RandomForestClassifier())]), True),
        (FunctionTransformer(_recorded), False),
        (make_pipeline(FunctionTransformer(lambda x: x), LogisticRegression()), False),
        (SVC(kernel=lambda a, b: a @ b.T), False),
        (_OwnRegression(), False),
        (make_pipeline(StandardScaler(), _OwnRegression()), False),
        (make_pipeline(StandardScaler(), LogisticRegression(), memory=joblib.Memory(None)), False),
        (OneHotEncoder(categories=[np.array(["a", None], dtype=object)]), True),
        (OneHotEncoder(categories=[np.array([_recorded], dtype=object)]), False),
    ],
    ids=[
        "svc", "pipeline", "one-hot", "ufunc", "column-selector", "voting", "users-function",
        "lambda-in-pipeline", "callable-kernel", "users-class", "users-class-in-pipeline",
        "joblib-memory", "object-array", "function-in-object-array",
    ],
)  # fmt: skip
def test_an_estimator_is_library_code_only_when_no_part_is_anyone_elses(
    estimator: Any, library_only: bool
) -> None:
    assert library_code_only(estimator) is library_only


def _fitted(estimator: Any, path: Path) -> np.ndarray:
    """``estimator`` fitted on a tiny two-class problem, saved to ``path``; a row to ask."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 4))
    estimator.fit(x, (x[:, 0] > 0).astype(int))
    joblib.dump(estimator, path)
    return x[:1]


@pytest.mark.parametrize("extra", ["", BATCHING], ids=["unbatched", "batching"])
def test_a_fast_sklearn_estimator_moves_onto_the_loop(tmp_path: Path, extra: str) -> None:
    estimator = make_pipeline(StandardScaler(), LogisticRegression())
    row = _fitted(estimator, tmp_path / "m.joblib")
    entry = "  - name: m\n    modelFormat: {name: sklearn}\n    storageUri: ./m.joblib\n" + extra

    async def scenario() -> None:
        kit = ServeKit(compile_plan(parse_config(ROOMY + "models:\n" + entry), tmp_path))
        await kit.control.start()
        kit.state.requests_in_progress = lambda: 1  # alone: a batching lone request may go inline
        try:
            for _ in range(placement.LEARN_FAST + 1):
                answer = await kit.dataplane.infer(
                    InferRequest("m", [Tensor("input-0", "FP64", row.shape, row)])
                )
                assert answer.outputs[0].data.tolist() == estimator.predict(row).tolist()
            assert _executor(kit, "m").mode is Mode.INLINE
        finally:
            await kit.stop()

    asyncio.run(scenario())


def test_an_estimator_holding_the_users_function_never_runs_on_the_loop(tmp_path: Path) -> None:
    row = _fitted(
        make_pipeline(FunctionTransformer(_recorded), LogisticRegression()), tmp_path / "m.joblib"
    )
    entry = "  - name: m\n    modelFormat: {name: sklearn}\n    storageUri: ./m.joblib\n"

    async def scenario() -> None:
        kit = ServeKit(compile_plan(parse_config(ROOMY + "models:\n" + entry), tmp_path))
        await kit.control.start()
        kit.state.requests_in_progress = lambda: 1
        CALLED_FROM.clear()
        try:
            for _ in range(placement.LEARN_SLOW + 5):
                await kit.dataplane.infer(
                    InferRequest("m", [Tensor("input-0", "FP64", row.shape, row)])
                )
            assert _executor(kit, "m").mode is Mode.THREADS
            assert len(CALLED_FROM) == placement.LEARN_SLOW + 5
            assert threading.current_thread().name not in CALLED_FROM
        finally:
            await kit.stop()

    asyncio.run(scenario())


def test_xgboost_and_lightgbm_model_files_may_run_on_the_loop(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(60, 3))
    y = (x[:, 0] > 0).astype(int)
    xgboost.XGBClassifier(n_estimators=3, max_depth=2).fit(x, y).save_model(tmp_path / "x.json")
    booster = lightgbm.train(
        {"objective": "binary", "verbose": -1}, lightgbm.Dataset(x, y), num_boost_round=3
    )
    booster.save_model(str(tmp_path / "l.txt"))
    entries = (
        "  - {name: x, modelFormat: {name: xgboost}, storageUri: ./x.json}\n"
        "  - {name: l, modelFormat: {name: lightgbm}, storageUri: ./l.txt}\n"
    )

    async def scenario() -> None:
        kit = ServeKit(compile_plan(parse_config(ROOMY + "models:\n" + entries), tmp_path))
        await kit.control.start()
        try:
            for name in ("x", "l"):
                runtime = kit.repository.resolve(name, None)[1].runtime
                assert runtime is not None and runtime.may_run_inline is True
        finally:
            await kit.stop()

    asyncio.run(scenario())
