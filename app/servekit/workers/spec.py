"""What a supervisor tells a worker process at start (JSON on its command line), and the
worker-count rule shared by the command line, serve.yaml and the Kubernetes export."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from servekit.config.compiler import available_cores
from servekit.config.overrides import Overrides

CORES_VARIABLE = "_SERVEKIT_WORKER_CORES"
"""Cores one worker may use (the supervisor's cores divided by the workers), read by
:func:`servekit.config.compiler.available_cores`; not ``SERVEKIT_*``, which is serve.yaml's."""


def worker_count(value: int | str | None) -> int:
    """``server.workers`` as a number: ``auto`` is the cores this process may run on."""
    if value is None:
        return 1
    if value == "auto":
        return available_cores()
    return max(1, int(value))


def cores_per_worker(workers: int) -> int:
    """The onnxruntime thread budget of one worker: the cores shared out, at least one."""
    return max(1, available_cores() // max(1, workers))


@dataclass(frozen=True)
class WorkerSpec:
    """One worker's start: which serve.yaml, the command line's overrides, the ports the
    supervisor reserved, and where to reach it."""

    index: int
    config: str
    socket: str
    http_port: int
    grpc_port: int | None
    server: dict[str, Any] = field(default_factory=dict)
    only: str | None = None
    storage_uri: str | None = None
    token_env: str | None = None
    """The variable holding ``--token``/``SERVEKIT_TOKEN`` (inherited; never the token itself)."""
    config_uri: str | None = None
    """The remote serve.yaml ``config`` is the supervisor's local copy of (worker 0's watch
    reads it again and rewrites that copy; the others re-read the copy when told)."""
    log_level: str = "info"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        return cls(**json.loads(text))

    def overrides(self) -> Overrides:
        """The command line's overrides plus the reserved ports (so every reload keeps them),
        one worker (a worker never supervises), and ``--watch`` only in worker 0."""
        server = {**self.server, "http_port": self.http_port, "grpc_port": self.grpc_port}
        server["workers"] = 1
        if self.index != 0:
            server["watch"] = False
        return Overrides(server, self.only, self.storage_uri, self.token_env, self.config_uri)


def worker_environment(workers: int) -> dict[str, str]:
    return {**os.environ, CORES_VARIABLE: str(cores_per_worker(workers))}
