"""Services: what every protocol adapter calls, and the only names adapters import from here.

The DataPlane (health, metadata, inference, configuration, statistics, the models as frozen
views), ModelControl (load, unload, push, hot reload) and ServerState (the plan in force,
online, addresses), the frozen result types their methods return, and the few constants an
adapter needs to word or encode them. Adapters import these names from ``servekit.services``
and nothing behind it (pyproject.toml's import-linter contracts hold that line); the modules
of this folder are the services' own business. No transport framework is imported here.
"""

from __future__ import annotations

from servekit.config.compiler import TABULAR_IMPLEMENTATIONS
from servekit.models.storage import FILE_PREFIX
from servekit.models.warmup import warmup_problems
from servekit.results import IndexRow, LoggedError, ServerMetadata
from servekit.runtimes.python_check import python_problems
from servekit.services import grps as grps_calls
from servekit.services.catalog import Catalog
from servekit.services.dataplane import DataPlane, server_extensions
from servekit.services.execution.batching import INCOMPATIBLE as DISPATCH_INCOMPATIBLE
from servekit.services.execution.batching import MAX_SIZE as DISPATCH_MAX_SIZE
from servekit.services.execution.batching import PREFERRED_SIZE as DISPATCH_PREFERRED_SIZE
from servekit.services.execution.batching import QUEUE_DRAINED as DISPATCH_QUEUE_DRAINED
from servekit.services.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from servekit.services.metrics import make_registry
from servekit.services.metrics import render as render_metrics
from servekit.services.model_config import (
    ModelConfiguration,
    SequenceBatchingConfig,
    TensorConfig,
    VersionPolicyConfig,
)
from servekit.services.model_control import ModelControl
from servekit.services.model_stats import DurationStat, VersionStatistics
from servekit.services.sequences.batcher import SequenceCounts
from servekit.services.shared_memory import CUDA_UNSUPPORTED
from servekit.services.state import Listening, ServerState
from servekit.services.stats import (
    QUEUE_BUCKETS_S,
    WINDOW_SLOT_S,
    WINDOW_SLOTS,
    Duration,
    WindowPoint,
    WorkerState,
    WorkerStatus,
    window,
)
from servekit.services.views import (
    LOADING,
    READY,
    STATES,
    UNAVAILABLE,
    UNLOADING,
    ModelView,
    VersionView,
)
from servekit.services.watch import (
    RemoteConfigError,
    RemoteConfigMissing,
    is_remote_config,
    remote_config_copy,
    watch_config,
)

__all__ = [
    "CUDA_UNSUPPORTED",
    "DISPATCH_INCOMPATIBLE",
    "DISPATCH_MAX_SIZE",
    "DISPATCH_PREFERRED_SIZE",
    "DISPATCH_QUEUE_DRAINED",
    "FILE_PREFIX",
    "LOADING",
    "METRICS_CONTENT_TYPE",
    "QUEUE_BUCKETS_S",
    "READY",
    "STATES",
    "TABULAR_IMPLEMENTATIONS",
    "UNAVAILABLE",
    "UNLOADING",
    "WINDOW_SLOTS",
    "WINDOW_SLOT_S",
    "Catalog",
    "DataPlane",
    "Duration",
    "DurationStat",
    "IndexRow",
    "Listening",
    "LoggedError",
    "ModelConfiguration",
    "ModelControl",
    "ModelView",
    "RemoteConfigError",
    "RemoteConfigMissing",
    "SequenceBatchingConfig",
    "SequenceCounts",
    "ServerMetadata",
    "ServerState",
    "TensorConfig",
    "VersionPolicyConfig",
    "VersionStatistics",
    "VersionView",
    "WindowPoint",
    "WorkerState",
    "WorkerStatus",
    "grps_calls",
    "is_remote_config",
    "make_registry",
    "python_problems",
    "remote_config_copy",
    "render_metrics",
    "server_extensions",
    "warmup_problems",
    "watch_config",
    "window",
]
