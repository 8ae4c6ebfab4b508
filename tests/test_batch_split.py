"""Dynamic batching splits answers back exactly, for every datatype (property-tested).

Requests are stacked (app/servekit/services/execution/batching.py ``stack``), a model computes
every output any of them asked for, and ``split`` must hand each request exactly its own rows
of exactly the outputs it asked for: ragged BYTES elements, several outputs, and outputs a
request did not ask for (computed for another) never leak into its answer.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servekit.datatypes import DATATYPES
from servekit.errors import Internal
from servekit.runtimes.base import Arrays
from servekit.services.execution import batching

OUTPUTS = ("same", "flipped", "first")


@dataclass
class Request:
    feed: Arrays
    outputs: tuple[str, ...]
    rows: int
    key: batching.Key


def model(feed: Arrays, outputs: list[str]) -> Arrays:
    """Three outputs per row: the input, the input reversed along its row, its first column."""
    x = feed["x"]
    every = {"same": x.copy(), "flipped": x[:, ::-1].copy(), "first": x[:, :1].copy()}
    return {name: every[name] for name in outputs}


def values(datatype: str, rows: int, width: int) -> st.SearchStrategy[np.ndarray]:
    dtype = DATATYPES[datatype].dtype
    count = rows * width
    if datatype == "BYTES":  # ragged: every element its own length
        items = st.lists(st.binary(max_size=12), min_size=count, max_size=count)
        return items.map(lambda xs: np.array([*xs, None], dtype=object)[:-1].reshape(rows, width))
    if datatype == "BOOL":
        return st.lists(st.booleans(), min_size=count, max_size=count).map(
            lambda xs: np.array(xs, dtype=dtype).reshape(rows, width)
        )
    raw = st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize)
    return raw.map(lambda b: np.frombuffer(b, dtype=dtype).reshape(rows, width).copy())


@st.composite
def batches(draw: st.DrawFn, datatype: str) -> list[Request]:
    width = draw(st.integers(1, 4))
    requests = []
    for _ in range(draw(st.integers(1, 6))):
        rows = draw(st.integers(1, 4))
        x = draw(values(datatype, rows, width))
        wanted = draw(st.lists(st.sampled_from(OUTPUTS), min_size=1, max_size=3, unique=True))
        feed = {"x": x}
        requests.append(Request(feed, tuple(wanted), rows, batching.batch_key(feed)))
    return requests


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_each_request_gets_exactly_its_own_rows_and_outputs(
    datatype: str, data: st.DataObject
) -> None:
    requests = data.draw(batches(datatype))
    queue = deque(requests)
    taken, _ = batching.take(queue, max_rows=1000, preferred=frozenset())
    assert taken == requests and not queue  # all stackable: one batch, in arrival order
    feed, outputs = batching.stack(taken)
    parts = batching.split(model(feed, outputs), taken)
    for request, part in zip(requests, parts, strict=True):
        alone = model(request.feed, list(request.outputs))
        assert set(part) == set(request.outputs)  # nothing another request asked for
        for name in request.outputs:
            assert part[name].shape == alone[name].shape
            assert part[name].dtype == alone[name].dtype
            np.testing.assert_array_equal(part[name], alone[name])


@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=12), limit=st.integers(5, 16))
def test_batches_respect_max_size_and_arrival_order(sizes: list[int], limit: int) -> None:
    queue = deque(
        Request({"x": np.zeros((n, 2), np.float32)}, ("same",), n, (("x", "<f4", (2,)),))
        for n in sizes
    )
    seen: list[int] = []
    while queue:
        taken, reason = batching.take(queue, limit, frozenset())
        assert sum(r.rows for r in taken) <= limit
        assert reason in (batching.MAX_SIZE, batching.QUEUE_DRAINED)
        seen.extend(r.rows for r in taken)
    assert seen == sizes


def test_preferred_sizes_cut_a_full_batch() -> None:
    queue = deque(
        Request({"x": np.zeros((1, 2), np.float32)}, ("same",), 1, (("x", "<f4", (2,)),))
        for _ in range(7)
    )
    taken, reason = batching.take(queue, 6, frozenset({4}))
    assert (len(taken), reason, len(queue)) == (4, batching.PREFERRED_SIZE, 3)


def test_requests_of_other_dimensions_wait_for_their_own_batch() -> None:
    def make(width: int) -> Request:
        feed = {"x": np.zeros((1, width), np.float32)}
        return Request(feed, ("same",), 1, batching.batch_key(feed))

    queue = deque([make(2), make(3), make(2)])
    taken, _ = batching.take(queue, 8, frozenset())
    assert [r.feed["x"].shape[1] for r in taken] == [2, 2]
    assert [r.feed["x"].shape[1] for r in queue] == [3]


def test_a_model_returning_the_wrong_number_of_rows_fails_clearly() -> None:
    requests = [
        Request({"x": np.zeros((2, 1), np.float32)}, ("same",), 2, ()),
        Request({"x": np.zeros((1, 1), np.float32)}, ("same",), 1, ()),
    ]
    with pytest.raises(Internal, match=r"output 'same' of a batch of 3 rows has shape \[2\]"):
        batching.split({"same": np.zeros(2, np.float32)}, requests)


def test_batch_keys_agree_exactly_when_requests_can_be_stacked() -> None:
    """The key (a single input's without a sort, by dtype object) says "stackable" for the
    same datatypes and trailing dimensions, whatever the rows or the feed's order, and
    "not stackable" for another datatype, byte order or trailing dimension."""

    def key(**arrays: np.ndarray) -> batching.Key:
        return batching.batch_key(arrays)

    f32 = np.zeros((1, 3), np.float32)
    assert key(x=f32) == key(x=np.ones((5, 3), dtype="<f4"))
    assert key(x=f32) != key(x=np.zeros((1, 3), np.float64))
    assert key(x=f32) != key(x=np.zeros((1, 3), dtype=">f4"))
    assert key(x=f32) != key(x=np.zeros((1, 4), np.float32))
    assert key(x=f32) != key(y=f32)
    ints = np.zeros((2, 2), np.int64)
    assert key(x=f32, y=ints) == key(y=np.ones((7, 2), np.int64), x=np.ones((7, 3), np.float32))
    assert key(x=f32, y=ints) != key(x=f32, y=ints.astype(np.int32))
