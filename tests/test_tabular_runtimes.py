"""The tabular runtimes (scikit-learn, XGBoost, LightGBM, MLflow) in process, fed requests built
by MLServer's own codecs (``mlserver.codecs``), as V2 JSON through servekit's JSON codec.

Each model is fitted here, tiny, and written the way its library saves it; the answer must be
what the model gives in this process. The end-to-end twin (real server, REST, gRPC, V1) is
tests/test_tabular_e2e.py.
"""

from __future__ import annotations

import json
import pickle
import re
import warnings
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pandas as pd
import pytest
from inprocess import Serve, Services
from mlserver_codecs import (
    InferenceRequest,
    InferenceResponse,
    NumpyCodec,
    NumpyRequestCodec,
    PandasCodec,
    RequestInput,
    RequestOutput,
    StringCodec,
)
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer, OneHotEncoder, StandardScaler

from servekit.codecs import v2_json
from servekit.config.loader import ConfigError
from servekit.errors import InvalidArgument

pytestmark = pytest.mark.anyio

RNG = np.random.default_rng(7)


def people(n: int = 40) -> pd.DataFrame:
    """A DataFrame with a numeric, an integer and a text column (what data scientists have)."""
    return pd.DataFrame(
        {
            "age": RNG.uniform(18, 80, n).round(1),
            "visits": RNG.integers(0, 10, n),
            "city": RNG.choice(["paris", "lyon", "nice"], n),
        }
    )


def encode_frame(frame: pd.DataFrame) -> InferenceRequest:
    """PandasCodec's request for ``frame``. MLServer 1.7.1 predates pandas 3's ``str`` dtype
    (its PandasCodec fails on it): text columns go as ``object``, pandas 2's dtype for text,
    which is what its users have."""
    text = {
        c: object
        for c in frame.columns
        if frame[c].dtype.kind in "OUT" or str(frame[c].dtype) == "str"
    }
    return PandasCodec.encode_request(frame.astype(text))


def column_pipeline(frame: pd.DataFrame) -> Pipeline:
    """issue 24's refused set-up: a ColumnTransformer over a DataFrame, then LogisticRegression."""
    target = (frame["age"] > 40).astype(int) ^ (frame["city"] == "nice").astype(int)
    pipe = Pipeline(
        [
            (
                "prep",
                ColumnTransformer(
                    [
                        ("num", StandardScaler(), ["age", "visits"]),
                        ("cat", OneHotEncoder(handle_unknown="ignore"), ["city"]),
                    ]
                ),
            ),
            ("clf", LogisticRegression()),
        ]
    )
    return pipe.fit(frame, target)


async def infer_json(
    services: Services, model: str, request: InferenceRequest
) -> InferenceResponse:
    """``request`` as MLServer's client sends it (its JSON), answered as servekit's REST does."""
    body = json.loads(request.model_dump_json(exclude_none=True))
    decoded = v2_json.decode_request(body, model, None)
    response = await services.dataplane.infer(decoded)
    outputs = [
        {**v2_json.output_entry(t), "data": v2_json.output_json_data(t)} for t in response.outputs
    ]
    wire = v2_json.dumps(v2_json.response_header(response, outputs))
    return InferenceResponse.model_validate_json(wire)


def output(response: InferenceResponse, name: str) -> np.ndarray:
    (found,) = [o for o in response.outputs if o.name == name]
    return np.asarray(NumpyCodec.decode_output(found))


async def test_sklearn_pipeline_on_a_dataframe_answers_pandas_codec_requests(
    serve: Serve, tmp_path: Path
) -> None:
    frame = people()
    pipe = column_pipeline(frame)
    joblib.dump(pipe, tmp_path / "model.joblib")
    services = await serve("models:\n  - {name: p, modelFormat: {name: sklearn}, storageUri: .}\n")
    metadata = services.dataplane.model_metadata("p")
    assert metadata.platform == "sklearn"
    assert [(t.name, t.shape) for t in metadata.inputs] == [
        ("age", (-1, 1)),
        ("visits", (-1, 1)),
        ("city", (-1, 1)),
    ]
    assert [t.name for t in metadata.outputs] == ["predict", "predict_proba"]

    rows = frame.head(7)
    request = encode_frame(rows)
    answer = await infer_json(services, "p", request)
    assert [o.name for o in answer.outputs] == ["predict"]  # MLServer's default: predict only
    assert answer.outputs[0].parameters is not None
    assert answer.outputs[0].parameters.content_type == "np"
    np.testing.assert_array_equal(output(answer, "predict").ravel(), pipe.predict(rows))

    request.outputs = [RequestOutput(name="predict_proba")]
    answer = await infer_json(services, "p", request)
    np.testing.assert_array_equal(output(answer, "predict_proba"), pipe.predict_proba(rows))


async def test_function_transformer_pipeline_from_a_pickle_answers_numpy_requests(
    serve: Serve, tmp_path: Path
) -> None:
    """A FunctionTransformer(np.log1p) pipeline fitted on a matrix, from a .pkl file, in a
    version folder; NumpyCodec's request (FP32, where the model's metadata says FP64) is cast."""
    x = RNG.uniform(0, 5, (30, 3))
    pipe = Pipeline([("log", FunctionTransformer(np.log1p)), ("reg", LinearRegression())])
    pipe.fit(x, x @ [1.0, -2.0, 0.5])
    (tmp_path / "m" / "3").mkdir(parents=True)
    (tmp_path / "m" / "3" / "model.pkl").write_bytes(pickle.dumps(pipe))
    services = await serve("models:\n  - {name: f, modelFormat: {name: sklearn}, storageUri: m}\n")
    metadata = services.dataplane.model_metadata("f")
    assert metadata.versions == ("3",)
    assert [(t.name, t.datatype, t.shape) for t in metadata.inputs] == [
        ("input-0", "FP64", (-1, 3))
    ]
    assert [t.name for t in metadata.outputs] == ["predict"]  # a regressor has no predict_proba
    rows = x[:5].astype(np.float32)
    answer = await infer_json(services, "f", NumpyRequestCodec.encode_request(rows))
    np.testing.assert_allclose(output(answer, "predict").ravel(), pipe.predict(rows), rtol=1e-12)


async def test_text_labels_and_a_request_for_both_outputs(serve: Serve, tmp_path: Path) -> None:
    x = RNG.uniform(0, 1, (40, 2))
    labels = np.where(x[:, 0] > 0.5, "high", "low")
    forest = RandomForestClassifier(n_estimators=5, random_state=0).fit(x, labels)
    joblib.dump(forest, tmp_path / "forest.joblib")
    services = await serve(
        "models:\n  - {name: rf, modelFormat: {name: sklearn}, storageUri: forest.joblib}\n"
    )
    spec = services.dataplane.model_metadata("rf").outputs
    assert [(s.name, s.datatype, s.shape) for s in spec] == [
        ("predict", "BYTES", (-1,)),
        ("predict_proba", "FP64", (-1, 2)),
    ]
    request = InferenceRequest(
        inputs=[NumpyCodec.encode_input("input-0", x[:4])],
        outputs=[RequestOutput(name="predict"), RequestOutput(name="predict_proba")],
    )
    answer = await infer_json(services, "rf", request)
    predict = answer.outputs[0]
    assert predict.parameters is not None and predict.parameters.content_type == "str"
    assert StringCodec.decode_output(predict) == list(forest.predict(x[:4]))
    np.testing.assert_array_equal(output(answer, "predict_proba"), forest.predict_proba(x[:4]))


async def test_a_matrix_request_reaches_a_column_model_and_columns_reach_a_matrix_model(
    serve: Serve, tmp_path: Path
) -> None:
    """KServe's ``input-0`` [N, F] to a model fitted on a DataFrame is split into its columns;
    a ``pd`` request to a model fitted on a matrix is stacked in the request's order."""
    x = RNG.uniform(0, 1, (30, 2))
    named = LinearRegression().fit(pd.DataFrame(x, columns=["a", "b"]), x @ [3.0, 1.0])
    plain = LinearRegression().fit(x, x @ [3.0, 1.0])
    (tmp_path / "named").mkdir()
    (tmp_path / "plain").mkdir()
    joblib.dump(named, tmp_path / "named" / "model.joblib")
    joblib.dump(plain, tmp_path / "plain" / "model.joblib")
    services = await serve(
        "models:\n"
        "  - {name: named, modelFormat: {name: sklearn}, storageUri: named}\n"
        "  - {name: plain, modelFormat: {name: sklearn}, storageUri: plain}\n"
    )
    want = plain.predict(x[:3])
    answer = await infer_json(services, "named", NumpyRequestCodec.encode_request(x[:3]))
    np.testing.assert_allclose(output(answer, "predict").ravel(), want)
    frame = pd.DataFrame(x[:3], columns=["a", "b"])
    answer = await infer_json(services, "plain", encode_frame(frame))
    np.testing.assert_allclose(output(answer, "predict").ravel(), want)


async def test_requests_that_do_not_fit_are_clear_400s(serve: Serve, tmp_path: Path) -> None:
    frame = people()
    joblib.dump(column_pipeline(frame), tmp_path / "model.joblib")
    services = await serve("models:\n  - {name: p, modelFormat: {name: sklearn}, storageUri: .}\n")
    cases: list[tuple[Any, str]] = [
        (encode_frame(frame[["age", "city"]].head(2)), "needs column(s) 'visits'"),
        (
            encode_frame(frame.assign(extra=1).head(2)),
            "has no column 'extra'",
        ),
        (
            InferenceRequest(
                parameters={"content_type": "pd"},
                inputs=[
                    RequestInput(name="age", datatype="FP64", shape=[2, 1], data=[1.0, 2.0]),
                    RequestInput(name="visits", datatype="INT64", shape=[1, 1], data=[1]),
                    RequestInput(name="city", datatype="BYTES", shape=[2, 1], data=["a", "b"]),
                ],
            ),
            "has 1 rows, the others 2",
        ),
        (
            InferenceRequest(
                parameters={"content_type": "yaml"},
                inputs=[NumpyCodec.encode_input("input-0", np.zeros((1, 3)))],
            ),
            "request content_type 'yaml' is not one servekit reads",
        ),
        (
            InferenceRequest(
                inputs=[
                    RequestInput(
                        name="input-0",
                        datatype="BYTES",
                        shape=[1, 1],
                        data=["%%%"],
                        parameters={"content_type": "base64"},
                    )
                ]
            ),
            "element 0 is not base64",
        ),
    ]
    for request, expected in cases:
        with pytest.raises(InvalidArgument, match=re.escape(expected)):
            await infer_json(services, "p", request)
    # A value the model itself refuses (text where it scales numbers) is the client's 400 too.
    bad = encode_frame(frame.head(2).assign(age=["old", "young"]))
    with pytest.raises(InvalidArgument, match="the model rejected the input"):
        await infer_json(services, "p", bad)


async def test_content_types_str_base64_and_datetime_reach_the_model(
    serve: Serve, tmp_path: Path
) -> None:
    """A Python-free check of what the model is handed: an MLflow-free pyfunc is overkill, so
    a scikit-learn FunctionTransformer echoes the DataFrame's dtypes back as its prediction."""
    joblib.dump(_dtype_echo(), tmp_path / "model.joblib")
    services = await serve(
        "models:\n  - {name: e, modelFormat: {name: sklearn}, storageUri: .,\n"
        "      outputs: [{name: predict, datatype: BYTES}]}\n"
    )
    request = InferenceRequest(
        parameters={"content_type": "pd"},
        inputs=[
            RequestInput(
                name="when",
                datatype="BYTES",
                shape=[1, 1],
                data=["2024-05-01T10:00:00"],
                parameters={"content_type": "datetime"},
            ),
            RequestInput(
                name="blob",
                datatype="BYTES",
                shape=[1, 1],
                data=["AAEC"],
                parameters={"content_type": "base64"},
            ),
            RequestInput(
                name="word",
                datatype="BYTES",
                shape=[1, 1],
                data=["héllo"],
                parameters={"content_type": "str"},
            ),
        ],
    )
    answer = await infer_json(services, "e", request)
    (described,) = StringCodec.decode_output(answer.outputs[0])
    assert (
        described
        == "when:datetime64[us]=2024-05-01 10:00:00|blob:object=b'\\x00\\x01\\x02'|word:str=héllo"
    )


def _dtype_echo() -> Any:
    from tabular_models import DtypeEcho

    return DtypeEcho(["when", "blob", "word"])


async def test_xgboost_classifier_and_regressor_files(serve: Serve, tmp_path: Path) -> None:
    """A classifier fitted on a DataFrame (.json: columns, labels and probabilities), and a
    Booster trained with xgb.train on a matrix (.ubj in a version folder: its objective's
    output), as MLServer's XGBoost runtime answers them."""
    import xgboost as xgb

    x = RNG.uniform(0, 1, (60, 3))
    y = (x[:, 0] + x[:, 1] > 1).astype(int)
    frame = pd.DataFrame(x, columns=["f0", "f1", "f2"])
    classifier = xgb.XGBClassifier(n_estimators=4, max_depth=2).fit(frame, y)
    classifier.save_model(tmp_path / "clf.json")
    booster = xgb.train({"objective": "reg:squarederror"}, xgb.DMatrix(x, label=x[:, 2]), 4)
    (tmp_path / "reg" / "1").mkdir(parents=True)
    booster.save_model(tmp_path / "reg" / "1" / "model.ubj")
    services = await serve(
        "models:\n"
        "  - {name: clf, modelFormat: {name: xgboost}, storageUri: clf.json}\n"
        "  - {name: reg, modelFormat: {name: xgboost}, storageUri: reg}\n"
    )
    clf = services.dataplane.model_metadata("clf")
    assert [(t.name, t.datatype) for t in clf.inputs] == [
        ("f0", "FP32"),
        ("f1", "FP32"),
        ("f2", "FP32"),
    ]
    request = encode_frame(frame.head(6))
    request.outputs = [RequestOutput(name="predict"), RequestOutput(name="predict_proba")]
    answer = await infer_json(services, "clf", request)
    np.testing.assert_array_equal(output(answer, "predict").ravel(), classifier.predict(frame[:6]))
    np.testing.assert_array_equal(
        output(answer, "predict_proba"), classifier.predict_proba(frame[:6])
    )
    reg = services.dataplane.model_metadata("reg")
    assert [(t.name, t.datatype, t.shape) for t in reg.inputs] == [("input-0", "FP32", (-1, 3))]
    answer = await infer_json(services, "reg", NumpyRequestCodec.encode_request(x[:5]))
    want = booster.predict(xgb.DMatrix(x[:5]))
    np.testing.assert_array_equal(output(answer, "predict").ravel(), want)


async def test_lightgbm_booster_files(serve: Serve, tmp_path: Path) -> None:
    """A Booster trained on a DataFrame (.txt: columns) and one on a matrix (.bst: input-0);
    a labels.txt beside the model is not taken for a LightGBM file."""
    import lightgbm as lgb

    x = RNG.uniform(0, 1, (80, 2))
    y = (x[:, 0] > x[:, 1]).astype(int)
    params = {"objective": "binary", "verbose": -1, "num_leaves": 4}
    named = lgb.train(params, lgb.Dataset(pd.DataFrame(x, columns=["u", "v"]), label=y), 5)
    plain = lgb.train(params, lgb.Dataset(x, label=y), 5)
    (tmp_path / "named").mkdir()
    named.save_model(str(tmp_path / "named" / "model.txt"))
    (tmp_path / "named" / "labels.txt").write_text("no\nyes\n")
    (tmp_path / "plain").mkdir()
    plain.save_model(str(tmp_path / "plain" / "model.bst"))
    services = await serve(
        "models:\n"
        "  - {name: named, modelFormat: {name: lightgbm}, storageUri: named}\n"
        "  - {name: plain, modelFormat: {name: lightgbm}, storageUri: plain}\n"
    )
    assert [t.name for t in services.dataplane.model_metadata("named").inputs] == ["u", "v"]
    frame = pd.DataFrame(x[:5], columns=["u", "v"])
    answer = await infer_json(services, "named", encode_frame(frame))
    np.testing.assert_array_equal(output(answer, "predict").ravel(), named.predict(frame))
    answer = await infer_json(services, "plain", NumpyRequestCodec.encode_request(x[:5]))
    np.testing.assert_array_equal(output(answer, "predict").ravel(), plain.predict(x[:5]))


@pytest.mark.slow  # mlflow.pyfunc.save_model runs `uname` (the environment it records)
async def test_mlflow_pyfunc_model_with_a_signature(serve: Serve, tmp_path: Path) -> None:
    """A custom PythonModel saved with a column signature (double, long, string): the inputs
    and their datatypes come from the signature, the model gets its DataFrame."""
    from tabular_models import make_scorer

    frame = pd.DataFrame({"amount": [1.5, 2.0, 3.25], "count": [1, 2, 3], "tag": ["a", "bb", "c"]})
    with warnings.catch_warnings():  # MLflow warns on its own imports and untyped models
        warnings.simplefilter("ignore")
        import mlflow.pyfunc
        from mlflow.models import infer_signature

        scorer = make_scorer()
        signature = infer_signature(frame, scorer.predict(None, frame))
        path = str(tmp_path / "scorer")
        mlflow.pyfunc.save_model(path, python_model=scorer, signature=signature)
        want = mlflow.pyfunc.load_model(path).predict(frame)
    services = await serve(
        "models:\n  - {name: s, modelFormat: {name: mlflow}, storageUri: scorer}\n"
    )
    metadata = services.dataplane.model_metadata("s")
    assert [(t.name, t.datatype) for t in metadata.inputs] == [
        ("amount", "FP64"),
        ("count", "INT64"),
        ("tag", "BYTES"),
    ]
    assert [(t.name, t.datatype) for t in metadata.outputs] == [("predict", "FP64")]
    answer = await infer_json(services, "s", encode_frame(frame))
    np.testing.assert_array_equal(output(answer, "predict").ravel(), np.asarray(want))


async def test_a_missing_library_is_unavailable_with_the_pip_command(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each library is an extra: without it the model is UNAVAILABLE, its reason the pip
    command (find_spec answers None as for a library that is not installed)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "xgboost" else real(name, *a)
    )
    (tmp_path / "model.json").write_text("{}")
    services = await serve(
        "server: {strictReadiness: false}\n"
        "models:\n  - {name: x, modelFormat: {name: xgboost}, storageUri: model.json}\n"
    )
    assert services.states() == {("x", "1"): "UNAVAILABLE"}
    assert "pip install 'servekit[xgboost]'" in services.reason("x")


def test_the_seed_example_compiles_and_kserve_can_select_servekit(tmp_path: Path) -> None:
    """issue 24: `modelFormat: {name: sklearn}` with a .joblib file was refused ("no runtime
    with autoSelect supports format sklearn"); the exported ServingRuntime lists the formats."""
    from inprocess import plan_of

    from servekit.export.kserve import supported_formats

    joblib.dump(LinearRegression().fit([[0.0], [1.0]], [0.0, 1.0]), tmp_path / "mnist.joblib")
    plan = plan_of(
        "models:\n"
        "  - {name: example-sklearn-isvc, modelFormat: {name: sklearn, version: '1'},\n"
        "     storageUri: mnist.joblib}\n",
        tmp_path,
    )
    (model,) = plan.models
    assert (model.runtime, model.implementation, model.problem) == ("sklearn", "sklearn", None)
    listed = {(f["name"], f.get("version")) for f in supported_formats(plan)}
    assert {("sklearn", "1"), ("xgboost", "2"), ("lightgbm", "4"), ("mlflow", "2")} <= listed
    with pytest.raises(ConfigError, match="sklearn version 2"):
        plan_of(
            "models:\n  - {name: m, modelFormat: {name: sklearn, version: '2'}, "
            "storageUri: mnist.joblib}\n",
            tmp_path,
        )
