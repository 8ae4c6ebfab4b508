"""Issue 22: a DNS-rebinding page, in a real Chromium, cannot drive a servekit on loopback.

The attack: a page at ``http://rebind.attacker.example:PORT/`` whose name then resolves to
127.0.0.1 talks to whatever listens on 127.0.0.1:PORT as its own origin: it may send any method
and content type and read the answers, so neither CORS nor the cross-site checks stop it. Here
Chromium maps the name to 127.0.0.1 (``--host-resolver-rules``); a tiny http.server on a free
port serves the page; then that server stops and servekit starts on the same port, which is
what the browser sees after rebinding: the same origin, now answered by servekit. The page's
script tries unload, a repository load and grps offline, and reads model metadata: servekit,
seeing a ``Host`` it does not answer, refuses each, and the model stays ready.
"""

from __future__ import annotations

import http.server
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import onnx_builders
import pytest
from browser import CHROMIUM, CHROMIUM_ARGS
from needs import missing
from repo_helpers import onnx_bytes
from servers import ServerProcess, running_server

pytestmark = pytest.mark.slow

if not CHROMIUM.exists():
    missing(f"Chromium at {CHROMIUM}", "apt-get install chromium chromium-driver", module=True)

from playwright.sync_api import sync_playwright  # noqa: E402

NAME = "rebind.attacker.example"

PAGE = b"""<!doctype html><meta charset="utf-8"><title>innocent page</title>
<script>
// What an attacker's page runs once its name points at the victim's 127.0.0.1: same-origin
// requests (relative URLs), JSON bodies, answers read.
async function attack() {
  const post = (path, body) => fetch(path, {method: "POST",
    headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
  const tries = {
    unload: () => post("/v2/repository/models/add_sub/unload", {}),
    load: () => post("/v2/repository/models/pushed/load", {parameters: {config: "{}"}}),
    offline: () => fetch("/grps/v1/health/offline"),
    metadata: () => fetch("/v2/models/add_sub"),
  };
  const out = {};
  for (const [name, run] of Object.entries(tries)) {
    try {
      const response = await run();
      out[name] = {status: response.status, body: await response.text()};
    } catch (error) {
      out[name] = {status: 0, body: String(error)};
    }
  }
  return out;
}
</script><p>nothing to see</p>"""


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(PAGE)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def config(tmp_path: Path) -> Path:
    (tmp_path / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    path = tmp_path / "serve.yaml"
    path.write_text(
        "models:\n  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub.onnx}\n"
    )
    return path


@pytest.fixture()
def page_server() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(10)


def servekit_on(config: Path, port: int) -> Any:
    argv = [sys.executable, "-m", "servekit", "serve", str(config), "--http-port", str(port),
            "--grpc-port", "0", "--host", "127.0.0.1"]  # fmt: skip
    return running_server(config, command=argv)


def model_ready(server: ServerProcess) -> bool:
    with server.http_client(timeout=10) as client:
        ready = client.get("/v2/models/add_sub/ready").status_code == 200
        return ready and client.get("/v2/health/ready").status_code == 200


def test_a_rebinding_page_cannot_drive_the_server(
    config: Path, page_server: http.server.ThreadingHTTPServer
) -> None:
    port = page_server.server_address[1]
    driver = sync_playwright().start()
    try:
        rule = f"--host-resolver-rules=MAP {NAME} 127.0.0.1"
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=[*CHROMIUM_ARGS, rule])
        page = browser.new_page()
        page.goto(f"http://{NAME}:{port}/")
        assert page.title() == "innocent page"
        # "Rebinding": the origin's port is now answered by servekit.
        page_server.shutdown()
        page_server.server_close()
        with socket.socket() as probe:  # the port is free again (nothing else took it)
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port))
        with servekit_on(config, port) as server:
            assert model_ready(server)
            results = page.evaluate("attack()")
            for name, result in results.items():
                assert result["status"] == 403, (name, result)
                assert "server.allowedHosts" in result["body"], (name, result)
            assert model_ready(server), server.log()  # not unloaded, not offline
            with server.http_client(timeout=10) as client:
                index = client.post("/v2/repository/index", json={}).json()
                assert {row["name"] for row in index} == {"add_sub"}  # nothing pushed
            assert server.alive()
        browser.close()
    finally:
        driver.stop()


def test_the_same_page_works_when_its_name_is_allowed(
    tmp_path: Path, page_server: http.server.ThreadingHTTPServer
) -> None:
    """The check is the Host name, nothing else: listed in server.allowedHosts, the same
    requests reach the server (so the refusal above is the guard, not a broken page)."""
    (tmp_path / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    config = tmp_path / "serve.yaml"
    config.write_text(
        f"server: {{allowedHosts: [{NAME}]}}\n"
        "models:\n  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub.onnx}\n"
    )
    port = page_server.server_address[1]
    driver = sync_playwright().start()
    try:
        rule = f"--host-resolver-rules=MAP {NAME} 127.0.0.1"
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=[*CHROMIUM_ARGS, rule])
        page = browser.new_page()
        page.goto(f"http://{NAME}:{port}/")
        page_server.shutdown()
        page_server.server_close()
        with servekit_on(config, port) as server:
            metadata = page.evaluate(
                "fetch('/v2/models/add_sub').then(async r => [r.status, await r.json()])"
            )
            assert metadata[0] == 200 and metadata[1]["name"] == "add_sub"
            with httpx.Client(base_url=server.http_url, timeout=10) as client:
                assert client.get("/v2/health/live").status_code == 200
        browser.close()
    finally:
        driver.stop()
