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
goes to the log under the reference the answer quotes. A :class:`servekit.errors.ServeError` the
model raises on purpose (e.g. InvalidArgument) passes through with its own code.

Each instance runs in its own worker thread (never two requests at once on one instance). A
model that waits (sleeps, does I/O, polls a device) can stop early when its request is
abandoned (client gone, deadline passed): see app/servekit/runtimes/cancel.py (``cancelled()``,
``cancel_event()``). Outputs are checked against the declared metadata after the call: ``None``
or a wrong shape is a 500 naming the output, never a 200 with made-up values (an output whose
shape is declared nowhere, a bare ``NDArray`` return hint, has only its datatype checked).

What a model imports and the keyword arguments its ``load()`` receives (``parameters``) come
from serve.yaml or the notebook API only: a repository load request cannot change them
(app/servekit/models/pushed_config.py).
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
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from servekit.datatypes import DATATYPES, as_bytes_array
from servekit.errors import Internal, InvalidArgument, ServeError, Unimplemented, logged_reference
from servekit.runtimes import mlserver_model
from servekit.runtimes.base import CALLING_MODEL, Arrays, LoadError, Predict, mark_optional
from servekit.runtimes.python_hints import guessed_output_shapes, signature_of
from servekit.runtimes.python_stream import is_generator_function, steps
from servekit.shown_paths import hide_paths
from servekit.types import GRPS_MESSAGE, ModelSignature, TensorSpec

if TYPE_CHECKING:  # annotations only: the isolated child imports this without pydantic
    from servekit.config.compiler import ModelPlan
    from servekit.config.schema import TensorOverride
    from servekit.config.versions import VersionSource

PLATFORM = "python"
OBJECT_PREFIX = "servekit-object:"
MAX_MESSAGE_CHARS = 1000
_OBJECTS: dict[str, object] = {}
log = logging.getLogger("servekit.python")


def import_root(base_dir: Path) -> None:
    """Python models are imported from serve.yaml's folder (appended: never shadows stdlib).
    The server (services/model_control.py) and ``servekit validate`` (python_check.py) both
    call this, so they find a model's module the same way."""
    root = str(base_dir.resolve())
    if root not in sys.path:
        sys.path.append(root)


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


def _instantiate(target: object, parameters: dict[str, Any], name: str = "") -> object:
    if not inspect.isclass(target):
        return target
    try:
        if mlserver_model.is_model_class(target):  # an MLServer custom runtime
            return mlserver_model.adapter_for(target)(target, parameters, name)
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
    may_run_inline = False  # user code may block at any call (runtimes/base.py)
    outputs_trusted = False
    note = ""
    fatal: tuple[type[BaseException], ...] = ()
    """Exceptions of the model's code that ``predict`` lets through as they are instead of
    turning them into the request's error: an isolated model's child process sets
    ``(MemoryError,)`` so that running out of memory restarts the process."""

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
        self.loose_outputs: frozenset[str] = frozenset()
        """Outputs whose shape was never declared (a bare NDArray hint): only their datatype
        is checked against the metadata (app/servekit/services/execution/outputs.py)."""
        self._stream_slots: asyncio.Semaphore | None = None

    def predict(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        if self.decoupled:
            raise Unimplemented(decoupled_refusal(self._name))
        call = self._free.get()
        try:
            return self._run(call, inputs, outputs)
        finally:
            self._free.put(call)

    def predictor(self, index: int) -> Predict:
        """Instance ``index`` alone, for its own worker thread (see ModelRuntime.predictor)."""
        if self.decoupled:
            return self.predict  # refuses, as predict does
        call = _predict_of(self._instances[index])
        return lambda inputs, outputs: self._run(call, inputs, outputs)

    def _run(self, call: Callable[..., Any], inputs: Arrays, outputs: list[str]) -> Arrays:
        feed = {k: v if v.flags.writeable else v.copy() for k, v in inputs.items()}
        caller = CALLING_MODEL.set(self._name)  # for models it calls (servekit.models.infer)
        try:
            result = call(**feed) if self._by_name else call(feed)
        except ServeError:
            raise
        except self.fatal:
            raise
        except Exception as exc:
            raise Internal(_user_error(exc)) from None
        finally:
            CALLING_MODEL.reset(caller)
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
            if value is None:  # np.asarray(None, float) would answer 200 with "NaN"
                raise Internal(f"the model returned None for output {name!r}")
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
    return build(
        plan.entrypoint,
        plan.parameters,
        plan.instances,
        plan.inputs,
        plan.outputs,
        name=plan.name,
        batching=plan.config is not None and plan.config.dynamic_batching is not None,
        grps_message=plan.config is not None and plan.config.grps_message,
        max_batch_size=plan.max_batch_size,
    )


def build(
    entrypoint: str | None,
    parameters: dict[str, Any],
    instances: int,
    inputs: tuple[TensorOverride, ...] | None,
    outputs: tuple[TensorOverride, ...] | None,
    *,
    name: str = "",
    batching: bool = False,
    grps_message: bool = False,
    max_batch_size: int = 0,
) -> PythonModel:
    """``load`` from the fields it needs (an isolated model's child process has no plan)."""
    if mlserver_model.SETTINGS_KEY in parameters:  # an MLServer project's custom runtime
        mlserver_model.enter_library()
    target = resolve_entrypoint(entrypoint)
    if mlserver_model.is_model_class(target):
        found = mlserver_model.hinted(target)  # type: ignore[arg-type]
        return _mlserver(target, parameters, instances, inputs, outputs, name, found, batching)
    built = [_instantiate(target, dict(parameters), name) for _ in range(instances)]
    predict = _predict_of(built[0])
    if grps_message or takes_grps_message(predict):
        if inputs or outputs or max_batch_size:
            raise LoadError(
                "a model that takes whole GrpsMessages has no declared inputs, outputs or "
                "maxBatchSize (its one input and output are the message)"
            )
        return GrpsMessageModel(built, MESSAGE_SIGNATURE, message_codec())
    signature, by_name = signature_of(predict, inputs, outputs)
    signature = mark_optional(signature, inputs)
    decoupled = is_generator_function(predict)
    if decoupled and batching:
        raise LoadError(
            "a model whose predict yields (decoupled: a stream of responses per request) "
            "cannot use dynamic batching; remove dynamic_batching from its config"
        )
    model = PythonModel(built, signature, by_name, name, decoupled)
    model.loose_outputs = guessed_output_shapes(predict, outputs)
    return model


# -- MLServer custom runtimes ------------------------------------------------------------------
def _mlserver(
    target: object,
    parameters: dict[str, Any],
    instances: int,
    inputs: tuple[TensorOverride, ...] | None,
    outputs: tuple[TensorOverride, ...] | None,
    name: str,
    found: tuple[tuple[Any, ...], tuple[Any, ...]] | None,
    batching: bool,
) -> PythonModel:
    """An MLServer custom runtime: it takes the whole request, as MLServer hands it over
    (runtimes/mlserver_wire.py), so its signature is only what its metadata shows:
    model-settings.json's ``inputs``/``outputs``, else a ``@decode_args`` predict's. One
    with its own ``predict_stream`` is decoupled (a stream of responses per request)."""
    built = [_instantiate(target, dict(parameters), name) for _ in range(instances)]
    metadata = getattr(built[0], "metadata", None) or {}
    declared_in = inputs or (found[0] if found else ())
    declared_out = outputs or (found[1] if found else ())
    signature = ModelSignature(
        _metadata_specs(metadata.get("inputs"), declared_in),
        _metadata_specs(metadata.get("outputs"), declared_out),
        parameters=metadata.get("parameters"),
    )
    decoupled = mlserver_model.streams(target)  # type: ignore[arg-type]
    if decoupled and batching:
        raise LoadError("a streaming MLServer runtime (predict_stream) cannot use dynamic batching")
    signature = mark_optional(signature, inputs)
    return MLServerRequestModel(built, signature, by_name=False, name=name, decoupled=decoupled)


def _metadata_specs(shown: Any, declared: Any) -> tuple[TensorSpec, ...]:
    """The tensors the runtime's ``metadata()`` shows (with their parameters), else those
    model-settings.json or a ``@decode_args`` predict declare."""
    if shown:
        return tuple(
            TensorSpec(t["name"], t["datatype"], tuple(t["shape"]), parameters=t["parameters"])
            for t in shown
        )
    return tuple(
        TensorSpec(t.name, t.datatype or "BYTES", tuple(t.shape) if t.shape is not None else (-1,))
        for t in declared
    )


class MLServerRequestModel(PythonModel):
    """An MLServer custom runtime's instances: each call takes the request document and
    gives the answer document (each step of a stream one), whatever the signature says."""

    def _convert(self, result: object, wanted: list[str]) -> Arrays:
        if not isinstance(result, dict):
            raise Internal(f"the MLServer runtime adapter returned {type(result).__name__}")
        return result

    def _fit_rank(self, arrays: Arrays) -> Arrays:
        return arrays


# -- models that take whole grps messages ---------------------------------------------------------
_MESSAGE_SPEC = TensorSpec(GRPS_MESSAGE, "BYTES", (1,))
MESSAGE_SIGNATURE = ModelSignature((_MESSAGE_SPEC,), (_MESSAGE_SPEC,), grps_message=True)
"""One BYTES element in, one out: a serialized GrpsMessage each way
(app/servekit/services/grps.py)."""


def takes_grps_message(predict: Callable[..., Any]) -> bool:
    """Whether predict's one argument is annotated ``GrpsMessage`` (servekit's generated class,
    grps' own, or the name as a string), the other way to ask for whole messages."""
    try:
        params = list(inspect.signature(predict).parameters.values())
    except (TypeError, ValueError):
        return False
    if len(params) != 1:
        return False
    annotation = params[0].annotation
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return isinstance(name, str) and name.strip("'\" ").rpartition(".")[2] == "GrpsMessage"


class MessageCodec(Protocol):
    """How a model that takes whole messages gets them: the serialized message -> the object
    its code receives, and what the code returned -> the serialized reply. A codec supplies it
    (:data:`servekit.codecs.grps_message.CODEC`), so no runtime imports a protocol module."""

    def parse(self, raw: bytes) -> object:
        """The message (InvalidArgument when ``raw`` is none)."""
        ...

    def reply(self, result: object) -> bytes:
        """The serialized reply to what the model returned (Internal when it cannot be one)."""
        ...


MESSAGE_CODECS: dict[str, MessageCodec] = {}
"""Message formats whole-message models can take, by name ("grps"): registered by the layer
that loads runtimes (app/servekit/models/repository.py; an isolated model's child process in
app/servekit/runtimes/isolated_child.py)."""


def message_codec(name: str = "grps") -> MessageCodec:
    try:
        return MESSAGE_CODECS[name]
    except KeyError:
        raise LoadError(f"no {name} message codec is registered in this process") from None


class GrpsMessageModel(PythonModel):
    """A Python model written as a grps model: ``predict(message) -> message``.

    The message crosses the dataplane serialized in one BYTES element (so statistics, limits
    and the one inference path apply as for any model); here ``messages`` (a codec) makes it
    a ``GrpsMessage`` for the model. The model may return a GrpsMessage, a str (``str_data``)
    or bytes (``bin_data``).
    """

    def __init__(
        self, instances: list[object], signature: ModelSignature, messages: MessageCodec
    ) -> None:
        super().__init__(instances, signature, by_name=False)
        self._messages = messages

    def _run(self, call: Callable[..., Any], inputs: Arrays, outputs: list[str]) -> Arrays:
        raw = as_bytes_array(inputs[GRPS_MESSAGE]).reshape(-1)
        if raw.size != 1:
            raise InvalidArgument(f"{GRPS_MESSAGE} holds one serialized GrpsMessage")
        message = self._messages.parse(bytes(raw[0]))
        try:
            result = call(message)
        except ServeError:
            raise
        except self.fatal:
            raise
        except Exception as exc:
            raise Internal(_user_error(exc)) from None
        return {GRPS_MESSAGE: np.array([self._messages.reply(result)], dtype=object)}
