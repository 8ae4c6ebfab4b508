"""A serve.yaml in object storage (``servekit serve|validate s3://bucket/prod/serve.yaml``).

In-process: where relative storageUris of a remote serve.yaml point, and that its errors name
the URI (without secrets), never the local copy. End to end (slow): ``servekit validate`` reads
the config from each store through the store layer (moto's S3, a GCS emulator, Azurite, an
HTTPS server), and a missing object, a folder, a scheme servekit does not read and a store that
cannot be reached each get a one-line message that shows no secret.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_remote_storage import Archives, Moto, azurite, gcs, https, moto  # noqa: F401
from test_replicas_store_e2e import _adds

from servekit.cli import main
from servekit.config.loader import ConfigError
from servekit.config.overrides import Overrides, load_plan
from servekit.config.remote_uris import beside
from servekit.models.remote_config import local_copy

CONFIG = b"models:\n  - {name: adds, modelFormat: {name: onnx}, storageUri: adds}\n"


@pytest.mark.parametrize(
    ("config_uri", "path", "expected"),
    [
        ("s3://b/prod/serve.yaml", "models/iris", "s3://b/prod/models/iris"),
        ("s3://b/serve.yaml", "iris", "s3://b/iris"),
        ("gs://b/a/b/serve.yaml", "../iris/", "gs://b/a/iris/"),
        ("az://c/prod/serve.yaml", "./iris.tar.gz", "az://c/prod/iris.tar.gz"),
        ("https://u:p@h/x/serve.yaml?sig=1", "m.zip", "https://u:p@h/x/m.zip"),
    ],
)
def test_a_relative_path_resolves_against_the_remote_config_folder(
    config_uri: str, path: str, expected: str
) -> None:
    assert beside(config_uri, path) == expected


def test_a_remote_config_reads_relative_storage_uris_from_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    text = (
        "models:\n"
        "  - {name: near, modelFormat: {name: onnx}, storageUri: models/near}\n"
        "  - {name: far, modelFormat: {name: onnx}, storageUri: 'gs://other/far'}\n"
        "  - {name: mounted, modelFormat: {name: onnx}, storageUri: /mnt/models}\n"
    )
    copy = local_copy(text.encode())
    assert copy.name == "serve.yaml" and copy.parent.parent == tmp_path / "cache/servekit/configs"
    plan = load_plan(copy, Overrides(config_uri="s3://bucket/prod/serve.yaml"))
    by_name = {m.name: m for m in plan.models}
    assert by_name["near"].remote == "s3://bucket/prod/models/near"
    assert by_name["far"].remote == "gs://other/far"
    assert by_name["mounted"].remote is None
    assert plan.base_dir == tmp_path  # other relative paths: the working directory
    # The same copy read as a local file keeps its relative path local.
    assert {m.name: m.remote for m in load_plan(copy).models}["near"] is None


def test_an_invalid_remote_config_names_its_uri_without_secrets_not_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    copy = local_copy(b"models:\n  - {name: x, modelFormat: {name: onnx}, maxBatchSize: -1}\n")
    uri = "https://user:hunter22@store.example/prod/serve.yaml?sig=s3cr3t"
    with pytest.raises(ConfigError) as caught:
        load_plan(copy, Overrides(config_uri=uri))
    text = str(caught.value)
    assert "https://store.example/prod/serve.yaml?...:2: models[0].maxBatchSize" in text, text
    assert "hunter22" not in text and "s3cr3t" not in text and str(copy) not in text


def test_a_scheme_servekit_does_not_read_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["validate", "http://user:hunter22@example.com/serve.yaml"]) == 1
    err = capsys.readouterr().err
    assert "servekit: cannot read http://example.com/serve.yaml:" in err, err
    assert "'http' is not supported" in err and "hunter22" not in err


# -- end to end: the stores -------------------------------------------------------------------


def _validate(uri: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "servekit", "validate", uri]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def _s3_env(moto: Moto) -> dict[str, str]:  # noqa: F811
    return {"AWS_ENDPOINT_URL": moto.url, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}  # fmt: skip


@pytest.mark.slow
def test_s3_config_validates_and_its_mistakes_are_said_in_one_line(
    moto: Moto,  # noqa: F811
) -> None:
    moto.s3.create_bucket(Bucket="models")
    moto.s3.put_object(Bucket="models", Key="prod/serve.yaml", Body=CONFIG)
    moto.s3.put_object(Bucket="models", Key="prod/adds/1/model.onnx", Body=_adds(1))
    env = _s3_env(moto)
    done = _validate("s3://models/prod/serve.yaml", env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("s3://models/prod/serve.yaml: OK, 1 model(s)"), done.stdout

    done = _validate("s3://models/prod/nothing.yaml", env)
    assert done.returncode == 1
    assert done.stderr.startswith("servekit: no such object: s3://models/prod/nothing.yaml\n")
    done = _validate("s3://models/prod", env)
    assert done.returncode == 1
    assert "servekit: s3://models/prod is a folder: name the serve.yaml object" in done.stderr

    moto.s3.put_object(Bucket="models", Key="prod/bad.yaml", Body=b"models: [{name: 1}]\n")
    done = _validate("s3://models/prod/bad.yaml", env)
    assert done.returncode == 1
    assert done.stderr.startswith("servekit: invalid config\ns3://models/prod/bad.yaml:1:")
    assert "configs/" not in done.stderr  # never the local copy's path

    moto.stop()
    done = _validate("s3://models/prod/serve.yaml", env)
    assert done.returncode == 1
    assert done.stderr.startswith("servekit: cannot read s3://models/prod/serve.yaml: "), done
    assert "Traceback" not in done.stderr and "testing" not in done.stderr


@pytest.mark.slow
def test_https_config_validates_and_a_password_in_it_is_never_shown(
    https: str,  # noqa: F811
) -> None:
    Archives.files = {"/prod/serve.yaml": CONFIG}
    host = https.removeprefix("https://")
    done = _validate(f"https://user:hunter22@{host}/prod/serve.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"https://{host}/prod/serve.yaml: OK"), done.stdout
    done = _validate(f"https://user:hunter22@{host}/prod/missing.yaml")
    assert done.returncode == 1 and "hunter22" not in done.stderr + done.stdout
    assert f"servekit: cannot read https://{host}/prod/missing.yaml: " in done.stderr, done


@pytest.mark.slow
def test_gcs_config_validates(gcs: Any) -> None:  # noqa: F811
    fs, _ = gcs
    fs.mkdir("models")
    fs.pipe("models/prod/serve.yaml", CONFIG)
    done = _validate("gs://models/prod/serve.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gs://models/prod/serve.yaml: OK, 1 model(s)"), done.stdout


@pytest.mark.slow
def test_azure_config_validates(azurite: Any) -> None:  # noqa: F811
    fs, _ = azurite
    fs.mkdir("models")
    fs.pipe("models/prod/serve.yaml", CONFIG)
    done = _validate("az://models/prod/serve.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("az://models/prod/serve.yaml: OK, 1 model(s)"), done.stdout
