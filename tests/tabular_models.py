"""Estimators the tabular tests pickle (importable by the server that unpickles them)."""

from __future__ import annotations

from typing import Any

import numpy as np


class DtypeEcho:
    """Predicts, per row, each column's pandas dtype and value: what the model was handed."""

    def __init__(self, columns: list[str]) -> None:
        self.feature_names_in_ = np.asarray(columns, dtype=object)
        self.n_features_in_ = len(columns)

    def predict(self, frame: Any) -> np.ndarray:
        return np.asarray(
            [
                "|".join(f"{c}:{frame[c].dtype}={frame[c].iloc[i]}" for c in frame.columns)
                for i in range(len(frame))
            ],
            dtype=object,
        )


def make_scorer() -> Any:
    """An MLflow PythonModel: ``amount * count + len(tag)``. Defined in a function so that
    cloudpickle stores the class by value (the server that loads it need not import this)."""
    import mlflow.pyfunc

    class Scorer(mlflow.pyfunc.PythonModel):  # type: ignore[misc]
        def predict(self, context, model_input, params=None):  # type: ignore[no-untyped-def]
            # No type hints: MLflow reads them to check inputs, and warns on Any.
            return model_input["amount"] * model_input["count"] + model_input["tag"].str.len()

    return Scorer()
