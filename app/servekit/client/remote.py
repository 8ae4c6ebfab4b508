"""``servekit.connect(url)``: the notebook API against a server that is already running.

Everything goes over HTTP: inference with the binary tensor data extension (no tensor is spelled
out as JSON numbers), the model list from the repository index, and ``add_model`` through the
repository load API with the model file attached, so pushing a model built in the notebook
works the same against a server on another machine as against one started with ``servekit.serve``.

A server with tokens (``server.auth``) needs ``Authorization: Bearer <token>`` on its protected
groups: the handle sends its token on every request but health checks, and a refusal (401)
raises :class:`~servekit.errors.Unauthenticated` saying whether no token or a wrong one was sent.
``connect`` takes the token as ``token=``, or from the ``SERVEKIT_TOKEN`` environment variable,
so a notebook shared with others need not contain it.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from servekit.client import frames, html, sources, wire
from servekit.client.transport import Reply, Transport, check
from servekit.config.auth import ApiGroup
from servekit.config.traffic import TRAFFIC_KEY_HEADER
from servekit.errors import Unauthenticated
from servekit.formats import convert
from servekit.project import files as saving

TOKEN_ENV = "SERVEKIT_TOKEN"
"""Where ``servekit.connect`` looks for a token when none is given."""


def _path(*parts: str) -> str:
    return "/" + "/".join(quote(p, safe="") for p in parts)


def valid_token(token: str, where: str) -> str:
    """``token`` without surrounding whitespace, refused here (not as a 401 later) when it
    cannot travel in an HTTP header or gRPC metadata. The message never repeats the value."""
    value = token.strip()
    if not value or any(not 0x21 <= ord(c) <= 0x7E for c in value):
        raise ValueError(
            f"{where}: a token is printable ASCII without spaces (it travels in a header)"
        )
    return value


class RemoteServer:
    """A handle on a running servekit (or any V2 server with the repository extension)."""

    kind = "connected"

    def __init__(
        self,
        url: str,
        *,
        grpc_target: str | None = None,
        timeout: float = 60.0,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        tokens: Mapping[ApiGroup, str] | None = None,
    ) -> None:
        """``tokens`` (one per API group, e.g. a server's own ``server.auth`` as the
        in-process notebook server and the dashboard's benchmark know it) overrides ``token``
        for the groups it names."""
        self._http = Transport(url, timeout, ssl_context)
        self._grpc_target = grpc_target
        self._token = None if token is None else valid_token(token, "token")
        self._tokens = dict(tokens or {})
        self._metadata: dict[tuple[str, str | None], dict[str, Any]] = {}
        self._casts: set[tuple[str, str, str]] = set()  # (model, input, cast) warned about
        self.missing: list[str] = []
        """What the last ``save`` could not fetch from the server (empty: nothing)."""

    # -- tokens -------------------------------------------------------------------------------
    @property
    def token(self) -> str | None:
        """The token this handle sends (None: none): given to ``connect`` or read from
        SERVEKIT_TOKEN; for ``servekit.serve``, the one given to (or made by) ``token=``, or
        serve.yaml's when one token guards every protected group. Other clients send it as
        ``authorization: Bearer <token>``, e.g. tritonclient.http and tritonclient.grpc alike:
        ``client.infer(..., headers={"authorization": f"Bearer {server.token}"})``."""
        return self._token

    def _token_for(self, group: ApiGroup) -> str | None:
        """The token a request of ``group`` carries: the group's own when ``tokens`` named it,
        else this handle's one token."""
        return self._tokens.get(group, self._token) if self._tokens else self._token

    def _auth(self, group: ApiGroup) -> dict[str, str]:
        token = None if group is ApiGroup.OPEN else self._token_for(group)
        return {} if token is None else {"Authorization": f"Bearer {token}"}

    def _call(self, group: ApiGroup, method: str, path: str, obj: Any = None) -> Any:
        """A JSON request of ``group`` (with its token); a 401 explains itself."""
        try:
            return self._http.call(method, path, obj, self._auth(group))
        except Unauthenticated as exc:
            raise self._refused(group, exc) from None

    def _send(
        self,
        group: ApiGroup,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """A raw request of ``group`` (with its token), its reply checked."""
        reply = self._http.request(method, path, body, {**(headers or {}), **self._auth(group)})
        try:
            return check(reply)
        except Unauthenticated as exc:
            raise self._refused(group, exc) from None

    def _refused(self, group: ApiGroup, exc: Unauthenticated) -> Unauthenticated:
        """A 401 as the notebook user needs it: which token was missing or wrong, and where
        to give it. The token itself is never part of the message."""
        if self._token_for(group) is None:
            why = (
                f"no token was sent; pass token=... to servekit.connect() or set the {TOKEN_ENV} "
                "environment variable"
            )
        else:
            why = "the token this handle sent was refused (wrong or outdated token?)"
        return Unauthenticated(f"{self.url} refused a {group.value} request: {why} ({exc})")

    # -- addresses ----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """Base URL of the REST API (``/v2/...``), e.g. ``http://127.0.0.1:8000``."""
        return self._http.url

    @property
    def grpc_target(self) -> str | None:
        """``host:port`` of the gRPC API when known (as tritonclient.grpc expects it): given to
        ``connect``, or found by it (the server's gRPC port on the URL's host); None when gRPC
        is disabled or the server does not say."""
        return self._grpc_target

    @property
    def dashboard_url(self) -> str:
        return self.url + "/"

    # -- models -------------------------------------------------------------------------------
    @property
    def models(self) -> html.ModelTable:
        """Every model version the server knows, with its state and, if not ready, why."""
        rows = self._call(ApiGroup.REPOSITORY, "POST", "/v2/repository/index", {}) or []
        return html.ModelTable(
            {
                "name": r.get("name", ""),
                "version": r.get("version", ""),
                "state": r.get("state", ""),
                "reason": r.get("reason", ""),
            }
            for r in rows
        )

    def metadata(self, model: str, version: int | str | None = None) -> dict[str, Any]:
        """The V2 model metadata (inputs, outputs, versions, platform)."""
        parts = ["v2", "models", model] + ([] if version is None else ["versions", str(version)])
        result: dict[str, Any] = self._call(ApiGroup.METADATA, "GET", _path(*parts))
        return result

    def add_model(
        self,
        name: str,
        source: Any,
        *,
        version: int = 1,
        model_format: str = "onnx",
        inputs: sources.TensorsSpec | None = None,
        outputs: sources.TensorsSpec | None = None,
        example: Any = None,
        input_names: Sequence[str] | None = None,
        output_names: Sequence[str] | None = None,
        dynamic_batch: bool | None = None,
        **config: Any,
    ) -> html.ModelTable:
        """Serve ``source`` as model ``name`` (replacing a model of that name).

        ``source`` is a path (a model file, or a folder of numbered version folders), ONNX bytes,
        an ``onnx.ModelProto``, a fitted scikit-learn estimator or pipeline (converted with
        skl2onnx: input ``X`` FP32, outputs ``label`` and ``probabilities`` for a classifier,
        ``variable`` for a regressor), or a ``torch.nn.Module`` exported with ``example`` as
        its input (a tensor, an array, or a tuple of them; inputs ``input`` or ``input0``, ...,
        outputs ``output`` or ``output0``, ... unless ``input_names`` / ``output_names`` say
        otherwise; the first dimension free for the batch unless ``dynamic_batch=False``);
        ``config`` takes any serve.yaml model field in snake_case
        (``max_batch_size=8``, ``instances=2``, ...). Returns the new model's index rows; a
        model that fails to load raises with the server's reason.

        It changes the one server that answers (every worker of it): behind a load balancer,
        one replica; the others, and a replica started later, serve their serve.yaml.
        """
        source = convert.to_onnx_source(
            source,
            example,
            input_names=input_names,
            output_names=output_names,
            dynamic_batch=dynamic_batch,
        )
        if not sources.is_file_source(source):
            raise TypeError(
                "a Python function or class can only be served by a server started in this "
                "process with servekit.serve(); over the network, send a path, ONNX bytes or an "
                f"onnx.ModelProto (got {type(source).__name__})"
            )
        return self.push(name, source, version, model_format, inputs, outputs, config)

    def push(
        self,
        name: str,
        source: object,
        version: int,
        model_format: str,
        inputs: sources.TensorsSpec | None,
        outputs: sources.TensorsSpec | None,
        config: dict[str, Any],
    ) -> html.ModelTable:
        """Send a model file (already converted to one: a path, ONNX bytes or an
        ``onnx.ModelProto``) through the repository load API; returns the model's index rows."""
        fields = {"inputs": sources.tensors(inputs), "outputs": sources.tensors(outputs), **config}
        model = sources.model_config(name, model_format, fields, storage_uri="(pushed)")
        files = sources.model_files(source, version)
        params = sources.load_parameters(model, files)
        path = _path("v2", "repository", "models", name, "load")
        self._call(ApiGroup.REPOSITORY, "POST", path, {"parameters": params})
        self.forget(name)
        return self._rows(name)

    def remove_model(self, name: str) -> None:
        """Unload ``name``: in-flight requests finish, new ones are refused (on the one
        server that answers: behind a load balancer, one replica)."""
        path = _path("v2", "repository", "models", name, "unload")
        self._call(ApiGroup.REPOSITORY, "POST", path, {})
        self.forget(name)

    # -- benchmark ----------------------------------------------------------------------------
    def benchmark(
        self,
        model: str,
        concurrency: Sequence[int] = (1, 16, 64),
        seconds: float = 5.0,
        protocols: Sequence[str] = ("http", "grpc"),
        example: Any = None,
        timeout: float | None = None,
    ) -> Any:
        """Drive ``model`` over HTTP and gRPC, ``seconds`` per protocol and concurrency, with
        the first row of ``example`` (a DataFrame or name -> array) or inputs made from its
        metadata; ``timeout``: a deadline per request in seconds. Returns a table (requests/s,
        p50/p90/p99 ms) that shows a chart in a notebook; progress is printed on stdout.
        Short runs on a shared machine are noisy: compare, do not quote."""
        from servekit.client.bench import run_benchmark

        return run_benchmark(
            self, model, concurrency, seconds, protocols, example=example, timeout=timeout
        )

    # -- projects -----------------------------------------------------------------------------
    def save(self, folder: str | os.PathLike[str]) -> Path:
        """Write what this server tells of its models as a project in ``folder`` (serve.yaml,
        requirements.txt, Dockerfile). The V2 API does not hand out model files or code: each
        model gets a placeholder ``storageUri`` and a note (``serve.yaml`` comments,
        ``missing``) says what to copy there. Save from the notebook that serves the models
        (``server.save``) to get everything. A name in the server's index that serve.yaml
        would not accept (``../x``, ``a/b``) fails the save (SaveError) before anything is
        written."""
        project = saving.Project()
        names = [row["name"] for row in self.models]
        saving.check_names(names)  # another program's answer: never a path outside ``folder``
        for name in sorted(set(names)):
            config = self._call(ApiGroup.METADATA, "GET", _path("v2", "models", name, "config"))
            entry, note = _entry_from_config(name, config or {})
            project.models.append(entry)
            project.notes.append(note)
        root = project.write(os.fspath(folder))
        self.missing = list(project.notes)
        return root

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
        input, or a pandas DataFrame: one input per column, as MLServer's PandasCodec sends
        it); return name -> numpy array, or a DataFrame when ``frame`` is true (default: when
        ``inputs`` is one).

        Arrays keep their dtype; lists and scalars take the dtype the model declares.
        ``traffic_key`` (sent as the ``servekit-traffic-key`` header) keeps requests with the
        same key on one version of a model with serve.yaml ``traffic``.
        """
        parameters: dict[str, dict[str, str]] = {}
        if frames.is_frame(inputs):
            frame = True if frame is None else frame
            inputs, parameters = frames.columns(inputs)
            arrays = wire.to_arrays(model, inputs, {}, self._casts)  # columns as they are
        else:
            arrays = self._arrays(model, inputs, version)
        if parameters or frame:
            body, header_length = wire.encode_request(
                arrays, outputs, parameters, dict(frames.REQUEST_PARAMETERS)
            )
        else:
            body, header_length = wire.encode_request(arrays, outputs)
        parts = ["v2", "models", model] + ([] if version is None else ["versions", str(version)])
        reply = self._send(
            ApiGroup.INFERENCE,
            "POST",
            _path(*parts, "infer"),
            body,
            {
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(header_length),
                **({} if traffic_key is None else {TRAFFIC_KEY_HEADER: traffic_key}),
            },
        )
        length = reply.headers.get("inference-header-content-length")
        results = wire.decode_response(reply.body, int(length) if length is not None else None)
        return frames.to_frame(results) if frame else results

    def _arrays(self, model: str, inputs: Any, version: int | str | None) -> dict[str, Any]:
        key = (model, None if version is None else str(version))
        if key not in self._metadata:
            self._metadata[key] = self.metadata(model, version)
        declared = {t["name"]: t["datatype"] for t in self._metadata[key].get("inputs", [])}
        named = wire.named(model, inputs, list(declared))
        return wire.to_arrays(model, named, declared, self._casts, stacklevel=4)

    def forget(self, name: str | None = None) -> None:
        """Drop what this handle remembers of model ``name`` (every model: None), its input
        datatypes, so the next ``infer`` asks the server again (after a push or a reload)."""
        for key in [k for k in self._metadata if name is None or k[0] == name]:
            del self._metadata[key]

    def _rows(self, name: str) -> html.ModelTable:
        return html.ModelTable(r for r in self.models if r["name"] == name)

    # -- display ------------------------------------------------------------------------------
    def _state(self) -> tuple[bool, str]:
        try:
            ready = self._http.request("GET", "/v2/health/ready").status == 200
        except OSError as exc:
            return False, f"unreachable ({exc})"
        return True, "ready" if ready else "not ready"

    def _repr_html_(self) -> str:
        running, state = self._state()
        models: list[dict[str, Any]] = []
        note = ""
        if running:
            try:
                models = self.models
            except Unauthenticated as exc:  # the card still shows where the server is
                note = str(exc)
        return html.card_html(
            kind=self.kind,
            state=state,
            running=running,
            url=self.url,
            grpc_target=self.grpc_target,
            dashboard_url=self.dashboard_url,
            models=models,
            note=note,
            token=html.TokenView.of(self._token, "sent with every request"),
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    def close(self) -> None:
        """Close this handle's connection (the server keeps running)."""
        self._http.close()


def _entry_from_config(name: str, config: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A serve.yaml entry from a model's Triton configuration, and what it lacks."""
    python = config.get("backend") == "python"
    entry: dict[str, Any] = {"name": name, "modelFormat": {"name": "python" if python else "onnx"}}
    batch = config.get("max_batch_size")
    if isinstance(batch, int) and batch > 0:
        entry["maxBatchSize"] = batch
    if python:
        entry["entrypoint"] = "MODULE:ATTRIBUTE"
        note = (
            f"model {name!r}: the server does not hand out Python code; put its module beside "
            "serve.yaml and set its entrypoint (module:attribute)"
        )
    else:
        entry["storageUri"] = f"models/{name}"
        note = (
            f"model {name!r}: the server does not hand out model files; copy them to "
            f"models/{name}/<version>/model.onnx"
        )
    return entry, note


def connect(
    url: str,
    *,
    token: str | None = None,
    grpc_target: str | None = None,
    timeout: float = 60.0,
    ca_file: str | os.PathLike[str] | None = None,
    cert_file: str | os.PathLike[str] | None = None,
    key_file: str | os.PathLike[str] | None = None,
) -> RemoteServer:
    """A handle on the server at ``url``: ``infer``, ``models``, ``add_model``, ``remove_model``.

    ``token`` is sent as ``Authorization: Bearer <token>`` with every request; without it the
    ``SERVEKIT_TOKEN`` environment variable is used if set (so the token need not be written
    in the notebook). An ``https://`` URL is verified against ``ca_file`` (a PEM bundle, e.g.
    the CA of a server's own certificate) or else the system's trusted CAs; ``cert_file`` and
    ``key_file`` are this client's certificate for a server that requires one (mutual TLS).

    Fails at once with ConnectionError if nothing answers there, and with
    :class:`~servekit.errors.Unauthenticated` if the server refuses the token (or wants one),
    rather than at first use. Without ``grpc_target``, the gRPC port is asked of the server
    (``GET /servekit/v1/ports``) and paired with the host of ``url``: the server may listen on
    0.0.0.0 or sit behind a port-forward, where only the host the user reached it by works.
    ``grpc_target`` stays None when gRPC is disabled or the server is not a servekit; pass it
    explicitly when gRPC is reached at another host or port than that (a forward to a
    different local port).
    """
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
        where = TOKEN_ENV
    else:
        where = "token"
    context = None
    if ca_file is not None or cert_file is not None:
        context = ssl.create_default_context(cafile=ca_file)
        if cert_file is not None:
            context.load_cert_chain(cert_file, key_file)
    server = RemoteServer(url, grpc_target=grpc_target, timeout=timeout, ssl_context=context)
    try:
        server._token = None if token is None else valid_token(token, where)
        server._http.request("GET", "/v2/health/live")
        if grpc_target is None:
            server._grpc_target = _discover_grpc_target(server)
    except OSError as exc:
        server.close()
        raise ConnectionError(f"no server answers at {server.url}: {exc}") from None
    except BaseException:
        server.close()
        raise
    return server


def _discover_grpc_target(server: RemoteServer) -> str | None:
    """``host:port`` of the server's gRPC API: the port from the server, the host from the URL.

    Anything but a servekit ports answer with an integer ``grpcPort`` (gRPC disabled, another
    V2 server answering 404, a proxy's error page) means "not known", never a failed connect:
    the HTTP API, which everything else uses, does answer. A 401 is the exception: the token
    is missing or wrong, which every later call would run into too.
    """
    group = ApiGroup.METADATA
    reply = server._http.request("GET", "/servekit/v1/ports", headers=server._auth(group))
    if reply.status == 401:
        try:
            check(reply)
        except Unauthenticated as exc:
            raise server._refused(group, exc) from None
    if reply.status != 200:
        return None
    try:
        port = reply.json().get("grpcPort")
    except (ValueError, AttributeError):  # not JSON, or not a JSON object
        return None
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        return None
    host = urlsplit(server.url).hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
