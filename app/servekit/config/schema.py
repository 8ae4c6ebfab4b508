"""The serve.yaml schema: pydantic models with camelCase keys and documented fields.

Unknown keys are errors; every field's docstring becomes its description in the JSON Schema
(``servekit schema``), so editors can complete and explain serve.yaml. Values are layered:
defaults < serve.yaml < ``SERVEKIT_*`` environment variables (nested with ``__``, e.g.
``SERVEKIT_SERVER__HTTPPORT=9000``) < command-line flags. Loading lives in
app/servekit/config/loader.py.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    SecretStr,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from servekit.config.hosts import check_entry
from servekit.config.openai import Declared, OpenAISettings, check_fits
from servekit.config.payload_log import PayloadLogConfig
from servekit.config.pip_requirements import NAME_START, check_requirement
from servekit.config.remote_uris import remote_scheme
from servekit.config.schema_base import Section, http_address
from servekit.config.sequences import SequenceBatching
from servekit.config.traffic import ShadowConfig, TrafficSplit, routing_of

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
CTRL_KEY = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
"""A name that works unchanged as a query parameter, a header and a JSON field."""
_TOKEN = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+\-]*"
MEDIA_TYPE = re.compile(rf"^{_TOKEN}/{_TOKEN}(;[ -~]*)?$")
"""type/subtype with optional parameters, printable ASCII only (it becomes a header value)."""


PipRequirement = Annotated[
    str,
    AfterValidator(check_requirement),
    WithJsonSchema({"type": "string", "pattern": NAME_START, "minLength": 1}),
]
"""One entry of ``server.requirements`` (app/servekit/config/pip_requirements.py says what is
refused
and why); the JSON Schema lets editors flag an option or a path at once."""


class GrpsStreaming(Section):
    """How a grps HTTP predict request asks for a streamed (chunked) answer, and that answer's
    Content-Type: grps' own server.yml `streaming_ctrl`, with the same modes and defaults."""

    ctrl_mode: Literal["query_param", "header_param", "body_param"] = "query_param"
    """Where the request says it wants streaming: a query parameter (`?streaming=true`), a
    request header (`streaming: true`), or a top-level field of the JSON body beside the
    GrpsMessage fields (`{"str_data": "hi", "streaming": true}`, a JSON boolean; a body sent as
    application/octet-stream carries no field, so it is never streamed in this mode)."""
    ctrl_key: str = "streaming"
    """Name of that query parameter, header or body field. A query parameter or header asks
    for streaming when its value is `true`, `1` or `yes` (any case)."""
    res_content_type: str = "application/octet-stream"
    """Content-Type of a streamed answer (each message one chunk: JSON and a newline, or the
    raw bytes of bin_data)."""

    @field_validator("ctrl_key")
    @classmethod
    def _valid_key(cls, value: str, info: ValidationInfo) -> str:
        """In the body the key sits beside the GrpsMessage fields: one of their names would be
        read as both, so it is refused here rather than guessed at per request."""
        if not CTRL_KEY.match(value):
            raise ValueError("use letters, digits, '_', '.', '-' (at most 64 characters)")
        if info.data.get("ctrl_mode") == "body_param" and value in GRPS_MESSAGE_KEYS:
            raise ValueError(
                f"{value!r} is a GrpsMessage field; with ctrlMode body_param choose a name the "
                "message does not use (e.g. streaming)"
            )
        return value

    @field_validator("res_content_type")
    @classmethod
    def _valid_content_type(cls, value: str) -> str:
        if not MEDIA_TYPE.match(value):
            raise ValueError("expected a media type such as application/octet-stream")
        return value


GRPS_MESSAGE_KEYS = frozenset(
    {"binData", "bin_data", "gmap", "gtensors", "model", "ndarray", "status", "strData", "str_data"}
)
"""Every top-level key a JSON GrpsMessage body may hold (both spellings, and ndarray). Written
out, not read from the protobuf descriptor: config imports no protocol module (tests check it
against ``grps_pb2.GrpsMessage.DESCRIPTOR``)."""


INT64_MAX = 2**63 - 1
"""Largest integer Triton's protobuf model configuration (int64 fields) can carry."""
INT32_MAX = 2**31 - 1
"""Largest value of Triton's int32 config fields (max_batch_size, instance_group count,
preferred_batch_size): beyond it ``GET /v2/models/{m}/config`` over gRPC could not encode it."""
UINT32_MAX = 2**32 - 1
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class TokenSource(Section):
    """Where a token is read from at start: an environment variable or a file (its content,
    surrounding whitespace removed). Exactly one of the two."""

    env: str | None = None
    """Name of an environment variable holding the token (e.g. SERVEKIT_TOKEN)."""
    file: str | None = None
    """Path of a file holding the token (relative to serve.yaml), e.g. a mounted Kubernetes
    Secret such as /var/run/secrets/servekit/token."""

    @model_validator(mode="after")
    def _exactly_one(self) -> TokenSource:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env (a variable name) or file (a path)")
        if self.env is not None and not ENV_NAME.match(self.env):
            raise ValueError("env must be an environment variable name (letters, digits, '_')")
        return self


TokenSpec = TokenSource | str
"""A token source, or the token itself written in clear (works, but `servekit validate` warns:
anyone who can read serve.yaml, a ConfigMap or a Git history then holds the token)."""


class AuthConfig(Section):
    """Access tokens by API group. A group with a token refuses requests that do not carry it
    (HTTP `Authorization: Bearer <token>`, gRPC metadata `authorization: Bearer <token>`) with
    401 / UNAUTHENTICATED; a group with none is open. Health (live, ready, per-model ready)
    always stays open, for probes."""

    default: TokenSpec | None = None
    """Token of every group that is not given its own below."""
    inference: TokenSpec | None = None
    """Inference: V2 infer, V1 predict, grps predict, gRPC ModelInfer and ModelStreamInfer."""
    metadata: TokenSpec | None = None
    """Metadata: server and model metadata (V2, V1, grps), the dashboard's read-only pages."""
    repository: TokenSpec | None = None
    """Repository: index, load, unload and pushing models (also what the dashboard's
    load/unload buttons need)."""
    admin: TokenSpec | None = None
    """Admin: statistics, model configuration, /metrics, grps online/offline."""


class TlsConfig(Section):
    """Serve HTTPS and gRPC over TLS from this process (when no TLS-terminating proxy is in
    front). Paths are relative to serve.yaml."""

    cert_file: str
    """PEM certificate chain of the server."""
    key_file: str
    """PEM private key of that certificate."""
    client_ca_file: str | None = None
    """PEM bundle of the CAs whose client certificates are accepted; when given, every client
    must present one (mutual TLS)."""


class Limits(Section):
    """Bounds on what a client may ask for through the repository API (serve.yaml itself is
    trusted and not bounded by these)."""

    max_instances: int = Field(16, ge=1, le=1024)
    """Largest `instances` (Triton: instance_group count) a pushed config may ask for."""
    max_runtime_threads: int = Field(64, ge=1, le=4096)
    """Largest intraOpThreads / interOpThreads a pushed config may ask for."""
    max_versions: int = Field(64, ge=1, le=100_000)
    """Longest version list (specific versions, latest numVersions) of a pushed config."""
    max_pushed_models: int = Field(32, ge=0, le=100_000)
    """How many models pushed with files may be stored at once."""
    max_pushed_bytes: int = Field(4 * 1024**3, ge=0)
    """Bytes all pushed model files may take on disk together."""


LIVE: dict[str, Any] = {"live": True}
"""``json_schema_extra`` of a server setting an edit of serve.yaml changes while running."""
RESTART: dict[str, Any] = {"live": False}
"""``json_schema_extra`` of a server setting a running process keeps until it restarts."""


class NetworkLimits(Section):
    """How long clients may take and how many they may be, on both listeners: what keeps a
    slow, idle or oversized client from holding the server (slowloris, huge headers, runaway
    streams). The defaults suit a small machine (2 cores, a 1,024 open-file limit) serving
    programs, not browsers on slow links; docs/server.md, "Limits at the edge", explains each."""

    header_timeout_seconds: float = Field(10.0, gt=0, le=3600)
    """Time a client has to send a request's whole header block, from its first byte (or from
    connecting); after it the request is answered 408 and the connection closed."""
    body_timeout_seconds: float = Field(30.0, gt=0, le=3600)
    """Longest pause between two reads of a request body (nginx's client_body_timeout): a body
    announced but not sent gets 408 and the connection closed."""
    body_deadline_seconds: float = Field(60.0, gt=0, le=86_400)
    """Time a request has for its whole body, from the end of its headers; past it, a body
    still arriving is cut (408, connection closed) unless it has come at bodyMinBytesPerSecond
    on average. A client that sends a byte now and then to hold a request slot is cut here,
    whatever its pauses."""
    body_min_bytes_per_second: int = Field(10 * 1024, ge=1, le=1 << 40)
    """The average rate (bytes since the headers ended / seconds since then) a body still
    arriving after bodyDeadlineSeconds must keep, or 408 and close: 10 KiB/s by default, what
    an 80 kbit/s link sends, so a large upload over a slow link is not cut."""
    keep_alive_seconds: float = Field(30.0, gt=0, le=3600)
    """How long an idle HTTP keep-alive connection stays open between requests."""
    max_connections: int = Field(1000, ge=1, le=1_000_000)
    """Open HTTP connections at most. At the cap, a new connection first displaces the oldest
    one that has no request in progress (idle keep-alive, or one still sending headers), then
    the oldest one still sending a request body; when none can be displaced it gets 503 and
    is closed at once. Lowered at start to what
    the process's open-file limit leaves (minus a reserve for models, gRPC and logs), so the
    server refuses connections instead of running out of file descriptors."""
    max_requests_in_flight: int = Field(256, ge=1, le=1_000_000)
    """HTTP requests being read or answered at once, all connections together; beyond it a
    request gets 503 with Retry-After at once (each in-flight request may hold a body of up to
    maxRequestBytes in memory)."""
    client_share_of_requests: float = Field(0.5, gt=0, le=1)
    """The fraction of maxRequestsInFlight one client address may hold at once (at least one
    request); beyond it that client's next request gets 503 with Retry-After, so one address
    cannot take every slot from the others. Loopback is an address like any other: behind a
    proxy on the same machine, raise it to 1."""
    max_header_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
    """Request line plus all header lines, in bytes; larger gets 431 (Envoy allows 60 KiB,
    nginx 32 KiB)."""
    max_header_count: int = Field(100, ge=8, le=10_000)
    """Header lines in one request; more gets 431 (Envoy's default, 100)."""
    grpc_max_concurrent_streams: int = Field(128, ge=1, le=1_000_000)
    """gRPC calls open at once on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS)."""
    grpc_max_metadata_bytes: int = Field(16 * 1024, ge=1024, le=1024 * 1024)
    """Largest gRPC metadata (headers) a call may send."""
    grpc_keepalive_seconds: float = Field(60.0, ge=1, le=86_400)
    """The server pings a gRPC connection idle this long, and drops it when the ping is not
    answered within 20 s; clients may ping at most every 10 s without a call in progress
    (more often: GOAWAY, grpcio's too_many_pings)."""


class LoggingConfig(Section):
    """How the server writes its log (stderr) and its access log: one formatter for every
    source (servekit, uvicorn, grpc, watchfiles, onnxruntime), set once at start
    (app/servekit/observability/logs.py)."""

    format: Literal["text", "json"] = "text"
    """`text`: one readable line per record. `json`: one JSON object per line (time, level,
    logger, message, and when known model, version, request_id, worker), for a log pipeline;
    the listening line on stdout is a JSON object too."""
    level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level written (`servekit serve --log-level` overrides it)."""
    access_log: Literal["off", "on", "errors"] = "off"
    """One line per HTTP request or gRPC call (method or RPC, path, status, duration, bytes in
    and out, model, version, client address, request ID): `on` for every one, `errors` for
    those answered with an error only (HTTP status 400 and above, gRPC other than OK)."""

    @field_validator("access_log", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: Any) -> Any:
        """YAML 1.1 reads a bare `off` / `on` as false / true: take them as the words."""
        if value is True:
            return "on"
        if value is False:
            return "off"
        return value


_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
"""An HTTP header name (RFC 9110 token): what gRPC metadata keys and OTLP/HTTP headers take."""


class TracingConfig(Section):
    """OpenTelemetry traces (docs/observability.md, "Traces"): off unless `enabled` or the standard
    `OTEL_*` variables ask. Where both set the same thing, the `OTEL_*` variable wins (the
    deployment's environment over the project's file), as OpenTelemetry's SDKs read them."""

    enabled: bool = False
    """Export a span per request (the extra `servekit[otel]`). `false` leaves it to the
    `OTEL_*` variables; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off
    whatever this says."""
    endpoint: str | None = None
    """The collector's OTLP address, `http://host:port` or `https://host:port`
    (`OTEL_EXPORTER_OTLP_ENDPOINT` wins); default `http://localhost:4317` (gRPC) or
    `http://localhost:4318` (HTTP)."""
    protocol: Literal["grpc", "http/protobuf"] = "grpc"
    """OTLP over gRPC (port 4317) or `http/protobuf` (port 4318; needs
    opentelemetry-exporter-otlp-proto-http). `OTEL_EXPORTER_OTLP_PROTOCOL` wins."""
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)
    """Share of the traces that start here to keep (0 to 1), as `parentbased_traceidratio`:
    a request whose caller sent a `traceparent` follows the caller's choice.
    `OTEL_TRACES_SAMPLER` wins."""
    service_name: str | None = Field(None, min_length=1, max_length=256)
    """The spans' `service.name`; default `servekit`. `OTEL_SERVICE_NAME` wins."""
    headers: dict[str, SecretStr] = {}
    """Headers sent with every export (a collector's API key): never shown by servekit (its
    log, the dashboard, `repr`). `OTEL_EXPORTER_OTLP_HEADERS` wins: set from a Kubernetes
    Secret, it keeps a real key out of serve.yaml, a file people read and commit."""

    @field_validator("endpoint")
    @classmethod
    def _an_address(cls, value: str | None) -> str | None:
        return http_address(value, "tracing_endpoint", "http://host:port or https://host:port")

    @field_validator("headers")
    @classmethod
    def _header_names(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, secret in value.items():
            if not _HEADER_NAME.match(name):
                raise PydanticCustomError(
                    "tracing_header", "'{name}' is not a header name", {"name": name}
                )
            text = secret.get_secret_value()
            if not text.isprintable() or not text.isascii():
                raise PydanticCustomError(
                    "tracing_header",
                    "the value of header '{name}' must be printable ASCII",
                    {"name": name},
                )
        return {name.lower(): secret for name, secret in value.items()}


class S3Storage(Section):
    """Where `s3://` URIs are read from: AWS, or any S3-compatible store."""

    endpoint: str | None = None
    """The store's URL (MinIO, Ceph, a local emulator); default `AWS_ENDPOINT_URL`, else AWS.
    Credentials come from the usual AWS environment variables and files, never serve.yaml."""
    anonymous: bool = False
    """Read a public bucket without credentials."""


class StorageConfig(Section):
    """Remote `storageUri`s (`s3://`, `gs://`, `az://`, Azure Blob and `https://` URLs):
    downloaded once into a local cache, served from there."""

    cache_dir: str | None = None
    """The cache folder; default `$XDG_CACHE_HOME/servekit/models` (`~/.cache/...`). In an
    image, a writable volume. Relative paths are relative to serve.yaml's folder."""
    max_bytes: int = Field(20 * 1024**3, ge=1024 * 1024)
    """The cache's size bound: beyond it, the least recently used downloads that no served
    model uses are deleted."""
    max_download_bytes: int = Field(10 * 1024**3, ge=1024)
    """The largest model (all its files, or an archive and what it unpacks to) one remote
    storageUri may bring."""
    timeout_seconds: float = Field(600.0, gt=0, le=86_400)
    """The longest one model's download may take, listing included."""
    poll_seconds: float = Field(30.0, ge=1, le=86_400)
    """How often `--watch` looks at remote models for new versions and changed objects (and
    reads a serve.yaml served from a store, `servekit serve s3://.../serve.yaml --watch`),
    and how soon a model whose download failed is tried again (doubling up to 10 minutes)."""
    when_unreachable: Literal["serveCached", "unavailable"] = "serveCached"
    """What a model does when its store cannot be listed or read (down, timing out, refusing
    the credentials) at start or reload: `serveCached` serves the last complete copy in the
    cache, with a warning in its reason, on the dashboard and in
    `servekit_model_cached_copy`, and looks at the store again in the background (every
    `pollSeconds`, doubling up to 10 minutes) until it answers; `unavailable` leaves the model
    UNAVAILABLE with the reason, retried likewise. A model never fetched has no copy: it is
    UNAVAILABLE either way. A store that answers with nothing there, a model too large or an
    unsafe archive is never covered by the cache."""
    s3: S3Storage = S3Storage()
    """`s3://` settings."""


def _allowed_host(value: str) -> str:
    try:
        return check_entry(value)
    except ValueError as exc:
        raise PydanticCustomError("allowed_host", str(exc)) from None


AllowedHost = Annotated[str, AfterValidator(_allowed_host)]
"""One entry of ``server.allowedHosts`` (app/servekit/config/hosts.py says what is accepted)."""


def _yaml_off(value: object) -> object:
    """YAML 1.1 (PyYAML) reads a bare ``off`` as false: take it as the word written."""
    return "off" if value is False else value


SharedMemoryMode = Annotated[Literal["off", "system"], BeforeValidator(_yaml_off)]
"""``server.sharedMemory``: ``off`` or ``system`` (``off`` unquoted in YAML is false)."""


_PERCENT = re.compile(r"^[0-9]{1,3}(\.[0-9]+)?%$")


def _model_memory(value: object) -> int | str:
    """``server.modelMemory``: a whole number of bytes of at least 1 MiB (digits too: an
    environment variable's value is text), or a percentage more than 0 and at most 100."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024 * 1024:
        return value
    if isinstance(value, str) and _PERCENT.match(value) and 0 < float(value[:-1]) <= 100:
        return value
    raise ValueError(
        'give bytes (a whole number, at least 1048576: 1 MiB) or a percentage of RAM ("40%", '
        "more than 0 and at most 100)"
    )


ModelMemory = Annotated[
    int | str,
    BeforeValidator(_model_memory),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1024 * 1024},
                {"type": "string", "pattern": _PERCENT.pattern},
            ]
        }
    ),
]
"""``server.modelMemory``: bytes (at least 1 MiB) or a percentage of RAM, ``"40%"``."""


class KubernetesConfig(Section):
    """What ``servekit export kserve`` writes for the pods and their scaling
    (docs/kserve.md, "serve.yaml's server.kubernetes"); a running server ignores it."""

    deployment_mode: Literal["Standard", "Knative"] = "Standard"
    """KServe's deployment mode of each InferenceService (its annotation
    `serving.kserve.io/deploymentMode`): `Standard` (a Deployment and an HPA; the pod's
    `terminationGracePeriodSeconds` is set from `drainDelaySeconds` and `drainSeconds`) or
    `Knative` (Knative owns the pod's stop: its queue-proxy drains and its revision timeout is
    the grace period)."""
    min_replicas: int = Field(1, ge=0, le=10_000)
    """Fewest pods of each InferenceService (its predictor's `minReplicas`); 0 (scale to zero)
    needs `deploymentMode: Knative`."""
    max_replicas: int = Field(10, ge=1, le=10_000)
    """Most pods of each InferenceService (`maxReplicas`), at least `minReplicas`."""
    scale_metric: Literal["cpu", "memory", "concurrency", "rps"] | None = None
    """What KServe's autoscaler scales on (`scaleMetric`): `cpu` or `memory` (utilization, in
    percent of the request) in either mode, `concurrency` or `rps` (requests in flight or per
    second, per pod) with `deploymentMode: Knative` only. Default: KServe's (cpu in
    `Standard`, concurrency in `Knative`)."""
    scale_target: int | None = Field(None, ge=1, le=1_000_000)
    """The value of `scaleMetric` each pod is kept at (`scaleTarget`): percent for cpu and
    memory, requests for concurrency and rps. Default: KServe's (80% cpu; Knative's 100
    concurrent requests); needed with `scaleMetric: memory`, which KServe has no default for."""
    startup_seconds: int = Field(600, ge=10, le=86_400)
    """How long a pod may take from its start to ready: loading its model and warming it up.
    The container's startupProbe (on `/v2/health/ready`) allows this long before the kubelet
    restarts it; liveness checks begin once it is ready."""

    @model_validator(mode="after")
    def _fits_the_mode(self) -> KubernetesConfig:
        knative = self.deployment_mode == "Knative"
        if self.scale_metric in ("concurrency", "rps") and not knative:
            raise ValueError(
                f"scaleMetric {self.scale_metric} is Knative's (its autoscaler counts requests): "
                "set deploymentMode: Knative, or scale on cpu or memory"
            )
        if self.min_replicas == 0 and not knative:
            raise ValueError(
                "minReplicas 0 (scale to zero) needs deploymentMode: Knative; Standard keeps "
                "at least 1 pod"
            )
        if self.max_replicas < self.min_replicas:
            raise ValueError(
                f"maxReplicas {self.max_replicas} is below minReplicas {self.min_replicas}"
            )
        if self.scale_target is not None and self.scale_metric is None:
            raise ValueError("scaleTarget needs scaleMetric: say what the target counts")
        if self.scale_metric == "memory" and self.scale_target is None:
            raise ValueError(
                "scaleMetric memory needs scaleTarget (percent of the memory request): KServe "
                "has no default for it"
            )
        return self


class ServerConfig(Section):
    """Network and process settings of the one server.

    Every field says, where it is declared, whether an edit of serve.yaml applies to the running
    server (``LIVE``) or needs a restart (``RESTART``: listeners, tokens, TLS, the storage
    folder). ``servekit serve --watch`` and a notebook's ``reload()`` keep the running value of a
    restart-only field (and report the edit); the JSON Schema shows the mark as ``live``.
    """

    name: str = Field("servekit", json_schema_extra=LIVE)
    """Server name reported by the V2 server metadata endpoint."""
    host: str = Field("127.0.0.1", json_schema_extra=RESTART)
    """Address both HTTP and gRPC listen on: the loopback interface by default, so nothing
    outside this machine reaches the server until you say so (`0.0.0.0` for every IPv4
    interface, `::` for every interface, or one address or host name)."""
    model_control: Literal["none", "explicit"] | None = Field(None, json_schema_extra=RESTART)
    """Whether clients may load and unload models through the repository API (`explicit`) or
    not (`none`: load and unload answer 403 / PERMISSION_DENIED; the index stays readable).
    Default: `explicit` when the server listens only on loopback or a repository token is
    configured, `none` otherwise. Editing serve.yaml under `--watch` works in either mode."""
    auth: AuthConfig = Field(AuthConfig(), json_schema_extra=RESTART)
    """Access tokens by API group (inference, metadata, repository, admin). On an address
    beyond loopback, a group without a token is open only if harmless to expose: the admin and
    repository groups are then closed (403) until they get one (docs/security.md)."""
    allowed_hosts: list[AllowedHost] = Field([], json_schema_extra=RESTART)
    """Host names HTTP clients may reach the server by, besides `localhost`, loopback and the
    bound addresses (a DNS-rebinding guard: any other `Host` header is answered 403). A name,
    `*.example.com` for every name under example.com, an IP address, or `*` to turn the check
    off. Bound to `0.0.0.0` or `::`, any IP address is accepted, names still need listing
    (a load balancer's or a Kubernetes Service's name, for example)."""
    tls: TlsConfig | None = Field(None, json_schema_extra=RESTART)
    """Serve HTTPS and gRPC over TLS (optionally mutual); default plain HTTP/gRPC."""
    strict_readiness: bool = Field(True, json_schema_extra=LIVE)
    """Readiness (`/v2/health/ready`, gRPC ServerReady, grps ready) is false while a model that
    serve.yaml or startupModels asks for is not READY, as in Triton; false: ready once the
    server is up and start-up loading is done."""
    limits: Limits = Field(Limits(), json_schema_extra=LIVE)
    """Bounds on what clients may push through the repository API."""
    network: NetworkLimits = Field(NetworkLimits(), json_schema_extra=RESTART)
    """Timeouts and connection, header and stream limits of the HTTP and gRPC listeners."""
    http_port: int = Field(8000, ge=0, le=65535, json_schema_extra=RESTART)
    """REST, dashboard and metrics port; 0 picks a free port."""
    grpc_port: int | None = Field(8001, ge=0, le=65535, json_schema_extra=RESTART)
    """gRPC port; 0 picks a free port; null disables gRPC."""
    grpc_max_message_bytes: int = Field(64 * 1024 * 1024, ge=1024, json_schema_extra=RESTART)
    """Largest gRPC message accepted or sent, in bytes."""
    grpc_poller_nice: int = Field(19, ge=0, le=19, json_schema_extra=RESTART)
    """How much lower than the rest of the server grpcio's poller thread runs (Linux nice
    steps; 0 keeps it equal). Lower priority lets the event loop finish its work before the
    poller takes the core, instead of being preempted at every gRPC event: on one core,
    about 20% more gRPC calls per second (docs/performance.md)."""
    max_request_bytes: int = Field(256 * 1024 * 1024, ge=1024, json_schema_extra=RESTART)
    """Largest HTTP request body accepted, in bytes (binary inference requests, pushed model
    files); JSON bodies are bounded by maxJsonRequestBytes too."""
    max_json_request_bytes: int = Field(64 * 1024 * 1024, ge=1024, json_schema_extra=RESTART)
    """Largest JSON inference request body (V2, V1, grps), in bytes: 64 MiB, as Triton. JSON
    tensors cost far more memory and time than their binary form; send large tensors with
    the binary tensor data extension (Inference-Header-Content-Length) instead."""
    storage_dir: str | None = Field(None, json_schema_extra=RESTART)
    """Folder for models pushed by clients (repository load with files); default
    `.servekit/storage` beside serve.yaml."""
    storage: StorageConfig = Field(StorageConfig(), json_schema_extra=RESTART)
    """Remote model storage (`s3://`, `gs://`, `az://`, `https://` storageUris): the local
    cache and its bounds."""
    startup_models: Literal["all", "none"] | list[str] = Field("all", json_schema_extra=LIVE)
    """Which models load at start: all, none, or a list of names (Triton's explicit mode).
    Models marked `load: onDemand` never load at start, whatever this says."""
    model_memory: ModelMemory | None = Field(None, json_schema_extra=LIVE)
    """Memory the models of one server process may hold, as bytes or a percentage of the
    machine's RAM (`"40%"`; a container's memory limit when lower): models marked
    `load: onDemand` are unloaded, least recently used first and never while a request uses
    them, to keep the measured resident size of every loaded model within it (models loaded at
    start count and stay). Each model's size is measured when it loads (docs/models.md,
    "Load on demand"). Default: no budget (on-demand models stay loaded once loaded)."""
    watch: bool = Field(False, json_schema_extra=RESTART)
    """Apply edits of serve.yaml while running (same as `servekit serve --watch`)."""
    inline_below_microseconds: int = Field(500, ge=0, json_schema_extra=LIVE)
    """ONNX models, and tabular models that are their library's own code (an XGBoost or
    LightGBM file, a pickle made only of scikit-learn's classes), measured faster than this (wall
    time of a call, measured in the model's worker threads first) run on the event loop thread,
    where a thread hop would cost more than the model; all others run in their own worker
    threads (Python models always do, as does a pickle holding a function or class of yours:
    their code may block on any call, and the loop also answers the liveness probes). A version seen
    slower than this while on the loop goes back to its threads, and after a few such moments
    stays there until it is reloaded. 0 keeps every model off the loop. An edit starts the
    measuring over."""
    drain_delay_seconds: float = Field(5.0, ge=0, le=3600, json_schema_extra=LIVE)
    """On SIGTERM (what Kubernetes, a rolling update or `docker stop` sends) readiness turns
    false at once on every surface, but new requests are still served for this many seconds,
    so a load balancer (or Kubernetes' endpoints) that still sends them until its next health
    check loses none; then the drain of `drainSeconds` begins. Ctrl-C (SIGINT) and a notebook's
    `server.stop()` skip it; a second SIGTERM cuts it short. Set it to at least the load
    balancer's health-check interval times its failure count (Kubernetes: the readiness
    probe's `periodSeconds` x `failureThreshold`) plus a second; 0 refuses new requests at
    once."""
    drain_seconds: float = Field(5.0, ge=0, le=3600, json_schema_extra=LIVE)
    """Graceful stop (SIGTERM after `drainDelaySeconds`, Ctrl-C, `server.stop()`): readiness is
    false and new inference requests are answered 503 / UNAVAILABLE, while queued and running
    ones finish for up to this many seconds (as Triton's `--exit-timeout-secs`); then
    keep-alive connections close after their current response and the listeners close, and the
    process exits even if a model call never returns (the call is abandoned)."""
    request_timeout_seconds: float | None = Field(None, gt=0, json_schema_extra=LIVE)
    """Server-wide cap on how long one inference request may take, queue and compute (a
    client's own deadline or `timeout` parameter may only shorten it); past it the request is
    answered 504 / DEADLINE_EXCEEDED. Default: no cap. An edit applies to the next request."""
    grps_streaming: GrpsStreaming = Field(GrpsStreaming(), json_schema_extra=LIVE)
    """How grps HTTP predict requests ask for streaming, and the streamed Content-Type."""
    grpc_answers: Literal["raw", "asSent"] = Field("raw", json_schema_extra=RESTART)
    """How gRPC inference answers carry their outputs: `raw` (`raw_output_contents`, what
    tritonclient reads, for every request that does not ask for typed contents with
    `binary_data_output: false`) or `asSent` (typed `contents` to a request whose inputs came
    typed, raw to one that came raw: what KServe's and MLServer's servers do, whose clients
    read an answer's typed contents). `servekit serve --model-dir` and MLServer project
    folders default to `asSent`."""
    workers: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] = Field(
        1, json_schema_extra=RESTART
    )
    """Server processes behind the same ports (`servekit serve`; notebooks always run one):
    each has its own event loop, listeners and model sessions, and a supervisor keeps one
    repository state and one set of statistics across them. `auto`: one per core this process
    may use. The onnxruntime threads are shared out so the workers never oversubscribe."""
    logging: LoggingConfig = Field(LoggingConfig(), json_schema_extra=RESTART)
    """Log format (text or JSON lines), level and the access log (docs/observability.md, "Logs")."""
    tracing: TracingConfig = Field(TracingConfig(), json_schema_extra=RESTART)
    """OpenTelemetry traces sent to an OTLP collector (docs/observability.md, "Traces"); the
    standard `OTEL_*` variables win where both set the same thing."""
    payload_log: PayloadLogConfig | None = Field(None, json_schema_extra=RESTART)
    """Record the requests and answers of the models marked `payloadLog: true` to a JSON-lines
    file or an HTTP endpoint (KServe's logger format): docs/observability.md, "Payload log"."""
    shared_memory: SharedMemoryMode = Field("off", json_schema_extra=RESTART)
    """Triton's system shared memory extension (clients on this host register POSIX shared
    memory objects and name them in inference requests instead of sending tensors): `off`
    (the default, as Triton now ships it: the register, status and unregister routes answer
    403 / PERMISSION_DENIED saying so) or `system`. `system` needs a loopback `host` or a
    `server.auth.repository` token, and one server process (`workers: 1`); registration is
    accepted from clients on this host only, for objects owned by the server's user and
    closed to group and others (mode 0600). docs/shared-memory.md."""
    kubernetes: KubernetesConfig = Field(KubernetesConfig(), json_schema_extra=LIVE)
    """The pods and scaling of `servekit export kserve` (docs/kserve.md); a running server
    ignores it."""
    requirements: list[PipRequirement] = Field([], json_schema_extra=RESTART)
    """Python packages the project's image installs (`servekit build`), one PEP 508
    requirement each: a name with optional extras, version and marker (`scipy==1.14.1`,
    `pandas[parquet]>=2`). Installed from the package index the build's pip uses, together with
    the folder's requirements.txt when it has one (one pip run: a conflict fails the build).
    Options (`-e`, `--index-url`, ...), URLs and paths are refused: a setting must not decide
    where the build fetches code (requirements.txt can). A running server never installs
    anything: an edit takes effect at the next build."""


def _restart_only() -> frozenset[str]:
    """ServerConfig fields marked RESTART; every field must carry a mark (checked at import, so
    a new setting cannot be added without deciding)."""
    marks = {name: f.json_schema_extra for name, f in ServerConfig.model_fields.items()}
    unmarked = [n for n, extra in marks.items() if extra not in (LIVE, RESTART)]
    if unmarked:
        raise TypeError(f"ServerConfig fields without a LIVE/RESTART mark: {unmarked}")
    return frozenset(name for name, extra in marks.items() if extra == RESTART)


RESTART_ONLY: frozenset[str] = _restart_only()
"""ServerConfig attribute names whose edits need a restart (the rest apply live)."""


class ModelFormat(Section):
    """What kind of model file this is, as in KServe's InferenceService modelFormat."""

    name: str
    """Format name, e.g. onnx or python."""
    version: str | None = None
    """Format version; when given, the runtime must list the same version."""


class SupportedModelFormat(Section):
    """A format a runtime can serve, as in KServe's ServingRuntime.supportedModelFormats."""

    name: str
    """Format name."""
    version: str | None = None
    """Format version; null means any version."""
    auto_select: bool = False
    """Whether models of this format that name no runtime may be given this runtime."""
    priority: int = Field(1, ge=1)
    """Among auto-selectable runtimes for a format, the highest priority wins; a tie is an
    error."""


class RuntimeOptions(Section):
    """Options of a runtime; a model's own `runtimeOptions` override its runtime's."""

    intra_op_threads: int | None = Field(None, ge=1, le=INT64_MAX)
    """Threads inside one operator; default: the machine's cores shared among all instances."""
    inter_op_threads: int | None = Field(None, ge=1, le=INT64_MAX)
    """Threads across independent operators (default 1)."""
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] | None = None
    """ONNX Runtime graph optimization level (default all)."""
    execution_providers: list[str] | None = None
    """ONNX Runtime execution providers in order of preference (default CPU)."""


class RuntimeConfig(Section):
    """A named runtime: a built-in implementation plus the formats it serves and options."""

    name: str
    """Runtime name, referred to by a model's `runtime`."""
    implementation: Literal["onnxruntime", "python", "sklearn", "xgboost", "lightgbm", "mlflow"]
    """Which built-in implementation runs the models."""
    supported_model_formats: list[SupportedModelFormat] = Field(min_length=1)
    """Formats this runtime serves."""
    options: RuntimeOptions = RuntimeOptions()
    """Options for every model on this runtime."""


class LatestPolicy(Section):
    """Serve the highest N versions."""

    num_versions: int = Field(1, ge=1, le=UINT32_MAX)
    """How many of the highest versions to serve."""


class AllPolicy(Section):
    """Serve every version found."""


class SpecificPolicy(Section):
    """Serve exactly the listed versions."""

    versions: list[Annotated[int, Field(ge=0, le=2**63 - 1)]] = Field(min_length=1)
    """Version numbers to serve (version folder names: 0 to 2^63-1, as Triton's int64)."""


class VersionPolicy(Section):
    """Which versions to serve (exactly one of latest, all, specific), as in Triton."""

    latest: LatestPolicy | None = None
    """Serve the highest N versions."""
    all: AllPolicy | None = None
    """Serve every version."""
    specific: SpecificPolicy | None = None
    """Serve the listed versions."""

    @model_validator(mode="after")
    def _exactly_one(self) -> VersionPolicy:
        chosen = [k for k in ("latest", "all", "specific") if getattr(self, k) is not None]
        if len(chosen) != 1:
            raise ValueError("give exactly one of latest, all, specific")
        return self


class TensorOverride(Section):
    """Metadata of an input or output declared in serve.yaml instead of read from the file."""

    name: str
    """Tensor name."""
    datatype: str | None = None
    """V2 datatype (FP32, INT64, BYTES, ...)."""
    shape: list[Annotated[int, Field(ge=-1, le=INT64_MAX)]] | None = None
    """Shape, -1 for a dynamic dimension."""
    format: Literal["FORMAT_NONE", "FORMAT_NCHW", "FORMAT_NHWC"] | None = None
    """Inputs only: the image layout the input expects, shown in the model configuration
    (Triton's ModelInput.format; clients such as Triton's image_client read it)."""
    optional: bool = False
    """Inputs only: a request may leave this input out (Triton's ModelInput.optional); a
    Python model then receives only the inputs that were sent (give the argument a default)."""
    labels: list[str] | None = None
    """Outputs only: class labels by index, for the classification extension (an output
    requested with `classification: k` answers its top k as "value:index:label"). Default: the
    lines of labels.txt beside the model."""


MAX_QUEUE_DELAY_MICROSECONDS = 1_000_000
"""Bound of ``dynamicBatching.maxQueueDelayMicroseconds`` (1 s), in serve.yaml and in configs
pushed with a repository load alike. A batching delay is meant to be a fraction of one model
call (Triton's examples use 100 us to a few ms); a second already holds requests rather than
batching them, and without a bound a pushed config could make requests wait for days."""


class DynamicBatching(Section):
    """Server-side batching of concurrent requests into one model call."""

    max_queue_delay_microseconds: int = Field(
        100, ge=0, json_schema_extra={"maximum": MAX_QUEUE_DELAY_MICROSECONDS}
    )
    """Longest a request may wait for others to join its batch, at most 1000000 (1 s).
    servekit never holds a request back while an instance of the model is free: batches form
    from the requests that queue while every instance is busy, so batching adds no latency at
    low load and this bound is rarely reached (kept for Triton compatibility)."""
    preferred_batch_size: list[Annotated[int, Field(ge=1, le=INT32_MAX)]] = []
    """Batch sizes to aim for: when more rows wait than fit, a batch stops at the largest
    preferred size it can reach (else at maxBatchSize)."""

    @field_validator("max_queue_delay_microseconds")
    @classmethod
    def _bounded_delay(cls, value: int) -> int:
        if value > MAX_QUEUE_DELAY_MICROSECONDS:
            raise ValueError(
                f"maxQueueDelayMicroseconds {value} is over {MAX_QUEUE_DELAY_MICROSECONDS} (1 s): "
                "a batching delay holds every request of the batch that long; keep it a "
                "fraction of one model call"
            )
        return value


PIPELINE_FORMAT = "ensemble"
"""The format (and Triton platform) of a model that is a pipeline of other models."""


class PipelineStep(Section):
    """One step of a pipeline (Triton's ModelEnsembling.Step): a served model, fed from the
    pipeline's tensors and adding its outputs to them."""

    model: str
    """The model this step runs (any model of serve.yaml, a pipeline included)."""
    version: int | None = Field(None, ge=1, le=INT64_MAX)
    """Its version; default the version an unversioned request gets."""
    inputs: dict[str, str] = Field(min_length=1)
    """The step model's input name -> the pipeline tensor it is given (a pipeline input or an
    earlier step's output)."""
    outputs: dict[str, str] = Field(min_length=1)
    """The step model's output name -> the pipeline tensor it becomes (a pipeline output, or
    a tensor later steps take)."""


class WarmupInput(Section):
    """One input of a warm-up sample (Triton's ModelWarmup.Input): its datatype, its shape
    without the batch dimension, and where its values come from (exactly one of them)."""

    data_type: str
    """V2 datatype (FP32, INT64, BYTES, ...) or Triton's name (TYPE_FP32, TYPE_STRING)."""
    dims: list[Annotated[int, Field(ge=0, le=1 << 24)]]
    """Shape of one sample, without the batch dimension when maxBatchSize > 0."""
    zero_data: bool | None = None
    """Zeros (BYTES: empty strings)."""
    random_data: bool | None = None
    """Random values (BYTES: random digits)."""
    input_data_file: str | None = None
    """A file, relative to serve.yaml, holding the input's raw little-endian values in
    row-major order (BYTES: each element a 4-byte little-endian length, then its bytes)."""

    @model_validator(mode="after")
    def _one_source(self) -> WarmupInput:
        given = [self.zero_data, self.random_data, self.input_data_file]
        if sum(1 for g in given if g) != 1:
            raise ValueError("give exactly one of zeroData: true, randomData: true, inputDataFile")
        return self


class WarmupSample(Section):
    """A warm-up request run when the model loads, before it is READY (Triton's model_warmup):
    what pays for lazy initialisation (ONNX Runtime's first run, a Python model's caches) so
    the first client does not."""

    name: str
    """Name of the sample (shown in the log and in the reason of a failed warm-up)."""
    batch_size: int = Field(1, ge=0, le=INT32_MAX)
    """Rows of the request when maxBatchSize > 0 (at most maxBatchSize); ignored otherwise."""
    count: int = Field(1, ge=1, le=10_000)
    """How many times the sample runs."""
    inputs: dict[str, WarmupInput]
    """The sample's inputs by name (every input of the model)."""


class ModelConfig(Section):
    """One served model."""

    name: str
    """Model name used in URLs and requests."""
    model_format: ModelFormat
    """Format of the model, e.g. {name: onnx}. Required, except for a pipeline."""
    pipeline: list[PipelineStep] | None = Field(None, min_length=1)
    """This model is a pipeline of other served models (Triton's ensemble): its steps, each a
    model with input and output maps onto the pipeline's tensors. Steps run in the server's
    process, handing arrays over without copies; steps whose inputs are ready run together.
    A pipeline declares its own `inputs` and `outputs` (name, datatype, shape) and has no
    modelFormat, storageUri or entrypoint."""
    storage_uri: str | None = None
    """Path relative to serve.yaml, or a remote URI (`s3://`, `gs://`, `az://`,
    `https://<account>.blob.core.windows.net/...`, `https://` for one file or a `.tar.gz` /
    `.zip` archive): a folder of numbered version folders, one model file, or an archive."""
    entrypoint: str | None = None
    """For Python models: `module:attr`, a class with load/predict or a function."""
    runtime: str | None = None
    """Runtime by name; default chosen by format (autoSelect and priority)."""
    version_policy: VersionPolicy = VersionPolicy(latest=LatestPolicy())
    """Which versions to serve; default the highest one."""
    default_version: int | None = Field(None, ge=0, le=INT64_MAX)
    """Version answering unversioned requests; default the highest served."""
    max_batch_size: int = Field(0, ge=0, le=INT32_MAX)
    """Largest batch the model accepts along its first dimension; 0 disables batching."""
    dynamic_batching: DynamicBatching | None = None
    """Batch concurrent requests together (needs maxBatchSize > 0)."""
    sequence_batching: SequenceBatching | None = None
    """A stateful model (Triton's sequence batching): requests carrying a correlation ID
    (`sequence_id`, `sequence_start`, `sequence_end`) go to one instance per sequence, in
    order, with control inputs (START, END, READY, CORRID) and implicit state filled by the
    server. Not with dynamicBatching (sequences batch by their own rules)."""
    instances: int = Field(1, ge=1, le=INT32_MAX)
    """Number of model instances serving requests in parallel: each has its own session (or
    Python object) and its own worker thread."""
    load: Literal["atStart", "onDemand"] = "atStart"
    """When the model loads: `atStart` (as `server.startupModels` says) or `onDemand`: not at
    start, but by its first inference request, which waits for the load (within its deadline,
    else 503 with `Retry-After`); under `server.modelMemory` it is unloaded again when memory
    is needed and it has been used least recently. Not for pipelines or sequence models."""
    max_queue_size: int = Field(1024, ge=0, le=INT32_MAX)
    """Most requests that may wait for an instance of this model; one more is refused at once
    with HTTP 429 (and `Retry-After`) / gRPC RESOURCE_EXHAUSTED, rather than waiting on a
    queue that only grows. 0: no limit (as Triton's max_queue_size)."""
    queue_timeout_microseconds: int = Field(0, ge=0, le=INT64_MAX)
    """Longest a request may wait in this model's queue before it starts; past it the request
    is answered 504 / DEADLINE_EXCEEDED and never runs (Triton's default_timeout_microseconds).
    0: no queue timeout (client deadlines and server.requestTimeoutSeconds still apply)."""
    inputs: list[TensorOverride] | None = None
    """Input metadata overrides, or the full list for Python models."""
    outputs: list[TensorOverride] | None = None
    """Output metadata overrides, or the full list for Python models."""
    runtime_options: RuntimeOptions | None = None
    """Options overriding the runtime's for this model."""
    parameters: dict[str, Any] = {}
    """Free-form parameters handed to the model (e.g. to a Python model's load)."""
    convert: Literal["onnx"] | None = None
    """`onnx`: a sklearn, xgboost or lightgbm model is converted to ONNX when it loads
    (skl2onnx; onnxmltools for XGBoost and LightGBM), run next to the native model on sample
    rows, and served by ONNX Runtime only when every output agrees (within 1e-5 + 1e-4 x the
    native value, labels equal); the metadata stays the native model's. When conversion fails
    or disagrees, the native model serves and the version's reason says why."""
    isolation: Literal["none", "process"] = "none"
    """Where a Python model runs. `none` (default): in the server's process. `process`: in a
    child process of its own (one per instance), fed over a socket, as Triton's Python backend
    stub: a crash (segfault, abort), an out-of-memory kill or a call that hangs past
    `timeoutSeconds` makes this model UNAVAILABLE with the reason while its process restarts,
    and every other model keeps serving (server readiness included); 5 such losses within 60 s
    stop the restarts until the model is loaded again (circuit breaker). Costs a round trip per
    call (tens of microseconds)."""
    timeout_seconds: float | None = Field(None, gt=0, le=86_400)
    """For `isolation: process`: longest one call may run in the child process; past it the
    process is killed and restarted and the request answered 503 / UNAVAILABLE. Default 60. A
    request's own shorter deadline answers that request 504 / DEADLINE_EXCEEDED and leaves
    the call to finish in the process (its answer dropped), which is not killed for it."""
    memory_limit_bytes: int | None = Field(None, ge=64 * 1024 * 1024, le=INT64_MAX)
    """For `isolation: process`: the child's RLIMIT_DATA (heap and private anonymous memory,
    not shared libraries or mapped files), so an allocation past it fails with MemoryError
    inside the model, which restarts the process and answers 503. Default: no limit. At least
    64 MiB; the child's Python with numpy uses about 40 MiB of it before the model loads."""
    grps_message: bool = False
    """Python models: predict takes the whole grps GrpsMessage and returns one, as a grps model
    does (also when predict's one argument is annotated GrpsMessage)."""
    payload_log: bool = False
    """Write this model's requests and answers to the payload log (`server.payloadLog`, which
    says where, which share and which parts)."""
    warmup: list[WarmupSample] = []
    """Warm-up samples run at every load, before the version is READY (Triton's model_warmup):
    a failing one leaves it UNAVAILABLE with the reason; a reload warms the new version before
    it takes traffic."""
    version_labels: dict[Annotated[str, Field(min_length=1, max_length=64)], int] = {}
    """Names for version numbers (grps' `1.0.0: 1`): a request may name the version instead,
    and a version folder may be named by its label (`models/m/1.0.0/model.onnx`)."""
    traffic: TrafficSplit | None = None
    """How requests naming no version are shared between versions, `{"2": 90, "3": 10}`
    (percentages adding up to 100; versions by number or label): a canary. A request with a
    `servekit-traffic-key` header (gRPC metadata) always reaches the same version for the same
    key; requests naming a version are untouched. Not with defaultVersion."""
    shadow: ShadowConfig | None = None
    """A version that also gets a copy of a share of the requests naming no version,
    `{version: "3", share: 0.2}`: its answer never reaches the client and is compared with the
    one that did (agreement in statistics, metrics and the dashboard); copies wait in a
    bounded queue and are dropped (and counted) when it is full, so it never slows the answer."""
    openai: OpenAISettings | None = None
    """Serve this model on the OpenAI-compatible routes (`/openai/v1/`) as `{kind: chat}`,
    `completion` or `embedding` (`openai: chat` for short); its declared inputs and outputs
    must be the ones that kind hands it (docs/openai.md, "OpenAI-compatible routes")."""

    @field_validator("version_labels")
    @classmethod
    def _labels_are_not_numbers(cls, value: dict[str, int]) -> dict[str, int]:
        for label in value:
            if label.isdigit():
                raise ValueError(f"version label {label!r} is a number; labels name versions")
        return value

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not MODEL_NAME.match(value):
            raise ValueError(
                "model names use letters, digits, '_', '.', '-', start with a letter or digit, "
                "and are at most 128 characters"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _pipeline_format(cls, data: Any) -> Any:
        """A pipeline's format is ``ensemble`` without saying so (its steps have formats)."""
        pipeline = isinstance(data, dict) and data.get("pipeline") is not None
        if pipeline and "modelFormat" not in data and "model_format" not in data:
            return {**data, "model_format": {"name": PIPELINE_FORMAT}}
        return data

    @model_validator(mode="after")
    def _has_source(self) -> ModelConfig:
        if self.pipeline is not None or self.model_format.name == PIPELINE_FORMAT:
            return self._pipeline_checked()
        if self.storage_uri is None and self.entrypoint is None:
            raise ValueError("give storageUri (a model file or folder) or entrypoint (Python)")
        if self.storage_uri is not None:
            remote_scheme(self.storage_uri)  # a scheme servekit cannot read is a config error
        if self.dynamic_batching is not None and self.max_batch_size == 0:
            raise ValueError("dynamicBatching needs maxBatchSize > 0 (the rows one batch may hold)")
        if self.dynamic_batching is not None and self.sequence_batching is not None:
            raise ValueError(
                "give dynamicBatching or sequenceBatching, not both (a sequence model batches "
                "the requests of different sequences by sequenceBatching's strategy)"
            )
        for tensor in self.inputs or ():
            if tensor.labels is not None:
                raise ValueError(f"input {tensor.name!r}: labels belong to outputs")
        for tensor in self.outputs or ():
            if tensor.format is not None:
                raise ValueError(f"output {tensor.name!r}: format belongs to inputs")
            if tensor.optional:
                raise ValueError(f"output {tensor.name!r}: optional belongs to inputs")
        if self.openai is not None and self.model_format.name == "python":
            # A Python model's lists are its whole signature (other formats' are overrides,
            # checked against the loaded model when a request comes).
            check_fits(self.openai.kind, _declared(self.inputs), _declared(self.outputs))
        if self.load == "onDemand" and self.sequence_batching is not None:
            raise ValueError(
                "load: onDemand is not for a sequence model (unloading it would lose its "
                "sequences' state)"
            )
        self._routing_checked()
        if self.isolation != "process" and (
            self.timeout_seconds is not None or self.memory_limit_bytes is not None
        ):
            raise ValueError(
                "timeoutSeconds and memoryLimitBytes apply to isolation: process only (a model "
                "in the server's process cannot be stopped or limited on its own)"
            )
        return self

    def _routing_checked(self) -> None:
        """traffic and shadow name versions a request may reach (app/servekit/config/traffic.py
        resolves them); the compiler checks that the version policy serves them."""
        if self.traffic is None and self.shadow is None:
            return
        if self.default_version is not None and self.traffic is not None:
            raise ValueError(
                "give defaultVersion or traffic, not both (traffic decides where requests "
                "naming no version go)"
            )
        if self.sequence_batching is not None:
            raise ValueError(
                "traffic and shadow are not offered for a sequence model (the requests of a "
                "sequence must all reach one version)"
            )
        routing_of(self.traffic, self.shadow, self.version_labels)

    def _pipeline_checked(self) -> ModelConfig:
        """A pipeline runs other models: it has steps and declared tensors, and nothing of a
        model of its own (where its steps' tensors go is checked against the other models
        by the compiler: app/servekit/config/pipelines.py)."""
        if self.pipeline is None:
            raise ValueError(f"modelFormat {PIPELINE_FORMAT!r} is a pipeline: give pipeline: steps")
        if self.model_format.name != PIPELINE_FORMAT:
            raise ValueError("a pipeline has no modelFormat (its steps' models have theirs)")
        own = {
            "storageUri": self.storage_uri,
            "entrypoint": self.entrypoint,
            "runtime": self.runtime,
            "dynamicBatching": self.dynamic_batching,
            "sequenceBatching": self.sequence_batching,
            "runtimeOptions": self.runtime_options,
            "traffic": self.traffic,
            "shadow": self.shadow,
        }
        given = [key for key, value in own.items() if value is not None]
        if self.isolation != "none":
            given.append("isolation")
        if self.load != "atStart":
            given.append("load")
        if given:
            raise ValueError(
                f"a pipeline runs other models and has no {', '.join(given)} (set them on the "
                "models of its steps)"
            )
        for kind, tensors in (("inputs", self.inputs), ("outputs", self.outputs)):
            if not tensors:
                raise ValueError(f"a pipeline declares its {kind} (name, datatype, shape)")
            for tensor in tensors:
                if tensor.datatype is None or tensor.shape is None:
                    raise ValueError(f"pipeline {kind} {tensor.name!r}: give datatype and shape")
        return self


def _declared(tensors: list[TensorOverride] | None) -> list[Declared] | None:
    """serve.yaml's tensor list as the openai kind check reads it (None: not declared)."""
    if tensors is None:
        return None
    return [Declared(t.name, t.datatype, t.optional) for t in tensors]


class ServeConfig(BaseSettings):
    """The whole serve.yaml."""

    model_config = SettingsConfigDict(
        env_prefix="SERVEKIT_",
        env_nested_delimiter="__",
        env_parse_none_str="null",  # SERVEKIT_SERVER__GRPCPORT=null disables gRPC, as in YAML
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        frozen=True,
    )

    server: ServerConfig = ServerConfig()
    """Network and process settings."""
    runtimes: list[RuntimeConfig] = []
    """Runtimes beyond the built-in onnxruntime and python (same name replaces a built-in)."""
    models: list[ModelConfig] = []
    """Served models."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Environment variables override the file (the file arrives as init values)."""
        return (env_settings, init_settings)

    @field_validator("models", "runtimes")
    @classmethod
    def _unique_names(cls, items: list[Any], info: ValidationInfo) -> list[Any]:
        """A name used twice is an error; ``index`` in its context lets the loader point at the
        second entry's line instead of the top of the file."""
        seen: dict[str, int] = {}
        for index, item in enumerate(items):
            if item.name in seen:
                raise PydanticCustomError(
                    "duplicate_name",
                    "{kind} name '{name}' is used twice (first at {field}[{first}])",
                    {
                        "kind": "model" if info.field_name == "models" else "runtime",
                        "name": item.name,
                        "field": info.field_name,
                        "first": seen[item.name],
                        "index": index,
                    },
                )
            seen[item.name] = index
        return items


def json_schema() -> dict[str, Any]:
    """JSON Schema of serve.yaml, with field docstrings as descriptions."""
    schema = ServeConfig.model_json_schema(by_alias=True)
    schema["title"] = "servekit serve.yaml"
    model = schema["$defs"]["ModelConfig"]  # a pipeline needs none (see _pipeline_format)
    model["required"] = [key for key in model.get("required", []) if key != "modelFormat"]
    return schema
