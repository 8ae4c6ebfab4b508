"""Inference over every transport and tensor encoding: exact round trips, versions, outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from servers import DATATYPES, ServerProcess, identity_name

from .adapter import Client
from .tensors import TEXTS, assert_same, sample

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("datatype", DATATYPES)
def test_identity_round_trip_is_exact(encoded_client: Client, datatype: str) -> None:
    """What goes in comes out bit for bit, extremes included (NaN/inf where the wire allows)."""
    data = sample(datatype, (3, 5), json_safe=encoded_client.encoding == "json")
    result = encoded_client.infer(identity_name(datatype), {"INPUT0": data})
    assert list(result.outputs) == ["OUTPUT0"]
    assert_same(result.outputs["OUTPUT0"], data)
    assert result.model_name == identity_name(datatype)
    assert result.model_version == "1"


def test_bytes_text_round_trip(encoded_client: Client) -> None:
    data = np.array([t.encode() for t in TEXTS], dtype=object).reshape(1, -1)
    result = encoded_client.infer(identity_name("BYTES"), {"INPUT0": data})
    assert_same(result.outputs["OUTPUT0"], data)


def test_non_utf8_bytes_into_an_onnx_string_input_is_refused(
    client: Client, server: ServerProcess
) -> None:
    """ONNX string tensors hold text, so bytes that are not UTF-8 get a clear 400, not garbage."""
    data = np.array([[b"ok", b"\xff\xfe\x00bad"]], dtype=object)
    message = client.expect_error(
        "INVALID_ARGUMENT", client.infer, identity_name("BYTES"), {"INPUT0": data}
    )
    assert "UTF-8" in message
    server.assert_healthy()


@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (0, 0)])
@pytest.mark.parametrize("datatype", ["FP32", "FP16", "INT64", "BOOL", "BYTES"])
def test_empty_tensors(encoded_client: Client, datatype: str, shape: tuple[int, int]) -> None:
    data = sample(datatype, shape)
    result = encoded_client.infer(identity_name(datatype), {"INPUT0": data})
    assert_same(result.outputs["OUTPUT0"], data)


def _expected_mlp(store: Path, version: int, rows: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(store.parent / "mlp" / str(version) / "model.onnx"))
    return np.asarray(session.run(None, {"input": rows})[0])


def test_versions(encoded_client: Client, model_store: Path) -> None:
    """Explicit versions answer with their own weights; no version means the highest."""
    rows = sample("FP32", (5, 16), seed=7) / 1e30  # keep the edge values finite through the MLP
    rows = np.nan_to_num(rows).astype(np.float32)
    answers = {v: encoded_client.infer("mlp", {"input": rows}, version=v) for v in ("1", "2", "")}
    assert answers["1"].model_version == "1"
    assert answers["2"].model_version == "2"
    assert answers[""].model_version == "2"
    for version in (1, 2):
        got = answers[str(version)].outputs["output"]
        np.testing.assert_allclose(
            got, _expected_mlp(model_store, version, rows), rtol=1e-5, atol=1e-6
        )
    assert not np.allclose(answers["1"].outputs["output"], answers["2"].outputs["output"])
    assert_same(answers[""].outputs["output"], answers["2"].outputs["output"])


def _add_sub_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "INPUT0": rng.standard_normal((2, 16)).astype(np.float32),
        "INPUT1": rng.standard_normal((2, 16)).astype(np.float32),
    }


@pytest.mark.parametrize(
    "wanted", [None, ["OUTPUT0", "OUTPUT1"], ["OUTPUT1", "OUTPUT0"], ["OUTPUT1"], ["OUTPUT0"]]
)
def test_requested_outputs_subset_and_order(
    encoded_client: Client, wanted: list[str] | None
) -> None:
    inputs = _add_sub_inputs()
    result = encoded_client.infer("add_sub", inputs, outputs=wanted)
    assert list(result.outputs) == (wanted or ["OUTPUT0", "OUTPUT1"])
    expected = {
        "OUTPUT0": inputs["INPUT0"] + inputs["INPUT1"],
        "OUTPUT1": inputs["INPUT0"] - inputs["INPUT1"],
    }
    for name, array in result.outputs.items():
        assert_same(array, expected[name])


def test_inputs_in_any_order(client: Client) -> None:
    inputs = _add_sub_inputs()
    reordered = {"INPUT1": inputs["INPUT1"], "INPUT0": inputs["INPUT0"]}
    result = client.infer("add_sub", reordered, outputs=["OUTPUT1"])
    assert_same(result.outputs["OUTPUT1"], inputs["INPUT0"] - inputs["INPUT1"])


@pytest.mark.parametrize("request_id", ["", "req-42", "ünïcode id 🙂"])
def test_request_id_is_echoed(client: Client, request_id: str) -> None:
    data = sample("INT32", (1, 3))
    result = client.infer(identity_name("INT32"), {"INPUT0": data}, request_id=request_id)
    assert result.id == request_id
