"""MLServer project folders served by servekit, answered as a real MLServer 1.7.1 answers them.

The folders are MLServer's own examples (SeldonIO/MLServer ``docs/examples/``: ``sklearn``,
``xgboost``, ``lightgbm``, ``mms``, ``model-repository``), written here with the same file names
and the same ``settings.json`` / ``model-settings.json`` fields, their models trained in the test
on the same data shapes (no downloads). The slow tests start ``mlserver start FOLDER`` and
``servekit serve FOLDER`` on the same folder, send the requests the examples' READMEs send, and
compare the answers field by field. MLServer runs with ``MLSERVER_PARALLEL_WORKERS=0`` (its
inference worker processes do not start under this environment's uvloop), which changes where
MLServer runs the model, not what it answers. MLServer's runtimes are never imported here: its
package ``__init__`` cannot be imported beside servekit's protos (tests/mlserver_codecs.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlserver_server import mlserver_started
from servers import start_server
from waits import wait_until

from servekit.cli import main as cli_main
from servekit.config import mlserver_project
from servekit.config.loader import parse_config
from servekit.config.overrides import load_plan

MLSERVER_VERSION = "v0.1.0"


# -- the example folders ---------------------------------------------------------------------
def _json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=4), encoding="utf-8")


def _settings(name: str, implementation: str, uri: str | None = None) -> dict[str, Any]:
    parameters: dict[str, Any] = {"version": MLSERVER_VERSION}
    if uri is not None:
        parameters = {"uri": uri, **parameters}
    return {"name": name, "implementation": implementation, "parameters": parameters}


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn import datasets

    digits = datasets.load_digits()
    return digits.images.reshape(len(digits.images), -1), digits.target


def _svm(path: Path) -> np.ndarray:
    """MLServer's sklearn example: an SVC on the 8x8 digits; its first test row."""
    import joblib
    from sklearn import svm

    x, y = _digits()
    classifier = svm.SVC(gamma=0.001)
    classifier.fit(x[: len(x) // 2], y[: len(y) // 2])
    path.parent.mkdir(parents=True, exist_ok=True)
    joblib.dump(classifier, path)
    return x[len(x) // 2 : len(x) // 2 + 1]


def _mushrooms(path: Path) -> np.ndarray:
    """MLServer's xgboost example: a binary:logistic Booster on the 126 one-hot mushroom
    features (agaricus), saved as JSON; a test row."""
    import xgboost as xgb

    rng = np.random.default_rng(0)
    x = (rng.random((300, 126)) < 0.2).astype(np.float32)
    y = (x[:, 3] + x[:, 7] > 0).astype(np.float32)
    booster = xgb.train(
        {"max_depth": 2, "eta": 1, "objective": "binary:logistic"}, xgb.DMatrix(x, label=y), 2
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(path))
    return x[:1]


def _iris(path: Path) -> np.ndarray:
    """MLServer's lightgbm example: a multiclass Booster on iris; a test row."""
    import lightgbm as lgb
    from sklearn import datasets

    x, y = datasets.load_iris(return_X_y=True)
    params = {"objective": "multiclass", "num_class": 3, "verbose": -1}
    booster = lgb.train(params, lgb.Dataset(x, label=y), num_boost_round=5)
    path.parent.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(path))
    return x[:1]


def sklearn_example(folder: Path) -> list[tuple[str, np.ndarray]]:
    row = _svm(folder / "mnist-svm.joblib")
    _json(folder / "settings.json", {"debug": "true"})
    uri = "./mnist-svm.joblib"
    _json(folder / "model-settings.json", _settings("mnist-svm", SKLEARN, uri))
    return [("mnist-svm", row)]


def xgboost_example(folder: Path) -> list[tuple[str, np.ndarray]]:
    row = _mushrooms(folder / "mushroom-xgboost.json")
    _json(folder / "settings.json", {"debug": "true"})
    uri = "./mushroom-xgboost.json"
    _json(folder / "model-settings.json", _settings("mushroom-xgboost", XGBOOST, uri))
    return [("mushroom-xgboost", row)]


def lightgbm_example(folder: Path) -> list[tuple[str, np.ndarray]]:
    row = _iris(folder / "iris-lightgbm.bst")
    _json(folder / "settings.json", {"debug": "true"})
    uri = "./iris-lightgbm.bst"
    _json(folder / "model-settings.json", _settings("iris-lgb", LIGHTGBM, uri))
    return [("iris-lgb", row)]


def mms_example(folder: Path) -> list[tuple[str, np.ndarray]]:
    """``mms`` and ``model-repository``: two models in folders of their own, no ``uri``."""
    digits = _svm(folder / "models" / "mnist-svm" / "model.joblib")
    mushroom = _mushrooms(folder / "models" / "mushroom-xgboost" / "model.json")
    _json(folder / "settings.json", {"debug": "true"})
    for name, implementation in (("mnist-svm", SKLEARN), ("mushroom-xgboost", XGBOOST)):
        _json(folder / "models" / name / "model-settings.json", _settings(name, implementation))
    return [("mnist-svm", digits), ("mushroom-xgboost", mushroom)]


WINE = [
    "fixed acidity",
    "volatile acidity",
    "citric acid",
    "residual sugar",
    "chlorides",
    "free sulfur dioxide",
    "total sulfur dioxide",
    "density",
    "pH",
    "sulphates",
    "alcohol",
]
WINE_ROW = [7.4, 0.7, 0, 1.9, 0.076, 11, 34, 0.9978, 3.51, 0.56, 9.4]
"""The mlflow README's request: one FP32 input of shape [1] per wine column."""


def mlflow_example(folder: Path) -> list[tuple[str, np.ndarray]]:
    """MLServer's mlflow example: an ElasticNet on the 11 wine-quality columns saved by MLflow
    with its signature, at the README's ``mlruns/0/<run>/artifacts/model``."""
    import warnings

    import pandas as pd
    from sklearn.linear_model import ElasticNet

    with warnings.catch_warnings():  # MLflow warns on its own imports
        warnings.simplefilter("ignore")
        import mlflow.sklearn
        from mlflow.models import infer_signature

        rng = np.random.default_rng(0)
        x = pd.DataFrame(rng.random((100, len(WINE))) * 10, columns=WINE)
        model = ElasticNet(alpha=0.5, l1_ratio=0.5).fit(x, x["alcohol"] * 0.3 + 2)
        uri = "./mlruns/0/6cd26d62883641188b4f7616725ed838/artifacts/model"
        signature = infer_signature(x, model.predict(x))
        mlflow.sklearn.save_model(
            model, str(folder / uri), signature=signature, serialization_format="cloudpickle"
        )
    settings = {"name": "wine-classifier", "implementation": MLFLOW, "parameters": {"uri": uri}}
    _json(folder / "model-settings.json", settings)
    return [("wine-classifier", np.array([WINE_ROW]))]


SKLEARN = "mlserver_sklearn.SKLearnModel"
XGBOOST = "mlserver_xgboost.XGBoostModel"
LIGHTGBM = "mlserver_lightgbm.LightGBMModel"
MLFLOW = "mlserver_mlflow.MLflowRuntime"
EXAMPLES = {
    "sklearn": sklearn_example,
    "xgboost": xgboost_example,
    "lightgbm": lightgbm_example,
    "mlflow": mlflow_example,
    "mms": mms_example,
    "model-repository": mms_example,
}


# -- the folder as a config (in process) -----------------------------------------------------
def test_the_sklearn_example_is_a_config(tmp_path: Path) -> None:
    sklearn_example(tmp_path)
    converted = mlserver_project.convert(tmp_path, environ={})
    assert converted.config == {
        "server": {"grpcAnswers": "asSent"},  # as MLServer: typed answers to typed requests
        "models": [
            {
                "name": "mnist-svm",
                "modelFormat": {"name": "sklearn"},
                "storageUri": "mnist-svm.joblib",
                "versionLabels": {MLSERVER_VERSION: 1},
            }
        ],
    }
    assert converted.notes == []  # `debug` has no meaning here and is not worth a warning
    plan = load_plan(tmp_path)
    (model,) = plan.models
    assert (model.name, model.implementation, model.problem) == ("mnist-svm", "sklearn", None)
    assert model.versions[0].path == tmp_path.resolve() / "mnist-svm.joblib"


def test_every_model_settings_file_is_a_model(tmp_path: Path) -> None:
    mms_example(tmp_path)
    config = mlserver_project.convert(tmp_path, environ={}).config
    assert [(m["name"], m["modelFormat"]["name"], m["storageUri"]) for m in config["models"]] == [
        ("mnist-svm", "sklearn", "models/mnist-svm/model.joblib"),
        ("mushroom-xgboost", "xgboost", "models/mushroom-xgboost/model.json"),
    ]


def test_settings_and_environment_become_server_settings(tmp_path: Path) -> None:
    sklearn_example(tmp_path)
    settings = {"debug": True, "http_port": 9090, "server_name": "mine", "cors_settings": {}}
    _json(tmp_path / "settings.json", {**settings, "metrics_port": 9092})
    model = _settings("mnist-svm", SKLEARN, "./mnist-svm.joblib")
    batching = {"max_batch_size": 16, "max_batch_time": 0.002, "warm_workers": True}
    _json(tmp_path / "model-settings.json", {**model, **batching})
    environ = {"MLSERVER_GRPC_PORT": "9091", "MLSERVER_HTTP_PORT": "1"}  # the file wins
    converted = mlserver_project.convert(tmp_path, environ)
    assert converted.config["server"] == {
        "httpPort": 9090,
        "grpcPort": 9091,
        "name": "mine",
        "grpcAnswers": "asSent",
    }
    (entry,) = converted.config["models"]
    assert entry["maxBatchSize"] == 16
    assert entry["dynamicBatching"] == {"maxQueueDelayMicroseconds": 2000}
    assert converted.notes == [
        "settings.json: cors_settings",
        "settings.json: metrics_port",
        "model-settings.json: warm_workers",
    ]


def test_kserve_environment_names_the_model(tmp_path: Path) -> None:
    """kserve-mlserver's pod: no model-settings.json, the model told by the environment."""
    mounted = tmp_path / "mnt" / "models"
    _svm(mounted / "model.joblib")
    environ = {
        "MLSERVER_MODEL_IMPLEMENTATION": SKLEARN,
        "MLSERVER_MODEL_NAME": "sklearn-iris",
        "MLSERVER_MODEL_URI": str(mounted),
        "MLSERVER_HTTP_PORT": "8080",
        "MLSERVER_GRPC_PORT": "9000",
    }
    project = tmp_path / "project"
    _json(project / "settings.json", {})
    config = mlserver_project.convert(project, environ).config
    assert config["server"] == {"httpPort": 8080, "grpcPort": 9000, "grpcAnswers": "asSent"}
    assert config["models"] == [
        {
            "name": "sklearn-iris",
            "modelFormat": {"name": "sklearn"},
            "storageUri": str(mounted / "model.joblib"),
        }
    ]


def test_convert_prints_a_serve_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sklearn_example(tmp_path)
    _json(tmp_path / "settings.json", {"debug": "true", "metrics_port": 8082})
    monkeypatch.chdir(tmp_path)
    assert cli_main(["convert", "mlserver", "."]) == 0
    text = capsys.readouterr().out
    assert "#   settings.json: metrics_port" in text
    (tmp_path / "serve.yaml").write_text(text, encoding="utf-8")
    config = parse_config(text)
    assert config.models[0].storage_uri == "mnist-svm.joblib"
    assert not mlserver_project.is_project(tmp_path)  # a serve.yaml beside it now decides
    assert cli_main(["validate", str(tmp_path / "serve.yaml")]) == 0


def test_validate_reads_the_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mms_example(tmp_path)
    assert cli_main(["validate", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "mnist-svm: format sklearn" in out and "mushroom-xgboost: format xgboost" in out


def test_a_broken_model_settings_file_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "model-settings.json").write_text("{not json", encoding="utf-8")
    assert cli_main(["validate", str(tmp_path)]) == 1
    assert "model-settings.json: (top level): invalid JSON" in capsys.readouterr().err
    _json(tmp_path / "model-settings.json", {"name": "x", "implementation": "NoModule"})
    assert cli_main(["validate", str(tmp_path)]) == 1
    assert "write it as module.Class" in capsys.readouterr().err
    assert cli_main(["convert", "mlserver", str(tmp_path / "elsewhere")]) == 1
    assert "no such file" in capsys.readouterr().err


# -- the same folder under MLServer 1.7.1 and servekit ---------------------------------------
@contextmanager
def real_mlserver(folder: Path) -> Iterator[str]:
    """``mlserver start FOLDER`` (MLServer 1.7.1, the test extra): its REST address."""
    with mlserver_started(folder) as mlserver:
        yield mlserver.url


def _readme_request(name: str, row: np.ndarray) -> dict[str, Any]:
    """The request the examples' READMEs send: one FP32 row named ``predict`` (the mlflow
    README: one FP32 input per column)."""
    if name == "wine-classifier":
        return {"inputs": [{"name": column, "shape": [1], "datatype": "FP32", "data": [value]}
                           for column, value in zip(WINE, row[0], strict=True)]}  # fmt: skip
    return {"inputs": [{"name": "predict", "shape": list(row.shape), "datatype": "FP32",
                        "data": row.astype(np.float32).tolist()}]}  # fmt: skip


def _path(name: str) -> str:
    """The README's route: the version MLServer's settings name (the mlflow README has none)."""
    if name == "wine-classifier":
        return f"/v2/models/{name}/infer"
    return f"/v2/models/{name}/versions/{MLSERVER_VERSION}/infer"


def _outputs(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: o.get(k) for k in ("name", "datatype", "shape", "parameters")}
            for o in answer["outputs"]]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_servekit_answers_as_mlserver(tmp_path: Path, example: str) -> None:
    import httpx

    folder = tmp_path / example
    rows = EXAMPLES[example](folder)
    answers: dict[str, list[dict[str, Any]]] = {}
    with real_mlserver(folder) as url:
        answers["mlserver"] = [
            httpx.post(f"{url}{_path(name)}", json=_readme_request(name, row), timeout=30).json()
            for name, row in rows
        ]
    served = start_server(folder, grpc=False)
    try:
        answers["servekit"] = [
            httpx.post(
                f"{served.http_url}{_path(name)}", json=_readme_request(name, row), timeout=30
            ).json()
            for name, row in rows
        ]
    finally:
        assert served.stop() == 0, served.log()
    for mine, theirs in zip(answers["servekit"], answers["mlserver"], strict=True):
        assert "error" not in mine, mine
        assert mine["model_name"] == theirs["model_name"]
        if example == "mlflow":  # MLServer names an MLflow model's unnamed output "output-1";
            for output in theirs["outputs"]:  # servekit's MLflow runtime calls it "predict"
                output["name"] = "predict"
        assert _outputs(mine) == _outputs(theirs)
        for ours, real in zip(mine["outputs"], theirs["outputs"], strict=True):
            np.testing.assert_allclose(ours["data"], real["data"], rtol=1e-6)


@pytest.mark.slow
def test_the_model_repository_example(tmp_path: Path) -> None:
    """``model-repository``'s README: the index, an unload, the index, a load, the index."""
    import httpx

    folder = tmp_path / "model-repository"
    mms_example(folder)

    def walk(url: str) -> list[Any]:
        seen: list[Any] = []
        seen.append(httpx.post(f"{url}/v2/repository/index", json={}).json())
        unloaded = httpx.post(f"{url}/v2/repository/models/mushroom-xgboost/unload")
        seen.append(unloaded.status_code)
        seen.append(httpx.post(f"{url}/v2/repository/index", json={}).json())
        loaded = httpx.post(f"{url}/v2/repository/models/mushroom-xgboost/load", timeout=60)
        seen.append(loaded.status_code)
        seen.append(httpx.post(f"{url}/v2/repository/index", json={}).json())
        return seen

    with real_mlserver(folder) as url:
        theirs = walk(url)
    served = start_server(folder, grpc=False)
    try:
        mine = walk(served.http_url)
    finally:
        assert served.stop() == 0, served.log()

    def states(seen: list[Any]) -> list[Any]:
        index = [0, 2, 4]  # the index after each step; 1 and 3: the unload's and load's status
        return [sorted((r["name"], r["state"]) for r in x) if i in index else x
                for i, x in enumerate(seen)]  # fmt: skip

    assert states(mine) == states(theirs)


# -- custom runtimes: the user's MLModel subclass --------------------------------------------
NUMPYRO_STAND_IN = '''
import json
from typing import Optional

import numpy as np
from mlserver import MLModel
from mlserver.codecs import decode_args
from mlserver.utils import get_model_uri


class NumpyroModel(MLModel):
    """MLServer's custom example with numpyro and jax swapped for their arithmetic: the same
    load (samples read through get_model_uri), the same @decode_args predict and shapes."""

    async def load(self) -> bool:
        model_uri = await get_model_uri(self._settings)
        with open(model_uri) as model_file:
            raw_samples = json.load(model_file)
        self._samples = {k: np.array(v) for k, v in raw_samples.items()}
        return True

    @decode_args
    async def predict(
        self,
        marriage: Optional[np.ndarray] = None,
        age: Optional[np.ndarray] = None,
        divorce: Optional[np.ndarray] = None,
    ) -> np.ndarray:
        mu = self._samples["a"].mean()
        if marriage is not None:
            mu = mu + self._samples["bM"].mean() * marriage
        if age is not None:
            mu = mu + self._samples["bA"].mean() * age
        return np.asarray(np.mean(mu))
'''


def custom_example(folder: Path) -> None:
    """MLServer's ``custom`` example: models.py, numpyro-divorce.json, model-settings.json."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "models.py").write_text(NUMPYRO_STAND_IN, encoding="utf-8")
    samples = {"a": [0.01, -0.02, 0.03], "bM": [0.35, 0.4, 0.45], "bA": [-0.6, -0.55, -0.5]}
    _json(folder / "numpyro-divorce.json", samples)
    _json(folder / "settings.json", {"debug": "true"})
    model = {"name": "numpyro-divorce", "implementation": "models.NumpyroModel",
             "parameters": {"uri": "./numpyro-divorce.json"}}  # fmt: skip
    _json(folder / "model-settings.json", model)


CUSTOM_REQUEST = {  # NumpyCodec.encode_input(name="marriage", payload=np.array([28.0]))
    "inputs": [{"name": "marriage", "shape": [1], "datatype": "FP64",
                "parameters": {"content_type": "np"}, "data": [28.0]}]
}  # fmt: skip


@pytest.mark.slow
def test_a_custom_runtime_answers_as_in_mlserver(tmp_path: Path) -> None:
    import httpx

    folder = tmp_path / "custom"
    custom_example(folder)
    with real_mlserver(folder) as url:
        theirs = httpx.post(f"{url}/v2/models/numpyro-divorce/infer", json=CUSTOM_REQUEST).json()
    served = start_server(folder, grpc=False)
    try:
        mine = httpx.post(
            f"{served.http_url}/v2/models/numpyro-divorce/infer", json=CUSTOM_REQUEST
        ).json()
    finally:
        assert served.stop() == 0, served.log()
    assert "error" not in mine, mine
    assert _outputs(mine) == _outputs(theirs)
    np.testing.assert_allclose(mine["outputs"][0]["data"], theirs["outputs"][0]["data"])


BROKEN = """
import time

import mlserver
import numpy as np
from mlserver import MLModel
from mlserver.codecs import StringCodec, decode_args
from mlserver.types import InferenceResponse


class Echo(MLModel):
    @decode_args
    async def predict(self, x: np.ndarray) -> np.ndarray:
        return x


class FailsToLoad(Echo):
    async def load(self) -> bool:
        raise RuntimeError("no weights here")


class Refuses(Echo):
    async def load(self) -> bool:
        return False


class Raises(MLModel):
    @decode_args
    async def predict(self, x: np.ndarray) -> np.ndarray:
        raise ValueError("the model refuses this")


class Logs(MLModel):
    @decode_args
    async def predict(self, x: np.ndarray) -> np.ndarray:
        mlserver.log(rows_seen=len(x))
        return x


class Words(MLModel):  # streams: one response per word of its prompt

    async def predict_stream(self, payloads):
        async for payload in payloads:
            text = StringCodec.decode_input(payload.inputs[0])[0]
            for word in text.split():
                yield InferenceResponse(
                    model_name=self.name,
                    outputs=[StringCodec.encode_output("text_output", [word])],
                )


class Hangs(MLModel):
    @decode_args
    async def predict(self, x: np.ndarray) -> np.ndarray:
        time.sleep(3600)
        return x


class Stalls(MLModel):  # in the server's process, far slower than the request's deadline
    @decode_args
    async def predict(self, x: np.ndarray) -> np.ndarray:
        time.sleep(4)  # not forever: a thread cannot be stopped, and the server's stop waits
        return x  # for it (server.drainSeconds, 5 s)
"""


@pytest.mark.slow
def test_a_broken_custom_runtime_gets_a_python_models_errors(tmp_path: Path) -> None:
    """load() raising or returning False, predict() raising or hanging (isolated: killed at
    its timeoutSeconds; in the server's process: answered at the request's deadline), a module
    that does not import: each model says why, the others serve (one logging metrics, one
    streaming with predict_stream)."""
    import httpx

    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "broken.py").write_text(BROKEN, encoding="utf-8")
    for name in ("FailsToLoad", "Refuses", "Raises", "Logs", "Hangs", "Stalls"):
        settings = {"name": name.lower(), "implementation": f"broken.{name}"}
        _json(folder / "models" / name.lower() / "model-settings.json", settings)
    words = {"name": "words", "implementation": "broken.Words",
             "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1]}],
             "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1]}]}  # fmt: skip
    _json(folder / "models" / "words" / "model-settings.json", words)
    missing_module = {"name": "nomodule", "implementation": "not_there.Model"}
    _json(folder / "models" / "nomodule" / "model-settings.json", missing_module)
    # The converted serve.yaml, with the hanging model isolated as any Python model may be.
    config = mlserver_project.convert(folder, environ={}).config
    for model in config["models"]:
        if model["name"] == "hangs":
            model.update(isolation="process", timeoutSeconds=2)
    (folder / "serve.yaml").write_text(json.dumps(config), encoding="utf-8")
    served = start_server(folder / "serve.yaml", grpc=False, wait_ready=False)
    try:
        url = served.http_url

        def index() -> dict[str, dict[str, Any]]:
            rows = httpx.post(f"{url}/v2/repository/index", json={}).json()
            return {row["name"]: row for row in rows}

        wait_until(lambda: all(r["state"] != "LOADING" for r in index().values()), 60)
        rows = index()
        assert "no weights here" in rows["failstoload"]["reason"], rows
        assert "load() returned False" in rows["refuses"]["reason"], rows
        assert "cannot import 'not_there'" in rows["nomodule"]["reason"], rows
        request = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP64", "data": [1.0]}]}
        raised = httpx.post(f"{url}/v2/models/raises/infer", json=request)
        assert raised.status_code == 500
        assert "the model raised ValueError: the model refuses this" in raised.json()["error"]
        logged = httpx.post(f"{url}/v2/models/logs/infer", json=request)
        assert logged.status_code == 200, logged.text
        assert logged.json()["outputs"][0]["data"] == [1.0], logged.text
        metrics = httpx.get(f"{url}/metrics").text  # mlserver.log: a histogram of the model's
        assert 'rows_seen_count{model="logs",version="1"} 1' in metrics, metrics[-2000:]
        body = {"text_input": "to be or not"}
        with httpx.stream("POST", f"{url}/v2/models/words/generate_stream", json=body) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        events = [json.loads(line.removeprefix("data: ")) for line in lines]
        assert all("text_output" in e for e in events), events
        assert [e["text_output"] for e in events] == ["to", "be", "or", "not"]
        hung = httpx.post(f"{url}/v2/models/hangs/infer", json=request, timeout=30)
        assert hung.status_code == 503, hung.text
        assert "ran past timeoutSeconds (2 s); its process was killed" in hung.json()["error"]
        # Triton's timeout parameter (microseconds): the request's deadline, 0.5 s from now
        timed = {**request, "parameters": {"timeout": 500_000}}
        stalled = httpx.post(f"{url}/v2/models/stalls/infer", json=timed, timeout=30)
        assert stalled.status_code == 504, stalled.text
        assert "deadline" in stalled.json()["error"].lower(), stalled.text
        assert httpx.post(f"{url}/v2/models/raises/infer", json=request).status_code == 500
        assert httpx.post(f"{url}/v2/models/logs/infer", json=request).status_code == 200
    finally:
        assert served.stop() == 0, served.log()
