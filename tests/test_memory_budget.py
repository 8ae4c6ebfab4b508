"""``load: onDemand`` and ``server.modelMemory`` in process (app/servekit/services/memory.py):
a model loads on its first request, the least recently used idle one is unloaded to make room,
never one with a request in flight, a request that cannot wait for a load gets 503 with
Retry-After, a model too big for the budget gets a clear error, and the index, metadata,
readiness and figures say so. Real Python models holding a known amount of memory
(tests/memory_models.py) through the real services; the 50-model run over HTTP is
tests/test_memory_budget_e2e.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import memory_models
import numpy as np
import pytest
from fakes import request
from inprocess import Serve, Services, plan_of
from memory_models import ballast_entry
from waits import async_wait_until

from servekit.config.loader import ConfigError, parse_config
from servekit.errors import Unavailable
from servekit.services.memory import NOT_LOADED, UNLOADED, budget_bytes

pytestmark = pytest.mark.anyio

MIB = 2**20


def served(names: list[str], megabytes: float, budget: int | str | None, record: Path) -> str:
    """serve.yaml text: ``names`` as on-demand Ballast models of ``megabytes`` each."""
    server = f"server: {{modelMemory: {budget!r}}}\n" if budget is not None else ""
    models = "".join(ballast_entry(name, megabytes, record) for name in names)
    return f"{server}models:\n{models}"


async def infer(services: Services, name: str, value: float = 1.0, **parameters: object) -> float:
    query = request(name, x=np.array([value], np.float32))
    query.parameters.update(parameters)
    response = await services.dataplane.infer(query)
    return float(response.outputs[0].data[0])


def loaded(services: Services) -> set[str]:
    return {m.name for m in services.catalog.memory().models if m.loaded}


async def test_a_model_loads_on_its_first_request(serve: Serve, tmp_path: Path) -> None:
    services = await serve(served(["a"], 1, None, tmp_path / "record"))
    assert services.dataplane.ready()  # not asked for at start: readiness does not wait
    assert services.states()[("a", "1")] == "UNAVAILABLE"
    assert services.reason("a") == NOT_LOADED
    metadata = services.dataplane.model_metadata("a")  # from serve.yaml, as Triton's config
    assert [t.name for t in metadata.inputs] == ["x"] and metadata.versions == ()
    assert await infer(services, "a", 1.0) == 2.0
    assert services.states()[("a", "1")] == "READY"
    (figures,) = services.catalog.memory().models
    assert figures.loads == 1 and figures.last_load_seconds is not None
    assert figures.resident_bytes is not None and figures.resident_bytes >= MIB // 2


async def test_the_least_recently_used_idle_model_makes_room(serve: Serve, tmp_path: Path) -> None:
    record = tmp_path / "record"
    # 16 MiB each, a budget of 40 MiB: two fit, a third needs one of them gone.
    services = await serve(served(["a", "b", "c"], 16, 40 * MIB, record))
    await infer(services, "a")
    await infer(services, "b")
    await asyncio.sleep(0.002)  # the statistics' clock counts milliseconds
    await infer(services, "a")  # a is now the more recently used
    assert loaded(services) == {"a", "b"}
    await infer(services, "c")
    assert loaded(services) == {"a", "c"}
    assert services.reason("b") == UNLOADED
    status = services.catalog.memory()
    assert status.budget_bytes == 40 * MIB and status.used_bytes <= 40 * MIB
    assert {m.name: m.unloads for m in status.models} == {"a": 0, "b": 1, "c": 0}
    assert await infer(services, "b") == 2.0  # loads again, making room in its turn
    assert not record.exists()


async def test_a_model_in_use_is_never_unloaded(serve: Serve, tmp_path: Path) -> None:
    record = tmp_path / "record"
    # One 16 MiB model fits 24 MiB; the model's calls run in its threads, not on this loop.
    yaml = served(["a", "b"], 16, 24 * MIB, record)
    services = await serve(yaml.replace("server: {", "server: {inlineBelowMicroseconds: 0, "))
    memory_models.GATE.clear()
    try:
        held = asyncio.create_task(infer(services, "a", -1.0))  # waits in predict
        await async_wait_until(lambda: loaded(services) == {"a"}, what="a to load")
        # b needs a's room while a's request runs: it waits, bounded by its deadline.
        with pytest.raises(Unavailable) as refused:
            await infer(services, "b", timeout=300_000)  # 0.3 s, in microseconds
        assert refused.value.retry_after_seconds is not None
        assert "loading on demand" in refused.value.message
        assert loaded(services) == {"a"} and not held.done()
        waiting = asyncio.create_task(infer(services, "b", 2.0))
        memory_models.GATE.set()
        assert await held == 0.0
        assert await waiting == 3.0
        assert loaded(services) == {"b"}
    finally:
        memory_models.GATE.set()
    assert not record.exists()


async def test_a_model_too_big_for_the_budget_gets_a_clear_error(
    serve: Serve, tmp_path: Path
) -> None:
    services = await serve(served(["big"], 48, 16 * MIB, tmp_path / "record"))
    for _ in range(2):  # the second is refused from what the first measured
        with pytest.raises(Unavailable) as refused:
            await infer(services, "big")
        message = refused.value.message
        assert "needs" in message and "more than server.modelMemory (16.0 MiB)" in message
        assert refused.value.retry_after_seconds is None
    (figures,) = services.catalog.memory().models
    assert figures.loads == 1 and not figures.loaded
    assert "server.modelMemory" in services.reason("big")
    assert any("server.modelMemory" in e.message for e in services.recent_errors())


def test_model_memory_is_bytes_or_a_share_of_ram() -> None:
    assert budget_bytes(64 * MIB) == 64 * MIB
    half = budget_bytes("50%")
    assert half is not None and half > 0
    assert budget_bytes("25%") == pytest.approx(half / 2, rel=1e-6)
    for wrong in ("140%", "100.5%", "0%", "40 %", "lots", 100, True):
        with pytest.raises(ConfigError, match=r"give bytes .* or a percentage of RAM"):
            parse_config(f"server: {{modelMemory: {wrong!r}}}\nmodels: []\n")
    for right, value in (("'12.5%'", "12.5%"), ("'2147483648'", 2**31), (2**31, 2**31)):
        config = parse_config(f"server: {{modelMemory: {right}}}\nmodels: []\n")
        assert config.server.model_memory == value


@pytest.mark.parametrize(
    "entry, words",
    [
        (
            "{name: s, modelFormat: {name: python}, entrypoint: m:M, load: onDemand, "
            "sequenceBatching: {}}",
            "not for a sequence model",
        ),
        (
            "{name: p, load: onDemand, pipeline: [{model: s, inputs: {x: x}, outputs: {y: y}}], "
            "inputs: [{name: x, datatype: FP32, shape: [1]}], "
            "outputs: [{name: y, datatype: FP32, shape: [1]}]}",
            "has no load",
        ),
        ("{name: s, modelFormat: {name: python}, entrypoint: m:M, load: sometimes}", "load"),
    ],
)
def test_load_on_demand_is_refused_where_it_cannot_work(entry: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_config(f"models:\n  - {entry}\n")


def test_a_pipeline_step_on_demand_is_refused(tmp_path: Path) -> None:
    step = "{name: s, modelFormat: {name: python}, entrypoint: m:M, load: onDemand}"
    pipeline = (
        "{name: p, pipeline: [{model: s, inputs: {x: x}, outputs: {y: y}}], "
        "inputs: [{name: x, datatype: FP32, shape: [1]}], "
        "outputs: [{name: y, datatype: FP32, shape: [1]}]}"
    )
    with pytest.raises(ConfigError, match="a pipeline's steps load at start"):
        plan_of(f"models:\n  - {step}\n  - {pipeline}\n", tmp_path)


async def test_a_model_that_fails_to_load_is_not_loaded_again_by_every_request(
    serve: Serve, tmp_path: Path
) -> None:
    services = await serve(served(["broken"], -1, None, tmp_path / "record"))  # -1 MiB: fails
    for _ in range(3):
        with pytest.raises(Unavailable, match=r"failed to load on demand: .*negative dimensions"):
            await infer(services, "broken")
    (figures,) = services.catalog.memory().models
    assert figures.loads == 1
