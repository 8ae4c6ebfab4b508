"""app/servekit/shown_paths.py: texts clients read never hold an absolute server path."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servekit.shown_paths import (
    PUSHED_LABEL,
    hide_paths,
    hide_uri_secrets,
    shown_storage_uri,
    shown_uri,
    uri_secrets,
)

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
    assert shown_storage_uri("file:///srv/app/models/mlp", BASE) == "mlp"


SIGNED = "https://user:S3cret%2Fpw@h.example:8443/m.onnx?X-Amz-Signature=SIG1&X-Amz-Credential=C2#f"


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        (SIGNED, "https://h.example:8443/m.onnx?..."),
        ("https://token@h/m.onnx", "https://h/m.onnx"),
        ("s3://bucket/models/m", "s3://bucket/models/m"),
        ("gs://b/m?generation=1", "gs://b/m?..."),
        ("https://[::1]:9/m", "https://[::1]:9/m"),
        ("http://u:p@collector:4317", "http://collector:4317"),
        ("https://h/m.onnx?...", "https://h/m.onnx?..."),
        ("models/mlp", "models/mlp"),
        ("https://u:p w@h/m", "https://..."),
    ],
)  # fmt: skip
def test_shown_uri(uri: str, shown: str) -> None:
    assert shown_uri(uri) == shown
    assert shown_uri(shown) == shown  # idempotent


def test_a_storage_uri_is_shown_without_user_info_or_query() -> None:
    assert shown_storage_uri(SIGNED, BASE) == "https://h.example:8443/m.onnx?..."


def test_uris_inside_a_text_lose_their_secrets_and_the_sentence_stays() -> None:
    text = f"cannot fetch {SIGNED}: HTTP Error 401, also 'https://a:b@x/y?t=1' (and s3://b/k)."
    shown = hide_uri_secrets(text)
    assert shown == (
        "cannot fetch https://h.example:8443/m.onnx?...: HTTP Error 401, also "
        "'https://x/y?...' (and s3://b/k)."
    )
    assert hide_uri_secrets(shown) == shown
    assert hide_paths(text, BASE) == shown  # reasons and errors go through hide_paths


def test_uri_secrets_are_the_user_info_and_query_values_as_written_and_decoded() -> None:
    secrets = uri_secrets(SIGNED)
    for part in ("user:S3cret%2Fpw", "S3cret%2Fpw", "S3cret/pw", "SIG1", "user"):
        assert part in secrets
    assert "h.example" not in " ".join(secrets)
    assert uri_secrets("https://h/m") == []


_secret = st.text("abcdefXYZ0123456789~-_.%!$&'()*+,;=:", min_size=4, max_size=16)


@given(_secret, _secret, _secret)
def test_no_user_info_or_query_value_survives(user: str, password: str, value: str) -> None:
    from urllib.parse import quote

    user, password = quote(user, safe=""), quote(password, safe="")
    uri = f"https://{user}:{password}@h.example/m.onnx?X-Amz-Signature={quote(value, safe='')}"
    for shown in (shown_uri(uri), hide_paths(f"failed: {uri}: denied"), hide_uri_secrets(uri)):
        assert password not in shown and f"{user}:" not in shown
        assert quote(value, safe="") not in shown.replace("h.example/m.onnx", "")
