"""serve.yaml's per-model ``traffic`` and ``shadow``: how unversioned requests are shared
between a model's versions, and which version also gets a copy of them.

``traffic: {"2": 90, "3": 10}`` sends 90% of the requests naming no version to version 2 and
10% to version 3 (a canary); ``shadow: {version: "3", share: 0.2}`` also sends a copy of 20%
of them to version 3, whose answer is only compared with the one the client got. This module
declares, checks and resolves them into a :class:`Routing` (version numbers, the split's
cumulative bounds); app/servekit/services/traffic.py chooses and shadows on each request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from servekit.config.schema_base import Section

TRAFFIC_KEY_HEADER = "servekit-traffic-key"
"""The request header (gRPC metadata key) whose value pins a client to one version of a
split: the same key always reaches the same version while the split is unchanged."""


def _version_text(value: Any) -> Any:
    """A version as YAML may write it (``3`` or ``"3"``), as text."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _keys_as_text(value: Any) -> Any:
    """``{2: 90, 3: 10}`` (unquoted YAML keys are numbers) as ``{"2": 90, "3": 10}``."""
    if isinstance(value, dict):
        return {_version_text(k): v for k, v in value.items()}
    return value


VersionName = Annotated[str, Field(min_length=1, max_length=64)]
"""A version number, or a label of the model's ``versionLabels``."""

Percent = Annotated[float, Field(ge=0, le=100)]


def check_split(split: dict[str, float]) -> dict[str, float]:
    """A split names at least one version and its percentages add up to 100."""
    if not split:
        raise ValueError('traffic names at least one version, e.g. {"2": 90, "3": 10}')
    total = math.fsum(split.values())
    if abs(total - 100) > 1e-6:
        shares = ", ".join(f"{k}: {v:g}" for k, v in split.items())
        raise ValueError(f"traffic percentages add up to {total:g}, not 100 ({shares})")
    return split


TrafficSplit = Annotated[
    dict[VersionName, Percent], BeforeValidator(_keys_as_text), AfterValidator(check_split)
]
"""``{"VERSION": PERCENT, ...}`` (:func:`check_split`)."""


class ShadowConfig(Section):
    """A version that also gets a copy of a share of the unversioned requests, answered by
    another version: its answer never reaches the client, it is compared with the client's."""

    version: Annotated[VersionName, BeforeValidator(_version_text)]
    """The shadow version (a number, or a label of versionLabels)."""
    share: float = Field(gt=0, le=1)
    """The share of the requests copied to it, from 0 (excluded) to 1, e.g. 0.2."""


@dataclass(frozen=True, slots=True)
class Routing:
    """A model's ``traffic`` and ``shadow`` resolved to version numbers (the plan's)."""

    versions: tuple[int, ...]
    """The split's versions (empty: no split; unversioned requests reach the serving one)."""
    bounds: tuple[float, ...]
    """Cumulative shares of ``versions`` (0 to 1, the last exactly 1): a draw in [0, 1)
    reaches the first version whose bound is above it."""
    shadow: int | None = None
    """The shadow version (None: no shadow)."""
    share: float = 0.0
    """The share of the unversioned requests copied to ``shadow``."""


def version_number(name: str, labels: dict[str, int]) -> int:
    """``name`` as a version number: digits, or a label of ``versionLabels``."""
    if name.isdigit():
        return int(name)
    if name in labels:
        return labels[name]
    known = f" (labels: {', '.join(sorted(labels))})" if labels else ""
    raise ValueError(f"version {name!r} is neither a number nor a label of versionLabels{known}")


def routing_of(
    split: dict[str, float] | None, shadow: ShadowConfig | None, labels: dict[str, int]
) -> Routing | None:
    """The :class:`Routing` of a model's settings (None when it has neither); ValueError names
    a version that is neither a number nor a label."""
    if split is None and shadow is None:
        return None
    versions: list[int] = []
    bounds: list[float] = []
    running = 0.0
    for name, percent in (split or {}).items():
        number = version_number(name, labels)
        if number in versions:
            raise ValueError(f"traffic names version {number} twice")
        running += percent
        versions.append(number)
        bounds.append(running / 100)
    if bounds:
        bounds[-1] = 1.0  # (sums to 100 within rounding: the last version takes the rest)
    if shadow is None:
        return Routing(tuple(versions), tuple(bounds))
    return Routing(
        tuple(versions), tuple(bounds), version_number(shadow.version, labels), shadow.share
    )


def missing_versions(routing: Routing, served: set[int]) -> str | None:
    """Why ``routing`` cannot be served by a model whose version policy serves ``served``
    (None: every version it names is served)."""
    named = [*routing.versions, *(() if routing.shadow is None else (routing.shadow,))]
    missing = sorted({v for v in named if v not in served})
    if not missing:
        return None
    have = ", ".join(str(v) for v in sorted(served)) or "none"
    which = ", ".join(str(v) for v in missing)
    return (
        f"traffic and shadow name version {which}, which the model does not serve (its version "
        f"policy serves: {have})"
    )


def describe(routing: Routing) -> str:
    """``routing`` in a few words, as ``servekit validate`` prints it:
    ``traffic 2: 90%, 3: 10%; shadow 4 gets 20%``."""
    parts = []
    if routing.versions:
        starts = (0.0, *routing.bounds[:-1])
        shares = [round((b - a) * 100, 6) for a, b in zip(starts, routing.bounds, strict=True)]
        split = ", ".join(f"{v}: {p:g}%" for v, p in zip(routing.versions, shares, strict=True))
        parts.append(f"traffic {split}")
    if routing.shadow is not None:
        parts.append(f"shadow {routing.shadow} gets {routing.share * 100:g}%")
    return "; ".join(parts)
