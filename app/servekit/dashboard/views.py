"""View models of the dashboard: plain dicts built from what the services answer.

Every number on every page comes from here, and here reads only the services' declared methods:
the Catalog's (models as frozen views, statistics, addresses, workers, recent errors), the
DataPlane's (health, metadata, configuration) and the ModelControl's mode.
Nothing is cached or copied, so the dashboard can never disagree with what the V2 API answers.
The same dicts feed the Jinja templates and the JSON the page polls.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import yaml

from servekit.config.auth import GROUP_FIELDS, ApiGroup
from servekit.config.compiler import TABULAR_IMPLEMENTATIONS
from servekit.config.schema import ModelConfig, PipelineStep
from servekit.dashboard.memory import memory_label, memory_summary, model_memory
from servekit.dashboard.traffic import traffic
from servekit.errors import ServeError
from servekit.rest.triton_json import model_config_json
from servekit.results import LoggedError
from servekit.services import (
    DISPATCH_REASONS,
    ON_DEMAND_REASONS,
    QUEUE_BUCKETS_S,
    Catalog,
    DataPlane,
    Duration,
    ModelControl,
    ModelState,
    ModelView,
    VersionView,
)
from servekit.shown_paths import shown_storage_uri

_QUIET_REASONS = {"", "not loaded", "unloaded", *ON_DEMAND_REASONS}  # chosen, not failures


@dataclass(frozen=True)
class Sources:
    """What the dashboard pages read: the services the HTTP handlers are given."""

    dataplane: DataPlane
    control: ModelControl
    catalog: Catalog


def overview(src: Sources, *, admin: bool = False) -> dict[str, Any]:
    """Home page: identity, health, addresses, models counted by state, recent errors; and
    what the pages' controls depend on: the model control mode and which API groups need a
    token (booleans: tokens never leave the server). ``admin`` (the request opens the admin
    group): also the workers' figures, which are admin data like the statistics."""
    dp, catalog = src.dataplane, src.catalog
    meta = dp.server_metadata()
    models = catalog.models()
    listening = catalog.listening
    access = dp.access
    return {
        "name": meta.name,
        "version": meta.version,
        "extensions": list(meta.extensions),
        "live": dp.live(),
        "ready": dp.ready(),
        "started_at": catalog.started_at,
        "uptime_s": max(0.0, time.time() - catalog.started_at),
        "http_url": listening.http_url if listening is not None else None,
        "grpc_target": listening.grpc_target if listening is not None else None,
        "models_by_state": _count(model_state(m) for m in models),
        "versions_by_state": _count(v.state for m in models for v in m.versions),
        "model_count": len(models),
        "problems": problems(catalog),
        "errors": recent_errors(catalog),
        "modelControl": src.control.mode,
        "protected": {name: access.protects(ApiGroup(name)) for name in GROUP_FIELDS},
        # Closed to every request (a public bind without that group's token): no token helps.
        "closed": [group.value for group in access.closed],
        "payload_log": catalog.payload_log_status() if admin else None,
        "workers": workers(catalog) if admin else [],
        "memory": memory_summary(catalog.memory()) if admin else None,
    }


def workers(catalog: Catalog) -> list[dict[str, Any]]:
    """The Workers panel: each worker process of ``server.workers`` with its figures (the
    same as ``GET /servekit/v1/workers``); empty for a single server, which shows none."""
    found = catalog.workers()
    if len(found) < 2:
        return []
    now = time.time()
    return [
        {
            "index": w.index,
            "pid": w.pid,
            "state": w.state,
            "up_since": w.up_since,
            "uptime_s": None if w.up_since is None else max(0.0, now - w.up_since),
            "restarts": w.restarts,
            "success": w.success,
            "failure": w.failure,
        }
        for w in found
    ]


def _count(states: Any) -> dict[str, int]:
    counted = Counter(states)
    return {state: counted.get(state, 0) for state in ModelState.ALL}


def model_state(model: ModelView) -> str:
    """One state for a model: READY if any version serves, else the most telling other state."""
    states = {v.state for v in model.versions}
    for state in (ModelState.READY, ModelState.LOADING, ModelState.UNLOADING):
        if state in states:
            return state
    return ModelState.UNAVAILABLE


def model_failed(model: ModelView) -> bool:
    """Unavailable because loading failed (not because nobody asked for it)."""
    if model_state(model) != ModelState.UNAVAILABLE:
        return False
    reasons = [v.reason for v in model.versions] or [model.plan.problem or ""]
    return any(reason not in _QUIET_REASONS for reason in reasons)


def problems(catalog: Catalog) -> list[dict[str, Any]]:
    """Model versions failing right now (a failed load, or a failed reload still serving)."""
    found: list[dict[str, Any]] = []
    for model in catalog.models():
        if not model.versions and model.plan.problem:
            found.append({"model": model.name, "version": "", "message": model.plan.problem})
        for version in model.versions:
            if version.reason not in _QUIET_REASONS:
                found.append(
                    {"model": model.name, "version": str(version.number), "message": version.reason}
                )
    return found


def recent_errors(catalog: Catalog, limit: int = 20) -> list[dict[str, Any]]:
    """Failed loads and rejected serve.yaml edits, newest first."""
    return [_logged_error(item) for item in catalog.recent_errors()[::-1][:limit]]


def _logged_error(item: LoggedError) -> dict[str, Any]:
    """One log entry as the templates want it."""
    return {
        "time": item.time,
        "source": item.source or "server",
        "model": item.model,
        "message": item.message,
    }


def index_rows(catalog: Catalog) -> list[dict[str, Any]]:
    """Repository index: one row per model version (one per model if it has none), each
    with its model's memory label (``memory_label``)."""
    memory = {m.name: m for m in catalog.memory().models}
    rows = [row for model in catalog.models() for row in index_rows_of(model)]
    for row in rows:
        row["memory"] = memory_label(memory.get(row["name"]))
    return rows


def index_rows_of(model: ModelView) -> list[dict[str, Any]]:
    """The index rows of one model."""
    serving = model.serving_version
    rows = [_row(model, str(v.number), v, v.number == serving) for v in model.versions]
    return rows or [_row(model, "", None, False)]


def _row(
    model: ModelView, number: str, version: VersionView | None, default: bool
) -> dict[str, Any]:
    plan = model.plan
    fmt = plan.format_name + (f" {plan.format_version}" if plan.format_version else "")
    state = version.state if version is not None else ModelState.UNAVAILABLE
    reason = version.reason if version is not None else model.reason
    return {
        "name": plan.name,
        "version": number,
        "state": state,
        "reason": reason,
        "failed": state == ModelState.UNAVAILABLE and reason not in _QUIET_REASONS,
        "runtime": plan.runtime,
        "format": fmt,
        "platform": version.platform if version is not None else "",
        "serves_unversioned": default,
        "model_state": model_state(model),
        "model_failed": model_failed(model),
        "download": _download(model) if state == ModelState.LOADING else None,
    }


def _download(model: ModelView) -> dict[str, Any] | None:
    """A remote model's fetch under way (bytes, percent, rate, time left), shown as a bar."""
    return model.download.as_dict() if model.download is not None else None


def filter_rows(rows: list[dict[str, Any]], text: str, state: str) -> list[dict[str, Any]]:
    """The rows whose name contains ``text`` (case-insensitive) and whose state is ``state``."""
    text, state = text.strip().lower(), state.strip().upper()
    return [r for r in rows if text in r["name"].lower() and (not state or r["state"] == state)]


def version_stats(catalog: Catalog, name: str, number: int) -> dict[str, Any]:
    """Counts and average latencies (ms) of one version, from the shared Statistics."""
    stats = catalog.version_stats(name, number)
    return {
        "success": stats.success.count,
        "fail": stats.fail.count,
        "inferences": stats.inference_count,
        "executions": stats.execution_count,
        "last_inference_ms": stats.last_inference_ms,
        "avg_ms": {
            "request": _avg_ms(stats.success),
            "queue": _avg_ms(stats.queue),
            "compute_input": _avg_ms(stats.compute_input),
            "compute_infer": _avg_ms(stats.compute_infer),
            "compute_output": _avg_ms(stats.compute_output),
            "failed_request": _avg_ms(stats.fail),
        },
        "batches": [
            {"size": size, "count": d.count, "avg_ms": _avg_ms(d)}
            for size, d in sorted(stats.batch_sizes.items())
        ],
        "dispatch": dispatch_reasons(stats.batch_reasons),
        "queue_histogram": queue_histogram(stats.queue_histogram),
        # The last minutes, per slot of the rolling window: the latency chart's points.
        "recent": [asdict(point) for point in catalog.window(name, number)],
    }


def dispatch_reasons(counts: dict[str, int]) -> list[dict[str, Any]]:
    """Every known reason (zeros too, so the page shows what did not happen) and any other."""
    rows = [
        {"reason": reason, "label": label, "count": counts.get(reason, 0)}
        for reason, label in DISPATCH_REASONS.items()
    ]
    rows += [
        {"reason": reason, "label": reason, "count": count}
        for reason, count in sorted(counts.items())
        if reason not in DISPATCH_REASONS
    ]
    return rows


def queue_histogram(counts: list[int]) -> list[dict[str, Any]]:
    """Successful requests by time spent in the queue, per bucket of ``QUEUE_BUCKETS_S`` up to
    the last one holding any (empty when nothing succeeded yet)."""
    last = max((i for i, count in enumerate(counts) if count), default=-1)
    labels = [f"≤ {_seconds(bound)}" for bound in QUEUE_BUCKETS_S]
    labels.append(f"> {_seconds(QUEUE_BUCKETS_S[-1])}")
    return [{"label": labels[i], "count": counts[i]} for i in range(last + 1)]


def _seconds(bound: float) -> str:
    return f"{bound * 1000:g} ms" if bound < 1 else f"{bound:g} s"


def _avg_ms(duration: Duration) -> float | None:
    return round(duration.ns / duration.count / 1e6, 4) if duration.count else None


def model_detail(dataplane: DataPlane, catalog: Catalog, name: str) -> dict[str, Any]:
    """Model page: plan, versions with state and statistics, metadata per ready version."""
    model = catalog.model(name)  # NotFound for an unknown name
    plan = model.plan
    versions = []
    for row in index_rows_of(model):
        number = row["version"]
        row["stats"] = version_stats(catalog, name, int(number)) if number else None
        versions.append(row)
    metadata: dict[str, Any] = {}
    for number in model.ready_versions():
        try:
            metadata[str(number)] = dataplane.model_metadata(name, str(number)).as_dict()
        except ServeError:  # unloaded between the two calls: simply not offered
            continue
    batching = plan.config.dynamic_batching if plan.config is not None else None
    config = plan.config
    if config is not None:  # no absolute path on the page: pushed ones say so, others relative
        uri = shown_storage_uri(config.storage_uri, dataplane.plan.base_dir)
        config = config.model_copy(update={"storage_uri": uri})
    return {
        "name": name,
        "state": model_state(model),
        "failed": model_failed(model),
        "reason": "" if model.ready_versions() else model.reason,
        "download": None if model.ready_versions() else _download(model),
        "format": plan.format_name + (f" {plan.format_version}" if plan.format_version else ""),
        "runtime": plan.runtime,
        "storage_uri": config.storage_uri if config is not None else None,
        "entrypoint": plan.entrypoint,
        "max_batch_size": plan.max_batch_size,
        "dynamic_batching": batching.model_dump(by_alias=True) if batching else None,
        "instances": plan.instances,
        "tabular": plan.implementation in TABULAR_IMPLEMENTATIONS,
        "serving_version": model.serving_version,
        "versions": versions,
        "metadata": metadata,
        "signatures": _signatures(metadata),
        "config": model_config(dataplane, name),
        "serve_yaml_text": _yaml_entry(config),
        "warmup": warmup(model),
        "memory": model_memory(next((m for m in catalog.memory().models if m.name == name), None)),
        "traffic": traffic(catalog, model),
        "pipeline": pipeline_steps(catalog, plan.pipeline),
        "openai": config.openai.kind if config is not None and config.openai else None,
        # its predict yields (the serving version): the V2 infer form would answer 501, so the
        # try-it page offers the OpenAI box alone for a chat or completion model
        "decoupled": dataplane.decoupled(name),
    }


def warmup(model: ModelView) -> dict[str, Any] | None:
    """The model's warm-up (serve.yaml ``warmup``) as the model page shows it: the samples,
    and how long each loaded version took to warm up (ms; None: not loaded, or loading).
    None for a model without warm-up."""
    config = model.plan.config
    samples = config.warmup if config is not None else []
    if not samples:
        return None
    return {
        "samples": [
            {"name": s.name, "batch_size": s.batch_size, "count": s.count} for s in samples
        ],
        "versions": [
            {
                "version": str(v.number),
                "ms": None if v.warmup_s is None else round(v.warmup_s * 1e3, 1),
            }
            for v in model.versions
        ],
    }


def pipeline_steps(catalog: Catalog, steps: Sequence[PipelineStep]) -> list[dict[str, Any]]:
    """A pipeline's steps for its page (empty for other models): each step's model, the
    version it runs, that version's state and statistics (``stats``: None until it is loaded),
    in the order serve.yaml lists them; static/pipeline.js draws them."""
    drawn = []
    for index, step in enumerate(steps):
        row: dict[str, Any] = {"step": index, "model": step.model, "version": None,
                               "state": ModelState.UNAVAILABLE, "stats": None}  # fmt: skip
        try:
            model = catalog.model(step.model)
        except ServeError:  # removed since: the pipeline is not ready, and says which step
            drawn.append(row)
            continue
        number = step.version if step.version is not None else model.serving_version
        if number is not None:
            row["version"] = number
            row["stats"] = version_stats(catalog, step.model, number)
            known = [v for v in model.versions if v.number == number]
            row["state"] = known[0].state if known else ModelState.UNAVAILABLE
        drawn.append(row)
    return drawn


def _signatures(metadata: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Ready versions grouped by identical inputs/outputs, so equal versions show once."""
    groups: list[dict[str, Any]] = []
    for number, meta in metadata.items():
        for group in groups:
            same = (group["inputs"], group["outputs"]) == (meta["inputs"], meta["outputs"])
            if same and group["platform"] == meta["platform"]:
                group["versions"].append(number)
                break
        else:
            groups.append({**{k: meta[k] for k in ("platform", "inputs", "outputs")},
                           "versions": [number]})  # fmt: skip
    return groups


def _yaml_entry(config: ModelConfig | None) -> str:
    """The model's serve.yaml entry as the user wrote it (defaults left out)."""
    if config is None:
        return ""
    data = config.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True)
    return str(yaml.safe_dump([data], sort_keys=False, default_flow_style=None)).strip()


def model_config(dataplane: DataPlane, name: str) -> dict[str, Any] | None:
    """What ``GET /v2/models/{name}/config`` answers (the same core method), or None."""
    try:
        return model_config_json(dataplane.model_config(name))
    except ServeError:  # no version loaded: the configuration is not known yet
        return None
