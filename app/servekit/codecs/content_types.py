"""MLServer's content types: what a tabular model's request means, and what its answer carries.

MLServer's codecs (``mlserver.codecs``), and the KServe V2 clients written for its sklearn,
xgboost, lightgbm and mlflow runtimes, say how to read a tensor with a ``content_type``
parameter: on the request, ``pd`` (one input per DataFrame column, mixed datatypes, strings as
BYTES), on an input ``np`` (a numpy array as it is), ``str`` (BYTES holding UTF-8 text),
``base64`` (BYTES holding base64 text of raw bytes) or ``datetime`` (BYTES holding ISO 8601
text). This module reads them for a tabular model (app/servekit/runtimes/tabular.py), whose
layout is either one tensor per column (a model that knows its feature names: it receives a
DataFrame) or one 2-D tensor of features by position (it receives a matrix):

* a ``pd`` request (columns) to a column model: each column by name;
* one 2-D input (``np``, KServe's ``input-0``) to a column model: split into its columns, in
  the model's order;
* columns to a matrix model: stacked side by side, in the request's order (as MLServer hands
  such a model the DataFrame, whose columns it reads by position);
* numbers reach the model in the datatype they were sent in, whatever the metadata declares
  (as MLServer hands them over: a FP32 matrix gives a pipeline's float32 arithmetic, the
  answer the same array gives in the client's own process; the model's library casts or
  refuses); BYTES become ``str`` (UTF-8) unless the input says ``base64`` (raw bytes) or
  ``datetime``.

Pure translation: no model, no pandas (the runtime builds the DataFrame from the columns).
Answers carry ``np`` on numeric outputs and ``str`` on BYTES ones, as MLServer's runtimes
encode them with its NumpyCodec.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from servekit.errors import InvalidArgument
from servekit.types import InferRequest, Tensor, TensorSpec

CONTENT_TYPE = "content_type"
PANDAS = "pd"
NUMPY = "np"
STRING = "str"
BASE64 = "base64"
DATETIME = "datetime"
INPUT_TYPES = (NUMPY, STRING, BASE64, DATETIME)
"""Content types an input may carry."""
REQUEST_TYPES = (PANDAS, *INPUT_TYPES)
"""Content types a request may carry (a non-``pd`` one is every input's default, as
MLServer's single-input request codecs send it)."""
_TEXT_TYPES = (STRING, BASE64, DATETIME)


COLUMNS = "columns"
MATRIX = "matrix"
"""The two layouts of a tabular model (``ModelSignature.tabular``)."""


def tabular_feed(
    request: InferRequest, inputs: tuple[TensorSpec, ...], layout: str, max_batch_size: int = 0
) -> tuple[dict[str, Any], int]:
    """The feed of a tabular model for ``request`` and its rows (see the module docstring)."""
    return _Layout(inputs, layout == COLUMNS).feed(request, max_batch_size)


@dataclass(frozen=True)
class _Layout:
    """How a tabular model takes its rows.

    ``columns``: each input is one column (shape [-1, 1]; [N] and [N, 1] are both accepted)
    and the model is given each as a 1-D array; else the model has exactly one input, a
    [-1, F] matrix (F may be -1 when the model does not say).
    """

    inputs: tuple[TensorSpec, ...]
    columns: bool

    def feed(self, request: InferRequest, max_batch_size: int = 0) -> tuple[dict[str, Any], int]:
        """The model's feed for ``request`` and its number of rows; InvalidArgument (400)
        saying what does not fit."""
        default = _request_type(request)
        decoded = [(t, decode_input(t, default)) for t in request.inputs]
        if not decoded:
            raise InvalidArgument(f"model {request.model_name!r} needs at least one input")
        seen: set[str] = set()
        for tensor, _ in decoded:
            if tensor.name in seen:
                raise InvalidArgument(f"input {tensor.name!r} is given twice")
            seen.add(tensor.name)
        if self.columns:
            feed = self._columns(request.model_name, decoded)
        else:
            feed = self._matrix(request.model_name, decoded)
        rows = len(next(iter(feed.values())))
        if max_batch_size > 0 and rows > max_batch_size:
            raise InvalidArgument(
                f"model {request.model_name!r}: {rows} rows exceed maxBatchSize {max_batch_size}"
            )
        return feed, rows

    def _columns(self, model: str, decoded: list[tuple[Tensor, np.ndarray]]) -> dict[str, Any]:
        names = [s.name for s in self.inputs]
        if len(decoded) == 1 and decoded[0][0].name not in names and decoded[0][1].ndim == 2:
            tensor, matrix = decoded[0]  # one 2-D input: the columns in the model's order
            if matrix.shape[1] != len(names):
                raise InvalidArgument(
                    f"input {tensor.name!r} has {matrix.shape[1]} columns; model {model!r} takes "
                    f"{len(names)} ({_listed(names)}), as one input each or one [N, "
                    f"{len(names)}] input"
                )
            return {spec.name: matrix[:, i] for i, spec in enumerate(self.inputs)}
        given = {t.name: (t, a) for t, a in decoded}
        unknown = [n for n in given if n not in names]
        if unknown:
            raise InvalidArgument(
                f"model {model!r} has no column {unknown[0]!r}; its columns are {_listed(names)}"
            )
        missing = [n for n in names if n not in given]
        if missing:
            raise InvalidArgument(f"model {model!r} needs column(s) {_listed(missing)}")
        feed: dict[str, Any] = {}
        rows: int | None = None
        for spec in self.inputs:
            tensor, array = given[spec.name]
            column = _as_column(tensor.name, array)
            if rows is not None and len(column) != rows:
                raise InvalidArgument(
                    f"column {tensor.name!r} has {len(column)} rows, the others {rows}"
                )
            rows = len(column)
            feed[spec.name] = column
        return feed

    def _matrix(self, model: str, decoded: list[tuple[Tensor, np.ndarray]]) -> dict[str, Any]:
        spec = self.inputs[0]
        if len(decoded) == 1 and decoded[0][1].ndim == 2:
            matrix = decoded[0][1]
        else:  # columns (a pd request): side by side, in the request's order
            columns = [_as_column(t.name, a) for t, a in decoded]
            lengths = {len(c) for c in columns}
            if len(lengths) > 1:
                raise InvalidArgument(
                    f"the columns of the request have different row counts ({sorted(lengths)})"
                )
            if all(c.dtype.kind in "biuf" for c in columns):
                matrix = np.column_stack(columns)
            else:  # text beside numbers: an object matrix, each value as it came
                matrix = np.empty((len(columns[0]), len(columns)), dtype=object)
                for i, column in enumerate(columns):
                    matrix[:, i] = column
        want = spec.shape[1] if len(spec.shape) == 2 else -1
        if want >= 0 and matrix.shape[1] != want:
            raise InvalidArgument(
                f"model {model!r} takes {want} features per row, the request has {matrix.shape[1]}"
            )
        return {spec.name: matrix}


def _request_type(request: InferRequest) -> str | None:
    value = request.parameters.get(CONTENT_TYPE) if request.parameters else None
    if value is None:
        return None
    if value not in REQUEST_TYPES:
        raise InvalidArgument(
            f"request content_type {str(value)[:40]!r} is not one servekit reads; "
            f"accepted: {', '.join(REQUEST_TYPES)}"
        )
    return None if value in (PANDAS, NUMPY) else str(value)


def decode_input(tensor: Tensor, default: str | None = None) -> np.ndarray:
    """The values of one input as the model should see them (see the module docstring)."""
    kind = tensor.parameters.get(CONTENT_TYPE, default) if tensor.parameters else default
    if kind is not None and kind not in INPUT_TYPES:
        raise InvalidArgument(
            f"input {tensor.name!r}: content_type {str(kind)[:40]!r} is not one servekit "
            f"reads; accepted: {', '.join(INPUT_TYPES)}"
        )
    data = tensor.data
    if tensor.datatype != "BYTES":
        if kind in _TEXT_TYPES:
            raise InvalidArgument(
                f"input {tensor.name!r}: content_type {kind!r} needs datatype BYTES, got "
                f"{tensor.datatype}"
            )
        return data
    out = np.empty(data.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(data.flat):
        flat[i] = _element(tensor.name, i, item, kind)
    return out


def _element(name: str, index: int, item: Any, kind: str | None) -> Any:
    raw = item if isinstance(item, bytes) else str(item).encode()
    try:
        if kind == BASE64:
            return base64.b64decode(raw, validate=True)
        text = raw.decode("utf-8")
        if kind == DATETIME:
            return datetime.fromisoformat(text)
        return text
    except binascii.Error:
        raise InvalidArgument(f"input {name!r}: element {index} is not base64") from None
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"input {name!r}: element {index} is not UTF-8 text (send raw bytes base64-encoded "
            "with content_type 'base64')"
        ) from None
    except ValueError:
        raise InvalidArgument(
            f"input {name!r}: element {index} is not an ISO 8601 date and time"
        ) from None


def _as_column(name: str, array: np.ndarray) -> np.ndarray:
    """A column from [N] or [N, 1] (MLServer's PandasCodec sends [N, 1])."""
    if array.ndim == 1:
        return array
    if array.ndim == 2 and array.shape[1] == 1:
        return array[:, 0]
    raise InvalidArgument(
        f"column {name!r} has shape {list(array.shape)}; a column is [N] or [N, 1]"
    )


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:20])
    return shown + (f" and {len(names) - 20} more" if len(names) > 20 else "")


def mark_outputs(outputs: list[Tensor]) -> list[Tensor]:
    """A tabular model's ``outputs`` with the content type MLServer's clients decode them by:
    ``str`` on BYTES, ``np`` on the rest; a 1-D output's shape ``[N]`` said ``[N, 1]``, one
    row per request row, as MLServer's NumpyCodec says it (``inject_batch_dimension``). Only
    the shape changes: the data is the same (KServe V1 answers it as the flat list of
    predictions)."""
    for tensor in outputs:
        if len(tensor.shape) == 1:
            tensor.shape = (tensor.shape[0], 1)
        tensor.parameters = {
            **tensor.parameters,
            CONTENT_TYPE: STRING if tensor.datatype == "BYTES" else NUMPY,
        }
    return outputs
