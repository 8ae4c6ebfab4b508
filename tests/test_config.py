"""serve.yaml validation: every error names its YAML path and line, env overrides beat the file,
the JSON Schema explains every key, and the example configs shipped with the repo validate."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from servekit.config.compiler import compile_plan
from servekit.config.loader import ConfigError, load_config, parse_config
from servekit.config.schema import ServeConfig, json_schema

ROOT = Path(__file__).resolve().parent.parent

MODEL = """\
models:
  - name: tiny
    modelFormat: {name: onnx}
    storageUri: ./models/tiny
"""


@pytest.fixture(autouse=True)
def _no_outside_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SERVEKIT_* variable in the shell running the tests must not change what they see."""
    for variable in list(os.environ):
        if variable.upper().startswith("SERVEKIT_"):
            monkeypatch.delenv(variable)


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "serve.yaml")
    assert str(info.value) == "\n".join(
        info.value.issues[i].render("serve.yaml") for i in range(len(info.value.issues))
    )
    return str(info.value).splitlines()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "server:\n  httpPort: 8000\n  htppPort: 1\n",
            ["serve.yaml:3: server.htppPort: unknown key"],
        ),
        (
            MODEL + "    modelFormat: {name: onnx}\n",
            ["serve.yaml:5: models[0].modelFormat: key given twice (first on line 3)"],
        ),
        (
            MODEL + "  - name: other\n    modelFormat: {name: onnx, nmae: x}\n    storageUri: x\n",
            ["serve.yaml:6: models[1].modelFormat.nmae: unknown key"],
        ),
        (
            "models:\n  - name: tiny\n    storageUri: ./x\n",
            ["serve.yaml:2: models[0].modelFormat: Field required"],
        ),
        (
            "models:\n  - name: tiny\n    modelFormat: {name: onnx}\n",
            ["serve.yaml:2: models[0]: give storageUri (a model file or folder) or entrypoint"],
        ),
        (
            MODEL + "    versionPolicy: {all: {}, latest: {numVersions: 2}}\n",
            ["serve.yaml:5: models[0].versionPolicy: give exactly one of latest, all, specific"],
        ),
        (
            MODEL + "    versionPolicy: {}\n",
            ["serve.yaml:5: models[0].versionPolicy: give exactly one of latest, all, specific"],
        ),
        (
            MODEL + "    versionPolicy: {latest: {numVersions: 0}}\n",
            ["serve.yaml:5: models[0].versionPolicy.latest.numVersions: Input should be greater"],
        ),
        (
            MODEL.replace("tiny\n", "'bad name'\n"),
            ["serve.yaml:2: models[0].name: model names use letters, digits"],
        ),
        (
            MODEL + "  - name: x\n    modelFormat: {name: onnx}\n    storageUri: x\n" + MODEL[8:],
            ["serve.yaml:8: models[2].name: model name 'tiny' is used twice (first at models[0])"],
        ),
        (
            "runtimes:\n"
            "  - {name: rt, implementation: onnxruntime, supportedModelFormats: [{name: onnx}]}\n"
            "  - {name: rt, implementation: python, supportedModelFormats: [{name: python}]}\n",
            [
                "serve.yaml:3: runtimes[1].name: runtime name 'rt' is used twice (first at "
                "runtimes[0])"
            ],
        ),
        (
            "runtimes:\n  - name: rt\n    implementation: tensorflow\n"
            "    supportedModelFormats: []\n",
            [
                "serve.yaml:3: runtimes[0].implementation: Input should be 'onnxruntime', "
                "'python', 'sklearn',",
                "serve.yaml:4: runtimes[0].supportedModelFormats: List should have at least 1 item",
            ],
        ),
        (
            "server:\n  httpPort: 70000\n  grpcPort: abc\n",
            [
                "serve.yaml:2: server.httpPort: Input should be less than or equal to 65535",
                "serve.yaml:3: server.grpcPort: Input should be a valid integer",
            ],
        ),
        (
            "server:\n  grpsStreaming:\n    ctrlMode: body_param\n    ctrlKey: str_data\n",
            ["serve.yaml:4: server.grpsStreaming.ctrlKey: 'str_data' is a GrpsMessage field"],
        ),
        (
            "server:\n  grpsStreaming:\n    ctrlMode: cookie\n    ctrlKey: a b\n"
            "    resContentType: octets\n",
            [
                "serve.yaml:3: server.grpsStreaming.ctrlMode: Input should be 'query_param', "
                "'header_param' or 'body_param'",
                "serve.yaml:4: server.grpsStreaming.ctrlKey: use letters, digits",
                "serve.yaml:5: server.grpsStreaming.resContentType: expected a media type",
            ],
        ),
        (
            "models:\n  - name: m\n    modelFormat: {name: onnx}\n    storageUri: m\n"
            "    versionPolicy:\n      specific: {versions: [1, -1, 99999999999999999999]}\n",
            [
                "serve.yaml:6: models[0].versionPolicy.specific.versions[1]: Input should be "
                "greater than or equal to 0",
                "serve.yaml:6: models[0].versionPolicy.specific.versions[2]: Input should be "
                "less than or equal to 9223372036854775807",
            ],
        ),
        (
            "server:\n  httpPort: [\n",
            ["serve.yaml:3: (top level): invalid YAML: expected the node"],
        ),
        ("server:\n\thttpPort: 1\n", ["serve.yaml:2: (top level): invalid YAML: found character"]),
        ("- a\n- b\n", ["serve.yaml:1: (top level): serve.yaml must be a mapping"]),
        ("just a string\n", ["serve.yaml:1: (top level): serve.yaml must be a mapping"]),
    ],
)
def test_errors_name_path_and_line(text: str, expected: list[str]) -> None:
    lines = errors_of(text)
    assert len(lines) == len(expected), lines
    for line, prefix in zip(lines, expected, strict=True):
        assert line.startswith(prefix), (line, prefix)


def test_every_error_is_reported_at_once() -> None:
    text = "server:\n  bogus: 1\nmodels:\n  - name: a\n    modelFormat: {}\n    storageUri: x\n"
    assert errors_of(text) == [
        "serve.yaml:2: server.bogus: unknown key",
        "serve.yaml:5: models[0].modelFormat.name: Field required",
    ]


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"missing\.yaml: \(top level\): cannot read: No such file"
    ):
        load_config(tmp_path / "missing.yaml")


def test_empty_file_is_all_defaults() -> None:
    config = parse_config("")
    assert (config.server.http_port, config.server.grpc_port, config.models) == (8000, 8001, [])


def test_python_api_takes_snake_case() -> None:
    config = ServeConfig(
        server={"http_port": 0, "grpc_port": None},
        models=[{"name": "m", "model_format": {"name": "onnx"}, "storage_uri": "m.onnx"}],
    )
    assert config.server.http_port == 0 and config.server.grpc_port is None
    assert config.models[0].version_policy.latest is not None  # Triton's default: latest 1
    assert config.models[0].version_policy.latest.num_versions == 1


# --- environment overrides ---------------------------------------------------------------------


def test_environment_beats_the_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    file = tmp_path / "serve.yaml"
    file.write_text("server:\n  httpPort: 8000\n  grpcPort: 8001\n  name: from-file\n" + MODEL)
    monkeypatch.setenv("SERVEKIT_SERVER__HTTPPORT", "9100")
    monkeypatch.setenv("SERVEKIT_SERVER__HOST", "127.0.0.1")  # not in the file at all
    config = load_config(file)
    assert config.server.http_port == 9100
    assert config.server.host == "127.0.0.1"
    assert (config.server.grpc_port, config.server.name) == (8001, "from-file")  # merged, kept
    assert [m.name for m in config.models] == ["tiny"]


def test_environment_can_disable_grpc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVEKIT_SERVER__GRPCPORT", "null")
    assert parse_config("server:\n  grpcPort: 8001\n").server.grpc_port is None


def test_grps_streaming_defaults_are_todays_behaviour(monkeypatch: pytest.MonkeyPatch) -> None:
    streaming = parse_config("").server.grps_streaming
    assert (streaming.ctrl_mode, streaming.ctrl_key, streaming.res_content_type) == (
        "query_param", "streaming", "application/octet-stream"
    )  # fmt: skip
    # A message field's name is refused only where it would share the body with the message.
    text = "server:\n  grpsStreaming: {ctrlMode: header_param, ctrlKey: model}\n"
    assert parse_config(text).server.grps_streaming.ctrl_key == "model"
    monkeypatch.setenv("SERVEKIT_SERVER__GRPSSTREAMING__CTRLMODE", "body_param")
    (line,) = errors_of(text)
    assert "server.grpsStreaming.ctrlKey: 'model' is a GrpsMessage field" in line


def test_bad_environment_value_blames_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVEKIT_SERVER__HTTPPORT", "eighty")
    (line,) = errors_of("server:\n  httpPort: 8000\n")
    assert line.startswith("serve.yaml: server.httpPort: Input should be a valid integer")
    assert line.endswith("(set by $SERVEKIT_SERVER__HTTPPORT)")


# --- JSON Schema -------------------------------------------------------------------------------


def _properties(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    found = [("ServeConfig", k, v) for k, v in schema["properties"].items()]
    for name, definition in schema.get("$defs", {}).items():
        found += [(name, k, v) for k, v in definition.get("properties", {}).items()]
    return found


def test_schema_describes_every_key_in_camel_case() -> None:
    schema = json_schema()
    assert schema["title"] == "servekit serve.yaml"
    properties = _properties(schema)
    assert len(properties) > 40
    for owner, key, prop in properties:
        assert prop.get("description"), f"{owner}.{key} has no description"
        assert "_" not in key, f"{owner}.{key} is not camelCase"
    server = schema["$defs"]["ServerConfig"]["properties"]
    assert server["grpcPort"]["description"].startswith("gRPC port; 0 picks a free port")
    for definition in schema["$defs"].values():
        assert definition.get("description"), definition.get("title")
        assert definition.get("additionalProperties") is False  # unknown keys are errors


def test_schema_accepts_the_example_and_refuses_unknown_keys() -> None:
    data = yaml.safe_load((ROOT / "serve.yaml").read_text())
    jsonschema.validate(data, json_schema())
    data["server"]["htppPort"] = 1
    with pytest.raises(jsonschema.ValidationError, match="htppPort"):
        jsonschema.validate(data, json_schema())


# --- the configs shipped with the repository ---------------------------------------------------


def test_root_serve_yaml_validates_and_compiles() -> None:
    file = ROOT / "serve.yaml"
    plan = compile_plan(load_config(file), file.parent, file)
    assert {m.name for m in plan.models} >= {"mlp", "add_sub", "text_identity"}
    for model in plan.models:
        assert model.problem is None, (model.name, model.problem)
        assert model.versions and all(
            v.path is not None and v.path.exists() for v in model.versions
        )
    mlp = next(m for m in plan.models if m.name == "mlp")
    assert [v.version for v in mlp.versions] == [1, 2]


DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_YAML_FENCE = re.compile(r"^( *)```ya?ml\n(.*?)^\1```", re.DOTALL | re.MULTILINE)
_SERVE_YAML_KEY = re.compile(r"^(server|models):", re.MULTILINE)


def serve_yaml_blocks(text: str) -> list[tuple[int, str]]:
    """The ```yaml blocks of a Markdown text that show a serve.yaml (a top-level ``server:`` or
    ``models:`` key), each with the line of its fence; an indented fence (inside a list item)
    is dedented first. Other yaml blocks (Kubernetes manifests, ...) are not serve.yaml."""
    found = []
    for match in _YAML_FENCE.finditer(text):
        indent = len(match.group(1))
        block = "".join(line[indent:] for line in match.group(2).splitlines(keepends=True))
        if _SERVE_YAML_KEY.search(block):
            found.append((text.count("\n", 0, match.start()) + 1, block))
    return found


def _doc_blocks() -> list[tuple[str, str]]:
    return [
        (f"{path.relative_to(ROOT)}:{line}", block)
        for path in DOC_FILES
        for line, block in serve_yaml_blocks(path.read_text(encoding="utf-8"))
    ]


def test_the_docs_show_serve_yaml_blocks() -> None:
    # The check below must have something to check: the README shows one serve.yaml, and the
    # pages that explain serve.yaml (models, protocols, security) show theirs.
    where = [name.split(":")[0] for name, _ in _doc_blocks()]
    for page in ("README.md", "docs/models.md", "docs/protocols.md", "docs/security.md"):
        assert page in where, f"{page} shows no serve.yaml block (```yaml with server:/models:)"
    indented = "- item\n\n  ```yaml\n  server:\n    httpPort: 1\n  ```\n"
    assert serve_yaml_blocks(indented) == [(3, "server:\n  httpPort: 1\n")]


@pytest.mark.parametrize(("where", "block"), _doc_blocks(), ids=[w for w, _ in _doc_blocks()])
def test_serve_yaml_in_the_docs_validates(where: str, block: str) -> None:
    parse_config(block, where)  # servekit's own loader: unknown keys, wrong values, bad YAML
