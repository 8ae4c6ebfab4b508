"""scikit-learn models (``modelFormat: sklearn``): a joblib or pickle file of a fitted
estimator or pipeline, as KServe's sklearnserver and MLServer load them.

Unpickling runs code chosen by whoever wrote the file: such a model is declared in serve.yaml only,
never pushed through the repository API (app/servekit/models/pushed_config.py). The estimator's
``feature_names_in_`` (fitted on a DataFrame) make its inputs one column each and it is given a
DataFrame, each column of the datatype the fitted estimator records (BYTES for a text column its
encoder saw, app/servekit/formats/fitted_types.py); else ``n_features_in_`` sizes its ``input-0``
matrix. ``predict``'s datatype follows ``classes_`` for a classifier (INT64, BYTES for text labels),
FP64 otherwise.

A pickle made only of the libraries' own classes (``library_code_only``) may run on the event loop
once measured fast, as an ONNX session does; one holding a function or class of anyone else's
(a ``FunctionTransformer`` of the user's function, a callable kernel or metric, a custom
estimator) may block on anything and stays in its worker threads (app/servekit/runtimes/base.py,
``may_run_inline``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from servekit.config.compiler import ModelPlan
from servekit.config.versions import VersionSource
from servekit.formats.fitted_types import fitted_columns
from servekit.runtimes.converted import Converted, maybe_convert
from servekit.runtimes.onnx import check_model_file
from servekit.runtimes.tabular import (
    PREDICT,
    PREDICT_PROBA,
    Instance,
    TabularLayout,
    TabularModel,
    columns_layout,
    label_datatype,
    matrix_layout,
    plan_layout,
    plan_outputs,
    require,
)
from servekit.types import TensorSpec

PLATFORM = "sklearn"
LIBRARIES = frozenset({"sklearn", "xgboost", "lightgbm", "numpy", "scipy", "pandas"})
"""Whose classes (and numpy's ufuncs) a pickle may hold and still run on the event loop."""
NESTING = 32
"""How deep ``library_code_only`` follows estimators inside estimators before giving up."""


def read(path: Path) -> Any:
    """The estimator in ``path`` (joblib reads plain pickles too)."""
    import joblib

    return joblib.load(path)


def load(plan: ModelPlan, version: VersionSource) -> TabularModel | Converted:
    """``instances`` copies of the estimator; LoadError with a reason a user can act on."""
    require("sklearn", "sklearn", "scikit-learn")
    from servekit.runtimes.base import LoadError

    path = check_model_file(version.path)
    try:
        estimators = [read(path) for _ in range(plan.instances)]
    except ModuleNotFoundError as exc:
        raise LoadError(
            f"{path} needs the module {exc.name!r}, which is not installed in the server's "
            "environment"
        ) from None
    except Exception as exc:
        why = str(exc) or type(exc).__name__  # a truncated file: EOFError, no message
        raise LoadError(f"{path} could not be read as a joblib or pickle file: {why}") from None
    first = estimators[0]
    if not hasattr(first, "predict"):
        raise LoadError(f"{path} holds a {type(first).__name__}, which has no predict method")
    native = TabularModel(
        PLATFORM,
        plan_layout(plan, layout_of(first)),
        outputs_of(plan, first),
        [Instance(methods_of(e)) for e in estimators],
        may_run_inline=library_code_only(first),
    )
    return maybe_convert(plan, native, first)


def layout_of(estimator: Any) -> TabularLayout:
    """Columns when the estimator knows its feature names, else the sized matrix."""
    names = getattr(estimator, "feature_names_in_", None)
    if names is not None:
        return columns_layout([str(n) for n in names], fitted=fitted_columns(estimator))
    count = getattr(estimator, "n_features_in_", None)
    return matrix_layout(int(count) if isinstance(count, int) else None)


def outputs_of(plan: ModelPlan, estimator: Any) -> tuple[TensorSpec, ...]:
    """``predict``, and ``predict_proba`` when the estimator offers it."""
    classes = getattr(estimator, "classes_", None)
    specs = [TensorSpec(PREDICT, label_datatype(classes), (-1,))]
    if hasattr(estimator, PREDICT_PROBA):
        width = len(classes) if classes is not None else -1
        specs.append(TensorSpec(PREDICT_PROBA, "FP64", (-1, width)))
    return plan_outputs(plan, tuple(specs))


def methods_of(estimator: Any) -> dict[str, Any]:
    methods = {PREDICT: estimator.predict}
    if hasattr(estimator, PREDICT_PROBA):
        methods[PREDICT_PROBA] = estimator.predict_proba
    return methods


def library_code_only(value: Any, depth: int = 0) -> bool:
    """Whether a fitted estimator, followed through its parameters (``get_params``: a
    pipeline's steps, an ensemble's estimators, a transformer's function), is made only of
    the classes of ``LIBRARIES``: its calls are then that library code's computation, whose
    time follows its input. A Python function, or an object of any other module, may be
    anyone's code: False. Plain values (numbers, text, arrays, numpy dtypes) are data."""
    if depth > NESTING:
        return False
    if isinstance(value, np.ndarray):
        return value.dtype.kind != "O" or library_code_only(value.tolist(), depth + 1)
    if value is None or isinstance(value, (bool, int, float, str, bytes, np.generic)):
        return True
    if isinstance(value, (list, tuple)):
        return all(library_code_only(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(library_code_only(item, depth + 1) for item in value.values())
    kind = value if isinstance(value, type) else type(value)  # a dtype class, or an instance
    if str(getattr(kind, "__module__", "")).partition(".")[0] not in LIBRARIES:
        return False
    get_params = getattr(value, "get_params", None)
    if isinstance(value, type) or get_params is None:
        return True
    try:
        params = get_params(deep=False)
    except Exception:  # an estimator that cannot say its parameters cannot be vouched for
        return False
    return library_code_only(params, depth + 1)
