"""scikit-learn, XGBoost and LightGBM models turned into ONNX, and the parity check that decides
whether the ONNX model may answer for them.

Two callers, on two sides of the layer table, share it: serve.yaml's ``convert: onnx``
(app/servekit/runtimes/converted.py, in the server) and ``add_model(name, estimator)`` in a notebook
(app/servekit/formats/convert.py, which the client calls). Both convert, run the ONNX model on
sample rows next to the native model, and use it only when every output agrees within
:data:`TOLERANCE`; otherwise the native model serves and the reason is said.

Why a check at all: a converter may accept a model and still compute something else (ONNX's tree
operators compare in float32 where LightGBM compares in float64; a converter may not know an
option the model was fitted with). A conversion that is fast and wrong is worse than none.

The libraries are imported only when a model of theirs is converted: skl2onnx
(``servekit[sklearn]``) for scikit-learn, onnxmltools (``servekit[xgboost]``,
``servekit[lightgbm]``) for XGBoost and LightGBM.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

RTOL = 1e-4
ATOL = 1e-5
TOLERANCE = (
    f"|onnx - native| <= {ATOL:g} + {RTOL:g} * |native| on every value; labels equal but where "
    "the native top two class probabilities tie within that"
)
"""The parity rule, in the words reasons and docs quote (float32 trees against float64 sums
differ by about 1e-7; a wrong conversion differs by far more). A forest's vote can tie (10 trees
of 20 for each class): which label wins a tie is the library's choice, not a wrong model."""
SAMPLE_ROWS = 256
"""Rows the check runs when the caller has none of its own (:func:`sample_rows`)."""


class ConversionError(Exception):
    """The model could not be converted, or the ONNX model does not agree with it; the message
    says why in one line."""


class ParityError(ConversionError):
    """The model converted, but the ONNX model's answers are not the model's."""


def library_of(model: Any) -> str | None:
    """``sklearn``, ``xgboost`` or ``lightgbm`` by the model's class (no library imported)."""
    module = type(model).__module__.split(".")[0]
    return module if module in ("sklearn", "xgboost", "lightgbm") else None


def to_onnx(model: Any, features: int) -> bytes:
    """ONNX bytes of a fitted model whose one input ``X`` is FP32 ``[-1, features]``;
    classifiers give ``label`` and ``probabilities`` (no ZipMap: V2 carries no maps)."""
    library = library_of(model)
    try:
        if library == "sklearn":
            return _sklearn(model, features)
        if library in ("xgboost", "lightgbm"):
            return _onnxmltools(model, features, library)
    except ConversionError:
        raise
    except Exception as exc:
        raise ConversionError(_one_line(exc)) from None
    kind = type(model).__name__
    raise ConversionError(f"{kind} is not a scikit-learn, XGBoost or LightGBM model")


def _sklearn(model: Any, features: int) -> bytes:
    _need("skl2onnx", "skl2onnx", "sklearn")
    from skl2onnx import to_onnx as skl_to_onnx
    from sklearn.base import is_classifier

    options = {"zipmap": False} if is_classifier(model) else None
    sample = np.zeros((1, features), dtype=np.float32)
    proto = skl_to_onnx(model, sample, options=options, target_opset=opset())
    data: bytes = proto.SerializeToString()
    return data


def _onnxmltools(model: Any, features: int, library: str) -> bytes:
    # No target_opset: onnxmltools picks the newest its converters support, which it
    # checks against the installed onnx (it refuses one it does not know).
    _need("onnxmltools", "onnxmltools", library)
    from onnxmltools import convert_lightgbm, convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType

    types = [("X", FloatTensorType([None, features]))]
    if library == "xgboost":
        # onnxmltools reads features as f0, f1, ...: a model fitted on a DataFrame names them,
        # and the ONNX model takes the same columns in the same order anyway.
        unnamed = copy.deepcopy(model)
        booster = unnamed.get_booster() if hasattr(unnamed, "get_booster") else unnamed
        booster.feature_names = None
        proto = convert_xgboost(unnamed, initial_types=types)
    else:
        proto = convert_lightgbm(model, initial_types=types, zipmap=False)
    data: bytes = proto.SerializeToString()
    return data


def _need(module: str, package: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ConversionError(
            f"{package} is not installed in this environment: pip install 'servekit[{extra}]'"
        )


def opset() -> int:
    """The newest ONNX opset both skl2onnx and the installed onnx know (skl2onnx may know a
    newer one than onnxruntime runs)."""
    import onnx
    from skl2onnx import get_latest_tested_opset_version

    return int(min(get_latest_tested_opset_version(), onnx.defs.onnx_opset_version()))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


# ---- sample rows ------------------------------------------------------------------------------


def sample_rows(model: Any, features: int, rows: int = SAMPLE_ROWS) -> np.ndarray:
    """``rows`` x ``features`` FP32 rows to compare the two models on, the same every time.

    A tree model's split thresholds say where its answers change: each feature is drawn across
    the span of its thresholds (10% wider), so the rows reach both sides of the splits. Features
    without thresholds (and models without trees) get values of three magnitudes (normal with
    scale 1, 10 and 100 by row), so a scaler or a linear model meets more than values near 0.
    """
    rng = np.random.default_rng(0)
    scales = np.array([1.0, 10.0, 100.0])[np.arange(rows) % 3][:, None]
    out = rng.normal(size=(rows, features)) * scales
    for feature, (low, high) in _threshold_spans(model, features).items():
        margin = (high - low) * 0.1 or 1.0
        out[:, feature] = rng.uniform(low - margin, high + margin, rows)
    rows_fp32: np.ndarray = out.astype(np.float32)
    return rows_fp32


def _threshold_spans(model: Any, features: int) -> dict[int, tuple[float, float]]:
    pairs: list[tuple[int, float]] = []
    try:
        pairs = _thresholds(model)
    except Exception:  # a model this reading does not understand: plain rows then
        return {}
    spans: dict[int, tuple[float, float]] = {}
    for feature, value in pairs:
        if 0 <= feature < features and np.isfinite(value):
            low, high = spans.get(feature, (value, value))
            spans[feature] = (min(low, value), max(high, value))
    return spans


def _thresholds(model: Any) -> list[tuple[int, float]]:
    """(feature index, threshold) of every split of a tree model; [] for any other."""
    library = library_of(model)
    if library == "xgboost":
        booster = model.get_booster() if hasattr(model, "get_booster") else model
        table = booster.trees_to_dataframe()
        table = table[table["Feature"] != "Leaf"]
        names = booster.feature_names
        index = {n: i for i, n in enumerate(names)} if names else {}
        return [
            (index.get(f, int(f[1:]) if f[1:].isdigit() else -1), float(s))
            for f, s in zip(table["Feature"], table["Split"], strict=True)
        ]
    if library == "lightgbm":
        booster = model.booster_ if hasattr(model, "booster_") else model
        table = booster.trees_to_dataframe()
        table = table[table["split_feature"].notna()]
        index = {n: i for i, n in enumerate(booster.feature_name())}
        return [
            (index.get(f, -1), float(t))
            for f, t in zip(table["split_feature"], table["threshold"], strict=True)
            if isinstance(t, (int, float))
        ]
    inner_trees = np.ravel(getattr(model, "estimators_", []))
    trees = [model] if hasattr(model, "tree_") else list(inner_trees)
    pairs: list[tuple[int, float]] = []
    for tree in trees:
        inner = getattr(tree, "tree_", None)
        if inner is None:
            continue
        split = inner.feature >= 0
        pairs += zip(inner.feature[split].tolist(), inner.threshold[split].tolist(), strict=True)
    return pairs


# ---- parity -----------------------------------------------------------------------------------

Adapt = Callable[[np.ndarray], np.ndarray]
"""One ONNX output made into the native output's shape (a column taken, a [N, 1] raveled)."""


@dataclass(frozen=True)
class Match:
    """Which ONNX output answers for a native output, and how it is reshaped."""

    onnx_output: str
    adapt: Adapt

    def __call__(self, values: np.ndarray) -> np.ndarray:
        return self.adapt(values)


def _same(values: np.ndarray) -> np.ndarray:
    return values


def _ravel(values: np.ndarray) -> np.ndarray:
    return values.reshape(-1)


def _second_column(values: np.ndarray) -> np.ndarray:
    return values[:, 1]


def match_outputs(
    native: dict[str, Any],
    onnx: dict[str, np.ndarray],
    order: Sequence[str],
    probabilities: str | None = None,
) -> dict[str, Match]:
    """For each native output (name -> values on the sample rows), the ONNX output (tried in
    ``order``, reshaped as the native one is shaped) that agrees with it within
    :data:`TOLERANCE`; ``probabilities`` names the native class probabilities, whose ties let
    a label differ. ConversionError naming the output and the largest difference when one has
    none."""
    ties = _ties(_plain(native[probabilities])) if probabilities in native else None
    found: dict[str, Match] = {}
    for name, values in native.items():
        want = _plain(values)
        closest = ""
        for onnx_name in order:
            got = np.asarray(onnx[onnx_name])
            for adapt in _adapters(got, want):
                why = _disagreement(want, adapt(got), ties)
                if why is None:
                    found[name] = Match(onnx_name, adapt)
                    break
                closest = closest or why
            if name in found:
                break
        if name not in found:
            detail = closest or f"no ONNX output has its shape {want.shape}"
            raise ParityError(f"the ONNX model's {name} does not match the native one: {detail}")
    return found


def _plain(values: Any) -> np.ndarray:
    if hasattr(values, "to_numpy"):
        values = values.to_numpy()
    return np.asarray(values)


def _adapters(got: np.ndarray, want: np.ndarray) -> list[Adapt]:
    if got.shape == want.shape:
        return [_same]
    if got.ndim == 2 and want.ndim == 1 and got.shape[0] == want.shape[0]:
        if got.shape[1] == 1:
            return [_ravel]
        if got.shape[1] == 2:  # a binary Booster's predict: the probability of class 1
            return [_second_column]
    if got.size == want.size and got.shape[0] == want.shape[0]:
        return [lambda values: values.reshape(want.shape)]
    return []


def _ties(probabilities: np.ndarray) -> np.ndarray | None:
    """Rows whose two likeliest classes tie within the tolerance (None: not [N, K>=2])."""
    if probabilities.ndim != 2 or probabilities.shape[1] < 2:
        return None
    top = np.sort(probabilities.astype(np.float64), axis=1)[:, -2:]
    tied: np.ndarray = np.abs(top[:, 1] - top[:, 0]) <= 2 * (ATOL + RTOL * top[:, 1])
    return tied


def _disagreement(want: np.ndarray, got: np.ndarray, ties: np.ndarray | None) -> str | None:
    """None when ``got`` matches ``want`` under the rule, else how it differs (a label may
    differ on a row of ``ties``)."""
    if want.dtype.kind in "fc" or (got.dtype.kind == "f" and want.dtype.kind in "iub"):
        if got.dtype.kind not in "fiub":
            return f"values of {got.dtype} for {want.dtype}"
        a = want.astype(np.float64)
        b = got.astype(np.float64)
        off = np.abs(a - b) > ATOL + RTOL * np.abs(a)
        if not off.any():
            return None
        worst = float(np.nanmax(np.abs(a - b)))
        return f"{int(off.sum())} of {off.size} values differ, by up to {worst:.3g}"
    if want.dtype.kind in "OUS" or got.dtype.kind in "OUS":
        text_want = np.vectorize(_text, otypes=[object])(want) if want.size else want
        text_got = np.vectorize(_text, otypes=[object])(got) if got.size else got
        off = np.asarray(text_want != text_got)
    else:
        off = np.asarray(want != got)
    if ties is not None and off.shape == ties.shape:
        off = off & ~ties
    differ = int(off.sum())
    return None if differ == 0 else f"{differ} of {want.size} labels differ"


def _text(item: Any) -> str:
    return item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
