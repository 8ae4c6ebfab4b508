"""``server.requirements``: the packages a project image installs besides requirements.txt.

Entries are PEP 508 requirements; options, URLs and paths are refused (a setting must not decide
where the build fetches code; app/servekit/config/pip_requirements.py). The field is restart-only,
shows
in the JSON Schema with a pattern editors apply, comes out of ``servekit requirements`` as the
project Dockerfile reads it, survives ``server.save``, and an invalid list stops ``servekit
build`` before any engine runs. The image build itself is tests/test_project_build.py.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from servekit.cli import main
from servekit.config.loader import ConfigError, parse_config
from servekit.config.schema import RESTART_ONLY, json_schema
from servekit.project import build, dockerfile
from servekit.project.save import Project

ACCEPTED = {
    "numpy>=1.26": "numpy>=1.26",
    "  scipy == 1.14.1 ": "scipy==1.14.1",
    "pandas[parquet]>=2,<3": "pandas[parquet]<3,>=2",
    "uvloop; sys_platform != 'win32'": 'uvloop; sys_platform != "win32"',
    "Pillow": "Pillow",
}

REFUSED = {
    "-e .": "is a pip option",
    "--index-url https://pypi.example/simple": "is a pip option",
    "--extra-index-url=https://pypi.example/simple": "is a pip option",
    "-r other.txt": "is a pip option",
    "--find-links /wheels": "is a pip option",
    "--trusted-host pypi.example": "is a pip option",
    "./wheels/model_utils-1.0-py3-none-any.whl": "is not a package requirement",
    "/opt/code/package": "is not a package requirement",
    "git+https://git.example/me/utils.git": "is not a package requirement",
    "https://files.example/utils-1.0.tar.gz": "is not a package requirement",
    "utils @ https://files.example/utils-1.0.tar.gz": "points at a URL",
    "utils@file:///opt/code/utils": "points at a URL",
    "numpy --hash=sha256:0123": "is not a package requirement",
    "numpy\n--index-url https://pypi.example": "no line breaks",
    "": "an empty requirement",
    # Found in review: pip breaks lines wherever str.splitlines() does (form feed, U+2028, ...),
    # and packaging writes a quote inside a marker value unescaped, so a marker could carry
    # options or a comment into pip's line.
    "numpy; os_name == 'posix\x0c--index-url http://127.0.0.1:9/simple'": "no line breaks",
    "numpy; os_name == 'posix\u2028-e git+http://127.0.0.1:9/evil.git#egg=evil'": (
        "no line breaks"
    ),
    "numpy==1.26 ; os_name == 'posix\" --hash=sha256:00 \"'": "more than one requirement",
    "numpy; os_name == 'posix\" --config-settings=x=y \"'": "more than one requirement",
    "numpy; os_name == 'a #b'": "more than one requirement",
}


def config_with(*entries: str) -> str:
    return yaml.safe_dump({"server": {"requirements": list(entries)}})


def test_requirements_are_kept_as_packaging_writes_them() -> None:
    config = parse_config(config_with(*ACCEPTED))
    assert config.server.requirements == list(ACCEPTED.values())
    assert parse_config("server: {}").server.requirements == []


@pytest.mark.parametrize(("entry", "reason"), REFUSED.items())
def test_options_urls_and_paths_are_refused_naming_the_entry(entry: str, reason: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(config_with("numpy", entry))
    message = str(raised.value)
    assert "server.requirements[1]" in message and reason in message, message


def test_restart_only_and_in_the_json_schema() -> None:
    assert "requirements" in RESTART_ONLY  # a running server installs nothing
    schema = json_schema()
    field = schema["$defs"]["ServerConfig"]["properties"]["requirements"]
    assert field["live"] is False and "requirements.txt" in field["description"]
    jsonschema.validate({"server": {"requirements": ["numpy>=1.26"]}}, schema)
    for bad in ("-e .", "./wheels/x.whl", "/opt/x", ""):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"server": {"requirements": [bad]}}, schema)


def test_servekit_requirements_prints_one_per_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(config_with("scipy == 1.14.1", "uvloop; sys_platform != 'win32'"))
    assert main(["requirements", str(path)]) == 0
    assert capsys.readouterr().out == 'scipy==1.14.1\nuvloop; sys_platform != "win32"\n'
    path.write_text("models: []\n")
    assert main(["requirements", str(path)]) == 0
    assert capsys.readouterr().out == ""  # nothing to install: the Dockerfile skips pip
    path.write_text(config_with("--index-url https://pypi.example/simple"))
    assert main(["requirements", str(path)]) == 1
    assert "server.requirements[0]" in capsys.readouterr().err


def test_project_dockerfile_installs_both_lists_in_one_pip_run() -> None:
    text = dockerfile.PROJECT_DOCKERFILE
    run = text[text.index("RUN servekit requirements") : text.index("USER 10001")]
    assert "servekit requirements /srv/serve.yaml > /tmp/requirements.txt" in run
    assert 'echo "-r /srv/requirements.txt" >> /tmp/requirements.txt' in run
    assert run.count("pip install") == 1 and "-r /tmp/requirements.txt" in run
    assert "if [ -s /tmp/requirements.txt ]" in run  # neither list: pip is not run at all
    assert all(line.endswith("\\") for line in run.strip().splitlines()[:-1])  # one RUN


def test_save_keeps_the_servers_requirements(tmp_path: Path) -> None:
    project = Project(requirements=["scipy==1.14.1"])
    saved = yaml.safe_load(project.serve_yaml())
    assert saved["server"] == {"requirements": ["scipy==1.14.1"]}
    assert "server" not in yaml.safe_load(Project().serve_yaml())
    folder = project.write(tmp_path / "project")
    assert parse_config((folder / "serve.yaml").read_text()).server.requirements == [
        "scipy==1.14.1"
    ]


def test_build_refuses_an_invalid_list_before_any_engine_runs(tmp_path: Path) -> None:
    (tmp_path / "serve.yaml").write_text(config_with("-e ../elsewhere"))
    with pytest.raises(build.BuildError, match=r"server\.requirements\[0\]: '-e \.\./elsewhere'"):
        build.build(tmp_path)


@pytest.mark.slow  # a server in this process (it listens)
def test_a_notebook_server_saves_its_serve_yaml_requirements(tmp_path: Path) -> None:
    import onnx
    import onnx_builders

    import servekit

    (tmp_path / "mlp" / "1").mkdir(parents=True)
    onnx.save(onnx_builders.mlp(), str(tmp_path / "mlp" / "1" / "model.onnx"))
    config = {
        "server": {"requirements": ["scipy >= 1.11"]},
        "models": [{"name": "mlp", "modelFormat": {"name": "onnx"}, "storageUri": "mlp"}],
    }
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(config))
    with servekit.serve(tmp_path / "serve.yaml", grpc_port=None) as server:
        folder = server.save(tmp_path / "saved")
    saved = parse_config((folder / "serve.yaml").read_text())
    assert saved.server.requirements == ["scipy>=1.11"]
    assert [m.name for m in saved.models] == ["mlp"]
