"""servekit's own OpenAPI document (``/openapi/openapi.json``) against the server serving it.

tests/test_openapi_conformance.py holds the REST surface to KServe's official V2 document;
this module holds the server to what it says about itself: schemathesis reads the served
document, generates requests from it (valid and invalid: examples, coverage and fuzzing
phases, bounded) and checks every answer: no 5xx, every status documented, bodies and content
types as documented, schema-valid requests accepted and schema-invalid ones refused, 405 with
``Allow`` for methods a path does not take, and OPTIONS naming exactly the documented methods.

Each test starts its own server (``--no-grpc``, healthy models only): the document has control
routes (grps offline, repository unload) that schemathesis calls, and the session's shared
server must not go offline under other tests. After a control call the models are loaded
again and the server put back online, so every case starts from a ready server.

``positive_data_acceptance`` is not applied to the inference operations (the OpenAI-compatible
ones too), a repository load and a
shared memory registration (its key must name an existing object on the host): a body valid
against the document (any tensors; any model configuration text) is still
refused with 400 when its tensors do not match the model's signature or its configuration is
not a model, which a document about routes cannot say (as for the V2 document).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import onnx
import onnx_builders
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks
from servers import ServerProcess, identity_name, start_server

pytestmark = pytest.mark.slow

MODELS = [identity_name(dt) for dt in ("FP32", "INT64", "BYTES", "BOOL")] + ["add_sub", "mlp"]
TOKEN = "s3cret-token-for-tests"
REQUEST_TIMEOUT = 10.0
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
    checks.positive_data_acceptance,
    checks.missing_required_header,
    checks.unsupported_method,
    checks.allow_header_conformance,
]
NOT_BY_SCHEMA = {
    # a register body valid against the document names a shared memory object that must exist
    # on the server's host, which no document can say
    "/v2/systemsharedmemory/region/{name}/register",
    # refused by design (no GPUs), whatever the body
    "/v2/cudasharedmemory/region/{name}/register",
    # other fields are ignored, as grps ignores them, but a second kind of data is refused
    "/grps/v1/metadata/model",
    "/v2/repository/models/{model}/load",
    "/v2/models/{model}/infer",
    "/v2/models/{model}/versions/{version}/infer",
    "/v1/models/{model}:predict",
    "/grps/v1/infer/predict",
    "/v2/models/{model}/generate",
    "/v2/models/{model}/versions/{version}/generate",
    "/v2/models/{model}/generate_stream",
    "/v2/models/{model}/versions/{version}/generate_stream",
    "/v2/models/{model}/infer_stream",
    "/v2/models/{model}/versions/{version}/infer_stream",
    # OpenAI's bodies name a served model of the route's kind and its text
    "/openai/v1/chat/completions",
    "/openai/v1/completions",
    "/openai/v1/embeddings",
}
CONTROL = ("/grps/v1/health/offline", "/v2/repository/models/{model}/unload")
"""Operations after which the server is put back as it was."""


def _write_store(root: Path, auth: str = "") -> Path:
    models = root / "models"
    entries = []
    for name in MODELS[:4]:
        datatype = name.removeprefix("identity_").upper()
        path = models / f"{name}.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(onnx_builders.identity(datatype), str(path))
        entries.append(
            f"  - {{name: {name}, modelFormat: {{name: onnx}}, storageUri: {name}.onnx}}"
        )
    (models / "add_sub" / "1").mkdir(parents=True)
    onnx.save(onnx_builders.add_sub(), str(models / "add_sub" / "1" / "model.onnx"))
    entries.append("  - {name: add_sub, modelFormat: {name: onnx}, storageUri: add_sub}")
    for version in (1, 2):
        (models / "mlp" / str(version)).mkdir(parents=True)
        onnx.save(
            onnx_builders.mlp(seed=version), str(models / "mlp" / str(version) / "model.onnx")
        )
    entries.append(
        "  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp, versionPolicy: {all: {}}}"
    )
    config = models / "serve.yaml"
    config.write_text(f"server: {{name: servekit{auth}}}\nmodels:\n" + "\n".join(entries) + "\n")
    return config


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = start_server(_write_store(tmp_path_factory.mktemp("self")), grpc=False)
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Every group but the open one behind a token (which the generated requests lack)."""
    store = _write_store(tmp_path_factory.mktemp("tokens"), f", auth: {{default: {TOKEN}}}")
    server = start_server(store, grpc=False)
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def own_schema(own_server: ServerProcess) -> Any:
    return schemathesis.openapi.from_url(f"{own_server.http_url}/openapi/openapi.json")


@pytest.fixture(scope="module")
def token_schema(token_server: ServerProcess) -> Any:
    return schemathesis.openapi.from_url(f"{token_server.http_url}/openapi/openapi.json")


def _restore(server: ServerProcess) -> None:
    """Online, and every model unloaded by the last call loaded again."""
    with httpx.Client(base_url=server.http_url, timeout=30) as client:
        assert client.post("/grps/v1/health/online").status_code == 200
        ready = {
            row["name"] for row in client.post("/v2/repository/index", json={"ready": True}).json()
        }
        for name in set(MODELS) - ready:
            response = client.post(f"/v2/repository/models/{name}/load")
            assert response.status_code == 200, response.text


def _checks(case: schemathesis.Case) -> list[Any]:
    if case.operation.path in NOT_BY_SCHEMA:
        return [c for c in CHECKS if c is not checks.positive_data_acceptance]
    return CHECKS


SETTINGS = settings(
    max_examples=10,
    deadline=timedelta(seconds=10),
    suppress_health_check=list(HealthCheck),
    database=None,
)

own = schemathesis.pytest.from_fixture("own_schema")


@pytest.mark.timeout(300)  # one test for all operations (a lazy schema): ~2 min on 2 cores
@own.parametrize()
@SETTINGS
def test_document_matches_server(case: schemathesis.Case, own_server: ServerProcess) -> None:
    """Every generated request is answered as the document says."""
    try:
        case.call_and_validate(
            base_url=own_server.http_url, checks=_checks(case), timeout=REQUEST_TIMEOUT
        )
    finally:
        if case.operation.path in CONTROL:
            _restore(own_server)
    assert own_server.alive(), own_server.log()


protected = schemathesis.pytest.from_fixture("token_schema")


@protected.parametrize()
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_document_with_tokens(case: schemathesis.Case, token_server: ServerProcess) -> None:
    """With tokens configured, requests without one are refused as documented (401)."""
    case.call_and_validate(
        base_url=token_server.http_url, checks=_checks(case), timeout=REQUEST_TIMEOUT
    )


# --- the document's shape ------------------------------------------------------------------------


def _document(server: ServerProcess) -> dict[str, Any]:
    with server.http_client(timeout=10) as client:
        response = client.get("/openapi/openapi.json")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


def test_v1_routes_as_clients_call_them(own_server: ServerProcess) -> None:
    """The V1 predict operation sits on its real path; status and predict are two resources."""
    paths = _document(own_server)["paths"]
    assert set(paths["/v1/models/{model}:predict"]) == {"post"}
    assert set(paths["/v1/models/{model}"]) == {"get"}
    assert not [p for p in paths if "{target}" in p or p.startswith("/openapi")]
    with own_server.http_client(timeout=10) as client:
        options = client.options("/v1/models/mlp:predict")
        assert options.headers["allow"] == "OPTIONS, POST"
        assert client.options("/v1/models/mlp").headers["allow"] == "GET, OPTIONS"
        wrong = client.get("/v1/models/mlp:predict")
        assert (wrong.status_code, wrong.headers["allow"]) == (405, "OPTIONS, POST")
        wrong = client.post("/v1/models/mlp", json={"instances": [[0.0] * 16]})
        assert (wrong.status_code, wrong.headers["allow"]) == (405, "GET, OPTIONS")
        assert client.get("/v1/models/mlp").json() == {"name": "mlp", "ready": True}


def test_every_operation_documents_its_failures(own_server: ServerProcess) -> None:
    """Each operation lists the edge's 503, 401 unless open, and {"error": ...} bodies."""
    document = _document(own_server)
    open_paths = {"/v2/health/live", "/v2/health/ready", "/grps/v1/health/live"}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            assert "503" in responses, (method, path)
            if path in open_paths or path.endswith("/ready"):
                assert "401" not in responses, (method, path)
            else:
                assert "401" in responses, (method, path)
            for status, response in responses.items():
                assert status.startswith(("2", "4", "5")), (method, path, status)
                assert response.get("content"), (method, path, status)


def test_unknown_document_path_is_json_404(own_server: ServerProcess) -> None:
    with own_server.http_client(timeout=10) as client:
        response = client.get("/openapi/nothing-here")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/json")
    assert "openapi.json" in response.json()["error"]
