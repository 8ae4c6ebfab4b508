"""Under ``--watch``, a half-written or emptied serve.yaml never unloads the served models:
edits are read once the file has settled, and an edit leaving no models at all is refused
unless the file says so with a ``models:`` list. Driven in process (no listener, no watcher
thread): ``_Watcher.check`` is what every file event calls."""

from __future__ import annotations

import asyncio
from pathlib import Path

import onnx
import pytest
from onnx_builders import mlp

from servekit.config.overrides import Overrides, load_plan
from servekit.server import ServeKit
from servekit.services import watch
from servekit.services.watch import NO_MODELS, _Watcher, names_models, settled

SERVED = "models:\n  - name: m\n    modelFormat: {name: onnx}\n    storageUri: ./m.onnx\n"


async def _served(tmp_path: Path) -> tuple[ServeKit, _Watcher, Path]:
    onnx.save(mlp(16, 8, 4), tmp_path / "m.onnx")
    path = tmp_path / "serve.yaml"
    path.write_text(SERVED)
    kit = ServeKit(load_plan(path, Overrides()))
    await kit.control.start()
    watcher = _Watcher(kit, path, Overrides())
    await watcher.check(touched=False)  # the file as it is: nothing changes
    assert kit.control.index()[0].state == "READY"
    return kit, watcher, path


@pytest.mark.parametrize(
    "text",
    ["", "\n", "server:\n  strictReadiness: true\n", "models:\n", "# serve.yaml\n"],
    ids=["empty", "blank", "cut-before-models", "models-key-without-list", "comment-only"],
)
def test_an_edit_leaving_no_models_is_refused(tmp_path: Path, text: str) -> None:
    async def scenario() -> None:
        kit, watcher, path = await _served(tmp_path)
        try:
            path.write_text(text)
            await watcher.check(touched=False)
            assert [(r.name, r.state) for r in kit.control.index()] == [("m", "READY")]
            # refused as naming no models, or as invalid (``models:`` with nothing after it)
            message = kit.control.recent_errors[-1].message
            assert NO_MODELS in message or "rejected" in message
        finally:
            await kit.stop()

    asyncio.run(scenario())


def test_an_unparsable_edit_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        kit, watcher, path = await _served(tmp_path)
        try:
            path.write_text(SERVED[: SERVED.index("modelFormat") + 16])  # cut mid-mapping
            await watcher.check(touched=False)
            assert [(r.name, r.state) for r in kit.control.index()] == [("m", "READY")]
            assert "rejected" in kit.control.recent_errors[-1].message
        finally:
            await kit.stop()

    asyncio.run(scenario())


def test_models_written_as_an_empty_list_unload_everything(tmp_path: Path) -> None:
    async def scenario() -> None:
        kit, watcher, path = await _served(tmp_path)
        try:
            path.write_text("models: []\n")
            await watcher.check(touched=False)
            assert kit.control.index() == []
        finally:
            await kit.stop()

    asyncio.run(scenario())


def test_an_edit_is_read_once_the_file_has_settled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer producing the file in steps (a template renderer) is waited for."""
    monkeypatch.setattr(watch, "SETTLE_STEP_S", 0.5)  # wide margin on a busy machine
    path = tmp_path / "serve.yaml"
    path.write_text("")
    parts = [SERVED[:10], SERVED[:40], SERVED]

    async def scenario() -> None:
        async def writer() -> None:
            for part in parts:
                path.write_text(part)
                await asyncio.sleep(0.02)

        task = asyncio.create_task(writer())
        await asyncio.sleep(0)  # the writer's first step lands before the first look
        assert await settled(path) == SERVED.encode()
        await task

    asyncio.run(scenario())


def test_names_models() -> None:
    assert names_models(b"models: []\n")
    assert names_models(SERVED.encode())
    assert not names_models(b"")
    assert not names_models(None)
    assert not names_models(b"models:\n")
    assert not names_models(b"models: [\n")
    assert not names_models(b"- a\n")
