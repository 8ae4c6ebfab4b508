"""``servekit save URL OUT`` treats the server's answers as untrusted: a model name from its index
that serve.yaml would refuse (``../../x``, ``..``, ``a/b``) fails the save with a clear error,
and nothing outside OUT (nor OUT itself) is removed or written.

The server is a real, small HTTP server in this test answering the V2 routes ``save`` reads, as
a hostile or broken server would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from servekit.project.save import Project, SaveError

BAD_NAMES = ["../../x", "..", "a/b"]


def _handler(names: list[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _json(self, status: int, obj: object) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v2/health/live":
                self._json(200, {})
            elif self.path.endswith("/config"):
                self._json(200, {"backend": "onnxruntime", "max_batch_size": 0})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            if self.path == "/v2/repository/index":
                rows = [{"name": n, "version": "1", "state": "READY"} for n in names]
                self._json(200, rows)
            else:
                self._json(404, {"error": "not found"})

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def hostile_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(["fine", *BAD_NAMES]))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _layout(tmp_path: Path) -> tuple[Path, dict[Path, bytes]]:
    """OUT (with files of its own) and the folders a traversal would reach."""
    out = tmp_path / "work" / "out"
    files = {
        tmp_path / "work" / "x" / "precious.txt": b"outside OUT",  # OUT/models/../../x
        out / "notes.txt": b"OUT's own file",  # OUT: models/..
        out / "models" / "a" / "b" / "model.onnx": b"another model's file",  # models/a/b
        out / "models" / "keep" / "1" / "model.onnx": b"kept",
    }
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return out, files


@pytest.mark.slow  # a real HTTP server and the CLI in a process (tests/tiers.py)
def test_save_refuses_model_names_that_are_paths(hostile_server: str, tmp_path: Path) -> None:
    out, files = _layout(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "servekit", "save", hostile_server, str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "not model names" in run.stderr, run.stderr
    for name in BAD_NAMES:
        assert repr(name) in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    for path, content in files.items():
        assert path.read_bytes() == content, f"{path} was changed or removed"
    assert not (out / "serve.yaml").exists()


@pytest.mark.parametrize(
    ("entry", "files"),
    [
        ({"name": "..", "storageUri": "models/.."}, {}),
        ({"name": "ok", "storageUri": "models/../../x"}, {}),
        ({"name": "ok", "storageUri": "models/"}, {}),
        ({"name": "ok", "storageUri": "models/ok"}, {"../escape.txt": b"x"}),
        ({"name": "ok", "storageUri": "models/ok"}, {"models/../../escape.txt": b"x"}),
        ({"name": "ok\n", "storageUri": "models/ok"}, {}),
    ],
)
def test_project_write_touches_nothing_outside_the_folder(
    tmp_path: Path, entry: dict[str, str], files: dict[str, bytes]
) -> None:
    out, kept = _layout(tmp_path)
    project = Project(models=[entry], files=files)
    with pytest.raises(SaveError, match="nothing was written"):
        project.write(out)
    for path, content in kept.items():
        assert path.read_bytes() == content
    assert not (tmp_path / "work" / "escape.txt").exists()
    assert not (tmp_path / "escape.txt").exists()
    assert not (out / "serve.yaml").exists()
