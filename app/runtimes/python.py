"""Python models: a function or a class given by import path (``module:attr``), or an object.

A *function* takes numpy arrays, one keyword argument per input (``def f(x, y)``), or one dict
of them, and returns an array (the single output) or a dict of arrays. A *class* is instantiated
once per instance, ``load()`` is called (with the model's ``parameters`` as keyword arguments
when there are any), and ``predict`` follows the same rules as a function; ``unload()`` is
called when the version is retired. An object already built (the notebook API hands one over
through :func:`register_object`) is used as it is.

A ``predict`` that is a generator (``yield``, sync or async) makes the model *decoupled*: each
yielded result is its own response (an LLM's token stream), served by the streaming endpoints
(gRPC ModelStreamInfer, HTTP ``generate_stream``, grps streaming; see python_stream.py).

Metadata is declared in serve.yaml (``inputs``/``outputs``) or read from type hints:
``numpy.typing.NDArray[np.float32]`` gives the datatype, ``Annotated[..., (-1, 4)]`` the shape
(default ``[-1]``), a ``TypedDict`` return names several outputs. Outputs are cast to their
declared datatypes.

A user exception becomes the request's error, never a dead server: 500 / INTERNAL saying
``the model raised <type>: <message>``. The message is the model author's own words and usually
what the caller needs (``ValueError: the model refuses negative numbers``), so it is shown, with
absolute paths cut to their last part and at most 1000 characters; the traceback never is. It
goes to the log under the reference the answer quotes. A :class:`app.errors.ServeError` the model
raises on purpose (e.g. InvalidArgument) passes through with its own code.

What a model imports and the keyword arguments its ``load()`` receives (``parameters``) come
from serve.yaml or the notebook API only: a repository load request cannot change them
(app/models/pushed_config.py).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import queue
import sys
import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import numpy as np

from app.config.compiler import ModelPlan
from app.config.versions import VersionSource
from app.datatypes import DATATYPES, as_bytes_array
from app.errors import Internal, ServeError, Unimplemented, logged_reference
from app.runtimes.base import Arrays, LoadError
from app.runtimes.python_hints import signature_of
from app.runtimes.python_stream import is_generator_function, steps
from app.shown_paths import hide_paths
from app.types import ModelSignature

PLATFORM = "python"
OBJECT_PREFIX = "servekit-object:"
MAX_MESSAGE_CHARS = 1000
_OBJECTS: dict[str, object] = {}
log = logging.getLogger("servekit.python")


def register_object(obj: object) -> str:
    """Make an in-memory function, class or instance loadable; returns its entrypoint."""
    token = f"{OBJECT_PREFIX}{uuid.uuid4().hex}"
    _OBJECTS[token] = obj
    return token


def forget_object(entrypoint: str | None) -> None:
    """Drop a registered object (loaded versions keep their own reference)."""
    if entrypoint is not None:
        _OBJECTS.pop(entrypoint, None)


def resolve_entrypoint(entrypoint: str | None) -> object:
    """The object an entrypoint names; user modules are re-imported so a reload sees edits."""
    if entrypoint is None:
        raise LoadError("a Python model needs an entrypoint: module:attribute")
    if entrypoint.startswith(OBJECT_PREFIX):
        try:
            return _OBJECTS[entrypoint]
        except KeyError:
            raise LoadError("the in-memory Python object of this model is gone") from None
    module_name, sep, attr = entrypoint.partition(":")
    if not sep or not module_name or not attr:
        raise LoadError(f"entrypoint {entrypoint!r}: write it as module:attribute")
    try:
        module = sys.modules.get(module_name)
        if module is not None and _is_user_module(module):
            module = importlib.reload(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as exc:
        raise LoadError(
            f"cannot import {module_name!r}: {type(exc).__name__}: {exc} (modules are found "
            "beside serve.yaml and on the Python path)"
        ) from None
    target: object = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise LoadError(f"module {module_name!r} has no attribute {attr!r}") from None
    return target


def _is_user_module(module: Any) -> bool:
    """A module of the user's project (reloadable), not of the standard library or a package."""
    file = getattr(module, "__file__", None)
    if not file or module.__name__ == "__main__":
        return False
    path = Path(file).resolve()
    installed = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return not any(path.is_relative_to(root) for root in installed)


def _instantiate(target: object, parameters: dict[str, Any]) -> object:
    if not inspect.isclass(target):
        return target
    try:
        instance = target()
        loader = getattr(instance, "load", None)
        if callable(loader):
            loader(**parameters) if parameters else loader()
    except Exception as exc:
        raise LoadError(f"{target.__name__} failed to load: {type(exc).__name__}: {exc}") from None
    return instance


def _predict_of(instance: object) -> Callable[..., Any]:
    predict = getattr(instance, "predict", None)
    if callable(predict):
        return predict  # type: ignore[no-any-return]
    if callable(instance):
        return instance
    raise LoadError(f"{instance!r} is neither a function nor an object with predict()")


class PythonModel:
    """A loaded Python model; ``instances`` copies are used one request at a time each.

    ``decoupled`` (its predict yields): requests go through :meth:`predict_stream`, each
    yielded result one response; :meth:`predict` refuses them, as Triton's unary endpoints
    refuse a decoupled model, because answering once would drop or merge responses."""

    platform = PLATFORM

    def __init__(
        self,
        instances: list[object],
        signature: ModelSignature,
        by_name: bool,
        name: str = "",
        decoupled: bool = False,
    ) -> None:
        self.signature = signature
        self.decoupled = decoupled
        self._name = name
        self._by_name = by_name
        self._instances = instances
        self._free: queue.SimpleQueue[Callable[..., Any]] = queue.SimpleQueue()
        for instance in instances:
            self._free.put(_predict_of(instance))
        self._outputs = {s.name: s for s in signature.outputs}
        self._stream_slots: asyncio.Semaphore | None = None

    def predict(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        if self.decoupled:
            raise Unimplemented(decoupled_refusal(self._name))
        feed = {k: v if v.flags.writeable else v.copy() for k, v in inputs.items()}
        call = self._free.get()
        try:
            result = call(**feed) if self._by_name else call(feed)
        except ServeError:
            raise
        except Exception as exc:
            raise Internal(_user_error(exc)) from None
        finally:
            self._free.put(call)
        return self._convert(result, outputs)

    async def predict_stream(
        self, inputs: Arrays, outputs: list[str]
    ) -> AsyncGenerator[Arrays, None]:
        """A decoupled model's results, one per item its predict yields (see python_stream).

        Called on the event loop. The instance is held from the first step until the generator
        ends or is closed (closing this iterator closes the model's generator), so with
        ``instances: N`` at most N streams run at once and the others wait here, off the loop.
        """
        feed = {k: v if v.flags.writeable else v.copy() for k, v in inputs.items()}
        if self._stream_slots is None:  # made on the loop that serves the streams
            self._stream_slots = asyncio.Semaphore(len(self._instances))
        async with self._stream_slots:
            call = self._free.get_nowait()  # the semaphore guarantees a free instance
            try:
                try:
                    produced = call(**feed) if self._by_name else call(feed)
                    async with aclosing(steps(produced)) as items:
                        async for item in items:
                            converted = self._fit_rank(self._convert(item, outputs))
                            yield converted
                except ServeError:
                    raise
                except Exception as exc:
                    raise Internal(_user_error(exc)) from None
            finally:
                self._free.put(call)

    def _fit_rank(self, arrays: Arrays) -> Arrays:
        """A yielded scalar (one token: ``yield "word"``) as a one-element tensor when the
        output is declared with dimensions (``[-1]``, the default), as clients index it."""
        for name, value in arrays.items():
            rank = len(self._outputs[name].shape)
            if value.ndim == 0 and rank > 0:
                arrays[name] = value.reshape((1,) * rank)
        return arrays

    def _convert(self, result: object, wanted: list[str]) -> Arrays:
        if isinstance(result, dict):
            produced = result
        elif len(self._outputs) == 1:
            produced = {next(iter(self._outputs)): result}
        elif isinstance(result, tuple) and len(result) == len(self._outputs):
            produced = dict(zip(self._outputs, result, strict=True))
        else:
            raise Internal(
                f"the model returned {type(result).__name__}; return a dict with "
                f"{', '.join(self._outputs)}"
            )
        out: Arrays = {}
        for name in wanted:
            if name not in produced:
                raise Internal(f"the model did not return output {name!r}")
            datatype = self._outputs[name].datatype
            value = produced[name]
            try:
                if datatype == "BYTES":
                    out[name] = as_bytes_array(np.asarray(value, dtype=object))
                else:
                    out[name] = np.asarray(value, dtype=DATATYPES[datatype].dtype)
            except (TypeError, ValueError) as exc:
                raise Internal(f"output {name!r} is not convertible to {datatype}: {exc}") from None
        return out

    def close(self) -> None:
        for instance in self._instances:
            unload = getattr(instance, "unload", None)
            if callable(unload) and not inspect.isclass(instance):
                try:
                    unload()
                except Exception:
                    log.exception("unload() of a Python model failed")
        self._instances.clear()


def _user_error(exc: Exception) -> str:
    """What the client reads when the model's own code raised (see the module docstring)."""
    reference = logged_reference(log, exc, "a Python model raised")
    text = hide_paths(str(exc))
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + "…"
    return f"the model raised {type(exc).__name__}: {text} (reference {reference})"


def decoupled_refusal(name: str) -> str:
    """Why a unary endpoint refuses a decoupled model (Triton's words first)."""
    shown = f"model {name!r}" if name else "this model"
    return (
        "this endpoint doesn't support models with decoupled transaction policy: "
        f"{shown} streams its responses (its predict yields them); use gRPC ModelStreamInfer, "
        f"HTTP POST /v2/models/{name or '{model}'}/generate_stream or grps streaming"
    )


def load(plan: ModelPlan, version: VersionSource) -> PythonModel:
    """Import (or take) the model, build its instances and read its metadata."""
    target = resolve_entrypoint(plan.entrypoint)
    instances = [_instantiate(target, dict(plan.parameters)) for _ in range(plan.instances)]
    predict = _predict_of(instances[0])
    signature, by_name = signature_of(predict, plan.inputs, plan.outputs)
    decoupled = is_generator_function(predict)
    if decoupled and plan.config is not None and plan.config.dynamic_batching is not None:
        raise LoadError(
            "a model whose predict yields (decoupled: a stream of responses per request) "
            "cannot use dynamic batching; remove dynamic_batching from its config"
        )
    return PythonModel(instances, signature, by_name, plan.name, decoupled)
