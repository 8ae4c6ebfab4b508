"""The dashboard's Payload log card in a real browser (Debian's Chromium): the counts a server
with ``server.payloadLog`` shows, kept up to date by the overview's polling."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import onnx
import onnx_builders
import pytest
from browser import CHROMIUM, chromium, collect_errors
from needs import missing

if not CHROMIUM.exists():
    missing(f"Chromium at {CHROMIUM}", "apt-get install chromium chromium-driver", module=True)

from playwright.sync_api import Browser, expect
from servers import running_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


def test_the_card_counts_logged_events_as_requests_come(tmp_path: Path, browser: Browser) -> None:
    model = tmp_path / "models" / "add_sub" / "1" / "model.onnx"
    model.parent.mkdir(parents=True)
    onnx.save(onnx_builders.add_sub(), str(model))
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server:\n  payloadLog: {sink: file, path: log/payloads.jsonl}\nmodels:\n"
        "  - {name: add_sub, modelFormat: {name: onnx}, storageUri: models/add_sub,"
        " payloadLog: true}\n"
    )
    body = {
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}
            for n in ("INPUT0", "INPUT1")
        ]
    }
    with running_server(config) as server:
        context = browser.new_context(base_url=server.http_url)
        page = context.new_page()
        errors = collect_errors(page)
        page.goto("/")
        card = page.locator("#payload-log")
        expect(card).to_contain_text("file payloads.jsonl")
        expect(card.locator('[data-bind="payload-logged"]')).to_have_text("0")
        with server.http_client(timeout=30) as client:
            for _ in range(3):
                answer = client.post("/v2/models/add_sub/infer", json=body)
                assert answer.status_code == 200
        # No reload: the overview's poll (every 3 s) brings the new counts.
        expect(card.locator('[data-bind="payload-logged"]')).to_have_text("6", timeout=20_000)
        expect(card.locator('[data-bind="payload-dropped"]')).to_have_text("0")
        assert str(tmp_path) not in page.content()  # the file's name only, never its path
        assert not errors
        context.close()
