"""ONNX Runtime: one InferenceSession per instance, created once at load, never per request.

Metadata comes from the session (names, element types, shapes with -1 for symbolic dims), with
serve.yaml overrides applied. Load failures are turned into reasons a user can act on: a missing
file, a Git-LFS pointer instead of the model, a file that is not ONNX, a bad option, external data
outside the model's folder (checked by app/servekit/formats/onnx_files.py before any session exists,
so such a file is never read). Reasons may name absolute paths: the repository rewrites them before
a client sees them (app/servekit/shown_paths.py)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from servekit.config.compiler import ModelPlan, ResolvedOptions
from servekit.config.versions import VersionSource
from servekit.errors import Internal, InvalidArgument
from servekit.formats import onnx_files
from servekit.runtimes.base import Arrays, LoadError, Predict, apply_overrides
from servekit.shown_paths import hide_paths
from servekit.types import ModelSignature, TensorSpec

PLATFORM = "onnxruntime_onnx"

ONNX_TO_V2: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def session_options(options: ResolvedOptions) -> ort.SessionOptions:
    """SessionOptions from resolved runtime options."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = options.intra_op_threads
    so.inter_op_num_threads = options.inter_op_threads
    so.graph_optimization_level = _OPT_LEVELS[options.graph_optimization_level]
    # Spinning threads burn a core between requests; the server shares cores with its I/O.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def check_model_file(path: Path | None) -> Path:
    """Fail early, with a useful reason, on files that are clearly not a model."""
    if path is None or not path.exists():
        raise LoadError(f"model file {path} does not exist")
    with path.open("rb") as fh:
        head = fh.read(200)
    if head.startswith(b"version https://git-lfs"):
        raise LoadError(
            f"{path} is a Git LFS pointer, not the model: run `git lfs pull` to fetch the file"
        )
    if not head:
        raise LoadError(f"{path} is empty")
    return path


def _spec(arg: Any) -> TensorSpec:
    datatype = ONNX_TO_V2.get(arg.type)
    if datatype is None:
        if arg.type.startswith("seq(map("):
            # skl2onnx's default for classifiers: probabilities as a list of {class: p} maps.
            raise LoadError(
                f"output {arg.name!r} is a sequence of maps (scikit-learn's ZipMap), which V2 "
                "cannot carry: convert the model again without it, skl2onnx.to_onnx(model, X, "
                "options={id(clf): {'zipmap': False}}) (or add_model the estimator itself: "
                "servekit converts it without ZipMap)"
            )
        raise LoadError(f"tensor {arg.name!r} has ONNX type {arg.type}, which V2 cannot carry")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
    return TensorSpec(arg.name, datatype, shape)


class OnnxModel:
    """A loaded ONNX model version with ``instances`` sessions used in turn."""

    platform = PLATFORM
    may_run_inline = True  # pure computation, timed by the executor (runtimes/base.py)
    decoupled = False
    loose_outputs: frozenset[str] = frozenset()
    note = ""

    def __init__(
        self,
        sessions: list[ort.InferenceSession],
        signature: ModelSignature,
        outputs_overridden: bool = False,
    ) -> None:
        self._sessions = sessions
        self.outputs_trusted = not outputs_overridden
        """onnxruntime returns the graph's own output types and ranks; only serve.yaml output
        overrides can make the metadata differ, so without them outputs are not re-checked
        (app/servekit/services/execution/outputs.py) on the hot path."""
        self._runs = [(session, _direct_run(session)) for session in sessions]
        self._next = itertools.cycle(self._runs).__next__
        self._required = frozenset(
            i.name for i in sessions[0].get_inputs() if not i.type.startswith("optional")
        )
        """Inputs onnxruntime's Python ``run`` insists on (its ``_validate_input``)."""
        self._required_one = next(iter(self._required)) if len(self._required) == 1 else None
        """The one required input of the usual model: a dict lookup, where the subset test of
        a set against the feed's keys view costs some 1,400 instructions per request."""
        self.signature = signature
        self._string_inputs = {s.name for s in signature.inputs if s.datatype == "BYTES"}
        self._string_outputs = {s.name for s in signature.outputs if s.datatype == "BYTES"}

    def predict(self, inputs: Arrays, outputs: list[str], run: _Run | None = None) -> Arrays:
        """The model's outputs ``outputs`` for ``inputs``, on the next session in turn (or on
        ``run``'s: ``predictor``). One frame for the common call (the hot path)."""
        session, direct = self._next() if run is None else run
        feed = inputs
        if self._string_inputs:
            feed = dict(inputs)
            for name in self._string_inputs:
                feed[name] = _bytes_to_str(name, inputs[name])
        try:
            # The C session's run, without the Python wrapper's per-call checks, when they
            # cannot fail: outputs named, every required input given (the inputs are numpy
            # arrays from our codecs, never another session's OrtValues). Else, and when an
            # execution provider fails (the wrapper's fallback), the wrapper's run.
            one = self._required_one
            if (
                direct is not None
                and outputs
                and (one in feed if one is not None else self._required <= feed.keys())
            ):
                try:
                    results = direct(outputs, feed, None)
                except _EP_FAIL:
                    results = session.run(outputs, feed)
            else:
                results = session.run(outputs, feed)
        except (ort.capi.onnxruntime_pybind11_state.InvalidArgument, ValueError) as exc:
            why = hide_paths(str(exc))
            raise InvalidArgument(f"onnxruntime rejected the input: {why}") from None
        except Exception as exc:  # an ORT failure during compute is not the client's fault
            raise Internal(f"onnxruntime failed: {hide_paths(str(exc))}") from None
        if len(outputs) == 1 and len(results) == 1:  # the usual one output: no zip
            out = {outputs[0]: results[0]}
        else:
            out = dict(zip(outputs, results, strict=True))
        if self._string_outputs:
            for name in self._string_outputs.intersection(out):
                out[name] = _str_to_bytes(out[name])
        return out

    def predictor(self, index: int) -> Predict:
        """Instance ``index``'s session alone (one worker thread each)."""
        run = self._runs[index]
        return lambda inputs, outputs: self.predict(inputs, outputs, run)

    def close(self) -> None:
        self._sessions.clear()
        self._runs.clear()


_Run = tuple[ort.InferenceSession, Any]
"""A session and its C session's ``run`` (None: only the Python wrapper's may be used)."""
_EP_FAIL = ort.capi.onnxruntime_pybind11_state.EPFail


def _direct_run(session: ort.InferenceSession) -> Any:
    """The C session's ``run`` (what ``InferenceSession.run`` calls after its checks), or None
    where the wrapper's checks matter per call: WebGPU graph capture, or an onnxruntime whose
    wrapper is not laid out as expected."""
    inner = getattr(session, "_sess", None)
    run = getattr(inner, "run", None)
    capture = getattr(inner, "is_webgpu_graph_capture_enabled", None)
    if run is None or capture is None or capture():
        return None
    return run


def _bytes_to_str(name: str, array: np.ndarray) -> np.ndarray:
    """ONNX string tensors hold UTF-8 text: decode, refusing bytes that are not text."""
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.flat):
        try:
            flat[i] = item.decode("utf-8") if isinstance(item, bytes) else item
        except UnicodeDecodeError:
            raise InvalidArgument(
                f"input {name!r}: element {i} is not UTF-8, but ONNX string inputs hold text"
            ) from None
    return out


def _str_to_bytes(array: np.ndarray) -> np.ndarray:
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.flat):
        flat[i] = item.encode("utf-8") if isinstance(item, str) else item
    return out


def load(plan: ModelPlan, version: VersionSource) -> OnnxModel:
    """Create the sessions of one version; raises LoadError with a user-facing reason."""
    path = check_model_file(version.path)
    problem = onnx_files.check_model_file(path)
    if problem is not None:
        raise LoadError(f"{path} {problem}")
    providers = list(plan.options.execution_providers)
    unknown = [p for p in providers if p not in ort.get_available_providers()]
    if unknown:
        raise LoadError(
            f"execution provider(s) {', '.join(unknown)} not available; this onnxruntime has "
            f"{', '.join(ort.get_available_providers())}"
        )
    try:
        sessions = [
            ort.InferenceSession(str(path), session_options(plan.options), providers=providers)
            for _ in range(plan.instances)
        ]
    except Exception as exc:
        text = str(exc)
        if "Protobuf parsing failed" in text or "INVALID_PROTOBUF" in text:
            raise LoadError(f"{path} is not a valid ONNX model (protobuf parsing failed)") from None
        raise LoadError(f"onnxruntime could not load {path}: {text}") from None
    first = sessions[0]
    try:
        inputs = apply_overrides(tuple(_spec(a) for a in first.get_inputs()), plan.inputs, "input")
        outputs = apply_overrides(
            tuple(_spec(a) for a in first.get_outputs()), plan.outputs, "output"
        )
    except InvalidArgument as exc:
        raise LoadError(exc.message) from None
    return OnnxModel(sessions, ModelSignature(inputs, outputs), bool(plan.outputs))
