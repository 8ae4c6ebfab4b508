"""Compile a ServeConfig into a frozen ServePlan: paths resolved, runtimes chosen, versions listed.

Pure apart from listing the model folders. Runtime choice follows KServe's rules: an explicit
``runtime`` must exist and support the model's format (and version, when given); otherwise the
auto-selectable runtimes supporting it are candidates and the highest priority wins. No
candidate, or a tie at the top, is a config error naming the candidates. A model whose files are
missing is *not* a config error: it compiles with a ``problem`` and is served as UNAVAILABLE.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from servekit.config.auth import (
    AccessPolicy,
    ApiGroup,
    TokenError,
    close_public_groups,
    resolve_policy,
)
from servekit.config.hosts import is_loopback
from servekit.config.loader import ConfigError, ConfigIssue, line_in_file
from servekit.config.payload_log import payload_log_issues
from servekit.config.pipelines import PIPELINE_RUNTIME, pipeline_issues
from servekit.config.remote_uris import local_path, remote_scheme
from servekit.config.schema import (
    PIPELINE_FORMAT,
    ModelConfig,
    PipelineStep,
    RuntimeConfig,
    RuntimeOptions,
    ServeConfig,
    ServerConfig,
    SupportedModelFormat,
    TensorOverride,
)
from servekit.config.sequences import SequenceBatching
from servekit.config.tls import TlsError, TlsFiles, resolve_tls
from servekit.config.traffic import Routing, missing_versions, routing_of
from servekit.config.versions import (
    VersionSource,
    discover_versions,
    files_of,
    select_versions,
)
from servekit.shown_paths import hide_paths

TABULAR_FORMAT_VERSIONS: dict[str, tuple[str, ...]] = {
    "sklearn": ("1",),
    "xgboost": ("1", "2", "3"),
    "lightgbm": ("3", "4"),
    "mlflow": ("1", "2", "3"),
}
"""The versions of each tabular format servekit serves, as KServe names them (the library's
major version; MLServer's ServingRuntime lists them the same way): the model files of these
versions load with the libraries servekit's extras install (XGBoost and LightGBM read their
older files, a pyfunc model of MLflow 1 or 2 loads in MLflow 3). An InferenceService that names
another version is not given to servekit by KServe, nor accepted by serve.yaml."""

BUILTIN_RUNTIMES: tuple[RuntimeConfig, ...] = (
    RuntimeConfig(
        name="onnxruntime",
        implementation="onnxruntime",
        supported_model_formats=[SupportedModelFormat(name="onnx", version="1", auto_select=True)],
    ),
    RuntimeConfig(
        name="python",
        implementation="python",
        supported_model_formats=[SupportedModelFormat(name="python", auto_select=True)],
    ),
    # The tabular formats, by KServe's format names (app/servekit/runtimes/tabular.py). Each
    # library is an extra (servekit[sklearn], ...): without it the model is UNAVAILABLE.
    *(
        RuntimeConfig(
            name=fmt,
            implementation=fmt,
            supported_model_formats=[
                SupportedModelFormat(name=fmt, version=v, auto_select=True) for v in versions
            ],
        )
        for fmt, versions in TABULAR_FORMAT_VERSIONS.items()
    ),
)
TABULAR_IMPLEMENTATIONS = frozenset({"sklearn", "xgboost", "lightgbm", "mlflow"})
"""Runtimes that load a model with its own library; sklearn and mlflow files are pickles
(code runs when they load), so app/servekit/models/pushed_config.py lets only serve.yaml
declare any of them."""

CONVERTIBLE = frozenset({"sklearn", "xgboost", "lightgbm"})
"""Runtimes whose models ``convert: onnx`` turns into ONNX at load
(app/servekit/runtimes/converted.py)."""

ROW_WISE = CONVERTIBLE
"""Runtimes whose models answer each row of a call on its own (the library's ``predict`` of N
rows is N predicts of one), so the requests waiting for one are stacked into one call by
default (app/servekit/services/execution/jobs.py); not MLflow, whose pyfunc may be any code."""


@dataclass(frozen=True)
class ResolvedOptions:
    """Runtime options with every default filled in."""

    intra_op_threads: int
    inter_op_threads: int
    graph_optimization_level: str
    execution_providers: tuple[str, ...]


@dataclass(frozen=True)
class ModelPlan:
    """Everything needed to load one model, decided before anything runs."""

    name: str
    format_name: str
    format_version: str | None
    runtime: str
    implementation: str
    options: ResolvedOptions
    versions: tuple[VersionSource, ...]
    default_version: int | None
    max_batch_size: int
    instances: int
    entrypoint: str | None
    inputs: tuple[TensorOverride, ...] | None
    outputs: tuple[TensorOverride, ...] | None
    parameters: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)
    config: ModelConfig | None = None
    problem: str | None = None  # why no version can load (missing folder, ...)
    labels_file: tuple[str, ...] = field(default=(), hash=False, compare=True)
    """The lines of labels.txt beside the model (classification labels by index), if any."""
    remote: str | None = None
    """The remote storageUri the versions come from (None: a local path or no files). Until
    the server has fetched it, the plan has one version with no file (see plan_model)."""
    cached_copy: str | None = None
    """Set when the remote store could not be reached and the versions are read from the copy
    the cache took earlier: the warning each READY version's reason and the dashboard show
    (app/servekit/models/remote.py), cleared by the next fetch that reaches the store."""
    pipeline: tuple[PipelineStep, ...] = ()
    """A pipeline's steps (Triton's ensemble; app/servekit/services/composition/pipelines.py
    runs them); empty for a model of its own."""
    sequence: SequenceBatching | None = None
    """serve.yaml's ``sequenceBatching`` (app/servekit/services/sequences/ runs it); a
    field, not read through ``config``, because every request of every model asks for it."""
    routing: Routing | None = None
    """serve.yaml's ``traffic`` and ``shadow`` as version numbers (app/servekit/services/
    traffic.py applies them); a field for the same reason as ``sequence``."""

    @property
    def on_demand(self) -> bool:
        """serve.yaml's ``load: onDemand``: loaded by its first request, not at start, and
        unloaded under ``server.modelMemory`` (app/servekit/services/memory.py)."""
        return self.config is not None and self.config.load == "onDemand"

    def labels(self, output: str) -> tuple[str, ...]:
        """Class labels of ``output``: serve.yaml's ``outputs[].labels``, else labels.txt."""
        for tensor in self.outputs or ():
            if tensor.name == output and tensor.labels is not None:
                return tuple(tensor.labels)
        return self.labels_file


@dataclass(frozen=True)
class ServePlan:
    """A compiled serve.yaml."""

    server: ServerConfig
    models: tuple[ModelPlan, ...]
    runtimes: tuple[RuntimeConfig, ...]
    base_dir: Path
    config_path: Path | None
    access: AccessPolicy = field(default_factory=AccessPolicy)
    """The tokens of ``server.auth``, read from their environment variables or files."""
    tls: TlsFiles | None = None
    """``server.tls`` read and checked (None: plain HTTP and gRPC)."""

    def model(self, name: str) -> ModelPlan | None:
        return next((m for m in self.models if m.name == name), None)

    def loads_at_start(self, name: str) -> bool:
        """Whether ``server.startupModels`` asks for ``name``: at start, and for a model a
        serve.yaml edit adds (the one statement of the rule; --only selects its model too).
        A ``load: onDemand`` model never does: its first request loads it."""
        model = self.model(name)
        if model is not None and model.on_demand:
            return False
        choice = self.server.startup_models
        return choice == "all" or (isinstance(choice, list) and name in choice)

    @property
    def model_control(self) -> Literal["none", "explicit"]:
        """``server.modelControl``, or its default: clients may load and unload models when
        only this machine can reach the server or a repository token guards the API."""
        if self.server.model_control is not None:
            return self.server.model_control
        guarded = is_loopback(self.server.host) or self.access.protects(ApiGroup.REPOSITORY)
        return "explicit" if guarded else "none"


def compile_plan(config: ServeConfig, base_dir: Path, config_path: Path | None = None) -> ServePlan:
    """Compile ``config``; raise ConfigError listing every model whose runtime cannot be chosen."""
    runtimes = merged_runtimes(config.runtimes)
    cores = available_cores()
    total_instances = sum(m.instances for m in config.models) or 1
    issues: list[ConfigIssue] = []
    models: list[ModelPlan] = []
    for index, model in enumerate(config.models):
        if model.pipeline is not None:
            models.append(plan_pipeline(model))
            continue
        try:
            runtime = choose_runtime(model, runtimes)
        except ValueError as exc:
            key = "runtime" if model.runtime is not None else "modelFormat"
            line = line_in_file(config_path, ["models", index, key])
            issues.append(ConfigIssue(f"models[{index}].{key}", line, str(exc)))
            continue
        if model.isolation == "process" and runtime.implementation != "python":
            line = line_in_file(config_path, ["models", index, "isolation"])
            issues.append(
                ConfigIssue(
                    f"models[{index}].isolation",
                    line,
                    f"isolation: process runs Python models only; runtime {runtime.name!r} is "
                    f"{runtime.implementation}",
                )
            )
            continue
        if model.convert is not None and runtime.implementation not in CONVERTIBLE:
            line = line_in_file(config_path, ["models", index, "convert"])
            issues.append(
                ConfigIssue(
                    f"models[{index}].convert",
                    line,
                    f"convert: {model.convert} converts sklearn, xgboost and lightgbm models; "
                    f"runtime {runtime.name!r} is {runtime.implementation}",
                )
            )
            continue
        options = resolve_options(runtime.options, model.runtime_options, cores, total_instances)
        planned = plan_model(model, runtime, options, base_dir)
        models.append(planned)
        missing = routing_problem(planned)
        if missing is not None:
            key = "traffic" if model.traffic is not None else "shadow"
            line = line_in_file(config_path, ["models", index, key])
            issues.append(ConfigIssue(f"models[{index}].{key}", line, missing))
    try:
        access = resolve_policy(config.server.auth, base_dir)
        access = close_public_groups(access, config.server.host, config.server.model_control)
    except TokenError as exc:
        line = line_in_file(config_path, exc.field.split("."))
        issues.append(ConfigIssue(exc.field, line, str(exc)))
        access = AccessPolicy()
    try:
        tls = resolve_tls(config.server.tls, base_dir)
    except TlsError as exc:
        line = line_in_file(config_path, exc.field.split("."))
        issues.append(ConfigIssue(exc.field, line, str(exc)))
        tls = None
    issues.extend(shared_memory_issues(config.server, access, config_path))
    issues.extend(pipeline_issues(config.models, config_path))
    issues.extend(sequence_issues(config, config_path))
    issues.extend(payload_log_issues(config, config_path, worker_processes(config.server)))
    if issues:
        raise ConfigError(str(config_path or "serve.yaml"), issues)
    return ServePlan(
        config.server, tuple(models), tuple(runtimes.values()), base_dir, config_path, access, tls
    )


def routing_problem(plan: ModelPlan) -> str | None:
    """Why a local model's ``traffic`` or ``shadow`` names a version its version policy does
    not serve (None: it does, or the model has neither, or its versions are not known until it
    is fetched: then a version not ready is skipped, app/servekit/services/traffic.py)."""
    routing = plan.routing
    if routing is None or plan.remote is not None or plan.problem is not None:
        return None
    served = {v.version for v in plan.versions if v.problem is None}
    missing = missing_versions(routing, served)
    unsplit = missing is None and not routing.versions and plan.default_version is None
    if unsplit and routing.shadow == max(served, default=None):
        return (
            f"shadow version {routing.shadow} is the highest, the one requests naming no "
            "version reach, so it would get no copies: say which version serves them with "
            "defaultVersion or traffic"
        )
    return missing


def sequence_issues(config: ServeConfig, config_path: Path | None) -> list[ConfigIssue]:
    """Sequence batching keeps each sequence in one process: under several workers the
    requests of one sequence could reach two of them."""
    if worker_processes(config.server) <= 1:
        return []
    return [
        ConfigIssue(
            f"models[{index}].sequenceBatching",
            line_in_file(config_path, ["models", index, "sequenceBatching"]),
            f"sequenceBatching needs one server process (workers: 1, here "
            f"{config.server.workers!r}): the requests of a sequence could reach two workers",
        )
        for index, model in enumerate(config.models)
        if model.sequence_batching is not None
    ]


def shared_memory_issues(
    server: ServerConfig, access: AccessPolicy, config_path: Path | None
) -> list[ConfigIssue]:
    """Why ``server.sharedMemory: system`` cannot be served as configured (empty: it can).

    A registered region makes the server read and write a file in /dev/shm that a client
    names, so registering must be reserved to someone the operator trusts: only this machine
    (a loopback host) or the holders of the repository token. Regions live in one process, so
    under several workers a region registered through one would be unknown to the others."""
    if server.shared_memory != "system":
        return []
    line = line_in_file(config_path, ["server", "sharedMemory"])
    issues: list[ConfigIssue] = []
    if not (is_loopback(server.host) or access.protects(ApiGroup.REPOSITORY)):
        issues.append(
            ConfigIssue(
                "server.sharedMemory",
                line,
                f"sharedMemory: system lets clients make the server read and write shared "
                f"memory objects of its host; with host {server.host!r} any client on the "
                "network could register one. Listen on loopback (host: 127.0.0.1) or protect "
                "the repository API with a token (server.auth.repository)",
            )
        )
    if worker_processes(server) > 1:
        issues.append(
            ConfigIssue(
                "server.sharedMemory",
                line,
                f"sharedMemory: system needs one server process (workers: 1, here "
                f"{server.workers!r}): a region registered through one worker would be unknown "
                "to the others, so requests naming it would fail at random",
            )
        )
    return issues


def worker_processes(server: ServerConfig) -> int:
    """How many server processes ``server.workers`` starts (``auto``: one per core here)."""
    return available_cores() if server.workers == "auto" else server.workers


def available_cores() -> int:
    """Cores this process may run on (respects taskset/cgroup affinity, unlike cpu_count); in
    a worker of ``server.workers`` its share, so the workers never oversubscribe the machine."""
    share = os.environ.get("_SERVEKIT_WORKER_CORES", "")
    if share.isdigit() and int(share) > 0:
        return int(share)
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # pragma: no cover - platforms without affinity
        return os.cpu_count() or 1


def merged_runtimes(declared: list[RuntimeConfig]) -> dict[str, RuntimeConfig]:
    """Built-in runtimes, with declared ones added (a declared name replaces a built-in)."""
    runtimes = {r.name: r for r in BUILTIN_RUNTIMES}
    runtimes.update({r.name: r for r in declared})
    return runtimes


def _supports(fmt: SupportedModelFormat, name: str, version: str | None) -> bool:
    if fmt.name.lower() != name.lower():
        return False
    return version is None or fmt.version is None or fmt.version == version


def choose_runtime(model: ModelConfig, runtimes: dict[str, RuntimeConfig]) -> RuntimeConfig:
    """Pick the runtime for ``model`` by KServe's rules; ValueError explains a failed choice."""
    name, version = model.model_format.name, model.model_format.version
    wanted = f"{name}" + (f" version {version}" if version else "")
    if model.runtime is not None:
        runtime = runtimes.get(model.runtime)
        if runtime is None:
            raise ValueError(
                f"runtime {model.runtime!r} is not defined; known runtimes: "
                f"{', '.join(sorted(runtimes))}"
            )
        if not any(_supports(f, name, version) for f in runtime.supported_model_formats):
            raise ValueError(f"runtime {model.runtime!r} does not support format {wanted}")
        return runtime
    candidates: list[tuple[int, RuntimeConfig]] = []
    for runtime in runtimes.values():
        priorities = [
            f.priority
            for f in runtime.supported_model_formats
            if f.auto_select and _supports(f, name, version)
        ]
        if priorities:
            candidates.append((max(priorities), runtime))
    if not candidates:
        raise ValueError(
            f"no runtime with autoSelect supports format {wanted}; "
            f"name one with `runtime:` or declare one under `runtimes:`"
        )
    candidates.sort(key=lambda c: c[0], reverse=True)
    top = sorted(r.name for p, r in candidates if p == candidates[0][0])
    if len(top) > 1:
        raise ValueError(
            f"format {wanted} is auto-selectable by several runtimes of priority "
            f"{candidates[0][0]}: {', '.join(top)}; give one a higher priority or name the "
            "runtime with `runtime:`"
        )
    return candidates[0][1]


def resolve_options(
    runtime: RuntimeOptions, model: RuntimeOptions | None, cores: int, total_instances: int
) -> ResolvedOptions:
    """Fill option defaults; threads default to a share of the cores so that all instances
    together never oversubscribe the machine."""
    merged = runtime.model_dump(exclude_none=True)
    if model is not None:
        merged.update(model.model_dump(exclude_none=True))
    return ResolvedOptions(
        intra_op_threads=merged.get("intra_op_threads", max(1, cores // total_instances)),
        inter_op_threads=merged.get("inter_op_threads", 1),
        graph_optimization_level=merged.get("graph_optimization_level", "all"),
        execution_providers=tuple(merged.get("execution_providers", ["CPUExecutionProvider"])),
    )


def plan_model(
    model: ModelConfig, runtime: RuntimeConfig, options: ResolvedOptions, base_dir: Path
) -> ModelPlan:
    """The plan of one model: its versions on disk filtered by the version policy.

    A remote storageUri is not read here (compiling never touches the network): its plan
    names the URI in ``remote`` and has no versions yet; the server fetches it into its cache
    and calls :func:`plan_at` with the local copy (app/servekit/models/remote.py)."""
    problem = None
    versions: tuple[VersionSource, ...] = ()
    labels: tuple[str, ...] = ()
    remote = None
    if model.storage_uri is not None:
        scheme = remote_scheme(model.storage_uri)  # the schema validator checked it parses
        if scheme is not None:
            remote = model.storage_uri
            versions = (VersionSource(1, None),)
            problem = scheme.missing()
        else:
            location = (base_dir / local_path(model.storage_uri)).resolve()
            versions, labels, problem = _versions_at(
                model, location, base_dir, runtime.implementation
            )
    else:
        versions = (VersionSource(1, None),)
    return ModelPlan(
        name=model.name,
        format_name=model.model_format.name,
        format_version=model.model_format.version,
        runtime=runtime.name,
        implementation=runtime.implementation,
        options=options,
        versions=versions,
        default_version=model.default_version,
        max_batch_size=model.max_batch_size,
        instances=model.instances,
        entrypoint=model.entrypoint,
        inputs=tuple(model.inputs) if model.inputs is not None else None,
        outputs=tuple(model.outputs) if model.outputs is not None else None,
        parameters=dict(model.parameters),
        config=model,
        problem=problem,
        labels_file=labels,
        remote=remote,
        sequence=model.sequence_batching,
        routing=routing_of(model.traffic, model.shadow, model.version_labels),
    )


def plan_pipeline(model: ModelConfig) -> ModelPlan:
    """The plan of a pipeline: one version, no files, no runtime options of its own (its steps
    run with theirs)."""
    assert model.pipeline is not None
    return ModelPlan(
        name=model.name,
        format_name=PIPELINE_FORMAT,
        format_version=None,
        runtime=PIPELINE_RUNTIME,
        implementation=PIPELINE_RUNTIME,
        options=ResolvedOptions(1, 1, "all", ()),
        versions=(VersionSource(1, None),),
        default_version=None,
        max_batch_size=model.max_batch_size,
        instances=1,
        entrypoint=None,
        inputs=tuple(model.inputs or ()),
        outputs=tuple(model.outputs or ()),
        parameters=dict(model.parameters),
        config=model,
        pipeline=tuple(model.pipeline),
    )


def plan_at(plan: ModelPlan, location: Path, base_dir: Path) -> ModelPlan:
    """``plan`` of a remote model once its files are at ``location`` (the local cache)."""
    assert plan.config is not None
    versions, labels, problem = _versions_at(plan.config, location, base_dir, plan.implementation)
    return replace(plan, versions=versions, labels_file=labels, problem=problem)


def _versions_at(
    model: ModelConfig, location: Path, base_dir: Path, implementation: str
) -> tuple[tuple[VersionSource, ...], tuple[str, ...], str | None]:
    """The versions found at ``location`` under the version policy, the labels beside them and
    the problem that keeps all of them from loading (paths in reasons relative to
    ``base_dir``, never absolute)."""
    found, problem = discover_versions(location, model.version_labels, files_of(implementation))
    labels, labels_problem = read_labels(location)
    problem = problem or labels_problem
    versions = select_versions(found, model.version_policy)
    if not problem and not any(v.path for v in versions):
        # Versions that are on disk but cannot load say why ('1' and '01', no model file);
        # only when the policy names versions that are not there is the policy the problem.
        on_disk = {v.version for v in found}
        problem = (
            "; ".join(
                f"version {v.version}: {v.problem}"
                for v in versions
                if v.version in on_disk and v.problem
            )
            or f"no version of {location} matches the version policy"
        )
    # Clients read these reasons: paths relative to serve.yaml's folder, never absolute.
    problem = hide_paths(problem, base_dir) if problem else problem
    versions = tuple(
        replace(v, problem=hide_paths(v.problem, base_dir)) if v.problem else v for v in versions
    )
    return versions, labels, problem


LABELS_FILE = "labels.txt"
"""Class labels beside a model, one per line (Triton's ``label_filename``): in a model's
folder, or in the folder of a one-file model."""
MAX_LABELS_BYTES = 16 * 1024 * 1024


def read_labels(location: Path) -> tuple[tuple[str, ...], str | None]:
    """The lines of the labels file beside ``location`` (none if there is no file), or why it
    cannot be used (a problem of the model, shown as its reason)."""
    path = (location if location.is_dir() else location.parent) / LABELS_FILE
    try:
        if not path.is_file():
            return (), None
        if path.stat().st_size > MAX_LABELS_BYTES:
            return (), f"{path} is over {MAX_LABELS_BYTES} bytes"
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        return (), f"{path} cannot be read as UTF-8 text: {exc}"
    return tuple(text.splitlines()), None
