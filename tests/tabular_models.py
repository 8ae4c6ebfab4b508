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
