"""The tabular formats served by a real server, driven by the clients their users have.

The seed's KServe example (an InferenceService with ``modelFormat: {name: sklearn}`` and a
``.joblib`` file, here a digits classifier fitted on scikit-learn's bundled data, nothing
downloaded) answers over V2 REST with requests built by MLServer's own codecs, over gRPC with
tritonclient, and over KServe V1 ``instances``: the predictions the estimator gives in this
process. A pipeline fitted on a DataFrame (numbers and text) answers a ``pd`` request over REST
and gRPC (BYTES columns), and XGBoost and LightGBM models answer MLServer's NumpyCodec. The
scikit-learn model batches (maxBatchSize, dynamicBatching): concurrent requests are all
answered right and counted in its statistics.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import joblib
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from mlserver_codecs import (
    InferenceRequest,
    InferenceResponse,
    NumpyCodec,
    NumpyRequestCodec,
    RequestOutput,
)
from servers import ServerProcess, start_server
from sklearn.datasets import load_digits
from sklearn.ensemble import RandomForestClassifier
from test_tabular_runtimes import column_pipeline, encode_frame, people

pytestmark = pytest.mark.slow

DIGITS = load_digits()
X = DIGITS.data
Y = DIGITS.target


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import lightgbm as lgb
    import xgboost as xgb

    base = tmp_path_factory.mktemp("tabular")
    forest = RandomForestClassifier(n_estimators=10, max_depth=6, random_state=0).fit(X, Y)
    joblib.dump(forest, base / "mnist.joblib")
    frame = people(60)
    joblib.dump(column_pipeline(frame), base / "people.joblib")
    booster = xgb.train({"objective": "reg:squarederror"}, xgb.DMatrix(X[:, :4], Y), 3)
    (base / "xgb" / "1").mkdir(parents=True)
    booster.save_model(base / "xgb" / "1" / "model.json")
    lgbm = lgb.train({"objective": "regression", "verbose": -1}, lgb.Dataset(X[:, :4], Y), 3)
    (base / "lgb").mkdir()
    lgbm.save_model(str(base / "lgb" / "model.bst"))
    (base / "serve.yaml").write_text(
        "models:\n"
        "  - name: example-sklearn-isvc\n"
        "    modelFormat: {name: sklearn}\n"
        "    storageUri: mnist.joblib\n"
        "    maxBatchSize: 64\n"
        "    dynamicBatching: {}\n"
        "  - {name: people, modelFormat: {name: sklearn}, storageUri: people.joblib}\n"
        "  - {name: xgb, modelFormat: {name: xgboost}, storageUri: xgb}\n"
        "  - {name: lgb, modelFormat: {name: lightgbm}, storageUri: lgb}\n"
    )
    return base


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[ServerProcess]:
    process = start_server(root / "serve.yaml", grpc=True)
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def model(root: Path) -> RandomForestClassifier:
    loaded: RandomForestClassifier = joblib.load(root / "mnist.joblib")
    return loaded


def post_mlserver(http: httpx.Client, name: str, request: InferenceRequest) -> InferenceResponse:
    """Send MLServer's request as its clients do (its JSON) and read the answer with its types."""
    answer = http.post(
        f"/v2/models/{name}/infer",
        content=request.model_dump_json(exclude_none=True),
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 200, answer.text
    return InferenceResponse.model_validate_json(answer.content)


def test_seed_example_over_v2_rest_with_mlserver_codecs(
    server: ServerProcess, model: RandomForestClassifier
) -> None:
    with server.http_client(timeout=30) as http:
        metadata = http.get("/v2/models/example-sklearn-isvc").json()
        assert metadata["platform"] == "sklearn"
        assert metadata["inputs"] == [{"name": "input-0", "datatype": "FP64", "shape": [-1, 64]}]
        request = NumpyRequestCodec.encode_request(X[:9])
        answer = post_mlserver(http, "example-sklearn-isvc", request)
        (predict,) = answer.outputs
        np.testing.assert_array_equal(
            NumpyCodec.decode_output(predict).ravel(), model.predict(X[:9])
        )
        request.outputs = [RequestOutput(name="predict_proba")]
        answer = post_mlserver(http, "example-sklearn-isvc", request)
        proba = NumpyCodec.decode_output(answer.outputs[0])
        np.testing.assert_array_equal(proba, model.predict_proba(X[:9]))


def test_seed_example_over_grpc_and_v1(
    server: ServerProcess, model: RandomForestClassifier
) -> None:
    assert server.grpc_target is not None
    client = grpcclient.InferenceServerClient(server.grpc_target)
    try:
        x = grpcclient.InferInput("input-0", [5, 64], "FP64")
        x.set_data_from_numpy(X[10:15])
        wanted = [
            grpcclient.InferRequestedOutput("predict"),
            grpcclient.InferRequestedOutput("predict_proba"),
        ]
        result = client.infer("example-sklearn-isvc", [x], outputs=wanted)
        # [5, 1]: one row per request row, as MLServer's NumpyCodec shapes a 1-D answer
        want = model.predict(X[10:15]).reshape(-1, 1)
        np.testing.assert_array_equal(result.as_numpy("predict"), want)
        np.testing.assert_array_equal(
            result.as_numpy("predict_proba"), model.predict_proba(X[10:15])
        )
        out = result.get_response().outputs[0]
        assert out.parameters["content_type"].string_param == "np"
    finally:
        client.close()
    with server.http_client(timeout=30) as http:
        body = {"instances": X[20:24].tolist()}
        answer = http.post("/v1/models/example-sklearn-isvc:predict", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"predictions": model.predict(X[20:24]).tolist()}


def test_a_dataframe_pipeline_over_rest_and_grpc(server: ServerProcess, root: Path) -> None:
    pipe = joblib.load(root / "people.joblib")
    rows = people(6)
    want = pipe.predict(rows)
    with server.http_client(timeout=30) as http:
        answer = post_mlserver(http, "people", encode_frame(rows))
        np.testing.assert_array_equal(NumpyCodec.decode_output(answer.outputs[0]).ravel(), want)
    assert server.grpc_target is not None
    client = grpcclient.InferenceServerClient(server.grpc_target)
    try:
        inputs = []
        for column, datatype in (("age", "FP64"), ("visits", "INT64"), ("city", "BYTES")):
            tensor = grpcclient.InferInput(column, [len(rows), 1], datatype)
            values = rows[column].to_numpy().reshape(-1, 1)
            if datatype == "BYTES":
                values = values.astype(object)
            tensor.set_data_from_numpy(values)
            inputs.append(tensor)
        result = client.infer("people", inputs, parameters={"content_type": "pd"})
        np.testing.assert_array_equal(result.as_numpy("predict"), want.reshape(-1, 1))
    finally:
        client.close()


def test_xgboost_and_lightgbm_over_rest(server: ServerProcess, root: Path) -> None:
    import lightgbm as lgb
    import xgboost as xgb

    booster = xgb.Booster(model_file=str(root / "xgb" / "1" / "model.json"))
    lgbm = lgb.Booster(model_file=str(root / "lgb" / "model.bst"))
    rows = X[:7, :4]
    with server.http_client(timeout=30) as http:
        answer = post_mlserver(http, "xgb", NumpyRequestCodec.encode_request(rows))
        got = NumpyCodec.decode_output(answer.outputs[0]).ravel()
        np.testing.assert_array_equal(got, booster.predict(xgb.DMatrix(rows)))
        answer = post_mlserver(http, "lgb", NumpyRequestCodec.encode_request(rows))
        np.testing.assert_array_equal(
            NumpyCodec.decode_output(answer.outputs[0]).ravel(), lgbm.predict(rows)
        )


def test_concurrent_requests_batch_and_are_counted(
    server: ServerProcess, model: RandomForestClassifier
) -> None:
    """16 clients at once on a batching model: each gets its own rows' predictions (a batch
    split back wrongly would mix rows up), and the statistics count every request and row."""
    name = "example-sklearn-isvc"
    with server.http_client(timeout=30) as http:
        before = http.get(f"/v2/models/{name}/stats").json()["model_stats"][0]

        def one(i: int) -> None:
            rows = X[i * 3 : i * 3 + 3]
            body = json.loads(NumpyRequestCodec.encode_request(rows).model_dump_json())
            answer = http.post(f"/v2/models/{name}/infer", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["outputs"][0]["data"] == model.predict(rows).tolist()

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, range(64)))
        after = http.get(f"/v2/models/{name}/stats").json()["model_stats"][0]
    served = int(after["inference_count"]) - int(before["inference_count"])
    assert served == 64 * 3
    successes = after["inference_stats"]["success"]["count"]
    assert int(successes) - int(before["inference_stats"]["success"]["count"]) == 64
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert 0 < executions <= 64
