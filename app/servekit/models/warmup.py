"""Model warm-up (serve.yaml ``warmup:``, Triton's ``model_warmup``): samples run when a version
loads, in the loading thread, before the version is READY.

The first requests to a freshly loaded model otherwise pay for lazy initialisation (ONNX
Runtime's first run allocates and plans, a Python model fills its caches) and, here, for the
executor's first measurements. A sample is built from its inputs (zeros, random values or a
file's raw values, with ``batchSize`` rows when the model batches) and run ``count`` times on
every instance; the outputs are dropped. A sample that fails makes the version UNAVAILABLE with
the reason (:class:`WarmupError`), as Triton does. Because the repository builds a reloaded
version beside the serving one and swaps only once it is READY, a reload is warm before it
takes traffic.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import onnx

from servekit.config.compiler import ModelPlan
from servekit.config.schema import WarmupInput, WarmupSample
from servekit.datatypes import DataType, element_count, from_config_name
from servekit.errors import ServeError
from servekit.formats.onnx_files import parse_file
from servekit.runtimes.base import Arrays, ModelRuntime, Predict, predict_stream

MAX_ELEMENTS = 1 << 26
"""Largest warm-up input (elements, batch included): a typo in dims must not fill memory."""


class WarmupError(Exception):
    """A warm-up sample could not be built or failed: the version's reason."""


def warm_up(plan: ModelPlan, runtime: ModelRuntime, base_dir: Path) -> tuple[int, float]:
    """Run ``plan``'s warm-up samples on every instance of ``runtime``; return how many calls
    ran and the seconds they took (0, 0.0 without samples). Raises WarmupError."""
    samples = plan.config.warmup if plan.config is not None else []
    if not samples:
        return 0, 0.0
    predictors: list[Predict] = [runtime.predictor(i) for i in range(max(1, plan.instances))]
    outputs = [spec.name for spec in runtime.signature.outputs]
    decoupled = runtime.decoupled
    started = time.perf_counter()
    calls = 0
    for sample in samples:
        feed = build_inputs(sample, plan.max_batch_size, base_dir)
        for predict in predictors:
            for _ in range(sample.count):
                try:
                    if decoupled:  # its stream runs on an event loop: one of its own, here
                        asyncio.run(_drain(runtime, feed, outputs))
                    else:
                        predict(feed, outputs)
                except ServeError as exc:
                    raise WarmupError(
                        f"warm-up sample {sample.name!r} failed: {exc.message}"
                    ) from exc
                except Exception as exc:
                    raise WarmupError(
                        f"warm-up sample {sample.name!r} failed: {type(exc).__name__}: {exc}"
                    ) from exc
                calls += 1
    return calls, time.perf_counter() - started


async def _drain(runtime: ModelRuntime, feed: Arrays, outputs: list[str]) -> None:
    stream = predict_stream(runtime, feed, outputs)
    try:
        async for _ in stream:
            pass
    finally:
        await stream.aclose()


def build_inputs(sample: WarmupSample, max_batch_size: int, base_dir: Path) -> Arrays:
    """The sample's input arrays (``batchSize`` rows first when the model batches)."""
    if max_batch_size > 0 and not 1 <= sample.batch_size <= max_batch_size:
        raise WarmupError(
            f"warm-up sample {sample.name!r}: batchSize {sample.batch_size} is not between 1 "
            f"and the model's maxBatchSize {max_batch_size}"
        )
    rows = sample.batch_size if max_batch_size > 0 else None
    return {
        name: _array(sample.name, name, spec, rows, base_dir)
        for name, spec in sample.inputs.items()
    }


def _array(
    sample: str, name: str, spec: WarmupInput, rows: int | None, base_dir: Path
) -> np.ndarray:
    where = f"warm-up sample {sample!r}, input {name!r}"
    try:
        datatype = from_config_name(spec.data_type)
    except ServeError as exc:
        raise WarmupError(f"{where}: {exc.message}") from None
    one = tuple(spec.dims)
    shape = (rows, *one) if rows is not None else one
    if element_count(shape) > MAX_ELEMENTS:
        raise WarmupError(f"{where}: {element_count(shape)} elements is over {MAX_ELEMENTS}")
    if spec.input_data_file is not None:
        single = _from_file(where, spec.input_data_file, datatype, one, base_dir)
        return np.broadcast_to(single, shape).copy() if rows is not None else single
    if spec.zero_data:
        if datatype.is_bytes:
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, dtype=datatype.dtype)
    rng = np.random.default_rng(0)
    if datatype.is_bytes:
        digits = rng.integers(0, 10_000, size=shape)
        texts = np.empty(shape, dtype=object)
        texts.reshape(-1)[:] = [str(v).encode() for v in digits.reshape(-1)]
        return texts
    kind = datatype.dtype.kind
    if kind == "f":
        return rng.random(shape).astype(datatype.dtype)
    if kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    return rng.integers(0, 100, size=shape).astype(datatype.dtype)


def _from_file(
    where: str, name: str, datatype: DataType, shape: tuple[int, ...], base_dir: Path
) -> np.ndarray:
    path = base_dir / name
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise WarmupError(f"{where}: cannot read inputDataFile {name}: {exc.strerror}") from None
    count = element_count(shape)
    if not datatype.is_bytes:
        if len(data) != count * datatype.itemsize:
            raise WarmupError(
                f"{where}: inputDataFile {name} holds {len(data)} bytes; dims {list(shape)} of "
                f"{datatype.name} need {count * datatype.itemsize}"
            )
        return np.frombuffer(data, dtype=datatype.dtype).reshape(shape).copy()
    items: list[bytes] = []
    offset = 0
    while offset < len(data) and len(items) < count:
        size = int.from_bytes(data[offset : offset + 4], "little")
        items.append(data[offset + 4 : offset + 4 + size])
        offset += 4 + size
    if len(items) != count or offset != len(data):
        raise WarmupError(
            f"{where}: inputDataFile {name} does not hold {count} length-prefixed BYTES elements"
        )
    out = np.empty(count, dtype=object)
    out[:] = items
    return out.reshape(shape)


def warmup_problems(plan: ModelPlan) -> list[str]:
    """Why ``plan``'s warm-up samples would fail the load, where the model file tells without
    loading it (``servekit validate``): an ONNX model's graph inputs give their names and
    shapes, so a sample naming another input, or whose dims (with ``batchSize`` rows when the
    model batches) do not fit the input's shape, is reported. Other formats say their shapes
    only once loaded: nothing is checked for them here."""
    samples = plan.config.warmup if plan.config is not None else []
    if not samples or plan.implementation != "onnxruntime":
        return []
    problems: list[str] = []
    for source in plan.versions:
        if source.path is None or not source.path.is_file():
            continue
        model = parse_file(source.path)
        if model is None:
            continue
        shapes = _graph_input_shapes(model)
        for sample in samples:
            rows = (sample.batch_size,) if plan.max_batch_size > 0 else ()
            for name, spec in sample.inputs.items():
                where = f"version {source.version}: warm-up sample {sample.name!r}, input {name!r}"
                if name not in shapes:
                    known = ", ".join(shapes) or "none"
                    problems.append(f"{where}: the model has no such input (its inputs: {known})")
                    continue
                shape = (*rows, *spec.dims)
                want = shapes[name]
                if want is not None and not _fits(shape, want):
                    shown = [d if d >= 0 else -1 for d in want]
                    problems.append(
                        f"{where}: shape {list(shape)} does not fit the model's input shape "
                        f"{shown}" + (" (batchSize rows, then dims)" if rows else "")
                    )
    return problems


def _graph_input_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...] | None]:
    """Each graph input that is not an initializer, with its shape (-1 for a symbolic or
    unknown dimension; None when the file gives no shape)."""
    initializers = {t.name for t in model.graph.initializer}
    shapes: dict[str, tuple[int, ...] | None] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            shapes[value.name] = None
            continue
        shapes[value.name] = tuple(
            d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim
        )
    return shapes


def _fits(shape: tuple[int, ...], want: tuple[int, ...]) -> bool:
    return len(shape) == len(want) and all(
        w < 0 or s == w for s, w in zip(shape, want, strict=True)
    )
