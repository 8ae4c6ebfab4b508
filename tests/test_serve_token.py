"""``servekit serve --token T`` and ``SERVEKIT_TOKEN`` in the server's environment: one token for
every API group but health, over HTTP and gRPC, on a real server (issue 27).

serve.yaml's own ``server.auth`` groups keep their tokens; health stays open for probes; the
token never appears in the server's output.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx_builders
import pytest
import tritonclient.grpc as grpcclient
from servers import ServerProcess, start_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

TOKEN = "flag-token-5c1e9a7b3d"
ENV_TOKEN = "env-token-8f2a4c6e0b"
OWN = "own-admin-token-3b7d"
INFER = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}


def _project(root: Path, auth: str = "") -> Path:
    path = root / "mlp" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(onnx_builders.mlp(seed=1).SerializeToString())
    (root / "serve.yaml").write_text(
        f"{auth}models:\n  - {{name: mlp, modelFormat: {{name: onnx}}, storageUri: mlp}}\n"
    )
    return root / "serve.yaml"


def _start(config: Path, env: dict[str, str], extra: tuple[str, ...] = ()) -> ServerProcess:
    """A server with ``env`` added to its environment (and SERVEKIT_TOKEN only when given)."""
    saved = {k: os.environ.get(k) for k in (*env, "SERVEKIT_TOKEN")}
    os.environ.pop("SERVEKIT_TOKEN", None)
    os.environ.update(env)
    try:
        return start_server(config, extra=extra)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def flagged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = _start(_project(tmp_path_factory.mktemp("flag")), {}, ("--token", TOKEN))
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def from_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    auth = "server:\n  auth:\n    admin: {env: TEST_OWN_ADMIN}\n"
    config = _project(tmp_path_factory.mktemp("env"), auth)
    server = _start(config, {"SERVEKIT_TOKEN": ENV_TOKEN, "TEST_OWN_ADMIN": OWN})
    yield server
    assert server.stop() == 0, server.log()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("which", ["flagged", "from_env"])
def test_every_http_group_needs_the_token_and_health_stays_open(
    request: pytest.FixtureRequest, which: str
) -> None:
    server: ServerProcess = request.getfixturevalue(which)
    token = TOKEN if which == "flagged" else ENV_TOKEN
    with httpx.Client(base_url=server.http_url, timeout=30) as client:
        for method, path, body in [
            ("POST", "/v2/models/mlp/infer", INFER),
            ("GET", "/v2/models/mlp", None),
            ("POST", "/v2/repository/index", None),
        ]:
            refused = client.request(method, path, json=body)
            assert refused.status_code == 401, (path, refused.text)
            wrong = client.request(method, path, json=body, headers=_bearer("wrong-token-00"))
            assert wrong.status_code == 401, path
            served = client.request(method, path, json=body, headers=_bearer(token))
            assert served.status_code == 200, (path, served.text)
        for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/mlp/ready"):
            assert client.get(path).status_code == 200, path
    assert token not in server.log()


@pytest.mark.parametrize("which", ["flagged", "from_env"])
def test_grpc_needs_the_token_and_health_stays_open(
    request: pytest.FixtureRequest, which: str
) -> None:
    server: ServerProcess = request.getfixturevalue(which)
    token = TOKEN if which == "flagged" else ENV_TOKEN
    assert server.grpc_target is not None
    client = grpcclient.InferenceServerClient(server.grpc_target)
    x = grpcclient.InferInput("input", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.infer("mlp", [x])
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        with pytest.raises(InferenceServerException) as refused:
            client.get_model_metadata("mlp")
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        result = client.infer("mlp", [x], headers={"authorization": f"Bearer {token}"})
        assert result.as_numpy("output").shape == (1, 4)
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("mlp")
    finally:
        client.close()


def test_a_group_serve_yaml_names_keeps_its_own_token(from_env: ServerProcess) -> None:
    with httpx.Client(base_url=from_env.http_url, timeout=30) as client:
        assert client.get("/v2/models/stats", headers=_bearer(ENV_TOKEN)).status_code == 401
        assert client.get("/v2/models/stats", headers=_bearer(OWN)).status_code == 200
        infer = client.post("/v2/models/mlp/infer", json=INFER, headers=_bearer(ENV_TOKEN))
        assert infer.status_code == 200, infer.text


def test_workers_inherit_the_token_and_never_see_it_on_a_command_line(tmp_path: Path) -> None:
    """Under --workers the token reaches each worker through its environment (SERVEKIT_TOKEN),
    not through the worker's command line, which any user of the machine can read."""
    server = _start(_project(tmp_path), {}, ("--workers", "2", "--token", TOKEN, "--no-grpc"))
    try:
        with httpx.Client(base_url=server.http_url, timeout=30) as client:
            for _ in range(6):  # the kernel spreads connections over both workers
                with httpx.Client(base_url=server.http_url, timeout=30) as fresh:
                    assert fresh.post("/v2/models/mlp/infer", json=INFER).status_code == 401
                    served = fresh.post("/v2/models/mlp/infer", json=INFER, headers=_bearer(TOKEN))
                    assert served.status_code == 200, served.text
            assert client.get("/v2/health/ready").status_code == 200
        pid = server.process.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        assert len(children) >= 2
        for child in children:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            assert TOKEN.encode() not in argv
            assert b"SERVEKIT_TOKEN" in argv  # the spec names the variable
    finally:
        assert server.stop() == 0, server.log()
