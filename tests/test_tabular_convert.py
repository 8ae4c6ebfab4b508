"""``convert: onnx`` (issue 24, item 5): a native scikit-learn, XGBoost or LightGBM model is
converted at load, checked against the native model on sample rows, served by ONNX Runtime, and
served natively with the reason when the conversion fails or disagrees. Requests are built with
MLServer's own codecs; the answers must be the native model's (within the stated tolerance)."""

from __future__ import annotations

from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import pytest
from inprocess import Serve, plan_of
from mlserver_codecs import NumpyRequestCodec, RequestOutput
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
from test_tabular_runtimes import column_pipeline, encode_frame, infer_json, output, people

from servekit.config.loader import ConfigError
from servekit.formats import tabular_onnx

pytestmark = pytest.mark.anyio

RNG = np.random.default_rng(11)
X = RNG.normal(size=(200, 4))
Y = (X[:, 0] + X[:, 1] > 0).astype(int)


def close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=tabular_onnx.RTOL, atol=tabular_onnx.ATOL)


async def test_a_random_forest_is_served_by_onnx_runtime_with_the_native_answers(
    serve: Serve, tmp_path: Path
) -> None:
    forest = RandomForestClassifier(n_estimators=20, random_state=0).fit(X, Y)
    joblib.dump(forest, tmp_path / "rf.joblib")
    regressor = RandomForestRegressor(n_estimators=10, random_state=0).fit(X, X[:, 2])
    joblib.dump(regressor, tmp_path / "reg.joblib")
    services = await serve(
        "models:\n"
        "  - {name: rf, modelFormat: {name: sklearn}, storageUri: rf.joblib, convert: onnx}\n"
        "  - {name: reg, modelFormat: {name: sklearn}, storageUri: reg.joblib, convert: onnx}\n"
    )
    assert services.states() == {("rf", "1"): "READY", ("reg", "1"): "READY"}
    assert services.reason("rf").startswith("converted to ONNX at load by skl2onnx")
    assert tabular_onnx.TOLERANCE in services.reason("rf")
    metadata = services.dataplane.model_metadata("rf")
    assert metadata.platform == "onnxruntime_onnx"
    # The native metadata: the same input and outputs a client of the native model uses.
    inputs = [(t.name, t.datatype, t.shape) for t in metadata.inputs]
    assert inputs == [("input-0", "FP64", (-1, 4))]
    assert [t.name for t in metadata.outputs] == ["predict", "predict_proba"]
    rows = RNG.normal(size=(30, 4))
    request = NumpyRequestCodec.encode_request(rows)
    request.outputs = [RequestOutput(name="predict"), RequestOutput(name="predict_proba")]
    answer = await infer_json(services, "rf", request)
    np.testing.assert_array_equal(output(answer, "predict").ravel(), forest.predict(rows))
    close(output(answer, "predict_proba"), forest.predict_proba(rows))
    answer = await infer_json(services, "reg", NumpyRequestCodec.encode_request(rows))
    close(output(answer, "predict").ravel(), regressor.predict(rows))


async def test_xgboost_and_lightgbm_convert_with_onnxmltools(serve: Serve, tmp_path: Path) -> None:
    """An XGBClassifier fitted on a DataFrame (named columns: onnxmltools wants f0, f1, ...)
    and a binary LightGBM Booster (its predict is the probability of class 1)."""
    import lightgbm as lgb
    import xgboost as xgb

    frame = pd.DataFrame(X, columns=["a", "b", "c", "d"])
    classifier = xgb.XGBClassifier(n_estimators=10, max_depth=3).fit(frame, Y)
    classifier.save_model(tmp_path / "xgb.json")
    booster = lgb.train(
        {"objective": "binary", "verbose": -1, "num_leaves": 7}, lgb.Dataset(X, Y), 10
    )
    booster.save_model(tmp_path / "lgb.txt")
    services = await serve(
        "models:\n"
        "  - {name: x, modelFormat: {name: xgboost}, storageUri: xgb.json, convert: onnx}\n"
        "  - {name: l, modelFormat: {name: lightgbm}, storageUri: lgb.txt, convert: onnx}\n"
    )
    assert services.reason("x").startswith("converted to ONNX at load by onnxmltools")
    assert services.reason("l").startswith("converted to ONNX at load by onnxmltools")
    rows = frame.sample(12, random_state=1)
    request = encode_frame(rows)
    request.outputs = [RequestOutput(name="predict"), RequestOutput(name="predict_proba")]
    answer = await infer_json(services, "x", request)
    np.testing.assert_array_equal(output(answer, "predict").ravel(), classifier.predict(rows))
    close(output(answer, "predict_proba"), classifier.predict_proba(rows))
    answer = await infer_json(services, "l", NumpyRequestCodec.encode_request(rows.to_numpy()))
    close(output(answer, "predict").ravel(), booster.predict(rows.to_numpy()))


async def test_what_cannot_convert_is_served_natively_with_the_reason(
    serve: Serve, tmp_path: Path
) -> None:
    """issue 24's DataFrame pipeline (a ColumnTransformer picking columns by name, one of them
    text): no ONNX model of one matrix of numbers can take it. It serves natively, READY, the
    reason in the index (the text column, known from its encoder)."""
    frame = people(40)
    pipe = column_pipeline(frame)
    joblib.dump(pipe, tmp_path / "people.joblib")
    services = await serve(
        "models:\n"
        "  - {name: p, modelFormat: {name: sklearn}, storageUri: people.joblib, convert: onnx}\n"
    )
    assert services.states() == {("p", "1"): "READY"}
    reason = services.reason("p")
    assert reason.startswith("convert: onnx failed, served natively by sklearn: ")
    assert "input(s) city are text; the converted model takes numbers only" in reason
    assert services.dataplane.model_metadata("p").platform == "sklearn"
    answer = await infer_json(services, "p", encode_frame(frame.head(5)))
    np.testing.assert_array_equal(output(answer, "predict").ravel(), pipe.predict(frame.head(5)))


async def test_a_conversion_that_disagrees_is_not_served(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A converter that computes something else (here: the ONNX model of another forest, a
    real ONNX model whose answers differ) is caught by the parity check; the native model
    serves and the reason says by how much they differed."""
    forest = RandomForestClassifier(n_estimators=10, random_state=0).fit(X, Y)
    other = RandomForestClassifier(n_estimators=10, random_state=0).fit(X, 1 - Y)
    joblib.dump(forest, tmp_path / "rf.joblib")
    real = tabular_onnx.to_onnx
    monkeypatch.setattr(tabular_onnx, "to_onnx", lambda model, features: real(other, features))
    services = await serve(
        "models:\n"
        "  - {name: rf, modelFormat: {name: sklearn}, storageUri: rf.joblib, convert: onnx}\n"
    )
    reason = services.reason("rf")
    assert reason.startswith("convert: onnx failed, served natively by sklearn: the ONNX model's")
    assert "differ" in reason
    rows = RNG.normal(size=(8, 4))
    answer = await infer_json(services, "rf", NumpyRequestCodec.encode_request(rows))
    np.testing.assert_array_equal(output(answer, "predict").ravel(), forest.predict(rows))


def test_convert_is_for_the_convertible_formats(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"models\[0\]\.convert.*sklearn, xgboost and lightgbm"):
        plan_of(
            "models:\n"
            "  - {name: m, modelFormat: {name: onnx}, storageUri: m.onnx, convert: onnx}\n",
            tmp_path,
        )
    with pytest.raises(ConfigError, match="convert"):
        plan_of(
            "models:\n"
            "  - {name: m, modelFormat: {name: sklearn}, storageUri: m.onnx, convert: tflite}\n",
            tmp_path,
        )


def test_the_parity_rule() -> None:
    """Labels must be equal; numbers within ATOL + RTOL * |native|; a [N, 1] or a binary
    [N, 2] output answers for a native [N] one."""
    want = {"predict": np.array([0.5, 0.25]), "predict_proba": np.array([[0.1, 0.9]] * 2)}
    onnx = {
        "label": np.array([1, 0]),
        "probabilities": np.array([[0.5, 0.5], [0.75, 0.25]], dtype=np.float32),
        "variable": np.array([[0.5], [0.25 + 1e-6]], dtype=np.float32),
    }
    found = tabular_onnx.match_outputs({"predict": want["predict"]}, onnx, list(onnx))
    assert found["predict"].onnx_output == "probabilities"  # the second column, after label
    found = tabular_onnx.match_outputs({"predict": want["predict"]}, onnx, ["variable"])
    assert found["predict"](onnx["variable"]).shape == (2,)
    with pytest.raises(tabular_onnx.ConversionError, match=r"4 of 4 values differ, by up to 0\.65"):
        tabular_onnx.match_outputs({"p": want["predict_proba"]}, onnx, ["probabilities"])
    with pytest.raises(tabular_onnx.ConversionError, match="1 of 2 labels differ"):
        tabular_onnx.match_outputs({"predict": np.array([1, 1])}, onnx, ["label"])


def test_add_model_conversion_is_checked_against_the_estimator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """add_model's conversion (servekit.formats.convert): a forest converts and agrees on the
    example and sample rows; an ONNX model with other answers is refused with a ParityError,
    which the notebook turns into the native fallback with the tolerance in its warning."""
    from servekit.formats import convert, native

    forest = RandomForestClassifier(n_estimators=10, random_state=0).fit(X, Y)
    assert convert.sklearn_to_onnx(forest, X[:5])[:2]  # ONNX bytes, parity held
    other = RandomForestClassifier(n_estimators=10, random_state=0).fit(X, 1 - Y)
    real = tabular_onnx.to_onnx
    monkeypatch.setattr(tabular_onnx, "to_onnx", lambda model, features: real(other, features))
    with pytest.raises(tabular_onnx.ParityError, match="predict does not match") as caught:
        convert.sklearn_to_onnx(forest, X[:5])
    with pytest.warns(native.NativeFallback, match=r"skl2onnx converts it, but the ONNX model"):
        native.warn("rf", caught.value)
