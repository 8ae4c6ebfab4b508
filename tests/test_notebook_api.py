"""The notebook API in process: ``servekit.serve`` handles, ``servekit.connect`` to a subprocess.

Leaks are checked the way a notebook user would notice them: Python threads still alive
(``threading.enumerate``) and ports that cannot be bound again after ``stop``. Results are
checked against onnxruntime run directly on the same model files, never against constants.
"""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnx_builders
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from servers import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

import servekit
from servekit.config.loader import ConfigError
from servekit.errors import InvalidArgument, NotFound, ServeError, Unauthenticated
from servekit.notebook import RemoteServer, StartError, registry

pytestmark = pytest.mark.slow

X = np.random.default_rng(7).standard_normal((3, 16)).astype(np.float32)


def _reference(model: onnx.ModelProto | Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return list(ort.InferenceSession(source).run(None, feed))


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _bindable(port: int) -> bool:
    """Whether a new server could listen on ``port`` (SO_REUSEADDR, as servers bind)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _wait_threads(before: set[threading.Thread], timeout: float = 10.0) -> set[threading.Thread]:
    deadline = time.monotonic() + timeout
    while True:
        extra = {t for t in threading.enumerate() if t not in before and t.is_alive()}
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.05)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A serve.yaml with mlp (versions 1 and 2) and a BYTES identity model."""
    for version in (1, 2):
        path = tmp_path / "models" / "mlp" / str(version) / "model.onnx"
        path.parent.mkdir(parents=True)
        onnx.save(onnx_builders.mlp(seed=version), str(path))
    onnx.save(onnx_builders.identity("BYTES"), str(tmp_path / "models" / "text.onnx"))
    config = tmp_path / "serve.yaml"
    config.write_text(
        "models:\n"
        "  - {name: mlp, modelFormat: {name: onnx}, storageUri: models/mlp,"
        " versionPolicy: {all: {}}}\n"
        "  - {name: text, modelFormat: {name: onnx}, storageUri: models/text.onnx}\n"
    )
    return config


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    """Every test must leave no server registered and no thread running."""
    before = set(threading.enumerate())
    yield
    leftover = registry.running()
    registry.stop_all()
    assert not leftover, f"servers left running: {leftover}"
    assert not _wait_threads(before), "threads left behind"


def test_start_stop_restart_leaves_no_thread_or_port(store: Path) -> None:
    before = set(threading.enumerate())
    for _ in range(3):
        server = servekit.serve(store, http_port=0, grpc_port=0)
        ports = [_port(server.url), _port(str(server.grpc_target))]
        assert server.running and not any(_bindable(p) for p in ports)
        out = server.infer("mlp", {"input": X})["output"]
        np.testing.assert_allclose(
            out, _reference(store.parent / "models/mlp/2/model.onnx", {"input": X})[0], rtol=1e-5
        )
        server.stop()
        assert not server.running
        assert all(_bindable(p) for p in ports), "a port is still held after stop()"
        assert not _wait_threads(before), "a thread is still alive after stop()"
    server.stop()  # a second stop is harmless


def test_rerun_replaces_the_previous_server_of_that_name(store: Path) -> None:
    first = servekit.serve(store, grpc_port=None)
    second = servekit.serve(store, grpc_port=None)  # the same cell, run again
    assert not first.running and second.running
    assert _bindable(_port(first.url))
    with pytest.raises(RuntimeError, match="replaced"):
        first.infer("mlp", {"input": X})
    other = servekit.serve(None, grpc_port=None, name="other")  # another name runs beside it
    assert set(registry.running()) == {"default", "other"}
    assert second.running and other.running
    second.stop()
    other.stop()
    assert registry.running() == {}


def test_context_manager_stops(store: Path) -> None:
    with servekit.serve(store, grpc_port=None) as server:
        assert server.infer("text", {"INPUT0": [["a", "b"]]})["OUTPUT0"].tolist() == [[b"a", b"b"]]
        port = _port(server.url)
    assert not server.running and _bindable(port)


def test_config_given_as_a_dict(store: Path) -> None:
    text = store.parent / "models" / "text.onnx"
    entry = {"name": "t", "modelFormat": {"name": "onnx"}, "storageUri": str(text)}
    with servekit.serve({"models": [entry]}, grpc_port=None, startup_models=["t"]) as server:
        assert server.models.states() == {"t": "READY"}
        with pytest.raises(RuntimeError, match=r"without a serve\.yaml"):
            server.reload()


def test_bad_config_raises_with_key_and_line(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(
        "models:\n  - name: a\n    modelFormat: {nmae: onnx}\n    storageUri: a.onnx\n"
    )
    with pytest.raises(ConfigError, match=r"serve.yaml:3: models\[0\].modelFormat.nmae: unknown"):
        servekit.serve(config)
    with pytest.raises(ConfigError, match="cannot read"):
        servekit.serve(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="http_port"):
        servekit.serve(None, http_port=-1)


def test_failed_models_raise_start_error_and_free_everything(tmp_path: Path) -> None:
    (tmp_path / "garbage.onnx").write_bytes(b"not onnx at all" * 10)
    onnx.save(onnx_builders.mlp(), str(tmp_path / "good.onnx"))
    config = tmp_path / "serve.yaml"
    config.write_text(
        "models:\n"
        "  - {name: good, modelFormat: {name: onnx}, storageUri: good.onnx}\n"
        "  - {name: garbage, modelFormat: {name: onnx}, storageUri: garbage.onnx}\n"
        "  - {name: missing, modelFormat: {name: onnx}, storageUri: 'no<b>where.onnx'}\n"
    )
    with pytest.raises(StartError) as caught:
        servekit.serve(config, grpc_port=None)
    assert set(caught.value.problems) == {"garbage:1", "missing"}
    assert "does not exist" in caught.value.problems["missing"]
    assert registry.running() == {}
    lenient = servekit.serve(config, grpc_port=None, strict=False)
    assert lenient.models.states() == {
        "garbage": "UNAVAILABLE",
        "good": "READY",
        "missing": "UNAVAILABLE",
    }
    card = lenient._repr_html_()  # reasons come from files: shown escaped
    assert "no&lt;b&gt;where.onnx" in card and "no<b>" not in card
    lenient.stop()


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError, match="cannot listen"):
            servekit.serve(None, http_port=taken.getsockname()[1], grpc_port=None)
    assert registry.running() == {}


def test_infer_versions_outputs_lists_and_errors(store: Path) -> None:
    mlp = store.parent / "models" / "mlp"
    with servekit.serve(store, grpc_port=None) as server:
        v1 = server.infer("mlp", {"input": X}, version=1)["output"]
        np.testing.assert_allclose(v1, _reference(mlp / "1/model.onnx", {"input": X})[0], rtol=1e-5)
        # Lists take the declared datatype (FP32), not numpy's default float64.
        listed = server.infer("mlp", {"input": X.tolist()}, outputs=["output"])
        np.testing.assert_allclose(
            listed["output"], _reference(mlp / "2/model.onnx", {"input": X})[0], rtol=1e-5
        )
        # Non-contiguous and big-endian arrays are laid out as the runtime needs them.
        odd = np.asfortranarray(X).astype(">f4")
        np.testing.assert_array_equal(
            server.infer("mlp", {"input": odd})["output"], listed["output"]
        )
        # A float64 array whose values fit FP32 is cast (said once); one that does not fit is
        # refused with both datatypes named (issue 16; app/servekit/client/casting.py).
        with pytest.warns(UserWarning, match="cast from FP64 to FP32"):
            cast = server.infer("mlp", {"input": X.astype(np.float64)}, version=1)["output"]
        np.testing.assert_array_equal(cast, v1)
        with pytest.raises(InvalidArgument, match="model takes FP32, the array is FP64"):
            server.infer("mlp", {"input": X.astype(np.float64) * 1e300})
        with pytest.raises(InvalidArgument, match="no input 'nope'"):
            server.infer("mlp", {"nope": X})
        with pytest.raises(NotFound):
            server.infer("unknown", {"input": X})
        with pytest.raises(NotFound):
            server.infer("mlp", {"input": X}, version=9)


def test_add_model_from_every_kind_of_source(tmp_path: Path) -> None:
    model = onnx_builders.mlp(seed=3)
    expected = _reference(model, {"input": X})[0]
    onnx.save(model, str(tmp_path / "file.onnx"))
    for version in (1, 4):
        folder = tmp_path / "versions" / str(version)
        folder.mkdir(parents=True)
        onnx.save(onnx_builders.mlp(seed=version), str(folder / "model.onnx"))

    def scale(x: np.ndarray) -> dict[str, np.ndarray]:
        return {"y": x * 2}

    class Doubler:
        def load(self) -> None:
            self.factor = np.float32(2)

        def predict(self, x: np.ndarray) -> dict[str, np.ndarray]:
            return {"y": x * self.factor}

    io = {
        "inputs": [("x", "FP32", [-1, 4])],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}],
    }
    with servekit.serve(grpc_port=None) as server:  # no config: an empty server
        assert list(server.models) == []
        server.add_model("from_path", tmp_path / "file.onnx")
        server.add_model("from_str_path", str(tmp_path / "file.onnx"))
        server.add_model("from_bytes", model.SerializeToString())
        rows = server.add_model("from_proto", model, max_batch_size=8)
        assert [(r["name"], r["version"], r["state"]) for r in rows] == [
            ("from_proto", "1", "READY")
        ]
        for name in ("from_path", "from_str_path", "from_bytes", "from_proto"):
            np.testing.assert_allclose(
                server.infer(name, {"input": X})["output"], expected, rtol=1e-5
            )
        rows = server.add_model("from_folder", tmp_path / "versions", version_policy={"all": {}})
        assert [r["version"] for r in rows] == ["1", "4"]
        np.testing.assert_allclose(
            server.infer("from_folder", {"input": X}, version=4)["output"],
            _reference(onnx_builders.mlp(seed=4), {"input": X})[0],
            rtol=1e-5,
        )
        server.add_model("function", scale, **io)
        server.add_model("klass", Doubler, **io)
        data = np.arange(8, dtype=np.float32).reshape(2, 4)
        for name in ("function", "klass"):
            assert server.infer(name, {"x": data})["y"].tolist() == (data * 2).tolist()
        server.remove_model("function")
        assert "function" not in server.models.states()
        with pytest.raises(ServeError):
            server.infer("function", {"x": data})
        with pytest.raises(InvalidArgument, match=r"not a valid ONNX|failed to load"):
            server.add_model("broken", b"definitely not onnx")
        with pytest.raises(TypeError, match="source must be"):
            server.add_model("number", 42)
        with pytest.raises(FileNotFoundError):
            server.add_model("nowhere", tmp_path / "nowhere.onnx")


def test_reload_applies_an_edited_serve_yaml(store: Path) -> None:
    with servekit.serve(store, grpc_port=None) as server:
        onnx.save(onnx_builders.add_sub(), str(store.parent / "models" / "add_sub.onnx"))
        original = store.read_text()
        store.write_text(
            original
            + "  - {name: add_sub, modelFormat: {name: onnx}, storageUri: models/add_sub.onnx}\n"
        )
        done = server.reload()
        assert done["added"] == ["add_sub"]
        a, b = np.ones((1, 16), np.float32), np.full((1, 16), 0.5, np.float32)
        assert (
            server.infer("add_sub", {"INPUT0": a, "INPUT1": b})["OUTPUT1"].tolist()
            == (a - b).tolist()
        )
        store.write_text(original.replace("modelFormat", "modelFormatt", 1))
        with pytest.raises(ConfigError, match="modelFormatt"):
            server.reload()
        assert server.models.states()["add_sub"] == "READY"  # a bad edit changes nothing


def test_repr_html_card(store: Path) -> None:
    with servekit.serve(store) as server:
        card = server._repr_html_()
        assert server.url in card and server.dashboard_url in card
        assert str(server.grpc_target) in card and "running" in card
        assert card.count("READY") == 3  # mlp 1, mlp 2, text
        assert "<script" not in card
        assert "READY" in server.models._repr_html_()
    stopped = server._repr_html_()
    assert "stopped" in stopped and "READY" not in stopped


def test_grpc_and_http_clients_reach_a_notebook_server(store: Path) -> None:
    with servekit.serve(store) as server:
        expected = server.infer("mlp", {"input": X})["output"]
        grpc = grpcclient.InferenceServerClient(str(server.grpc_target))
        tensor = grpcclient.InferInput("input", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X)
        np.testing.assert_array_equal(grpc.infer("mlp", [tensor]).as_numpy("output"), expected)
        grpc.close()
        http = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        assert http.is_server_ready()
        http.close()


def test_connect_to_a_subprocess_server(server: ServerProcess, model_store: Path) -> None:
    remote = servekit.connect(server.http_url)
    mlp = model_store.parent / "mlp" / "2" / "model.onnx"
    out = remote.infer("mlp", {"input": X})
    np.testing.assert_allclose(out["output"], _reference(mlp, {"input": X})[0], rtol=1e-5)
    assert remote.infer("mlp", {"input": X.tolist()}, version=1, outputs=["output"]).keys() == {
        "output"
    }
    raw = np.array([["h\u00e9llo".encode(), b"nul\x00inside"]], dtype=object)
    assert remote.infer("identity_bytes", {"INPUT0": raw})["OUTPUT0"].tolist() == raw.tolist()
    states = remote.models.states()
    assert states["mlp"] == "READY" and states["broken_lfs"] == "UNAVAILABLE"
    model = onnx_builders.mlp(seed=11)
    rows = remote.add_model("nb_pushed", model)
    assert [r["state"] for r in rows] == ["READY"]
    np.testing.assert_allclose(
        remote.infer("nb_pushed", {"input": X})["output"],
        _reference(model, {"input": X})[0],
        rtol=1e-5,
    )
    remote.remove_model("nb_pushed")  # a pushed model's files are deleted: it is gone
    with pytest.raises(NotFound):
        remote.infer("nb_pushed", {"input": X})
    with pytest.raises(TypeError, match=r"servekit\.serve"):
        remote.add_model("fn", lambda x: x)
    with pytest.raises(NotFound, match="unknown"):
        remote.infer("no_such_model", {"input": X})
    assert "READY" in remote._repr_html_()
    remote.close()


def test_connect_finds_the_grpc_port_and_keeps_the_urls_host(server: ServerProcess) -> None:
    """A server started elsewhere: connect(url) alone yields a target tritonclient.grpc uses."""
    assert server.grpc_target is not None
    http_port, grpc_port = _port(server.http_url), _port(server.grpc_target)
    ports = httpx.get(f"{server.http_url}/servekit/v1/ports", timeout=10).json()
    assert ports == {"httpPort": http_port, "grpcPort": grpc_port}
    assert set(httpx.get(f"{server.http_url}/v2", timeout=10).json()) == {
        "name", "version", "extensions"
    }  # fmt: skip
    for host in ("127.0.0.1", "localhost"):  # the host is the one the user typed
        remote = servekit.connect(f"http://{host}:{http_port}")
        assert remote.grpc_target == f"{host}:{grpc_port}"
        expected = remote.infer("mlp", {"input": X})["output"]
        client = grpcclient.InferenceServerClient(remote.grpc_target)
        assert client.is_server_ready()
        tensor = grpcclient.InferInput("input", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X)
        np.testing.assert_array_equal(client.infer("mlp", [tensor]).as_numpy("output"), expected)
        client.close()
        assert remote.grpc_target in remote._repr_html_()
        remote.close()
    given = servekit.connect(server.http_url, grpc_target="gateway.example:443")
    assert given.grpc_target == "gateway.example:443"  # an explicit target is never replaced
    given.close()


def test_connect_to_a_server_with_grpc_disabled(store: Path) -> None:
    with running_server(store, grpc=False) as server:
        assert server.grpc_target is None  # the server's own listening line says so too
        ports = httpx.get(f"{server.http_url}/servekit/v1/ports", timeout=10).json()
        assert ports == {"httpPort": _port(server.http_url), "grpcPort": None}
        remote = servekit.connect(server.http_url)
        assert remote.grpc_target is None
        mlp = store.parent / "models" / "mlp" / "2" / "model.onnx"
        np.testing.assert_allclose(
            remote.infer("mlp", {"input": X})["output"], _reference(mlp, {"input": X})[0], rtol=1e-5
        )
        assert "gRPC" not in remote._repr_html_()
        remote.close()


class _OtherV2Server(http.server.BaseHTTPRequestHandler):
    """Another V2 server (not a servekit): live, and 404 for servekit's own paths."""

    def do_GET(self) -> None:
        live = self.path == "/v2/health/live"
        body = b'{"live": true}' if live else b'{"error": "not found"}'
        self.send_response(200 if live else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_connect_to_another_v2_server_leaves_grpc_unknown() -> None:
    with http.server.HTTPServer(("127.0.0.1", 0), _OtherV2Server) as other:
        thread = threading.Thread(target=other.serve_forever, kwargs={"poll_interval": 0.05})
        thread.start()
        try:
            remote = servekit.connect(f"http://127.0.0.1:{other.server_address[1]}")
            assert remote.grpc_target is None
            remote.close()
        finally:
            other.shutdown()
            thread.join(10)


def test_connect_refuses_a_bad_url() -> None:
    with pytest.raises(ValueError, match="URL"):
        servekit.connect("ftp://example")
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    with pytest.raises(ConnectionError, match="no server"):
        servekit.connect(f"http://127.0.0.1:{free}")


def test_interpreter_exit_stops_servers(store: Path) -> None:
    """A kernel ending without stop() stops its servers at exit: a hook registered before
    servekit.serve runs after servekit's own (atexit is last-in, first-out) and sees no thread."""
    script = textwrap.dedent(
        f"""
        import atexit, threading
        import servekit
        atexit.register(lambda: print("threads at exit:", len(threading.enumerate()), flush=True))
        server = servekit.serve({str(store)!r})
        print(server.url, server.grpc_target, flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    lines = done.stdout.splitlines()
    assert lines[-1] == "threads at exit: 1", done.stdout + done.stderr
    url, target = lines[0].split()
    assert _bindable(_port(url)) and _bindable(_port(target))


# -- tokens -----------------------------------------------------------------------------------
def _bearer(token: str) -> dict[str, str]:
    """The header tritonclient sends as given: HTTP header and gRPC metadata alike."""
    return {"authorization": f"Bearer {token}"}


def _mlp_inputs(module: type[httpclient.InferInput] | type[grpcclient.InferInput]) -> list[Any]:
    tensor = module("input", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    return [tensor]


def test_serve_with_a_generated_token_guards_every_group_but_health(
    store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    mlp = store.parent / "models" / "mlp" / "2" / "model.onnx"
    with servekit.serve(store, token=True) as server:
        token = server.token
        assert token is not None and len(token) >= 43  # token_urlsafe(32): 256 random bits
        assert servekit.serve(None, grpc_port=None, token=True, name="other").token != token
        registry.running()["other"].stop()
        # The handle itself: in process, and over HTTP with the token (metadata, push).
        expected = _reference(mlp, {"input": X})[0]
        np.testing.assert_allclose(server.infer("mlp", {"input": X})["output"], expected, rtol=1e-5)
        assert server.metadata("mlp")["name"] == "mlp"
        pushed = onnx_builders.mlp(seed=5)
        assert [r["state"] for r in server.add_model("pushed", pushed)] == ["READY"]
        server.remove_model("pushed")
        # Anyone else: 401 without the token or with a wrong one; health stays open for probes.
        with httpx.Client(base_url=server.url, timeout=10) as http:
            assert http.get("/v2/health/live").status_code == 200
            assert http.get("/v2/health/ready").status_code == 200
            assert http.get("/v2/models/mlp").status_code == 401
            assert http.get("/v2/models/mlp", headers=_bearer("wrong")).status_code == 401
            assert http.get("/v2/models/mlp", headers=_bearer(token)).status_code == 200
        rest = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        with pytest.raises(InferenceServerException):
            rest.infer("mlp", _mlp_inputs(httpclient.InferInput))
        answer = rest.infer("mlp", _mlp_inputs(httpclient.InferInput), headers=_bearer(token))
        np.testing.assert_allclose(answer.as_numpy("output"), expected, rtol=1e-5)
        rest.close()
        grpc = grpcclient.InferenceServerClient(str(server.grpc_target))
        assert grpc.is_server_ready()
        with pytest.raises(InferenceServerException) as refused:
            grpc.infer("mlp", _mlp_inputs(grpcclient.InferInput))
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        answer = grpc.infer("mlp", _mlp_inputs(grpcclient.InferInput), headers=_bearer(token))
        np.testing.assert_allclose(answer.as_numpy("output"), expected, rtol=1e-5)
        grpc.close()
        # The card says a token is set and how to use it, without the token itself (a cell's
        # output is saved in the notebook file).
        card = server._repr_html_()
        assert token not in card and f"<code>{token[:4]}\u2026</code> set" in card
        assert ".token" in card and "Bearer" in card
        assert token not in repr(server)
    assert token not in caplog.text


def test_serve_with_a_given_token_and_bad_tokens() -> None:
    with servekit.serve(None, grpc_port=None, token="  notebook-secret-1  ") as server:
        assert server.token == "notebook-secret-1"
        reply = httpx.get(f"{server.url}/v2", headers=_bearer("notebook-secret-1"), timeout=10)
        assert reply.status_code == 200
    for bad in ("", "   ", "two words", "caf\u00e9"):
        with pytest.raises(ValueError, match="printable ASCII") as caught:
            servekit.serve(None, grpc_port=None, token=bad)
        assert not bad.strip() or bad not in str(caught.value)  # never echoed
    with pytest.raises(TypeError, match="token must be"):
        servekit.serve(None, grpc_port=None, token=42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not both"):
        servekit.serve(None, grpc_port=None, token=True, auth={"default": "x"})
    assert registry.running() == {}


def test_serving_beyond_loopback_without_a_token_warns() -> None:
    with socket.socket() as taken:  # so that the bind fails and nothing listens outside
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.warns(UserWarning, match="without a token"), pytest.raises(OSError):
            servekit.serve(None, host="0.0.0.0", http_port=port, grpc_port=None)
    assert registry.running() == {}


def test_serve_yaml_tokens_by_group_are_used_by_the_handle(tmp_path: Path) -> None:
    onnx.save(onnx_builders.mlp(), str(tmp_path / "mlp.onnx"))
    (tmp_path / "infer.token").write_text("infer-token\n")
    (tmp_path / "repo.token").write_text("repo-token\n")
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server:\n"
        "  auth: {inference: {file: infer.token}, repository: {file: repo.token}}\n"
        "models:\n"
        "  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp.onnx}\n"
    )
    with servekit.serve(config, grpc_port=None) as server:
        assert server.token is None  # two tokens: no one token to show
        card = server._repr_html_()
        assert "for inference, repository" in card and "infer-token" not in card
        # Over HTTP, each call carries its own group's token.
        assert [r["state"] for r in server.add_model("pushed", onnx_builders.mlp(seed=2))] == [
            "READY"
        ]
        assert server.metadata("pushed")["name"] == "pushed"  # metadata is open here
        with httpx.Client(base_url=server.url, timeout=10) as http:
            body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [3, 16],
                                "data": X.ravel().tolist()}]}  # fmt: skip
            assert http.post("/v2/models/mlp/infer", json=body).status_code == 401
            refused = http.post("/v2/models/mlp/infer", json=body, headers=_bearer("repo-token"))
            assert refused.status_code == 401
            ok = http.post("/v2/models/mlp/infer", json=body, headers=_bearer("infer-token"))
            assert ok.status_code == 200


def _infer_over_connect(url: str, **kwargs: Any) -> np.ndarray:
    remote = servekit.connect(url, **kwargs)
    try:
        return np.asarray(remote.infer("mlp", {"input": X})["output"])
    finally:
        remote.close()


def test_connect_sends_the_token_and_explains_a_refusal(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SERVEKIT_TOKEN", raising=False)
    mlp = store.parent / "models" / "mlp" / "2" / "model.onnx"
    expected = _reference(mlp, {"input": X})[0]
    with servekit.serve(store, token=True) as server:
        token = str(server.token)
        remote = servekit.connect(server.url, token=token)
        assert remote.token == token
        assert remote.grpc_target == server.grpc_target  # the ports answer needs no retry
        np.testing.assert_allclose(remote.infer("mlp", {"input": X})["output"], expected, rtol=1e-5)
        np.testing.assert_allclose(
            remote.infer("mlp", {"input": X.tolist()})["output"], expected, rtol=1e-5
        )  # lists: the metadata request carries the token too
        assert remote.models.states()["mlp"] == "READY"
        assert [r["state"] for r in remote.add_model("pushed", onnx_builders.mlp(seed=3))] == [
            "READY"
        ]
        remote.remove_model("pushed")
        card = remote._repr_html_()
        assert token not in card and "sent with every request" in card
        remote.close()
        # SERVEKIT_TOKEN stands in for token= (a notebook shared with others need not hold it).
        monkeypatch.setenv("SERVEKIT_TOKEN", token)
        np.testing.assert_allclose(_infer_over_connect(server.url), expected, rtol=1e-5)
        monkeypatch.delenv("SERVEKIT_TOKEN")
        with pytest.raises(Unauthenticated, match=r"no token was sent.*SERVEKIT_TOKEN"):
            _infer_over_connect(server.url)
        with pytest.raises(Unauthenticated, match="token this handle sent was refused") as wrong:
            _infer_over_connect(server.url, token="not-the-token")
        assert "not-the-token" not in str(wrong.value) and token not in str(wrong.value)
        with pytest.raises(ValueError, match="printable ASCII"):
            servekit.connect(server.url, token="two words")
        anonymous = RemoteServer(server.url)  # the card still renders, and says why no models
        card = anonymous._repr_html_()
        assert "no token was sent" in card and "READY" not in card
        anonymous.close()


def test_connect_to_a_subprocess_server_with_a_token_file(tmp_path: Path) -> None:
    onnx.save(onnx_builders.mlp(), str(tmp_path / "mlp.onnx"))
    (tmp_path / "token").write_text("subprocess-token\n")
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {auth: {default: {file: token}}}\n"
        "models:\n"
        "  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp.onnx}\n"
    )
    with running_server(config) as server:
        expected = _reference(tmp_path / "mlp.onnx", {"input": X})[0]
        remote = servekit.connect(server.http_url, token="subprocess-token")
        assert remote.grpc_target == server.grpc_target
        np.testing.assert_allclose(remote.infer("mlp", {"input": X})["output"], expected, rtol=1e-5)
        remote.close()
        with pytest.raises(Unauthenticated, match="no token was sent"):
            _infer_over_connect(server.http_url)
        assert "subprocess-token" not in server.log()
