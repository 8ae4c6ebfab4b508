"""The example's character generator with its steps batched across streams.

A generator model's own steps are never batched: each stream holds one of its instances and
steps on its own. To batch them, as an LLM server batches its forward passes, the compute of a
step goes into a model of its own that declares dynamic batching, ``next-letters`` (one row per
stream: the counts of each letter that may follow that stream's text), and the generator, an
async generator on the server's loop, awaits it once per step with
``servekit.models.infer_async``. Steps of concurrent streams meet in that model's queue and run
as one call, through its executor like any request; each stream then samples its own letter
(its seed, its temperature). The chain is chargen.py's: the same text, the same counts.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from chargen import TEXT, CharChain

from servekit import models

LETTERS = sorted(set(" ".join(TEXT.split())))
"""The columns of ``next-letters``' ``counts``, in order."""
COLUMN = {letter: index for index, letter in enumerate(LETTERS)}


class NextLetters:
    """The batched step (``maxBatchSize`` + ``dynamicBatching``): for each row of
    ``context``, the counts of every letter after it."""

    def load(self, order: int = 4) -> None:
        self.chain = CharChain(TEXT, order)

    def predict(self, context: np.ndarray) -> dict[str, np.ndarray]:
        rows = context.reshape(-1)
        counts = np.zeros((len(rows), len(LETTERS)), dtype=np.float32)
        for row, text in enumerate(rows):
            for letter, count in self.chain.next_counts(text.decode()).items():
                counts[row, COLUMN[letter]] = count
        return {"counts": counts}


def _pick(counts: np.ndarray, temperature: float, rng: np.random.Generator) -> str:
    if temperature < 0.01:  # greedy: the most frequent next letter
        return LETTERS[int(np.argmax(counts))]
    weights = counts.astype(np.float64) ** (1 / temperature)
    return LETTERS[int(rng.choice(len(LETTERS), p=weights / weights.sum()))]


async def generate(
    text_input: np.ndarray, parameters: np.ndarray | None = None
) -> AsyncIterator[dict[str, list[str]]]:
    """``openai: completion``: continues the prompt one letter per step, every choice (``n``)
    a row of the same step call; honours ``max_tokens``, ``temperature``, ``seed``, ``stop``."""
    settings: dict[str, Any] = {}
    if parameters is not None:
        settings = json.loads(parameters.reshape(-1)[0])
    n = int(settings.get("n") or 1)
    seed = settings.get("seed")
    rngs = [np.random.default_rng(None if seed is None else int(seed) + c) for c in range(n)]
    temperature = settings.get("temperature")
    temperature = 1.0 if temperature is None else float(temperature)
    limit = settings.get("max_tokens") or settings.get("max_completion_tokens") or 48
    stops = settings.get("stop") or []
    stops = [stops] if isinstance(stops, str) else list(stops)
    start = " ".join(text_input.reshape(-1)[0].decode().lower().split()) + " "
    texts, made, going = [start] * n, [""] * n, list(range(n))
    for _ in range(int(limit)):
        rows = np.array([texts[c].encode() for c in going], dtype=object)
        counts = (await models.infer_async("next-letters", {"context": rows}))["counts"]
        pieces = [""] * n
        for row, choice in enumerate(list(going)):
            letter = _pick(counts[row], temperature, rngs[choice])
            made[choice] += letter
            if any(stop and made[choice].endswith(stop) for stop in stops):
                going.remove(choice)
                continue
            texts[choice] += letter
            pieces[choice] = letter
        if not going:
            return
        yield {"text_output": pieces}
