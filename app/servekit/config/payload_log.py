"""``server.payloadLog``: where the payload log goes, and the checks serve.yaml gets for it.

Declared beside the schema (as sequences.py is) so that the schema only names the section; the
log itself is app/servekit/observability/payloads.py, fed by app/servekit/services/payload_log.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from servekit.config.schema_base import Section, http_address

if TYPE_CHECKING:
    from servekit.config.loader import ConfigIssue
    from servekit.config.schema import ServeConfig


class PayloadLogConfig(Section):
    """The payload log (docs/observability.md, "Payload log"): for the models marked
    `payloadLog: true` and a sampled share of their requests, each request's inputs and the
    answer's outputs, joined by the request ID, written off the request path to a JSON-lines
    file or sent to an HTTP endpoint as CloudEvents in KServe's logger format. A slow or dead
    sink drops events and counts them; it never slows a request. Headers (`Authorization`
    among them) are never written."""

    sink: Literal["file", "http"]
    """`file`: one CloudEvent per line (JSON), in `path`, rotated by size. `http`: each event
    POSTed to `url` as KServe's logger sends it (CloudEvents binary mode: `ce-*` headers, the
    V2 JSON as the body)."""
    path: str | None = None
    """The file (`sink: file`), relative to serve.yaml; rotated to `path.1`, `path.2`, ... when
    it reaches `maxBytes`."""
    url: str | None = None
    """The endpoint (`sink: http`): `http://host:port/path` or `https://...` (KServe's
    `logger.url`, e.g. a Knative broker or a message dumper)."""
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)
    """Share of the marked models' requests logged (0 to 1), each request drawn at random;
    a logged request has both its events."""
    inputs: bool = True
    """Log the request (its inputs): CloudEvent type `org.kubeflow.serving.inference.request`."""
    outputs: bool = True
    """Log the answer (its outputs): type `org.kubeflow.serving.inference.response`, only for
    a request answered without error (as KServe's logger)."""
    max_bytes: int = Field(100 * 1024 * 1024, ge=1024)
    """`sink: file`: size at which the file is rotated (default 100 MiB); events are written
    in groups of at most 64, so a file may pass it by one group."""
    backup_count: int = Field(5, ge=1, le=1000)
    """`sink: file`: rotated files kept (`path.1` the newest); older ones are deleted."""

    @field_validator("url")
    @classmethod
    def _an_address(cls, value: str | None) -> str | None:
        return http_address(value, "payload_log_url", "http://host:port/path or https://...")

    @model_validator(mode="after")
    def _where(self) -> PayloadLogConfig:
        if self.sink == "file" and (self.path is None or self.url is not None):
            raise ValueError("sink: file writes to path: give path (and no url)")
        if self.sink == "http" and (self.url is None or self.path is not None):
            raise ValueError("sink: http sends to url: give url (and no path)")
        return self


def payload_log_issues(
    config: ServeConfig, config_path: Path | None, workers: int
) -> list[ConfigIssue]:
    """Why the payload log cannot run as configured: a model marked `payloadLog: true` with no
    `server.payloadLog` to write to, or a file sink shared by several worker processes (each
    would rotate the same file under the others). ``workers``: the server processes."""
    from servekit.config.loader import ConfigIssue, line_in_file  # (the loader reads the schema)

    settings = config.server.payload_log
    issues = [
        ConfigIssue(
            f"models[{index}].payloadLog",
            line_in_file(config_path, ["models", index, "payloadLog"]),
            "payloadLog: true needs server.payloadLog (the sink the events go to)",
        )
        for index, model in enumerate(config.models)
        if model.payload_log and settings is None
    ]
    if settings is not None and settings.sink == "file" and workers > 1:
        issues.append(
            ConfigIssue(
                "server.payloadLog.sink",
                line_in_file(config_path, ["server", "payloadLog", "sink"]),
                f"payloadLog sink: file needs one server process (workers: 1, here "
                f"{config.server.workers!r}): the workers would rotate one file under each "
                "other; use sink: http",
            )
        )
    return issues
