"""Models from remote storage, end to end: a real S3-compatible server (moto's server mode) and a
real HTTPS server on 127.0.0.1, each started by the test; ``servekit serve`` fetches from them
into its cache (app/servekit/models/remote.py).

For each: a model folder with two versions serves; an unchanged restart downloads nothing; a new
version uploaded under ``--watch`` appears; a broken store makes that model UNAVAILABLE with a
reason that holds no secret while the other models serve; a store that breaks mid-download leaves
nothing half-written and the old version serving; a tar with ``../`` entries is refused.
"""

from __future__ import annotations

import http.server
import io
import os
import signal
import socket
import ssl
import subprocess
import sys
import tarfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import object_stores
import onnx
import onnx_builders
import pytest
import trustme
from object_stores import azure_connection
from servers import ServerProcess, start_server

pytestmark = pytest.mark.slow

SECRET = "s3cr3t-Value-That-Must-Not-Show"
BODY = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _model_bytes(seed: int) -> bytes:
    return bytes(onnx_builders.mlp(seed=seed).SerializeToString())


# ---- S3 (moto's server mode) -------------------------------------------------------------------


class Moto:
    def __init__(self, log_path: Path, port: int | None = None) -> None:
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        with log_path.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        _wait(self._up, 30, "moto's server")
        import boto3

        self.s3 = boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def _up(self) -> bool:
        try:
            return httpx.get(self.url, timeout=1).status_code < 500
        except httpx.HTTPError:
            return False

    def require_auth(self) -> tuple[str, str]:
        """Turn moto's signature checks on (off by default: it takes any key) and return the
        access key id and secret of an IAM user allowed s3:*, made through moto's IAM first.
        From then on a request signed with any other secret is refused."""
        import json

        import boto3

        iam = boto3.client("iam", endpoint_url=self.url, aws_access_key_id="testing",
                           aws_secret_access_key="testing", region_name="us-east-1")  # fmt: skip
        iam.create_user(UserName="servekit")
        allow = {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}
        policy = {"Version": "2012-10-17", "Statement": [allow]}
        iam.put_user_policy(UserName="servekit", PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="servekit")["AccessKey"]
        # moto's INITIAL_NO_AUTH_ACTION_COUNT, set at run time: 0 unchecked requests from now.
        assert httpx.post(f"{self.url}/moto-api/reset-auth", content=b"0").status_code == 200
        return str(key["AccessKeyId"]), str(key["SecretAccessKey"])

    def gets(self, key: str) -> int:
        """GET requests moto answered for ``key`` so far (its access log)."""
        return sum(1 for line in self.log_path.read_text().splitlines() if f'"GET /{key}' in line)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


@pytest.fixture
def moto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Moto]:
    server = Moto(tmp_path / "moto.log")
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    try:
        yield server
    finally:
        server.stop()


def _config(tmp_path: Path, uri: str, *, extra_server: str = "") -> Path:
    (tmp_path / "local").mkdir(exist_ok=True)
    onnx.save(onnx_builders.mlp(seed=9), str(tmp_path / "local" / "model.onnx"))
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {strictReadiness: false, storage: {pollSeconds: 1}" + extra_server + "}\nmodels:\n"
        f"  - {{name: remote, modelFormat: {{name: onnx}}, storageUri: '{uri}', "
        "versionPolicy: {all: {}}}\n"
        "  - {name: local, modelFormat: {name: onnx}, storageUri: local}\n"
    )
    return config


def _ready(server: ServerProcess, path: str) -> bool:
    with server.http_client(timeout=5) as client:
        return client.get(path).status_code == 200


def _infer(server: ServerProcess, model: str, version: int) -> list[float]:
    with server.http_client(timeout=10) as client:
        answer = client.post(f"/v2/models/{model}/versions/{version}/infer", json=BODY)
    assert answer.status_code == 200, answer.text
    data: list[float] = answer.json()["outputs"][0]["data"]
    return data


def test_s3_versions_serve_and_an_unchanged_restart_downloads_nothing(
    tmp_path: Path, moto: Moto
) -> None:
    moto.s3.create_bucket(Bucket="models")
    for version in (1, 2):
        moto.s3.put_object(
            Bucket="models", Key=f"mlp/{version}/model.onnx", Body=_model_bytes(version)
        )
    config = _config(tmp_path, "s3://models/mlp")
    server = start_server(config, grpc=False)
    try:
        one, two = _infer(server, "remote", 1), _infer(server, "remote", 2)
        assert one != two  # two different models, each under its own version
        assert _infer(server, "local", 1)
    finally:
        assert server.stop() == 0, server.log()
    assert moto.gets("models/mlp/1/model.onnx") >= 1
    before = moto.gets("models/mlp/1/model.onnx") + moto.gets("models/mlp/2/model.onnx")

    server = start_server(config, grpc=False)
    try:
        assert _infer(server, "remote", 1) == one and _infer(server, "remote", 2) == two
    finally:
        assert server.stop() == 0, server.log()
    after = moto.gets("models/mlp/1/model.onnx") + moto.gets("models/mlp/2/model.onnx")
    assert after == before, "the restart downloaded model files again"


def test_s3_a_new_version_uploaded_under_watch_appears(tmp_path: Path, moto: Moto) -> None:
    moto.s3.create_bucket(Bucket="models")
    moto.s3.put_object(Bucket="models", Key="mlp/1/model.onnx", Body=_model_bytes(1))
    server = start_server(_config(tmp_path, "s3://models/mlp"), grpc=False, extra=["--watch"])
    try:
        assert _infer(server, "remote", 1)
        assert not _ready(server, "/v2/models/remote/versions/2/ready")
        moto.s3.put_object(Bucket="models", Key="mlp/2/model.onnx", Body=_model_bytes(2))
        _wait(lambda: _ready(server, "/v2/models/remote/versions/2/ready"), 30, "version 2")
        assert _infer(server, "remote", 2) != _infer(server, "remote", 1)
    finally:
        assert server.stop() == 0, server.log()


def test_s3_a_missing_bucket_is_unavailable_with_a_reason_and_no_secret(
    tmp_path: Path, moto: Moto
) -> None:
    server = start_server(_config(tmp_path, "s3://no-such-bucket/mlp"), grpc=False)
    try:
        assert _infer(server, "local", 1)  # every other model serves
        with server.http_client(timeout=5) as client:
            index = client.post("/v2/repository/index", json={}).json()
            answer = client.post("/v2/models/remote/infer", json=BODY)
        (row,) = [r for r in index if r["name"] == "remote"]
        assert row["state"] == "UNAVAILABLE"
        assert "cannot fetch s3://no-such-bucket/mlp" in row["reason"], row
        assert answer.status_code >= 400
        for text in (str(index), answer.text, server.log()):
            assert SECRET not in text
    finally:
        assert server.stop() == 0, server.log()


def test_s3_a_wrong_secret_is_refused_unavailable_and_never_shown(
    tmp_path: Path, moto: Moto, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One object, not a folder: moto's signature check miscomputes a listing with a prefix
    # (getmoto/moto#5948) and would refuse the right key too; HEAD and GET it checks right.
    moto.s3.create_bucket(Bucket="models")
    moto.s3.put_object(Bucket="models", Key="mlp/1/model.onnx", Body=_model_bytes(1))
    key_id, secret = moto.require_auth()
    config = _config(tmp_path, "s3://models/mlp/1/model.onnx")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    server = start_server(config, grpc=False)  # the right secret serves: auth is not the bug
    try:
        assert _infer(server, "remote", 1)
    finally:
        assert server.stop() == 0, server.log()

    wrong = "Wr0ng-" + secret[6:]  # same length and shape, one bit of it differs
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another-cache"))
    server = start_server(config, grpc=False)
    try:
        assert _infer(server, "local", 1)  # every other model serves
        with server.http_client(timeout=5) as client:
            index = client.post("/v2/repository/index", json={}).json()
            answer = client.post("/v2/models/remote/infer", json=BODY)
        (row,) = [r for r in index if r["name"] == "remote"]
        assert row["state"] == "UNAVAILABLE", row
        assert "cannot fetch s3://models/mlp/1/model.onnx: PermissionError" in row["reason"], row
        assert answer.status_code >= 400
    finally:
        assert server.stop() == 0, server.log()
    for text in (str(index), answer.text, server.log()):
        assert wrong not in text and secret not in text and wrong[6:20] not in text


def _metric(server: ServerProcess, line_start: str) -> float | None:
    with server.http_client(timeout=5) as client:
        text = client.get("/metrics").text
    found = [ln.split()[-1] for ln in text.splitlines() if ln.startswith(line_start)]
    return float(found[0]) if found else None


def _remote_row(server: ServerProcess) -> dict[str, Any]:
    with server.http_client(timeout=5) as client:
        index = client.post("/v2/repository/index", json={}).json()
    (row,) = [r for r in index if r["name"] == "remote"]
    return dict(row)


def test_s3_a_restart_while_the_store_is_down_serves_the_cached_copy_until_it_is_back(
    tmp_path: Path, moto: Moto
) -> None:
    moto.s3.create_bucket(Bucket="models")
    moto.s3.put_object(Bucket="models", Key="mlp/1/model.onnx", Body=_model_bytes(1))
    config = _config(tmp_path, "s3://models/mlp")
    server = start_server(config, grpc=False)
    try:
        first = _infer(server, "remote", 1)
        assert _metric(server, 'servekit_model_cached_copy{model="remote"}') == 0.0
    finally:
        assert server.stop() == 0, server.log()
    moto.stop()

    server = start_server(config, grpc=False)  # readiness is not strict: wait for the model
    try:
        _wait(lambda: _ready(server, "/v2/models/remote/ready"), 60, "the cached copy to serve")
        assert _infer(server, "remote", 1) == first
        row = _remote_row(server)
        assert row["state"] == "READY", row
        assert "serving the copy cached" in row["reason"], row
        assert "cannot fetch s3://models/mlp" in row["reason"], row
        assert SECRET not in row["reason"]
        assert _metric(server, 'servekit_model_cached_copy{model="remote"}') == 1.0
        with server.http_client(timeout=5) as client:
            problems = client.get("/dashboard/api/overview").json()["problems"]
        assert any("serving the copy cached" in p["message"] for p in problems), problems
        assert "model remote: the store cannot be reached" in server.log()
        # The store comes back (same port, same object): the next look clears the warning.
        back = Moto(tmp_path / "moto-again.log", port=moto.port)
        try:
            back.s3.create_bucket(Bucket="models")
            back.s3.put_object(Bucket="models", Key="mlp/1/model.onnx", Body=_model_bytes(1))
            _wait(lambda: _remote_row(server)["reason"] == "", 60, "the store to be seen again")
            assert _metric(server, 'servekit_model_cached_copy{model="remote"}') == 0.0
            assert _infer(server, "remote", 1) == first
        finally:
            back.stop()
    finally:
        assert server.stop() == 0, server.log()

    unavailable = "pollSeconds: 1, whenUnreachable: unavailable"
    config.write_text(config.read_text().replace("pollSeconds: 1", unavailable))
    server = start_server(config, grpc=False)
    try:
        _wait(lambda: "cannot fetch" in _remote_row(server)["reason"], 60, "the fetch to fail")
        assert _remote_row(server)["state"] == "UNAVAILABLE"
        assert not _ready(server, "/v2/models/remote/ready")
        assert _infer(server, "local", 1)
    finally:
        assert server.stop() == 0, server.log()


def _stopped_mid_download(tmp_path: Path, uri: str, put: Any, proxy: Any, store: Any) -> None:
    """Version 1 serves from ``uri`` (read through ``proxy``, a GatedProxy in front of
    ``store``); a large version 2 arrives and the store goes away (stopped, its connections
    cut) while version 2 is under way: nothing half-written stays in the cache, version 1
    serves on, version 2 never appears, the other model serves."""
    put("mlp/1/model.onnx", _model_bytes(1))
    server = start_server(_config(tmp_path, uri), grpc=False, extra=["--watch"])
    try:
        first = _infer(server, "remote", 1)
        big = onnx_builders.mlp(hidden=160_000, seed=2).SerializeToString()  # 12.8 MB
        proxy.hold_after = proxy.passed + 4 * 1024 * 1024  # a third of the way through
        put("mlp/2/model.onnx", big)
        _wait(proxy.holding.is_set, 60, "the download of version 2 to be under way")
        cache = tmp_path / "xdg-cache" / "servekit" / "models"
        held = [p for key in cache.iterdir() if key.is_dir() for p in key.iterdir()]
        assert any(p.name.startswith(".tmp-") for p in held)  # it was really under way
        with server.http_client(timeout=5) as client:  # the index says how far it is
            index = client.post("/v2/repository/index", json={}).json()
        (row,) = [r for r in index if r["name"] == "remote"]
        assert row["state"] == "READY" and row["reason"].startswith(f"downloading {uri}: "), row
        store.stop()
        proxy.cut()
        _wait(lambda: f"model remote: cannot fetch {uri}" in server.log(), 120,
              "the cut download to fail")  # fmt: skip
        assert _infer(server, "remote", 1) == first  # the old version serves on
        assert not _ready(server, "/v2/models/remote/versions/2/ready")
        left = [p for key in cache.iterdir() if key.is_dir() for p in key.iterdir()]
        assert not [p for p in left if p.name.startswith(".tmp-")], left  # nothing half-written
        assert _infer(server, "local", 1)
    finally:
        proxy.close()
        assert server.stop() == 0, server.log()


def test_s3_a_store_stopped_mid_download_leaves_nothing_half_written_and_the_old_version(
    tmp_path: Path, moto: Moto, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gated_proxy import GatedProxy

    moto.s3.create_bucket(Bucket="models")
    proxy = GatedProxy(moto.port, hold_after=1 << 40)  # nothing held until the test says
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    put = lambda key, data: moto.s3.put_object(Bucket="models", Key=key, Body=data)  # noqa: E731
    _stopped_mid_download(tmp_path, "s3://models/mlp", put, proxy, moto)
    assert SECRET not in "".join(p.read_text() for p in tmp_path.glob("server-*.log"))


# ---- HTTPS (a local server with a throwaway CA) -------------------------------------------------


class Archives(http.server.BaseHTTPRequestHandler):
    """Serves ``files`` by path; a path in ``cut`` sends half its body, then closes. With a
    ``token``, a request without ``?token=<it>`` (a signed URL's signature) gets a 403."""

    files: dict[str, bytes] = {}
    cut: set[str] = set()
    token: str | None = None

    def _answer(self, body: bool) -> None:
        path, _, query = self.path.partition("?")
        if self.token is not None and query != f"token={self.token}":
            self.send_error(403)
            return
        data = self.files.get(path)
        if data is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("ETag", f'"{hash(data) & 0xFFFFFFFF:x}"')
        self.end_headers()
        if body:
            self.wfile.write(data[: len(data) // 2] if path in self.cut else data)

    def do_HEAD(self) -> None:
        self._answer(False)

    def do_GET(self) -> None:
        self._answer(True)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def https(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    Archives.files, Archives.cut, Archives.token = {}, set(), None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Archives)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _tar(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_https_archive_serves_and_a_cut_download_keeps_the_old_version(
    tmp_path: Path, https: str
) -> None:
    Archives.files["/mlp.tar.gz"] = _tar({"1/model.onnx": _model_bytes(1)})
    server = start_server(_config(tmp_path, f"{https}/mlp.tar.gz"), grpc=False, extra=["--watch"])
    try:
        first = _infer(server, "remote", 1)
        # The archive changes, and the store breaks while the new one downloads.
        Archives.files["/mlp.tar.gz"] = _tar(
            {"1/model.onnx": _model_bytes(5), "2/model.onnx": _model_bytes(2)}
        )
        Archives.cut.add("/mlp.tar.gz")
        cache = tmp_path / "xdg-cache" / "servekit" / "models"
        _wait(lambda: "download ended after" in server.log(), 30, "the cut download")
        assert _infer(server, "remote", 1) == first  # still the old version
        snapshots = [p for key in cache.iterdir() if key.is_dir() for p in key.iterdir()]
        assert [p.name.startswith(".tmp-") for p in snapshots if p.is_dir()] == [False]
        # The store comes back: the new archive becomes the served model.
        Archives.cut.clear()
        _wait(lambda: _ready(server, "/v2/models/remote/versions/2/ready"), 30, "version 2")
        assert _infer(server, "remote", 1) != first
    finally:
        assert server.stop() == 0, server.log()


def test_https_a_wrong_signed_url_token_is_unavailable_and_never_shown(
    tmp_path: Path, https: str
) -> None:
    # The https transport carries a credential the way stores hand one out: in a signed URL's
    # query (no headers of its own). The server refuses a wrong one with a 403.
    Archives.files["/mlp.tar.gz"] = _tar({"1/model.onnx": _model_bytes(1)})
    Archives.token = "right-" + SECRET
    wrong = "Wrong-" + SECRET
    server = start_server(_config(tmp_path, f"{https}/mlp.tar.gz?token={wrong}"), grpc=False)
    try:
        assert _infer(server, "local", 1)
        with server.http_client(timeout=5) as client:
            index = client.post("/v2/repository/index", json={}).json()
            answer = client.post("/v2/models/remote/infer", json=BODY)
        (row,) = [r for r in index if r["name"] == "remote"]
        assert row["state"] == "UNAVAILABLE", row
        assert f"cannot fetch {https}/mlp.tar.gz?...: HTTPError: HTTP Error 403" in row["reason"]
        assert answer.status_code >= 400
    finally:
        assert server.stop() == 0, server.log()
    for text in (str(index), answer.text, server.log()):
        assert SECRET not in text
    # The right token serves the same archive (so the 403 was the token's).
    right = _config(tmp_path, f"{https}/mlp.tar.gz?token={Archives.token}")
    server = start_server(right, grpc=False)
    try:
        assert _infer(server, "remote", 1)
    finally:
        assert server.stop() == 0, server.log()
    assert SECRET not in server.log()


def test_https_a_tar_slip_is_refused(tmp_path: Path, https: str) -> None:
    Archives.files["/evil.tar.gz"] = _tar(
        {"1/model.onnx": _model_bytes(1), "../../escaped.txt": b"owned"}
    )
    server = start_server(_config(tmp_path, f"{https}/evil.tar.gz"), grpc=False)
    try:
        with server.http_client(timeout=5) as client:
            index = client.post("/v2/repository/index", json={}).json()
        (row,) = [r for r in index if r["name"] == "remote"]
        assert row["state"] == "UNAVAILABLE"
        assert "leaves the model's folder" in row["reason"], row
        assert _infer(server, "local", 1)
    finally:
        assert server.stop() == 0, server.log()
    assert not list(tmp_path.rglob("escaped.txt"))


# ---- Azure Blob (Azurite) and GCS (gcp-storage-emulator) ---------------------------------------


@pytest.fixture
def azurite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    emulator = object_stores.azurite(tmp_path / "azurite")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure_connection(emulator.port))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    import adlfs

    fs = adlfs.AzureBlobFileSystem(connection_string=azure_connection(emulator.port))
    try:
        yield fs, emulator
    finally:
        emulator.stop()


@pytest.fixture
def gcs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    emulator = object_stores.gcs_emulator(tmp_path / "gcs")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{emulator.port}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from gcsfs.core import GCSFileSystem

    fs = GCSFileSystem(token="anon", skip_instance_cache=True)
    try:
        yield fs, emulator
    finally:
        emulator.stop()


def _putter(fs: Any) -> Any:
    """Upload ``data`` as ``models/<key>`` through an fsspec filesystem."""

    def put(key: str, data: bytes) -> None:
        with warnings.catch_warnings():  # aiohttp's advice about a large body: not ours
            warnings.simplefilter("ignore", ResourceWarning)
            fs.pipe(f"models/{key}", data)

    return put


def _two_versions_then_restart(tmp_path: Path, uri: str, put: Any) -> None:
    """Two versions serve; a restart with the remote unchanged fetches nothing; a third
    version uploaded under --watch appears."""
    for version in (1, 2):
        put(f"mlp/{version}/model.onnx", _model_bytes(version))
    config = _config(tmp_path, uri)
    server = start_server(config, grpc=False)
    try:
        one, two = _infer(server, "remote", 1), _infer(server, "remote", 2)
        assert one != two
    finally:
        assert server.stop() == 0, server.log()
    assert "fetched" in server.log()
    server = start_server(config, grpc=False, extra=["--watch"])
    try:
        assert _infer(server, "remote", 1) == one and _infer(server, "remote", 2) == two
        assert "unchanged: served from the cache" in server.log()
        assert "fetched" not in server.log()
        put("mlp/3/model.onnx", _model_bytes(3))
        _wait(lambda: _ready(server, "/v2/models/remote/versions/3/ready"), 30, "version 3")
    finally:
        assert server.stop() == 0, server.log()


def test_azure_blob_versions_serve_restart_and_watch(tmp_path: Path, azurite: Any) -> None:
    fs, _ = azurite
    fs.mkdir("models")
    _two_versions_then_restart(
        tmp_path, "az://models/mlp", lambda key, data: fs.pipe(f"models/{key}", data)
    )


def test_azure_blob_wrong_credentials_are_unavailable_without_the_key(
    tmp_path: Path, azurite: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, emulator = azurite
    fs.mkdir("models")
    fs.pipe("models/mlp/1/model.onnx", _model_bytes(1))
    wrong = "V3JvbmdLZXlXcm9uZ0tleVdyb25nS2V5V3JvbmdLZXk="
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure_connection(emulator.port, wrong))
    server = start_server(_config(tmp_path, "az://models/mlp"), grpc=False)
    try:
        assert _infer(server, "local", 1)
        with server.http_client(timeout=5) as client:
            index = client.post("/v2/repository/index", json={}).json()
        (row,) = [r for r in index if r["name"] == "remote"]
        assert row["state"] == "UNAVAILABLE" and "cannot fetch az://models/mlp" in row["reason"]
        for text in (str(index), server.log()):
            assert wrong not in text and wrong[:20] not in text
    finally:
        assert server.stop() == 0, server.log()


def test_azure_blob_stopped_mid_download_leaves_nothing_half_written_and_the_old_version(
    tmp_path: Path, azurite: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gated_proxy import GatedProxy

    fs, emulator = azurite
    fs.mkdir("models")
    proxy = GatedProxy(emulator.port, hold_after=1 << 40)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure_connection(proxy.port))
    _stopped_mid_download(tmp_path, "az://models/mlp", _putter(fs), proxy, emulator)


def test_gcs_versions_serve_restart_and_watch(tmp_path: Path, gcs: Any) -> None:
    fs, _ = gcs
    fs.mkdir("models")
    _two_versions_then_restart(
        tmp_path, "gs://models/mlp", lambda key, data: fs.pipe(f"models/{key}", data)
    )


def test_gcs_a_missing_bucket_is_unavailable_with_a_reason(tmp_path: Path, gcs: Any) -> None:
    # gcp-storage-emulator checks no credentials at all (any token, or none, is taken), so a
    # wrong credential cannot be refused here; the nearest failure it can give: no bucket.
    fs, _ = gcs
    fs.mkdir("models")
    server = start_server(_config(tmp_path, "gs://no-such-bucket/mlp"), grpc=False)
    try:
        assert _infer(server, "local", 1)
        with server.http_client(timeout=5) as client:
            index = client.post("/v2/repository/index", json={}).json()
            answer = client.post("/v2/models/remote/infer", json=BODY)
        (row,) = [r for r in index if r["name"] == "remote"]
        assert row["state"] == "UNAVAILABLE", row
        assert "cannot fetch gs://no-such-bucket/mlp: nothing found there" in row["reason"], row
        assert answer.status_code >= 400 and "cannot fetch gs://no-such-bucket" in answer.text
    finally:
        assert server.stop() == 0, server.log()


def test_gcs_stopped_mid_download_leaves_nothing_half_written_and_the_old_version(
    tmp_path: Path, gcs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gated_proxy import GatedProxy

    fs, emulator = gcs
    fs.mkdir("models")
    proxy = GatedProxy(emulator.port, hold_after=1 << 40)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    _stopped_mid_download(tmp_path, "gs://models/mlp", _putter(fs), proxy, emulator)
