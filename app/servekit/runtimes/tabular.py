"""What the tabular runtimes (scikit-learn, XGBoost, LightGBM, MLflow) share.

Each library's module loads its model (``instances`` copies, one per worker thread: their
predict methods are not all documented thread-safe) and says what the model carries: its feature
names and count, its outputs. This module turns that into the V2 metadata and runs requests:

* Inputs: one column per feature name when the model knows them (it is then given a pandas
  DataFrame with those columns, the way it was fitted), else one ``input-0`` [-1, F] matrix
  (KServe's and MLServer's example name). Each column's datatype is what the fitted model
  records (app/servekit/formats/fitted_types.py: BYTES for a text column an encoder saw,
  with its categories), FP64 when it records nothing; a column XGBoost or LightGBM took as a
  pandas ``category`` is given to it as one again. serve.yaml's ``inputs`` override datatypes
  and shapes by name, or declare the inputs of a model that carries neither. How a request's
  tensors map onto them (``pd`` columns, one ``np`` matrix, numbers cast, text decoded) is
  app/servekit/codecs/content_types.py's job; the DataPlane applies it through ``tabular``.
* Outputs: ``predict``, and ``predict_proba`` when the model has it; a request that names no
  output gets ``predict`` only, as MLServer's runtimes answer.
* Calls go through the version's executor like ONNX calls (queue limits, deadlines, batching).
  They may run on the event loop once measured fast (``may_run_inline``) only when the model is
  the library's own computation, as an ONNX Runtime session's are: an XGBoost or LightGBM
  model file (data, not code), or a pickled estimator made only of the libraries' own classes
  (app/servekit/runtimes/sklearn.py). Any other (a pickle holding a function or class of the
  user's, an MLflow pyfunc) may block on anything and stays in its worker threads.
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from servekit.config.compiler import ModelPlan
from servekit.config.schema import TensorOverride
from servekit.datatypes import DATATYPES, from_numpy
from servekit.errors import Internal, InvalidArgument
from servekit.formats.fitted_types import Column
from servekit.runtimes.base import Arrays, LoadError, Predict, apply_overrides
from servekit.shown_paths import hide_paths
from servekit.types import ModelSignature, TensorSpec

MATRIX_INPUT = "input-0"
"""The one input of a model that does not know its feature names (KServe's examples' name)."""
PREDICT = "predict"
PREDICT_PROBA = "predict_proba"

COLUMNS = "columns"
MATRIX = "matrix"
"""``ModelSignature.tabular``: how app/servekit/codecs/content_types.py reads requests."""


class TabularLayout(NamedTuple):
    """A tabular model's inputs: one [-1, 1] column per feature, or one [-1, F] matrix."""

    inputs: tuple[TensorSpec, ...]
    columns: bool
    categorical: tuple[str, ...] = ()
    """Columns given to the model as pandas ``category`` columns (XGBoost, LightGBM)."""


Method = Callable[[Any], Any]
"""One output's function of the model: features (DataFrame or matrix) -> values."""


def require(module: str, extra: str, library: str) -> None:
    """LoadError with the pip command when ``module`` is not installed (each library is an
    extra, never a dependency of servekit itself)."""
    if importlib.util.find_spec(module) is None:
        raise LoadError(
            f"{library} is not installed in the server's environment: "
            f"pip install 'servekit[{extra}]'"
        )


def columns_layout(
    names: Sequence[str],
    datatypes: Sequence[str] | None = None,
    fitted: dict[str, Column] | None = None,
) -> TabularLayout:
    """One [-1, 1] input per named feature: its datatype what the fitted model records
    (``fitted``, app/servekit/formats/fitted_types.py), else ``datatypes``, else FP64."""
    types = datatypes or ["FP64"] * len(names)
    known = fitted or {}
    specs = []
    for name, datatype in zip(names, types, strict=True):
        column = known.get(name)
        if column is None:
            specs.append(TensorSpec(name, datatype, (-1, 1)))
        else:
            specs.append(TensorSpec(name, column.datatype, (-1, 1), categories=column.categories))
    categorical = tuple(n for n in names if n in known and known[n].categorical)
    return TabularLayout(tuple(specs), True, categorical)


def matrix_layout(features: int | None, datatype: str = "FP64") -> TabularLayout:
    """The one ``input-0`` [-1, F] input (F -1 when the model does not say)."""
    count = features if features is not None and features > 0 else -1
    return TabularLayout((TensorSpec(MATRIX_INPUT, datatype, (-1, count)),), False)


def plan_layout(plan: ModelPlan, found: TabularLayout) -> TabularLayout:
    """``found`` with serve.yaml's ``inputs`` applied: overrides by name, or, for a model that
    carries no feature names, the inputs declared in full (several: columns; one of rank 2:
    the matrix)."""
    declared = plan.inputs
    if not declared:
        return found
    names = {s.name for s in found.inputs}
    if not found.columns and not any(t.name in names for t in declared):
        specs = tuple(_declared(t) for t in declared)
        columns = len(specs) > 1 or len(specs[0].shape) != 2
        if columns:
            specs = tuple(TensorSpec(s.name, s.datatype, (-1, 1)) for s in specs)
        return TabularLayout(specs, columns)
    try:
        inputs = apply_overrides(found.inputs, declared, "input")
    except InvalidArgument as exc:
        raise LoadError(exc.message) from None
    return TabularLayout(inputs, found.columns, found.categorical)


def _declared(tensor: TensorOverride) -> TensorSpec:
    shape = tuple(tensor.shape) if tensor.shape is not None else (-1, 1)
    return TensorSpec(tensor.name, tensor.datatype or "FP64", shape)


def plan_outputs(plan: ModelPlan, found: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
    """``found`` with serve.yaml's ``outputs`` overrides applied by name."""
    try:
        return apply_overrides(found, plan.outputs, "output")
    except InvalidArgument as exc:
        raise LoadError(exc.message) from None


def label_datatype(classes: Any, default: str = "FP64") -> str:
    """The V2 datatype of a classifier's labels (``classes_``), else ``default``."""
    if classes is None:
        return default
    return from_numpy(np.asarray(classes).dtype).name


@dataclass(frozen=True)
class Instance:
    """One loaded copy of the model: its output functions by output name."""

    methods: dict[str, Method]


class TabularModel:
    """A loaded tabular model version (see the module docstring)."""

    decoupled = False
    outputs_trusted = False

    def __init__(
        self,
        platform: str,
        layout: TabularLayout,
        outputs: tuple[TensorSpec, ...],
        instances: list[Instance],
        client_errors: tuple[type[BaseException], ...] = (ValueError, TypeError, KeyError),
        may_run_inline: bool = False,
    ) -> None:
        """``client_errors``: what the library raises on input it cannot use (a 400, with its
        message); anything else is the model's failure (a 500 with a logged reference).
        ``may_run_inline``: the model is the library's own computation (the module docstring)."""
        self.platform = platform
        self.may_run_inline = may_run_inline
        self.note = ""
        """Set by app/servekit/runtimes/converted.py when ``convert: onnx`` fell back here."""
        self.layout = layout
        names = {s.name for s in outputs}
        self.signature = ModelSignature(
            layout.inputs,
            outputs,
            tabular=COLUMNS if layout.columns else MATRIX,
            default_outputs=(PREDICT,) if PREDICT in names else None,
        )
        self.loose_outputs = frozenset(s.name for s in outputs)
        """Shapes vary by model (a multi-output regressor's predict is 2-D): datatypes are
        checked, shapes are not (app/servekit/services/execution/outputs.py)."""
        self._instances = instances
        self._next = itertools.cycle(instances).__next__
        self._client_errors = client_errors
        self._frame: Callable[[Arrays], Any] | None = (
            _frame_builder(_categories(layout)) if layout.columns else None
        )

    def predict(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        return self._run(self._next(), inputs, outputs)

    def predictor(self, index: int) -> Predict:
        """Instance ``index``'s copy alone (one worker thread each)."""
        instance = self._instances[index]
        return lambda inputs, outputs: self._run(instance, inputs, outputs)

    def _run(self, instance: Instance, inputs: Arrays, outputs: list[str]) -> Arrays:
        if self._frame is not None:
            features = self._frame(inputs)
        else:
            features = inputs[self.layout.inputs[0].name]
        results: Arrays = {}
        for name in outputs:
            try:
                values = instance.methods[name](features)
            except self._client_errors as exc:
                why = hide_paths(str(exc))[:500]
                raise InvalidArgument(f"the model rejected the input: {why}") from None
            results[name] = as_output(self.signature.output_index[name], values)
        return results

    def close(self) -> None:
        self._instances.clear()


def _categories(layout: TabularLayout) -> dict[str, tuple[Any, ...] | None]:
    """The categorical columns' known categories (None: unknown), by name."""
    by_name = {s.name: s for s in layout.inputs}
    return {n: by_name[n].categories for n in layout.categorical if n in by_name}


def _frame_builder(categorical: dict[str, tuple[Any, ...] | None]) -> Callable[[Arrays], Any]:
    """Columns -> a pandas DataFrame in the model's column order (pandas is imported only
    for models that take one; a model fitted on a DataFrame came with pandas). A categorical
    column becomes a pandas ``category`` with the model's categories (a value it never saw
    is missing, as XGBoost and LightGBM treat one)."""
    try:
        import pandas as pd
    except ImportError:
        raise LoadError(
            "the model was fitted on a pandas DataFrame, and pandas is not installed in the "
            "server's environment: pip install pandas"
        ) from None

    def frame(columns: Arrays) -> Any:
        # infer_objects: text and datetimes arrive as object arrays; the model was fitted
        # on the dtypes pandas itself gives such columns.
        table = pd.DataFrame(columns, copy=False).infer_objects()
        for name, categories in categorical.items():
            if name in table:
                table[name] = pd.Categorical(table[name], categories=categories)
        return table

    return frame


def as_output(spec: TensorSpec, values: Any) -> np.ndarray:
    """A model's answer as an array of the declared datatype (labels as UTF-8 bytes)."""
    if hasattr(values, "to_numpy"):  # pandas Series or DataFrame
        if getattr(values, "ndim", 1) == 2 and values.shape[1] == 1:
            values = values.iloc[:, 0]
        values = values.to_numpy()
    array = np.asarray(values)
    if spec.datatype == "BYTES":
        out = np.empty(array.shape, dtype=object)
        flat = out.reshape(-1)
        for i, item in enumerate(array.flat):
            flat[i] = item if isinstance(item, bytes) else str(item).encode("utf-8")
        return out
    wanted = DATATYPES[spec.datatype].dtype
    if array.dtype == wanted:
        return array
    if array.dtype.kind in "biuf":
        return array.astype(wanted)
    raise Internal(
        f"output {spec.name!r} holds {array.dtype} values, not {spec.datatype}: declare its "
        "datatype under the model's `outputs:` in serve.yaml"
    )
