"""KServe's pod contract in servekit's built image under podman: the runtime's container run as
the kubelet runs it (tests/kserve_pod.py's ``start_pod_in_image``), not this checkout's code on
the host.

* ``kserve-servekit`` (``servekit export kserve --cluster-runtime --image IMAGE``) serves an
  sklearn folder, answering KServe's V1, V2 and gRPC clients (test_sklearn.py's cases).
* ``kserve-mlserver``, KServe's own ClusterServingRuntime (tests/data/kserve-crds/
  kserve-mlserver.yaml) with only ``image:`` replaced by servekit's, answers KServe's
  ``*_v2_mlserver`` e2e cases (test_sklearn.py, test_xgboost.py, test_lightgbm.py): the same
  InferenceService shapes (the legacy ``predictor.sklearn`` form too), the env and label
  KServe's controller adds for a server-type ``mlserver`` runtime, the image's default command
  (no command, no args: it serves /mnt/models as MLServer's image would), KServe's request file
  and assertions. The models are trained here on iris; the files come from an S3 store (moto)
  through KServe's own storage initializer.

A runtime whose args, port or probe path are broken, or an image command that serves its own
serve.yaml instead of MLServer's folder, never turns ready here (test_a_broken_*).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from kserve_pod import (
    Pod,
    ask_clients,
    broken_runtime,
    pod_container,
    start_pod_in_image,
    storage_initializer,
)
from kserve_schemas import validate_kserve
from object_stores import moto_s3
from test_kserve_clients import kserve_python

# Training three models, then one container start a case: minutes on a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DATA = Path(__file__).with_name("data")
MLSERVER_RUNTIME = DATA / "kserve-crds" / "kserve-mlserver.yaml"
BUCKET = "kfserving-examples"
SKLEARN = f"s3://{BUCKET}/models/sklearn/1.0/model"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A moto S3 server holding the KServe e2e models' shapes under their gs:// keys, and the
    environment KServe's S3 credentials give the storage initializer."""
    with moto_s3(BUCKET) as (env, client):
        folder = tmp_path_factory.mktemp("trained")
        with warnings.catch_warnings():  # the libraries' own deprecation notes while training
            warnings.simplefilter("ignore")
            for key, path in _train(folder).items():
                client.upload_file(str(path), BUCKET, key)
        yield env


def _train(folder: Path) -> dict[str, Path]:
    """KServe's e2e models, trained on iris: an SVC (model.joblib), an XGBoost softmax booster
    and a LightGBM multiclass booster (both model.bst); their object keys."""
    import joblib
    import lightgbm as lgb
    import xgboost as xgb
    from sklearn import svm
    from sklearn.datasets import load_iris

    x, y = load_iris(return_X_y=True)
    joblib.dump(svm.SVC(gamma="scale").fit(x, y), folder / "model.joblib")
    booster = xgb.train({"objective": "multi:softmax", "num_class": 3}, xgb.DMatrix(x, label=y), 10)
    booster.save_model(folder / "xgb.bst")
    params = {"objective": "multiclass", "num_class": 3, "verbose": -1}
    lgb.train(params, lgb.Dataset(x, y), 20).save_model(folder / "lgb.bst")
    return {
        "models/sklearn/1.0/model/model.joblib": folder / "model.joblib",
        "models/xgboost/iris/model.bst": folder / "xgb.bst",
        "models/lightgbm/v2/iris/model.bst": folder / "lgb.bst",
    }


@pytest.fixture(scope="module")
def servekit_runtime(servekit_image: str) -> dict[str, Any]:
    """``servekit export kserve --cluster-runtime`` naming the built image."""
    out = subprocess.run(
        [sys.executable, "-m", "servekit", "export", "kserve", "--cluster-runtime",
         "--image", servekit_image],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (doc,) = yaml.safe_load_all(out.stdout)
    validate_kserve(doc)
    return dict(doc)


@pytest.fixture(scope="module")
def mlserver_runtime(servekit_image: str) -> dict[str, Any]:
    """KServe's kserve-mlserver ClusterServingRuntime with only ``image:`` replaced."""
    doc = yaml.safe_load(MLSERVER_RUNTIME.read_text())
    (container,) = doc["spec"]["containers"]
    assert container["image"] == "mlserver:replace"
    assert "command" not in container and "args" not in container  # the image's own command
    container["image"] = servekit_image
    validate_kserve(doc)
    return dict(doc)


@pytest.fixture
def pods() -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for pod in started:
        pod.stop()


def start(
    runtime: dict[str, Any],
    isvc: dict[str, Any],
    s3: dict[str, str],
    tmp_path: Path,
    podman_env: dict[str, str],
    pods: list[Pod],
) -> Pod:
    """Storage initializer into the pod's model folder, then the container in the image."""
    validate_kserve(isvc)
    predictor = isvc["spec"]["predictor"]
    (spec,) = [v for v in predictor.values() if isinstance(v, dict) and "storageUri" in v]
    models = tmp_path / "mnt-models"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    storage_initializer(kserve_python(), spec["storageUri"], models, {**env, **s3})
    container = pod_container(runtime, isvc)
    pod = start_pod_in_image(container, models, tmp_path / "container.log", podman_env)
    pods.append(pod)
    return pod


def ask(pod: Pod, calls: list[dict[str, Any]]) -> list[Any]:
    """KServe's clients (in KServe's venv, tests/kserve_pod_client.py) send ``calls`` to the
    pod's HTTP port 8080 (and gRPC 8081 where the pod has it); their answers, in order."""
    return ask_clients(kserve_python(), pod, calls)


def isvc_of(name: str, predictor: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": "kserve-ci-e2e-test"},
        "spec": {"predictor": {"minReplicas": 1, **predictor}},
    }


def ready_probe(name: str) -> dict[str, Any]:
    """The readinessProbe KServe's V2 e2e cases set: the model's own ready endpoint."""
    path = f"/v2/models/{name}/ready"
    return {"httpGet": {"path": path, "port": 8080}, "initialDelaySeconds": 30}


# --- kserve-servekit -------------------------------------------------------------------------


def test_servekit_runtime_in_image(
    servekit_runtime: dict[str, Any],
    s3: dict[str, str],
    tmp_path: Path,
    podman_env: dict[str, str],
    pods: list[Pod],
) -> None:
    """test_sklearn.py's kserve-servekit shapes in the image: V1 (test_sklearn_runtime_kserve),
    V2 with the model's readinessProbe (test_sklearn_v2_runtime_mlserver) and gRPC on the h2c
    port 8081 (test_sklearn_v2_grpc)."""
    name = "isvc-sklearn-v2-runtime"
    model = {"modelFormat": {"name": "sklearn"}, "runtime": "kserve-servekit",
             "storageUri": SKLEARN, "protocolVersion": "v2", "readinessProbe": ready_probe(name),
             "ports": [{"containerPort": 8081, "name": "h2c", "protocol": "TCP"}]}  # fmt: skip
    pod = start(servekit_runtime, isvc_of(name, {"model": model}), s3, tmp_path, podman_env, pods)
    pod.wait_ready()
    v1, v2, grpc = ask(pod, [
        {"kind": "rest_v1", "model": name, "file": "iris_input.json"},
        {"kind": "rest_v2", "model": name, "file": "iris_input_v2.json"},
        {"kind": "grpc", "model": name, "file": "iris_input_v2_grpc.json"},
    ])  # fmt: skip
    assert v1["predictions"] == [1, 1]
    assert v2["outputs"][0]["data"] == [1, 1]
    assert grpc["outputs"][0]["data"] == [1, 1]


# --- kserve-mlserver with servekit's image ---------------------------------------------------

LEGACY_RESOURCES = {"requests": {"cpu": "50m", "memory": "128Mi"},
                    "limits": {"cpu": "100m", "memory": "512Mi"}}  # fmt: skip
"""The resources KServe's legacy-form cases ask (100m of a CPU: the load is slow, not wrong)."""
MLSERVER_CASES: dict[str, tuple[str, str, str]] = {
    # KServe's test name: (InferenceService name, predictor key or modelFormat, storageUri)
    "test_sklearn_v2_mlserver": ("sklearn-v2-mlserver", "sklearn", SKLEARN),
    "test_sklearn_v2_runtime_mlserver": ("isvc-sklearn-v2-runtime", "model:sklearn", SKLEARN),
    "test_xgboost_v2_mlserver": (
        "isvc-xgboost-v2-mlserver",
        "xgboost",
        f"s3://{BUCKET}/models/xgboost/iris",
    ),
    "test_xgboost_single_model_file": (
        "xgboost-v2-mlserver",
        "xgboost",
        f"s3://{BUCKET}/models/xgboost/iris/model.bst",
    ),
    "test_xgboost_v2_runtime_mlserver": (
        "isvc-xgboost-v2-runtime",
        "model:xgboost",
        f"s3://{BUCKET}/models/xgboost/iris",
    ),
    "test_lightgbm_v2_runtime_mlserver": (
        "isvc-lightgbm-v2-runtime",
        "model:lightgbm",
        f"s3://{BUCKET}/models/lightgbm/v2/iris",
    ),
}


def mlserver_isvc(case: str) -> dict[str, Any]:
    """The InferenceService of KServe's ``case``: ``predictor.<format>`` (the legacy form, which
    KServe's webhook turns into ``predictor.model`` and KServe picks kserve-mlserver for) or
    ``predictor.model`` naming ``runtime: kserve-mlserver``; protocol v2, the model's probe."""
    name, kind, uri = MLSERVER_CASES[case]
    spec: dict[str, Any] = {"storageUri": uri, "protocolVersion": "v2",
                            "readinessProbe": ready_probe(name)}  # fmt: skip
    if case.startswith("test_xgboost") and not kind.startswith("model:"):
        spec["env"] = [{"name": "MLSERVER_MODEL_PARALLEL_WORKERS", "value": "0"}]
    if kind.startswith("model:"):
        fmt = kind.removeprefix("model:")
        return isvc_of(name, {"model": {"modelFormat": {"name": fmt}, "runtime": "kserve-mlserver",
                                        **spec}})  # fmt: skip
    return isvc_of(name, {kind: {**spec, "resources": LEGACY_RESOURCES}})


@pytest.mark.parametrize("case", list(MLSERVER_CASES))
def test_kserve_mlserver_runtime_with_servekit_image(
    case: str,
    mlserver_runtime: dict[str, Any],
    s3: dict[str, str],
    tmp_path: Path,
    podman_env: dict[str, str],
    pods: list[Pod],
) -> None:
    isvc = mlserver_isvc(case)
    name = isvc["metadata"]["name"]
    pod = start(mlserver_runtime, isvc, s3, tmp_path, podman_env, pods)
    env = {e["name"]: e["value"] for e in pod.container["env"]}
    assert env["MLSERVER_MODEL_NAME"] == name and env["MLSERVER_MODEL_URI"] == "/mnt/models"
    assert env["MLSERVER_MODEL_IMPLEMENTATION"].startswith("mlserver_")
    pod.wait_ready()
    (v2,) = ask(pod, [{"kind": "rest_v2", "model": name, "file": "iris_input_v2.json"}])
    if "lightgbm" not in case:
        assert v2["outputs"][0]["data"] == [1, 1]  # KServe: [1, 1] or [1.0, 1.0]
        return
    # KServe asserts its own model's six probabilities; this model's are LightGBM's own.
    import lightgbm as lgb

    request = json.loads((DATA / "kserve-e2e" / "iris_input_v2.json").read_text())
    rows = np.array(request["inputs"][0]["data"], dtype=np.float64).reshape(2, 4)
    booster = lgb.Booster(model_file=str(tmp_path / "mnt-models" / "model.bst"))
    assert v2["outputs"][0]["data"] == pytest.approx(booster.predict(rows).reshape(-1).tolist())
    probabilities = np.array(v2["outputs"][0]["data"]).reshape(2, 3)
    assert list(np.argmax(probabilities, axis=1)) == [1, 1]


# --- the contract holds both ways: a broken runtime or image command fails ------------------


@pytest.mark.parametrize("how", ["args", "port", "probe", "image-command"])
def test_a_broken_runtime_in_image_never_turns_ready(
    how: str,
    servekit_runtime: dict[str, Any],
    mlserver_runtime: dict[str, Any],
    s3: dict[str, str],
    tmp_path: Path,
    podman_env: dict[str, str],
    pods: list[Pod],
) -> None:
    if how == "image-command":
        runtime, isvc = mlserver_runtime, mlserver_isvc("test_sklearn_v2_runtime_mlserver")
    else:
        model = {"modelFormat": {"name": "sklearn"}, "runtime": "kserve-servekit",
                 "storageUri": SKLEARN}  # fmt: skip
        if how == "args":  # without --model-dir the image serves its own /srv/serve.yaml, whose
            model["readinessProbe"] = ready_probe("isvc-sklearn")  # health is ready: ask the model
        runtime, isvc = servekit_runtime, isvc_of("isvc-sklearn", {"model": model})
    pod = start(broken_runtime(runtime, how), isvc, s3, tmp_path, podman_env, pods)
    with pytest.raises(AssertionError, match=r"exited|not ready within"):
        pod.wait_ready(timeout=30)
    assert pod.output(), "the container said nothing"
