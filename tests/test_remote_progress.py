"""Progress of large remote downloads (app/servekit/models/remote_progress.py): bytes, rate and
time left in throttled log lines, the repository index and the dashboard (the model is LOADING
with the progress as its reason, and a bar), and a notebook's ``serve()`` while it waits; and
never a secret or a signed URL in any of them.

The end-to-end tests download a 25 MB model from moto's S3 server through a proxy that holds
the download a third of the way until the test has looked (tests/gated_proxy.py): under way
for as long as needed, without a sleep.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import onnx_builders
import pytest
from gated_proxy import GatedProxy
from servers import ServerProcess, start_server
from test_remote_storage import BODY, SECRET, Moto
from waits import wait_until

from servekit.config.overrides import Overrides, plan_config
from servekit.config.schema import ServeConfig
from servekit.models.remote_progress import LOG_FROM_BYTES, LOG_GAP_S, Download
from servekit.models.repository import ModelRepository
from servekit.services.views import view_of
from servekit.shown_paths import shown_uri

MB = 1024 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_lines_are_throttled_and_say_bytes_rate_and_time_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    download = Download("big", "s3://models/big", clock)
    assert download.status().text() == "listing s3://models/big"
    caplog.set_level(logging.INFO, "servekit.storage")
    download.begin(100 * MB, 2)
    assert caplog.messages == ["model big: downloading s3://models/big: 100.0 MB in 2 file(s)"]
    caplog.clear()
    for _ in range(30):  # 30 MB in 0.3 s: no line (not a second since the last)
        clock.now += 0.01
        download.add(MB)
    assert caplog.messages == []
    clock.now += 1.0  # over a second since the start, 31% done: one line
    download.add(MB)
    assert caplog.messages == [
        "model big: downloading s3://models/big: 31.0 of 100.0 MB (31%), 23.8 MB/s, about 3 s left"
    ]
    caplog.clear()
    clock.now += 2.0  # 2 more MB in 2 s: neither a tenth more nor 5 s
    download.add(2 * MB)
    assert caplog.messages == []
    clock.now += 3.0  # 5 s since the last line: one line although only 2% more came
    download.add(MB)
    assert len(caplog.messages) == 1 and "34.0 of 100.0 MB (34%)" in caplog.messages[0]
    status = download.status()
    assert (status.done_bytes, status.total_bytes, status.percent) == (34 * MB, 100 * MB, 34)
    assert status.as_dict()["text"] == status.text()


def test_small_downloads_log_no_progress(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    download = Download("small", "s3://models/small", clock)
    caplog.set_level(logging.INFO, "servekit.storage")
    download.begin(LOG_FROM_BYTES - 1, 1)
    clock.now += 10
    download.add(LOG_FROM_BYTES // 2)
    assert caplog.messages == []
    assert download.status().percent == 50


def test_a_signed_url_shows_in_progress_without_its_signature(
    caplog: pytest.LogCaptureFixture,
) -> None:
    uri = f"https://user:{SECRET}@store.example/m.tar.gz?X-Amz-Signature={SECRET}&sig={SECRET}"
    clock = Clock()
    download = Download("m", shown_uri(uri), clock)
    caplog.set_level(logging.INFO, "servekit.storage")
    download.begin(64 * MB, 1)
    for _ in range(8):
        clock.now += 1.5
        download.add(8 * MB)
    shown = [*caplog.messages, download.status().text(), str(download.status().as_dict())]
    assert len(caplog.messages) == 9, caplog.messages
    assert all("https://store.example/m.tar.gz?..." in line for line in shown), shown
    assert all(SECRET not in line and "user" not in line for line in shown)


def test_the_index_and_the_views_show_a_downloading_model_as_loading(tmp_path: Path) -> None:
    config = ServeConfig(
        models=[{"name": "big", "modelFormat": {"name": "onnx"}, "storageUri": "s3://b/big"}]
    )
    plan = plan_config(config, None, Overrides(server={}, flags=False), base_dir=tmp_path).model(
        "big"
    )
    assert plan is not None and plan.remote == "s3://b/big"
    repository = ModelRepository(tmp_path)
    repository.register(plan)
    assert [(r.state, r.reason) for r in repository.index()] == [("UNAVAILABLE", "not loaded")]
    clock = Clock()
    download = Download("big", "s3://b/big", clock)
    repository.downloads["big"] = download
    download.begin(40 * MB, 1)
    clock.now += 2
    download.add(10 * MB)
    text = "downloading s3://b/big: 10.0 of 40.0 MB (25%), 5.0 MB/s, about 6 s left"
    assert [(r.state, r.reason) for r in repository.index()] == [("LOADING", text)]
    view = view_of(repository.get("big"), repository.downloading("big"))
    assert [(v.state, v.reason) for v in view.versions] == [("LOADING", text)]
    assert view.reason == text and view.download is not None and view.download.percent == 25
    del repository.downloads["big"]
    assert [r.state for r in repository.index()] == ["UNAVAILABLE"]


# ---- end to end: moto's S3 server, a held download ----------------------------------------------


@pytest.fixture
def held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Moto, GatedProxy]]:
    """moto with a 25 MB model, and the proxy servekit reaches it through (held at 8 MB)."""
    store = Moto(tmp_path / "moto.log")
    store.s3.create_bucket(Bucket="models")
    big = onnx_builders.mlp(hidden=320_000, seed=1).SerializeToString()
    store.s3.put_object(Bucket="models", Key="big/1/model.onnx", Body=big)
    proxy = GatedProxy(store.port, hold_after=8 * MB)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    try:
        yield store, proxy
    finally:
        proxy.close()
        store.stop()


def _serve_yaml(tmp_path: Path) -> Path:
    (tmp_path / "local").mkdir()
    onnx.save(onnx_builders.mlp(seed=9), str(tmp_path / "local" / "model.onnx"))
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {strictReadiness: false}\nmodels:\n"
        "  - {name: big, modelFormat: {name: onnx}, storageUri: 's3://models/big'}\n"
        "  - {name: local, modelFormat: {name: onnx}, storageUri: local}\n"
    )
    return config


def _row(server: ServerProcess, name: str) -> dict[str, Any]:
    with server.http_client(timeout=5) as client:
        rows = client.get("/dashboard/api/models").json()
    (row,) = [r for r in rows if r["name"] == name]
    return dict(row)


@pytest.mark.slow
def test_a_large_s3_download_shows_progress_in_the_log_the_index_and_the_dashboard(
    tmp_path: Path, held: tuple[Moto, GatedProxy]
) -> None:
    _, proxy = held
    server = start_server(_serve_yaml(tmp_path), grpc=False, wait_ready=False)
    try:
        wait_until(proxy.holding.is_set, 60, "the download to be under way")
        # What the dashboard reads: LOADING, the progress as the reason, and its figures.
        wait_until(lambda: _row(server, "big")["state"] == "LOADING", 30, "big LOADING")
        row = _row(server, "big")
        assert row["reason"].startswith("downloading s3://models/big: "), row
        download = row["download"]
        assert download["total_bytes"] > 25 * MB and 0 < download["percent"] < 100, download
        assert download["uri"] == "s3://models/big"
        with server.http_client(timeout=5) as client:
            index = client.post("/v2/repository/index", json={}).json()
            answer = client.post("/v2/models/big/infer", json=BODY)
            local = client.post("/v2/models/local/infer", json=BODY)
        (triton_row,) = [r for r in index if r["name"] == "big"]
        assert triton_row["state"] == "LOADING"
        assert triton_row["reason"].startswith("downloading s3://models/big: ")
        assert answer.status_code == 503 and "downloading s3://models/big" in answer.text
        assert local.status_code == 200  # the other model serves meanwhile
        _check_the_loading_row_in_chromium(server)
        # The log throttles to one line a second: hold at least that long, then let it go.
        wait_until(lambda: time.monotonic() - proxy.held_since >= LOG_GAP_S, 5, "a second held")
        proxy.release()
        wait_until(lambda: _row(server, "big")["state"] == "READY", 60, "big READY")
        assert _row(server, "big")["download"] is None
    finally:
        proxy.release()
        assert server.stop() == 0, server.log()
    log = server.log()
    assert re.search(r"model big: downloading s3://models/big: 25\.\d MB in 1 file\(s\)", log), log
    assert re.search(
        r"model big: downloading s3://models/big: \d+\.\d of 25\.\d MB \(\d+%\), "
        r"\d+\.\d MB/s, about \d+ s left",
        log,
    ), log
    assert re.search(r"fetched s3://models/big: 1 file\(s\), 25\.\d MB in \d+\.\d s", log), log
    assert SECRET not in log


def _check_the_loading_row_in_chromium(server: ServerProcess) -> None:
    from browser import CHROMIUM, chromium, collect_errors
    from playwright.sync_api import expect

    assert CHROMIUM.exists(), "Chromium is installed for the dashboard's tests"
    with chromium() as browser:
        page = browser.new_page(base_url=server.http_url)
        errors = collect_errors(page)
        page.goto("/models")
        row = page.locator('tbody[data-model="big"] tr[data-state="LOADING"]')
        expect(row).to_have_count(1, timeout=15_000)
        expect(row.locator("[data-col=reason]")).to_contain_text("downloading s3://models/big: ")
        bar = row.locator("progress[data-col=download]")
        expect(bar).to_have_attribute("max", "100")
        assert 0 < int(bar.get_attribute("value") or "0") < 100
        page.goto("/models/big")
        expect(page.locator("[data-bind=download]")).to_contain_text("downloading s3://models")
        assert errors == []


@pytest.mark.slow
def test_a_notebook_serve_shows_the_download_while_it_waits(
    tmp_path: Path, held: tuple[Moto, GatedProxy], capsys: pytest.CaptureFixture[str]
) -> None:
    import servekit

    _, proxy = held
    started: dict[str, Any] = {}

    def start() -> None:
        try:
            started["server"] = servekit.serve(_serve_yaml(tmp_path), grpc_port=None)
        except BaseException as exc:  # handed to the test's thread
            started["error"] = exc

    thread = threading.Thread(target=start)
    thread.start()
    shown: list[str] = []
    try:
        wait_until(proxy.holding.is_set, 60, "the download to be under way")
        wait_until(
            lambda: shown.append(capsys.readouterr().err) or "MB (" in "".join(shown),
            30,
            "serve() to show the download",
        )
    finally:
        proxy.release()
        thread.join(120)
    assert "error" not in started, started
    server = started["server"]
    try:
        assert {r["name"]: r["state"] for r in server.models} == {"big": "READY", "local": "READY"}
    finally:
        server.stop()
    text = "".join(shown)
    assert re.search(
        r"servekit: model big: downloading s3://models/big: \d+\.\d of 25\.\d MB", text
    )
    assert SECRET not in text
