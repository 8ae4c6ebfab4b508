"""Services: what every protocol adapter calls, and the only names adapters import from here.

The DataPlane (health, metadata, inference), the Catalog (the read side: the models as frozen
views, the index, statistics, workers, ports, recent errors) and ModelControl (load, unload,
push, hot reload, what a load would refuse), the frozen result types their methods return, and
the few constants and functions an adapter needs to word or encode them. Adapters import these
names from ``servekit.services`` and nothing behind it (pyproject.toml's import-linter contracts
hold that line); the modules of this folder are the services' own business, and nothing of
the config, models or runtimes layers is passed on from here (an adapter that needs a config
type imports it from ``servekit.config``). No transport framework is imported here.
"""

from __future__ import annotations

from servekit.services import grps as grps_calls
from servekit.services.catalog import Catalog
from servekit.services.dataplane import DataPlane
from servekit.services.execution.batching import REASONS as DISPATCH_REASONS
from servekit.services.memory import ON_DEMAND_REASONS, MemoryStatus, ModelMemory, megabytes
from servekit.services.metrics import make_registry
from servekit.services.model_config import (
    ModelConfiguration,
    SequenceBatchingConfig,
    TensorConfig,
    VersionPolicyConfig,
)
from servekit.services.model_control import ModelControl
from servekit.services.model_stats import DurationStat, VersionStatistics
from servekit.services.shared_memory import CUDA_UNSUPPORTED
from servekit.services.stats import QUEUE_BUCKETS_S, Duration, WorkerState, WorkerStatus
from servekit.services.traffic import OUTCOMES as SHADOW_OUTCOMES
from servekit.services.views import ModelState, ModelView, VersionView
from servekit.services.watch import (
    RemoteConfigError,
    RemoteConfigMissing,
    is_remote_config,
    remote_config_copy,
    watch_config,
)

__all__ = [
    "CUDA_UNSUPPORTED",
    "DISPATCH_REASONS",
    "ON_DEMAND_REASONS",
    "QUEUE_BUCKETS_S",
    "SHADOW_OUTCOMES",
    "Catalog",
    "DataPlane",
    "Duration",
    "DurationStat",
    "MemoryStatus",
    "ModelConfiguration",
    "ModelControl",
    "ModelMemory",
    "ModelState",
    "ModelView",
    "RemoteConfigError",
    "RemoteConfigMissing",
    "SequenceBatchingConfig",
    "TensorConfig",
    "VersionPolicyConfig",
    "VersionStatistics",
    "VersionView",
    "WorkerState",
    "WorkerStatus",
    "grps_calls",
    "is_remote_config",
    "make_registry",
    "megabytes",
    "remote_config_copy",
    "watch_config",
]
