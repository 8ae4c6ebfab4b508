"""ModelControl and the repository driven directly, in process: load, unload, reload (a failed
reload keeps the old version serving), requests in flight across unloads, model control
``none``, the limits on pushed configs, strict readiness and serve.yaml edits (``apply_plan``).

Fake models (tests/fakes.py) stand in for real ones where the model's work does not matter;
small ONNX models (tests/onnx_builders.py) where files and versions do.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import onnx
import onnx_builders
import pytest
from fakes import BrokenLoad, Echo, Slow, Sum, python_model, request, rows
from inprocess import Serve, Services, plan_of
from waits import async_wait_until

from servekit.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from servekit.types import InferResponse

pytestmark = pytest.mark.anyio

ADD_SUB = "  - {name: add_sub, modelFormat: {name: onnx}, storageUri: models/add_sub.onnx}\n"
BROKEN = "  - {name: broken, modelFormat: {name: onnx}, storageUri: models/broken.onnx}\n"
PAIR = {"INPUT0": np.full((1, 16), 3, np.float32), "INPUT1": np.ones((1, 16), np.float32)}


def write_models(folder: Path) -> None:
    models = folder / "models"
    models.mkdir(exist_ok=True)
    onnx.save(onnx_builders.add_sub(), str(models / "add_sub.onnx"))
    (models / "broken.onnx").write_bytes(b"not an onnx model" * 8)


def onnx_bytes(model: onnx.ModelProto) -> bytes:
    return bytes(model.SerializeToString())


async def add_sub(services: Services) -> np.ndarray:
    response = await services.dataplane.infer(request("add_sub", **PAIR))
    return next(o.data for o in response.outputs if o.name == "OUTPUT0")


# -- load, unload, reload -------------------------------------------------------------------
async def test_unload_then_load_again(serve: Serve, tmp_path: Path) -> None:
    write_models(tmp_path)
    services = await serve("models:\n" + ADD_SUB)
    np.testing.assert_array_equal(await add_sub(services), np.full((1, 16), 4))
    await services.control.unload("add_sub")
    assert services.states() == {("add_sub", "1"): "UNAVAILABLE"}
    assert not services.dataplane.model_ready("add_sub")
    with pytest.raises(Unavailable, match="not ready: version 1: unloaded"):
        await add_sub(services)
    await services.control.load("add_sub")
    assert services.states() == {("add_sub", "1"): "READY"}
    np.testing.assert_array_equal(await add_sub(services), np.full((1, 16), 4))


async def test_unknown_and_invalid_names(serve: Serve) -> None:
    services = await serve()
    poll = r"^failed to load 'nope', failed to poll from model repository: serve.yaml has no"
    with pytest.raises(NotFound, match=poll):
        await services.control.load("nope")
    with pytest.raises(NotFound):
        await services.control.unload("nope")
    for name in ("../etc", "", "a/b", "x" * 200):
        with pytest.raises(InvalidArgument, match="invalid model name"):
            await services.control.load(name)
    with pytest.raises(InvalidArgument, match="unknown load parameter"):
        await services.control.load("nope", {"colour": "blue"})


async def test_reload_from_disk_picks_up_a_new_version(serve: Serve, tmp_path: Path) -> None:
    folder = tmp_path / "models" / "mlp"
    for version in (1, 2):
        (folder / str(version)).mkdir(parents=True)
        onnx.save(onnx_builders.mlp(seed=version), str(folder / str(version) / "model.onnx"))
    services = await serve(
        "models:\n  - {name: mlp, modelFormat: {name: onnx}, storageUri: models/mlp}\n"
    )
    assert services.dataplane.model_metadata("mlp").versions == ("2",)
    (folder / "3").mkdir()
    onnx.save(onnx_builders.mlp(seed=3), str(folder / "3" / "model.onnx"))
    await services.control.load("mlp")
    assert services.dataplane.model_metadata("mlp").versions == ("3",)


async def test_a_failed_reload_keeps_the_old_version_serving(serve: Serve, tmp_path: Path) -> None:
    write_models(tmp_path)
    services = await serve("models:\n" + ADD_SUB)
    (tmp_path / "models" / "add_sub.onnx").write_bytes(b"garbage" * 32)
    with pytest.raises(InvalidArgument, match="failed to load 'add_sub'"):
        await services.control.load("add_sub")
    assert services.states() == {("add_sub", "1"): "READY"}
    assert "reload failed, still serving the previous load" in services.reason("add_sub")
    np.testing.assert_array_equal(await add_sub(services), np.full((1, 16), 4))
    assert any(e.model == "add_sub" for e in services.recent_errors())


async def test_a_failed_replacement_of_a_python_model_keeps_the_old_one(serve: Serve) -> None:
    services = await serve()
    await services.control.add(python_model("sum"), Sum())
    with pytest.raises(InvalidArgument, match="cannot reach the weights"):
        await services.control.add(python_model("sum"), BrokenLoad)
    response = await services.dataplane.infer(request("sum", a=rows(1), b=rows(2)))
    np.testing.assert_array_equal(response.outputs[0].data, rows(3))
    assert services.dataplane.model_metadata("sum").inputs[0].name == "a"


async def test_a_model_that_never_loaded_is_unavailable_with_its_reason(serve: Serve) -> None:
    services = await serve()
    with pytest.raises(InvalidArgument, match="cannot reach the weights"):
        await services.control.add(python_model("broken"), BrokenLoad)
    assert services.states() == {("broken", "1"): "UNAVAILABLE"}
    assert "RuntimeError: cannot reach the weights" in services.reason("broken")
    with pytest.raises(Unavailable, match="cannot reach the weights"):
        await services.dataplane.infer(request("broken", x=[1.0]))


async def test_add_replaces_a_model_of_that_name(serve: Serve) -> None:
    services = await serve()
    await services.control.add(python_model("model"), Sum())
    await services.control.add(python_model("model"), Echo())
    assert [s.name for s in services.dataplane.model_metadata("model").inputs] == ["text"]


async def test_remove_forgets_the_model(serve: Serve) -> None:
    services = await serve()
    await services.control.add(python_model("sum"), Sum())
    await services.control.remove("sum")
    assert services.control.index() == []
    with pytest.raises(NotFound):
        services.dataplane.model_metadata("sum")


# -- requests in flight ---------------------------------------------------------------------
async def in_flight(services: Services, slow: Slow) -> asyncio.Task[InferResponse]:
    """A request to ``slow`` that is inside the model (in its worker thread: the server runs
    with ``inlineBelowMicroseconds: 0``)."""
    await services.dataplane.infer(request("slow", x=[0.0]))  # warm-up, with the gate open
    slow.hold()
    entered = slow.entered
    task = asyncio.create_task(services.dataplane.infer(request("slow", x=[1.0, 2.0])))
    await async_wait_until(lambda: slow.entered > entered, what="the request to enter the model")
    return task


@pytest.mark.parametrize("action", ["unload", "reload"])
async def test_unload_and_reload_wait_for_requests_in_flight(serve: Serve, action: str) -> None:
    services = await serve("server: {inlineBelowMicroseconds: 0}\nmodels: []\n")
    slow = Slow()
    await services.control.add(python_model("slow"), slow)
    task = await in_flight(services, slow)
    if action == "unload":
        change = asyncio.create_task(services.control.unload("slow"))
    else:
        change = asyncio.create_task(services.control.add(python_model("slow"), Sum))
    # The change takes effect at once (new requests see it), but it returns only once the
    # request it found in flight has finished.
    if action == "unload":
        await async_wait_until(lambda: not services.dataplane.model_ready("slow"), what="unload")
    else:
        await async_wait_until(lambda: _inputs(services) == ["a", "b"], what="the new version")
    await asyncio.sleep(0)
    assert not change.done() and not task.done()
    slow.release()
    await asyncio.wait_for(change, 10)
    response = await asyncio.wait_for(task, 10)
    np.testing.assert_array_equal(response.outputs[0].data, [1.0, 2.0])
    if action == "unload":
        assert services.states() == {("slow", "1"): "UNAVAILABLE"}


def _inputs(services: Services) -> list[str]:
    return [s.name for s in services.dataplane.model_metadata("slow").inputs]


# -- who may control models -----------------------------------------------------------------
@pytest.mark.parametrize(
    "settings",
    ["{modelControl: none}", "{host: 0.0.0.0}", "{host: '::', modelControl: none}"],
    ids=["explicit-none", "reachable-without-token", "reachable-none"],
)
async def test_model_control_none_refuses_clients(
    serve: Serve, tmp_path: Path, settings: str
) -> None:
    write_models(tmp_path)
    services = await serve(f"server: {settings}\nmodels:\n" + ADD_SUB)
    assert not services.control.client_control
    for call in (services.control.load("add_sub"), services.control.unload("add_sub")):
        with pytest.raises(PermissionDenied, match=r"server\.modelControl is none"):
            await call
    config = json.dumps({"backend": "onnxruntime"})
    with pytest.raises(PermissionDenied):
        await services.control.load("pushed", {"config": config})
    assert services.states() == {("add_sub", "1"): "READY"}
    np.testing.assert_array_equal(await add_sub(services), np.full((1, 16), 4))
    # The server's own process (notebook API, serve.yaml edits) still manages models.
    await services.control.add(python_model("sum"), Sum())
    assert services.dataplane.model_ready("sum")


async def test_model_control_is_explicit_on_loopback(serve: Serve) -> None:
    services = await serve("server: {host: 127.0.0.1}\nmodels: []\n")
    assert services.control.client_control


# -- pushed configs: limits and what a client may not choose --------------------------------
LIMITS = "server: {limits: {maxInstances: 2, maxVersions: 2, maxPushedModels: 1}}\nmodels: []\n"


def push(config: dict[str, object], versions: tuple[int, ...] = (1,)) -> dict[str, object]:
    files = {f"file:{v}/model.onnx": onnx_bytes(onnx_builders.add_sub()) for v in versions}
    return {"config": json.dumps(config), **files}


async def test_a_pushed_model_loads_and_its_unload_deletes_it(serve: Serve) -> None:
    services = await serve(LIMITS)
    await services.control.load("pushed", push({"backend": "onnxruntime"}))
    assert services.states() == {("pushed", "1"): "READY"}
    await services.control.unload("pushed")
    assert services.control.index() == []
    with pytest.raises(NotFound):
        await services.control.load("pushed")


@pytest.mark.parametrize(
    ("config", "versions", "message"),
    [
        ({"backend": "onnxruntime", "instance_group": [{"count": 3}]}, (1,), "maxInstances"),
        ({"backend": "onnxruntime"}, (1, 2, 3), r"3 version folders\) exceeds .*maxVersions"),
        (
            {"backend": "onnxruntime", "version_policy": {"latest": {"num_versions": 5}}},
            (1,),
            "numVersions 5 exceeds server.limits.maxVersions",
        ),
    ],
    ids=["instances", "version-folders", "latest"],
)
async def test_pushed_configs_are_bounded_by_the_limits(
    serve: Serve, tmp_path: Path, config: dict[str, object], versions: tuple[int, ...], message: str
) -> None:
    services = await serve(LIMITS)
    with pytest.raises(InvalidArgument, match=message):
        await services.control.load("pushed", push(config, versions))
    assert services.control.index() == []
    assert not any((tmp_path / ".servekit" / "storage").glob("*/*")), "a refused push wrote"


async def test_max_pushed_models(serve: Serve) -> None:
    services = await serve(LIMITS)
    await services.control.load("first", push({"backend": "onnxruntime"}))
    with pytest.raises(ResourceExhausted, match="maxPushedModels is 1"):
        await services.control.load("second", push({"backend": "onnxruntime"}))
    await services.control.load("first", push({"backend": "onnxruntime"}))  # replacing: fine
    await services.control.unload("first")
    await services.control.load("second", push({"backend": "onnxruntime"}))


async def test_a_push_cannot_make_a_python_model(serve: Serve) -> None:
    services = await serve()
    config = {"name": "evil", "modelFormat": {"name": "python"}, "entrypoint": "os:system"}
    with pytest.raises(PermissionDenied):
        await services.control.load("evil", {"config": json.dumps(config)})
    assert services.control.index() == []


# -- strict readiness -----------------------------------------------------------------------
async def test_not_ready_until_startup_loading_is_done(serve: Serve, tmp_path: Path) -> None:
    write_models(tmp_path)
    services = await serve("models:\n" + ADD_SUB, start=False)
    assert not services.dataplane.ready()
    assert services.dataplane.not_ready_reason() == "models are still loading"
    await services.start()
    assert services.dataplane.ready() and services.dataplane.not_ready_reason() is None


async def test_strict_readiness_waits_for_every_model_asked_for(
    serve: Serve, tmp_path: Path
) -> None:
    write_models(tmp_path)
    services = await serve("models:\n" + ADD_SUB + BROKEN)
    assert not services.dataplane.ready()
    reason = services.dataplane.not_ready_reason()
    assert reason is not None and reason.startswith("1 model(s) asked for are not READY")
    assert "broken" not in reason  # readiness is public, model names are not
    await services.control.unload("broken")  # no longer asked for
    assert services.dataplane.ready()
    with pytest.raises(InvalidArgument):  # asked for again, and failing again
        await services.control.load("broken")
    assert services.dataplane.ready(), "a failed client load is not asked for"


async def test_relaxed_readiness_ignores_failed_models(serve: Serve, tmp_path: Path) -> None:
    write_models(tmp_path)
    services = await serve("server: {strictReadiness: false}\nmodels:\n" + ADD_SUB + BROKEN)
    assert services.dataplane.ready()


async def test_startup_models_none_is_ready_with_nothing_loaded(
    serve: Serve, tmp_path: Path
) -> None:
    write_models(tmp_path)
    services = await serve("server: {startupModels: none}\nmodels:\n" + ADD_SUB + BROKEN)
    assert services.dataplane.ready()
    assert set(services.states().values()) == {"UNAVAILABLE"}
    await services.control.load("add_sub")
    assert services.dataplane.ready() and services.dataplane.model_ready("add_sub")


async def test_startup_models_listed_loads_only_those(serve: Serve, tmp_path: Path) -> None:
    write_models(tmp_path)
    services = await serve("server: {startupModels: [add_sub]}\nmodels:\n" + ADD_SUB + BROKEN)
    assert services.states() == {("add_sub", "1"): "READY", ("broken", "1"): "UNAVAILABLE"}
    assert services.dataplane.ready()


# -- serve.yaml edits -----------------------------------------------------------------------
async def test_apply_plan_adds_removes_and_reloads(serve: Serve, tmp_path: Path) -> None:
    write_models(tmp_path)
    onnx.save(onnx_builders.identity("FP32"), str(tmp_path / "models" / "identity.onnx"))
    services = await serve("models:\n" + ADD_SUB)
    identity = "  - {name: identity, modelFormat: {name: onnx}, storageUri: models/identity.onnx}\n"
    done = await services.control.apply_plan(plan_of("models:\n" + identity, tmp_path))
    assert done == {"added": ["identity"], "removed": ["add_sub"], "reloaded": [], "failed": []}
    assert services.states() == {("identity", "1"): "READY"}
    changed = identity.replace("identity.onnx}", "identity.onnx, maxBatchSize: 4}")
    done = await services.control.apply_plan(plan_of("models:\n" + changed, tmp_path))
    assert done["reloaded"] == ["identity"]
    assert services.dataplane.ready()


async def test_apply_plan_with_a_broken_model(serve: Serve, tmp_path: Path) -> None:
    write_models(tmp_path)
    services = await serve("models:\n" + ADD_SUB)
    done = await services.control.apply_plan(plan_of("models:\n" + ADD_SUB + BROKEN, tmp_path))
    assert done["added"] == ["broken"] and done["failed"] == ["broken"]
    assert not services.dataplane.ready()  # startupModels (all) asks for it
    np.testing.assert_array_equal(await add_sub(services), np.full((1, 16), 4))


async def test_a_plain_load_restores_the_serve_yaml_model_a_push_replaced(
    serve: Serve, tmp_path: Path
) -> None:
    """A scikit-learn model of serve.yaml replaced by a pushed ONNX model comes back with a
    load without config, as Triton's load without override goes back to the repository's
    model; the pushed files are deleted. A model only a push made keeps reloading itself."""
    import joblib
    from sklearn.linear_model import LinearRegression

    x = np.random.default_rng(0).normal(size=(20, 16))
    joblib.dump(LinearRegression().fit(x, x[:, 0]), tmp_path / "reg.joblib")
    services = await serve(
        "models:\n  - {name: reg, modelFormat: {name: sklearn}, storageUri: reg.joblib}\n"
    )
    platform = services.dataplane.model_metadata("reg").platform
    await services.control.load("reg", push({"backend": "onnxruntime"}))
    assert services.dataplane.model_metadata("reg").platform == "onnxruntime_onnx"
    await services.control.load("reg")
    assert services.dataplane.model_metadata("reg").platform == platform != "onnxruntime_onnx"
    assert services.states() == {("reg", "1"): "READY"}
    assert not any((tmp_path / ".servekit" / "storage").glob("*/*")), "the push was kept"
    await services.control.load("reg")  # serve.yaml's model reloads as itself
    assert services.dataplane.model_metadata("reg").platform == platform
    # A config-only change of a serve.yaml model is undone the same way.
    await services.control.load("reg", {"config": json.dumps({"max_batch_size": 4})})
    assert services.control.served_plans()[0].max_batch_size == 4
    await services.control.load("reg")
    assert services.control.served_plans()[0].max_batch_size == 0
    # A model that exists only because it was pushed reloads its push.
    await services.control.load("pushed", push({"backend": "onnxruntime"}))
    await services.control.load("pushed")
    assert services.dataplane.model_metadata("pushed").platform == "onnxruntime_onnx"
