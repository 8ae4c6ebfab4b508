"""How an MLServer custom runtime's request and answer cross servekit: one JSON document each.

MLServer hands its runtimes the request as the client sent it (any input names, the request's
and each input's ``parameters``, ``content_type`` included) and answers what ``predict``
returns as it is (any outputs, their ``parameters``). servekit runs such a model through its
executor, isolation and statistics like any Python model, whose requests are dicts of arrays:
so the request goes in as one BYTES element holding the document :func:`request_document`
writes (``{"id", "parameters", "inputs": [...], "outputs": [...]}``, MLServer's
InferenceRequest fields) and the answer comes back as one holding MLServer's
InferenceResponse fields. A tensor's ``data`` is a flat list; a BYTES element is its text
when it is UTF-8, else ``{"base64": ...}`` (JSON has no bytes). Plain JSON, never pickle: the
child process of an isolated model reads it too.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from servekit.datatypes import DATATYPES, as_bytes_array

REQUEST = "MLSERVER_REQUEST"
"""The one input of an MLServer custom runtime as servekit runs it: the request document."""
RESPONSE = "MLSERVER_RESPONSE"
"""Its one output: the answer document."""
BASE64 = "base64"


def pack(document: dict[str, Any]) -> np.ndarray:
    """A document as the one-element BYTES tensor that carries it."""
    return pack_all([document])


def unpack(tensor: np.ndarray) -> dict[str, Any]:
    """The document a one-element BYTES tensor carries (ValueError when it carries none)."""
    documents = unpack_all(tensor)
    if len(documents) != 1:
        raise ValueError(f"expected one serialized document, got {len(documents)}")
    return documents[0]


def unpack_all(tensor: np.ndarray) -> list[dict[str, Any]]:
    """The documents a BYTES tensor carries, one per element (several when the executor
    batched requests together, one row each)."""
    out = []
    for raw in as_bytes_array(np.asarray(tensor, dtype=object)).reshape(-1):
        document = json.loads(bytes(raw))
        if not isinstance(document, dict):
            raise ValueError("the serialized document is not a JSON object")
        out.append(document)
    return out


def pack_all(documents: list[dict[str, Any]]) -> np.ndarray:
    """Documents as a BYTES tensor of one element each (:func:`pack` for several)."""
    return np.array([json.dumps(d, ensure_ascii=False).encode() for d in documents], dtype=object)


def flat_data(data: Any, as_bytes: bool = False) -> list[Any]:
    """A tensor's elements (an array, a list nested or not, a bare value) as a flat JSON list
    (BYTES: text, or ``{"base64": ...}`` when not UTF-8 or ``as_bytes``)."""
    if isinstance(data, np.ndarray) and data.dtype.kind in "biuf":
        numbers: list[Any] = data.reshape(-1).tolist()  # already JSON's
        return numbers
    return [_element(v, as_bytes) for v in flatten(data)]


def _element(value: Any, as_bytes: bool = False) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        if not as_bytes:
            try:
                return raw.decode()
            except UnicodeDecodeError:
                pass
        return {BASE64: base64.b64encode(raw).decode()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def element_bytes(value: Any) -> bytes:
    """A BYTES element of a document (text or ``{"base64": ...}``) as bytes."""
    raw = raw_element(value)
    return raw if isinstance(raw, bytes) else str(raw).encode()


def raw_element(value: Any) -> Any:
    """A BYTES element of a document as the model sees it: text stays text (as MLServer's REST
    hands it over), ``{"base64": ...}`` becomes bytes."""
    if isinstance(value, dict) and BASE64 in value:
        return base64.b64decode(str(value[BASE64]))
    return value


def array_of(data: Any, datatype: str, shape: list[int]) -> np.ndarray:
    """A document's tensor as an array of ``shape`` (ValueError when its data does not fill
    the shape or is not of the datatype)."""
    flat = flatten(data)
    size = int(np.prod(shape)) if shape else 1
    if len(flat) != size:
        raise ValueError(f"shape {list(shape)} holds {size} elements, its data has {len(flat)}")
    if datatype == "BYTES":
        return np.array([element_bytes(v) for v in flat], dtype=object).reshape(shape)
    spec = DATATYPES.get(datatype)
    if spec is None:
        raise ValueError(f"unknown datatype {datatype!r}")
    return np.asarray(flat, dtype=spec.dtype).reshape(shape)


def flatten(data: Any) -> list[Any]:
    """MLServer's tensor data as a flat list: a list (nested or not), a bare value (a str for
    one BYTES element, as its REST API echoes one) or an array."""
    if isinstance(data, np.ndarray):
        return list(data.reshape(-1).tolist()) if data.dtype != object else list(data.flat)
    if isinstance(data, list | tuple):
        out: list[Any] = []
        for item in data:
            if isinstance(item, list | tuple):
                out.extend(flatten(item))
            else:
                out.append(item)
        return out
    return [data]
