"""The ClusterServingRuntime ``kserve-servekit`` meets KServe's pod contract: KServe's e2e
predictor cases (test/e2e/predictor/test_sklearn.py, test_xgboost.py, test_lightgbm.py,
test_mlflow.py) served by the exported runtime through tests/kserve_pod.py (KServe's controller
and kubelet, emulated), the model files brought by KServe's own storage initializer from each
store KServe reads (an S3 store: moto; GCS: gcp-storage-emulator; Azure Blob: Azurite), the
calls made by KServe's own InferenceRESTClient (V1, V2) and InferenceGRPCClient with KServe's own
request files (tests/data/kserve-e2e/) and by tritonclient.http and tritonclient.grpc, and the
answers held to what KServe's tests assert. The models are trained here on the same data shapes
(iris; wine-shaped columns for MLflow): nothing is downloaded.

Each store is set up as KServe's pod would meet it. S3: the settings KServe's credential
builder sets. GCS: ``STORAGE_EMULATOR_HOST`` (google-cloud-storage's own setting, given to the
initializer through a ClusterStorageContainer's env). Azure: kserve-storage builds the endpoint
``https://ACCOUNT.blob.core.windows.net`` from the URI with no setting to change it, so the
initializer reaches Azurite (HTTPS, a certificate for that host) through ``HTTPS_PROXY``, which
azure-core honours, trusting the certificate's CA through KServe's global CA bundle
(``CA_BUNDLE_CONFIGMAP_NAME``), with the account key KServe's credential builder sets
(``AZURE_STORAGE_ACCESS_KEY``).

KServe's gRPC tests compare ``response.outputs[0].data``, which KServe's client fills from typed
``contents`` only: a server in ``--model-dir`` mode answers a request sent with typed contents
in typed contents (``server.grpcAnswers: asSent``, as KServe's servers and MLServer do), so
KServe's assertion holds as its test sends the request; the same request with
``binary_data_output: false`` says it outright and is answered the same.

A runtime whose args, port or probe path are wrong fails here (test_a_broken_runtime_*), as a
pod would fail on a cluster.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trustme
import yaml
from gated_proxy import GatedProxy
from kserve_pod import (
    Pod,
    ask_clients,
    broken_runtime,
    pod_container,
    start_pod,
    storage_initializer,
)
from kserve_schemas import validate_kserve
from object_stores import (
    AZURE_BLOB_HOST,
    AZURITE_KEY,
    azure_connection,
    azurite,
    gcs_emulator,
    moto_s3,
)
from test_kserve_clients import kserve_python

# Training four models and starting a pod a test: minutes on a loaded 2-core machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DATA = Path(__file__).with_name("data") / "kserve-e2e"
BUCKET = "kfserving-examples"
WINE_COLUMNS = [
    "fixed acidity", "volatile acidity", "citric acid", "residual sugar", "chlorides",
    "free sulfur dioxide", "total sulfur dioxide", "density", "pH", "sulphates", "alcohol",
]  # fmt: skip
IRIS_COLUMNS = ["sepal_length_(cm)", "sepal_width_(cm)", "petal_length_(cm)", "petal_width_(cm)"]


# --- the stores, the models, the runtime ---------------------------------------------------


@dataclass
class Store:
    """One store holding KServe's e2e models under their gs:// paths' keys, and the settings
    KServe gives the storage initializer for it."""

    prefix: str  # the storageUri of the bucket: its keys follow after a slash
    env: dict[str, str]

    def uri(self, key: str) -> str:
        return f"{self.prefix}/{key}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The models of KServe's e2e InferenceServices, by the key each has in a store."""
    with warnings.catch_warnings():  # the libraries' own deprecation notes while training
        warnings.simplefilter("ignore")
        return _train(tmp_path_factory.mktemp("trained"))


@pytest.fixture(scope="module")
def s3(trained: dict[str, Path]) -> Iterator[Store]:
    """A moto S3 server and the settings KServe's S3 credentials give the initializer."""
    with moto_s3(BUCKET) as (env, client):
        for key, path in trained.items():
            client.upload_file(str(path), BUCKET, key)
        yield Store(f"s3://{BUCKET}", env)


@pytest.fixture(scope="module")
def gcs(trained: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """gcp-storage-emulator; the initializer's google-cloud-storage finds it through
    ``STORAGE_EMULATOR_HOST`` (and then sends no credentials)."""
    with warnings.catch_warnings():  # google-auth's note on this grpcio's version: not ours
        warnings.simplefilter("ignore", FutureWarning)
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

    emulator = gcs_emulator(tmp_path_factory.mktemp("gcs"))
    url = f"http://127.0.0.1:{emulator.port}"
    try:
        client = storage.Client(
            project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": url}
        )
        bucket = client.create_bucket(BUCKET)
        for key, path in trained.items():
            bucket.blob(key).upload_from_filename(str(path))
        yield Store(f"gs://{BUCKET}", {"STORAGE_EMULATOR_HOST": url})
    finally:
        emulator.stop()


@pytest.fixture(scope="module")
def azure(trained: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """Azurite over HTTPS as ``devstoreaccount1.blob.core.windows.net``, reached through an
    HTTPS proxy that tunnels only that domain; the initializer trusts its CA through KServe's
    global CA bundle and signs with the account key KServe's Azure credentials set."""
    from azure.storage.blob import BlobServiceClient

    folder = tmp_path_factory.mktemp("azure")
    ca = trustme.CA()
    (folder / "ca-bundle").mkdir()  # the global CA bundle ConfigMap, as KServe mounts it
    ca.cert_pem.write_to_path(str(folder / "ca-bundle" / "cabundle.crt"))
    emulator = azurite(folder / "azurite", tls=ca)
    proxy = GatedProxy(emulator.port, hold_after=1 << 40, tunnel_to=".blob.core.windows.net")
    try:
        service = BlobServiceClient.from_connection_string(
            azure_connection(emulator.port, scheme="https"),
            connection_verify=str(folder / "ca-bundle" / "cabundle.crt"),
        )
        container = service.create_container(BUCKET)
        for key, path in trained.items():
            with path.open("rb") as data:
                container.upload_blob(key, data)
        env = {
            "HTTPS_PROXY": proxy.url,
            "AZURE_STORAGE_ACCESS_KEY": AZURITE_KEY,
            "CA_BUNDLE_CONFIGMAP_NAME": "servekit-test-ca",
            "CA_BUNDLE_VOLUME_MOUNT_POINT": str(folder / "ca-bundle"),
        }
        yield Store(f"https://{AZURE_BLOB_HOST}/{BUCKET}", env)
        assert set(proxy.tunnelled) == {f"{AZURE_BLOB_HOST}:443"}, proxy.tunnelled
    finally:
        proxy.close()
        emulator.stop()


@pytest.fixture(scope="module", params=["s3", "gcs", "azure"])
def store(request: pytest.FixtureRequest) -> Store:
    """Each store in turn: every case below is fetched from each."""
    found: Store = request.getfixturevalue(request.param)
    return found


def _iris() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    from sklearn.datasets import load_iris

    x, y = load_iris(return_X_y=True)
    return x.astype(np.float32), y


def _train(folder: Path) -> dict[str, Path]:
    """The InferenceService shapes of KServe's e2e tests, under their gs:// paths' keys."""
    import joblib
    import lightgbm as lgb
    import mlflow.sklearn
    import pandas as pd
    import xgboost as xgb
    from sklearn import svm
    from sklearn.linear_model import ElasticNet

    x, y = _iris()
    joblib.dump(svm.SVC(gamma="scale").fit(x, y), folder / "model.joblib")
    booster = xgb.train({"objective": "multi:softmax", "num_class": 3}, xgb.DMatrix(x, label=y), 10)
    booster.save_model(folder / "model.bst")
    frame = pd.DataFrame(x, columns=IRIS_COLUMNS)
    lgb_model = lgb.train(
        {"objective": "multiclass", "num_class": 3, "verbose": -1}, lgb.Dataset(frame, y), 20
    )
    (folder / "lgb").mkdir()
    lgb_model.save_model(folder / "lgb" / "model.bst")
    rng = np.random.default_rng(0)
    wine = pd.DataFrame(rng.uniform(0, 15, (200, 11)).astype(np.float32), columns=WINE_COLUMNS)
    quality = wine["alcohol"] * 0.3 + wine["fixed acidity"] * 0.1 + 2
    mlflow.sklearn.save_model(
        ElasticNet(alpha=0.1).fit(wine, quality), folder / "wine", input_example=wine.head(2),
        serialization_format=mlflow.sklearn.SERIALIZATION_FORMAT_CLOUDPICKLE,
        pip_requirements=["scikit-learn"],  # not inferred: that imports and runs the model
    )  # fmt: skip
    settings = {
        "name": "xgboost-iris",
        "implementation": "mlserver_xgboost.XGBoostModel",
        "parameters": {"uri": "./model.bst", "version": "v0.1.0"},
    }
    (folder / "model-settings.json").write_text(json.dumps(settings))
    keys = {
        "models/sklearn/1.0/model/model.joblib": folder / "model.joblib",
        "models/xgboost/1.5/model/model.bst": folder / "model.bst",
        "models/xgboost/iris/model.bst": folder / "model.bst",
        "models/xgboost/iris/model-settings.json": folder / "model-settings.json",
        "models/lightgbm/iris/model.bst": folder / "lgb" / "model.bst",
        "models/lightgbm/v2/iris/model.bst": folder / "lgb" / "model.bst",
    }
    for path in (folder / "wine").rglob("*"):
        if path.is_file():
            keys[f"models/mlflow/wine/{path.relative_to(folder / 'wine')}"] = path
    return keys


@pytest.fixture(scope="module")
def runtime() -> dict[str, Any]:
    """``servekit export kserve --cluster-runtime``, run as ops run it."""
    out = subprocess.run(
        [sys.executable, "-m", "servekit", "export", "kserve", "--cluster-runtime",
         "--image", "registry.example/servekit:1"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (doc,) = yaml.safe_load_all(out.stdout)
    validate_kserve(doc)
    return dict(doc)


# --- one InferenceService through the pod --------------------------------------------------


def inference_service(name: str, fmt: str, uri: str, **model: Any) -> dict[str, Any]:
    """An InferenceService as KServe's e2e tests write it (predictor.model), runtime named."""
    spec = {"modelFormat": {"name": fmt}, "runtime": "kserve-servekit", "storageUri": uri}
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": "kserve-ci-e2e-test"},
        "spec": {"predictor": {"minReplicas": 1, "model": {**spec, **model}}},
    }
    validate_kserve(isvc)
    return isvc


def serve(runtime: dict[str, Any], isvc: dict[str, Any], store: Store, tmp_path: Path) -> Pod:
    """Storage initializer, then the container, then readiness: a pod's start."""
    models = tmp_path / "mnt-models"
    storage_initializer(
        kserve_python(), isvc["spec"]["predictor"]["model"]["storageUri"], models, store.env
    )
    pod = start_pod(pod_container(runtime, isvc), models, tmp_path / "container.log")
    try:
        pod.wait_ready()
    except BaseException:
        pod.stop()
        raise
    return pod


def call(pod: Pod, calls: list[dict[str, Any]]) -> list[Any]:
    """KServe's clients (in KServe's venv) send ``calls``; their answers, in order."""
    return ask_clients(kserve_python(), pod, calls)


@pytest.fixture
def pods() -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for pod in started:
        pod.stop()


# --- KServe's cases, from each store ---------------------------------------------------------


def kserve_grpc(model: str) -> list[dict[str, Any]]:
    """KServe's gRPC call (predict_grpc with iris_input_v2_grpc.json's typed contents) as its
    test sends it, and again with ``binary_data_output: false``."""
    call = {"kind": "grpc", "model": model, "file": "iris_input_v2_grpc.json"}
    return [call, {**call, "parameters": {"binary_data_output": False}}]


def assert_kserve_grpc(as_sent: dict[str, Any], typed: dict[str, Any], expected: Any) -> None:
    """KServe's assertion, ``response.outputs[0].data == expected``, as its test sends the
    request (typed contents in, typed contents out), and with typed contents asked for."""
    assert as_sent["outputs"][0]["data"] == expected
    assert as_sent["outputs"][0]["decoded"] == expected
    assert typed["outputs"][0]["data"] == expected


def triton(pod: Pod, model: str, file: str) -> list[list[Any]]:
    """tritonclient.http and tritonclient.grpc send KServe's V2 request file (its values as
    tritonclient sends them, binary) to the same pod: each one's first output, flat."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import triton_to_np_dtype

    request = json.loads((DATA / file).read_text())
    answers = []
    for module, port in ((httpclient, 8080), (grpcclient, 8081)):
        inputs = []
        for tensor in request["inputs"]:
            sent = module.InferInput(tensor["name"], tensor["shape"], tensor["datatype"])
            dtype = triton_to_np_dtype(tensor["datatype"])
            sent.set_data_from_numpy(np.array(tensor["data"], dtype).reshape(tensor["shape"]))
            inputs.append(sent)
        client = module.InferenceServerClient(pod.target(port))
        with contextlib.closing(client):
            result = client.infer(model, inputs, parameters=request.get("parameters"))
        response = result.get_response()
        name = response["outputs"][0]["name"] if module is httpclient else response.outputs[0].name
        answers.append(result.as_numpy(name).reshape(-1).tolist())
    return answers


def test_sklearn(runtime: dict[str, Any], store: Store, tmp_path: Path, pods: list[Pod]) -> None:
    """test_sklearn.py: test_sklearn_runtime_kserve (V1) and test_sklearn_v2_runtime_mlserver
    (V2, with its readinessProbe on /v2/models/NAME/ready). (test_sklearn_v2's binary case asks
    for kserve-sklearnserver's output name ``output-0``; servekit names it ``predict``, as
    MLServer, whose place it takes, does.)"""
    name = "isvc-sklearn-v2-runtime"
    probe = {"httpGet": {"path": f"/v2/models/{name}/ready", "port": 8080}}
    isvc = inference_service(
        name, "sklearn", store.uri("models/sklearn/1.0/model"), readinessProbe=probe,
        protocolVersion="v2",
    )  # fmt: skip
    pods.append(pod := serve(runtime, isvc, store, tmp_path))
    v1, v2 = call(pod, [
        {"kind": "rest_v1", "model": name, "file": "iris_input.json"},
        {"kind": "rest_v2", "model": name, "file": "iris_input_v2.json"},
    ])  # fmt: skip
    assert v1["predictions"] == [1, 1]
    assert v2["outputs"][0]["data"] == [1, 1]
    assert triton(pod, name, "iris_input_v2.json") == [[1, 1], [1, 1]]


def test_sklearn_grpc(
    runtime: dict[str, Any], store: Store, tmp_path: Path, pods: list[Pod]
) -> None:
    """test_sklearn_v2_grpc: the h2c port 8081 and ``args: [--model_name, sklearn]``."""
    isvc = inference_service(
        "isvc-sklearn-v2-grpc", "sklearn", store.uri("models/sklearn/1.0/model"),
        ports=[{"containerPort": 8081, "name": "h2c", "protocol": "TCP"}],
        args=["--model_name", "sklearn"],
    )  # fmt: skip
    pods.append(pod := serve(runtime, isvc, store, tmp_path))
    as_sent, typed = call(pod, kserve_grpc("sklearn"))
    assert_kserve_grpc(as_sent, typed, [1, 1])
    assert triton(pod, "sklearn", "iris_input_v2.json") == [[1, 1], [1, 1]]


def test_xgboost(runtime: dict[str, Any], store: Store, tmp_path: Path, pods: list[Pod]) -> None:
    """test_xgboost.py: test_xgboost_runtime_kserve (V1, a folder with model.bst)."""
    name = "isvc-xgboost-runtime"
    isvc = inference_service(name, "xgboost", store.uri("models/xgboost/1.5/model"))
    pods.append(pod := serve(runtime, isvc, store, tmp_path))
    (v1,) = call(pod, [{"kind": "rest_v1", "model": name, "file": "iris_input.json"}])
    assert v1["predictions"] == [1, 1]
    assert triton(pod, name, "iris_input_v2.json") == [[1.0, 1.0], [1.0, 1.0]]


def test_xgboost_mlserver_folder(
    runtime: dict[str, Any], store: Store, tmp_path: Path, pods: list[Pod]
) -> None:
    """test_xgboost_v2_runtime_mlserver: the folder MLServer's runtime gets (model.bst and
    model-settings.json), V2 REST, and gRPC as test_xgboost_v2_grpc."""
    name = "isvc-xgboost-v2-runtime"
    isvc = inference_service(
        name, "xgboost", store.uri("models/xgboost/iris"), protocolVersion="v2",
        env=[{"name": "MLSERVER_MODEL_PARALLEL_WORKERS", "value": "0"}],
    )  # fmt: skip
    pods.append(pod := serve(runtime, isvc, store, tmp_path))
    v2, *grpc = call(pod, [
        {"kind": "rest_v2", "model": name, "file": "iris_input_v2.json"},
        *kserve_grpc(name),
    ])  # fmt: skip
    assert v2["outputs"][0]["data"] == [1.0, 1.0]
    assert_kserve_grpc(*grpc, [1.0, 1.0])
    assert triton(pod, name, "iris_input_v2.json") == [[1.0, 1.0], [1.0, 1.0]]


def test_xgboost_single_model_file(
    runtime: dict[str, Any], store: Store, tmp_path: Path, pods: list[Pod]
) -> None:
    """test_xgboost_single_model_file: the storageUri names one object, model.bst."""
    name = "isvc-xgboost-v2-single"
    isvc = inference_service(name, "xgboost", store.uri("models/xgboost/iris/model.bst"))
    pods.append(pod := serve(runtime, isvc, store, tmp_path))
    (v2,) = call(pod, [{"kind": "rest_v2", "model": name, "file": "iris_input_v2.json"}])
    assert v2["outputs"][0]["data"] == [1.0, 1.0]
    assert triton(pod, name, "iris_input_v2.json") == [[1.0, 1.0], [1.0, 1.0]]


def test_lightgbm(runtime: dict[str, Any], store: Store, tmp_path: Path, pods: list[Pod]) -> None:
    """test_lightgbm.py: test_lightgbm_runtime_kserve (V1), test_lightgbm_v2_kserve (V2) and
    test_lightgbm_v2_grpc: the class probabilities of each row (class 1 for KServe's rows).
    KServe's V1 case sends named columns under ``inputs`` (iris_input_v3.json), which servekit's
    V1 does not read: the V1 call here sends iris_input.json's ``instances``."""
    name = "isvc-lightgbm-runtime"
    isvc = inference_service(name, "lightgbm", store.uri("models/lightgbm/iris"))
    pods.append(pod := serve(runtime, isvc, store, tmp_path))
    v1, v2, *grpc = call(pod, [
        {"kind": "rest_v1", "model": name, "file": "iris_input.json"},
        {"kind": "rest_v2", "model": name, "file": "iris_input_v2.json"},
        *kserve_grpc(name),
    ])  # fmt: skip
    assert [int(np.argmax(row)) for row in v1["predictions"]] == [1, 1]
    probabilities = np.array(v2["outputs"][0]["data"]).reshape(2, 3)
    assert list(np.argmax(probabilities, axis=1)) == [1, 1]
    assert np.allclose(probabilities.sum(axis=1), 1.0)
    assert_kserve_grpc(*grpc, v2["outputs"][0]["data"])
    assert triton(pod, name, "iris_input_v2.json") == [v2["outputs"][0]["data"]] * 2


def test_mlflow(runtime: dict[str, Any], store: Store, tmp_path: Path, pods: list[Pod]) -> None:
    """test_mlflow_v2_runtime_kserve: an MLflow folder, V2 with content_type pd
    (mlflow_input_v2.json); the answer is the model's own prediction for that row."""
    import mlflow.pyfunc
    import pandas as pd

    name = "isvc-mlflow-v2-runtime"
    probe = {"httpGet": {"path": f"/v2/models/{name}/ready", "port": 8080}}
    isvc = inference_service(
        name, "mlflow", store.uri("models/mlflow/wine"), protocolVersion="v2",
        readinessProbe=probe,
    )  # fmt: skip
    pods.append(pod := serve(runtime, isvc, store, tmp_path))
    (v2,) = call(pod, [{"kind": "rest_v2", "model": name, "file": "mlflow_input_v2.json"}])
    request = json.loads((DATA / "mlflow_input_v2.json").read_text())
    row = pd.DataFrame({t["name"]: np.array(t["data"], np.float32) for t in request["inputs"]})
    expected = mlflow.pyfunc.load_model(str(tmp_path / "mnt-models")).predict(row)
    assert v2["outputs"][0]["data"] == pytest.approx([float(expected[0])])
    for answer in triton(pod, name, "mlflow_input_v2.json"):
        assert answer == pytest.approx([float(expected[0])])


# --- the contract holds both ways: a broken runtime fails -----------------------------------


@pytest.mark.parametrize("how", ["args", "port", "probe"])
def test_a_broken_runtime_never_turns_ready(
    how: str, runtime: dict[str, Any], s3: Store, tmp_path: Path, pods: list[Pod]
) -> None:
    isvc = inference_service("isvc-sklearn", "sklearn", s3.uri("models/sklearn/1.0/model"))
    models = tmp_path / "mnt-models"
    storage_initializer(kserve_python(), s3.uri("models/sklearn/1.0/model"), models, s3.env)
    pod = start_pod(pod_container(broken_runtime(runtime, how), isvc), models, tmp_path / "c.log")
    pods.append(pod)
    with pytest.raises(AssertionError, match=r"exited|not ready within"):
        pod.wait_ready(timeout=20)


def test_a_bad_model_folder_stops_the_pod_naming_its_files(
    runtime: dict[str, Any], tmp_path: Path, pods: list[Pod]
) -> None:
    """Two formats in /mnt/models: the container exits with one line naming the files, never
    ready (KServe would show it in the pod's log and CrashLoopBackOff)."""
    models = tmp_path / "mnt-models"
    models.mkdir()
    (models / "model.joblib").write_bytes(b"\x80\x04N.")
    (models / "model.txt").write_text("tree\n")
    isvc = inference_service("isvc-bad", "sklearn", "s3://nowhere/bad")
    pod = start_pod(pod_container(runtime, isvc), models, tmp_path / "c.log")
    pods.append(pod)
    with pytest.raises(AssertionError, match="exited"):
        pod.wait_ready(timeout=30)
    assert not pod.probe("readinessProbe")
    lines = [line for line in pod.output().splitlines() if line.strip()]
    assert lines == [
        "servekit: the model folder holds files of several formats (lightgbm, sklearn; files: "
        "model.joblib, model.txt): keep one model, or say which with --model-format"
    ]


def test_a_pickle_that_does_not_load_stops_the_pod(
    runtime: dict[str, Any], tmp_path: Path, pods: list[Pod]
) -> None:
    """A model.joblib that begins as a pickle but breaks off passes the start-up check; its
    load fails, so the container exits (1) before it was ever ready, the reason in its log."""
    models = tmp_path / "mnt-models"
    models.mkdir()
    (models / "model.joblib").write_bytes(b"\x80\x04\x95\x10\x00\x00")
    isvc = inference_service("isvc-truncated", "sklearn", "s3://nowhere/truncated")
    pod = start_pod(pod_container(runtime, isvc), models, tmp_path / "c.log")
    pods.append(pod)
    with pytest.raises(AssertionError, match=r"exited \(1\) before it was ready"):
        pod.wait_ready(timeout=60)
    assert "could not be read as a joblib or pickle file" in pod.output()
