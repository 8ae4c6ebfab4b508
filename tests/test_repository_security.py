"""Pushed file names cannot escape the storage folder, over both transports.

Every malicious name is sent beside a valid file, so the test also proves that names are
validated before anything is written: after each refused request the whole temporary tree
(store, storage folder and a folder outside it) is byte-for-byte as before.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import onnx_builders
import pytest
from repo_helpers import Repo, onnx_bytes, snapshot, write_store
from servers import ServerProcess, start_server

pytestmark = pytest.mark.slow

BAD_KEYS = [
    "file:../evil.onnx",
    "file:1/../../evil.onnx",
    "file:1/../../../outside/evil.onnx",
    "file:/tmp/evil.onnx",
    "file://tmp/evil.onnx",
    "file:1/..",
    "file:1/./model.onnx",
    "file:1\\..\\..\\evil.onnx",
    "file:..\\evil.onnx",
    "file:1/a\x00b.onnx",
    "file:1/.hidden",
    "file:C:/evil.onnx",
    "file:1//model.onnx",
    "file:1/model.onnx/",
    "file:",
    "file:model.onnx",
    "file:one/model.onnx",
    "file:~/evil.onnx",
    "file:1/%2e%2e/evil.onnx",
    "file:1/" + "a" * 300,
    "file:1/a/b/c/d/e/f/g/h/i.onnx",
]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("security")
    (base / "store").mkdir()
    (base / "outside").mkdir()
    write_store(base / "store")
    return base


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[ServerProcess]:
    process = start_server(root / "store" / "serve.yaml", grpc=True)
    yield process
    assert process.stop() == 0, process.log()


@pytest.mark.parametrize("key", BAD_KEYS, ids=range(len(BAD_KEYS)))
def test_file_names_that_could_escape_are_refused(repo: Repo, root: Path, key: str) -> None:
    before = snapshot(root)
    files = {"file:1/model.onnx": onnx_bytes(onnx_builders.add_sub()), key: b"evil"}
    message = repo.expect_error(
        "INVALID_ARGUMENT", repo.load, "victim", {"backend": "onnxruntime"}, files
    )
    assert "file" in message
    assert snapshot(root) == before, "a refused push wrote something"
    assert not (root / "store" / ".servekit" / "storage" / "victim").exists()


def test_a_link_planted_in_storage_is_not_followed(repo: Repo, root: Path) -> None:
    storage = root / "store" / ".servekit" / "storage"
    storage.mkdir(parents=True, exist_ok=True)
    link = storage / f"linked_{repo.transport}"
    link.symlink_to(root / "outside", target_is_directory=True)
    try:
        files = {"file:1/model.onnx": onnx_bytes(onnx_builders.add_sub())}
        message = repo.expect_error(
            "INVALID_ARGUMENT", repo.load, link.name, {"backend": "onnxruntime"}, files
        )
        assert "link" in message
        assert list((root / "outside").iterdir()) == []
    finally:
        link.unlink()


def test_model_names_that_could_escape_are_refused(server: ServerProcess, root: Path) -> None:
    before = snapshot(root)
    assert server.grpc_target is not None
    grpc_repo = Repo("grpc", server.http_url, server.grpc_target)
    files = {"file:1/model.onnx": onnx_bytes(onnx_builders.add_sub())}
    try:
        for name in ("../evil", "..", "a/b", "/abs", "a\\b", "a\x00b", ".hidden"):
            grpc_repo.expect_error(
                "INVALID_ARGUMENT", grpc_repo.load, name, {"backend": "onnxruntime"}, files
            )
    finally:
        grpc_repo.close()
    body = {
        "parameters": {
            "config": json.dumps({"backend": "onnxruntime"}),
            "file:1/model.onnx": base64.b64encode(files["file:1/model.onnx"]).decode(),
        }
    }
    with httpx.Client(base_url=server.http_url) as client:
        for raw in ("..%2Fevil", "%2E%2E", "a%5Cb", "a%00b", ".hidden"):
            answer = client.post(f"/v2/repository/models/{raw}/load", json=body)
            assert answer.status_code in (400, 404), answer.text
            assert "error" in answer.json()
    assert snapshot(root) == before


def test_bad_base64_and_non_bytes_files(server: ServerProcess, root: Path) -> None:
    before = snapshot(root)
    config = json.dumps({"backend": "onnxruntime"})
    with httpx.Client(base_url=server.http_url) as client:
        for value in ("not base64!!", 12, None, ["AAAA"]):
            answer = client.post(
                "/v2/repository/models/victim/load",
                json={"parameters": {"config": config, "file:1/model.onnx": value}},
            )
            assert answer.status_code == 400, answer.text
        for body in (b"{", b"[]", b'{"parameters": 3}'):
            answer = client.post("/v2/repository/models/victim/load", content=body)
            assert answer.status_code == 400, answer.text
        assert client.post("/v2/repository/index", content=b'{"ready": "yes"}').status_code == 400
    assert snapshot(root) == before
