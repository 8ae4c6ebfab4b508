"""The remote-model cache on its own (app/servekit/models/remote_cache.py): snapshots appear whole
or not at all, an unchanged remote downloads nothing, archives cannot write outside their
folder, and the cache stays within its bound without deleting what a model uses.

The store here is an in-memory transport (the same interface s3fs, gcsfs, adlfs and HTTPS are
adapted to); the real stores are driven in tests/test_remote_storage.py.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from servekit.config.remote_uris import remote_scheme
from servekit.config.schema import ModelConfig, StorageConfig
from servekit.errors import InvalidArgument
from servekit.models.pushed_config import check_sources
from servekit.models.remote import shown_error as _shown_error
from servekit.models.remote_cache import MANIFEST, cached_copy, evict, snapshot
from servekit.models.remote_stores import (
    Listing,
    Progress,
    RemoteObject,
    StoreError,
    StoreRefused,
    without_user_info,
)
from servekit.shown_paths import shown_uri


class MemoryStore:
    """Objects held in a dict; counts downloads; can fail after some bytes of one object."""

    def __init__(self, files: dict[str, bytes], *, is_file: bool = False) -> None:
        self.files = files
        self.is_file = is_file
        self.downloads: list[str] = []
        self.fail_on: str | None = None

    def list(self) -> Listing:
        objects = [
            RemoteObject(PurePosixPath(p), len(d), hashlib.md5(d).hexdigest(), None)
            for p, d in sorted(self.files.items())
        ]
        return Listing(objects, self.is_file)

    def download(self, item: RemoteObject, target: str, progress: Progress) -> None:
        self.downloads.append(str(item.path))
        data = self.files[str(item.path)]
        with open(target, "wb") as out:
            if self.fail_on == str(item.path):
                out.write(data[: len(data) // 2])
                raise StoreError("connection reset by the store")
            out.write(data)
            progress(len(data))


SETTINGS = StorageConfig()


def test_a_folder_is_snapshotted_once_and_an_unchanged_remote_downloads_nothing(
    tmp_path: Path,
) -> None:
    store = MemoryStore({"1/model.onnx": b"one", "2/model.onnx": b"two"})
    first = snapshot("s3://b/m", store, tmp_path, SETTINGS, set())
    assert (first / "1" / "model.onnx").read_bytes() == b"one"
    assert (first / "2" / "model.onnx").read_bytes() == b"two"
    assert sorted(store.downloads) == ["1/model.onnx", "2/model.onnx"]
    store.downloads.clear()
    assert snapshot("s3://b/m", store, tmp_path, SETTINGS, set()) == first
    assert store.downloads == []


def test_a_new_version_downloads_only_what_changed(tmp_path: Path) -> None:
    store = MemoryStore({"1/model.onnx": b"one"})
    first = snapshot("s3://b/m", store, tmp_path, SETTINGS, set())
    store.files["2/model.onnx"] = b"two"
    store.downloads.clear()
    second = snapshot("s3://b/m", store, tmp_path, SETTINGS, set())
    assert second != first and (first / "1" / "model.onnx").is_file()  # the old one stays
    assert store.downloads == ["2/model.onnx"]
    assert (second / "1" / "model.onnx").read_bytes() == b"one"


def test_a_failed_download_leaves_nothing_half_written(tmp_path: Path) -> None:
    store = MemoryStore({"1/model.onnx": b"one"})
    first = snapshot("s3://b/m", store, tmp_path, SETTINGS, set())
    store.files["1/model.onnx"] = b"a changed model"
    store.fail_on = "1/model.onnx"
    with pytest.raises(StoreError, match="connection reset"):
        snapshot("s3://b/m", store, tmp_path, SETTINGS, set())
    folders = [p.name for p in first.parent.iterdir() if p.is_dir()]
    assert folders == [first.name]  # no temporary folder, no second snapshot
    assert (first / "1" / "model.onnx").read_bytes() == b"one"


def test_one_file_is_served_as_a_file(tmp_path: Path) -> None:
    store = MemoryStore({"model.onnx": b"x"}, is_file=True)
    path = snapshot("s3://b/m/model.onnx", store, tmp_path, SETTINGS, set())
    assert path.name == "model.onnx" and path.read_bytes() == b"x"


def test_the_cached_copy_is_the_snapshot_taken_last_and_a_one_file_uri_stays_a_file(
    tmp_path: Path,
) -> None:
    assert cached_copy("s3://b/m", tmp_path) is None  # never fetched: nothing stands in
    store = MemoryStore({"1/model.onnx": b"one"})
    first = snapshot("s3://b/m", store, tmp_path, SETTINGS, set())
    store.files["2/model.onnx"] = b"two"
    second = snapshot("s3://b/m", store, tmp_path, SETTINGS, set())
    found = cached_copy("s3://b/m", tmp_path)
    assert found is not None and found[0] == second
    os.utime(first / ".used", (found[1] + 60, found[1] + 60))  # the first taken again since
    assert cached_copy("s3://b/m", tmp_path) == (first, found[1] + 60)
    one = MemoryStore({"model.onnx": b"x"}, is_file=True)
    path = snapshot("s3://b/m/model.onnx", one, tmp_path, SETTINGS, set())
    stand_in = cached_copy("s3://b/m/model.onnx", tmp_path)
    assert stand_in is not None and stand_in[0] == path and path.read_bytes() == b"x"


def test_what_a_store_that_answered_refuses_is_never_covered_by_the_cache(tmp_path: Path) -> None:
    with pytest.raises(StoreRefused, match="nothing found there"):
        snapshot("s3://b/m", MemoryStore({}), tmp_path, SETTINGS, set())
    tight = StorageConfig(maxDownloadBytes=1024)
    with pytest.raises(StoreRefused, match="maxDownloadBytes"):
        snapshot("s3://b/m", MemoryStore({"m.onnx": b"x" * 2048}), tmp_path, tight, set())


def _tar(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return buffer.getvalue()


def test_an_archive_is_unpacked_into_its_snapshot(tmp_path: Path) -> None:
    archive = _tar({"1/model.onnx": b"one", "2/model.onnx": b"two"})
    store = MemoryStore({"m.tar.gz": archive}, is_file=True)
    path = snapshot("https://h/m.tar.gz", store, tmp_path, SETTINGS, set())
    assert (path / "1" / "model.onnx").read_bytes() == b"one"
    assert not (path / "m.tar.gz").exists()


@pytest.mark.parametrize(
    ("members", "links"),
    [
        ({"../escaped": b"x"}, None),
        ({"1/../../escaped": b"x"}, None),
        ({"/tmp/absolute": b"x"}, None),
        ({"1/model.onnx": b"x"}, {"1/link": "../../../etc/passwd"}),
    ],
    ids=["dotdot", "nested-dotdot", "absolute", "link-out"],
)
def test_a_tar_slip_refuses_the_whole_archive(
    tmp_path: Path, members: dict[str, bytes], links: dict[str, str] | None
) -> None:
    store = MemoryStore({"m.tar.gz": _tar(members, links)}, is_file=True)
    with pytest.raises(StoreError, match=r"archive|leaves the model's folder"):
        snapshot("https://h/m.tar.gz", store, tmp_path / "cache", SETTINGS, set())
    assert not (tmp_path / "escaped").exists()
    key = next((tmp_path / "cache").iterdir())
    leftovers = [p for p in key.iterdir() if p.is_dir()] if key.is_dir() else []
    assert leftovers == []


def test_a_zip_slip_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        zipped.writestr("../escaped", b"x")
    store = MemoryStore({"m.zip": buffer.getvalue()}, is_file=True)
    with pytest.raises(StoreError, match="leaves the model's folder"):
        snapshot("https://h/m.zip", store, tmp_path / "cache", SETTINGS, set())
    assert not (tmp_path / "escaped").exists()


def test_too_large_a_model_is_refused_before_anything_is_downloaded(tmp_path: Path) -> None:
    store = MemoryStore({"1/model.onnx": b"x" * 4096})
    small = StorageConfig(maxDownloadBytes=1024)
    with pytest.raises(StoreError, match="maxDownloadBytes"):
        snapshot("s3://b/m", store, tmp_path, small, set())
    assert store.downloads == []


def test_the_cache_evicts_the_least_recently_used_but_never_a_model_in_use(
    tmp_path: Path,
) -> None:
    in_use: set[Path] = set()
    a = snapshot("s3://b/a", MemoryStore({"m.onnx": b"a" * 1000}), tmp_path, SETTINGS, in_use)
    b = snapshot("s3://b/b", MemoryStore({"m.onnx": b"b" * 1000}), tmp_path, SETTINGS, set())
    c = snapshot("s3://b/c", MemoryStore({"m.onnx": b"c" * 1000}), tmp_path, SETTINGS, set())
    for age, folder in enumerate((a, b, c)):  # used in this order
        os.utime(folder / ".used", (1_000_000 + age, 1_000_000 + age))
    deleted = evict(tmp_path, 2500, {a})
    # a is the oldest but in use; b goes next (least recently used), c stays
    assert deleted == [b]
    assert (a / MANIFEST).is_file() and (c / MANIFEST).is_file() and not b.exists()


def test_uris_are_classified_and_shown_without_secrets() -> None:
    assert remote_scheme("models/m") is None
    s3 = remote_scheme("s3://b/m")
    assert s3 is not None and s3.name == "s3"
    azure = remote_scheme("https://acct1.blob.core.windows.net/c/m")
    assert azure is not None and azure.name == "az"
    https = remote_scheme("https://example.org/m.tar.gz")
    assert https is not None and https.name == "https"
    with pytest.raises(ValueError, match="not supported"):
        remote_scheme("http://example.org/m.onnx")
    shown = shown_uri("https://user:pw@h.example/m.tar.gz?X-Amz-Signature=abc#f")
    assert shown == "https://h.example/m.tar.gz?..."


def test_library_errors_are_shown_without_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret-value")
    error = RuntimeError(
        "denied for very-secret-value at https://h/o?X-Amz-Signature=sig&X-Amz-Credential=c"
    )
    shown = _shown_error(error)
    assert "very-secret-value" not in shown and "sig" not in shown
    assert shown.startswith("RuntimeError: denied for ***")


def test_a_load_request_cannot_name_remote_storage(tmp_path: Path) -> None:
    model = ModelConfig.model_validate(
        {"name": "m", "modelFormat": {"name": "onnx"}, "storageUri": "s3://attacker/m"}
    )
    with pytest.raises(InvalidArgument, match=r"remote storage is declared in serve\.yaml"):
        check_sources(model, None, tmp_path, tmp_path / ".servekit" / "storage")


def test_user_info_is_taken_out_of_the_address_and_decoded() -> None:
    # urllib would read "user:p%2Fw@h" as the host: the fetch sends it as Basic auth instead.
    url, user_info = without_user_info("https://us%40er:p%2Fw%3A@h.example:8443/m.onnx?s=1")
    assert url == "https://h.example:8443/m.onnx?s=1"
    assert user_info == ("us@er", "p/w:")
    assert without_user_info("https://h/m.onnx") == ("https://h/m.onnx", None)
    assert without_user_info("https://token@h/m")[1] == ("token", "")


def test_a_library_error_quoting_user_info_is_shown_without_it() -> None:
    # What http.client said of such a URI before its user info went as Basic auth.
    uri = "https://user:S3cretPassw0rd@127.0.0.1:8443/m.onnx?X-Amz-Signature=SIGVALUE123"
    error = ValueError("nonnumeric port: 'S3cretPassw0rd@127.0.0.1:8443'; sig SIGVALUE123")
    shown = _shown_error(error, uri)
    assert "S3cretPassw0rd" not in shown and "SIGVALUE123" not in shown
    assert shown.startswith("ValueError: nonnumeric port: '***@127.0.0.1:8443'")
    assert "S3cret" not in _shown_error(RuntimeError(f"could not open {uri}"))


def test_an_https_storage_uri_whose_user_info_reads_as_its_host_is_refused() -> None:
    with pytest.raises(ValueError, match="percent-encode") as refused:
        remote_scheme("https://user:pa/ss@h.example/m.onnx")
    assert "pa/ss" not in str(refused.value)
    assert remote_scheme("https://user:pa%2Fss@h.example/m.onnx") is not None
