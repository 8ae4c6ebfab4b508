"""Issue 40's first hour with a real tabular model, end to end: a churn pipeline (OneHotEncoder
on a text column) and an XGBoost model with a pandas categorical column, fitted here on a
DataFrame and added in a notebook-style script (``servekit.serve`` + ``add_model``). The
metadata says BYTES for the text column; ``server.benchmark`` and ``servekit bench`` run with
no error; Debian's Chromium fills the try-it form with a text value and gets the pipeline's own
``predict_proba``; the benchmark prints its progress on stdout and reports no deadline of its
own."""

from __future__ import annotations

import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from browser import CHROMIUM, chromium, collect_errors
from needs import missing
from test_tabular_types import PLANS, churn_frame, churn_pipeline, churned

import servekit
from servekit.errors import InvalidArgument

if not CHROMIUM.exists():
    missing(f"Chromium at {CHROMIUM}", "apt-get install chromium chromium-driver", module=True)

from playwright.sync_api import expect

pytestmark = pytest.mark.slow

FRAME = churn_frame()
PIPE = churn_pipeline(FRAME)
CLI = {"capture_output": True, "text": True, "timeout": 120}


def xgboost_model() -> Any:
    import xgboost as xgb

    typed = FRAME.astype({"plan": "category"})
    model = xgb.XGBClassifier(n_estimators=6, max_depth=3, enable_categorical=True)
    return model.fit(typed, churned(FRAME))


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    """The notebook's cells: serve, then add the models as they are (skl2onnx cannot convert
    them, so they are served natively: that warning is expected)."""
    with servekit.serve() as server:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            server.add_model("churn", PIPE)
            xgb_model = xgboost_model()
            server.add_model("xchurn", xgb_model, example=FRAME.head(3))
            server.add_model("xbare", xgb_model)
        yield server


def bench_cli(server: Any, model: str, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "servekit", "bench", server.url, model]
    return subprocess.run([*command, "--concurrency", "1,4", "--seconds", "0.3", *extra], **CLI)


def no_errors(table: Any) -> None:
    rows = table.to_list()
    assert [(r["protocol"], r["concurrency"]) for r in rows] == [
        ("http", 1), ("http", 4), ("grpc", 1), ("grpc", 4),
    ]  # fmt: skip
    assert all(r["requests"] > 0 for r in rows), rows
    assert table.errors == 0, table.text()


def test_the_churn_pipeline_says_bytes_and_benchmarks_without_errors(
    server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = server.metadata("churn")["inputs"]
    assert inputs == [
        {"name": "plan", "datatype": "BYTES", "shape": [-1, 1],
         "parameters": {"categories": PLANS}},
        {"name": "age", "datatype": "FP64", "shape": [-1, 1]},
        {"name": "spend", "datatype": "FP64", "shape": [-1, 1]},
    ]  # fmt: skip
    capsys.readouterr()
    no_errors(server.benchmark("churn", concurrency=(1, 4), seconds=0.3))
    printed = capsys.readouterr()
    # The progress bar is on stdout (stderr reads as an error under a notebook cell).
    assert "4/4 done" in printed.out and "in flight" in printed.out
    assert printed.err == ""
    run = bench_cli(server, "churn")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "requests failed" not in run.stderr


def test_xgboost_with_a_categorical_column_says_bytes_and_benchmarks_from_its_example(
    server: Any, tmp_path: Path
) -> None:
    # XGBoost's own feature types; add_model's example declares its columns' dtypes.
    for model, spend in (("xbare", "FP32"), ("xchurn", "FP64")):
        inputs = server.metadata(model)["inputs"]
        assert [(i["name"], i["datatype"]) for i in inputs] == [
            ("plan", "BYTES"),
            ("age", "INT64"),
            ("spend", spend),
        ]
    got = server.infer("xchurn", FRAME.head(4), outputs=["predict_proba"], frame=False)
    want = xgboost_model().predict_proba(FRAME.head(4).astype({"plan": "category"}))
    np.testing.assert_allclose(got["predict_proba"], want, rtol=1e-6)
    # add_model's example is what the benchmark sends.
    no_errors(server.benchmark("xchurn", concurrency=(1, 4), seconds=0.3))
    # Without one, and no categories to draw from, it asks for one instead of sending garbage.
    categories = server.metadata("xbare")["inputs"][0].get("parameters")
    if categories is None:  # pyarrow absent: XGBoost cannot hand its categories out
        with pytest.raises(InvalidArgument, match=r"'plan' is a text column.*example"):
            server.benchmark("xbare", concurrency=(1,), seconds=0.2)
        refused = bench_cli(server, "xbare")
        assert refused.returncode != 0 and "--example rows.csv" in refused.stderr
    FRAME.head(2).to_csv(tmp_path / "rows.csv", index=False)
    run = bench_cli(server, "xbare", "--example", str(tmp_path / "rows.csv"))
    assert run.returncode == 0, run.stdout + run.stderr


def test_no_deadline_errors_unless_a_deadline_was_set(server: Any) -> None:
    """Concurrency 4 on a healthy model: no DEADLINE_EXCEEDED of the benchmark's own making,
    over many short steps (each ends with requests in flight); a deadline the caller sets is
    honoured and its expiries counted."""

    def slow(x: np.ndarray) -> dict[str, np.ndarray]:
        import time

        time.sleep(0.02)
        return {"y": x}

    server.add_model(
        "slow", slow, inputs=[("x", "FP32", [-1, 1])], outputs=[("y", "FP32", [-1, 1])]
    )
    table = server.benchmark("slow", concurrency=(4, 4, 4, 4, 4, 4), seconds=0.15)
    assert table.errors == 0, table.text()
    timed = server.benchmark("slow", concurrency=(4,), seconds=0.3, timeout=0.005)
    kinds = {kind for row in timed.rows for kind in row.error_kinds}
    assert kinds & {"timeout", "gRPC DEADLINE_EXCEEDED"}, timed.text()


def test_chromium_fills_the_try_it_form_with_text_and_gets_predict_proba(server: Any) -> None:
    rows = pd.DataFrame(
        {"plan": ["pro", "team", "basic"], "age": [23.0, 61.0, 45.0], "spend": [80.5, 12.0, 55.0]}
    )
    with chromium() as browser:
        page = browser.new_page(base_url=server.url)
        errors = collect_errors(page)
        page.goto("/models/churn/try")
        expect(page.locator("table.tabular-input th").first).to_be_visible()
        headers = page.locator("table.tabular-input th").all_text_contents()
        assert headers == ["plan BYTES", "age FP64", "spend FP64"]
        # The categories the encoder knows are offered as the text column's choices.
        offered = page.locator("datalist option").evaluate_all("o => o.map(x => x.value)")
        assert offered == PLANS
        for column in rows.columns:
            for row, value in enumerate(rows[column].tolist()):
                page.get_by_label(f"{column}, row {row + 1}", exact=True).fill(str(value))
        page.get_by_role("checkbox", name="predict_proba").check()
        page.get_by_role("button", name="Run inference").click()
        expect(page.locator("#try-summary")).to_contain_text("HTTP 200")
        cells = page.locator('[data-output="predict_proba"] td[data-value]')
        shown = [float(v) for v in cells.evaluate_all("c => c.map(x => x.dataset.value)")]
        np.testing.assert_allclose(shown, PIPE.predict_proba(rows).ravel(), rtol=1e-12)
        assert errors == []


def test_an_example_of_other_columns_than_the_inputs_is_not_what_the_benchmark_sends(
    server: Any,
) -> None:
    """A numeric pipeline converted to ONNX takes one matrix ``X``: the DataFrame example given
    to add_model is no row of it, so the benchmark makes its inputs from the metadata."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    numbers = FRAME[["age", "spend"]]
    pipe = make_pipeline(StandardScaler(), LogisticRegression()).fit(numbers, churned(FRAME))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        server.add_model("numeric", pipe, example=numbers.head(2))
    assert [i["name"] for i in server.metadata("numeric")["inputs"]] == ["X"]
    no_errors(server.benchmark("numeric", concurrency=(1, 4), seconds=0.3))
