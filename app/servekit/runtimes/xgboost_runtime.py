"""XGBoost models (``modelFormat: xgboost``): a model saved with ``save_model`` as ``.json``,
``.ubj`` or the older binary ``.bst``.

Loaded as MLServer loads them, through XGBoost's scikit-learn interface: an XGBRegressor, or an
XGBClassifier when the file says it is one, so ``predict`` gives class labels and
``predict_proba`` probabilities for a classifier; a plain Booster trained with ``xgb.train``
predicts its objective's output (probabilities for ``binary:logistic``). These formats are data,
not pickles. The booster's feature names (fitted on a DataFrame) make its inputs one column
each, of the booster's feature types; a categorical feature (``enable_categorical``) is a BYTES
column, given to the model as a pandas ``category`` (its categories in the metadata when
XGBoost stores them and pyarrow is installed to read them). Threads per call follow the
model's ``intraOpThreads``.
"""

from __future__ import annotations

from typing import Any

from servekit.config.compiler import ModelPlan
from servekit.config.versions import VersionSource
from servekit.formats.fitted_types import fitted_columns
from servekit.runtimes.base import LoadError
from servekit.runtimes.converted import Converted, maybe_convert
from servekit.runtimes.onnx import check_model_file
from servekit.runtimes.tabular import (
    PREDICT,
    PREDICT_PROBA,
    Instance,
    TabularModel,
    columns_layout,
    matrix_layout,
    plan_layout,
    plan_outputs,
    require,
)
from servekit.types import TensorSpec

PLATFORM = "xgboost"


def read(path: str, threads: int) -> Any:
    """The model in ``path`` through the scikit-learn interface (classifier or regressor)."""
    import xgboost as xgb

    model: Any = xgb.XGBRegressor(n_jobs=threads)
    try:
        model.load_model(path)
    except TypeError:  # "Loading an estimator with different type": a classifier
        model = xgb.XGBClassifier(n_jobs=threads)
        model.load_model(path)
    return model


def load(plan: ModelPlan, version: VersionSource) -> TabularModel | Converted:
    """``instances`` copies of the model; LoadError with a reason a user can act on."""
    require("xgboost", "xgboost", "XGBoost")
    path = check_model_file(version.path)
    threads = plan.options.intra_op_threads
    try:
        models = [read(str(path), threads) for _ in range(plan.instances)]
    except Exception as exc:
        raise LoadError(f"XGBoost could not load {path}: {exc}") from None
    first = models[0]
    booster = first.get_booster()
    names = booster.feature_names
    if names:
        layout = columns_layout(names, ["FP32"] * len(names), fitted_columns(booster))
    else:
        layout = matrix_layout(booster.num_features(), "FP32")
    classifier = hasattr(first, PREDICT_PROBA)
    specs = [TensorSpec(PREDICT, "INT64" if classifier else "FP32", (-1,))]
    methods = [{PREDICT: m.predict} for m in models]
    if classifier:
        width = int(getattr(first, "n_classes_", -1) or -1)
        specs.append(TensorSpec(PREDICT_PROBA, "FP32", (-1, width)))
        for method, model in zip(methods, models, strict=True):
            method[PREDICT_PROBA] = model.predict_proba
    from xgboost.core import XGBoostError

    native = TabularModel(
        PLATFORM,
        plan_layout(plan, layout),
        plan_outputs(plan, tuple(specs)),
        [Instance(m) for m in methods],
        (ValueError, TypeError, KeyError, XGBoostError),
        may_run_inline=True,  # a model file is data: XGBoost's own computation runs it
    )
    return maybe_convert(plan, native, first)
