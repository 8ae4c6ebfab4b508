"""LightGBM models (``modelFormat: lightgbm``): a Booster saved with ``save_model`` (``.txt``,
or ``.bst`` as KServe's lgbserver names it).

``predict`` is the Booster's own: probabilities for a binary or multiclass objective ([-1, K] for K
classes: one row of K per input row), values for a regression ([-1]), as MLServer's LightGBM runtime
answers. Feature names the booster was trained with (a DataFrame) make its inputs one column each (a
pandas ``category`` column a BYTES one with its categories, given to the booster as a ``category``
again); LightGBM's own defaults (``Column_0``, ...) mean it was trained on a matrix. Threads per
call follow the model's ``intraOpThreads``. The file is text, not a pickle."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from servekit.config.compiler import ModelPlan
from servekit.config.versions import VersionSource
from servekit.formats.fitted_types import fitted_columns
from servekit.runtimes.base import LoadError
from servekit.runtimes.converted import Converted, maybe_convert
from servekit.runtimes.onnx import check_model_file
from servekit.runtimes.tabular import (
    PREDICT,
    Instance,
    TabularModel,
    columns_layout,
    matrix_layout,
    plan_layout,
    plan_outputs,
    require,
)
from servekit.types import TensorSpec

PLATFORM = "lightgbm"
_DEFAULT_NAME = re.compile(r"Column_\d+")


def read(path: str) -> Any:
    import lightgbm as lgb

    return lgb.Booster(model_file=path)


def load(plan: ModelPlan, version: VersionSource) -> TabularModel | Converted:
    """``instances`` Boosters; LoadError with a reason a user can act on."""
    require("lightgbm", "lightgbm", "LightGBM")
    path = check_model_file(version.path)
    try:
        boosters = [read(str(path)) for _ in range(plan.instances)]
    except Exception as exc:
        raise LoadError(f"LightGBM could not load {path}: {exc}") from None
    names = [str(n) for n in boosters[0].feature_name()]
    if names and not all(_DEFAULT_NAME.fullmatch(n) for n in names):
        layout = columns_layout(names, fitted=fitted_columns(boosters[0]))
    else:
        layout = matrix_layout(boosters[0].num_feature())
    threads = plan.options.intra_op_threads
    from lightgbm.basic import LightGBMError

    native = TabularModel(
        PLATFORM,
        plan_layout(plan, layout),
        plan_outputs(plan, (TensorSpec(PREDICT, "FP64", _predict_shape(boosters[0])),)),
        [Instance({PREDICT: partial(b.predict, num_threads=threads)}) for b in boosters],
        (ValueError, TypeError, KeyError, LightGBMError),
        may_run_inline=True,  # a model file is data: LightGBM's own computation runs it
    )
    return maybe_convert(plan, native, boosters[0])


def _predict_shape(booster: Any) -> tuple[int, ...]:
    """[-1, K] when the booster gives K values per row (multiclass: one per class), else [-1]."""
    per_row = int(booster.num_model_per_iteration())
    return (-1, per_row) if per_row > 1 else (-1,)
