"""The dashboard's API page (``/api``, issue 27): Swagger UI served by the server itself, offline
(no request leaves it, nothing refused by the Content-Security-Policy), every route of the
OpenAPI document listed with "Try it out", and a try-out that really reaches the server, with
the dashboard's token when inference is protected."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import onnx
import onnx_builders
import pytest
from browser import CHROMIUM, chromium, collect_errors
from needs import missing

if not CHROMIUM.exists():
    missing(f"Chromium at {CHROMIUM}", "apt-get install chromium chromium-driver", module=True)

from playwright.sync_api import Browser, Page, expect
from servers import ServerProcess, start_server

pytestmark = pytest.mark.slow

TOKEN = "api-page-token-1"
SERVE_YAML = f"""\
server: {{name: api-demo, auth: {{inference: {TOKEN}}}}}
models:
  - {{name: mlp, modelFormat: {{name: onnx}}, storageUri: mlp.onnx}}
"""


@pytest.fixture(scope="module", autouse=True)
def _patient_expect() -> None:
    """Swagger UI renders slowly on a busy machine: page assertions retry for up to 30 s."""
    expect.set_options(timeout=30_000)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("api-page")
    onnx.save(onnx_builders.mlp(), str(root / "mlp.onnx"))
    (root / "serve.yaml").write_text(SERVE_YAML)
    process = start_server(root / "serve.yaml", grpc=False)
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Browser, server: ServerProcess) -> Iterator[Page]:
    context = browser.new_context(base_url=server.http_url, viewport={"width": 1280, "height": 800})
    yield context.new_page()
    context.close()


def _offline(page: Page, server: ServerProcess) -> tuple[list[str], list[str]]:
    """Every request the page makes, and the page's script errors and CSP refusals."""
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    return requests, collect_errors(page)


def test_api_page_lists_every_route_with_try_it_out(
    page: Page, server: ServerProcess, tmp_path: Path
) -> None:
    requests, errors = _offline(page, server)
    document = httpx.get(f"{server.http_url}/openapi/openapi.json", timeout=10).json()
    operations = [
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in ("get", "put", "post", "delete", "patch", "head", "options")
    ]
    response = page.goto("/api")
    assert response is not None and response.status == 200
    policy = response.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "img-src 'self' data:;" in policy
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("servekit")
    blocks = page.locator(".opblock")
    expect(blocks).to_have_count(len(operations))
    shown = {
        (b.locator(".opblock-summary-method").inner_text(), b.get_attribute("id") or "")
        for b in blocks.all()
    }
    assert {m for m, _ in shown} == {m for m, _ in operations}
    # "Try it out" on every route: Swagger UI offers it for the methods it is configured with,
    # which are every method of the document; one route of each method is opened to see it
    # (opening all 50 takes minutes of Swagger UI's rendering on a busy machine).
    offered = page.evaluate("window.servekitApi.getConfigs().supportedSubmitMethods")
    assert {m for m, _ in operations} <= {m.upper() for m in offered}
    for method in sorted({m for m, _ in operations}):
        block = page.locator(f".opblock-{method.lower()}").first
        block.locator(".opblock-summary-control").click()
        expect(block.locator("button.try-out__btn")).to_be_visible()
    expect(page.locator("nav.nav a[aria-current=page]")).to_have_text("API")
    assert page.title() == "API · api-demo · servekit"
    origin = server.http_url
    assert all(url.startswith(origin) or url.startswith("data:") for url in requests), requests
    assert errors == []


def test_try_it_out_reaches_the_server_with_the_dashboards_token(
    page: Page, server: ServerProcess
) -> None:
    requests, errors = _offline(page, server)
    page.goto("/api")
    health = page.locator(".opblock-get").filter(
        has=page.locator('.opblock-summary-path[data-path="/v2/health/ready"]')
    )
    health.locator(".opblock-summary-control").click()
    health.locator("button.try-out__btn").click()
    health.get_by_role("button", name="Execute").click()
    expect(health.locator(".live-responses-table tbody .response-col_status").first).to_have_text(
        "200"
    )
    expect(health.locator(".live-responses-table")).to_contain_text('"ready": true')

    infer = page.locator(".opblock-post").filter(
        has=page.locator('.opblock-summary-path[data-path="/v2/models/{model}/infer"]')
    )
    expect(infer).to_have_count(1)
    infer.locator(".opblock-summary-control").click()
    infer.locator("button.try-out__btn").click()
    infer.locator('input[placeholder="model"]').fill("mlp")
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [1] * 16}]}
    infer.locator("textarea.body-param__text").fill(json.dumps(body))
    infer.get_by_role("button", name="Execute").click()
    status = infer.locator(".live-responses-table tbody .response-col_status").first
    expect(status).to_have_text("401")  # inference is protected; no token typed yet

    page.evaluate(f"sessionStorage.setItem('servekit.accessToken', {json.dumps(TOKEN)})")
    infer.get_by_role("button", name="Execute").click()
    expect(status).to_have_text("200")
    expect(infer.locator(".live-responses-table")).to_contain_text('"name": "output"')
    expect(infer.locator(".curl-command")).to_be_visible()
    assert TOKEN not in (page.locator("#swagger-ui").inner_text())  # sent, never shown
    infer.locator(".live-responses-table").scroll_into_view_if_needed()
    assert all(url.startswith(server.http_url) for url in requests), requests
    assert errors == []
    shots = os.environ.get("SERVEKIT_SCREENSHOTS")
    if shots:
        page.screenshot(path=str(Path(shots) / "api-laptop.png"), full_page=False)
