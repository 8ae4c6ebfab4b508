"""What a fitted model says about the types of the columns it was fitted on.

A model fitted on a pandas DataFrame keeps its column names, and often more: a scikit-learn
encoder keeps the categories it saw (``categories_``, text or numbers), XGBoost keeps each
feature's type (``c`` categorical, ``int``, ``i`` indicator, ``float``/``q``) and, since 3.1,
its categories, LightGBM keeps the categories of a pandas ``category`` column
(``pandas_categorical``). This module reads them once, for every tabular runtime, so that the
metadata says BYTES for a text column, and a form or a benchmark can offer the known values.

Only the first step of a scikit-learn Pipeline sees the raw columns: a ColumnTransformer's
encoders (alone or as a step of their own pipeline) give their columns' types; a column no
encoder claims is a number (FP64), which is what a scaler or a model fitted on numbers takes.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from servekit.datatypes import from_numpy


@dataclass(frozen=True)
class Column:
    """One input column as the fitted model knows it."""

    datatype: str
    categories: tuple[str | int | float, ...] | None = None
    categorical: bool = False
    """Given to the model as a pandas ``category`` column (XGBoost and LightGBM refuse text
    columns), with ``categories`` when known."""


TEXT = Column("BYTES")
_XGBOOST_TYPES = {"int": "INT64", "i": "BOOL", "float": "FP32", "q": "FP32"}


def fitted_columns(model: Any) -> dict[str, Column]:
    """The columns whose type ``model`` records, by name (the others: numbers)."""
    library = type(model).__module__.split(".")[0]
    if library == "xgboost":
        return _xgboost(model.get_booster() if hasattr(model, "get_booster") else model)
    if library == "lightgbm":
        booster = getattr(model, "booster_", model)
        return _lightgbm(booster) if hasattr(booster, "pandas_categorical") else {}
    steps = getattr(model, "steps", None)
    if isinstance(steps, list) and steps:  # a Pipeline: its first step takes the columns
        return fitted_columns(steps[0][1])
    transformers = getattr(model, "transformers_", None)
    if isinstance(transformers, list):  # a ColumnTransformer
        found: dict[str, Column] = {}
        for _, transformer, columns in transformers:
            names = [columns] if isinstance(columns, str) else columns
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                found.update(_encoded(transformer, names))
        return found
    names = getattr(model, "feature_names_in_", None)
    return _encoded(model, [str(n) for n in names]) if names is not None else {}


def _encoded(transformer: Any, names: list[str]) -> dict[str, Column]:
    """The columns an encoder (or a pipeline holding one) was fitted on."""
    for step in _steps(transformer):
        categories = getattr(step, "categories_", None)
        if isinstance(categories, list) and len(categories) == len(names):
            return {n: _column(c) for n, c in zip(names, categories, strict=True)}
        statistics = getattr(step, "statistics_", None)  # SimpleImputer of text
        if isinstance(statistics, np.ndarray) and statistics.dtype.kind in "OSU":
            return dict.fromkeys(names, TEXT)
    return {}


def _steps(transformer: Any) -> list[Any]:
    steps = getattr(transformer, "steps", None)
    if isinstance(steps, list):
        return [step for _, step in steps]
    return [transformer]


def _column(values: Any, categorical: bool = False) -> Column:
    """A column from the categories seen in it (missing values left out)."""
    array = np.asarray(values)
    known = [v for v in array.tolist() if not _missing(v)]
    if array.dtype.kind in "OSU" or any(isinstance(v, str | bytes) for v in known):
        text = tuple(_text(v) for v in known)
        return Column("BYTES", text, categorical)
    if array.dtype.kind in "biuf":
        return Column(from_numpy(array.dtype).name, tuple(known), categorical)
    return Column("BYTES", None, categorical)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _xgboost(booster: Any) -> dict[str, Column]:
    names = booster.feature_names or []
    types = booster.feature_types or []
    if len(names) != len(types):
        return {}
    pairs = list(zip(names, types, strict=True))
    found = {n: Column(_XGBOOST_TYPES[t]) for n, t in pairs if t in _XGBOOST_TYPES}
    categorical = [n for n, t in pairs if t == "c"]
    known = _xgboost_categories(booster) if categorical else {}
    for name in categorical:
        values = known.get(name)
        found[name] = _column(values, True) if values is not None else Column("BYTES", None, True)
    return found


def _xgboost_categories(booster: Any) -> dict[str, list[Any]]:
    """The categories XGBoost (3.1+) stores with the model; it hands them out as Arrow
    arrays, so only when pyarrow is installed (else the column is text of unknown values)."""
    if importlib.util.find_spec("pyarrow") is None or not hasattr(booster, "get_categories"):
        return {}
    try:
        pairs = booster.get_categories(export_to_arrow=True).to_arrow()
    except Exception:  # an older model without stored categories
        return {}
    return {str(name): array.to_pylist() for name, array in pairs if array is not None}


def _lightgbm(booster: Any) -> dict[str, Column]:
    """LightGBM's categorical columns: pandas ``category`` columns at fit, their categories
    in ``pandas_categorical`` in column order; which columns they are, the model's feature
    infos say (a categorical feature lists its values, a numerical one a range)."""
    lists = booster.pandas_categorical or []
    if not lists:
        return {}
    infos = booster.dump_model(num_iteration=1).get("feature_infos", {})
    names = [str(n) for n in booster.feature_name()]
    categorical = [n for n in names if infos.get(n, {}).get("values")]
    if len(categorical) != len(lists):
        return {}
    return {n: _column(c, True) for n, c in zip(categorical, lists, strict=True)}
