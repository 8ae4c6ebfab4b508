"""No storage secret reaches a client or the log: a signed URL with user info, end to end.

A local HTTPS server (a throwaway CA, on 127.0.0.1) serves a model only to requests that carry
HTTP Basic auth and the signed URL's query; serve.yaml names it by a storageUri holding both
(``https://user:<password>@host/m.onnx?X-Amz-Signature=...&X-Amz-Credential=...``), and a second
model by the same URL with a wrong password. The model loads (the user info went as Basic auth),
the other is UNAVAILABLE with a reason naming no secret, and then every answer a client can get
is searched for the password, the wrong password, the signature and the credential: every
dashboard route (read from the dashboard's own Litestar handlers, so a new route is covered),
every GET route of the OpenAPI document (V2, KServe V1, ``/servekit/v1/...``), ``/metrics``,
the OpenAPI document itself, the gRPC ModelConfig, ModelMetadata, RepositoryIndex and
statistics, ``servekit validate`` and ``servekit export``'s messages, and the server's log.
A redirect to another origin (a store handing out a signed URL) is followed without the user
info.
"""

from __future__ import annotations

import base64
import http.server
import re
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import onnx_builders
import pytest
import trustme
from litestar import Router
from litestar.handlers import HTTPRouteHandler
from servers import ServerProcess, start_server
from waits import wait_until

from servekit.dashboard import routes as dashboard_routes
from servekit.dashboard.render import STATIC_DIR

pytestmark = pytest.mark.slow

PASSWORD = "S3cretPassw0rd"
WRONG = "Wr0ngPassw0rdXYZ"
SIGNATURE = "SIGVALUE123"
CREDENTIAL = "CREDVALUE456"
SECRETS = (PASSWORD, WRONG, SIGNATURE, CREDENTIAL)
QUERY = f"X-Amz-Signature={SIGNATURE}&X-Amz-Credential={CREDENTIAL}"
BODY = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}


class BasicAuthFiles(http.server.BaseHTTPRequestHandler):
    """Serves ``files`` to requests with Basic auth ``user:PASSWORD`` and the signed query;
    401 with a Basic challenge otherwise. Counts the authorized GETs."""

    files: dict[str, bytes] = {}
    redirects: dict[str, str] = {}
    """Path -> where an authorized request for it is sent (302)."""
    served = 0
    refused = 0

    def _answer(self, body: bool) -> None:
        path, _, query = self.path.partition("?")
        expected = "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()
        if self.headers.get("Authorization") != expected or query != QUERY:
            type(self).refused += 1
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="models"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path in self.redirects:
            self.send_response(302)
            self.send_header("Location", self.redirects[path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = self.files.get(path)
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{len(data):x}"')
        self.end_headers()
        if body:
            type(self).served += 1
            self.wfile.write(data)

    def do_HEAD(self) -> None:
        self._answer(False)

    def do_GET(self) -> None:
        self._answer(True)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Elsewhere(http.server.BaseHTTPRequestHandler):
    """Another origin a redirect may lead to (a signed URL's store): serves ``files`` to
    anyone, and keeps every Authorization header it was sent."""

    files: dict[str, bytes] = {}
    authorizations: list[str] = []

    def _answer(self, body: bool) -> None:
        if "Authorization" in self.headers:
            type(self).authorizations.append(self.headers["Authorization"])
        data = self.files.get(self.path.partition("?")[0])
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_HEAD(self) -> None:
        self._answer(False)

    def do_GET(self) -> None:
        self._answer(True)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ssl.SSLContext:
    """A server context for 127.0.0.1 whose throwaway CA servekit trusts (SSL_CERT_FILE)."""
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    return context


def _serving(context: ssl.SSLContext, handler: type[http.server.BaseHTTPRequestHandler]) -> Any:
    """An HTTPS server on 127.0.0.1 serving in a thread; ``.stop()`` ends it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(10)

    server.stop = stop  # type: ignore[attr-defined]
    return server


@pytest.fixture
def store(tls: ssl.SSLContext) -> Iterator[str]:
    """``host:port`` of the HTTPS server asking for Basic auth."""
    BasicAuthFiles.files = {"/m.onnx": onnx_builders.mlp(seed=3).SerializeToString()}
    BasicAuthFiles.redirects = {}
    BasicAuthFiles.served = BasicAuthFiles.refused = 0
    server = _serving(tls, BasicAuthFiles)
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.stop()


@pytest.fixture
def elsewhere(tls: ssl.SSLContext) -> Iterator[str]:
    """``host:port`` of the other origin, open to anyone."""
    Elsewhere.files = {"/signed.onnx": onnx_builders.mlp(seed=4).SerializeToString()}
    Elsewhere.authorizations = []
    server = _serving(tls, Elsewhere)
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.stop()


def _config(tmp_path: Path, host: str) -> Path:
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {strictReadiness: false}\nmodels:\n"
        f"  - {{name: m, modelFormat: {{name: onnx}}, "
        f"storageUri: 'https://user:{PASSWORD}@{host}/m.onnx?{QUERY}'}}\n"
        f"  - {{name: bad, modelFormat: {{name: onnx}}, "
        f"storageUri: 'https://user:{WRONG}@{host}/m.onnx?{QUERY}'}}\n"
    )
    return config


def _dashboard_requests() -> list[tuple[str, str]]:
    """(method, path) of every route the dashboard mounts, path parameters filled in: the
    model names, and every file of the static folder."""
    found: list[tuple[str, str]] = []
    statics = sorted(p.relative_to(STATIC_DIR).as_posix() for p in STATIC_DIR.rglob("*"))
    for item in dashboard_routes():
        if isinstance(item, Router):
            paths = [(route.path, sorted(route.methods)) for route in item.routes]
        else:
            assert isinstance(item, HTTPRouteHandler), item
            paths = [(path, sorted(item.http_methods)) for path in item.paths]
        for path, methods in paths:
            for method in methods:
                if method in ("HEAD", "OPTIONS"):
                    continue
                if "{file_path:path}" in path:
                    found += [
                        (method, path.replace("{file_path:path}", "/" + f).replace("//", "/"))
                        for f in statics
                        if (STATIC_DIR / f).is_file()
                    ]
                    continue
                found += [(method, re.sub(r"\{name:str\}", name, path)) for name in ("m", "bad")]
    return sorted(set(found))


def _filled(fill: dict[str, str], parameter: re.Match[str]) -> str:
    return fill.get(parameter[1], "x")


def _openapi_gets(document: dict[str, Any]) -> list[str]:
    """Every GET path of the OpenAPI document, parameters filled in (each model's name), but
    grps' online/offline switches (a GET that changes the server's state)."""
    found = []
    for path, operations in document["paths"].items():
        if "get" not in operations or path.endswith(("/online", "/offline")):
            continue
        for name in ("m", "bad"):
            fill = {"model": name, "version": "1", "name": name}
            found.append(re.sub(r"\{(\w+)\}", partial(_filled, fill), path))
    return sorted(set(found))


def _answers(server: ServerProcess) -> dict[str, str]:
    """What every HTTP route a client can reach answers, by request."""
    answers: dict[str, str] = {}
    with server.http_client(timeout=60) as client:

        def keep(method: str, path: str, **kwargs: Any) -> None:
            answer = client.request(method, path, **kwargs)
            text = answer.content.decode(errors="replace")
            answers[f"{method} {path} -> {answer.status_code}"] = f"{answer.headers}\n{text}"

        keep("POST", "/v2/models/m/infer", json=BODY)
        keep("POST", "/v1/models/m:predict", json={"instances": [[0.5] * 16]})
        keep("POST", "/v2/repository/index", json={})
        keep("POST", "/v2/repository/models/bad/load", json={})
        dashboard = _dashboard_requests()
        assert ("GET", "/dashboard/api/models/m") in dashboard
        assert ("GET", "/models/m") in dashboard
        for method, path in dashboard:
            body = {"seconds": 0.2, "concurrency": [1]} if method == "POST" else None
            keep(method, path, json=body)
        document = client.get("/openapi/openapi.json")
        assert document.status_code == 200
        answers["openapi"] = document.text
        gets = _openapi_gets(document.json())
        wanted = {"/v2/models/m/config", "/v2/models/bad/config", "/v2/models/m/stats", "/v2",
                  "/v2/models/m", "/v1/models/m", "/metrics", "/servekit/v1/workers"}  # fmt: skip
        assert wanted <= set(gets), gets
        for path in gets:
            keep("GET", path)
    return answers


def _grpc_answers(server: ServerProcess) -> dict[str, str]:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    assert server.grpc_target is not None
    client = grpcclient.InferenceServerClient(server.grpc_target)
    answers: dict[str, str] = {}
    calls = {
        "ModelConfig": lambda name: client.get_model_config(name, as_json=True),
        "ModelMetadata": lambda name: client.get_model_metadata(name, as_json=True),
        "ModelStatistics": lambda name: client.get_inference_statistics(name, as_json=True),
        "ModelReady": lambda name: client.is_model_ready(name),
    }
    try:
        for call, run in calls.items():
            for name in ("m", "bad"):
                try:
                    answers[f"{call} {name}"] = str(run(name))
                except InferenceServerException as exc:
                    answers[f"{call} {name}"] = str(exc)
        answers["RepositoryIndex"] = str(client.get_model_repository_index(as_json=True))
        answers["ServerMetadata"] = str(client.get_server_metadata(as_json=True))
        try:
            client.load_model("bad")
        except InferenceServerException as exc:
            answers["RepositoryModelLoad bad"] = str(exc)
    finally:
        client.close()
    return answers


def _row(client: Any, name: str) -> dict[str, Any]:
    (row,) = [r for r in client.post("/v2/repository/index", json={}).json() if r["name"] == name]
    return dict(row)


def _settled(client: Any, name: str) -> bool:
    """Whether ``name`` has been fetched and loaded, or failed with a reason."""
    row = _row(client, name)
    return row["state"] == "READY" or "cannot fetch" in row.get("reason", "")


def _leaks(texts: dict[str, str]) -> list[str]:
    return [f"{where}: {secret}" for where, text in texts.items() for secret in SECRETS
            if secret in text]  # fmt: skip


def test_a_signed_url_with_user_info_loads_and_no_answer_or_log_holds_its_secrets(
    tmp_path: Path, store: str
) -> None:
    config = _config(tmp_path, store)
    server = start_server(config, extra=["--log-level", "debug"])
    try:
        with server.http_client(timeout=10) as client:
            wait_until(lambda: _settled(client, "m"), 60, "model m fetched or failed")
            assert client.get("/v2/models/m/ready").status_code == 200, _row(client, "m")
            assert BasicAuthFiles.served >= 1
            assert client.post("/v2/models/m/infer", json=BODY).status_code == 200
            index = client.post("/v2/repository/index", json={}).json()
        (bad,) = [row for row in index if row["name"] == "bad"]
        assert bad["state"] == "UNAVAILABLE", bad
        # A clear reason: which URL (as it may be shown) and what the store answered.
        reason = f"cannot fetch https://{store}/m.onnx?...: HTTPError: HTTP Error 401"
        assert reason in bad["reason"], bad
        answers = _answers(server)
        answers.update(_grpc_answers(server))
        # The model page and its JSON do show where the model comes from, as it may be shown.
        shown = answers["GET /dashboard/api/models/m -> 200"]
    finally:
        assert server.stop() == 0, server.log()
    answers["server log"] = server.log()
    leaks = _leaks(answers)
    assert not leaks, "\n".join(leaks)
    assert f"https://{store}/m.onnx?..." in shown
    # The command line: validate's summary and export's warnings (the manifests themselves are
    # for the cluster, which fetches the model: they carry the URI as serve.yaml writes it).
    for argv in (["validate", str(config)], ["export", "k8s", str(config)]):
        done = subprocess.run(
            [sys.executable, "-m", "servekit", *argv],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        printed = {f"{argv[0]} stderr": done.stderr}
        if argv[0] == "validate":
            printed[f"{argv[0]} stdout"] = done.stdout
        assert _leaks(printed) == []
        assert argv[0] != "export" or "carries credentials" in done.stderr


def test_a_store_refusing_the_password_is_a_clear_reason_without_it(
    tmp_path: Path, store: str
) -> None:
    # Only the model with the wrong password: the reason says 401 and names no secret.
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {strictReadiness: false}\nmodels:\n"
        f"  - {{name: bad, modelFormat: {{name: onnx}}, "
        f"storageUri: 'https://user:{WRONG}@{store}/m.onnx?{QUERY}'}}\n"
    )
    server = start_server(config, grpc=False)
    try:
        with server.http_client(timeout=10) as client:
            wait_until(lambda: _settled(client, "bad"), 30, "the refused fetch")
            index = client.post("/v2/repository/index", json={}).json()
            answer = client.post("/v2/models/bad/infer", json=BODY)
    finally:
        assert server.stop() == 0, server.log()
    (row,) = index
    assert row["state"] == "UNAVAILABLE"
    assert "HTTP Error 401: Unauthorized" in row["reason"], row
    assert BasicAuthFiles.served == 0
    assert answer.status_code >= 400
    assert _leaks({"index": str(index), "infer": answer.text, "log": server.log()}) == []


def test_a_redirect_to_another_origin_goes_without_the_user_info(
    tmp_path: Path, store: str, elsewhere: str
) -> None:
    # The store answers an authorized request with a redirect to another host (as a store
    # hands out a signed URL): the model comes from there, and the password never went there.
    BasicAuthFiles.redirects = {"/moved.onnx": f"https://{elsewhere}/signed.onnx?sig=1"}
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {strictReadiness: false}\nmodels:\n"
        f"  - {{name: m, modelFormat: {{name: onnx}}, "
        f"storageUri: 'https://user:{PASSWORD}@{store}/moved.onnx?{QUERY}'}}\n"
    )
    server = start_server(config, grpc=False)
    try:
        with server.http_client(timeout=10) as client:
            wait_until(lambda: _settled(client, "m"), 30, "model m fetched or failed")
            assert client.get("/v2/models/m/ready").status_code == 200, _row(client, "m")
            assert client.post("/v2/models/m/infer", json=BODY).status_code == 200
    finally:
        assert server.stop() == 0, server.log()
    assert BasicAuthFiles.refused == 0  # the store did get the password
    assert Elsewhere.authorizations == []
