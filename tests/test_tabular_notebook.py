"""``infer(name, DataFrame)`` in a notebook: in process (``servekit.serve``) and over HTTP
(``servekit.connect``), a DataFrame in (numbers, text and datetime columns) and a DataFrame out,
the values the model gives in this process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pandas as pd
import pytest
from tabular_models import DtypeEcho
from test_tabular_runtimes import column_pipeline, people

import servekit

pytestmark = pytest.mark.slow


def test_dataframes_in_and_out(tmp_path: Path) -> None:
    frame = people(50)
    pipe = column_pipeline(frame)
    joblib.dump(pipe, tmp_path / "people.joblib")
    joblib.dump(DtypeEcho(["when", "n"]), tmp_path / "echo.joblib")
    (tmp_path / "serve.yaml").write_text(
        "models:\n"
        "  - {name: people, modelFormat: {name: sklearn}, storageUri: people.joblib}\n"
        "  - {name: echo, modelFormat: {name: sklearn}, storageUri: echo.joblib,\n"
        "     outputs: [{name: predict, datatype: BYTES}]}\n"
    )
    rows = frame.head(5)
    with servekit.serve(tmp_path / "serve.yaml", http_port=0, grpc_port=None) as server:
        remote = servekit.connect(server.url)
        try:
            check(server, rows, pipe)
            check(remote, rows, pipe)
        finally:
            remote.close()


def check(client: Any, rows: pd.DataFrame, pipe: Any) -> None:
    answer = client.infer("people", rows)
    assert isinstance(answer, pd.DataFrame)
    assert list(answer.columns) == ["predict"]
    np.testing.assert_array_equal(answer["predict"].to_numpy(), pipe.predict(rows))
    both = client.infer("people", rows, outputs=["predict", "predict_proba"])
    assert list(both.columns) == ["predict", "predict_proba_0", "predict_proba_1"]
    np.testing.assert_array_equal(
        both[["predict_proba_0", "predict_proba_1"]].to_numpy(), pipe.predict_proba(rows)
    )
    arrays = client.infer("people", rows, frame=False)
    assert isinstance(arrays, dict)
    # Over the wire [N, 1] (MLServer's shape), in the server's process the model's own [N]
    np.testing.assert_array_equal(np.ravel(arrays["predict"]), pipe.predict(rows))
    when = pd.DataFrame({"when": pd.to_datetime(["2024-05-01 10:00"]), "n": [3]})
    (echoed,) = client.infer("echo", when)["predict"]
    assert echoed == "when:datetime64[us]=2024-05-01 10:00:00|n:int64=3"


def test_add_model_serves_natively_what_skl2onnx_cannot_convert(tmp_path: Path) -> None:
    """issue 24's two refused pipelines: a ColumnTransformer over a DataFrame and a
    FunctionTransformer(np.log1p). add_model serves each natively with one warning saying why,
    and after save() a fresh `servekit serve` of the saved folder answers bit-identically."""
    from servers import start_server
    from sklearn.linear_model import LinearRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import FunctionTransformer

    from servekit.formats.native import NativeFallback

    frame = people(50)
    pipe = column_pipeline(frame)
    x = np.random.default_rng(3).uniform(0, 4, (30, 2))
    logged = Pipeline([("log", FunctionTransformer(np.log1p)), ("reg", LinearRegression())])
    logged.fit(x, x @ [2.0, -1.0])
    rows = frame.head(6)
    with servekit.serve(None, http_port=0, grpc_port=None) as server:
        with pytest.warns(NativeFallback, match="skl2onnx cannot convert it .*natively"):
            server.add_model("people", pipe)
        with pytest.warns(NativeFallback, match="FunctionTransformer"):
            server.add_model("logged", logged)
        first = server.infer("people", rows, outputs=["predict", "predict_proba"])
        np.testing.assert_array_equal(first["predict"].to_numpy(), pipe.predict(rows))
        logged_first = server.infer("logged", {"input-0": x[:5]})["predict"]
        np.testing.assert_array_equal(logged_first, logged.predict(x[:5]))
        saved = server.save(tmp_path / "project")
    process = start_server(saved / "serve.yaml", grpc=False)
    try:
        remote = servekit.connect(process.http_url)
        try:
            again = remote.infer("people", rows, outputs=["predict", "predict_proba"])
            pd.testing.assert_frame_equal(again, first)
            np.testing.assert_array_equal(
                remote.infer("logged", {"input-0": x[:5]})["predict"], logged_first.reshape(-1, 1)
            )
        finally:
            remote.close()
    finally:
        assert process.stop() == 0, process.log()
