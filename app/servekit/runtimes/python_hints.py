"""Metadata of a Python model from its type hints and the inputs/outputs declared in serve.yaml.

Declared values win; a hint fills what the declaration leaves out. Inputs are passed by name
(one keyword argument per input) when every input name is a parameter of the function, else as
one dict when the function takes a single argument. Datatypes come from
``NDArray[np.float32]``-style hints (or ``str``/``bytes``/``float``/``int``/``bool`` and lists of
them), shapes from ``Annotated[..., (-1, 4)]`` (default ``[-1]``), several outputs from a
``TypedDict`` return type. A generator's return hint (``Iterator[str]``,
``AsyncIterator[Out]``, ...) describes each item it yields.
"""

from __future__ import annotations

import collections.abc
import inspect
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from servekit.datatypes import DATATYPES, from_numpy
from servekit.errors import InvalidArgument
from servekit.runtimes.base import LoadError
from servekit.runtimes.python_stream import is_generator_function
from servekit.types import ModelSignature, TensorSpec

if TYPE_CHECKING:  # annotations only: the isolated child imports this without pydantic
    from servekit.config.schema import TensorOverride

DEFAULT_SHAPE: tuple[int, ...] = (-1,)
_STREAMS = (
    collections.abc.Iterator,
    collections.abc.Iterable,
    collections.abc.Generator,
    collections.abc.AsyncIterator,
    collections.abc.AsyncIterable,
    collections.abc.AsyncGenerator,
)
_SCALARS: dict[Any, str] = {float: "FP64", int: "INT64", bool: "BOOL", str: "BYTES", bytes: "BYTES"}
Hint = tuple[str | None, tuple[int, ...] | None]


def hint_of(annotation: Any) -> Hint:
    """(datatype, shape) a type hint describes; None where it says nothing."""
    datatype: str | None = None
    shape: tuple[int, ...] | None = None
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extras = typing.get_args(annotation)
        for extra in extras:
            if isinstance(extra, tuple | list) and all(isinstance(d, int) for d in extra):
                shape = tuple(extra)
            elif isinstance(extra, str) and extra in DATATYPES:
                datatype = extra
        inner, _ = hint_of(base)
        return datatype or inner, shape
    if annotation in _SCALARS:
        return _SCALARS[annotation], None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple) and args and args[0] in _SCALARS:
        return _SCALARS[args[0]], None
    if origin is np.ndarray and len(args) == 2:
        dtype_args = typing.get_args(args[1])
        if dtype_args and isinstance(dtype_args[0], type) and issubclass(dtype_args[0], np.generic):
            try:
                return from_numpy(np.dtype(dtype_args[0])).name, None
            except InvalidArgument:
                return None, None
    return None, None


def _hints(func: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(func, include_extras=True)
    except Exception:  # unresolvable forward references: behave as if unannotated
        return {}


def _spec(name: str, kind: str, declared: TensorOverride | None, hint: Hint) -> TensorSpec:
    datatype = (declared.datatype if declared else None) or hint[0]
    if datatype is None:
        raise LoadError(
            f"{kind} {name!r} has no datatype: declare it in serve.yaml ({kind}s: - name: "
            f"{name}, datatype: FP32, shape: [-1]) or annotate it, e.g. NDArray[np.float32]"
        )
    if datatype not in DATATYPES:
        raise LoadError(f"{kind} {name!r}: unknown datatype {datatype!r}")
    declared_shape = declared.shape if declared and declared.shape is not None else None
    shape = tuple(declared_shape) if declared_shape is not None else hint[1] or DEFAULT_SHAPE
    return TensorSpec(name, datatype, shape)


def _is_mapping(annotation: Any) -> bool:
    origin = typing.get_origin(annotation) or annotation
    return origin in (dict, typing.Mapping) or (
        isinstance(origin, type) and issubclass(origin, dict)
    )


def signature_of(
    func: Callable[..., Any],
    inputs: tuple[TensorOverride, ...] | None,
    outputs: tuple[TensorOverride, ...] | None,
) -> tuple[ModelSignature, bool]:
    """The model's signature and whether inputs are passed by name (else as one dict)."""
    try:
        params = [
            p
            for p in inspect.signature(func).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    hints = _hints(func)
    names = [p.name for p in params]
    if inputs:
        by_name = all(t.name in names for t in inputs) and not (
            len(params) == 1 and _is_mapping(hints.get(params[0].name))
        )
        if not by_name and len(params) != 1:
            raise LoadError(
                f"predict takes ({', '.join(names)}): give one argument (a dict of inputs) or one "
                f"argument per input ({', '.join(t.name for t in inputs)})"
            )
        in_specs = [
            _spec(t.name, "input", t, hint_of(hints.get(t.name)) if by_name else (None, None))
            for t in inputs
        ]
    else:
        if len(params) == 1 and (_is_mapping(hints.get(names[0])) or names[0] not in hints):
            raise LoadError(
                "predict takes one dict of inputs: declare the inputs (name, datatype, shape) "
                "in serve.yaml, or take one annotated argument per input"
            )
        if not params:
            raise LoadError("predict takes no arguments: it needs at least one input")
        by_name = True
        in_specs = [_spec(n, "input", None, hint_of(hints.get(n))) for n in names]
    returns = hints.get("return")
    if is_generator_function(func):
        out_specs = _outputs(_yielded(returns), outputs)
    elif not outputs and _is_mapping(returns) and not _typed_dict_fields(returns):
        out_specs = _probe_outputs(func, tuple(in_specs), by_name, _value_hint(returns))
    else:
        out_specs = _outputs(returns, outputs)
    return ModelSignature(tuple(in_specs), out_specs), by_name


def _yielded(annotation: Any) -> Any:
    """What each item of ``Iterator[X]`` (or Generator, AsyncIterator, ...) is: X."""
    if typing.get_origin(annotation) in _STREAMS:
        args = typing.get_args(annotation)
        return args[0] if args else None
    return annotation


def _value_hint(annotation: Any) -> Hint:
    """What ``dict[str, NDArray[np.float32]]`` says of each value (nothing for a bare dict)."""
    args = typing.get_args(annotation)
    return hint_of(args[1]) if len(args) == 2 else (None, None)


def _probe_outputs(
    func: Callable[..., Any], inputs: tuple[TensorSpec, ...], by_name: bool, value: Hint
) -> tuple[TensorSpec, ...]:
    """Outputs of a model annotated ``-> dict[str, NDArray]``: the names are only in the dict
    it returns, so it is called once at load on one row of zeros per input (datatype from the
    value hint, else from each array; shape ``[-1, ...]`` as returned for one row)."""
    feed = {s.name: _zeros(s) for s in inputs}
    try:
        result = func(**feed) if by_name else func(feed)
    except Exception as exc:
        raise LoadError(
            "predict returns a dict, so servekit called it once on zeros to learn its outputs, "
            f"and it raised {type(exc).__name__}: {exc}; declare the outputs in serve.yaml "
            "(outputs: - name: ..., datatype: FP32, shape: [-1]) or return a TypedDict"
        ) from None
    if not isinstance(result, dict) or not result:
        raise LoadError(
            f"predict is annotated to return a dict but returned {type(result).__name__}; "
            "declare the outputs or fix the annotation"
        )
    specs = []
    for name, array in result.items():
        found = np.asarray(array)
        try:
            datatype = value[0] or from_numpy(found.dtype).name
        except InvalidArgument:
            datatype = "BYTES"
        shape = value[1] or ((-1, *found.shape[1:]) if found.ndim else DEFAULT_SHAPE)
        specs.append(TensorSpec(str(name), datatype, tuple(shape)))
    return tuple(specs)


def _zeros(spec: TensorSpec) -> np.ndarray:
    shape = tuple(1 if d < 0 else d for d in spec.shape)
    if spec.datatype == "BYTES":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=DATATYPES[spec.datatype].dtype)


def _outputs(returns: Any, declared: tuple[TensorOverride, ...] | None) -> tuple[TensorSpec, ...]:
    fields = _typed_dict_fields(returns)
    if declared:
        single = hint_of(returns) if len(declared) == 1 else (None, None)
        if _is_mapping(returns):
            single = _value_hint(returns)
        return tuple(
            _spec(t.name, "output", t, hint_of(fields[t.name]) if t.name in fields else single)
            for t in declared
        )
    if fields:
        return tuple(_spec(n, "output", None, hint_of(h)) for n, h in fields.items())
    if returns is None or _is_mapping(returns):
        raise LoadError(
            "the outputs are unknown: declare them in serve.yaml (outputs: - name: output, "
            "datatype: FP32, shape: [-1]) or annotate the return type, e.g. NDArray[np.float32]"
        )
    return (_spec("output", "output", None, hint_of(returns)),)


def _typed_dict_fields(annotation: Any) -> dict[str, Any]:
    if isinstance(annotation, type) and typing.is_typeddict(annotation):
        return typing.get_type_hints(annotation, include_extras=True)
    return {}


def guessed_output_shapes(
    func: Callable[..., Any], declared: tuple[TensorOverride, ...] | None
) -> frozenset[str]:
    """Outputs whose shape neither serve.yaml nor a type hint gives (``DEFAULT_SHAPE`` was
    assumed): their rank is a guess, so the server checks only their datatype."""
    returns = _hints(func).get("return")
    fields = _typed_dict_fields(returns)
    if declared:
        names = [t.name for t in declared]
        single = hint_of(returns) if len(declared) == 1 else (None, None)
    else:
        names = list(fields) or ["output"]
        single = (None, None) if fields else hint_of(returns)
    guessed = set()
    for name in names:
        entry = next((t for t in declared or () if t.name == name), None)
        if entry is not None and entry.shape is not None:
            continue
        hint = hint_of(fields[name]) if name in fields else single
        if hint[1] is None:
            guessed.add(name)
    return frozenset(guessed)
