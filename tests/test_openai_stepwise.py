"""A generator model's steps batched across streams (examples/openai/stepwise.py), driven by
the official async ``openai`` client against a real ``servekit serve``.

The generator awaits the ``next-letters`` model once per step; that model declares dynamic
batching, so the steps of concurrent streams run as one call through its executor. The test
checks both halves: batches of more than one stream's step happen, and every stream still
gets exactly the text it gets alone (its rows are not mixed up with other streams')."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from loops import run_in_own_loop
from servers import ServerProcess, start_server

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "openai"
STREAMS = 16


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("stepwise")
    for name in ("chargen.py", "stepwise.py", "stepwise.yaml"):
        shutil.copy(EXAMPLE / name, root / name)
    process = start_server(root / "stepwise.yaml", grpc=False)
    yield process
    assert process.stop() == 0, process.log()


def _batches(server: ServerProcess) -> dict[int, int]:
    with server.http_client(timeout=10) as http:
        stats = http.get("/v2/models/next-letters/stats").json()["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def test_concurrent_streams_share_step_calls(server: ServerProcess) -> None:
    url = f"{server.http_url}/openai/v1"

    async def streams() -> list[str]:
        async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as client:

            async def one(seed: int) -> str:
                stream = await client.completions.create(
                    model="stepwise", prompt="the cat", seed=seed, max_tokens=40, stream=True
                )
                return "".join([c.choices[0].text async for c in stream if c.choices])

            return await asyncio.gather(*(one(seed) for seed in range(STREAMS)))

    with openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30) as client:
        alone = [
            client.completions.create(
                model="stepwise", prompt="the cat", seed=seed, max_tokens=40
            ).choices[0]
            for seed in range(STREAMS)
        ]
    assert all(choice.finish_reason == "length" for choice in alone)
    assert len({choice.text for choice in alone}) > 1  # the seeds make different texts
    before = _batches(server)
    assert set(before) == {1}  # one stream at a time: a step is a call of one row
    together = run_in_own_loop(streams)
    assert together == [choice.text for choice in alone]
    after = _batches(server)
    joined = {size: count - before.get(size, 0) for size, count in after.items() if size > 1}
    assert joined and max(joined) > STREAMS // 2, after  # most streams' steps in one call
