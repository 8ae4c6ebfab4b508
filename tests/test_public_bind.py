"""Issue 22: a server bound to every interface without a token keeps its admin and repository
APIs closed to every client, over HTTP and gRPC, and says so when it starts; inference,
metadata and health stay open. On a wildcard bind any IP address is a fine ``Host``, a public
name is not. (The server binds 0.0.0.0; the test reaches it at 127.0.0.1 only.)
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import onnx_builders
import pytest
from repo_helpers import onnx_bytes
from servers import ServerProcess, running_server

from servekit.protos import grpc_service_pb2 as pb
from servekit.protos import grpc_service_pb2_grpc as pb_grpc
from servekit.protos import grps_pb2, grps_pb2_grpc

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("public")
    (root / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    config = root / "serve.yaml"
    config.write_text(
        "models:\n  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub.onnx}\n"
    )
    argv = [sys.executable, "-m", "servekit", "serve", str(config), "--http-port", "0",
            "--grpc-port", "0", "--host", "0.0.0.0"]  # fmt: skip
    with running_server(config, command=argv) as started:
        yield started


def local(server: ServerProcess) -> httpx.Client:
    port = server.http_url.rsplit(":", 1)[1]
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)


INFER = {
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": [2.0] * 16},
    ]
}


@pytest.mark.parametrize(
    ("method", "path", "setting"),
    [
        ("GET", "/grps/v1/health/offline", "server.auth.admin"),
        ("GET", "/grps/v1/health/online", "server.auth.admin"),
        ("GET", "/metrics", "server.auth.admin"),
        ("GET", "/v2/models/add_sub/stats", "server.auth.admin"),
        ("GET", "/v2/models/add_sub/config", "server.auth.admin"),
        ("POST", "/dashboard/api/models/add_sub/benchmark", "server.auth.admin"),
        ("POST", "/v2/repository/index", "server.auth.repository"),
        ("POST", "/v2/repository/models/add_sub/unload", "server.auth.repository"),
    ],
)
def test_admin_and_repository_are_closed(
    server: ServerProcess, method: str, path: str, setting: str
) -> None:
    with local(server) as client:
        reply = client.request(method, path, json={} if method == "POST" else None)
        assert reply.status_code == 403, reply.text
        assert setting in reply.json()["error"]
        # a token changes nothing: there is none to match
        again = client.request(method, path, headers={"Authorization": "Bearer guess"})
        assert again.status_code == 403
    server.assert_healthy()  # still online, the model still ready


def test_inference_metadata_and_health_stay_open(server: ServerProcess) -> None:
    with local(server) as client:
        reply = client.post("/v2/models/add_sub/infer", json=INFER)
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["data"] == [3.0] * 16
        assert client.get("/v2/models/add_sub").status_code == 200
        assert client.get("/v2/health/ready").json() == {"ready": True}
        page = client.get("/models/add_sub")  # the dashboard shows no button nobody may use
        assert page.status_code == 200 and 'id="benchmark-run"' not in page.text


def test_grpc_closes_the_same_groups(server: ServerProcess) -> None:
    assert server.grpc_target is not None
    port = server.grpc_target.rsplit(":", 1)[1]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelStatistics(pb.ModelStatisticsRequest(name="add_sub"), timeout=10)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "server.auth.admin" in (caught.value.details() or "")
        with pytest.raises(grpc.RpcError) as caught:
            stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="add_sub"))
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        grps = grps_pb2_grpc.GrpsServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as caught:
            grps.Offline(grps_pb2.EmptyGrpsMessage(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert stub.ModelReady(pb.ModelReadyRequest(name="add_sub"), timeout=10).ready
        assert stub.ModelMetadata(pb.ModelMetadataRequest(name="add_sub"), timeout=10).name


def test_the_start_line_says_what_is_closed(server: ServerProcess) -> None:
    lines = [line for line in server.stdout_lines if line.startswith("servekit: closed:")]
    assert len(lines) == 1, server.log()
    assert "repository and admin" in lines[0] and "server.auth.admin" in lines[0]


def test_any_ip_is_a_fine_host_on_a_wildcard_bind_a_public_name_is_not(
    server: ServerProcess,
) -> None:
    with local(server) as client:
        for host in ("10.1.2.3:8000", "[2001:db8::5]:8000", "localhost", "gpu-box"):
            reply = client.get("/v2/health/live", headers={"Host": host})
            assert reply.status_code == 200, (host, reply.text)
        refused = client.get("/v2/health/live", headers={"Host": "models.attacker.example"})
        assert refused.status_code == 403
        assert "server.allowedHosts" in refused.json()["error"]
        infer = client.post(
            "/v2/models/add_sub/infer", json=INFER, headers={"Host": "models.attacker.example"}
        )
        assert infer.status_code == 403  # the inference fast path too


def test_server_allowed_hosts_lists_names(tmp_path: Path) -> None:
    (tmp_path / "add_sub.onnx").write_bytes(onnx_bytes(onnx_builders.add_sub()))
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {allowedHosts: [models.example.com, '*.corp.example']}\n"
        "models:\n  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub.onnx}\n"
    )
    with running_server(config, grpc=False) as started, started.http_client(timeout=10) as c:
        for host in ("models.example.com", "a.corp.example:80"):
            assert c.get("/v2/health/live", headers={"Host": host}).status_code == 200, host
        assert c.get("/v2/health/live", headers={"Host": "corp.example"}).status_code == 403
        assert not any(line.startswith("servekit: closed:") for line in started.stdout_lines)
