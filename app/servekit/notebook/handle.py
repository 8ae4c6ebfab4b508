"""The handle ``servekit.serve`` returns: a server running in this process, in a background thread.

It *has* a client (:class:`servekit.client.RemoteServer`) for what goes over the wire
(``add_model`` with a file, bytes or an ``onnx.ModelProto`` goes through the repository load API
exactly as it would against a remote server; ``metadata``; ``benchmark``), and adds what only a
server in the same process can do: infer without a socket through the same DataPlane the
HTTP and gRPC adapters call, serve a Python function or class held in the notebook's memory,
reload its serve.yaml, and stop.

What goes over the wire (``add_model`` with a file, ``metadata``) carries the token of its API
group as the server itself resolved it from ``server.auth`` (``servekit.serve(token=...)`` sets one
token for every group); what runs in process (``infer``, ``models``, Python models) needs none:
the notebook holding the handle started the server.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from servekit.client import RemoteServer, frames, html, sources, wire
from servekit.config.auth import ApiGroup
from servekit.config.compiler import ServePlan
from servekit.config.traffic import TRAFFIC_KEY_HEADER
from servekit.datatypes import from_numpy
from servekit.errors import ServeError
from servekit.formats import convert, native
from servekit.notebook import registry
from servekit.notebook.launcher import ServerThread
from servekit.observability.request_ids import CURRENT, RequestInfo, new_id
from servekit.project import save as saving
from servekit.server import ServeKit
from servekit.services import Catalog, DataPlane, MemoryStatus, ModelControl
from servekit.types import InferRequest, RequestedOutput, Tensor


class Server:
    """A servekit running in this process. Stop it with ``stop()`` or a ``with`` block."""

    kind = "in this process"

    def __init__(
        self,
        thread: ServerThread,
        *,
        name: str,
        replan: Callable[[], ServePlan] | None,
        cleanup: Path | None = None,
        load_timeout: float = 600.0,
    ) -> None:
        assert thread.addresses is not None
        addresses = thread.addresses
        tls = thread.plan.tls
        # The tokens the server started with (a reload does not change them: server.auth is
        # read once at start), as text for the Authorization header.
        self._tokens = {g: t.decode("ascii") for g, t in thread.plan.access.tokens.items()}
        shared = set(self._tokens.values())
        self._token = shared.pop() if len(shared) == 1 else None
        self._client = RemoteServer(
            addresses.http_url,
            grpc_target=addresses.grpc_target,
            timeout=load_timeout,
            ssl_context=tls.pinned_client_context() if tls is not None else None,
            tokens=self._tokens,
        )
        """What goes over the wire: pushes of model files, metadata, the benchmark."""
        self._casts: set[tuple[str, str, str]] = set()  # (model, input, cast) warned about
        self._load_timeout = load_timeout
        self.name = name
        self._thread = thread
        self._replan = replan
        self._cleanup = cleanup
        self._native_folders: list[Path] = []
        self._examples: dict[str, Any] = {}
        """The first row of each model's ``add_model`` example (a DataFrame or name -> array):
        what ``benchmark`` sends when it is given none."""
        """Joblib files of estimators served natively (removed when the server stops)."""
        self._note = ""

    # -- tokens and addresses -----------------------------------------------------------------
    @property
    def token(self) -> str | None:
        """The token of every protected group when serve.yaml (or ``serve(token=...)``) set
        one for all of them, else None (then ``server.auth`` has one per group). Other clients
        send it as ``authorization: Bearer <token>``, e.g. tritonclient.http and
        tritonclient.grpc alike: ``client.infer(..., headers={"authorization": f"Bearer
        {server.token}"})``."""
        return self._token

    @property
    def url(self) -> str:
        """Base URL of the REST API (``/v2/...``), e.g. ``http://127.0.0.1:8000``."""
        return self._client.url

    @property
    def grpc_target(self) -> str | None:
        """``host:port`` of the gRPC API (as tritonclient.grpc expects it); None without gRPC."""
        return self._client.grpc_target

    @property
    def dashboard_url(self) -> str:
        return self._client.dashboard_url

    def _token_view(self) -> html.TokenView | None:
        protected = [g.value for g in ApiGroup if g in self._tokens]
        if not protected:
            return None
        scope = (
            "every API group but health"
            if len(protected) == len(ApiGroup) - 1
            else "for " + ", ".join(protected)
        )
        if self._token is None:
            return html.TokenView(None, f"{scope}: one token each, from serve.yaml server.auth")
        return html.TokenView.of(self._token, scope)

    # -- state --------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread.alive

    @property
    def plan(self) -> ServePlan:
        """The compiled serve.yaml the server runs (the plan in force: ``reload`` replaces it)."""
        return self._dataplane().plan

    def _servekit(self) -> ServeKit:
        if not self.running or self._thread.servekit is None:
            raise RuntimeError(
                f"servekit {self.name!r} is stopped{self._note}; run servekit.serve() to restart"
            )
        return self._thread.servekit

    def _control(self) -> ModelControl:
        """The server's model control (load, add, remove, apply an edited serve.yaml)."""
        return self._servekit().control

    def _dataplane(self) -> DataPlane:
        """The server's DataPlane (inference, metadata, the plan in force)."""
        return self._servekit().dataplane

    def _catalog(self) -> Catalog:
        """The server's Catalog (the index, the models as views, statistics)."""
        return self._servekit().catalog

    @property
    def payload_log(self) -> dict[str, Any] | None:
        """The payload log (``server.payloadLog``; None without one): its sink as the dashboard
        shows it, and the events it logged and dropped (``queue_full``, ``sink_failed``)."""
        return self._catalog().payload_log_status()

    # -- models -------------------------------------------------------------------------------
    @property
    def models(self) -> html.ModelTable:
        """Every model version with its state (READY, LOADING, UNAVAILABLE + reason, ...)."""
        catalog = self._catalog()

        async def index() -> list[dict[str, Any]]:
            return [row.as_dict() for row in catalog.index()]

        return html.ModelTable(self._thread.run(index()))

    def memory(self) -> dict[str, Any]:
        """Model memory: ``server.modelMemory`` in bytes (``budget_bytes``, None: none), what
        the loaded models hold (``used_bytes``), and by model its measured resident size, and
        for a ``load: onDemand`` model its loads on demand, their time and its unloads (as the
        dashboard and /metrics show them)."""
        catalog = self._catalog()

        async def status() -> MemoryStatus:
            return catalog.memory()

        found = self._thread.run(status())
        return {
            "budget_bytes": found.budget_bytes,
            "used_bytes": found.used_bytes,
            "models": {m.name: dataclasses.asdict(m) for m in found.models},
        }

    def add_model(
        self,
        name: str,
        source: Any = None,
        *,
        pipeline: Sequence[Mapping[str, Any]] | None = None,
        version: int = 1,
        model_format: str | None = None,
        inputs: sources.TensorsSpec | None = None,
        outputs: sources.TensorsSpec | None = None,
        example: Any = None,
        input_names: Sequence[str] | None = None,
        output_names: Sequence[str] | None = None,
        dynamic_batch: bool | None = None,
        openai: str | Mapping[str, Any] | None = None,
        **config: Any,
    ) -> html.ModelTable:
        """Serve ``source`` as ``name``: a path, ONNX bytes, an ``onnx.ModelProto``, a fitted
        scikit-learn estimator or pipeline (converted by skl2onnx), a ``torch.nn.Module`` with an
        ``example`` input (exported by ``torch.onnx.export``; ``input_names``, ``output_names`` and
        ``dynamic_batch`` shape that export, see app/servekit/formats/torch_onnx.py) -- all sent
        through the repository load API -- or a Python function or class (served from memory).

        A function takes the inputs as keyword numpy arrays and returns a dict of arrays; a
        class is instantiated once and its ``predict`` is called the same way. Python models
        declare their ``inputs`` and ``outputs`` (``[("x", "FP32", [-1, 4])]`` or dicts).
        Returns the model's index rows; a model that fails to load raises with the reason.

        ``pipeline=[{"model": ..., "inputs": {...}, "outputs": {...}}, ...]`` (no ``source``)
        serves a pipeline of models served already, as serve.yaml's ``pipeline:``; it declares
        its own ``inputs`` and ``outputs``.

        ``openai="chat"`` (``"completion"``, ``"embedding"``, or serve.yaml's mapping) also
        serves the model on the OpenAI-compatible routes (:meth:`openai_client`).
        """
        if openai is not None:
            config["openai"] = openai
        if pipeline is not None:
            return self._add_pipeline(name, source, pipeline, inputs, outputs, config)
        if source is None:
            raise TypeError("add_model needs a source (or pipeline=[...] steps)")
        self._remember_example(name, example)
        if convert.is_sklearn(source):
            try:
                source = convert.sklearn_to_onnx(source, example)
            except ImportError:
                raise
            except Exception as exc:  # skl2onnx cannot: serve the estimator itself
                native.warn(name, exc)
                if inputs is None and frames.is_frame(example):
                    known = getattr(source, "feature_names_in_", None)
                    inputs = frames.column_types(example, known) if known is not None else None
                return self._add_native(name, source, version, inputs, outputs, config)
        source = convert.to_onnx_source(
            source,
            example,
            input_names=input_names,
            output_names=output_names,
            dynamic_batch=dynamic_batch,
        )
        if sources.is_file_source(source):
            return self._client.push(
                name, source, version, model_format or "onnx", inputs, outputs, config
            )
        if not callable(source):
            raise TypeError(
                "source must be a path, ONNX bytes, an onnx.ModelProto, or a Python function or "
                f"class; got {type(source).__name__}"
            )
        fields = {"inputs": sources.tensors(inputs), "outputs": sources.tensors(outputs), **config}
        model = sources.model_config(
            name, model_format or "python", fields, entrypoint=_describe(source)
        )
        control = self._control()
        self._thread.run(control.add(model, python_object=source), timeout=self._load_timeout)
        self._client.forget(name)
        return html.ModelTable(r for r in self.models if r["name"] == name)

    def _remember_example(self, name: str, example: Any) -> None:
        if frames.is_frame(example) and len(example):
            self._examples[name] = example.head(1)
        elif isinstance(example, Mapping) and example:
            self._examples[name] = {k: np.asarray(v)[:1] for k, v in example.items()}
        else:
            self._examples.pop(name, None)

    def _add_pipeline(
        self,
        name: str,
        source: Any,
        steps: Sequence[Mapping[str, Any]],
        inputs: sources.TensorsSpec | None,
        outputs: sources.TensorsSpec | None,
        config: dict[str, Any],
    ) -> html.ModelTable:
        """Serve a pipeline of this server's models
        (app/servekit/services/composition/pipelines.py)."""
        if source is not None:
            raise TypeError("add_model takes a source or pipeline=[...] steps, not both")
        fields = {
            "inputs": sources.tensors(inputs),
            "outputs": sources.tensors(outputs),
            "pipeline": [dict(step) for step in steps],
            **config,
        }
        model = sources.model_config(name, "ensemble", fields)
        control = self._control()
        self._thread.run(control.add(model), timeout=self._load_timeout)
        self._client.forget(name)
        return html.ModelTable(r for r in self.models if r["name"] == name)

    def _add_native(
        self,
        name: str,
        estimator: Any,
        version: int,
        inputs: sources.TensorsSpec | None,
        outputs: sources.TensorsSpec | None,
        config: dict[str, Any],
    ) -> html.ModelTable:
        """Serve a scikit-learn estimator with the sklearn runtime, from a joblib file in a
        folder of this server's own (app/servekit/formats/native.py)."""
        folder = Path(tempfile.mkdtemp(prefix="servekit-native-"))
        self._native_folders.append(folder)
        path = native.write(estimator, folder / name / str(version))
        fields = {"inputs": sources.tensors(inputs), "outputs": sources.tensors(outputs), **config}
        model = sources.model_config(name, "sklearn", fields, storage_uri=str(path.parent.parent))
        control = self._control()
        self._thread.run(control.add(model), timeout=self._load_timeout)
        self._client.forget(name)
        return html.ModelTable(r for r in self.models if r["name"] == name)

    def remove_model(self, name: str) -> None:
        """Unload ``name`` (in-flight requests finish) and drop it from the index."""
        self._thread.run(self._control().remove(name), timeout=self._load_timeout)
        self._client.forget(name)

    def reload(self) -> dict[str, list[str]]:
        """Re-read serve.yaml and apply the difference while the other models keep serving:
        returns the models ``added``, ``removed``, ``reloaded`` and ``failed`` (a failed reload
        keeps the previous load serving; ``server.models`` shows why). A bad edit raises its
        ConfigError and changes nothing."""
        if self._replan is None:
            raise RuntimeError("this server was started without a serve.yaml; nothing to reload")
        control = self._control()
        plan = self._replan()
        done = self._thread.run(control.apply_plan(plan), timeout=self._load_timeout)
        self._client.forget()
        return done

    # -- over the wire --------------------------------------------------------------------------
    def metadata(self, model: str, version: int | str | None = None) -> dict[str, Any]:
        """The V2 model metadata (inputs, outputs, versions, platform), as a client sees it."""
        return self._client.metadata(model, version)

    def benchmark(
        self,
        model: str,
        concurrency: Sequence[int] = (1, 16, 64),
        seconds: float = 5.0,
        protocols: Sequence[str] = ("http", "grpc"),
        example: Any = None,
        timeout: float | None = None,
    ) -> Any:
        """Drive ``model`` over this server's own HTTP and gRPC listeners (see
        :meth:`servekit.client.RemoteServer.benchmark`); without ``example``, the one given
        to ``add_model`` for it when its columns are the model's inputs (a DataFrame example
        of a model converted to ONNX's one matrix ``X`` is not)."""
        if example is None and model in self._examples:
            remembered = self._examples[model]
            names = {spec["name"] for spec in self.metadata(model).get("inputs", [])}
            columns = {
                str(c) for c in (remembered.columns if frames.is_frame(remembered) else remembered)
            }
            example = remembered if names and names <= columns else None
        return self._client.benchmark(model, concurrency, seconds, protocols, example, timeout)

    def openai_client(self, **options: Any) -> Any:
        """An ``openai.OpenAI`` client of this server's OpenAI-compatible routes
        (``/openai/v1``), sending the inference token when there is one; ``options`` go to
        ``openai.OpenAI`` (``max_retries``, ``timeout``, ...). Needs ``servekit[openai]``."""
        try:
            import openai
        except ImportError:
            raise ImportError(
                "server.openai_client() needs the openai package: pip install 'servekit[openai]'"
            ) from None
        token = self._tokens.get(ApiGroup.INFERENCE)
        tls = self._thread.plan.tls
        if tls is not None and "http_client" not in options:
            options["http_client"] = openai.DefaultHttpxClient(verify=tls.pinned_client_context())
        # The client insists on a key; with no token the server ignores it.
        return openai.OpenAI(
            base_url=f"{self.url}/openai/v1", api_key=token or "servekit", **options
        )

    # -- projects -----------------------------------------------------------------------------
    def save(self, folder: str | os.PathLike[str]) -> Path:
        """Write the models this server serves as a project in ``folder``: serve.yaml, the model
        files, Python models as source (``notebook_models.py``), requirements.txt and a
        Dockerfile. ``servekit serve folder/serve.yaml`` serves the same models with the same
        outputs anywhere; ``servekit build folder`` makes its image. A model whose source cannot
        be written (a lambda, a closure, ...) raises SaveError naming it; nothing is written."""
        control = self._control()
        plan = control.plan
        project = saving.from_plans(control.served_plans(), plan.runtimes, plan.server.requirements)
        return project.write(os.fspath(folder))

    # -- inference ----------------------------------------------------------------------------
    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any] | Any,
        version: int | str | None = None,
        outputs: Sequence[str] | None = None,
        frame: bool | None = None,
        traffic_key: str | None = None,
    ) -> Any:
        """Run ``model`` on ``inputs`` (name -> array or list, a bare array for a model of one
        input, or a pandas DataFrame: one input per column) in process; name -> numpy array,
        or a DataFrame when ``frame`` is true (default: when ``inputs`` is one;
        app/servekit/client/frames.py).

        Goes through the same DataPlane (validation, version choice, batching, statistics) as
        HTTP and gRPC requests, without encoding anything. ``traffic_key`` is what the
        ``servekit-traffic-key`` header is over the wire: the same key, the same version of a
        model with serve.yaml ``traffic``.
        """
        parameters: dict[str, dict[str, str]] = {}
        request_parameters: dict[str, Any] = {}
        if frames.is_frame(inputs):
            frame = True if frame is None else frame
            inputs, parameters = frames.columns(inputs)
            request_parameters = dict(frames.REQUEST_PARAMETERS)
        dataplane = self._dataplane()
        wanted = [RequestedOutput(n) for n in outputs] if outputs else None
        label = None if version is None else str(version)

        async def declared() -> dict[str, str]:
            try:
                signature = dataplane.signature_of(model, label)
            except ServeError:  # not servable: the request itself fails with the right error
                return {}
            return {s.name: s.datatype for s in signature.inputs}

        # Cast here, in the caller's thread, so a cast warning points at the caller's line.
        # A DataFrame's columns go as they are, as MLServer's PandasCodec sends them.
        types = {} if request_parameters else self._thread.run(declared())
        inputs = wire.named(model, inputs, list(types))
        arrays = wire.to_arrays(model, inputs, types, self._casts)

        async def run() -> dict[str, Any]:
            tensors = [
                Tensor(key, from_numpy(array.dtype).name, array.shape, array)
                for key, array in arrays.items()
            ]
            for tensor in tensors:
                tensor.parameters = dict(parameters.get(tensor.name, {}))
            request = InferRequest(
                model, tensors, model_version=label, outputs=wanted, parameters=request_parameters
            )
            if traffic_key is not None:  # as the adapters record a header (this task's own)
                info = RequestInfo(new_id(), False)
                info.sent_headers = ((TRAFFIC_KEY_HEADER, traffic_key),)
                CURRENT.set(info)
            response = await dataplane.infer(request)
            return {t.name: t.data for t in response.outputs}

        results = self._thread.run(run())
        return frames.to_frame(results) if frame else results

    # -- lifecycle ----------------------------------------------------------------------------
    def stop(self, grace: float = 5.0) -> None:
        """Stop serving: in-flight requests get ``grace`` seconds, then ports and threads are
        released. Safe to call twice."""
        self._stop(grace, "")
        registry.forget(self)

    def _stop(self, grace: float, note: str) -> None:
        if note and not self._note:
            self._note = note
        self._thread.stop(grace)
        self._client.close()
        if self._cleanup is not None:
            shutil.rmtree(self._cleanup, ignore_errors=True)
            self._cleanup = None
        for folder in self._native_folders:
            shutil.rmtree(folder, ignore_errors=True)
        self._native_folders.clear()

    def close(self) -> None:
        """Close this handle's client connection (the server keeps running: ``stop`` ends it)."""
        self._client.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _repr_html_(self) -> str:
        running = self.running
        return html.card_html(
            kind=f"{self.kind} (name {self.name!r})",
            state="running" if running else f"stopped{self._note}",
            running=running,
            url=self.url,
            grpc_target=self.grpc_target,
            dashboard_url=self.dashboard_url,
            models=self.models if running else [],
            token=self._token_view(),
        )

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<Server {self.name!r} {state} {self.url}>"


def _describe(source: Callable[..., Any]) -> str:
    """An entrypoint-like label of an in-memory object (``module:qualname``), for display."""
    module = getattr(source, "__module__", None) or "__main__"
    qualname = getattr(source, "__qualname__", None) or type(source).__name__
    return f"{module}:{qualname}"
