"""The web dashboard in a real browser: Debian's headless Chromium driven by Playwright.

A real ``servekit serve`` subprocess (tests/servers.py) serves a small model store; every check
compares what the page shows with what a real client (tritonclient.http, curl) gets from the
same server. Screenshots of every page at laptop and phone width go to ``SERVEKIT_SCREENSHOTS``
when set (``SERVEKIT_SCREENSHOTS=docs/screenshots`` refreshes the committed ones), else to a
temporary folder. In CI these tests always run; elsewhere they skip only without Chromium.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnx_builders
import pytest
from browser import CHROMIUM, chromium, collect_errors
from needs import missing

if not CHROMIUM.exists():
    missing(f"Chromium at {CHROMIUM}", "apt-get install chromium chromium-driver", module=True)

import tritonclient.http as httpclient
from playwright.sync_api import Browser, Page, Route, ViewportSize, expect
from prometheus_client.parser import text_string_to_metric_families
from servers import ServerProcess, grpc_available, running_server, start_server
from waits import wait_until

from servekit.services.stats import WINDOW_SLOT_S, WINDOW_SLOTS

pytestmark = pytest.mark.slow

LAPTOP: ViewportSize = {"width": 1280, "height": 800}
PHONE: ViewportSize = {"width": 390, "height": 844}
# `broken` is broken on purpose; readiness must not wait for it (tests/test_readiness.py covers
# strict readiness, the default, on the dashboard's pill too).
SERVE_YAML = """\
server: {name: dashboard-demo, strictReadiness: false}
models:
  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp, versionPolicy: {all: {}}}
  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub}
  - {name: text_identity, modelFormat: {name: onnx}, storageUri: text_identity.onnx}
  - {name: image_identity, modelFormat: {name: onnx}, storageUri: image_identity.onnx}
  - {name: broken, modelFormat: {name: onnx}, storageUri: broken.onnx}
  - {name: classifier, modelFormat: {name: onnx}, storageUri: classifier.onnx}
"""


def _save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


@pytest.fixture(scope="module", autouse=True)
def _patient_expect() -> None:
    """CI machines may be busy: give page assertions (which retry) more time than 5 s."""
    expect.set_options(timeout=15_000)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Its own server: these tests unload and load models, which others must not see."""
    root = tmp_path_factory.mktemp("dashboard")
    for version in (1, 2):
        _save(onnx_builders.mlp(seed=version), root / "mlp" / str(version) / "model.onnx")
    _save(onnx_builders.add_sub(), root / "add_sub" / "1" / "model.onnx")
    _save(onnx_builders.identity("BYTES", ["batch"]), root / "text_identity.onnx")
    _save(onnx_builders.identity("UINT8", ["batch", 8, 8, 3]), root / "image_identity.onnx")
    _save(onnx_builders.classifier(), root / "classifier.onnx")
    (root / "broken.onnx").write_bytes(bytes(range(256)) * 4)
    config = root / "serve.yaml"
    config.write_text(SERVE_YAML)
    process = start_server(config, grpc=grpc_available())
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium (``playwright install`` is never used), for this module only."""
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Browser, server: ServerProcess) -> Iterator[Page]:
    context = browser.new_context(base_url=server.http_url, viewport=LAPTOP)
    yield context.new_page()
    context.close()


@pytest.fixture(scope="module")
def triton(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.http_host_port)
    yield client
    client.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wanted = os.environ.get("SERVEKIT_SCREENSHOTS")
    folder = Path(wanted) if wanted else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def page_errors(page: Page) -> Iterator[list[str]]:
    """Uncaught script errors and Content-Security-Policy refusals: every test ends with none."""
    errors = collect_errors(page)
    yield errors
    assert errors == []


def snap(page: Page, shots: Path, name: str) -> None:
    """Screenshot at laptop and phone width; at both, nothing may overflow sideways."""
    for label, size in (("laptop", LAPTOP), ("phone", PHONE)):
        page.set_viewport_size(size)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{name} is {overflow}px wider than a {size['width']}px screen"
        page.screenshot(path=str(shots / f"{name}-{label}.png"), full_page=True)
    page.set_viewport_size(LAPTOP)


def test_home_shows_health_addresses_states_and_errors(
    page: Page, page_errors: list[str], server: ServerProcess, shots: Path
) -> None:
    page.goto("/")
    expect(page.locator("[data-bind=ready-pill]")).to_have_text("Ready")
    expect(page.get_by_text(server.http_url)).to_be_visible()
    if server.grpc_target:
        expect(page.get_by_text(server.grpc_target, exact=True)).to_be_visible()
    expect(page.locator("[data-bind=models-READY]")).to_have_text("5")
    expect(page.locator("[data-bind=models-UNAVAILABLE]")).to_have_text("1")
    metadata = httpx.get(f"{server.http_url}/v2").json()
    for extension in metadata["extensions"]:
        expect(page.locator(".chips").get_by_text(extension, exact=True)).to_be_visible()
    expect(page.locator("[data-bind=problems]")).to_contain_text("not a valid ONNX model")
    expect(page.locator("[data-bind=errors] li").first).to_contain_text("broken")
    expect(page.locator("#workers")).to_have_count(0)  # one process: no Workers panel
    snap(page, shots, "home")


def test_index_lists_versions_and_filters(
    page: Page, page_errors: list[str], server: ServerProcess, shots: Path
) -> None:
    page.goto("/models")
    index = httpx.post(f"{server.http_url}/v2/repository/index").json()
    for row in index:
        cells = page.locator(
            f'tbody[data-model="{row["name"]}"] tr[data-version="{row["version"]}"]'
        )
        expect(cells.locator("[data-col=state]")).to_have_text(row["state"])
        expect(cells.locator("[data-col=reason]")).to_have_text(row["reason"])
    mlp = page.locator('tbody[data-model="mlp"]')
    expect(mlp.locator("tr[data-version]")).to_have_count(2)
    expect(mlp.locator('tr[data-version="2"] [data-col=platform]')).to_have_text("onnxruntime_onnx")
    expect(mlp).to_contain_text("onnxruntime")
    snap(page, shots, "models")
    page.get_by_label("Name").fill("ML")
    expect(page.locator("tbody[data-model]:visible")).to_have_count(1)
    expect(page.locator("[data-bind=shown]")).to_have_text("2 of 7 versions")
    page.get_by_label("Name").fill("")
    page.get_by_label("State").select_option("UNAVAILABLE")
    expect(page.locator("tbody[data-model]:visible")).to_have_count(1)
    expect(page.locator('tbody[data-model="broken"]')).to_be_visible()
    assert "state=UNAVAILABLE" in page.url  # the filtered view can be bookmarked


def test_pages_are_readable_without_javascript(
    browser: Any, server: ServerProcess, triton: httpclient.InferenceServerClient
) -> None:
    context = browser.new_context(base_url=server.http_url, java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto("/models?state=UNAVAILABLE")
        expect(page.locator("tbody[data-model]")).to_have_count(1)
        expect(page.locator('tbody[data-model="broken"] [data-col=state]')).to_have_text(
            "UNAVAILABLE"
        )
        page.goto("/models/mlp")
        meta = triton.get_model_metadata("mlp")
        for tensor in meta["inputs"] + meta["outputs"]:
            expect(
                page.locator("table.data").get_by_text(tensor["name"], exact=True)
            ).to_be_visible()
        expect(page.get_by_text("[-1, 16]")).to_be_visible()
        page.goto("/")
        expect(page.locator("[data-bind=model-count]")).to_have_text("6")
    finally:
        context.close()


def test_model_page_statistics_update_live(
    page: Page,
    page_errors: list[str],
    server: ServerProcess,
    triton: httpclient.InferenceServerClient,
    shots: Path,
) -> None:
    page.goto("/models/mlp")
    config = triton.get_model_config("mlp")
    expect(page.locator("pre.code").first).to_contain_text(f'"name": "{config["name"]}"')
    ok = page.locator('#version-stats tr[data-version="1"] [data-stat=success]')
    before = int(ok.inner_text())
    inputs = [httpclient.InferInput("input", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(np.ones((1, 16), np.float32))
    for _ in range(3):
        triton.infer("mlp", inputs, model_version="1")
    stats = triton.get_inference_statistics("mlp", "1")["model_stats"][0]
    expected = int(stats["inference_stats"]["success"]["count"])
    assert expected == before + 3
    expect(ok).to_have_text(str(expected), timeout=10_000)  # polled, no reload
    average = page.locator('#version-stats tr[data-version="1"] [data-stat="avg_ms.request"]')
    expect(average).not_to_have_text("—")
    # The last minutes: p50/p90/p99 lines and requests/s columns from the server's rolling
    # window, which holds the requests just sent (and the earlier tests').
    recent = httpx.get(f"{server.http_url}/dashboard/api/models/mlp").json()
    (v1,) = [v for v in recent["versions"] if v["version"] == "1"]
    busy = [p for p in v1["stats"]["recent"] if p["requests"]]
    assert 3 <= sum(p["requests"] for p in busy) <= expected
    assert all(0 < p["p50_ms"] <= p["p90_ms"] <= p["p99_ms"] for p in busy)
    chart = page.locator('figure[data-latency="1"] svg.chart.latency')
    for line in ("p50", "p90", "p99"):
        expect(chart.locator(f'path.line[data-line="{line}"]')).to_have_count(1)
        expect(chart.locator(f"circle.dot.{line}").first).to_be_visible()
    expect(chart.locator("rect.bar:not(.zero)").first).to_be_visible()
    expect(page.locator('figure[data-latency="1"] table')).to_be_hidden()  # the chart says it
    snap(page, shots, "model")


def _shown_output(page: Page, name: str) -> list[str]:
    """The exact values shown in an output's table (cells carry them in data-value)."""
    cells = page.locator(f'[data-output="{name}"] td[data-value]')
    return [str(v) for v in cells.evaluate_all("cells => cells.map(c => c.dataset.value)")]


def test_try_it_out_equals_tritonclient(
    page: Page,
    page_errors: list[str],
    server: ServerProcess,
    triton: httpclient.InferenceServerClient,
    shots: Path,
) -> None:
    page.goto("/models/mlp/try")
    page.select_option("#try-version", "1")
    page.get_by_role("button", name="Fill input with random").click()
    values = np.array(json.loads(page.locator("textarea").input_value()), np.float32)
    assert values.shape == (1, 16)
    page.get_by_role("button", name="Run inference").click()
    expect(page.locator("#try-summary")).to_contain_text("HTTP 200")
    expect(page.locator("#try-summary")).to_contain_text("version 1")
    inputs = [httpclient.InferInput("input", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(values)
    direct = triton.infer("mlp", inputs, model_version="1").as_numpy("output")
    shown = np.array([float(v) for v in _shown_output(page, "output")], np.float32)
    np.testing.assert_array_equal(shown, direct.reshape(-1))
    text = page.locator('[data-output="output"] td[data-value]').all_inner_texts()
    np.testing.assert_allclose([float(t) for t in text], direct.reshape(-1), rtol=1e-5)
    expect(page.locator('[data-output="output"] svg.chart rect')).to_have_count(4)
    expect(page.locator('[data-output="output"]')).to_contain_text("shape [1, 4]")
    assert float(page.locator("[data-latency-ms]").get_attribute("data-latency-ms") or 0) > 0
    raw = json.loads(page.locator("#try-raw").text_content() or "{}")
    assert raw["model_version"] == "1"
    # The snippets are the very request: run them and get the same numbers.
    curl = page.locator("#try-curl").text_content() or ""
    answer = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=30)
    from_curl = np.array(json.loads(answer.stdout)["outputs"][0]["data"], np.float32)
    np.testing.assert_array_equal(from_curl, direct.reshape(-1))
    python = page.locator("#try-python").text_content() or ""
    ran = subprocess.run([sys.executable, "-c", python], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("output [[")
    connect = page.locator("#try-connect").text_content() or ""
    assert "servekit.connect(" in connect
    ran = subprocess.run(
        [sys.executable, "-c", connect], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("output [[")
    snap(page, shots, "try-it-out")


def test_bad_input_shows_the_servers_error_inline(
    page: Page, page_errors: list[str], server: ServerProcess, shots: Path
) -> None:
    """A request the form cannot judge (a UINT8 value out of range) gets the server's error."""
    page.goto("/models/image_identity/try")
    values = [300] + [0] * (8 * 8 * 3 - 1)
    page.locator('[data-input="INPUT0"] textarea').fill(", ".join(map(str, values)))
    page.locator('[data-input="INPUT0"] textarea').press("Control+Enter")  # keyboard submit
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 8, 8, 3], "datatype": "UINT8",
                        "data": values}]}  # fmt: skip
    answer = httpx.post(f"{server.http_url}/v2/models/image_identity/infer", json=body)
    assert answer.status_code == 400
    expect(page.locator("#try-error")).to_have_text(f"HTTP 400: {answer.json()['error']}")
    expect(page.locator("#try-error")).to_have_attribute("role", "alert")
    snap(page, shots, "try-it-out-error")
    page.goto("/models/add_sub/try")
    page.locator('[data-input="INPUT0"] textarea').fill("1, two, 3")
    page.get_by_role("button", name="Run inference").click()
    field_error = page.locator('[data-input="INPUT0"] .field-error')
    expect(field_error).to_contain_text('value 2 ("two") is not a number')  # caught before sending


def test_a_wrong_shape_is_refused_before_sending(page: Page, page_errors: list[str]) -> None:
    """Values that do not fill the shape, or a shape the model cannot take, are said next to
    the input and nothing is sent (the form used to rewrite the shape and send it anyway)."""
    page.goto("/models/add_sub/try")
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if r.url.endswith("/infer") else None)
    field = page.locator('[data-input="INPUT0"]')
    field.locator("textarea").fill("1, 2, 3")
    page.get_by_role("button", name="Run inference").click()
    expect(field.locator(".field-error")).to_contain_text(
        "3 value(s) for shape [1, 16], which holds 16"
    )
    expect(page.locator("#try-error")).to_contain_text("Not sent")
    field.locator("textarea").fill("[[1, 2, 3], [4, 5, 6]]")
    page.get_by_role("button", name="Run inference").click()
    expect(field.locator(".field-error")).to_contain_text("dimension 2 must be 16")
    assert sent == []


def test_nesting_that_disagrees_with_shape_is_refused_not_rewritten(
    page: Page, page_errors: list[str]
) -> None:
    """Two rows pasted while Shape says one: refused before sending, Shape left as typed (the
    form used to take the nesting as the shape and send it)."""
    page.goto("/models/mlp/try")
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if r.url.endswith("/infer") else None)
    field = page.locator('[data-input="input"]')
    expect(field.get_by_label("Shape")).to_have_value("1, 16")
    field.locator("textarea").fill(json.dumps([[1.0] * 16, [2.0] * 16]))
    page.get_by_role("button", name="Run inference").click()
    expect(field.locator(".field-error")).to_contain_text(
        "the values are nested as [2, 16] but Shape says [1, 16]: set Shape to 2, 16"
    )
    expect(field.get_by_label("Shape")).to_have_value("1, 16")
    assert sent == []
    field.get_by_label("Shape").fill("2, 16")
    page.get_by_role("button", name="Run inference").click()
    expect(page.locator("#try-summary")).to_contain_text("HTTP 200")
    expect(page.locator('[data-output="output"]')).to_contain_text("shape [2, 4]")
    assert len(sent) == 1


def test_only_score_like_outputs_are_charted(page: Page, page_errors: list[str]) -> None:
    """A 2-row batch of a classifier: neither its INT64 ``label`` nor its per-row
    probabilities are ranked as one score vector; one row's probabilities are."""
    page.goto("/models/classifier/try")
    field = page.locator('[data-input="X"]')
    field.get_by_label("Shape").fill("2, 4")
    field.locator("textarea").fill("[[1, 2, 3, 4], [4, 3, 2, 1]]")
    page.get_by_role("button", name="Run inference").click()
    expect(page.locator("#try-summary")).to_contain_text("HTTP 200")
    expect(page.locator('[data-output="label"]')).to_contain_text("shape [2]")
    expect(page.locator('[data-output="label"] svg.chart')).to_have_count(0)
    expect(page.locator('[data-output="probabilities"] svg.chart')).to_have_count(0)
    field.get_by_label("Shape").fill("1, 4")
    field.locator("textarea").fill("[[1, 2, 3, 4]]")
    page.get_by_role("button", name="Run inference").click()
    expect(page.locator('[data-output="label"]')).to_contain_text("shape [1]")
    expect(page.locator('[data-output="probabilities"] svg.chart rect')).to_have_count(3)
    expect(page.locator('[data-output="label"] svg.chart')).to_have_count(0)


def test_titles_and_the_models_table_say_what_they_hold(page: Page, page_errors: list[str]) -> None:
    page.goto("/")
    assert page.title() == "Overview · dashboard-demo · servekit"
    page.goto("/models")
    expect(page.locator("#model-index thead th").first).to_have_text("Model / version")


def test_bytes_and_image_inputs(page: Page, page_errors: list[str], tmp_path: Path) -> None:
    page.goto("/models/text_identity/try")
    page.get_by_label("Shape").fill("2")
    page.get_by_label("Values of INPUT0").fill("hello\nwörld")
    page.get_by_role("button", name="Run inference").click()
    expect(page.locator("#try-summary")).to_contain_text("HTTP 200")
    assert _shown_output(page, "OUTPUT0") == ["hello", "wörld"]
    page.goto("/models/image_identity/try")
    image = tmp_path / "gradient.png"
    pixels = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    image.write_bytes(_png(pixels))
    page.get_by_label("Load an image into INPUT0").set_input_files(str(image))
    expect(page.get_by_label("Shape")).to_have_value("1, 8, 8, 3")
    page.get_by_role("button", name="Run inference").click()
    expect(page.locator("#try-summary")).to_contain_text("HTTP 200")
    expect(page.locator('[data-output="OUTPUT0"] canvas.preview')).to_be_visible()
    raw = json.loads(page.locator("#try-raw").text_content() or "{}")
    assert raw["outputs"][0]["data"] == pixels.reshape(-1).tolist()


def _png(rgb: np.ndarray) -> bytes:
    """A minimal RGB PNG (no imaging library needed)."""
    height, width, _ = rgb.shape
    rows = b"".join(b"\x00" + rgb[y].tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def test_unload_clicked_before_the_first_refresh_answers(
    page: Page, page_errors: list[str], triton: httpclient.InferenceServerClient
) -> None:
    """On a slow server the index's first refresh may not have answered when the user clicks:
    the action is still sent, and the rows update once the refresh answers."""
    held: list[Route] = []

    def hold(route: Route) -> None:
        held.append(route)  # every refresh waits until released

    page.route("**/dashboard/api/models", hold)
    page.goto("/models")
    model = page.locator('tbody[data-model="add_sub"]')
    page.once("dialog", lambda dialog: dialog.accept())
    model.get_by_role("button", name="Unload", exact=True).click()
    wait_until(lambda: not triton.is_model_ready("add_sub"), what="add_sub to be unloaded")
    for route in held:
        route.continue_()
    page.unroute("**/dashboard/api/models", hold)  # also lets through any refresh held since
    expect(model.locator('tr[data-version="1"] [data-col=state]')).to_have_text("UNAVAILABLE")
    expect(model.locator(".action-msg")).to_have_text("Unloaded add_sub.")
    model.get_by_role("button", name="Load", exact=True).click()
    expect(model.locator(".action-msg")).to_have_text("Loaded add_sub.")
    assert triton.is_model_ready("add_sub")


def test_unload_and_load_from_the_index(
    page: Page, page_errors: list[str], triton: httpclient.InferenceServerClient
) -> None:
    page.goto("/models")
    page.evaluate("window.__sameDocument = true")
    model = page.locator('tbody[data-model="add_sub"]')
    page.once("dialog", lambda dialog: dialog.accept())  # unload asks first
    model.get_by_role("button", name="Unload", exact=True).click()
    expect(model.locator('tr[data-version="1"] [data-col=state]')).to_have_text("UNAVAILABLE")
    expect(model.locator(".action-msg")).to_have_text("Unloaded add_sub.")
    assert not triton.is_model_ready("add_sub")
    model.get_by_role("button", name="Load", exact=True).click()
    expect(model.locator('tr[data-version="1"] [data-col=state]')).to_have_text("READY")
    expect(model.locator(".action-msg")).to_have_text("Loaded add_sub.")
    assert triton.is_model_ready("add_sub")
    assert page.evaluate("window.__sameDocument") is True  # updated in place, no reload


def test_benchmark_button_shows_the_servers_table(page: Page, page_errors: list[str]) -> None:
    """The model page's Benchmark button: the server drives add_sub over HTTP and gRPC and the
    page shows one row per protocol and concurrency (counts checked, never speed)."""
    page.goto("/models/add_sub")
    page.get_by_role("button", name="Benchmark").click()
    rows = page.locator("#benchmark-table tbody tr")
    expect(rows).to_have_count(4 if grpc_available() else 2, timeout=90_000)
    expect(page.locator("#benchmark-status")).to_contain_text("Done")
    protocols = rows.locator("td:first-child").all_inner_texts()
    assert protocols[:2] == ["http", "http"]
    errors = rows.locator("td:last-child").all_inner_texts()
    assert set(errors) == {"0"}


def test_workers_panel_shows_each_workers_figures_live(
    browser: Browser, tmp_path: Path, shots: Path
) -> None:
    """With ``--workers 2`` the overview has a Workers panel: the figures of
    ``GET /servekit/v1/workers``, polled (requests sent while the page is open show up)."""
    _save(onnx_builders.add_sub(), tmp_path / "add_sub" / "1" / "model.onnx")
    config = tmp_path / "serve.yaml"
    config.write_text(
        "models:\n  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub}\n"
    )
    with running_server(config, grpc=False, extra=["--workers", "2"]) as workers_server:
        context = browser.new_context(base_url=workers_server.http_url, viewport=LAPTOP)
        try:
            page = context.new_page()
            errors = collect_errors(page)
            page.goto("/")
            rows = page.locator("#worker-table tbody tr")
            expect(rows).to_have_count(2)
            listed = httpx.get(f"{workers_server.http_url}/servekit/v1/workers").json()["workers"]
            for worker in listed:
                row = page.locator(f'#worker-table tr[data-worker="{worker["index"]}"]')
                expect(row.locator("[data-col=pid]")).to_have_text(str(worker["pid"]))
                expect(row.locator("[data-col=state]")).to_have_text("serving")
                expect(row.locator("[data-col=restarts]")).to_have_text("0")
            data = [1.0] * 16
            body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "FP32", "data": data}
                               for n in ("INPUT0", "INPUT1")]}  # fmt: skip
            for _ in range(10):  # new connections: spread over both workers
                answer = httpx.post(f"{workers_server.http_url}/v2/models/add_sub/infer", json=body)
                assert answer.status_code == 200

            def shown_total() -> int:
                cells = page.locator("#worker-table [data-col=success]").all_inner_texts()
                return sum(int(c) for c in cells)

            expect(page.locator("#worker-table")).to_be_visible()
            page.wait_for_function(  # polled, no reload
                "() => [...document.querySelectorAll('#worker-table [data-col=success]')]"
                ".reduce((n, td) => n + Number(td.textContent), 0) === 10",
                timeout=15_000,
            )
            assert shown_total() == 10
            snap(page, shots, "home-workers")
            assert errors == []
        finally:
            context.close()


BATCH_MODELS = """\
import time


def slow_double(x):
    time.sleep(0.02)  # long enough for the other clients' requests to queue behind a call
    return x * 2
"""
BATCH_IO = (
    "inputs: [{name: x, datatype: FP32, shape: [-1, 4]}], "
    "outputs: [{name: y, datatype: FP32, shape: [-1, 4]}]"
)


def _bars(page: Page, chart: str) -> list[tuple[str, int]]:
    """(label, value) of every bar a chart of the model page draws."""
    rects = page.locator(f'figure[data-chart="{chart}"] svg.chart rect')
    found = rects.evaluate_all("rs => rs.map(r => [r.dataset.label, Number(r.dataset.value)])")
    return [(str(label), int(value)) for label, value in found]


def test_model_page_charts_batch_sizes_their_reasons_and_queue_times(
    browser: Browser, tmp_path: Path, shots: Path
) -> None:
    """A batching model under concurrent load (8 threads, real HTTP): the model page charts
    the batch sizes, why batches stopped and the time in queue, and every bar is the server's
    number (``/v2/models/batched/stats`` and ``/metrics``). A model without dynamic batching
    says so plainly and still charts its queue times."""
    (tmp_path / "batch_models.py").write_text(BATCH_MODELS)
    config = tmp_path / "serve.yaml"
    config.write_text(
        "models:\n"
        "  - {name: batched, modelFormat: {name: python}, entrypoint: batch_models:slow_double,\n"
        f"     maxBatchSize: 8, dynamicBatching: {{}}, {BATCH_IO}}}\n"
        "  - {name: single, modelFormat: {name: python}, entrypoint: batch_models:slow_double,\n"
        f"     {BATCH_IO}}}\n"
    )
    with running_server(config, grpc=False) as batching_server:
        url = batching_server.http_url
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1] * 4}]}

        def client(model: str, count: int) -> list[int]:
            with httpx.Client(base_url=url, timeout=30) as http:
                return [http.post(f"/v2/models/{model}/infer", json=body).status_code
                        for _ in range(count)]  # fmt: skip

        with ThreadPoolExecutor(8) as pool:
            statuses = [s for part in pool.map(client, ["batched"] * 8, [12] * 8) for s in part]
        assert statuses == [200] * 96
        assert client("single", 3) == [200] * 3
        stats = httpx.get(f"{url}/v2/models/batched/stats").json()["model_stats"][0]
        sizes = {
            int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]
        }
        assert max(sizes) > 1, sizes  # requests did queue and were stacked
        dispatched = {}
        for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
            for sample in family.samples:
                if sample.name == "servekit_batch_dispatch_total":
                    dispatched[sample.labels["reason"]] = int(sample.value)

        context = browser.new_context(base_url=url, viewport=LAPTOP)
        try:
            page = context.new_page()
            errors = collect_errors(page)
            page.goto("/models/batched")
            section = page.locator("#queue-batching")
            expect(section.locator('figure[data-chart="batch-sizes"] rect')).to_have_count(
                len(sizes)
            )
            assert dict(_bars(page, "batch-sizes")) == {str(k): v for k, v in sizes.items()}
            reasons = _bars(page, "dispatch")
            labels = [label for label, _ in reasons]
            assert labels[:2] == [
                "Queue empty when an instance freed",
                "Reached a preferred batch size",
            ]
            assert "Reached maxBatchSize" in labels
            shown = dict(reasons)
            assert shown["Queue empty when an instance freed"] == dispatched.get("queue_drained", 0)
            assert shown["Reached maxBatchSize"] == dispatched.get("max_size", 0)
            assert sum(shown.values()) == int(stats["execution_count"])
            queue = _bars(page, "queue")
            assert queue[0][0] == "≤ 0.1 ms"
            assert sum(v for _, v in queue) == int(stats["inference_stats"]["success"]["count"])
            expect(section.locator("table.chart-table").first).to_be_hidden()  # the chart says it
            snap(page, shots, "model-batching")

            page.goto("/models/single")
            expect(page.locator("[data-bind=no-batching]")).to_contain_text("No dynamic batching")
            expect(page.locator('figure[data-chart="batch-sizes"]')).to_have_count(0)
            expect(page.locator('figure[data-chart="queue"] rect').first).to_be_visible()
            assert sum(v for _, v in _bars(page, "queue")) == 3
            assert errors == []
        finally:
            context.close()
        plain = browser.new_context(base_url=url, java_script_enabled=False)
        try:  # without JavaScript the same numbers are tables
            page = plain.new_page()
            page.goto("/models/batched")
            rows = page.locator('figure[data-chart="batch-sizes"] tbody tr')
            expect(rows).to_have_count(len(sizes))
            drained = page.locator('figure[data-chart="dispatch"] tr[data-reason="queue_drained"]')
            expect(drained.locator("td.num")).to_have_text(str(dispatched.get("queue_drained", 0)))
        finally:
            plain.close()


SLEEPY_MODEL = """\
import time


def sleepy(x):
    time.sleep(float(x.flat[0]) / 1000)  # the first value is the milliseconds to take
    return x
"""
# Counts the pixels of one colour in a PNG, decoded by the browser itself.
COUNT_COLOUR = """async ([png, rgb, tolerance]) => {
  const image = new Image();
  image.src = `data:image/png;base64,${png}`;
  await image.decode();
  const canvas = document.createElement("canvas");
  canvas.width = image.width;
  canvas.height = image.height;
  const context = canvas.getContext("2d");
  context.drawImage(image, 0, 0);
  const { data } = context.getImageData(0, 0, image.width, image.height);
  let count = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (Math.abs(data[i] - rgb[0]) <= tolerance && Math.abs(data[i + 1] - rgb[1]) <= tolerance
        && Math.abs(data[i + 2] - rgb[2]) <= tolerance) count += 1;
  }
  return count;
}"""


def test_latency_chart_draws_lines_over_a_time_axis(
    browser: Browser, tmp_path: Path, shots: Path
) -> None:
    """Three 10 s slots of real traffic at 2, 40 and 10 ms: the latency chart draws p99 as a
    line in its colour (counted in Chromium's own pixels: a line has about two pixels per unit
    of length, a filled shape far more), over a time axis from -5 min to now, with its y scale
    spread over the plot."""
    (tmp_path / "sleepy_model.py").write_text(SLEEPY_MODEL)
    config = tmp_path / "serve.yaml"
    config.write_text(
        "models:\n"
        "  - {name: sleepy, modelFormat: {name: python}, entrypoint: sleepy_model:sleepy,\n"
        f"     {BATCH_IO}}}\n"
    )

    def slot() -> int:
        return int(time.time() // WINDOW_SLOT_S)

    with running_server(config, grpc=False) as sleepy_server, sleepy_server.http_client() as http:
        for delay in (2, 40, 10):  # each fills the rest of one slot of the server's window
            started = slot()
            for _ in range(2000):  # bounded; a slot is 10 s, the slowest request 40 ms
                if slot() != started:
                    break
                body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                    "data": [delay, 0, 0, 0]}]}  # fmt: skip
                assert http.post("/v2/models/sleepy/infer", json=body).status_code == 200
        context = browser.new_context(
            base_url=sleepy_server.http_url, viewport=LAPTOP, device_scale_factor=1
        )
        try:
            page = context.new_page()
            errors = collect_errors(page)
            page.goto("/models/sleepy")
            chart = page.locator('figure[data-latency="1"] svg.chart.latency')
            expect(chart.locator("rect.bar:not(.zero)").nth(2)).to_be_visible()  # 3 slots
            p99 = chart.locator('[data-line="p99"]')
            expect(p99).to_have_count(1)
            # The line's own style: stroked in its colour, never filled.
            style = p99.evaluate("l => [getComputedStyle(l).stroke, getComputedStyle(l).fill]")
            rgb = [int(c) for c in style[0].removeprefix("rgb(").rstrip(")").split(",")]
            length = float(p99.evaluate("l => l.getTotalLength()"))
            dots = chart.locator("circle.dot.p99").count()
            png = base64.b64encode(chart.screenshot()).decode()
            blank = context.new_page()
            counted = int(blank.evaluate(COUNT_COLOUR, [png, rgb, 48]))
            blank.close()
            assert counted >= 0.5 * length, (counted, length)  # the line is drawn, in its colour
            # At most its 2 px stroke, its dots and the key's "p99": no filled area.
            assert counted <= 2.5 * length + 40 * dots + 150, (counted, length, dots)
            assert style[1] == "none", style
            # The time axis: labels from the window's start to now.
            labels = chart.locator("text").all_text_contents()
            for label in ("-5 min", "-1 min", "now"):
                assert label in labels, labels
            # The scales use the plot: the lines span its middle, and the last busy
            # slot sits a slot or two left of "now" (x is the window's time).
            box = chart.evaluate(
                """svg => {
                  const frame = svg.querySelector("rect.frame").getBBox();
                  const lines = [...svg.querySelectorAll("[data-line]")].map((l) => l.getBBox());
                  const top = Math.min(...lines.map((b) => b.y));
                  const bottom = Math.max(...lines.map((b) => b.y + b.height));
                  const texts = [...svg.querySelectorAll("text")];
                  const now = texts.find((t) => t.textContent === "now");
                  const last = Math.max(...lines.map((b) => b.x + b.width));
                  return { frame: [frame.y, frame.height], lines: [top, bottom],
                           now: now.getBBox().x + now.getBBox().width, last,
                           width: frame.width };
                }"""
            )
            frame_top, frame_height = box["frame"]
            assert frame_top <= box["lines"][0] and box["lines"][1] <= frame_top + frame_height
            # Round ticks leave headroom (up to a step above the largest figure), so "most of
            # its height" is: the highest point in the upper part, the lowest in the lower part.
            assert box["lines"][0] <= frame_top + 0.45 * frame_height, box
            assert box["lines"][1] >= frame_top + 0.55 * frame_height, box
            slot_width = box["width"] / WINDOW_SLOTS
            assert 0.4 * slot_width <= box["now"] - box["last"] <= 4 * slot_width, box
            # Each p99 dot is the server's figure: a larger p99 is drawn higher.
            recent = http.get("/dashboard/api/models/sleepy").json()["versions"][0]["stats"]
            figures = [p["p99_ms"] for p in recent["recent"] if p["requests"]]
            heights = chart.locator("circle.dot.p99").evaluate_all(
                "dots => dots.map((d) => -Number(d.getAttribute('cy')))"
            )
            assert len(heights) == len(figures) >= 3, (heights, figures)
            for (a, ha), (b, hb) in itertools.combinations(zip(figures, heights, strict=True), 2):
                assert (a > b) == (ha > hb) or a == b, (figures, heights)
            page.evaluate("window.scrollTo(0, 0)")  # the element screenshot scrolled the page
            snap(page, shots, "model-latency")
            assert errors == []
        finally:
            context.close()
