"""app/servekit/shown_paths.py: texts clients read never hold an absolute server path."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servekit.shown_paths import PUSHED_LABEL, hide_paths, shown_storage_uri

BASE = Path("/srv/app/models")
PUSH = "/srv/app/models/.servekit/storage/mlp/1234-1700000000000000000-0123abcd"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("model file /srv/app/models/mlp/1/model.onnx does not exist",
         "model file mlp/1/model.onnx does not exist"),
        ("storageUri /srv/app/models does not exist", "storageUri . does not exist"),
        (f"Load model from {PUSH}/1/model.onnx failed", "Load model from mlp/1/model.onnx failed"),
        (f"'{PUSH}/2/model.onnx' is empty", "'mlp/2/model.onnx' is empty"),
        ("cannot open /etc/passwd: denied", "cannot open …/passwd: denied"),
        ("in (/usr/lib/x.so)", "in (…/x.so)"),
        ("/srv/app/modelsXYZ/a.onnx", "…/a.onnx"),
        ("see http://host/v2/x and a/b and 1/2", "see http://host/v2/x and a/b and 1/2"),
        ("no path here", "no path here"),
    ],
)  # fmt: skip
def test_hide_paths(text: str, shown: str) -> None:
    assert hide_paths(text, BASE) == shown
    assert hide_paths(shown, BASE) == shown  # idempotent


_part = st.text("abcXYZ019_.-", min_size=1, max_size=12).filter(lambda p: p not in (".", ".."))


@given(st.lists(_part, min_size=1, max_size=6), st.sampled_from([" ", "'", '"', "(", "\n", ": "]))
def test_no_absolute_path_survives(parts: list[str], before: str) -> None:
    for root in ("/srv/app/models", "/elsewhere", PUSH):
        text = f"error{before}{root}/{'/'.join(parts)}: failed"
        shown = hide_paths(text, BASE)
        assert "/srv" not in shown and "/elsewhere" not in shown and "1234-" not in shown


def test_shown_storage_uri() -> None:
    assert shown_storage_uri(None, BASE) is None
    assert shown_storage_uri("models/mlp", BASE) == "models/mlp"
    assert shown_storage_uri(PUSH, BASE) == PUSHED_LABEL
    assert shown_storage_uri("/srv/app/models/mlp", BASE) == "mlp"
    assert shown_storage_uri("/data/mlp", BASE) == "…/mlp"
