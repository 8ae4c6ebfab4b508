"""Version discovery on disk and Triton's version policies (latest N, all, specific)."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import onnx
import onnx_builders
import pytest
import tritonclient.http as httpclient
from hypothesis import given, settings
from hypothesis import strategies as st
from servers import start_server

from servekit.config.compiler import ModelPlan, compile_plan
from servekit.config.loader import ConfigError, parse_config
from servekit.config.schema import VersionPolicy
from servekit.config.versions import VersionSource, discover_versions, select_versions


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


def test_folders_named_by_version_labels(tmp_path: Path) -> None:
    """grps names versions with strings: serve.yaml's versionLabels give them numbers."""
    make(tmp_path, "m/1.0.0/model.onnx", "m/2/model.onnx", "m/notes/")
    found, problem = discover_versions(tmp_path / "m", {"1.0.0": 1})
    assert problem is None and numbers(found) == [1, 2]
    assert found[0].path == tmp_path / "m" / "1.0.0" / "model.onnx"
    found, _ = discover_versions(tmp_path / "m", {"1.0.0": 2})  # the label and 2/ collide
    assert numbers(found) == [2] and found[0].problem and "'1.0.0'" in found[0].problem
    text = (
        "models:\n  - name: m\n    modelFormat: {name: onnx}\n    storageUri: m\n"
        "    versionPolicy: {all: {}}\n    versionLabels: {'1.0.0': 1}\n"
    )
    plan = compile_plan(parse_config(text), tmp_path).models[0]
    assert numbers(plan.versions) == [1, 2]
    with pytest.raises(ConfigError, match="version label '7' is a number"):
        parse_config(text.replace("'1.0.0'", "'7'"))


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


def test_two_folders_of_one_number_make_that_version_a_problem(tmp_path: Path) -> None:
    make(tmp_path, "1/model.onnx", "01/model.onnx", "2/model.onnx")
    found, problem = discover_versions(tmp_path)
    assert problem is None
    assert found == [
        VersionSource(1, None, "version folders '1' and '01' both mean version 1; keep one"),
        VersionSource(2, tmp_path / "2" / "model.onnx"),
    ]
    make(tmp_path, "001/model.onnx", "0003/")
    found, _ = discover_versions(tmp_path)
    assert found[0].problem == "version folders '1', '01' and '001' all mean version 1; keep one"
    assert found[2] == VersionSource(3, None, f"no model file (model.onnx) in {tmp_path / '0003'}")


def test_an_empty_twin_folder_is_still_ambiguous(tmp_path: Path) -> None:
    """A leftover empty ``01/`` beside ``1/``: which one the user meant is theirs to say."""
    make(tmp_path, "1/model.onnx", "01/")
    (version,) = discover_versions(tmp_path)[0]
    assert version.path is None and "'1' and '01' both mean version 1" in (version.problem or "")


@pytest.mark.parametrize("name", ["01", "001", "0"])
def test_a_lone_zero_prefixed_folder_is_its_number(tmp_path: Path, name: str) -> None:
    make(tmp_path, f"{name}/model.onnx")
    assert discover_versions(tmp_path) == (
        [VersionSource(int(name), tmp_path / name / "model.onnx")],
        None,
    )


def test_the_largest_version_number(tmp_path: Path) -> None:
    make(tmp_path, f"{2**63 - 1}/model.onnx", "1/model.onnx")
    assert numbers(discover_versions(tmp_path)[0]) == [1, 2**63 - 1]


@pytest.mark.parametrize("name", ["99999999999999999999", str(2**63)])
def test_a_version_number_beyond_int64_is_a_model_problem(tmp_path: Path, name: str) -> None:
    make(tmp_path, f"{name}/model.onnx", "1/model.onnx")
    assert discover_versions(tmp_path) == (
        [],
        f"version folder '{name}' in {tmp_path} is beyond the largest version number "
        f"({2**63 - 1}); rename it",
    )


def test_folders_that_are_not_numbers_are_ignored(tmp_path: Path) -> None:
    make(tmp_path, "-1/model.onnx", "v2/model.onnx", "1.0/model.onnx", " 3/model.onnx")
    make(tmp_path, "+4/model.onnx", "5/model.onnx")
    assert numbers(discover_versions(tmp_path)[0]) == [5]


def test_misnamed_version_folders_are_named_in_the_problem(tmp_path: Path) -> None:
    make(tmp_path, "v1/model.onnx", "v2/model.onnx", ".ipynb_checkpoints/")
    assert discover_versions(tmp_path) == (
        [],
        f"no model file (model.onnx) in {tmp_path} (not version folders: 'v1', 'v2'; "
        "name them 1/, 2/, ...)",
    )


def test_hidden_entries_are_ignored(tmp_path: Path) -> None:
    """Jupyter's checkpoints and macOS ``._`` copies are neither versions nor model files."""
    make(
        tmp_path,
        "exported.onnx",
        "._exported.onnx",
        ".ipynb_checkpoints/exported-checkpoint.onnx",
        ".1/model.onnx",
    )
    assert discover_versions(tmp_path) == ([VersionSource(1, tmp_path / "exported.onnx")], None)
    make(tmp_path, "2/exported.onnx", "2/._exported.onnx", "2/.ipynb_checkpoints/")
    found, problem = discover_versions(tmp_path)
    assert problem is None
    assert found == [VersionSource(2, tmp_path / "2" / "exported.onnx")]


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
    # The reason reaches clients: relative to serve.yaml's folder, never absolute.
    assert model.problem == "storageUri missing does not exist"


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
    assert model.problem == "no version of m matches the version policy"
    assert model.versions == (VersionSource(2, None, "version 2 has no folder"),)
    partial = plan_of(tmp_path, "m", "{specific: {versions: [1, 2]}}")
    assert partial.problem is None and numbers(partial.versions) == [1, 2]


def test_folder_without_model_is_a_problem(tmp_path: Path) -> None:
    make(tmp_path, "m/")
    assert plan_of(tmp_path, "m").problem == "no model file (model.onnx) in m"


def test_a_clash_is_the_model_problem_when_nothing_else_loads(tmp_path: Path) -> None:
    make(tmp_path, "m/1/model.onnx", "m/01/model.onnx")
    model = plan_of(tmp_path, "m")
    clash = "version folders '1' and '01' both mean version 1; keep one"
    assert model.versions == (VersionSource(1, None, clash),)
    assert model.problem == f"version 1: {clash}"


def test_a_clash_leaves_the_other_versions_alone(tmp_path: Path) -> None:
    make(tmp_path, "m/1/model.onnx", "m/01/model.onnx", "m/2/model.onnx")
    latest = plan_of(tmp_path, "m")
    assert latest.problem is None and latest.versions == (
        VersionSource(2, tmp_path / "m/2/model.onnx"),
    )
    both = plan_of(tmp_path, "m", "{all: {}}")
    assert both.problem is None
    assert [(v.version, v.path is None) for v in both.versions] == [(1, True), (2, False)]
    latest_two = plan_of(tmp_path, "m", "{latest: {numVersions: 2}}")
    assert numbers(latest_two.versions) == [1, 2]  # one folder per number, not two for 1


# --- through a real server ---------------------------------------------------------------------


def save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


@pytest.mark.slow
def test_a_clash_is_reported_by_the_server_and_the_rest_serves(tmp_path: Path) -> None:
    """``1/`` and ``01/``: that version is UNAVAILABLE with the reason over the wire; the
    model's version 2, a model living beside notebook checkpoints and the server stay up."""
    mlp = onnx_builders.mlp(seed=1)
    for folder in ("clash/1", "clash/01", "mixed/1", "mixed/01", "mixed/2"):
        save(mlp, tmp_path / folder / "model.onnx")
    save(onnx_builders.add_sub(), tmp_path / "notebook" / "exported.onnx")
    (tmp_path / "notebook" / "._exported.onnx").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    (tmp_path / "notebook" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "notebook" / ".ipynb_checkpoints" / "train-checkpoint.ipynb").write_text("{}")
    config = tmp_path / "serve.yaml"
    config.write_text(  # the clash is on purpose: readiness must not wait for it
        "server: {strictReadiness: false}\n"
        "models:\n"
        "  - {name: clash, modelFormat: {name: onnx}, storageUri: clash}\n"
        "  - {name: mixed, modelFormat: {name: onnx}, storageUri: mixed,\n"
        "     versionPolicy: {all: {}}}\n"
        "  - {name: notebook, modelFormat: {name: onnx}, storageUri: notebook}\n"
    )
    clash = "version folders '1' and '01' both mean version 1; keep one"
    server = start_server(config, grpc=False)
    try:
        with httpx.Client(base_url=server.http_url, timeout=10) as http:
            assert http.get("/v2/health/ready").status_code == 200
            ready = http.get("/v2/models/clash/ready")
            assert (ready.status_code, ready.json()) == (503, {"name": "clash", "ready": False})
            metadata = http.get("/v2/models/clash")
            assert metadata.status_code == 503
            assert metadata.json() == {"error": f"model 'clash' is not ready: version 1: {clash}"}
            assert http.get("/v2/models/mixed/versions/1/ready").status_code == 503
            assert http.get("/v2/models/mixed/versions/2/ready").status_code == 200
        client = httpclient.InferenceServerClient(server.http_host_port)
        try:
            rows = {(r["name"], r["version"]): r for r in client.get_model_repository_index()}
            assert rows[("clash", "1")]["state"] == "UNAVAILABLE"
            assert rows[("clash", "1")]["reason"] == clash
            assert rows[("mixed", "1")]["reason"] == clash
            assert rows[("mixed", "2")]["state"] == "READY"
            assert rows[("notebook", "1")]["state"] == "READY"
            assert set(rows) == {("clash", "1"), ("mixed", "1"), ("mixed", "2"), ("notebook", "1")}
            x = httpclient.InferInput("input", [1, 16], "FP32")
            x.set_data_from_numpy(np.ones((1, 16), np.float32))
            assert client.infer("mixed", [x]).as_numpy("output").shape[0] == 1
            a = httpclient.InferInput("INPUT0", [1, 16], "FP32")
            a.set_data_from_numpy(np.full((1, 16), 3, np.float32))
            b = httpclient.InferInput("INPUT1", [1, 16], "FP32")
            b.set_data_from_numpy(np.ones((1, 16), np.float32))
            sums = client.infer("notebook", [a, b]).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(sums, np.full((1, 16), 4, np.float32))
        finally:
            client.close()
        server.assert_healthy()
    finally:
        assert server.stop() == 0, server.log()
