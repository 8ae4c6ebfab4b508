"""The dashboard's security in a real browser: headers, tokens, controls, cross-site attacks.

Real ``servekit serve`` subprocesses (tests/servers.py), one per configuration: the default
(loopback, no token), model control off, a repository/inference/admin token, a metadata token.
Debian's headless Chromium (tests/browser.py) plays both the user and, for the cross-site
tests, a hostile page served by a tiny HTTP server on another origin of this machine.
"""

from __future__ import annotations

import base64
import contextlib
import html
import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import onnx
import onnx_builders
import pytest
from browser import CHROMIUM, chromium, collect_errors
from needs import missing

from servekit import __version__
from servekit.dashboard.headers import CONTENT_SECURITY_POLICY

if not CHROMIUM.exists():
    missing(f"Chromium at {CHROMIUM}", "apt-get install chromium chromium-driver", module=True)

from playwright.sync_api import Browser, BrowserContext, Page, Request, expect
from servers import ServerProcess, start_server

pytestmark = pytest.mark.slow

TOKEN = "s3cret-Token_for.tests"
META_TOKEN = "metadata-only-token"
SECRET = "zebra"  # in the server's and the models' names: must not appear while locked


def _models(root: Path) -> str:
    """A small store (two versions of mlp, add_sub); the models part of serve.yaml."""
    for version in (1, 2):
        path = root / "mlp" / str(version) / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(onnx_builders.mlp(seed=version), str(path))
    (root / "add_sub" / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(onnx_builders.add_sub(), str(root / "add_sub" / "1" / "model.onnx"))
    return (
        "models:\n"
        "  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp, versionPolicy: {all: {}}}\n"
        "  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub}\n"
    )


@contextlib.contextmanager
def _server(root: Path, server_yaml: str, models: str | None = None) -> Iterator[ServerProcess]:
    root.mkdir(parents=True, exist_ok=True)
    config = root / "serve.yaml"
    config.write_text(f"server: {server_yaml}\n" + (models or _models(root)))
    process = start_server(config, grpc=False)
    try:
        yield process
    finally:
        assert process.stop() == 0, process.log()


@pytest.fixture(scope="module", autouse=True)
def _patient_expect() -> None:
    expect.set_options(timeout=15_000)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The default: loopback, no token, so model control is explicit."""
    with _server(tmp_path_factory.mktemp("open"), "{name: open-demo}") as process:
        yield process


@pytest.fixture(scope="module")
def no_control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with _server(tmp_path_factory.mktemp("none"), "{name: fixed, modelControl: none}") as process:
        yield process


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Repository, inference and admin need TOKEN; the pages' metadata stays open."""
    auth = f"{{repository: {TOKEN}, inference: {TOKEN}, admin: {TOKEN}}}"
    with _server(tmp_path_factory.mktemp("guarded"), f"{{name: guarded, auth: {auth}}}") as p:
        yield p


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Metadata needs META_TOKEN: without it the dashboard may show nothing about the server."""
    root = tmp_path_factory.mktemp("locked")
    path = root / f"{SECRET}_mlp" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(onnx_builders.mlp(seed=1), str(path))
    models = (
        f"models:\n  - {{name: {SECRET}_mlp, modelFormat: {{name: onnx}}, "
        f"storageUri: {SECRET}_mlp}}\n"
    )
    server_yaml = f"{{name: {SECRET}-server, auth: {{metadata: {META_TOKEN}}}}}"
    with _server(root, server_yaml, models) as process:
        yield process


@contextlib.contextmanager
def _context(browser: Browser, server: ServerProcess) -> Iterator[tuple[BrowserContext, Page]]:
    context = browser.new_context(base_url=server.http_url)
    try:
        yield context, context.new_page()
    finally:
        context.close()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _model_state(server: ServerProcess, name: str, token: str | None = None) -> str:
    """The model's state from the repository index (the API, not the dashboard)."""
    headers = _bearer(token) if token else {}
    index = httpx.post(f"{server.http_url}/v2/repository/index", headers=headers).json()
    states = [row["state"] for row in index if row["name"] == name]
    return "READY" if "READY" in states else (states[0] if states else "ABSENT")


# -- headers ------------------------------------------------------------------------------------
EXPECTED_HEADERS = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/", 200),
        ("/models?q=ml", 200),
        ("/models/mlp", 200),
        ("/models/mlp/try", 200),
        ("/models/nope", 404),
        ("/dashboard/api/overview", 200),
        ("/dashboard/api/models", 200),
        ("/dashboard/api/models/nope", 404),
        ("/dashboard/static/dashboard.js", 200),
        ("/dashboard/static/dashboard.css", 200),
        ("/dashboard/static/nope.js", 404),
    ],
)
def test_every_dashboard_answer_carries_the_security_headers(
    open_server: ServerProcess, path: str, status: int
) -> None:
    answer = httpx.get(f"{open_server.http_url}{path}")
    assert answer.status_code == status
    for name, value in EXPECTED_HEADERS.items():
        assert answer.headers.get_list(name) == [value], name
    policy = dict(part.strip().split(" ", 1) for part in CONTENT_SECURITY_POLICY.split(";"))
    assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'"
    assert policy["default-src"] == "'none'" and policy["frame-ancestors"] == "'none'"


def test_app_wide_headers_leave_the_dashboards_stricter_ones() -> None:
    """What the application can wrap every route with: added where absent, never doubled."""
    from litestar import Litestar, get
    from litestar.testing import TestClient

    from servekit.dashboard.headers import API_HEADERS, DASHBOARD_HEADERS, add_headers

    @get("/api", sync_to_thread=False)
    def api() -> dict[str, str]:
        return {}

    @get("/page", sync_to_thread=False, middleware=[add_headers(DASHBOARD_HEADERS)])
    def page() -> dict[str, str]:
        return {}

    with TestClient(Litestar([api, page], middleware=[add_headers(API_HEADERS)])) as client:
        answer = client.get("/api")
        assert {k: answer.headers.get_list(k) for k in API_HEADERS} == {
            k: [v] for k, v in API_HEADERS.items()
        }
        answer = client.get("/page")
        assert answer.headers.get_list("content-security-policy") == [CONTENT_SECURITY_POLICY]
        assert answer.headers.get_list("x-frame-options") == ["DENY"]


def test_locked_shell_carries_the_security_headers(locked: ServerProcess) -> None:
    answer = httpx.get(f"{locked.http_url}/models")
    assert answer.status_code == 401
    for name, value in EXPECTED_HEADERS.items():
        assert answer.headers.get(name) == value


def test_pages_run_without_inline_script_or_style(
    browser: Browser, open_server: ServerProcess
) -> None:
    """Every page under the CSP: no refusal, no script error, and the scripts really ran."""
    with _context(browser, open_server) as (_, page):
        errors = collect_errors(page)
        for path in ("/", "/models", "/models/mlp", "/models/nope"):
            page.goto(path)
            expect(page.locator("[data-bind=ready-pill]")).to_have_text("Ready")
        page.goto("/models")
        expect(page.locator('button[data-action="unload"]').first).to_be_enabled()  # JS ran
        page.goto("/models/mlp/try")
        page.get_by_role("button", name="Run inference").click()
        expect(page.locator("#try-summary")).to_contain_text("HTTP 200")
        expect(page.locator("svg.chart")).to_be_visible()
        assert errors == []


# -- model control and the repository token ----------------------------------------------------
def test_overview_says_model_control_and_protected_groups(
    open_server: ServerProcess, no_control: ServerProcess, guarded: ServerProcess
) -> None:
    overview = httpx.get(f"{open_server.http_url}/dashboard/api/overview").json()
    assert overview["modelControl"] == "explicit"
    assert overview["protected"] == {
        "inference": False, "metadata": False, "repository": False, "admin": False,
    }  # fmt: skip
    assert httpx.get(f"{no_control.http_url}/dashboard/api/overview").json()["modelControl"] == (
        "none"
    )
    overview = httpx.get(f"{guarded.http_url}/dashboard/api/overview").json()
    assert overview["protected"] == {
        "inference": True, "metadata": False, "repository": True, "admin": True,
    }  # fmt: skip
    assert TOKEN not in json.dumps(overview)


def test_models_page_says_control_acts_on_this_replica_only(
    open_server: ServerProcess, no_control: ServerProcess
) -> None:
    """Behind a load balancer a load or unload changes the one replica that took the call:
    the page with the buttons says so (issue 41); without buttons it has nothing to say."""
    page = httpx.get(f"{open_server.http_url}/models").text
    assert 'data-bind="replica-note"' in page
    assert "change this server only" in page and "other replicas keep what they serve" in page
    assert 'data-bind="replica-note"' not in httpx.get(f"{no_control.http_url}/models").text


def test_no_controls_when_model_control_is_none(
    browser: Browser, no_control: ServerProcess
) -> None:
    with _context(browser, no_control) as (_, page):
        errors = collect_errors(page)
        page.goto("/models")
        expect(page.locator('tbody[data-model="mlp"]')).to_be_visible()
        expect(page.locator("[data-bind=control-note]")).to_contain_text("modelControl: none")
        expect(page.locator("button[data-action]")).to_have_count(0)
        expect(page.locator("[data-token-panel]")).to_have_count(0)
        assert errors == []


def test_controls_need_an_accepted_token(browser: Browser, guarded: ServerProcess) -> None:
    with _context(browser, guarded) as (context, page):
        errors = collect_errors(page)
        requests: list[Request] = []
        page.on("request", lambda request: requests.append(request))
        page.goto("/models")
        mlp = page.locator('tbody[data-model="mlp"]')
        expect(mlp.locator("tr[data-version]")).to_have_count(2)
        expect(page.locator("[data-token-panel]")).to_contain_text("load and unload models")
        expect(page.locator("button[data-action]:visible")).to_have_count(0)

        page.get_by_label("Token", exact=True).fill("not-the-token")
        page.get_by_role("button", name="Use token").click()
        expect(page.locator("[data-token-msg]")).to_have_text("The server refused this token.")
        expect(page.locator("button[data-action]:visible")).to_have_count(0)
        assert page.evaluate("sessionStorage.length") == 0

        page.get_by_label("Token", exact=True).fill(TOKEN)
        page.get_by_role("button", name="Use token").click()
        expect(page.locator("[data-token-msg]")).to_have_text("Token accepted.")
        expect(mlp.get_by_role("button", name="Unload", exact=True)).to_be_visible()
        expect(page.locator("[data-token-held]")).to_be_visible()

        # Unload asks first; dismissing changes nothing.
        add_sub = page.locator('tbody[data-model="add_sub"]')
        asked: list[str] = []

        def dismiss(dialog: object) -> None:
            asked.append(dialog.message)  # type: ignore[attr-defined]
            dialog.dismiss()  # type: ignore[attr-defined]

        page.once("dialog", dismiss)  # the click waits until the dialog is handled
        add_sub.get_by_role("button", name="Unload", exact=True).click()
        assert len(asked) == 1 and "Unload add_sub?" in asked[0]
        assert _model_state(guarded, "add_sub", TOKEN) == "READY"

        page.once("dialog", lambda dialog: dialog.accept())
        add_sub.get_by_role("button", name="Unload", exact=True).click()
        expect(add_sub.locator(".action-msg")).to_have_text("Unloaded add_sub.")
        assert _model_state(guarded, "add_sub", TOKEN) == "UNAVAILABLE"
        add_sub.get_by_role("button", name="Load", exact=True).click()
        expect(add_sub.locator(".action-msg")).to_have_text("Loaded add_sub.")
        assert _model_state(guarded, "add_sub", TOKEN) == "READY"

        # The token stays in this tab's sessionStorage: no cookie, never in an address.
        assert page.evaluate("Object.values(sessionStorage)") == [TOKEN]
        assert context.cookies() == []
        assert not [r.url for r in requests if TOKEN in r.url]
        changes = [r for r in requests if r.url.endswith(("/load", "/unload"))]
        assert len(changes) == 2
        for change in changes:
            assert change.method == "POST"
            assert change.headers["content-type"] == "application/json"
            assert change.headers["authorization"] == f"Bearer {TOKEN}"
        assert errors == []


def test_try_it_out_sends_the_token_and_snippets_do_not_show_it(
    browser: Browser, guarded: ServerProcess
) -> None:
    with _context(browser, guarded) as (_, page):
        page.goto("/models/mlp/try")
        expect(page.locator("[data-token-panel]")).to_contain_text("run inference")
        page.get_by_role("button", name="Run inference").click()
        expect(page.locator("#try-error")).to_contain_text("HTTP 401")

        page.get_by_label("Token", exact=True).fill(TOKEN)
        page.get_by_role("button", name="Use token").click()
        expect(page.locator("[data-token-held]")).to_be_visible()
        page.get_by_role("button", name="Run inference").click()
        expect(page.locator("#try-summary")).to_contain_text("HTTP 200")
        curl = page.locator("#try-curl").text_content() or ""
        python = page.locator("#try-python").text_content() or ""
        assert "$SERVEKIT_TOKEN" in curl and "SERVEKIT_TOKEN" in python
        assert TOKEN not in curl + python


def test_statistics_need_the_admin_token(browser: Browser, guarded: ServerProcess) -> None:
    anonymous = httpx.get(f"{guarded.http_url}/dashboard/api/models/mlp").json()
    assert anonymous["config"] is None and all(v["stats"] is None for v in anonymous["versions"])
    with_token = httpx.get(f"{guarded.http_url}/dashboard/api/models/mlp", headers=_bearer(TOKEN))
    assert all(v["stats"] is not None for v in with_token.json()["versions"])
    page_html = httpx.get(f"{guarded.http_url}/models/mlp").text
    assert "data-stat=" not in page_html and "Statistics need the admin token" in page_html

    with _context(browser, guarded) as (_, page):
        errors = collect_errors(page)
        page.goto("/models/mlp")
        expect(page.locator("[data-token-panel]")).to_contain_text("statistics")
        expect(page.locator("[data-stat]")).to_have_count(0)
        page.get_by_label("Token", exact=True).fill(TOKEN)
        page.get_by_role("button", name="Use token").click()
        # The page comes back with what the token opens.
        expect(page.locator('tr[data-version="1"] [data-stat=success]')).to_be_visible()
        expect(page.locator("#config-h + .cards pre.code").first).to_contain_text('"name"')
        assert errors == []


# -- metadata token: nothing leaks ---------------------------------------------------------------
def test_pages_and_json_leak_nothing_without_the_metadata_token(locked: ServerProcess) -> None:
    shells = []
    for path in ("/", "/models", f"/models/{SECRET}_mlp", f"/models/{SECRET}_mlp/try", "/models/x"):
        answer = httpx.get(f"{locked.http_url}{path}")
        assert answer.status_code == 401, path
        assert SECRET not in answer.text.lower() and __version__ not in answer.text, path
        assert "Access token needed" in answer.text
        shells.append(answer.text)
    assert len(set(shells)) == 1  # the same shell everywhere: not even "this model exists"
    for path in (
        "/dashboard/api/overview",
        "/dashboard/api/models",
        f"/dashboard/api/models/{SECRET}_mlp",
    ):
        answer = httpx.get(f"{locked.http_url}{path}")
        assert answer.status_code == 401, path
        assert SECRET not in answer.text.lower(), path
        assert "error" in answer.json()
    answer = httpx.get(f"{locked.http_url}/dashboard/api/models", headers=_bearer(META_TOKEN))
    assert [row["name"] for row in answer.json()] == [f"{SECRET}_mlp"]


def test_locked_dashboard_opens_with_the_token(browser: Browser, locked: ServerProcess) -> None:
    with _context(browser, locked) as (context, page):
        errors = collect_errors(page)
        urls: list[str] = []
        page.on("request", lambda request: urls.append(request.url))
        page.goto("/models")
        expect(page.get_by_role("heading", name="Access token needed")).to_be_visible()
        page.get_by_label("Token", exact=True).fill("wrong")
        page.get_by_role("button", name="Use token").click()
        expect(page.locator("[data-token-msg]")).to_have_text("The server refused this token.")
        assert SECRET not in (page.content()).lower()

        page.get_by_label("Token", exact=True).fill(META_TOKEN)
        page.get_by_role("button", name="Use token").click()
        expect(page.locator(f'tbody[data-model="{SECRET}_mlp"]')).to_be_visible()
        expect(page.locator("[data-bind=ready-pill]")).to_have_text("Ready")  # JSON polled
        page.get_by_role("link", name=f"{SECRET}_mlp").click()
        expect(page.get_by_role("heading", name=f"{SECRET}_mlp")).to_be_visible()
        expect(page.locator('tr[data-version="1"] [data-stat=success]')).to_be_visible()
        page.get_by_role("link", name="Overview", exact=True).click()
        expect(page.locator("[data-bind=model-count]")).to_have_text("1")
        assert context.cookies() == []
        assert not [url for url in urls if META_TOKEN in url]

        page.get_by_role("button", name="Forget token").click()
        expect(page.get_by_role("heading", name="Access token needed")).to_be_visible()
        assert page.evaluate("sessionStorage.length") == 0
        assert errors == []


# -- cross-site attacks ---------------------------------------------------------------------------
def _attack_page(target: str) -> str:
    """A hostile page: a text/plain form, no-cors fetches and an <img>, all at ``target``."""
    push = {
        "parameters": {
            "config": json.dumps({"backend": "onnxruntime"}),
            "file:1/model.onnx": base64.b64encode(
                onnx_builders.add_sub().SerializeToString()
            ).decode(),
        }
    }
    fetches = {
        "unload": (f"{target}/v2/repository/models/mlp/unload", {}),
        "push": (f"{target}/v2/repository/models/evil/load", push),
        "offline": (f"{target}/grps/v1/health/offline", {}),
    }
    # A text/plain form can still carry a valid JSON body: name={..."x":" and value="}.
    form_name = html.escape('{"parameters": {"unload_dependents": false}, "x": "', quote=True)
    return f"""<!doctype html>
<title>attack</title>
<iframe name="sink"></iframe>
<iframe id="framed" src="{target}/models"></iframe>
<form id="form" method="post" enctype="text/plain" target="sink"
      action="{target}/v2/repository/models/mlp/unload">
  <input name="{form_name}" value='"}}'>
</form>
<img id="img" src="{target}/grps/v1/health/offline" alt="">
<script>
const fetches = {json.dumps(fetches)};
async function run() {{
  const results = {{}};
  for (const [name, [url, body]] of Object.entries(fetches)) {{
    try {{
      await fetch(url, {{ mode: "no-cors", method: "POST", body: JSON.stringify(body) }});
      results[name] = "answered";
    }} catch (problem) {{
      results[name] = "network error: " + problem.message;
    }}
  }}
  const img = document.getElementById("img");
  if (!img.complete) await new Promise((done) => {{ img.onload = img.onerror = done; }});
  await new Promise((done) => {{
    document.querySelector("iframe[name=sink]").addEventListener("load", done, {{ once: true }});
    document.getElementById("form").submit();
  }});
  document.title = "done " + JSON.stringify(results);
}}
run();
</script>
"""


@contextlib.contextmanager
def _hostile_site(body: str) -> Iterator[int]:
    """Serve ``body`` at / from another port of 127.0.0.1 (another origin); yield the port."""
    payload = body.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=site.serve_forever, daemon=True)
    thread.start()
    try:
        yield site.server_address[1]
    finally:
        site.shutdown()
        site.server_close()
        thread.join(10)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"], ids=["other-port", "other-host"])
def test_a_page_from_another_origin_changes_nothing(
    browser: Browser, open_server: ServerProcess, host: str
) -> None:
    """Another port is another origin but the same site; localhost is another site too."""
    target = open_server.http_url
    with _hostile_site(_attack_page(target)) as port, _context(browser, open_server) as (_, page):
        page.goto(f"http://{host}:{port}/")
        expect(page).to_have_title(re.compile(r"^done "))
        results = json.loads(page.title().removeprefix("done "))
        # The requests really reached the server (else this test would prove nothing).
        assert results == {"unload": "answered", "push": "answered", "offline": "answered"}
        framed = [f for f in page.frames if f.name != "sink" and f != page.main_frame]
        assert all(not f.url.startswith(target) or "Models" not in _frame_text(f) for f in framed)

    assert _model_state(open_server, "mlp") == "READY"
    assert _model_state(open_server, "evil") == "ABSENT"
    assert httpx.get(f"{target}/v2/health/ready").status_code == 200  # still online
    assert httpx.get(f"{target}/grps/v1/health/ready").status_code == 200


def _frame_text(frame: object) -> str:
    try:
        return str(frame.inner_text("body"))  # type: ignore[attr-defined]
    except Exception:  # a blocked frame has no document to read
        return ""
