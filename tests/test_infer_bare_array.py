"""``server.infer("m", array)`` (issue 27): a bare array goes to a model of one input, in process
and over the wire alike; for a model of several inputs the error names them (it was a raw
AttributeError: ``'numpy.ndarray' object has no attribute 'items'``)."""

from __future__ import annotations

import numpy as np
import pytest

import servekit
from servekit.errors import InvalidArgument

pytestmark = pytest.mark.slow


def test_a_bare_array_reaches_a_one_input_model_and_is_refused_for_two() -> None:
    x = np.arange(4, dtype=np.float32)
    with servekit.serve() as server:
        server.add_model(
            "double", lambda x: {"y": x * 2}, inputs=[("x", "FP32", [-1])],
            outputs=[("y", "FP32", [-1])],
        )  # fmt: skip
        server.add_model(
            "add", lambda a, b: {"y": a + b},
            inputs=[("a", "FP32", [-1]), ("b", "FP32", [-1])], outputs=[("y", "FP32", [-1])],
        )  # fmt: skip
        remote = servekit.connect(server.url)
        try:
            for handle in (server, remote):
                np.testing.assert_array_equal(handle.infer("double", x)["y"], x * 2)
                np.testing.assert_array_equal(handle.infer("double", [1, 2])["y"], [2, 4])
                with pytest.raises(
                    InvalidArgument, match=r"takes 2 inputs \('a', 'b'\): pass a dict"
                ):
                    handle.infer("add", x)
        finally:
            remote.close()
