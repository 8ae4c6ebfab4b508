"""``convert: onnx``: a native scikit-learn, XGBoost or LightGBM model served by ONNX Runtime.

The native model loads first (app/servekit/runtimes/sklearn.py, ...). Then it is converted
(skl2onnx; onnxmltools for XGBoost and LightGBM), both models run the same sample rows, and the ONNX
model serves only when every output the native one has agrees within
``servekit.formats.tabular_onnx.TOLERANCE`` (app/servekit/formats/tabular_onnx.py says how rows are
drawn). The served model keeps the native model's metadata (inputs, ``predict``, ``predict_proba``),
so clients see no difference but the speed; its platform becomes ``onnxruntime_onnx`` and its READY
reason says it was converted. When the conversion fails or disagrees, the native model serves, and
the reason (a warning in the log, the version's reason in the index and on the dashboard) says why.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import numpy as np
import onnxruntime as ort

from servekit.config.compiler import ModelPlan
from servekit.errors import Internal, InvalidArgument
from servekit.formats import tabular_onnx
from servekit.formats.tabular_onnx import ConversionError, Match
from servekit.runtimes.base import Arrays, Predict
from servekit.runtimes.onnx import session_options
from servekit.runtimes.tabular import PREDICT_PROBA, TabularModel, as_output
from servekit.shown_paths import hide_paths

log = logging.getLogger("servekit.runtimes")

PLATFORM = "onnxruntime_onnx"
CONVERTERS = {"sklearn": "skl2onnx", "xgboost": "onnxmltools", "lightgbm": "onnxmltools"}


def maybe_convert(plan: ModelPlan, native: TabularModel, model: Any) -> TabularModel | Converted:
    """``native`` as it is unless serve.yaml says ``convert: onnx``; then the ONNX model when
    it converts and agrees, else ``native`` with the reason it serves as its note."""
    if plan.config is None or plan.config.convert != "onnx":
        return native
    try:
        return convert(plan, native, model)
    except ConversionError as exc:
        why = hide_paths(str(exc))
    except Exception as exc:  # onnxruntime refusing the converted model, ...
        why = f"{type(exc).__name__}: {hide_paths(str(exc))[:300]}"
    native.note = f"convert: onnx failed, served natively by {native.platform}: {why}"
    log.warning("%s: %s", plan.name, native.note)
    return native


def convert(plan: ModelPlan, native: TabularModel, model: Any) -> Converted:
    """The ONNX model of ``model`` (ConversionError when it cannot be, or disagrees)."""
    specs = native.layout.inputs
    text = [s.name for s in specs if s.datatype == "BYTES"]
    if text:
        raise ConversionError(
            f"input(s) {', '.join(text)} are text; the converted model takes numbers only"
        )
    features = len(specs) if native.layout.columns else int(specs[0].shape[-1])
    if features <= 0:
        raise ConversionError(
            "the model does not say how many features it takes: declare its input-0 shape "
            "[-1, F] under `inputs:`"
        )
    data = tabular_onnx.to_onnx(model, features)
    options = session_options(plan.options)
    providers = list(plan.options.execution_providers)
    sessions = [
        ort.InferenceSession(data, options, providers=providers) for _ in range(plan.instances)
    ]
    rows = tabular_onnx.sample_rows(model, features)
    feed = _native_feed(native, rows)
    wanted = [s.name for s in native.signature.outputs]
    expected = native.predict(feed, wanted)
    order = [o.name for o in sessions[0].get_outputs()]
    got = dict(zip(order, sessions[0].run(None, {"X": _matrix(native, feed)}), strict=True))
    matches = tabular_onnx.match_outputs(expected, got, order, PREDICT_PROBA)
    library = tabular_onnx.library_of(model) or "?"
    converted = Converted(native, sessions, matches)
    converted.note = (
        f"converted to ONNX at load by {CONVERTERS.get(library, '?')}; its outputs matched "
        f"{native.platform}'s on {len(rows)} sample rows ({tabular_onnx.TOLERANCE})"
    )
    log.info("%s: %s", plan.name, converted.note)
    native.close()
    return converted


def _native_feed(native: TabularModel, rows: np.ndarray) -> Arrays:
    """The sample rows as the DataPlane hands them to the native model."""
    specs = native.layout.inputs
    if native.layout.columns:
        return {s.name: _cast(rows[:, i], s.datatype) for i, s in enumerate(specs)}
    return {specs[0].name: _cast(rows, specs[0].datatype)}


def _cast(values: np.ndarray, datatype: str) -> np.ndarray:
    from servekit.datatypes import DATATYPES

    dtype = DATATYPES[datatype].dtype
    if dtype.kind in "iub":
        values = np.rint(values)
    return values.astype(dtype)


def _matrix(native: TabularModel, inputs: Arrays) -> np.ndarray:
    """The request's features as the ONNX model's FP32 ``X`` (columns side by side)."""
    specs = native.layout.inputs
    try:
        if native.layout.columns:
            return np.column_stack([inputs[s.name] for s in specs]).astype(np.float32)
        return np.asarray(inputs[specs[0].name]).astype(np.float32, copy=False)
    except (TypeError, ValueError) as exc:  # an object matrix holding text, ...
        raise InvalidArgument(f"the converted model takes numbers only: {exc}") from None


class Converted:
    """The ONNX model answering for a native one (see the module docstring)."""

    platform = PLATFORM
    may_run_inline = True  # ONNX Runtime: pure computation, timed by the executor
    decoupled = False
    outputs_trusted = False

    def __init__(
        self, native: TabularModel, sessions: list[ort.InferenceSession], matches: dict[str, Match]
    ) -> None:
        self.layout = native.layout
        self.signature = native.signature
        self.loose_outputs = native.loose_outputs
        self.note = ""
        self._native = native
        self._sessions = sessions
        self._next = itertools.cycle(sessions).__next__
        self._matches = matches

    def predict(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        return self._run(self._next(), inputs, outputs)

    def predictor(self, index: int) -> Predict:
        session = self._sessions[index]
        return lambda inputs, outputs: self._run(session, inputs, outputs)

    def _run(self, session: ort.InferenceSession, inputs: Arrays, outputs: list[str]) -> Arrays:
        feed = {"X": _matrix(self._native, inputs)}
        names = list(dict.fromkeys(self._matches[o].onnx_output for o in outputs))
        try:
            values = dict(zip(names, session.run(names, feed), strict=True))
        except (ort.capi.onnxruntime_pybind11_state.InvalidArgument, ValueError) as exc:
            why = hide_paths(str(exc))
            raise InvalidArgument(f"onnxruntime rejected the input: {why}") from None
        except Exception as exc:
            raise Internal(f"onnxruntime failed: {hide_paths(str(exc))}") from None
        index = self.signature.output_index
        return {
            o: as_output(index[o], self._matches[o](values[self._matches[o].onnx_output]))
            for o in outputs
        }

    def close(self) -> None:
        self._sessions.clear()
