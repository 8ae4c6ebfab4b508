"""MLflow models (``modelFormat: mlflow``): an MLmodel folder, loaded as a pyfunc model.

Any flavour with the ``python_function`` flavour loads (scikit-learn, XGBoost, LightGBM, a
custom PythonModel). A pyfunc model is pickled code (a custom PythonModel is cloudpickled), so
it is declared in serve.yaml only, never pushed. The model's signature gives the metadata: a
column-based input schema makes one input per column with its datatype (the model is given a
DataFrame), a tensor-based one a single input; the output schema's type is ``predict``'s
datatype, and a tensor output schema its shape ([-1, 2] for two probabilities per row).
Without a signature: one ``input-0`` matrix and FP64 ``predict``, unless serve.yaml declares
``inputs``/``outputs``. MLflow checks inputs against the signature itself; a request it refuses
is a 400 with its message.
"""

from __future__ import annotations

import warnings
from typing import Any

from servekit.config.compiler import ModelPlan
from servekit.config.versions import VersionSource
from servekit.datatypes import from_numpy
from servekit.runtimes.base import LoadError
from servekit.runtimes.tabular import (
    PREDICT,
    Instance,
    TabularLayout,
    TabularModel,
    columns_layout,
    matrix_layout,
    plan_layout,
    plan_outputs,
    require,
)
from servekit.types import TensorSpec

PLATFORM = "mlflow"
_TYPES = {
    "boolean": "BOOL",
    "integer": "INT32",
    "long": "INT64",
    "float": "FP32",
    "double": "FP64",
    "string": "BYTES",
    "binary": "BYTES",
    "datetime": "BYTES",
}
"""MLflow's column types -> V2 datatypes (datetimes travel as ISO 8601 text, content_type
``datetime``; binary as bytes, ``base64`` in JSON)."""


def load(plan: ModelPlan, version: VersionSource) -> TabularModel:
    """``instances`` copies of the pyfunc model; LoadError with a reason a user can act on."""
    require("mlflow", "mlflow", "MLflow")
    if version.path is None or not (version.path / "MLmodel").is_file():
        raise LoadError(f"no MLmodel file in {version.path}")
    with warnings.catch_warnings():  # MLflow's own import warns about its type hints
        warnings.simplefilter("ignore", UserWarning)
        import mlflow.pyfunc
        from mlflow.exceptions import MlflowException

    try:
        with warnings.catch_warnings():  # and about a PythonModel without type hints
            warnings.simplefilter("ignore", UserWarning)
            models = [mlflow.pyfunc.load_model(str(version.path)) for _ in range(plan.instances)]
    except ModuleNotFoundError as exc:
        raise LoadError(
            f"the MLflow model in {version.path} needs the module {exc.name!r}, which is not "
            "installed in the server's environment (see its requirements.txt)"
        ) from None
    except Exception as exc:
        raise LoadError(f"MLflow could not load {version.path}: {exc}") from None
    metadata = models[0].metadata
    return TabularModel(
        PLATFORM,
        plan_layout(plan, _layout(metadata.get_input_schema())),
        plan_outputs(plan, (_predict_spec(metadata.get_output_schema()),)),
        [Instance({PREDICT: m.predict}) for m in models],
        (ValueError, TypeError, KeyError, MlflowException),
    )


def _layout(schema: Any) -> TabularLayout:
    if schema is None:
        return matrix_layout(None)
    if schema.is_tensor_spec():
        spec = schema.inputs[0]
        shape = tuple(spec.shape)
        features = shape[1] if len(schema.inputs) == 1 and len(shape) == 2 else None
        return matrix_layout(features, from_numpy(spec.type).name)
    if not schema.has_input_names():
        return matrix_layout(len(schema.inputs), _TYPES.get(schema.inputs[0].type.name, "FP64"))
    return columns_layout(
        [str(c.name) for c in schema.inputs],
        [_TYPES.get(getattr(c.type, "name", ""), "FP64") for c in schema.inputs],
    )


def _predict_spec(schema: Any) -> TensorSpec:
    """``predict``: the output schema's type, and its shape when it is a tensor schema (a
    classifier's probabilities, ``[-1, 2]``), else one value per row."""
    shape: tuple[int, ...] = (-1,)
    if schema is not None and schema.is_tensor_spec() and len(schema.inputs) == 1:
        dims = tuple(int(d) for d in schema.inputs[0].shape)
        if len(dims) >= 2:
            shape = (-1, *dims[1:])
    return TensorSpec(PREDICT, _output_type(schema), shape)


def _output_type(schema: Any) -> str:
    if schema is None or len(schema.inputs) != 1:
        return "FP64"
    spec = schema.inputs[0]
    if schema.is_tensor_spec():
        return from_numpy(spec.type).name
    return _TYPES.get(getattr(spec.type, "name", ""), "FP64")
