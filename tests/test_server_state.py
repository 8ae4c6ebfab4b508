"""The plan in force has one owner (ServerState), and every reader sees the plan just applied.

In-process servers (ServeKit, the notebook handle): a ``--watch`` edit of a live setting
(``inlineBelowMicroseconds``, ``strictReadiness``) takes effect on the next request, a
restart-only one keeps its running value, a notebook ``reload()`` leaves no stale copy of the
plan behind, and a model whose reload failed is not reported "reloaded" by an unrelated edit.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import onnx
import onnx_builders
import pytest

import servekit
from servekit.config.overrides import Overrides, load_plan
from servekit.config.schema import RESTART_ONLY, ServerConfig
from servekit.runtimes.python import PythonModel
from servekit.server import ServeKit
from servekit.services.execution import placement
from servekit.services.watch import watch_config
from servekit.types import InferRequest, Tensor

PROBE = """
import threading
from typing import Annotated

import numpy as np
from numpy.typing import NDArray

THREADS = []


def predict(x: Annotated[NDArray[np.float32], (-1,)]) -> NDArray[np.float32]:
    THREADS.append(threading.current_thread() is threading.main_thread())
    return x
"""
LOCAL = Overrides({"http_port": 0, "grpc_port": None, "host": "127.0.0.1"})


def _probe_request() -> InferRequest:
    x = np.ones(3, dtype=np.float32)
    return InferRequest(model_name="probe", inputs=[Tensor("x", "FP32", (3,), x)])


def test_every_server_setting_is_marked_live_or_restart_only() -> None:
    marks = {name: field.json_schema_extra for name, field in ServerConfig.model_fields.items()}
    assert all(mark in ({"live": True}, {"live": False}) for mark in marks.values()), marks
    assert {n for n, mark in marks.items() if mark == {"live": False}} == RESTART_ONLY
    assert {"host", "http_port", "grpc_port", "auth", "tls", "storage_dir"} <= RESTART_ONLY
    live = {"inline_below_microseconds", "strict_readiness", "grps_streaming", "limits", "name"}
    live.add("request_timeout_seconds")  # read per request (ServerState.request_timeout_s)
    assert not live & RESTART_ONLY


@pytest.mark.slow  # binds its listeners
def test_an_inline_threshold_edit_under_watch_takes_effect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug: the DataPlane kept the threshold it was built with, so the edit was reported
    applied and ignored. Huge threshold: once measured (its first calls run in its worker
    thread, app/servekit/services/execution/placement.py), the model runs on the loop thread;
    0: in its worker. (A Python function stands in for a runtime that may run on the loop,
    ONNX Runtime's, so that the test can see which thread runs it.)"""
    monkeypatch.setattr(PythonModel, "may_run_inline", True)
    module = "svc_state_probe"
    (tmp_path / f"{module}.py").write_text(PROBE)
    config = tmp_path / "serve.yaml"
    model = f'  - {{name: probe, modelFormat: {{name: python}}, entrypoint: "{module}:predict"}}\n'
    config.write_text("server: {inlineBelowMicroseconds: 1000000000}\nmodels:\n" + model)

    async def scenario() -> list[bool]:
        kit = ServeKit(load_plan(config, LOCAL))
        await kit.start(wait_for_models=True)
        watcher = asyncio.create_task(watch_config(kit, LOCAL, debounce_ms=50))
        try:
            for _ in range(placement.LEARN_FAST + 3):
                await kit.dataplane.infer(_probe_request())
            config.write_text("server: {inlineBelowMicroseconds: 0}\nmodels:\n" + model)
            async with asyncio.timeout(30):
                while kit.plan.server.inline_below_microseconds != 0:
                    await asyncio.sleep(0.05)
            for _ in range(3):
                await kit.dataplane.infer(_probe_request())
            assert not [e for e in kit.catalog.recent_errors() if "restart" in e.message]
        finally:
            watcher.cancel()
            await kit.stop()
        import svc_state_probe  # type: ignore[import-not-found]

        threads: list[bool] = svc_state_probe.THREADS
        return threads

    on_loop = asyncio.run(scenario())
    assert on_loop == [False] * placement.LEARN_FAST + [True] * 3 + [False] * 3


def test_restart_only_settings_keep_their_running_values(tmp_path: Path) -> None:
    onnx.save(onnx_builders.mlp(), str(tmp_path / "mlp.onnx"))
    config = tmp_path / "serve.yaml"
    model = "  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp.onnx}\n"
    config.write_text("server: {strictReadiness: true}\nmodels:\n" + model)

    async def scenario() -> None:
        kit = ServeKit(load_plan(config, LOCAL))
        await kit.control.start()
        try:
            edited = "server: {strictReadiness: false, maxRequestBytes: 5000, name: renamed}\n"
            config.write_text(edited + "models:\n" + model)
            await kit.control.apply_plan(load_plan(config, LOCAL))
            server = kit.dataplane.plan.server
            assert server.strict_readiness is False and server.name == "renamed"  # live
            assert kit.dataplane.server_metadata().name == "renamed"
            assert server.max_request_bytes == 256 * 1024 * 1024  # restart-only: as it runs
            assert kit.plan is kit.dataplane.plan is kit.control.plan  # one owner, no copies
        finally:
            await kit.stop()

    asyncio.run(scenario())


@pytest.mark.slow  # binds its listeners
def test_a_notebook_reload_leaves_no_stale_plan(tmp_path: Path) -> None:
    """Bug: ``Server.reload()`` replaced the plan in ModelControl and the repository but not
    ServeKit.plan, which ``/servekit/v1/ports`` read."""
    onnx.save(onnx_builders.mlp(), str(tmp_path / "mlp.onnx"))
    config = tmp_path / "serve.yaml"
    model = "  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp.onnx}\n"
    config.write_text("server: {name: before}\nmodels:\n" + model)
    server = servekit.serve(config, name="svc-state-reload")
    try:
        config.write_text("server: {name: after}\nmodels:\n" + model)
        server.reload()
        kit = server._thread.servekit
        assert kit is not None
        assert kit.plan.server.name == "after"
        assert server.plan.server.name == "after"
        assert httpx.get(f"{server.url}/v2").json()["name"] == "after"
        ports = httpx.get(f"{server.url}/servekit/v1/ports").json()
        assert ports["grpcPort"] is not None and ports["httpPort"] > 0
    finally:
        server.stop()


@pytest.mark.parametrize("startup", ["all", "none"])
def test_a_failed_reload_is_not_reported_again_by_an_unrelated_edit(
    tmp_path: Path, startup: str
) -> None:
    """Bug: after an edit that failed to load, the next unrelated edit reported the model as
    "reloaded" (it was tried again) and could replace its reason."""
    onnx.save(onnx_builders.mlp(), str(tmp_path / "mlp.onnx"))
    onnx.save(onnx_builders.add_sub(), str(tmp_path / "add_sub.onnx"))
    config = tmp_path / "serve.yaml"
    head = f"server: {{startupModels: {startup}, strictReadiness: false}}\nmodels:\n"
    good = "  - {name: mlp, modelFormat: {name: onnx}, storageUri: mlp.onnx}\n"
    broken = "  - {name: mlp, modelFormat: {name: onnx}, storageUri: gone.onnx}\n"
    other = "  - {name: other, modelFormat: {name: onnx}, storageUri: add_sub.onnx}\n"

    async def apply(kit: ServeKit, text: str) -> dict[str, list[str]]:
        config.write_text(head + text)
        return await kit.control.apply_plan(load_plan(config, LOCAL))

    def reasons_of_mlp(kit: ServeKit) -> dict[str, str]:
        return {r.version: r.reason for r in kit.catalog.index() if r.name == "mlp"}

    async def scenario() -> None:
        config.write_text(head + good)
        kit = ServeKit(load_plan(config, LOCAL))
        await kit.control.start()
        try:
            if startup == "none":
                await kit.control.load("mlp")  # asked for by a client
            done = await apply(kit, broken)
            assert done == {"added": [], "removed": [], "reloaded": ["mlp"], "failed": ["mlp"]}
            reasons = reasons_of_mlp(kit)
            done = await apply(kit, broken + other)
            assert done == {"added": ["other"], "removed": [], "reloaded": [], "failed": []}
            assert reasons_of_mlp(kit) == reasons
            assert all("not loaded" not in reason for reason in reasons.values())
            # Fixing the entry is an edit of it: the model is tried again and serves.
            assert (await apply(kit, good + other))["reloaded"] == ["mlp"]
            assert kit.dataplane.model_ready("mlp")
        finally:
            await kit.stop()

    asyncio.run(scenario())
