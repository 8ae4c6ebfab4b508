"""Round-trip properties and refusals of the wire codecs, checked against tritonclient's own code.

Every V2 datatype goes through the raw layout, the JSON codec (flat and nested ``data``) and the
binary extension in both directions. Requests are built by ``tritonclient.http`` exactly as it
sends them, and responses are parsed back by ``tritonclient.http.InferResult``: if our bytes and
theirs ever disagree, these tests say so before a user does.
"""

from __future__ import annotations

import json
import math
import tracemalloc
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.http._utils import _get_inference_request
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from servekit.codecs import raw, v2_binary, v2_json
from servekit.datatypes import DATATYPES, DataType, lookup
from servekit.errors import InvalidArgument
from servekit.types import InferRequest, InferResponse, RequestedOutput, Tensor, TensorSpec

ALL = sorted(DATATYPES)
FAST = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


def _object_array(items: list[bytes], shape: tuple[int, ...]) -> np.ndarray:  # type: ignore[type-arg]
    out = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        out[i] = item
    return out.reshape(shape)


def tensors(dt: DataType, *, json_safe: bool) -> st.SearchStrategy[np.ndarray]:  # type: ignore[type-arg]
    """Arrays of ``dt`` of any small shape (scalars and 0-size included); ``json_safe`` leaves
    out what JSON cannot carry (NaN, infinities, non-UTF-8 bytes)."""
    if dt.is_bytes:
        element = (
            st.text(st.characters(codec="utf-8"), max_size=6).map(str.encode)
            if json_safe
            else st.binary(max_size=6)
        )
        return SHAPES.flatmap(
            lambda shape: st.lists(
                element, min_size=math.prod(shape), max_size=math.prod(shape)
            ).map(lambda items: _object_array(items, shape))
        )
    if dt.dtype.kind == "f":
        elements = hnp.from_dtype(dt.dtype, allow_nan=not json_safe, allow_infinity=not json_safe)
        return hnp.arrays(dt.dtype, SHAPES, elements=elements)
    return hnp.arrays(dt.dtype, SHAPES)


def assert_same(got: np.ndarray, want: np.ndarray, dt: DataType) -> None:  # type: ignore[type-arg]
    """Same shape and the same bytes (so NaN payloads and -0.0 count too)."""
    assert got.shape == want.shape
    if dt.is_bytes:
        as_bytes = [x.encode() if isinstance(x, str) else bytes(x) for x in got.flat]
        assert as_bytes == list(want.flat)
    else:
        assert got.dtype == dt.dtype
        assert got.tobytes() == want.tobytes()


def triton_body(inputs: list[httpclient.InferInput]) -> tuple[bytes, int | None]:
    """The request body tritonclient.http sends for ``inputs`` (binary_data_output set)."""
    body, json_size = _get_inference_request(inputs, "", None, 0, False, False, 0, None, None)
    return body, json_size


def triton_input(name: str, array: np.ndarray, dt: DataType, binary: bool) -> httpclient.InferInput:  # type: ignore[type-arg]
    tensor = httpclient.InferInput(name, list(array.shape), dt.name)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def response_of(name: str, array: np.ndarray, dt: DataType) -> InferResponse:  # type: ignore[type-arg]
    return InferResponse("m", "1", [Tensor(name, dt.name, array.shape, array)], id="r1")


# --- (a) raw layout ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
@FAST
@given(data=st.data())
def test_raw_round_trip(name: str, data: st.DataObject) -> None:
    dt = lookup(name)
    array = data.draw(tensors(dt, json_safe=False))
    buffer = raw.tensor_to_buffer(dt, array)
    if dt.is_bytes:  # the same bytes tritonclient serializes, and it reads ours back
        theirs = serialize_byte_tensor(array)
        assert bytes(buffer) == (theirs.item() if theirs.size else b"")
        if array.size:
            assert list(deserialize_bytes_tensor(bytes(buffer))) == list(array.flat)
    else:
        assert bytes(buffer) == array.astype(dt.dtype).tobytes()
    back = raw.tensor_from_bytes("x", dt, array.shape, bytes(buffer))
    assert_same(back, array, dt)


def test_raw_decoding_is_a_view_at_any_offset() -> None:
    body = b"\xff" + np.arange(4, dtype="<f4").tobytes() + b"\xee"
    array = raw.tensor_from_bytes("x", lookup("FP32"), (2, 2), body, offset=1, size=16)
    assert array.base is not None  # no copy of the request bytes
    assert array.tolist() == [[0.0, 1.0], [2.0, 3.0]]


def test_fp16_extremes_survive_binary_and_json() -> None:
    dt = lookup("FP16")
    finite = np.array([65504.0, -65504.0, 6e-08, -6e-08, 6.104e-05, -0.0, 0.0, 1.0], "<f2")
    special = np.array([np.inf, -np.inf, np.nan], "<f2")
    both = np.concatenate([finite, special])
    assert_same(
        raw.tensor_from_bytes("x", dt, both.shape, bytes(raw.tensor_to_buffer(dt, both))), both, dt
    )
    request = InferRequest("m", [], parameters={})
    body, header = v2_binary.encode_response(request, response_of("y", finite, dt))
    assert header is None
    assert_same(httpclient.InferResult.from_response_body(body).as_numpy("y"), finite, dt)


# --- (b) V2 JSON ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
@FAST
@given(data=st.data(), nested=st.booleans())
def test_json_request_round_trip(name: str, data: st.DataObject, nested: bool) -> None:
    dt = lookup(name)
    array = data.draw(tensors(dt, json_safe=True))
    if nested:  # a hand-written client: nested lists (a bare value for a scalar)
        values = array.tolist()
        if dt.is_bytes:
            values = np.vectorize(lambda b: b.decode(), otypes=[object])(array).tolist()
        obj: Any = {
            "inputs": [{"name": "x", "datatype": name, "shape": list(array.shape), "data": values}]
        }
        body = orjson.dumps(obj)
    else:  # tritonclient: flat data inside the JSON
        body, json_size = triton_body([triton_input("x", array, dt, binary=False)])
        assert json_size is None
    request = v2_json.decode_request(v2_json.loads(body), "m", None)
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", name, array.shape)
    assert_same(tensor.data, array, dt)


@pytest.mark.parametrize("name", ALL)
@FAST
@given(data=st.data())
def test_json_response_round_trip(name: str, data: st.DataObject) -> None:
    dt = lookup(name)
    array = data.draw(tensors(dt, json_safe=True))
    request = InferRequest("m", [], outputs=[RequestedOutput("y", {"binary_data": False})])
    body, header = v2_binary.encode_response(request, response_of("y", array, dt))
    assert header is None
    parsed = orjson.loads(body)
    assert parsed["model_name"] == "m" and parsed["id"] == "r1"
    assert parsed["outputs"][0]["shape"] == list(array.shape)
    assert_same(httpclient.InferResult.from_response_body(body).as_numpy("y"), array, dt)


# --- (c) binary tensor data extension ----------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
@FAST
@given(data=st.data())
def test_binary_request_round_trip(name: str, data: st.DataObject) -> None:
    dt = lookup(name)
    first = data.draw(tensors(dt, json_safe=False))
    second = data.draw(tensors(lookup("INT32"), json_safe=True))
    third = data.draw(tensors(dt, json_safe=False))
    inputs = [
        triton_input("a", first, dt, binary=True),
        triton_input("b", second, lookup("INT32"), binary=False),  # JSON between binary inputs
        triton_input("c", third, dt, binary=True),
    ]
    body, json_size = triton_body(inputs)
    assert json_size is not None
    request = v2_binary.decode_request(body, json_size, "m", "2")
    assert [t.name for t in request.inputs] == ["a", "b", "c"]
    assert request.model_version == "2" and request.parameters == {"binary_data_output": True}
    assert_same(request.inputs[0].data, first, dt)
    assert_same(request.inputs[1].data, second, lookup("INT32"))
    assert_same(request.inputs[2].data, third, dt)


@pytest.mark.parametrize("name", ALL)
@FAST
@given(data=st.data(), per_output=st.booleans())
def test_binary_response_round_trip(name: str, data: st.DataObject, per_output: bool) -> None:
    dt = lookup(name)
    array = data.draw(tensors(dt, json_safe=False))
    json_part = np.arange(3, dtype="<i8")
    if per_output:
        request = InferRequest(
            "m",
            [],
            outputs=[RequestedOutput("y", {"binary_data": True}), RequestedOutput("z", {})],
        )
    else:
        request = InferRequest(
            "m",
            [],
            outputs=[RequestedOutput("z", {"binary_data": False})],
            parameters={"binary_data_output": True},
        )
    response = InferResponse(
        "m", "1", [Tensor("y", name, array.shape, array), Tensor("z", "INT64", (3,), json_part)]
    )
    body, header = v2_binary.encode_response(request, response)
    assert header is not None
    head = orjson.loads(body[:header])
    assert "data" not in head["outputs"][0]
    assert head["outputs"][0]["parameters"]["binary_data_size"] == len(body) - header
    assert head["outputs"][1]["data"] == [0, 1, 2]
    result = httpclient.InferResult.from_response_body(body, header_length=header)
    assert_same(result.as_numpy("y"), array, dt)
    assert result.as_numpy("z").tolist() == [0, 1, 2]


def test_non_utf8_bytes_go_through_binary_only() -> None:
    array = _object_array([b"\xff\xfe", b"ok", b""], (3,))
    binary = InferRequest("m", [], parameters={"binary_data_output": True})
    body, header = v2_binary.encode_response(binary, response_of("y", array, lookup("BYTES")))
    result = httpclient.InferResult.from_response_body(body, header_length=header)
    assert list(result.as_numpy("y")) == [b"\xff\xfe", b"ok", b""]
    with pytest.raises(InvalidArgument, match=r"not UTF-8.*binary_data"):
        v2_binary.encode_response(InferRequest("m", []), response_of("y", array, lookup("BYTES")))


# --- raw binary request (Inference-Header-Content-Length: 0) -----------------------------------


@FAST
@given(
    rows=st.integers(0, 5),
    cols=st.integers(1, 4),
    name=st.sampled_from([n for n in ALL if n != "BYTES"]),
)
def test_raw_request_infers_the_dynamic_dim(rows: int, cols: int, name: str) -> None:
    dt = lookup(name)
    array = np.ones((rows, cols), dtype=dt.dtype)
    spec = TensorSpec("in", dt.name, (-1, cols))
    request = v2_binary.decode_raw_request(array.tobytes(), "m", None, (spec,))
    (tensor,) = request.inputs
    assert tensor.shape == (rows, cols) and tensor.datatype == dt.name
    assert tensor.data.tobytes() == array.tobytes()
    assert request.parameters == {"binary_data_output": True}


def test_raw_request_fixed_shape_and_bytes() -> None:
    fixed = TensorSpec("in", "INT16", (2, 3))
    body = np.arange(6, dtype="<i2").tobytes()
    assert v2_binary.decode_raw_request(body, "m", "1", (fixed,)).inputs[0].shape == (2, 3)
    with pytest.raises(InvalidArgument, match="needs 12 bytes, got 10"):
        v2_binary.decode_raw_request(body[:10], "m", "1", (fixed,))
    text = TensorSpec("in", "BYTES", (1,))
    (tensor,) = v2_binary.decode_raw_request(b"\xffraw", "m", None, (text,)).inputs
    assert tensor.shape == (1,) and tensor.data[0] == b"\xffraw"
    with pytest.raises(InvalidArgument, match=r"only shape \[1\] qualifies"):
        v2_binary.decode_raw_request(b"abc", "m", None, (TensorSpec("in", "BYTES", (2, 3)),))


def test_raw_request_refusals() -> None:
    two_dynamic = TensorSpec("in", "FP32", (-1, -1))
    with pytest.raises(InvalidArgument, match="more than one dynamic dimension"):
        v2_binary.decode_raw_request(b"\0" * 16, "m", None, (two_dynamic,))
    spec = TensorSpec("in", "FP32", (-1, 4))
    with pytest.raises(InvalidArgument, match="does not fit input 'in'"):
        v2_binary.decode_raw_request(b"\0" * 20, "m", None, (spec,))
    with pytest.raises(InvalidArgument, match="needs a model with one input; 'm' has 2"):
        v2_binary.decode_raw_request(b"\0" * 16, "m", None, (spec, spec))


# --- refusals ------------------------------------------------------------------------------


def _json_input(datatype: str, shape: Any, data: Any) -> bytes:
    return orjson.dumps(
        {"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": data}]}
    )


def _decode_json(body: bytes) -> InferRequest:
    return v2_json.decode_request(v2_json.loads(body), "m", None)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_json_input("FP32", [-1, 4], [1.0] * 4), r"shape \[-1, 4\] must hold non-negative"),
        (_json_input("FP32", [2, 2], [1.0, 2.0, 3.0]), "needs 4 elements, got 3"),
        (_json_input("INT32", [2], [1, 1.5]), "holds floats, not valid for INT32"),
        (_json_input("FP32", [2], [1.0, "a"]), "not valid for FP32"),
        (_json_input("BOOL", [1], [1]), "holds integers, not valid for BOOL"),
        (_json_input("BOOL", [2], [True, 1]), r"not valid for BOOL \(JSON true/false only\)"),
        (_json_input("BOOL", [2], [False, 0.0]), "holds floats, not valid for BOOL"),
        (_json_input("INT32", [2], [True, 1]), r"input 'x': booleans \(JSON true/false\) are "),
        (_json_input("FP32", [2], [1.5, False]), "booleans .* not valid for FP32"),
        (_json_input("FP32", [3], [1.5, "NaN", True]), "booleans .* not valid for FP32"),
        (_json_input("UINT64", [2], [True, 2**64 - 1]), "booleans .* not valid for UINT64"),
        (_json_input("FP16", [2], [1.0, 1e6]), r"input 'x': value out of range for FP16"),
        (_json_input("FP16", [1], [70000]), r"value out of range for FP16 \[-65504, 65504\]"),
        (_json_input("FP32", [2, 1], [[1e39], [1.0]]), "input 'x': value out of range for FP32"),
        (_json_input("FP32", [1], [-1e39]), "value out of range for FP32"),
        (_json_input("UINT8", [2], [1, 256]), r"out of range for UINT8 \[0, 255\]"),
        (_json_input("INT8", [1], [-129]), "out of range for INT8"),
        (_json_input("FP32", [2, 2], [[1.0, 2.0], [3.0]]), "ragged"),
        (_json_input("BYTES", [2], ["a", 1]), "BYTES data must be strings"),
        (_json_input("BYTES", [2, 2], [["a", "b", "c"], ["d"]]), "'data' is ragged"),
        (_json_input("BYTES", [3], [["a", "b"], "c"]), "'data' is ragged"),
        (_json_input("FP128", [1], [1.0]), "unknown datatype 'FP128'; expected one of BOOL"),
        (_json_input("FP32", "12", [1.0]), "must hold non-negative integers"),
        (_json_input("FP32", [1.5], [1.0]), "must hold non-negative integers"),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]',
            "malformed JSON",
        ),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"inputs": {}}', "needs an 'inputs' list"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "data": [1]}]}', "missing 'shape'"),
        (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1]}]}', "missing 'data'"),
        (
            b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], '
            b'"parameters": {"binary_data_size": 4}}]}',
            "no binary data",
        ),
    ],
)
def test_json_refusals(body: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        _decode_json(body)


def test_absurd_shape_is_refused_without_allocating() -> None:
    """``[2**40, 16]`` with 16 values would need 64 TiB: refuse it from the count alone."""
    shape = [2**40, 16]
    header = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": shape,
                "parameters": {"binary_data_size": 64},
            }
        ]
    }
    head = orjson.dumps(header)
    strings = {
        "inputs": [
            {
                "name": "x",
                "datatype": "BYTES",
                "shape": shape,
                "parameters": {"binary_data_size": 80},
            }
        ]
    }
    shead = orjson.dumps(strings)
    cases = [
        (
            lambda: _decode_json(_json_input("FP32", shape, [1.0] * 16)),
            "needs 17592186044416 elements",
        ),
        (
            lambda: _decode_json(_json_input("BYTES", shape, ["a"] * 16)),
            "needs 17592186044416 elements",
        ),
        (
            lambda: v2_binary.decode_request(head + b"\0" * 64, len(head), "m", None),
            "needs 70368744177664 bytes",
        ),
        (
            lambda: v2_binary.decode_request(shead + b"\1\0\0\0a" * 16, len(shead), "m", None),
            "BYTES elements but only 80 bytes",
        ),
    ]
    for call, message in cases:
        tracemalloc.start()
        try:
            with pytest.raises(InvalidArgument, match=message):
                call()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1_000_000


def _binary_body(entries: list[tuple[str, list[int], int]], payload: bytes) -> tuple[bytes, int]:
    head = orjson.dumps(
        {
            "inputs": [
                {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": z}}
                for n, (d, s, z) in zip("abc", entries, strict=False)
            ]
        }
    )
    return head + payload, len(head)


@pytest.mark.parametrize(
    ("entries", "payload", "message"),
    [
        ([("FP32", [2], 8)], b"\0" * 4, "binary_data_size 8 runs past the end of the body"),
        (
            [("FP32", [1], 4)],
            b"\0" * 6,
            "2 bytes of binary data follow the inputs but no input claims them",
        ),
        ([("FP32", [2], 4)], b"\0" * 4, r"shape \[2\] of FP32 needs 8 bytes, got 4"),
        ([("BYTES", [1], 6)], b"\x09\0\0\0ab", "declares 9 bytes, only 2 remain"),
        (
            [("BYTES", [2], 9)],
            b"\1\0\0\0a\1\0\0\0",
            "BYTES element 1 declares 1 bytes, only 0 remain",
        ),
        ([("BYTES", [1], 8)], b"\1\0\0\0abcd"[:8], "3 bytes left over after 1 BYTES elements"),
        ([("BYTES", [3], 13)], b"\1\0\0\0a\1\0\0\0b\0\0\0", "element 2 is missing its length"),
        ([("BYTES", [2], 6)], b"\2\0\0\0ab", "needs 2 BYTES elements but only 6 bytes"),
        ([("INT8", [1], -1)], b"\0", "binary_data_size must be a non-negative int"),
    ],
)
def test_binary_refusals(
    entries: list[tuple[str, list[int], int]], payload: bytes, message: str
) -> None:
    body, header = _binary_body(entries, payload)
    with pytest.raises(InvalidArgument, match=message):
        v2_binary.decode_request(body, header, "m", None)


def test_header_length_refusals() -> None:
    assert v2_binary.parse_header_length(None, 10) is None
    assert v2_binary.parse_header_length("4", 10) == 4
    with pytest.raises(InvalidArgument, match="must be an integer, got 'x'"):
        v2_binary.parse_header_length("x", 10)
    with pytest.raises(InvalidArgument, match="outside the body of 10 bytes"):
        v2_binary.parse_header_length("11", 10)
    with pytest.raises(InvalidArgument, match="malformed JSON"):
        v2_binary.decode_request(b'{"inputs": [' + b"\0" * 4, 12, "m", None)


@example(value=True)
@FAST
@given(value=st.one_of(st.booleans(), st.floats(allow_nan=False), st.text(max_size=3)))
def test_wrong_kind_for_every_integer_type(value: object) -> None:
    """Nothing but JSON integers is an integer: bools, floats and strings are refused."""
    for name in ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"):
        with pytest.raises(InvalidArgument, match=f"not valid for {name}"):
            _decode_json(_json_input(name, [1], [value]))


NUMERIC = [n for n in ALL if n not in ("BOOL", "BYTES")]


@pytest.mark.parametrize("name", NUMERIC)
@FAST
@given(
    data=st.data(),
    size=st.sampled_from([1, 4, 64, 300, 2048]),  # below and above the list-scan threshold
    zeros=st.sampled_from([0.0, 0.01, 0.5, 1.0]),  # share of 0/1 values beside the boolean
    nested=st.booleans(),
)
def test_json_booleans_are_refused_in_numeric_tensors(
    name: str, data: st.DataObject, size: int, zeros: float, nested: bool
) -> None:
    """true/false anywhere among numbers is refused, however many 0/1 numbers surround it;
    the same data with the number in its place is accepted (no false alarm)."""
    dt = lookup(name)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    kind = dt.dtype.kind
    values = rng.integers(2, 100, size) if kind in "iu" else rng.standard_normal(size) + 3
    values[rng.random(size) < zeros] = rng.integers(0, 2)
    flat: list[Any] = values.astype(dt.dtype).tolist()
    position = data.draw(st.integers(0, size - 1))
    flag = data.draw(st.booleans())
    shape = [size // 4, 4] if nested and size % 4 == 0 else [size]

    def body(item: object) -> bytes:
        flat[position] = item
        rows = [flat[i : i + 4] for i in range(0, size, 4)] if len(shape) == 2 else flat
        return _json_input(name, shape, rows)

    with pytest.raises(InvalidArgument, match=rf"input 'x': booleans .* not valid for {name}$"):
        _decode_json(body(flag))
    (tensor,) = _decode_json(body(int(flag))).inputs
    assert tensor.data.reshape(-1)[position] == int(flag) and tensor.data.dtype == dt.dtype


@pytest.mark.parametrize("name", ["FP16", "FP32"])
@FAST
@given(data=st.data(), negative=st.booleans())
def test_json_floats_beyond_the_finite_range_are_refused(
    name: str, data: st.DataObject, negative: bool
) -> None:
    """A finite JSON number that would become infinity is refused, not made inf."""
    dt = lookup(name)
    largest = float(np.finfo(dt.dtype).max)
    # JSON integers too, where an int64 can exceed the type (orjson reads bigger ones as floats)
    integers = st.integers(int(largest) + 16, 2**63 - 1) if name == "FP16" else st.nothing()
    beyond = data.draw(st.floats(min_value=largest * 1.001, max_value=1.7e308) | integers)
    fine = data.draw(st.lists(st.sampled_from([0.5, -largest, "NaN", "Infinity"]), max_size=5))
    values = [*fine, -beyond if negative else beyond]
    with pytest.raises(InvalidArgument, match=f"input 'x': value out of range for {name}"):
        _decode_json(_json_input(name, [len(values)], values))


@pytest.mark.parametrize("name", ["FP16", "FP32", "FP64"])
@FAST
@given(data=st.data())
def test_json_non_finite_strings_and_extremes_are_accepted(name: str, data: st.DataObject) -> None:
    """Every value of the type, infinities and NaN spelled as strings, decodes to itself."""
    dt = lookup(name)
    array = data.draw(
        hnp.arrays(dt.dtype, st.integers(1, 8), elements=hnp.from_dtype(dt.dtype, allow_nan=True))
    )
    finfo = np.finfo(dt.dtype)
    array[0] = data.draw(st.sampled_from([finfo.max, finfo.min, finfo.tiny, np.inf, -np.inf]))
    values = [
        x
        if math.isfinite(x)
        else ("NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity"))
        for x in array.tolist()
    ]
    (tensor,) = _decode_json(_json_input(name, list(array.shape), values)).inputs
    assert tensor.data.dtype == dt.dtype
    np.testing.assert_array_equal(tensor.data, array)


@pytest.mark.parametrize(
    "name", ["UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"]
)
def test_json_integer_extremes_are_exact(name: str) -> None:
    """Each integer type's min and max, mixed with 0 (numpy alone would make UINT64 floats)."""
    info = np.iinfo(lookup(name).dtype)
    values = [int(info.max), 0, int(info.min)]
    (tensor,) = _decode_json(_json_input(name, [3], values)).inputs
    assert tensor.data.tolist() == values and tensor.data.dtype == lookup(name).dtype
    for beyond in (int(info.max) + 1, int(info.min) - 1):
        # stdlib json: orjson will not even write integers past 64 bits (and reads them as floats)
        body = json.dumps(
            {"inputs": [{"name": "x", "datatype": name, "shape": [2], "data": [0, beyond]}]}
        )
        with pytest.raises(InvalidArgument, match=f"(out of range|not valid) for {name}"):
            _decode_json(body.encode())
