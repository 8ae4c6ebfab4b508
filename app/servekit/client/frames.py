"""pandas DataFrames in and out of the notebook's ``infer`` (in process and ``connect(url)``).

A DataFrame goes as MLServer's PandasCodec sends one: one [N, 1] input per column and the
request's ``content_type: pd``; text columns as BYTES, datetime columns as ISO 8601 text with
``content_type: datetime`` (app/servekit/codecs/content_types.py reads both). The answer comes
back as a DataFrame when asked (by default when the inputs were one): a 1-D output is a column,
a [N, k] output (``predict_proba``) k columns ``name_0`` .. ``name_{k-1}``, text decoded.
pandas is imported only when a DataFrame is involved: it is not a dependency of servekit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servekit.datatypes import of_column
from servekit.errors import InvalidArgument

CONTENT_TYPE = "content_type"
REQUEST_PARAMETERS = {CONTENT_TYPE: "pd"}


def is_frame(value: object) -> bool:
    """Whether ``value`` is a pandas DataFrame (without importing pandas for anything else)."""
    kind = type(value)
    return kind.__name__ == "DataFrame" and kind.__module__.startswith("pandas")


def columns(frame: Any) -> tuple[dict[str, np.ndarray], dict[str, dict[str, str]]]:
    """The frame's columns as [N, 1] arrays, and the per-input parameters some need."""
    arrays: dict[str, np.ndarray] = {}
    parameters: dict[str, dict[str, str]] = {}
    for label in frame.columns:
        name = str(label)
        if name in arrays:
            raise InvalidArgument(f"the DataFrame has two columns named {name!r}")
        series = frame[label]
        kind = getattr(series.dtype, "kind", "O")
        if kind == "M":
            values = np.asarray([v.isoformat() for v in series], dtype=object)
            parameters[name] = {CONTENT_TYPE: "datetime"}
        elif kind in "biuf":
            values = series.to_numpy()
        else:  # text (object, str, category): what the model saw as text
            values = np.asarray(
                [v if isinstance(v, bytes) else str(v) for v in series], dtype=object
            )
        arrays[name] = values.reshape(-1, 1)
    return arrays, parameters


def column_types(frame: Any, names: Any = None) -> list[dict[str, str]]:
    """Each column's V2 datatype as :func:`columns` sends it (text BYTES, numbers their own),
    as ``inputs`` declarations by name: ``add_model(..., example=df)`` declares them for a
    model served natively. ``names``: only these columns (the model's own), when given."""
    wanted = None if names is None else {str(n) for n in names}
    return [
        {"name": str(label), "datatype": of_column(frame[label].dtype).name}
        for label in frame.columns
        if wanted is None or str(label) in wanted
    ]


def to_frame(results: dict[str, np.ndarray]) -> Any:
    """Outputs (name -> array) as one DataFrame, a row per input row."""
    import pandas as pd

    data: dict[str, Any] = {}
    for name, array in results.items():
        if array.dtype.kind == "O":
            array = np.asarray(
                [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in array.flat],
                dtype=object,
            ).reshape(array.shape)
        if array.ndim == 1 or (array.ndim == 2 and array.shape[1] == 1):
            data[name] = array.reshape(-1)
        elif array.ndim == 2:
            for j in range(array.shape[1]):
                data[f"{name}_{j}"] = array[:, j]
        else:
            raise InvalidArgument(
                f"output {name!r} has shape {list(array.shape)}: a DataFrame holds 1-D or "
                "[N, k] outputs; ask for arrays with frame=False"
            )
    return pd.DataFrame(data)
