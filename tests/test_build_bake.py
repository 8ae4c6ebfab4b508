"""``servekit build --include-models`` at the build-context level (app/servekit/project/bake.py):
against a real S3-compatible server (moto's, in a thread of this process, on 127.0.0.1), which
files and which serve.yaml the bake context gets, that the baked serve.yaml plans its models
from those files, and that a store that refuses says why without the secret. No engine runs
here; the tests that talk to moto listen on a socket, so they are in the slow tier (they take a
second or two each); the serve.yaml edit is checked in the fast tier.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import onnx
import onnx_builders
import pytest
import yaml

from servekit.config.loader import load_config
from servekit.config.overrides import Overrides, load_plan
from servekit.project.bake import BAKE_DOCKERFILE, BakeError, bake, replace_storage_uris

SECRET = "s3cr3t-Value-That-Must-Not-Show"


class Moto:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        import boto3

        self.s3 = boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )


@pytest.fixture
def moto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Moto]:
    store = Moto()
    monkeypatch.setenv("AWS_ENDPOINT_URL", store.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    try:
        yield store
    finally:
        httpx.post(f"{store.url}/moto-api/reset", timeout=10)  # moto's state is per process
        store.server.stop()


SERVE_YAML = """\
# The project's serve.yaml: comments and layout must survive the bake.
server:
  storage: {pollSeconds: 5}
models:
  - name: remote        # two versions in a bucket folder
    modelFormat: {name: onnx}
    storageUri: s3://models/mlp   # fetched at start unless baked
    versionPolicy: {all: {}}
  - {name: single, modelFormat: {name: onnx}, storageUri: 's3://models/one/model.onnx'}
  - name: local
    modelFormat: {name: onnx}
    storageUri: local
"""


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    (project / "local").mkdir(parents=True)
    onnx.save(onnx_builders.mlp(seed=9), str(project / "local" / "model.onnx"))
    (project / "serve.yaml").write_text(SERVE_YAML)
    return project


def _model(seed: int) -> bytes:
    return bytes(onnx_builders.mlp(seed=seed).SerializeToString())


@pytest.mark.slow
def test_the_bake_context_holds_the_remote_models_and_a_serve_yaml_naming_them(
    tmp_path: Path, moto: Moto
) -> None:
    moto.s3.create_bucket(Bucket="models")
    for version in (1, 2):
        moto.s3.put_object(Bucket="models", Key=f"mlp/{version}/model.onnx", Body=_model(version))
    moto.s3.put_object(Bucket="models", Key="one/model.onnx", Body=_model(3))
    project = _project(tmp_path)
    context = tmp_path / "context"
    context.mkdir()

    baked = bake(project, load_config(project / "serve.yaml"), context)

    assert baked is not None
    assert baked.models == {"remote": "baked-models/remote",
                            "single": "baked-models/single/model.onnx"}  # fmt: skip
    files = sorted(str(p.relative_to(context)) for p in context.rglob("*") if p.is_file())
    assert files == [
        "Dockerfile",
        "baked-models/remote/1/model.onnx",
        "baked-models/remote/2/model.onnx",
        "baked-models/single/model.onnx",
        "serve.yaml",
    ]  # the cache's bookkeeping (.manifest.json, .used) stays out, the local model too
    assert (context / "baked-models/remote/2/model.onnx").read_bytes() == _model(2)
    assert (context / "baked-models/single/model.onnx").read_bytes() == _model(3)
    assert (context / "Dockerfile").read_text() == BAKE_DOCKERFILE
    for path in (context / "baked-models").rglob("*"):  # readable by the image's user 10001
        assert path.stat().st_mode & 0o005 == (0o005 if path.is_dir() else 0o004)
    text = (context / "serve.yaml").read_text()
    assert text == (
        SERVE_YAML.replace("s3://models/mlp", '"baked-models/remote"').replace(
            "'s3://models/one/model.onnx'", '"baked-models/single/model.onnx"'
        )
    )  # only the two values changed: every comment and the local model stay as written
    assert "# fetched at start unless baked" in text
    assert not (project / "baked-models").exists()  # nothing written into the project

    # The baked serve.yaml, with the project's local model beside it as in /srv, plans both
    # remote models from the baked files: no remote left, their versions on disk.
    (context / "local").symlink_to(project / "local")
    plan = load_plan(context / "serve.yaml", Overrides(server={}, flags=False))
    remote, single, local = (plan.model(n) for n in ("remote", "single", "local"))
    assert remote is not None and single is not None and local is not None
    assert (remote.remote, single.remote) == (None, None)
    assert [v.version for v in remote.versions] == [1, 2]
    assert all(v.path is not None for m in (remote, single, local) for v in m.versions)
    assert (remote.problem, single.problem, local.problem) == (None, None, None)


@pytest.mark.slow
def test_a_second_bake_of_an_unchanged_remote_downloads_nothing(tmp_path: Path, moto: Moto) -> None:
    moto.s3.create_bucket(Bucket="models")
    moto.s3.put_object(Bucket="models", Key="mlp/1/model.onnx", Body=_model(1))
    moto.s3.put_object(Bucket="models", Key="one/model.onnx", Body=_model(3))
    project = _project(tmp_path)
    config = load_config(project / "serve.yaml")
    (tmp_path / "first").mkdir()
    bake(project, config, tmp_path / "first")
    cache = tmp_path / "xdg-cache" / "servekit" / "models"
    snapshots = sorted(p for key in cache.iterdir() if key.is_dir() for p in key.iterdir())
    (tmp_path / "second").mkdir()
    bake(project, config, tmp_path / "second")
    assert sorted(p for key in cache.iterdir() if key.is_dir() for p in key.iterdir()) == snapshots
    assert (tmp_path / "second/baked-models/remote/1/model.onnx").read_bytes() == _model(1)


@pytest.mark.slow
def test_a_model_the_store_refuses_fails_the_bake_with_the_reason_and_no_secret(
    tmp_path: Path, moto: Moto
) -> None:
    project = _project(tmp_path)  # no bucket at all
    (tmp_path / "context").mkdir()
    with pytest.raises(BakeError) as caught:
        bake(project, load_config(project / "serve.yaml"), tmp_path / "context")
    message = str(caught.value)
    assert message.startswith("cannot fetch model remote from s3://models/mlp: "), message
    assert SECRET not in message


def test_a_project_without_remote_models_bakes_nothing(tmp_path: Path) -> None:
    project = _project(tmp_path)
    (project / "serve.yaml").write_text(
        "models:\n  - {name: local, modelFormat: {name: onnx}, storageUri: local}\n"
    )
    (tmp_path / "context").mkdir()
    assert bake(project, load_config(project / "serve.yaml"), tmp_path / "context") is None
    assert list((tmp_path / "context").iterdir()) == []


def test_storage_uris_are_replaced_where_they_are_written() -> None:
    text = (
        "models:\n"
        '  - name: a\n    storageUri: "s3://b/a?x=1"  # signed\n'
        "  - {storageUri: gs://b/c, name: c}\n"
        "  - name: d\n    storageUri: s3://b/d\n"
    )
    replaced = replace_storage_uris(text, {"a": "baked-models/a", "c": "baked-models/c"})
    assert replaced == (
        "models:\n"
        '  - name: a\n    storageUri: "baked-models/a"  # signed\n'
        '  - {storageUri: "baked-models/c", name: c}\n'
        "  - name: d\n    storageUri: s3://b/d\n"
    )
    assert yaml.safe_load(replaced)["models"][1]["storageUri"] == "baked-models/c"
