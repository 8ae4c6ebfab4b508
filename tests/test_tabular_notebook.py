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
    np.testing.assert_array_equal(arrays["predict"], pipe.predict(rows))
    when = pd.DataFrame({"when": pd.to_datetime(["2024-05-01 10:00"]), "n": [3]})
    (echoed,) = client.infer("echo", when)["predict"]
    assert echoed == "when:datetime64[us]=2024-05-01 10:00:00|n:int64=3"
