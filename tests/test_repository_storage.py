"""Unit tests of the pieces under the repository extension: file names, storage, config shapes.

Fast and in-process; the end-to-end behaviour over real clients is in test_repository_api.py and
test_repository_security.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servekit.config.schema import Limits, ModelConfig
from servekit.errors import InvalidArgument, ResourceExhausted
from servekit.models import storage
from servekit.models.pushed_config import check_limits, parse_load_config


@pytest.mark.parametrize(
    ("key", "path"),
    [
        ("file:1/model.onnx", "1/model.onnx"),
        ("file:12/sub_dir/weights-v2.bin", "12/sub_dir/weights-v2.bin"),
        ("file:3/_private.onnx", "3/_private.onnx"),
    ],
)
def test_good_file_names(key: str, path: str) -> None:
    assert storage.parse_file_key(key) == PurePosixPath(path)


@given(st.text(max_size=40))
def test_parsed_names_never_escape(text: str) -> None:
    """Whatever the name, an accepted path is relative, plain and stays below its folder."""
    try:
        path = storage.parse_file_key("file:" + text)
    except InvalidArgument:
        return
    assert not path.is_absolute()
    assert all(part not in ("", ".", "..") and not part.startswith(".") for part in path.parts)
    assert "\\" not in str(path) and "\x00" not in str(path) and ":" not in str(path)
    assert path.parts[0].isdigit()


def test_validate_files_limits() -> None:
    with pytest.raises(ResourceExhausted):
        storage.validate_files({"file:1/a": b"x" * 11}, max_total_bytes=10)
    many = {f"file:1/f{i}": b"" for i in range(storage.MAX_FILES + 1)}
    with pytest.raises(ResourceExhausted):
        storage.validate_files(many, max_total_bytes=10)
    with pytest.raises(InvalidArgument, match="bytes"):
        storage.validate_files({"file:1/a": "text"}, max_total_bytes=10)
    with pytest.raises(InvalidArgument, match="inside another"):
        storage.validate_files({"file:1/a": b"", "file:1/a/b": b""}, max_total_bytes=10)


def test_stage_writes_only_inside_its_folder(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    files = storage.validate_files(
        {"file:1/model.onnx": b"one", "file:2/sub/extra.bin": b"two"}, 100
    )
    folder = storage.stage(root, "model", files)
    assert folder.parent == (root / "model").resolve()
    assert (folder / "1" / "model.onnx").read_bytes() == b"one"
    assert (folder / "2" / "sub" / "extra.bin").read_bytes() == b"two"
    assert storage.is_generation(root, folder)
    storage.discard(root, folder)
    assert not (root / "model").exists()


def test_stage_refuses_a_linked_model_folder(tmp_path: Path) -> None:
    root, outside = tmp_path / "storage", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "model").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InvalidArgument, match="link"):
        storage.stage(root, "model", [(PurePosixPath("1/model.onnx"), b"x")])
    assert list(outside.iterdir()) == []


def test_discard_never_deletes_what_is_not_ours(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    user = root / "model" / "1"
    user.mkdir(parents=True)
    (user / "model.onnx").write_bytes(b"user data")
    storage.discard(root, root / "model" / "1")
    storage.discard(root, tmp_path)
    assert storage.clean(root) == 0
    assert (user / "model.onnx").read_bytes() == b"user data"


@pytest.mark.slow
def test_clean_removes_leftovers_of_dead_servers_only(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    files = [(PurePosixPath("1/model.onnx"), b"x")]
    mine = storage.stage(root, "live", files)  # this process is alive
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    leftover = storage.stage(root, "gone", files)
    renamed = leftover.with_name(f"{dead.stdout.strip()}-0-deadbeef")
    leftover.rename(renamed)
    assert os.getpid() != int(dead.stdout)
    assert storage.clean(root) == 1  # the dead server's; ours may still be in use
    assert not renamed.exists() and mine.exists()


# -- the config parameter ------------------------------------------------------------------------
def parse(
    config: dict[str, object], current: ModelConfig | None = None, pushed: bool = True
) -> ModelConfig:
    files = [PurePosixPath("1/model.onnx")] if pushed else []
    return parse_load_config("m", json.dumps(config), current, files)


def test_triton_config_with_batching_and_proto_json_spellings() -> None:
    model = parse(
        {
            "name": "m",
            "platform": "onnxruntime_onnx",
            "maxBatchSize": 8,
            "input": [{"name": "text", "dataType": "TYPE_STRING", "dims": ["4"]}],
            "output": [{"name": "score", "data_type": "TYPE_FP16", "dims": [1]}],
            "versionPolicy": {"specific": {"versions": ["1", 3]}},
            "instanceGroup": [{"count": 2}, {"count": "1"}],
            "dynamic_batching": {"max_queue_delay_microseconds": "500"},
            "parameters": {"threshold": {"string_value": "0.5"}},
        }
    )
    assert model.model_format.name == "onnx" and model.max_batch_size == 8
    assert model.inputs is not None and model.outputs is not None
    assert (model.inputs[0].datatype, model.inputs[0].shape) == ("BYTES", [-1, 4])
    assert (model.outputs[0].datatype, model.outputs[0].shape) == ("FP16", [-1, 1])
    assert model.version_policy.specific is not None
    assert model.version_policy.specific.versions == [1, 3]
    assert model.instances == 3
    assert model.dynamic_batching is not None
    assert model.dynamic_batching.max_queue_delay_microseconds == 500
    assert model.parameters == {"threshold": "0.5"}


def test_config_without_files_keeps_where_the_model_lives() -> None:
    current = ModelConfig.model_validate(
        {
            "name": "m",
            "modelFormat": {"name": "onnx"},
            "storageUri": "models/m",
            "runtime": "onnxruntime",
        }
    )
    model = parse({"backend": "onnxruntime", "max_batch_size": 2}, current, pushed=False)
    assert model.storage_uri == "models/m" and model.runtime == "onnxruntime"
    assert model.max_batch_size == 2


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"modelFormat": {"name": "onnx"}, "storageUri": "x"}, "not both"),
        ({"input": [{"dims": [1]}]}, "with a name"),
        ({"backend": "onnxruntime", "input": {"name": "x"}}, "must be a list"),
        ({"backend": "onnxruntime", "max_batch_size": True}, "integer"),
        ({"modelFormat": {"name": "onnx"}, "unknownKey": 1}, "unknownKey"),
        ({"backend": "onnxruntime", "max_batch_size": 2**70}, "beyond int64"),
        ({"backend": "onnxruntime", "max_batch_size": -(2**64)}, "beyond int64"),
        ({"backend": "onnxruntime", "max_batch_size": 2**31}, "max_batch_size"),
        ({"backend": "onnxruntime", "instance_group": [{"count": "9" * 30}]}, "beyond int64"),
        ({"backend": "onnxruntime", "input": [{"name": "x", "dims": [2**63]}]}, "beyond int64"),
        ({"backend": "onnxruntime", "version_policy": {"latest": {"num_versions": 2**32}}}, "num"),
    ],
)
def test_bad_configs(config: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidArgument, match=fragment):
        parse(config)


def test_deeply_nested_json_is_a_clean_error() -> None:
    with pytest.raises(InvalidArgument, match="nested too deeply"):
        parse_load_config("m", "[" * 100_000 + "]" * 100_000, None, [])


def _limits(**values: int) -> Limits:
    return Limits.model_validate(values)


def test_limits_allow_what_the_model_already_has() -> None:
    declared = ModelConfig.model_validate(
        {"name": "m", "modelFormat": {"name": "onnx"}, "storageUri": "m", "instances": 8}
    )
    limits = _limits(maxInstances=4)
    check_limits(declared, declared, limits)  # unchanged: serve.yaml is not bounded
    with pytest.raises(InvalidArgument, match=r"instances 8 exceeds server.limits.maxInstances"):
        check_limits(declared, None, limits)
    more = declared.model_copy(update={"instances": 9})
    with pytest.raises(InvalidArgument, match=r"instances 9 exceeds"):
        check_limits(more, declared, limits)
    check_limits(declared.model_copy(update={"instances": 2}), declared, limits)
