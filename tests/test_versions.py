"""Version discovery on disk and Triton's version policies (latest N, all, specific)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.compiler import ModelPlan, compile_plan
from app.config import VersionPolicy
from app.config_loader import parse_config
from app.versions import VersionSource, discover_versions, select_versions


def make(root: Path, *files: str) -> Path:
    """Create ``files`` (paths relative to ``root``); a trailing '/' makes an empty folder."""
    for name in files:
        path = root / name
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"onnx")
    return root


def policy(text: str) -> VersionPolicy:
    config = parse_config(
        f"models:\n  - name: m\n    modelFormat: {{name: onnx}}\n    storageUri: m\n"
        f"    versionPolicy: {text}\n"
    )
    return config.models[0].version_policy


def plan_of(base: Path, storage: str, policy_text: str | None = None) -> ModelPlan:
    text = f"models:\n  - name: m\n    modelFormat: {{name: onnx}}\n    storageUri: {storage}\n"
    if policy_text:
        text += f"    versionPolicy: {policy_text}\n"
    plan = compile_plan(parse_config(text), base)
    return plan.models[0]


def numbers(versions: tuple[VersionSource, ...] | list[VersionSource]) -> list[int]:
    return [v.version for v in versions]


# --- discovery -----------------------------------------------------------------------------


def test_numbered_folders_sorted_numerically(tmp_path: Path) -> None:
    make(tmp_path, "2/model.onnx", "10/model.onnx", "1/model.onnx", "notes/", "README.txt")
    found, problem = discover_versions(tmp_path)
    assert problem is None
    assert numbers(found) == [1, 2, 10]
    assert found[2].path == tmp_path / "10" / "model.onnx"


def test_single_file_is_version_1(tmp_path: Path) -> None:
    make(tmp_path, "tiny.onnx")
    assert discover_versions(tmp_path / "tiny.onnx") == (
        [VersionSource(1, tmp_path / "tiny.onnx")],
        None,
    )


@pytest.mark.parametrize("name", ["model.onnx", "exported.onnx"])
def test_folder_with_one_model_file_is_version_1(tmp_path: Path, name: str) -> None:
    make(tmp_path, name, "labels.txt")
    assert discover_versions(tmp_path) == ([VersionSource(1, tmp_path / name)], None)


def test_model_onnx_is_preferred_among_several(tmp_path: Path) -> None:
    make(tmp_path, "1/model.onnx", "1/old.onnx")
    (version,) = discover_versions(tmp_path)[0]
    assert version.path == tmp_path / "1" / "model.onnx" and version.problem is None


def test_several_model_files_are_a_problem(tmp_path: Path) -> None:
    make(tmp_path, "a.onnx", "b.onnx")
    found, problem = discover_versions(tmp_path)
    assert found == []
    assert problem == f"several model files in {tmp_path} (a.onnx, b.onnx); name one model.onnx"
    make(tmp_path, "3/x.onnx", "3/y.onnx")
    (version,) = discover_versions(tmp_path)[0]
    assert version.path is None and "several model files" in (version.problem or "")


def test_folder_without_model_file(tmp_path: Path) -> None:
    make(tmp_path, "readme.md")
    assert discover_versions(tmp_path) == ([], f"no model file (model.onnx) in {tmp_path}")
    make(tmp_path, "1/model.onnx", "2/")
    found, problem = discover_versions(tmp_path)
    assert problem is None
    assert found[1] == VersionSource(2, None, f"no model file (model.onnx) in {tmp_path / '2'}")


def test_missing_location(tmp_path: Path) -> None:
    assert discover_versions(tmp_path / "nope") == (
        [],
        f"storageUri {tmp_path / 'nope'} does not exist",
    )


def test_non_ascii_digit_folders_are_not_versions(tmp_path: Path) -> None:
    make(tmp_path, "²/model.onnx", "1/model.onnx")
    assert numbers(discover_versions(tmp_path)[0]) == [1]


# --- policies ------------------------------------------------------------------------------


def sources(*versions: int) -> list[VersionSource]:
    return [VersionSource(v, Path(f"/m/{v}/model.onnx")) for v in versions]


def test_default_policy_is_latest_one() -> None:
    default = (
        parse_config("models:\n  - name: m\n    modelFormat: {name: onnx}\n    storageUri: m\n")
        .models[0]
        .version_policy
    )
    assert numbers(select_versions(sources(3, 1, 2), default)) == [3]


def test_latest_n() -> None:
    assert numbers(select_versions(sources(1, 2, 3), policy("{latest: {numVersions: 2}}"))) == [
        2,
        3,
    ]
    assert numbers(select_versions(sources(1, 2), policy("{latest: {numVersions: 5}}"))) == [1, 2]
    assert select_versions([], policy("{latest: {}}")) == ()


def test_all() -> None:
    assert numbers(select_versions(sources(4, 1, 2), policy("{all: {}}"))) == [1, 2, 4]


def test_specific_keeps_missing_versions_as_unavailable() -> None:
    chosen = select_versions(sources(1, 2), policy("{specific: {versions: [3, 1, 1]}}"))
    assert chosen == (sources(1)[0], VersionSource(3, None, "version 3 has no folder"))


@settings(max_examples=60, deadline=None, database=None)
@given(
    found=st.sets(st.integers(1, 30), max_size=8),
    n=st.integers(1, 10),
    wanted=st.lists(st.integers(1, 30), min_size=1, max_size=5),
)
def test_policies_agree_with_their_definition(found: set[int], n: int, wanted: list[int]) -> None:
    available = sources(*found)
    latest = numbers(select_versions(available, policy(f"{{latest: {{numVersions: {n}}}}}")))
    assert latest == sorted(found)[-n:] if found else latest == []
    assert numbers(select_versions(available, policy("{all: {}}"))) == sorted(found)
    specific = select_versions(available, policy(f"{{specific: {{versions: {wanted}}}}}"))
    assert numbers(specific) == sorted(set(wanted))
    assert all((v.path is None) == (v.version not in found) for v in specific)


# --- through the compiler: problems make a model UNAVAILABLE, not a config error --------------


def test_missing_storage_uri_is_a_model_problem(tmp_path: Path) -> None:
    model = plan_of(tmp_path, "./missing")
    assert model.versions == ()
    assert model.problem == f"storageUri {tmp_path / 'missing'} does not exist"


def test_storage_uri_relative_to_the_config(tmp_path: Path) -> None:
    make(tmp_path, "models/m/1/model.onnx", "models/m/2/model.onnx")
    model = plan_of(tmp_path, "./models/m", "{all: {}}")
    assert model.problem is None
    assert [v.path for v in model.versions] == [
        tmp_path / "models/m/1/model.onnx",
        tmp_path / "models/m/2/model.onnx",
    ]


def test_policy_matching_nothing_on_disk_is_a_problem(tmp_path: Path) -> None:
    make(tmp_path, "m/1/model.onnx")
    model = plan_of(tmp_path, "m", "{specific: {versions: [2]}}")
    assert model.problem == f"no version of {tmp_path / 'm'} matches the version policy"
    assert model.versions == (VersionSource(2, None, "version 2 has no folder"),)
    partial = plan_of(tmp_path, "m", "{specific: {versions: [1, 2]}}")
    assert partial.problem is None and numbers(partial.versions) == [1, 2]


def test_folder_without_model_is_a_problem(tmp_path: Path) -> None:
    make(tmp_path, "m/")
    assert plan_of(tmp_path, "m").problem == f"no model file (model.onnx) in {tmp_path / 'm'}"
