"""Metadata of a Python model from its type hints and the inputs/outputs declared in serve.yaml.

Declared values win; a hint fills what the declaration leaves out. Inputs are passed by name
(one keyword argument per input) when every input name is a parameter of the function, else as
one dict when the function takes a single argument. Datatypes come from
``NDArray[np.float32]``-style hints (or ``str``/``bytes``/``float``/``int``/``bool`` and lists of
them), shapes from ``Annotated[..., (-1, 4)]`` (default ``[-1]``), several outputs from a
``TypedDict`` return type.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from app.datatypes import DATATYPES, from_numpy
from app.errors import InvalidArgument
from app.runtimes.base import LoadError
from app.types import ModelSignature, TensorSpec

if TYPE_CHECKING:  # annotations only: the isolated child imports this without pydantic
    from app.config.schema import TensorOverride

DEFAULT_SHAPE: tuple[int, ...] = (-1,)
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
    return ModelSignature(tuple(in_specs), _outputs(hints.get("return"), outputs)), by_name


def _outputs(returns: Any, declared: tuple[TensorOverride, ...] | None) -> tuple[TensorSpec, ...]:
    fields = _typed_dict_fields(returns)
    if declared:
        single = hint_of(returns) if len(declared) == 1 else (None, None)
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
