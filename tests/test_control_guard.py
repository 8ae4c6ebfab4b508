"""Control routes are safe from the network and from other sites' pages, end to end.

``server.modelControl: none`` refuses load and unload over HTTP and gRPC with 403 /
PERMISSION_DENIED naming the setting, while the index stays readable. Control routes (load,
unload, grps online/offline) refuse what a page of another site can send without a preflight
(a cross-site Sec-Fetch-Site, a foreign Origin, a form content type), and keep serving the
clients that are not browsers (tritonclient sends no Content-Type at all). The real browser
version of the attack is in the dashboard's browser tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import onnx_builders
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from servers import ServerProcess, start_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow


def _store(root: Path, server_yaml: str) -> Path:
    path = root / "mlp" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(onnx_builders.mlp(seed=1).SerializeToString())
    config = root / "serve.yaml"
    config.write_text(
        f"server: {server_yaml}\nmodels:\n"
        "  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp}\n"
    )
    return config


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(_store(tmp_path_factory.mktemp("locked"), "{modelControl: none}"))
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(_store(tmp_path_factory.mktemp("open"), "{}"))
    yield server
    assert server.stop() == 0, server.log()


def test_model_control_none_refuses_load_and_unload_over_http(locked: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(locked.http_host_port)
    try:
        for action in (lambda: client.load_model("mlp"), lambda: client.unload_model("mlp")):
            with pytest.raises(InferenceServerException) as refused:
                action()
            assert refused.value.status() == "403"
            assert "server.modelControl is none" in refused.value.message()
        assert [m["state"] for m in client.get_model_repository_index()] == ["READY"]
        assert client.is_model_ready("mlp")
    finally:
        client.close()


def test_model_control_none_refuses_load_and_unload_over_grpc(locked: ServerProcess) -> None:
    assert locked.grpc_target is not None
    client = grpcclient.InferenceServerClient(locked.grpc_target)
    try:
        for action in (lambda: client.load_model("mlp"), lambda: client.unload_model("mlp")):
            with pytest.raises(InferenceServerException) as refused:
                action()
            assert refused.value.status() == "StatusCode.PERMISSION_DENIED"
            assert "server.modelControl" in refused.value.message()
        index = client.get_model_repository_index(as_json=True)
        assert [m["name"] for m in index["models"]] == ["mlp"]
    finally:
        client.close()


def test_a_push_is_refused_and_writes_nothing_under_model_control_none(
    locked: ServerProcess,
) -> None:
    client = httpclient.InferenceServerClient(locked.http_host_port)
    model = onnx_builders.mlp(seed=3).SerializeToString()
    try:
        with pytest.raises(InferenceServerException, match="modelControl"):
            client.load_model("pushed", config='{"backend": "onnxruntime"}',
                              files={"file:1/model.onnx": model})  # fmt: skip
    finally:
        client.close()
    storage = Path(locked.log_path).parent / ".servekit" / "storage"
    assert not storage.exists() or not any(storage.iterdir())


CROSS_SITE = [
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},  # another port of the same host is another origin
    {"Origin": "http://evil.example"},
    {"Origin": "null"},
    {"Content-Type": "text/plain"},
    {"Content-Type": "application/x-www-form-urlencoded"},
    {"Content-Type": "multipart/form-data; boundary=x"},
]


@pytest.mark.parametrize("headers", CROSS_SITE)
@pytest.mark.parametrize("action", ["load", "unload"])
def test_what_another_site_can_send_is_refused(
    open_server: ServerProcess, headers: dict[str, str], action: str
) -> None:
    url = f"{open_server.http_url}/v2/repository/models/mlp/{action}"
    refused = httpx.post(url, content=b"{}", headers=headers, timeout=30)
    assert refused.status_code == 403, refused.text
    assert "error" in refused.json()
    assert httpx.get(f"{open_server.http_url}/v2/models/mlp/ready", timeout=10).status_code == 200


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_grps_offline_from_another_site_is_refused(open_server: ServerProcess, method: str) -> None:
    url = f"{open_server.http_url}/grps/v1/health/offline"
    refused = httpx.request(method, url, headers={"Sec-Fetch-Site": "cross-site"}, timeout=10)
    assert refused.status_code == 403
    assert httpx.get(f"{open_server.http_url}/v2/health/ready", timeout=10).json() == {
        "ready": True
    }


def test_same_origin_pages_and_non_browser_clients_keep_control(open_server: ServerProcess) -> None:
    host = open_server.http_host_port
    same_origin = [
        {"Sec-Fetch-Site": "same-origin", "Origin": f"http://{host}",
         "Content-Type": "application/json"},
        {"Origin": f"http://{host}", "Content-Type": "application/json"},
        {"Sec-Fetch-Site": "none"},
        {},
    ]  # fmt: skip
    for headers in same_origin:
        url = f"{open_server.http_url}/v2/repository/models/mlp/load"
        answer = httpx.post(url, content=b"{}", headers=headers, timeout=30)
        assert answer.status_code == 200, (headers, answer.text)
    client = httpclient.InferenceServerClient(host)  # sends no Content-Type at all
    try:
        client.unload_model("mlp")
        client.load_model("mlp")
        assert client.is_model_ready("mlp")
    finally:
        client.close()
