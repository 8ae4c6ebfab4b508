"""Test tensors for every V2 datatype, with the edge values each type has.

Values are random from a fixed seed plus the extremes (integer min/max, float max, tiny,
subnormal, -0.0, and NaN/inf where the encoding can carry them: JSON cannot).
"""

from __future__ import annotations

import numpy as np
from tritonclient.utils import triton_to_np_dtype

TEXTS = ["hello", "héllo wörld", "", "日本語", "a\x00b", "x" * 300, "tab\tnew\nline", "🙂", "?"]


def numpy_dtype(datatype: str) -> np.dtype:
    """The client library's mapping, not the server's: an independent oracle."""
    dtype: np.dtype = np.dtype(triton_to_np_dtype(datatype))
    return dtype


def sample(
    datatype: str, shape: tuple[int, ...], *, json_safe: bool = True, seed: int = 0
) -> np.ndarray:
    """A tensor of ``shape`` whose first elements are the datatype's edge values."""
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape))
    if datatype == "BYTES":
        values = [
            TEXTS[i % len(TEXTS)].encode() + bytes([65 + i % 26]) * (i % 3) for i in range(count)
        ]
        return np.array(values, dtype=object).reshape(shape)
    dtype = numpy_dtype(datatype)
    if datatype == "BOOL":
        edges = np.array([True, False])
        flat = rng.integers(0, 2, count).astype(bool)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        edges = np.array([info.min, info.max, 0, 1], dtype=dtype)
        flat = rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
    else:
        finfo = np.finfo(dtype)
        special = [finfo.max, finfo.min, finfo.tiny, finfo.smallest_subnormal, -0.0, 1 / 3]
        if not json_safe:
            special += [np.inf, -np.inf, np.nan]
        edges = np.array(special, dtype=dtype)
        flat = (rng.standard_normal(count) * 100).astype(dtype)
    head = min(count, len(edges))
    flat[:head] = edges[:head]
    return flat.reshape(shape)


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit for bit: dtype, shape and bytes (BYTES: element by element)."""
    assert got.shape == want.shape
    if want.dtype == object:
        assert [bytes(x) for x in got.reshape(-1)] == [bytes(x) for x in want.reshape(-1)]
        return
    assert got.dtype == want.dtype
    assert got.tobytes() == want.tobytes()
