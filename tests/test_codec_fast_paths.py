"""The codecs' fast paths for the usual request and answer give what the general way gives.

Issue 28's round 6 added fast paths for the tiny-model hot path: a JSON body without
booleans skips the type and range passes over its values (``v2_json.decode_body``), the usual
binary request is decoded in one pass (``v2_binary._plain_request``), one output's JSON answer
comes from one cached prefix (``v2_json._encode_one``) and a binary answer from a cached
header joined to the arrays (``v2_binary._plain_binary``). Each must accept exactly what the
general way accepts, with the same result byte for byte, and leave every refusal (and its
words) to the general way. These tests compare the two on chosen edge cases and on seeded
random requests and answers.
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest

from servekit.codecs import v2_binary, v2_json
from servekit.errors import ServeError
from servekit.types import InferRequest, InferResponse, RequestedOutput, Tensor


def _request_facts(request: InferRequest) -> tuple[Any, ...]:
    """Everything a request carries, arrays as dtype, shape, bytes and writeability."""
    outputs = None
    if request.outputs is not None:
        outputs = [(o.name, o.parameters) for o in request.outputs]
    inputs = [
        (
            t.name,
            t.datatype,
            t.shape,
            t.parameters,
            t.data.dtype.str,
            t.data.shape,
            t.data.tolist() if t.data.dtype.kind == "O" else t.data.tobytes(),
            t.data.flags.writeable,
        )
        for t in request.inputs
    ]
    request_facts = (request.model_name, request.model_version, request.id, request.parameters)
    return (*request_facts, request.shared_memory, outputs, inputs)


def _outcome(call: Any, *args: Any) -> tuple[Any, ...]:
    try:
        result = call(*args)
    except ServeError as exc:
        return ("refused", type(exc).__name__, str(exc))
    except Exception as exc:  # (the same unexpected error both ways counts as the same)
        return ("raised", type(exc).__name__, str(exc))
    if isinstance(result, InferRequest):
        return ("ok", _request_facts(result))
    return ("ok", result)


def _json_both(body: bytes) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    fast = _outcome(v2_json.decode_body, body, "m", None)
    general = _outcome(lambda: v2_json.decode_request(v2_json.loads(body), "m", None))
    return fast, general


def _body(datatype: str, shape: list[int], data: Any) -> bytes:
    item = {"name": "x", "datatype": datatype, "shape": shape, "data": data}
    return json.dumps({"inputs": [item]}).encode()


@pytest.mark.parametrize(
    "datatype,shape,data",
    [
        ("FP32", [1, 4], [0.5, -1.25, 3.0, 1e-3]),
        ("FP32", [4], [1, 2, 3, 4]),  # ints for a float input: exactly as the general way
        ("FP32", [1, 3], [0.5, 2, -7]),
        ("FP32", [2, 2], [0.5, 2, -7, 1.0]),
        ("FP32", [1, 2], [2**53, 1.0]),  # at the bound
        ("FP32", [1, 2], [2**53 + 1, 1.0]),  # past it: the general way
        ("FP32", [1, 2], [2**60 + 1, 0.5]),
        ("FP32", [1, 2], [1e39, 0.5]),  # out of range for FP32: refused, same words
        ("FP32", [1, 2], [3.4e38, 3.4e38]),  # each in range, the norm is not
        ("FP32", [1, 2], [10**30, 1.0]),
        ("FP32", [1, 2], [10**400, 1.0]),  # an int no float holds
        ("FP16", [1, 3], [65504.0, 1, -2.5]),
        ("FP16", [1, 2], [65520.0, 1.0]),  # rounds past FP16's largest: refused
        ("FP16", [1, 2], [70000, 1]),
        ("FP64", [1, 2], [1e300, 1.0]),
        ("FP64", [1, 2], [16777217, 0.1]),
        ("FP32", [1, 2], ["NaN", 1.0]),
        ("FP32", [1, 2], ["Infinity", "-Infinity"]),
        ("FP32", [1, 2], ["a", 1.0]),
        ("FP32", [1, 2], [None, 1.0]),
        ("FP32", [1, 2], [[1.0], 1.0]),
        ("FP32", [1, 2], [[1.0, 2.0]]),  # nested: the general way
        ("FP32", [1, 3], [1.0, 2.0]),  # too few
        ("FP32", [1, 1], [1.0, 2.0]),  # too many
        ("FP32", [0, 2], []),
        ("INT32", [1, 2], [1, 2]),
        ("BOOL", [1, 2], [True, False]),
        ("BYTES", [1, 1], ["text"]),
    ],
)
def test_json_decode_body_matches_the_general_way(
    datatype: str, shape: list[int], data: Any
) -> None:
    fast, general = _json_both(_body(datatype, shape, data))
    assert fast == general


@pytest.mark.parametrize("token", [b"true", b"false"])
def test_json_a_boolean_among_numbers_is_refused_as_before(token: bytes) -> None:
    """The body's true/false tokens send it the general way, which refuses the boolean."""
    body = _body("FP32", [1, 3], [0.5, 1.5, 2.5]).replace(b"1.5", token)
    fast, general = _json_both(body)
    assert fast == general
    assert fast[0] == "refused" and "booleans" in fast[2]


def test_json_a_name_with_f_and_r_still_takes_the_numbers_way() -> None:
    """Letters of true/false in a name only make the check read the words (same result)."""
    item = {"name": "features", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 1.0]}
    body = json.dumps({"inputs": [item]}).encode()
    fast, general = _json_both(body)
    assert fast == general and fast[0] == "ok"


def test_json_seeded_random_bodies_decode_as_the_general_way() -> None:
    rng = random.Random(5)
    odd: list[Any] = [1.0, 0.0, 1, 0, -3, 2**53, 2**53 + 1, 1e20, 3.5e38, 65520.0, 70000]
    odd += ["NaN", "a", None, True, False, [1.0], 10**30, 16777217, -0.0]
    plain = [0.5, -1.25, 1e-3, 2.0, 7, 3.25]
    for _ in range(3000):
        count = rng.choice([1, 2, 3, 4, 16])
        data = [rng.choice(odd) if rng.random() < 0.3 else rng.choice(plain) for _ in range(count)]
        shape = rng.choice([[count], [1, count], [count, 1], [1, 1, count]])
        datatype = rng.choice(["FP32", "FP16", "FP64", "INT32", "BOOL", "BYTES", "UINT64"])
        fast, general = _json_both(_body(datatype, shape, data))
        assert fast == general, (datatype, shape, data)


def _binary_general(body: bytes | bytearray, length: int) -> InferRequest:
    header = v2_json.loads(body[:length])
    cursor = length

    def take(name: str, datatype: Any, shape: tuple[int, ...], size: int) -> np.ndarray:
        nonlocal cursor
        if cursor + size > len(body):
            raise v2_binary.InvalidArgument(
                f"input {name!r}: binary_data_size {size} runs past the end of the body"
            )
        array = v2_binary.tensor_from_bytes(name, datatype, shape, body, cursor, size)
        cursor += size
        return array

    request = v2_json.decode_request(header, "m", "1", binary=take)
    if cursor != len(body):
        raise v2_binary.InvalidArgument(
            f"{len(body) - cursor} bytes of binary data follow the inputs but no input claims them"
        )
    return request


def test_binary_seeded_random_requests_decode_as_the_general_way() -> None:
    """The general way here is decode_request's own (the JSON decoder with a binary
    callback), written out as it stood before the fast path."""
    rng = random.Random(11)
    sizes = {"FP32": 4, "INT64": 8, "BOOL": 1, "FP16": 2, "BYTES": 4, "UINT8": 1}
    fast_taken = 0
    for _ in range(3000):
        inputs, blobs = [], []
        for index in range(rng.choice([0, 1, 1, 2])):
            datatype = rng.choice(list(sizes))
            shape = rng.choice([[1, 4], [4], [], [0, 3], [2, 2]])
            size = int(np.prod(shape)) * sizes[datatype] + rng.choice([0, 0, 0, 0, 1, -1])
            parameters: dict[str, Any] = {"binary_data_size": size}
            if rng.random() < 0.05:
                parameters["other"] = 1
            if rng.random() < 0.03:
                parameters = {"binary_data_size": True}
            entry: dict[str, Any] = {"name": f"i{index}", "datatype": datatype, "shape": shape}
            entry["parameters"] = parameters
            if rng.random() < 0.03:
                entry["datatype"] = ["FP32"]
            if rng.random() < 0.03:
                entry["shape"] = [1, -1]
            inputs.append(entry)
            blobs.append(bytes(rng.getrandbits(8) for _ in range(max(size, 0))))
        obj: dict[str, Any] = {"inputs": inputs}
        pick = rng.random()
        if pick < 0.5:
            obj["outputs"] = [{"name": "o", "parameters": {"binary_data": True}}]
        elif pick < 0.6:
            obj["outputs"] = [{"name": "o"}]
        elif pick < 0.65:
            obj["outputs"] = [{"name": "o", "parameters": {"shared_memory_region": "r"}}]
        elif pick < 0.7:
            obj["outputs"] = [{"name": "o", "parameters": None}]
        elif pick < 0.72:
            obj["id"] = "abc"
        header = json.dumps(obj).encode()
        body: bytes | bytearray = header + b"".join(blobs)
        if rng.random() < 0.05:
            body += b"z"
        if rng.random() < 0.3:
            body = bytearray(body)
        fast = _outcome(v2_binary.decode_request, body, len(header), "m", "1")
        general = _outcome(_binary_general, body, len(header))
        assert fast == general, body
        if fast[0] == "ok" and isinstance(obj, dict):
            fast_taken += v2_binary._plain_request(obj, body, len(header), "m", "1") is not None
    assert fast_taken > 300  # the fast path was taken, not only the general way


def _json_answer_general(response: InferResponse) -> tuple[bytes, None]:
    entries = []
    for tensor in response.outputs:
        entry = v2_json.output_entry(tensor)
        entry["data"] = v2_json.output_json_data(tensor)
        entries.append(entry)
    return v2_json.dumps(v2_json.response_header(response, entries)), None


def _binary_answer_general(request: InferRequest, response: InferResponse) -> Any:
    """encode_response's general way (the fast one switched off for this call)."""
    fast = v2_binary._plain_binary
    v2_binary._plain_binary = lambda request, response: None  # type: ignore[assignment]
    try:
        return v2_binary.encode_response(request, response)
    finally:
        v2_binary._plain_binary = fast  # type: ignore[assignment]


def _array(rng: random.Random, seed: int) -> tuple[str, np.ndarray]:
    datatype, dtype = rng.choice(
        [
            ("FP32", np.float32),
            ("FP16", np.float16),
            ("FP64", np.float64),
            ("INT64", np.int64),
            ("BOOL", np.bool_),
            ("UINT8", np.uint8),
        ]
    )
    shape = rng.choice([(1, 4), (4,), (2, 2), (1, 1, 3), (), (0, 4), (1, 0)])
    with np.errstate(over="ignore", invalid="ignore"):
        values = np.random.default_rng(seed).standard_normal(shape) * rng.choice([1, 1e5])
        array = values.astype(dtype)
    if rng.random() < 0.1 and array.size:
        array = array.astype(np.float64)
        array.flat[0] = rng.choice([np.nan, np.inf])
    if rng.random() < 0.05 and array.ndim == 2 and array.shape[1] > 1:
        array = array[:, ::2]  # not contiguous
    if rng.random() < 0.05:
        array = array.astype(array.dtype.newbyteorder(">"))
    return datatype, array


def test_answers_match_the_general_way() -> None:
    rng = random.Random(7)
    for seed in range(3000):
        outputs = []
        for index in range(rng.choice([1, 1, 1, 2])):
            datatype, array = _array(rng, seed * 3 + index)
            shape: Any = array.shape if rng.random() < 0.95 else list(array.shape)
            parameters = {} if rng.random() < 0.9 else {"content_type": "np"}
            outputs.append(Tensor(f"o{index}", datatype, shape, array, parameters))
        answer_id = None if rng.random() < 0.9 else "id1"
        response = InferResponse(rng.choice(["m", "n"]), "1", outputs, answer_id, {})
        plain = InferRequest("m", [], None)
        fast = _outcome(v2_binary.encode_response, plain, response)
        assert fast == _outcome(_json_answer_general, response), response
        pick = rng.random()
        if pick < 0.6:
            requested = [RequestedOutput(t.name, {"binary_data": True}) for t in outputs]
        elif pick < 0.8:
            choices: list[Any] = [True, False, 1]
            requested = [
                RequestedOutput(t.name, {"binary_data": rng.choice(choices)}) for t in outputs
            ]
        else:
            requested = [RequestedOutput("o0", {"binary_data": True})]
        parameters = {} if rng.random() < 0.9 else {"binary_data_output": True}
        binary = InferRequest("m", [], None, None, requested, parameters)
        fast = _outcome(v2_binary.encode_response, binary, response)
        assert fast == _outcome(_binary_answer_general, binary, response), response


def test_a_non_finite_output_is_written_as_a_string_on_the_one_output_way() -> None:
    data = np.array([[1.5, np.nan, np.inf, -np.inf]], dtype=np.float32)
    response = InferResponse("m", "1", [Tensor("o", "FP32", (1, 4), data, {})], None, {})
    content, length = v2_binary.encode_response(InferRequest("m", [], None), response)
    assert length is None
    assert json.loads(content)["outputs"][0]["data"] == [1.5, "NaN", "Infinity", "-Infinity"]
