"""Types from the data (issue 40): a model fitted on a DataFrame advertises each column's V2
datatype from what the fitted model records (a text column an encoder saw is BYTES, with the
categories it knows), XGBoost and LightGBM categorical columns are served, metadata shapes are
the shapes the model returns (LightGBM multiclass [-1, 3]), and the benchmark's request is made
of values of each column's type. In process; the end-to-end twin (notebook-style server,
``servekit bench``, Chromium) is tests/test_tabular_types_e2e.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pandas as pd
import pytest
from inprocess import Serve
from mlserver_codecs import InferenceRequest, RequestOutput
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import GradientBoostingClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from test_tabular_runtimes import encode_frame, infer_json, output

from servekit.client.bench import csv_example, example_inputs, request_inputs
from servekit.datatypes import of_column
from servekit.errors import InvalidArgument

pytestmark = pytest.mark.anyio

PLANS = ["basic", "pro", "team"]


def churn_frame(n: int = 90, seed: int = 4) -> pd.DataFrame:
    """Customers: a text column, an integer and a float one (what data scientists have)."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "plan": rng.choice(PLANS, n),
            "age": rng.integers(18, 80, n),
            "spend": rng.uniform(0, 100, n).round(2),
        }
    )


def churned(frame: pd.DataFrame) -> np.ndarray:
    return ((frame["plan"] == "pro") ^ (frame["spend"] > 50)).astype(int).to_numpy()


def churn_pipeline(frame: pd.DataFrame) -> Pipeline:
    """issue 40's pipeline: OneHotEncoder on the text column, StandardScaler on the numbers."""
    prep = ColumnTransformer(
        [
            ("cat", OneHotEncoder(handle_unknown="ignore"), ["plan"]),
            ("num", StandardScaler(), ["age", "spend"]),
        ]
    )
    return Pipeline([("prep", prep), ("clf", GradientBoostingClassifier(n_estimators=20))]).fit(
        frame, churned(frame)
    )


def asking(rows: pd.DataFrame, *outputs: str) -> InferenceRequest:
    """MLServer's request for ``rows``, asking for ``outputs``."""
    request = encode_frame(rows)
    request.outputs = [RequestOutput(name=n) for n in outputs]
    return request


def specs(services: Any, model: str) -> list[tuple[str, str, tuple[int, ...], Any]]:
    meta = services.dataplane.model_metadata(model)
    return [(t.name, t.datatype, t.shape, t.categories) for t in meta.inputs]


async def test_a_text_column_of_a_pipeline_is_bytes_with_its_categories(
    serve: Serve, tmp_path: Path
) -> None:
    frame = churn_frame()
    pipe = churn_pipeline(frame)
    joblib.dump(pipe, tmp_path / "churn.joblib")
    services = await serve(
        "models:\n  - {name: churn, modelFormat: {name: sklearn}, storageUri: churn.joblib}\n"
    )
    assert specs(services, "churn") == [
        ("plan", "BYTES", (-1, 1), tuple(PLANS)),
        ("age", "FP64", (-1, 1), None),
        ("spend", "FP64", (-1, 1), None),
    ]
    described = services.dataplane.model_metadata("churn").as_dict()["inputs"][0]
    assert described["parameters"] == {"categories": PLANS}
    rows = frame.head(5)
    answer = await infer_json(services, "churn", asking(rows, "predict_proba"))
    np.testing.assert_array_equal(output(answer, "predict_proba"), pipe.predict_proba(rows))


async def test_xgboost_with_a_pandas_categorical_column(serve: Serve, tmp_path: Path) -> None:
    import xgboost as xgb

    frame = churn_frame()
    typed = frame.astype({"plan": "category"})
    model = xgb.XGBClassifier(n_estimators=6, max_depth=3, enable_categorical=True)
    model.fit(typed, churned(frame))
    model.save_model(tmp_path / "churn.json")
    services = await serve(
        "models:\n  - {name: churn, modelFormat: {name: xgboost}, storageUri: churn.json}\n"
    )
    # Categories are read through pyarrow when it is installed; the type in any case.
    assert [s[:3] for s in specs(services, "churn")] == [
        ("plan", "BYTES", (-1, 1)),
        ("age", "INT64", (-1, 1)),
        ("spend", "FP32", (-1, 1)),
    ]
    rows = frame.head(6)  # text, as a client sends it
    answer = await infer_json(services, "churn", asking(rows, "predict_proba"))
    np.testing.assert_allclose(
        output(answer, "predict_proba"), model.predict_proba(typed.head(6)), rtol=1e-6
    )


async def test_lightgbm_multiclass_predict_is_n_by_3_and_its_categories_known(
    serve: Serve, tmp_path: Path
) -> None:
    import lightgbm as lgb

    frame = churn_frame(150)
    typed = frame.astype({"plan": "category"})
    label = (frame["plan"].map({"basic": 0, "pro": 1, "team": 2}) + (frame["age"] > 60)) % 3
    params = {"objective": "multiclass", "num_class": 3, "verbose": -1, "num_leaves": 4}
    booster = lgb.train(params, lgb.Dataset(typed, label=label), 5)
    booster.save_model(str(tmp_path / "multi.txt"))
    services = await serve(
        "models:\n  - {name: multi, modelFormat: {name: lightgbm}, storageUri: multi.txt}\n"
    )
    meta = services.dataplane.model_metadata("multi")
    assert [(t.name, t.datatype, t.shape) for t in meta.outputs] == [("predict", "FP64", (-1, 3))]
    assert specs(services, "multi")[0] == ("plan", "BYTES", (-1, 1), tuple(PLANS))
    rows = frame.head(5)
    answer = await infer_json(services, "multi", encode_frame(rows))
    got = output(answer, "predict")
    assert got.shape == (5, 3)
    np.testing.assert_allclose(got, booster.predict(typed.head(5)), rtol=1e-12)


def test_pandas_dtypes_map_to_the_datatypes_a_dataframe_is_sent_as() -> None:
    frame = pd.DataFrame(
        {
            "text": ["a"],
            "cat": pd.Categorical(["a"]),
            "flag": [True],
            "n": np.array([1], dtype=np.int32),
            "x": [1.5],
            "f": np.array([1.5], dtype=np.float32),
            "when": pd.to_datetime(["2024-05-01"]),
        }
    )
    got = {c: of_column(frame[c].dtype).name for c in frame.columns}
    assert got == {
        "text": "BYTES",
        "cat": "BYTES",
        "flag": "BOOL",
        "n": "INT32",
        "x": "FP64",
        "f": "FP32",
        "when": "BYTES",
    }


def _meta(platform: str, categories: list[str] | None) -> dict[str, Any]:
    plan: dict[str, Any] = {"name": "plan", "datatype": "BYTES", "shape": [-1, 1]}
    if categories is not None:
        plan["parameters"] = {"categories": categories}
    age = {"name": "age", "datatype": "INT64", "shape": [-1, 1]}
    return {"name": "churn", "platform": platform, "inputs": [plan, age]}


def test_the_benchmark_sends_a_known_category_and_asks_for_an_example_otherwise(
    tmp_path: Path,
) -> None:
    made = example_inputs(_meta("sklearn", ["pro", "basic"]))
    assert made["plan"].tolist() == [[b"pro"]] and made["age"].tolist() == [[1]]
    with pytest.raises(InvalidArgument, match=r"input 'plan' is a text column.*example"):
        example_inputs(_meta("xgboost", None))
    # A text input of a model that is no table (an echo, a tokenizer) still gets text.
    assert example_inputs(_meta("python", None))["plan"].tolist() == [[b"1"]]
    # An example: its first row, numbers cast to the model's datatypes, text as BYTES.
    frame = pd.DataFrame({"plan": ["team", "pro"], "age": np.array([33, 40], dtype=np.int8)})
    inputs = request_inputs(_meta("xgboost", None), frame)
    assert inputs.arrays["plan"].tolist() == [["team"]]
    assert inputs.arrays["age"].dtype == np.int64 and inputs.arrays["age"].tolist() == [[33]]
    # servekit bench --example rows.csv: the header names the inputs, the first row is sent.
    (tmp_path / "rows.csv").write_text("plan,age\nbasic,41\npro,50\n")
    inputs = request_inputs(_meta("xgboost", None), csv_example(str(tmp_path / "rows.csv")))
    assert inputs.arrays["plan"].tolist() == [["basic"]]
    assert inputs.arrays["age"].tolist() == [[41]] and inputs.arrays["age"].dtype == np.int64
    (tmp_path / "bad.csv").write_text("plan,age\nbasic,old\n")
    with pytest.raises(InvalidArgument, match="input 'age' takes INT64"):
        request_inputs(_meta("xgboost", None), csv_example(str(tmp_path / "bad.csv")))


@pytest.mark.slow  # mlflow.sklearn.save_model runs `uname` (the environment it records)
async def test_an_mlflow_signature_gives_the_types_and_the_output_shape(
    serve: Serve, tmp_path: Path
) -> None:
    """The churn pipeline saved by MLflow with ``predict_proba`` as its pyfunc method: the
    signature's string column is BYTES, its [-1, 2] tensor output is predict's shape."""
    import warnings

    frame = churn_frame()
    pipe = churn_pipeline(frame)
    with warnings.catch_warnings():  # MLflow warns on its own imports
        warnings.simplefilter("ignore")
        import mlflow.sklearn
        from mlflow.models import infer_signature

        signature = infer_signature(frame, pipe.predict_proba(frame))
        mlflow.sklearn.save_model(
            pipe,
            str(tmp_path / "churn"),
            serialization_format=mlflow.sklearn.SERIALIZATION_FORMAT_CLOUDPICKLE,
            signature=signature,
            pyfunc_predict_fn="predict_proba",
        )
    services = await serve(
        "models:\n  - {name: churn, modelFormat: {name: mlflow}, storageUri: churn}\n"
    )
    assert [s[:2] for s in specs(services, "churn")] == [
        ("plan", "BYTES"),
        ("age", "INT64"),
        ("spend", "FP64"),
    ]
    meta = services.dataplane.model_metadata("churn")
    assert [(t.name, t.datatype, t.shape) for t in meta.outputs] == [("predict", "FP64", (-1, 2))]
    answer = await infer_json(services, "churn", encode_frame(frame.head(4)))
    np.testing.assert_allclose(output(answer, "predict"), pipe.predict_proba(frame.head(4)))


@pytest.mark.slow  # LightGBM's scikit-learn interface asks loky for the cores (a process)
async def test_an_lgbm_classifier_pickle_with_a_category_column(
    serve: Serve, tmp_path: Path
) -> None:
    """LightGBM's scikit-learn interface (how a notebook hands one over), pickled: its category
    column is BYTES with its categories, predict_proba [-1, 3], the answers the model's own."""
    import lightgbm as lgb

    frame = churn_frame(150)
    typed = frame.astype({"plan": "category"})
    label = (frame["plan"].map({"basic": 0, "pro": 1, "team": 2}) + (frame["age"] > 60)) % 3
    model = lgb.LGBMClassifier(n_estimators=5, num_leaves=4, verbose=-1).fit(typed, label)
    joblib.dump(model, tmp_path / "lgbm.joblib")
    services = await serve(
        "models:\n  - {name: lgbm, modelFormat: {name: sklearn}, storageUri: lgbm.joblib}\n"
    )
    assert specs(services, "lgbm")[0] == ("plan", "BYTES", (-1, 1), tuple(PLANS))
    meta = services.dataplane.model_metadata("lgbm")
    assert ("predict_proba", (-1, 3)) in [(t.name, t.shape) for t in meta.outputs]
    rows = frame.head(5)
    answer = await infer_json(services, "lgbm", asking(rows, "predict_proba"))
    np.testing.assert_allclose(
        output(answer, "predict_proba"), model.predict_proba(typed.head(5)), rtol=1e-12
    )
