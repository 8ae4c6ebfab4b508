"""Tokens by API group, end to end: a real ``servekit serve`` with ``server.auth`` set, driven by
the real clients (tritonclient over HTTP and gRPC with their ``headers``, httpx, curl).

Each group is refused without its token (401 / UNAUTHENTICATED), refused with another group's
token, and served with its own; health stays open for probes; the log names the group and the
client, never the token. Tokens come from an environment variable, a file and the ``default``
fallback, the three ways serve.yaml can give them.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import onnx_builders
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from servers import ServerProcess, start_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

TOKENS = {
    "inference": "inf-7f3a9c1e5b2d4a6f",
    "metadata": "meta-2b8e4d6a1c3f5e7a",
    "repository": "repo-9d1c3e5f7a2b4c6d",
    "admin": "adm-4e6a8c0b2d1f3a5c",
}
WRONG = "not-the-token-0000"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """mlp behind four tokens: inference from the environment, repository from a file,
    admin in clear (validate warns about it), metadata through ``default``."""
    root = tmp_path_factory.mktemp("auth")
    path = root / "mlp" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(onnx_builders.mlp(seed=1).SerializeToString())
    (root / "repository.token").write_text(TOKENS["repository"] + "\n")
    (root / "serve.yaml").write_text(
        "server:\n"
        "  auth:\n"
        "    default: {env: TEST_META_TOKEN}\n"
        "    inference: {env: TEST_INFER_TOKEN}\n"
        "    repository: {file: repository.token}\n"
        f"    admin: {TOKENS['admin']}\n"
        "models:\n"
        "  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp}\n"
    )
    env = {"TEST_META_TOKEN": TOKENS["metadata"], "TEST_INFER_TOKEN": TOKENS["inference"]}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        server = start_server(root / "serve.yaml")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield server
    assert server.stop() == 0, server.log()


def bearer(group: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[group]}"}


HTTP_ROUTES = [
    ("metadata", "GET", "/v2", None),
    ("metadata", "GET", "/v2/models/mlp", None),
    ("metadata", "GET", "/v1/models", None),
    ("metadata", "GET", "/grps/v1/metadata/server", None),
    ("metadata", "GET", "/servekit/v1/ports", None),
    ("inference", "POST", "/v2/models/mlp/infer", "infer"),
    ("inference", "POST", "/v1/models/mlp:predict", "predict"),
    ("inference", "POST", "/grps/v1/infer/predict?model=mlp", "grps"),
    ("inference", "POST", "/v2/models/mlp/generate", "generate"),
    ("inference", "POST", "/v2/models/mlp/versions/1/generate_stream", "generate"),
    ("inference", "POST", "/v2/models/mlp/infer_stream", "infer"),
    ("repository", "POST", "/v2/repository/index", None),
    ("admin", "GET", "/v2/models/mlp/config", None),
    ("admin", "GET", "/v2/models/stats", None),
    ("admin", "GET", "/metrics", None),
]
BODIES = {
    None: None,
    "infer": {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16],
                          "data": [0.5] * 16}]},
    "predict": {"instances": [[0.5] * 16]},
    "generate": {"input": [0.5] * 16},
    "grps": {"gtensors": {"tensors": [{"name": "input", "dtype": "DT_FLOAT32", "shape": [1, 16],
                                       "flat_float32": [0.5] * 16}]}},
}  # fmt: skip


@pytest.mark.parametrize(("group", "method", "path", "body"), HTTP_ROUTES)
def test_each_http_group_needs_its_own_token(
    secured: ServerProcess, group: str, method: str, path: str, body: str | None
) -> None:
    others = [g for g in TOKENS if g != group]
    with httpx.Client(base_url=secured.http_url, timeout=30) as client:

        def call(headers: dict[str, str]) -> httpx.Response:
            return client.request(method, path, json=BODIES[body], headers=headers)

        missing = call({})
        assert missing.status_code == 401, missing.text
        assert missing.headers["www-authenticate"].startswith("Bearer")
        assert f"server.auth.{group}" in missing.json()["error"]
        assert call({"Authorization": f"Bearer {WRONG}"}).status_code == 401
        assert call({"Authorization": TOKENS[group]}).status_code == 401  # scheme missing
        for other in others:
            assert call(bearer(other)).status_code == 401, other
        served = call(bearer(group))
        assert served.status_code == 200, served.text
        lower = call({"authorization": f"bearer {TOKENS[group]}"})  # scheme in any case
        assert lower.status_code == 200, lower.text


@pytest.mark.parametrize(
    "path", ["/v2/health/live", "/v2/health/ready", "/v2/models/mlp/ready", "/grps/v1/health/live"]
)
def test_health_stays_open_for_probes(secured: ServerProcess, path: str) -> None:
    assert httpx.get(secured.http_url + path, timeout=10).status_code == 200


def test_the_openapi_document_is_open(secured: ServerProcess) -> None:
    document = httpx.get(secured.http_url + "/openapi/openapi.json", timeout=10)
    assert document.status_code == 200
    assert "/v2/repository/index" in document.json()["paths"]


def test_tritonclient_http_passes_the_token_as_a_header(secured: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(secured.http_host_port)
    x = httpclient.InferInput("input", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32), binary_data=True)
    try:
        with pytest.raises(InferenceServerException, match="needs a token"):
            client.infer("mlp", [x])
        result = client.infer("mlp", [x], headers=bearer("inference"))
        assert result.as_numpy("output").shape == (1, 4)
        assert client.is_server_ready()  # health: no header at all
        with pytest.raises(InferenceServerException, match="needs a token"):
            client.get_model_repository_index(headers=bearer("inference"))
        index = client.get_model_repository_index(headers=bearer("repository"))
        assert [m["name"] for m in index] == ["mlp"]
        stats = client.get_inference_statistics("mlp", headers=bearer("admin"))
        assert stats["model_stats"][0]["name"] == "mlp"
    finally:
        client.close()


GRPC_CALLS = [
    ("metadata", lambda c, h: c.get_server_metadata(headers=h)),
    ("metadata", lambda c, h: c.get_model_metadata("mlp", headers=h)),
    ("inference", lambda c, h: c.infer("mlp", [_grpc_input()], headers=h)),
    ("repository", lambda c, h: c.get_model_repository_index(headers=h)),
    ("repository", lambda c, h: c.load_model("mlp", headers=h)),
    ("admin", lambda c, h: c.get_model_config("mlp", headers=h)),
    ("admin", lambda c, h: c.get_inference_statistics("mlp", headers=h)),
]


def _grpc_input() -> grpcclient.InferInput:
    x = grpcclient.InferInput("input", [1, 16], "FP32")
    x.set_data_from_numpy(np.ones((1, 16), np.float32))
    return x


@pytest.mark.parametrize(("group", "call"), GRPC_CALLS)
def test_each_grpc_group_needs_its_own_token(
    secured: ServerProcess, group: str, call: object
) -> None:
    assert secured.grpc_target is not None
    client = grpcclient.InferenceServerClient(secured.grpc_target)
    run = call  # type: ignore[assignment]
    try:
        for headers in ({}, {"authorization": f"Bearer {WRONG}"},
                        *[bearer(g) for g in TOKENS if g != group]):  # fmt: skip
            with pytest.raises(InferenceServerException) as refused:
                run(client, {k.lower(): v for k, v in headers.items()})  # type: ignore[operator]
            assert refused.value.status() == "StatusCode.UNAUTHENTICATED", refused.value
            assert f"server.auth.{group}" in refused.value.message()
        run(client, {"authorization": f"Bearer {TOKENS[group]}"})  # type: ignore[operator]
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("mlp")
    finally:
        client.close()


def test_grpc_streaming_inference_needs_the_token(secured: ServerProcess) -> None:
    assert secured.grpc_target is not None
    results: list[object] = []
    client = grpcclient.InferenceServerClient(secured.grpc_target)
    try:
        client.start_stream(callback=lambda result, error: results.append(error or result),
                            headers={"authorization": f"Bearer {WRONG}"})  # fmt: skip
        # The refusal may end the stream before the request is even written.
        with contextlib.suppress(InferenceServerException):
            client.async_stream_infer("mlp", [_grpc_input()])
        client.stop_stream()
        assert len(results) == 1 and isinstance(results[0], InferenceServerException)
        assert results[0].status() == "StatusCode.UNAUTHENTICATED"
        results.clear()
        client.start_stream(callback=lambda result, error: results.append(error or result),
                            headers={"authorization": f"Bearer {TOKENS['inference']}"})  # fmt: skip
        client.async_stream_infer("mlp", [_grpc_input()])
        client.stop_stream()
        assert len(results) == 1 and results[0].as_numpy("output").shape == (1, 4)  # type: ignore[attr-defined]
    finally:
        client.close()


def test_grpc_health_service_stays_open(secured: ServerProcess) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    assert secured.grpc_target is not None
    with grpc.insecure_channel(secured.grpc_target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_curl_with_the_token(secured: ServerProcess) -> None:
    def curl(*headers: str) -> str:
        args = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                f"{secured.http_url}/v2/repository/index"]  # fmt: skip
        for header in headers:
            args += ["-H", header]
        return subprocess.run(args, capture_output=True, text=True, timeout=30, check=True).stdout

    assert curl() == "401"
    assert curl(f"Authorization: Bearer {TOKENS['repository']}") == "200"


def test_refusals_are_logged_without_the_token(secured: ServerProcess) -> None:
    httpx.post(f"{secured.http_url}/v2/repository/index",
               headers={"Authorization": "Bearer guess-1234-secret"}, timeout=10)  # fmt: skip
    log = secured.log()
    assert "refused a repository request from 127.0.0.1" in log
    assert "guess-1234-secret" not in log
    for token in TOKENS.values():
        assert token not in log


def test_a_missing_token_variable_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("server:\n  auth:\n    inference: {env: SERVEKIT_TEST_UNSET_TOKEN}\n")
    env = {k: v for k, v in os.environ.items() if k != "SERVEKIT_TEST_UNSET_TOKEN"}
    done = subprocess.run(["servekit", "validate", str(config)], capture_output=True, text=True,
                          timeout=60, env=env)  # fmt: skip
    assert done.returncode == 1
    assert "serve.yaml:3: server.auth.inference" in done.stderr
    assert "SERVEKIT_TEST_UNSET_TOKEN is not set" in done.stderr


def test_index_json_of_a_secured_server_names_no_token(secured: ServerProcess) -> None:
    index = httpx.post(f"{secured.http_url}/v2/repository/index", headers=bearer("repository"),
                       timeout=10)  # fmt: skip
    text = json.dumps(index.json())
    assert all(token not in text for token in TOKENS.values())
