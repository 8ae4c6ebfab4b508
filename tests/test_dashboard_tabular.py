"""The try-it form of a tabular model in a real browser (Debian's Chromium via Playwright): a
small table with one column per input (a DataFrame pipeline) or per feature (a matrix model),
sent as MLServer's clients send a DataFrame; the answers shown are the estimator's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pandas as pd
import pytest
from browser import CHROMIUM, chromium, collect_errors
from needs import missing

if not CHROMIUM.exists():
    missing(f"Chromium at {CHROMIUM}", "apt-get install chromium chromium-driver", module=True)

from playwright.sync_api import Page, expect
from servers import ServerProcess, start_server
from sklearn.ensemble import RandomForestClassifier
from test_dashboard import LAPTOP, snap
from test_tabular_runtimes import column_pipeline, people

pytestmark = pytest.mark.slow

FRAME = people(60)
PIPE = column_pipeline(FRAME)
X = np.random.default_rng(5).normal(size=(80, 3))
FOREST = RandomForestClassifier(n_estimators=5, random_state=0).fit(X, (X[:, 0] > 0).astype(int))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("tabular-dashboard")
    joblib.dump(PIPE, root / "people.joblib")
    joblib.dump(FOREST, root / "forest.joblib")
    (root / "serve.yaml").write_text(
        "models:\n"
        "  - {name: people, modelFormat: {name: sklearn}, storageUri: people.joblib,\n"
        "     inputs: [{name: visits, datatype: INT64}, {name: city, datatype: BYTES}]}\n"
        "  - {name: forest, modelFormat: {name: sklearn}, storageUri: forest.joblib}\n"
    )
    process = start_server(root / "serve.yaml", grpc=False)
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture
def page(server: ServerProcess) -> Iterator[Page]:
    with chromium() as browser:
        context = browser.new_context(base_url=server.http_url, viewport=LAPTOP)
        page = context.new_page()
        errors = collect_errors(page)
        yield page
        context.close()
        assert errors == []


def shown(page: Page, name: str) -> list[str]:
    cells = page.locator(f'[data-output="{name}"] td[data-value]')
    return [str(v) for v in cells.evaluate_all("cells => cells.map(c => c.dataset.value)")]


def fill(page: Page, column: str, values: list[Any]) -> None:
    for row, value in enumerate(values):
        page.get_by_label(f"{column}, row {row + 1}", exact=True).fill(str(value))


def test_a_dataframe_model_gets_a_table_with_a_column_per_input(page: Page, tmp_path: Path) -> None:
    page.goto("/models/people/try")
    # the table is drawn once the model's metadata arrives: wait for it (bounded), then read
    expect(page.locator("table.tabular-input th").first).to_be_visible()
    headers = page.locator("table.tabular-input th").all_text_contents()
    assert [h.split()[0] for h in headers] == ["age", "visits", "city"]
    page.get_by_role("button", name="Add row").click()
    rows = pd.DataFrame(
        {
            "age": [23.5, 61.0, 45.0, 70.5],
            "visits": [1, 7, 3, 0],
            "city": ["paris", "nice", "lyon", "nice"],
        }
    )
    for column in rows.columns:
        fill(page, column, rows[column].tolist())
    page.get_by_role("checkbox", name="predict_proba").uncheck()
    page.get_by_role("button", name="Run inference").click()
    expect(page.locator("#try-summary")).to_contain_text("HTTP 200")
    assert [int(v) for v in shown(page, "predict")] == PIPE.predict(rows).tolist()
    snap(page, tmp_path, "try-it-out-tabular")
    # A cell that is no number is said before anything is sent.
    page.get_by_label("age, row 2", exact=True).fill("old")
    page.get_by_role("button", name="Run inference").click()
    expect(page.locator("#tabular-error")).to_contain_text('age, row 2: "old" is not a number')


def test_a_matrix_model_gets_a_column_per_feature(page: Page) -> None:
    page.goto("/models/forest/try")
    # the table is drawn once the model's metadata arrives: wait for it (bounded), then read
    expect(page.locator("table.tabular-input th").first).to_be_visible()
    headers = page.locator("table.tabular-input th").all_text_contents()
    assert [h.split()[0] for h in headers] == ["input-0[0]", "input-0[1]", "input-0[2]"]
    page.get_by_role("button", name="Remove row").click()  # 3 rows -> 2
    rows = X[:2].round(3)
    for feature in range(3):
        fill(page, f"input-0[{feature}]", rows[:, feature].tolist())
    page.get_by_role("button", name="Run inference").click()
    expect(page.locator("#try-summary")).to_contain_text("HTTP 200")
    assert [int(v) for v in shown(page, "predict")] == FOREST.predict(rows).tolist()
