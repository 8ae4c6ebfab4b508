"""MLServer custom runtimes (a user's ``mlserver.MLModel`` subclass) as servekit Python models.

An MLServer project's ``implementation: models.MyModel`` becomes a Python model
(app/servekit/config/mlserver_project.py) whose entrypoint is that class, with its
model-settings.json under ``parameters.mlserver``. The Python runtime (python.py) builds each
instance through :class:`MLServerModel` instead of calling the class itself, so the model gets
the executor, isolation, batching and statistics of any Python model, and the same errors: an
implementation that does not import, a ``load()`` that raises or returns False, a ``predict()``
that raises or (isolated) hangs.

``import mlserver`` runs MLServer's package ``__init__``, which imports its gRPC server, whose
generated protos register the same ``inference.*`` names as servekit's in protobuf's default
pool: in servekit's process that import fails. :func:`enter_library` enters the package with
its folder on ``__path__`` and without its ``__init__``, and gives the names a model imports
from it (``MLModel``, ``ModelSettings``, ``Settings``, ``register``, ``log``, ``__version__``)
from their own modules (``log`` and ``register`` are servekit's: see :func:`log`): MLServer's
types, codecs and base class, never its server.

The instance's ``load``, ``metadata``, ``predict`` and ``unload`` are coroutines: each runs to
completion on an event loop of the instance's own (one instance serves one request at a time,
in its worker thread), never on the server's loop. The request reaches ``predict`` whole, as
MLServer hands it over: the request document (mlserver_wire.py) the DataPlane's request kind
writes (app/servekit/services/mlserver_requests.py) becomes MLServer's ``InferenceRequest``
with every input and parameter the client sent (``@decode_args`` and the model's
``decode``/``decode_request`` helpers work as in MLServer, with the content types of the
request and of the model's metadata), and its ``InferenceResponse`` goes back as the answer
document, outputs and parameters as the runtime wrote them. ``metadata()`` is read once, when
the version loads: its tensors (with their parameters) and parameters are the model's metadata
(the tensors a ``@decode_args`` predict names, :func:`hinted`, when it shows none). A runtime
with its own ``predict_stream`` is a decoupled model (:class:`MLServerStreamModel`), one answer
document per response. ``mlserver.log`` and ``mlserver.register`` give servekit's own custom
metrics (histograms in ``/metrics``).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import inspect
import sys
import types
from collections.abc import AsyncGenerator, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servekit.observability import custom_metrics
from servekit.runtimes import mlserver_wire
from servekit.runtimes.base import Arrays, LoadError

SETTINGS_KEY = "mlserver"
"""The Python model parameter holding the model's model-settings.json."""
_EXPORTS = {
    "MLModel": "mlserver.model",
    "ModelSettings": "mlserver.settings",
    "Settings": "mlserver.settings",
    "__version__": "mlserver.version",
}


def register(name: str, description: str) -> custom_metrics.Histogram:
    """``mlserver.register``: a histogram of the model version running (or loading) now, in
    servekit's ``/metrics`` (app/servekit/observability/custom_metrics.py)."""
    return custom_metrics.histogram(name, description)


def log(**metrics: float) -> None:
    """``mlserver.log(name=value, ...)``: each value observed in its histogram, labelled with
    the model and version whose predict runs (MLServer's labels are model_name and
    model_version; servekit's custom metrics say model and version)."""
    for name, value in metrics.items():
        custom_metrics.histogram(name, name).observe(value)


_OURS = {"register": register, "log": log}


def enter_library() -> None:
    """Make ``import mlserver`` give MLServer's library without its server (see the module
    docstring); nothing when it is not installed or is imported already."""
    if "mlserver" in sys.modules:
        return
    spec = importlib.util.find_spec("mlserver")
    if spec is None or spec.origin is None:
        return
    package = types.ModuleType("mlserver")
    package.__path__ = [str(Path(spec.origin).parent)]
    package.__file__ = spec.origin
    package.__getattr__ = _library_attribute  # type: ignore[method-assign]
    sys.modules["mlserver"] = package


def _library_attribute(name: str) -> Any:
    if name in _OURS:
        return _OURS[name]
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(
            f"mlserver.{name}: servekit gives MLServer's types, codecs and MLModel base class, "
            "not its server"
        )
    return getattr(importlib.import_module(module), name)


def is_model_class(target: object) -> bool:
    """Whether ``target`` is a subclass of MLServer's ``MLModel`` (imported already when the
    user's module subclasses it)."""
    base = getattr(sys.modules.get("mlserver.model"), "MLModel", None)
    return inspect.isclass(target) and base is not None and issubclass(target, base)


@dataclass(frozen=True)
class Declared:
    """A tensor as the Python runtime reads a declared one (serve.yaml's TensorOverride)."""

    name: str
    datatype: str | None
    shape: list[int] | None
    optional: bool = False
    labels: list[str] | None = None
    format: str | None = None


def hinted(model_class: type) -> tuple[tuple[Declared, ...], tuple[Declared, ...]] | None:
    """The tensors of a ``@decode_args`` predict, as MLServer reads them: one input per
    argument (optional when it has a default), outputs ``output-0``, ``output-1``, ... for the
    values it returns. Their datatype is not in the hints (MLServer takes any): FP64, which
    model-settings.json's ``inputs``/``outputs`` may say otherwise. None: predict takes the
    whole InferenceRequest, whose tensors only model-settings.json can name."""
    predict = getattr(model_class, "predict", None)
    inner = getattr(predict, "__wrapped__", None)
    if inner is None:
        return None
    params = list(inspect.signature(inner).parameters.values())[1:]  # after self
    inputs = tuple(
        Declared(p.name, "FP64", [-1], optional=p.default is not p.empty) for p in params
    )
    returns = inspect.signature(inner).return_annotation
    several = getattr(returns, "__origin__", None) is tuple
    count = len(getattr(returns, "__args__", ())) if several else 1
    outputs = tuple(Declared(f"output-{i}", "FP64", [-1]) for i in range(count))
    return inputs, outputs


class MLServerModel:
    """One instance of an MLModel subclass, driven as a Python model with one dict argument."""

    def __init__(self, model_class: type, parameters: dict[str, Any], name: str) -> None:
        from mlserver.settings import ModelSettings

        data = dict(parameters.get(SETTINGS_KEY) or {})
        data["name"] = data.get("name") or name
        data["implementation"] = model_class
        self._loop = asyncio.new_event_loop()
        self._labels = custom_metrics.LOADING.get()  # this version's, for mlserver.log
        try:
            settings = ModelSettings(**data)
            # parameters.uri is relative to model-settings.json, which MLServer's projects keep
            # beside the module of their runtime (get_model_uri reads _source).
            folder = Path(inspect.getfile(model_class)).parent
            settings._source = str(folder / "model-settings.json")
            self._model = model_class(settings)
            ready = self._run(self._model.load())
        except Exception:
            self._loop.close()
            raise
        if ready is False:
            self._loop.close()
            raise LoadError(f"{model_class.__name__}.load() returned False")
        self._model.ready = True  # as MLServer marks a model whose load() succeeded
        try:
            self.metadata = _metadata_of(self._run(self._model.metadata()))
        except Exception:
            self._run(self._model.unload())
            self._loop.close()
            raise

    def predict(self, inputs: Arrays) -> Arrays:
        """One request as MLServer hands it to its runtimes: the request document
        (mlserver_wire.py) in, the answer document out."""
        answers = []
        labels = custom_metrics.LOADING.set(self._labels)
        try:  # several documents: requests the executor batched, each answered on its own
            for document in mlserver_wire.unpack_all(inputs[mlserver_wire.REQUEST]):
                response = self._run(self._model.predict(_request_of(document)))
                answers.append(_document_of(response))
        finally:
            custom_metrics.LOADING.reset(labels)
        return {mlserver_wire.RESPONSE: mlserver_wire.pack_all(answers)}

    def unload(self) -> None:
        """The runtime's ``unload()``, when its version is retired."""
        try:
            self._run(self._model.unload())
        finally:
            self._loop.close()

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """``coroutine`` run to its end on the instance's own loop: in this thread, or in a
        thread of its own when this one runs a loop already (the server's, which retires a
        version and so calls :meth:`unload` there)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._loop.run_until_complete(coroutine)
        with ThreadPoolExecutor(1, thread_name_prefix="mlserver-model") as pool:
            return pool.submit(self._loop.run_until_complete, coroutine).result()


class MLServerStreamModel(MLServerModel):
    """A runtime whose ``predict_stream`` is its own: a decoupled Python model (each
    response it yields is one response of the stream, python_stream.py), its generator
    stepped on the server's loop as MLServer steps it on its own."""

    async def predict(self, inputs: Arrays) -> AsyncGenerator[Arrays, None]:  # type: ignore[override]
        request = _request_of(mlserver_wire.unpack(inputs[mlserver_wire.REQUEST]))

        async def payloads() -> AsyncGenerator[Any, None]:
            yield request

        # Each step may run in another context (python_stream.py steps it): the labels are
        # set again, not reset by token, around the model's own code.
        before = custom_metrics.LOADING.get()
        custom_metrics.LOADING.set(self._labels)
        try:
            async for response in self._model.predict_stream(payloads()):
                yield {mlserver_wire.RESPONSE: mlserver_wire.pack(_document_of(response))}
        finally:
            custom_metrics.LOADING.set(before)


def streams(model_class: type) -> bool:
    """Whether ``model_class`` overrides ``predict_stream`` (a streaming model)."""
    base = sys.modules["mlserver.model"].MLModel
    return getattr(model_class, "predict_stream", None) is not base.predict_stream


def adapter_for(model_class: type) -> type[MLServerModel]:
    """The adapter of ``model_class``: streaming when it overrides ``predict_stream``."""
    return MLServerStreamModel if streams(model_class) else MLServerModel


def _metadata_of(found: Any) -> dict[str, Any]:
    """The model's ``metadata()`` (MLServer's MetadataModelResponse) as the tensors and
    parameters servekit answers in model metadata: ``{"inputs": [...], "outputs": [...],
    "parameters": {...} or None}``, each tensor's ``parameters`` as MLServer writes them."""

    def tensors(items: Any) -> list[dict[str, Any]]:
        out = []
        for item in items or ():
            datatype = _text(item.datatype)
            tensor = {"name": item.name, "datatype": datatype, "shape": list(item.shape)}
            tensor["parameters"] = _parameters(item.parameters) if item.parameters else None
            out.append(tensor)
        return out

    parameters = _parameters(found.parameters) if found.parameters is not None else None
    return {
        "inputs": tensors(found.inputs),
        "outputs": tensors(found.outputs),
        "parameters": parameters,
    }


def _request_of(document: dict[str, Any]) -> Any:
    """The request document as MLServer's InferenceRequest, as its REST API parses a request:
    data as sent (BYTES as text; bytes where the text was not UTF-8)."""
    from mlserver.types import InferenceRequest

    inputs = []
    for item in document.get("inputs") or ():
        if item.get("datatype") == "BYTES":
            item = {**item, "data": [mlserver_wire.raw_element(v) for v in item["data"]]}
        inputs.append(item)
    return InferenceRequest.model_validate({**document, "inputs": inputs})


def _document_of(response: Any) -> dict[str, Any]:
    """MLServer's InferenceResponse as the answer document (mlserver_wire.py): each output's
    name, datatype, shape, parameters and flat data, and the response's parameters."""
    from mlserver.types import InferenceResponse

    if not isinstance(response, InferenceResponse):
        raise TypeError(f"predict() returned {type(response).__name__}, not an InferenceResponse")
    outputs = []
    for output in response.outputs:
        data = output.data.root if hasattr(output.data, "root") else output.data
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": _text(output.datatype),
            "shape": list(output.shape),
            "data": mlserver_wire.flat_data(data),
        }
        parameters = _parameters(output.parameters)
        if parameters:
            entry["parameters"] = parameters
        outputs.append(entry)
    document: dict[str, Any] = {"outputs": outputs}
    parameters = _parameters(response.parameters)
    if parameters:
        document["parameters"] = parameters
    return document


def _text(datatype: Any) -> str:
    """A datatype as its V2 name (MLServer's ``Datatype`` enum or a plain string)."""
    return str(getattr(datatype, "value", datatype))


def _parameters(parameters: Any) -> dict[str, Any]:
    """MLServer's Parameters as MLServer's REST API writes them (what is set and not None),
    less what never leaves its server: the headers it copies in and the decoded payload."""
    if parameters is None:
        return {}
    dumped: dict[str, Any] = parameters.model_dump(exclude_unset=True, exclude_none=True)
    for private in ("headers", "_decoded_payload"):
        dumped.pop(private, None)
    return dumped
