"""Metrics a Python model defines itself, exposed in ``/metrics`` with its model and version.

A model's code creates them while it loads (in ``load()``, its constructor, or at the import
of its module, which happens as it loads) and updates them when it runs::

    from servekit.custom_metrics import counter, histogram

    class Model:
        def load(self):
            self.tokens = counter("tokens_generated", "Tokens the model generated")
            self.lengths = histogram("prompt_length", "Prompt lengths", [8, 64, 512])

        def predict(self, text):
            self.lengths.observe(len(text))
            self.tokens.inc(3)
            ...

The model and version come from the load in progress (the repository sets :data:`LOADING` in
the loading thread), so each loaded version counts apart and ``/metrics`` shows
``tokens_generated_total{model="m",version="1"}``; a metric created outside a load is labelled
with empty model and version. Names follow Prometheus' rules and may not start with
``servekit_`` (the server's own). Updates are thread-safe (a model runs in several threads).
Under ``server.workers`` the worker that answers the scrape shows every worker's figures
(:func:`snapshot` travels with the statistics snapshots, app/servekit/workers/stats.py;
:func:`merged` adds them up): counters and histograms are the sums over the workers, the
processes that died included (a restart loses no count); a gauge is one value per live worker,
labelled ``worker`` (a sum of, say, "the last batch's size" would be no figure of anything).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

LOADING: ContextVar[tuple[str, str] | None] = ContextVar("servekit_loading", default=None)
"""The (model, version) whose load runs in this thread (set by the repository)."""

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class _Family:
    name: str
    kind: str  # counter, gauge, histogram
    help: str
    buckets: tuple[float, ...] = ()
    children: dict[tuple[str, str], _Child] = field(default_factory=dict)


class _Child:
    """One family's figures for one model version."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.lock = threading.Lock()
        self.value = 0.0
        self.sum = 0.0
        self.counts = [0] * (len(buckets) + 1)  # the last one: +Inf
        self.buckets = buckets


class Counter:
    """Goes up: ``inc(amount)`` with amount >= 0."""

    def __init__(self, child: _Child) -> None:
        self._child = child

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up (inc with an amount >= 0)")
        with self._child.lock:
            self._child.value += amount


class Gauge:
    """Goes up and down: ``set``, ``inc``, ``dec``."""

    def __init__(self, child: _Child) -> None:
        self._child = child

    def set(self, value: float) -> None:
        with self._child.lock:
            self._child.value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        with self._child.lock:
            self._child.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.inc(-amount)


class Histogram:
    """Observations counted in buckets: ``observe(value)``."""

    def __init__(self, child: _Child) -> None:
        self._child = child

    def observe(self, value: float) -> None:
        child = self._child
        index = len(child.buckets)
        for i, bound in enumerate(child.buckets):
            if value <= bound:
                index = i
                break
        with child.lock:
            child.counts[index] += 1
            child.sum += value


_families: dict[str, _Family] = {}
_lock = threading.Lock()


def _child(name: str, kind: str, help_text: str, buckets: tuple[float, ...] = ()) -> _Child:
    if not _NAME.match(name) or name.startswith("servekit_"):
        raise ValueError(
            f"metric name {name!r}: use letters, digits, '_' and ':' (not starting with a "
            "digit), and not the server's prefix servekit_"
        )
    if kind == "counter" and name.endswith("_total"):
        name = name[: -len("_total")]  # exposed as <name>_total, as Prometheus names counters
    key = LOADING.get() or ("", "")
    with _lock:
        family = _families.get(name)
        if family is None:
            family = _families[name] = _Family(name, kind, help_text or name, buckets)
        elif family.kind != kind or family.buckets != buckets:
            raise ValueError(f"metric {name!r} already exists as a {family.kind}")
        child = family.children.get(key)
        if child is None:
            child = family.children[key] = _Child(buckets)
        return child


def counter(name: str, description: str = "") -> Counter:
    """A counter of the model version loading now (the same one if asked for again)."""
    return Counter(_child(name, "counter", description))


def gauge(name: str, description: str = "") -> Gauge:
    """A gauge of the model version loading now."""
    return Gauge(_child(name, "gauge", description))


def histogram(
    name: str, description: str = "", buckets: Sequence[float] = DEFAULT_BUCKETS
) -> Histogram:
    """A histogram of the model version loading now, with these upper bounds."""
    bounds = tuple(sorted(float(b) for b in buckets if not math.isinf(b)))
    return Histogram(_child(name, "histogram", description, bounds))


@dataclass(frozen=True)
class Sample:
    """One family's figures as /metrics shows them (observability/metrics.py CustomCollector)."""

    name: str
    kind: str
    help: str
    rows: list[tuple[tuple[str, ...], float, float, list[tuple[float, int]]]]
    """Label values, value (counter, gauge) or sum (histogram), count, cumulative buckets."""
    labels: tuple[str, ...] = ("model", "version")
    """The label names: model and version, and ``worker`` for a gauge of several workers."""


Snapshot = list[dict[str, Any]]
"""Every family's figures as JSON: ``[{"name", "kind", "help", "buckets", "rows": [[model,
version, value, sum, [count per bucket, +Inf last]], ...]}, ...]``."""


def snapshot() -> Snapshot:
    """A consistent read of every family, as the workers' channel carries it."""
    with _lock:
        families = [(f, list(f.children.items())) for f in _families.values()]
    out: Snapshot = []
    for family, children in families:
        rows = []
        for (model, version), child in children:
            with child.lock:
                rows.append([model, version, child.value, child.sum, list(child.counts)])
        out.append({"name": family.name, "kind": family.kind, "help": family.help,
                    "buckets": list(family.buckets), "rows": rows})  # fmt: skip
    return out


def samples() -> Iterator[Sample]:
    """This process's families, as /metrics shows them."""
    return merged([(None, snapshot())])


def retire(snapshots: Iterable[Snapshot]) -> Snapshot:
    """The counts that outlive processes that died: their counters and histograms, added up
    (their gauges are dropped: the value of a process that is gone)."""
    total = _Totals()
    for part in snapshots:
        total.add(part, None, keep_gauges=False)
    return total.snapshot()


def merged(
    live: Sequence[tuple[str | None, Snapshot]], retired: Iterable[Snapshot] = ()
) -> Iterator[Sample]:
    """The families of several processes as one: ``live`` are (worker label or None for a
    single server, snapshot), ``retired`` what :func:`retire` kept of dead ones."""
    total = _Totals()
    for label, part in live:
        total.add(part, label, keep_gauges=True)
    for part in retired:
        total.add(part, None, keep_gauges=False)
    return total.samples()


class _Totals:
    """Families added up across snapshots (see :func:`merged`)."""

    def __init__(self) -> None:
        self.families: dict[str, dict[str, Any]] = {}
        self.rows: dict[str, dict[tuple[str, ...], list[Any]]] = {}

    def add(self, part: Snapshot, worker: str | None, *, keep_gauges: bool) -> None:
        for family in part:
            name, kind = str(family["name"]), str(family["kind"])
            if kind == "gauge" and not keep_gauges:
                continue
            known = self.families.setdefault(name, family)
            if known["kind"] != kind or known["buckets"] != family["buckets"]:
                continue  # another definition under the same name (a model changed): skipped
            rows = self.rows.setdefault(name, {})
            for model, version, value, total, counts in family["rows"]:
                key: tuple[str, ...] = (str(model), str(version))
                if kind == "gauge" and worker is not None:
                    key = (*key, worker)
                row = rows.get(key)
                if row is None or kind == "gauge":
                    rows[key] = [float(value), float(total), [int(c) for c in counts]]
                else:
                    row[0] += float(value)
                    row[1] += float(total)
                    row[2] = [a + int(b) for a, b in zip(row[2], counts, strict=True)]

    def snapshot(self) -> Snapshot:
        return [
            {**family, "rows": [[*key[:2], *row] for key, row in self.rows[name].items()]}
            for name, family in self.families.items()
        ]

    def samples(self) -> Iterator[Sample]:
        for name, family in self.families.items():
            kind, rows = str(family["kind"]), self.rows[name]
            labels: tuple[str, ...] = ("model", "version")
            if kind == "gauge" and any(len(key) == 3 for key in rows):
                labels = ("model", "version", "worker")
            shown = []
            for key, (value, total, counts) in rows.items():
                if kind == "histogram":
                    cumulative, running = [], 0
                    bounds = [*(float(b) for b in family["buckets"]), math.inf]
                    for bound, count in zip(bounds, counts, strict=True):
                        running += count
                        cumulative.append((bound, running))
                    shown.append((key, total, float(running), cumulative))
                else:
                    shown.append((key, value, 0.0, []))
            yield Sample(name, kind, str(family["help"]), shown, labels)
