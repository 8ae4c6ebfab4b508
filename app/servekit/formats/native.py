"""scikit-learn estimators that skl2onnx cannot convert, served natively instead (in process).

``add_model(name, estimator)`` converts to ONNX when it can (the fast path) and the ONNX model
gives the estimator's answers on the example and sample rows (the parity check of
app/servekit/formats/tabular_onnx.py). When skl2onnx refuses (a ColumnTransformer over a
DataFrame's named columns, a FunctionTransformer, an estimator it does not know) or its model
disagrees, the estimator is written as a joblib file in a folder this server owns and served by
the ``sklearn`` runtime (app/servekit/runtimes/sklearn.py), with one warning saying why and what
it costs (app/servekit/notebook/handle.py does both). Only the in-process server does this: its
own process wrote the file. A server reached with ``connect(url)`` takes no pickles over the
network (a pushed pickle would run code on it), so there the conversion error stands, with the
way out.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from servekit.formats import tabular_onnx

SLOWER = (
    "served natively by scikit-learn in the server's threads: slower per request than "
    "ONNX Runtime, the same predictions as in this notebook"
)


class NativeFallback(UserWarning):
    """add_model served a scikit-learn model natively because skl2onnx could not convert it."""


def reason(exc: BaseException) -> str:
    """skl2onnx's refusal in one line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


def warn(name: str, exc: BaseException) -> None:
    if isinstance(exc, tabular_onnx.ParityError):
        why = f"skl2onnx converts it, but {reason(exc)} ({tabular_onnx.TOLERANCE})"
    else:
        why = f"skl2onnx cannot convert it ({reason(exc)})"
    warnings.warn(f"{name}: {why}; {SLOWER}", NativeFallback, stacklevel=3)


def write(estimator: Any, folder: Path) -> Path:
    """The estimator as ``folder/model.joblib`` (folder created)."""
    import joblib

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.joblib"
    joblib.dump(estimator, path)
    return path
