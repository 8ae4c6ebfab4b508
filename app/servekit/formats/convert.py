"""Models from other libraries, turned into ONNX before ``add_model`` serves them.

scikit-learn estimators and pipelines go through skl2onnx (``pip install servekit[sklearn]``),
PyTorch modules through ``torch.onnx.export`` with the example input the caller gives
(app/servekit/formats/torch_onnx.py, ``pip install "servekit[torch]"``). Neither library is
imported unless the object handed over comes from it, so a notebook without them pays nothing.
The result is ONNX bytes, which then travel like any other model file: served by onnxruntime,
saved as a file by ``server.save``, pushed over the network by ``connect``.

A converted scikit-learn model is checked before it is used: its outputs must match the
estimator's on the example rows and on sample rows (app/servekit/formats/tabular_onnx.py states
the tolerance); ``add_model`` on an in-process server serves the estimator natively when they
do not (app/servekit/formats/native.py).

scikit-learn classifiers are converted with ZipMap off: skl2onnx's default returns the
probabilities as a sequence of maps, which the V2 protocol cannot carry; without it the outputs
are ``label`` and ``probabilities`` (one row of class probabilities per input row).
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from servekit.formats import tabular_onnx, torch_onnx


def is_sklearn(source: object) -> bool:
    """An instance of a scikit-learn estimator (or pipeline), without importing sklearn."""
    base = getattr(sys.modules.get("sklearn.base"), "BaseEstimator", None)
    return base is not None and isinstance(source, base)


def sklearn_to_onnx(estimator: Any, example: Any = None) -> bytes:
    """ONNX bytes of a fitted estimator; its input ``X`` is FP32 ``[-1, n_features]``.

    ``example`` (a few rows of the training data) decides the number of features when the
    estimator does not record it (``n_features_in_``). The ONNX model must then give the
    estimator's own answers (``predict``, and ``predict_proba`` when it has one) on the example
    rows and on sample rows (app/servekit/formats/tabular_onnx.py, within its ``TOLERANCE``):
    ``tabular_onnx.ConversionError`` says how they differ when they do not.
    """
    if importlib.util.find_spec("skl2onnx") is None:
        raise ImportError(
            "serving a scikit-learn model needs skl2onnx: pip install 'servekit[sklearn]'"
        )
    if example is None:
        features = getattr(estimator, "n_features_in_", None)
        if features is None:
            raise ValueError(
                f"{type(estimator).__name__} does not say how many features it takes (is it "
                "fitted?); pass example=X[:1]"
            )
        given = np.zeros((0, int(features)), dtype=np.float32)
    else:
        text = _text_columns(example)
        if text:
            raise tabular_onnx.ConversionError(
                f"column(s) {', '.join(text)} of the example are text; an ONNX model of one "
                "matrix takes numbers only"
            )
        given = np.asarray(example, dtype=np.float32).reshape(len(example), -1)
    count = given.shape[1]
    data = tabular_onnx.to_onnx(estimator, count)
    rows = np.concatenate([given, tabular_onnx.sample_rows(estimator, count)])
    check_parity(estimator, data, rows)
    return data


def _text_columns(example: Any) -> list[str]:
    """The columns of a DataFrame example that are not numbers or booleans."""
    dtypes = getattr(example, "dtypes", None)
    if dtypes is None or not hasattr(dtypes, "items"):
        return []
    return [str(c) for c, d in dtypes.items() if getattr(d, "kind", "O") not in "biuf"]


def check_parity(estimator: Any, data: bytes, rows: np.ndarray) -> None:
    """ConversionError unless the ONNX model ``data`` answers ``rows`` as ``estimator`` does."""
    import onnxruntime as ort

    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    order = [o.name for o in session.get_outputs()]
    got = dict(zip(order, session.run(None, {session.get_inputs()[0].name: rows}), strict=True))
    with warnings.catch_warnings():  # fitted on a DataFrame, given the same numbers unnamed
        warnings.simplefilter("ignore", UserWarning)
        native = {"predict": estimator.predict(rows)}
        if hasattr(estimator, "predict_proba"):
            native["predict_proba"] = estimator.predict_proba(rows)
    tabular_onnx.match_outputs(native, got, order, "predict_proba")


def to_onnx_source(
    source: object,
    example: Any = None,
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    dynamic_batch: bool | None = None,
) -> object:
    """``source`` as ONNX bytes when it is a scikit-learn or PyTorch model, else unchanged.

    ``input_names``, ``output_names`` and ``dynamic_batch`` shape a PyTorch export only; given
    with any other source they would be silently ignored, so they are refused instead.
    """
    if torch_onnx.is_torch_module(source):
        return torch_onnx.to_onnx(
            source,
            example,
            input_names=input_names,
            output_names=output_names,
            dynamic_batch=True if dynamic_batch is None else dynamic_batch,
        )
    given = {
        "input_names": input_names,
        "output_names": output_names,
        "dynamic_batch": dynamic_batch,
    }
    named = [key for key, value in given.items() if value is not None]
    if named:
        raise TypeError(
            f"{', '.join(named)} apply to a torch.nn.Module only (they shape its ONNX export); "
            f"got {type(source).__name__}"
        )
    if is_sklearn(source):
        return sklearn_to_onnx(source, example)
    return source
