"""The dashboard draws a pipeline as its steps with per-step timings (issue 29, item 5), in
Debian's headless Chromium: the ``classify`` pipeline's page lists featurise -> mlp ->
postprocess with each step's version, state and averages, and refreshes them live as requests
arrive; a model that is no pipeline has no such section (models: tests/pipeline_models.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from browser import CHROMIUM, chromium, collect_errors
from needs import missing

if not CHROMIUM.exists():
    missing(f"Chromium at {CHROMIUM}", "apt-get install chromium chromium-driver", module=True)

import tritonclient.http as httpclient
from pipeline_models import rows, write_project
from playwright.sync_api import Page, expect
from servers import ServerProcess, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = start_server(write_project(tmp_path_factory.mktemp("dashboard")), grpc=False)
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture
def page(server: ServerProcess) -> Iterator[Page]:
    with chromium() as browser:
        context = browser.new_context(base_url=server.http_url)
        page = context.new_page()
        errors = collect_errors(page)
        yield page
        assert errors == []
        context.close()


def classify(server: ServerProcess, count: int) -> None:
    with httpclient.InferenceServerClient(server.http_host_port) as client:
        tensor = httpclient.InferInput("RAW", [2, 8], "FP32")
        tensor.set_data_from_numpy(rows(2))
        for _ in range(count):
            client.infer("classify", [tensor])


def test_pipeline_page_draws_its_steps_with_live_timings(server: ServerProcess, page: Page) -> None:
    classify(server, 2)
    page.goto("/models/classify")
    steps = page.locator("#pipeline-steps li.pipeline-step")
    expect(steps).to_have_count(3)
    expect(steps.locator(".step-head a")).to_have_text(["featurise", "mlp", "postprocess"])
    expect(steps.nth(1)).to_contain_text("version 1")
    expect(steps.locator('[data-col="state"]')).to_have_text(["READY"] * 3)
    first = steps.nth(0).locator('[data-step-stat="success"]')
    before = int(first.inner_text())
    assert before >= 2
    expect(steps.nth(2).locator('[data-step-stat="avg_ms.request"]')).not_to_have_text("—")
    expect(steps.locator("meter")).to_have_count(3)  # drawn by static/pipeline.js
    classify(server, 3)
    expect(first).to_have_text(str(before + 3), timeout=15_000)  # polled, no reload
    shares = steps.locator("meter").evaluate_all("ms => ms.map(m => m.value / m.max)")
    assert 0.99 < sum(shares) < 1.01


def test_a_plain_model_has_no_pipeline_section(server: ServerProcess, page: Page) -> None:
    page.goto("/models/mlp")
    expect(page.locator("h1")).to_contain_text("mlp")
    expect(page.locator("#pipeline")).to_have_count(0)


def test_pipeline_page_without_javascript(server: ServerProcess) -> None:
    with server.http_client(timeout=20) as http:
        html = http.get("/models/classify").text
    assert 'id="pipeline-steps"' in html
    assert html.index(">featurise<") < html.index(">mlp<") < html.index(">postprocess<")
    assert html.count('class="pipeline-step"') == 3
