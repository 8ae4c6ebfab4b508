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
Each server process reports its own figures (under ``server.workers``, the worker that answers
the scrape).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field

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
    """One family's figures as /metrics shows them (read by app/servekit/services/metrics.py)."""

    name: str
    kind: str
    help: str
    rows: list[tuple[tuple[str, str], float, float, list[tuple[float, int]]]]
    """(model, version), value (counter, gauge) or sum (histogram), count, cumulative buckets."""


def samples() -> Iterator[Sample]:
    """A consistent read of every family."""
    with _lock:
        families = [(f, list(f.children.items())) for f in _families.values()]
    for family, children in families:
        rows = []
        for key, child in children:
            with child.lock:
                value, total, counts = child.value, child.sum, list(child.counts)
            if family.kind == "histogram":
                cumulative, running = [], 0
                for bound, count in zip([*child.buckets, math.inf], counts, strict=True):
                    running += count
                    cumulative.append((bound, running))
                rows.append((key, total, float(running), cumulative))
            else:
                rows.append((key, value, 0.0, []))
        yield Sample(family.name, family.kind, family.help, rows)
