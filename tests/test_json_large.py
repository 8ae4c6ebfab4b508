"""The large-body V2 JSON decoder (app/servekit/codecs/v2_json_large.py) agrees with the usual one.

Same arrays for every numeric datatype (flat and nested data, extremes of each integer type,
non-finite tokens), same refusals (kinds, ranges, counts), and the generic fallback for what
numpy's reader does not take; CHUNK_BYTES is lowered so chunk boundaries are crossed.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from servekit.codecs import v2_json, v2_json_large
from servekit.errors import InvalidArgument, ResourceExhausted

LIMIT = 1 << 20


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(v2_json_large, "CHUNK_BYTES", 7)


def _body(datatype: str, shape: list[int], data: Any, **extra: Any) -> bytes:
    tensor = {"name": "x", "datatype": datatype, "shape": shape, "data": data}
    return json.dumps({"id": "r", "inputs": [tensor], **extra}).encode()


def _both(body: bytes) -> tuple[Any, Any]:
    def run(decode: Any) -> Any:
        try:
            return decode()
        except InvalidArgument as exc:
            return ("error", exc.message)

    usual = run(lambda: v2_json.decode_request(v2_json.loads(body), "m", None))
    large = run(lambda: v2_json_large.decode_request(body, "m", None, LIMIT))
    return usual, large


INTS = {
    "INT8": [-128, 0, 127],
    "INT16": [-32768, 5, 32767],
    "INT32": [-(2**31), 7, 2**31 - 1],
    "INT64": [-(2**63), 9, 2**63 - 1],
    "UINT8": [0, 1, 255],
    "UINT16": [0, 2, 65535],
    "UINT32": [0, 3, 2**32 - 1],
    "UINT64": [0, 4, 2**64 - 1],
}


@pytest.mark.parametrize("datatype", sorted(INTS))
def test_integers_exact_at_the_extremes(datatype: str) -> None:
    usual, large = _both(_body(datatype, [3], INTS[datatype]))
    np.testing.assert_array_equal(large.inputs[0].data, usual.inputs[0].data)
    assert large.inputs[0].data.dtype == usual.inputs[0].data.dtype


@pytest.mark.parametrize("datatype", sorted(INTS))
def test_integers_out_of_range_are_refused_alike(datatype: str) -> None:
    low, _, high = INTS[datatype]
    for value in (low - 1, high + 1):
        usual, large = _both(_body(datatype, [1], [value]))
        assert usual[0] == large[0] == "error", (usual, large)
        assert "out of range" in large[1]


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_floats_nested_and_flat(datatype: str) -> None:
    values = np.linspace(-3, 3, 24).round(3).tolist()
    for data in (values, np.array(values).reshape(2, 3, 4).tolist()):
        usual, large = _both(_body(datatype, [2, 3, 4], data))
        np.testing.assert_array_equal(large.inputs[0].data, usual.inputs[0].data)
        assert large.inputs[0].data.shape == (2, 3, 4)


def test_bare_non_finite_tokens_and_overflow() -> None:
    body = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[3],"data":[NaN,Infinity,1]}]}'
    decoded = v2_json_large.decode_request(body, "m", None, LIMIT)
    assert np.isnan(decoded.inputs[0].data[0]) and np.isinf(decoded.inputs[0].data[1])
    usual, large = _both(_body("FP32", [1], [1e300]))
    assert usual[0] == large[0] == "error" and "out of range for FP32" in large[1]


@pytest.mark.parametrize(
    ("datatype", "data"),
    [("INT32", [1.5, 2]), ("FP32", [True, 1.0]), ("INT8", [1, 2]), ("FP32", [1.0, 2.0, 3.0])],
)
def test_refusals_agree(datatype: str, data: list[Any]) -> None:
    usual, large = _both(_body(datatype, [2], data))
    assert isinstance(usual, tuple) == isinstance(large, tuple), (usual, large)


def test_strings_bools_and_parameters_take_the_generic_path() -> None:
    for datatype, data in (("BYTES", ["a", "b"]), ("BOOL", [True, False]), ("FP32", ["NaN", 1])):
        usual, large = _both(_body(datatype, [2], data, parameters={"data": [1, 2]}))
        np.testing.assert_array_equal(large.inputs[0].data, usual.inputs[0].data)
        assert large.parameters == {"data": [1, 2]}


def test_a_large_generic_rest_is_413() -> None:
    body = _body("BYTES", [1], ["a" * 2000])
    with pytest.raises(ResourceExhausted, match="binary tensor data extension"):
        v2_json_large.decode_request(body, "m", None, 1000)
