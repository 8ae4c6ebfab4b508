"""The REST surface against the official V2 OpenAPI document, property-based (schemathesis).

``../shared/specs/rest_predict_v2.yaml`` is KServe's ``docs/predict-api/v2`` document (a copy is
kept in ``tests/specs/`` so a clone without ``shared/`` still runs this). Schemathesis generates
requests from it, valid and invalid, sends them to the session's real ``servekit serve``
subprocess and checks every answer: no 5xx, bodies valid against the document's response
schemas, documented content types, invalid requests refused with a 4xx, a 405 that names the
allowed methods.

How the document is mapped onto a running server (it cannot be run as it stands):

- Its path templates spell parameters shell-style, ``/v2/models/${MODEL_NAME}/...``; they are
  read as the OpenAPI templates ``{MODEL_NAME}`` they stand for.
- ``MODEL_NAME`` and ``MODEL_VERSION`` are free strings there, and random names would only
  ever reach 404s: they are given the served models' names and versions (an ``enum``), so
  metadata, readiness and inference are really exercised; negative generation still sends
  names outside the enum.
- ``status_code_conformance`` is off: the document lists only 200 (and 400 for two
  operations), while the protocol's text (and KServe, and Triton) answer 404 for an unknown
  model and 503 for one not ready. ``positive_data_acceptance`` is off: a body valid against
  the generic ``inference_request`` schema is still refused (400) when its tensors do not
  match the model's signature, as the protocol requires.
- Schema-valid random bodies almost never match a model, so :func:`test_real_inference`
  sends hypothesis-generated tensors that do, through the same operation and checks, and
  compares the results.

Where the document disagrees with Triton's clients, Triton's clients win: non-finite floats.
The document's ``tensor_data`` allows numbers, strings and booleans; Triton reads and writes
the bare (non-JSON) tokens ``NaN``/``Infinity`` and tritonclient.http sends them. We accept
those tokens, and answer non-finite values as the strings ``"NaN"``/``"Infinity"``/
``"-Infinity"``, which are valid against the document and which tritonclient's and KServe's
``as_numpy`` turn back into the right floats.
"""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import jsonschema  # type: ignore[import-untyped]
import numpy as np
import pytest
import schemathesis
import tritonclient.http as httpclient
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import checks
from servers import DATATYPES, ServerProcess, identity_name

pytestmark = pytest.mark.slow

SPEC_COPY = Path(__file__).parent / "specs" / "rest_predict_v2.yaml"
SPEC_SHARED = Path(__file__).resolve().parents[2] / "shared" / "specs" / "rest_predict_v2.yaml"

MODELS: dict[str, list[str]] = {
    **{identity_name(datatype): ["1"] for datatype in DATATYPES},
    "add_sub": ["1"],
    "mlp": ["1", "2"],
}
"""The session server's ready models (tests/servers.py) and their versions."""

INFER = "/v2/models/{MODEL_NAME}/versions/{MODEL_VERSION}/infer"
CHECKS = [
    checks.not_a_server_error,
    checks.response_schema_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.negative_data_rejection,
    checks.unsupported_method,
]
REQUEST_TIMEOUT = 10.0


def mapped_spec(document: dict[str, Any]) -> dict[str, Any]:
    """The document with ``${X}`` path templates read as ``{X}`` and names of served models."""
    versions = sorted({v for vs in MODELS.values() for v in vs} | {"3"})
    paths: dict[str, Any] = {}
    for path, item in document["paths"].items():
        for parameter in item.get("parameters", []):
            if parameter["name"] == "MODEL_NAME":
                parameter["schema"] = {"type": "string", "enum": sorted(MODELS)}
            elif parameter["name"] == "MODEL_VERSION":
                parameter["schema"] = {"type": "string", "enum": versions}
        paths[path.replace("${", "{")] = item
    return {**document, "paths": paths}


def _load() -> dict[str, Any]:
    text = SPEC_COPY.read_text()
    if SPEC_SHARED.exists():  # CI has shared/ beside the clone: the copy must not drift
        assert SPEC_SHARED.read_text() == text, f"{SPEC_COPY} differs from {SPEC_SHARED}"
    document: dict[str, Any] = yaml.safe_load(text)
    return mapped_spec(document)


schema = schemathesis.openapi.from_dict(_load(), config=schemathesis.Config())


@schema.parametrize()
@settings(
    max_examples=50,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)
def test_spec(case: schemathesis.Case[Any], server: ServerProcess) -> None:
    """Every generated request: no 5xx, no schema violation, bad input refused with 4xx."""
    case.call_and_validate(base_url=server.http_url, checks=CHECKS, timeout=REQUEST_TIMEOUT)
    assert server.alive(), server.log()


# --- real inference through the document's operation -------------------------------------------

_INT_RANGES = {dt: np.iinfo(dt.lower()) for dt in DATATYPES if dt.startswith(("INT", "UINT"))}
_FLOAT_WIDTH: dict[str, Literal[16, 32, 64]] = {"FP16": 16, "FP32": 32, "FP64": 64}
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _elements(datatype: str) -> st.SearchStrategy[Any]:
    """JSON values of one element of ``datatype`` (non-finite floats as the strings we answer)."""
    if datatype == "BOOL":
        return st.booleans()
    if datatype == "BYTES":
        return st.text(max_size=12)
    if datatype in _INT_RANGES:
        info = _INT_RANGES[datatype]
        return st.integers(int(info.min), int(info.max))
    finite = st.floats(width=_FLOAT_WIDTH[datatype], allow_nan=False, allow_infinity=False)
    return finite | st.sampled_from(sorted(_NON_FINITE))


def _as_array(data: list[Any], datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array(data, dtype=object)
    values = [_NON_FINITE.get(x, x) if isinstance(x, str) else x for x in data]
    return np.array(values, dtype=np.dtype(datatype.lower().replace("fp", "float")))


def _infer(server: ServerProcess, model: str, version: str, body: dict[str, Any]) -> Any:
    """One inference through the document's operation, validated by the same checks."""
    operation = schema[INFER]["POST"]
    case = operation.Case(
        path_parameters={"MODEL_NAME": model, "MODEL_VERSION": version}, body=body
    )
    response = case.call_and_validate(
        base_url=server.http_url, checks=CHECKS, timeout=REQUEST_TIMEOUT
    )
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("datatype", DATATYPES)
@settings(max_examples=8, deadline=None, database=None)
@given(data=st.data())
def test_real_inference(server: ServerProcess, datatype: str, data: st.DataObject) -> None:
    """Identity models of every datatype answer exactly what they were sent."""
    rows = data.draw(st.integers(0, 3), label="rows")
    cols = data.draw(st.integers(1, 4), label="cols")
    values = data.draw(st.lists(_elements(datatype), min_size=rows * cols, max_size=rows * cols))
    tensor = {"name": "INPUT0", "shape": [rows, cols], "datatype": datatype, "data": values}
    body = {"id": "conformance", "inputs": [tensor], "outputs": [{"name": "OUTPUT0"}]}
    answer = _infer(server, identity_name(datatype), "1", body)
    assert answer["model_name"] == identity_name(datatype)
    assert answer["id"] == "conformance"
    (output,) = answer["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == (
        "OUTPUT0",
        datatype,
        [rows, cols],
    )
    np.testing.assert_array_equal(_as_array(output["data"], datatype), _as_array(values, datatype))


@settings(max_examples=10, deadline=None, database=None)
@given(
    rows=st.integers(1, 3),
    data=st.data(),
)
def test_real_inference_add_sub(server: ServerProcess, rows: int, data: st.DataObject) -> None:
    """Two inputs, two outputs, nested ``data`` (allowed by the document): sums and differences."""
    element = st.floats(-1e6, 1e6, width=32)
    a, b = (
        np.array(data.draw(st.lists(element, min_size=rows * 16, max_size=rows * 16)), np.float32)
        for _ in range(2)
    )
    inputs = [
        {
            "name": name,
            "shape": [rows, 16],
            "datatype": "FP32",
            "data": x.reshape(rows, 16).tolist(),
        }
        for name, x in (("INPUT0", a), ("INPUT1", b))
    ]
    answer = _infer(server, "add_sub", "1", {"inputs": inputs})
    outputs = {o["name"]: np.array(o["data"], np.float32) for o in answer["outputs"]}
    np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)


@pytest.mark.parametrize("version", MODELS["mlp"])
def test_real_inference_mlp_versions(server: ServerProcess, version: str) -> None:
    """Both versions of the perceptron answer through the versioned path, each its own way."""
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
    body = {
        "inputs": [
            {"name": "input", "shape": [2, 16], "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }
    answer = _infer(server, "mlp", version, body)
    assert answer["model_version"] == version
    (output,) = answer["outputs"]
    assert output["shape"] == [2, 4] and len(output["data"]) == 8
    other = _infer(server, "mlp", "2" if version == "1" else "1", body)
    assert other["outputs"][0]["data"] != output["data"]


# --- non-finite floats: where Triton's clients and the document disagree -----------------------


def _response_schema() -> dict[str, Any]:
    document = yaml.safe_load(SPEC_COPY.read_text())
    return {"$ref": "#/components/schemas/inference_response", **document}


@pytest.mark.parametrize("datatype", sorted(_FLOAT_WIDTH))
def test_tritonclient_non_finite_json(server: ServerProcess, datatype: str) -> None:
    """tritonclient.http sends NaN/Infinity as bare tokens (as Triton accepts); the answer is
    valid against the document and decodes to the same floats in tritonclient."""
    x = np.array(
        [[1.5, np.nan, np.inf, -np.inf, -0.0, 65504.0]], dtype=_as_array([], datatype).dtype
    )
    client = httpclient.InferenceServerClient(server.http_host_port)
    try:
        tensor = httpclient.InferInput("INPUT0", list(x.shape), datatype)
        tensor.set_data_from_numpy(x, binary_data=False)
        wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)
        result = client.infer(identity_name(datatype), [tensor], outputs=[wanted])
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    response = result.get_response()
    jsonschema.validate(response, _response_schema())
    assert response["outputs"][0]["data"][1:4] == ["NaN", "Infinity", "-Infinity"]


def test_overflow_is_refused_not_made_infinite(server: ServerProcess) -> None:
    """A finite JSON number beyond FP32's range is a clear 400 naming the input, not a silent
    inf (infinities travel as the strings "Infinity"/"-Infinity", tested above)."""
    tensor = {"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1e300, -1e300]}
    operation = schema[INFER]["POST"]
    case = operation.Case(
        path_parameters={"MODEL_NAME": identity_name("FP32"), "MODEL_VERSION": "1"},
        body={"inputs": [tensor]},
    )
    response = case.call(base_url=server.http_url, timeout=REQUEST_TIMEOUT)
    assert response.status_code == 400, response.text
    assert "INPUT0" in response.json()["error"]
    assert "out of range for FP32" in response.json()["error"]
