"""The command line explains itself (issue 27): bare ``servekit`` prints the help, every
argument says what it does and its default, a missing serve.yaml is said as such, unknown keys
get a "did you mean", ``servekit init`` writes a project that validates, and ``validate``
refuses a Python model ``serve`` could not load. In process (``main``), so the fast tier.
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path
from typing import Any

import pytest

from servekit.cli import _parser, main


def test_bare_servekit_prints_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: servekit")
    for command in ("serve", "validate", "init", "infer", "build", "bench"):
        assert f"    {command} " in out or f"    {command}\n" in out, command


def _actions(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, Any]]:
    """(command and destination, its parser, the argument) for every argument of every command."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(f"{name} {a.dest}", sub, a) for a in sub._actions]
        else:
            found.append((action.dest, parser, action))
    return found


def test_every_argument_has_help_saying_its_default() -> None:
    checked = 0
    for where, parser, action in _actions(_parser()):
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            continue
        assert action.help, f"{where}: no help"
        required_group = any(
            g.required and action in g._group_actions for g in parser._mutually_exclusive_groups
        )
        positional_required = not action.option_strings and action.nargs is None
        if action.required or required_group or positional_required:
            continue  # given every time: nothing to default to
        formatter = parser._get_formatter()
        shown = formatter._get_help_string(action) % {**vars(action), "prog": parser.prog}  # type: ignore[attr-defined]
        assert "(default" in shown, f"{where}: its help does not say its default: {shown!r}"
        checked += 1
    assert checked > 20


def test_positionals_have_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "config the serve.yaml to read, a path or an object in a store: s3://" in out
    assert "from its folder) (default: serve.yaml)" in out
    assert "--http-port HTTP_PORT HTTP port, 0 picks a free one (default: server.httpPort" in out
    with pytest.raises(SystemExit):
        main(["build", "--help"])
    assert "folder the project folder (its serve.yaml) (default: .)" in " ".join(
        capsys.readouterr().out.split()
    )


def test_a_missing_serve_yaml_is_said_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for argv in (["serve"], ["validate"], ["requirements"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("servekit: no such file: serve.yaml"), err
        assert "servekit init" in err and "invalid config" not in err


def test_an_unknown_key_gets_a_did_you_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "serve.yaml").write_text(
        "server:\n  htpPort: 8000\n  auth:\n    defualt: {env: X}\nmodels:\n"
        "  - name: m\n    modelFormat: {nmae: onnx}\n    storageURI: m.onnx\n    zzz: 1\n"
    )
    assert main(["validate", str(tmp_path / "serve.yaml")]) == 1
    err = capsys.readouterr().err
    assert "serve.yaml:2: server.htpPort: unknown key; did you mean 'httpPort'?" in err
    assert "serve.yaml:4: server.auth.defualt: unknown key; did you mean 'default'?" in err
    assert "models[0].modelFormat.nmae: unknown key; did you mean 'name'?" in err
    assert "serve.yaml:8: models[0].storageURI: unknown key; did you mean 'storageUri'?" in err
    assert "serve.yaml:9: models[0].zzz: unknown key\n" in err  # nothing close: no guess


def test_init_writes_a_project_that_validates_and_never_overwrites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "project"
    assert main(["init", str(folder)]) == 0
    assert "servekit infer http://127.0.0.1:8000 starter --data 1,2,3" in capsys.readouterr().out
    config = (folder / "serve.yaml").read_text()
    assert config.count("#") > 5 and "entrypoint: model:predict" in config
    # Validate imports the starter as `model`: give it a name no other test imports.
    unique = f"starter_{uuid.uuid4().hex[:8]}"
    (folder / "model.py").rename(folder / f"{unique}.py")
    (folder / "serve.yaml").write_text(config.replace("model:predict", f"{unique}:predict"))
    assert main(["validate", str(folder / "serve.yaml")]) == 0, capsys.readouterr().err
    assert "starter: format python, runtime python" in capsys.readouterr().out

    (folder / "serve.yaml").write_text("# mine\n")
    assert main(["init", str(folder)]) == 1
    assert "not overwriting serve.yaml" in capsys.readouterr().err
    assert (folder / "serve.yaml").read_text() == "# mine\n"
    assert not (folder / "model.py").exists()  # nothing written when anything exists


def test_validate_refuses_a_python_model_serve_could_not_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    untyped = f"untyped_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{untyped}.py").write_text("def predict(x):\n    return x\n")
    (tmp_path / "serve.yaml").write_text(
        "models:\n"
        f"  - name: untyped\n    modelFormat: {{name: python}}\n    entrypoint: {untyped}:predict\n"
        "  - name: nowhere\n    modelFormat: {name: python}\n    entrypoint: no_such_module_x:f\n"
    )
    assert main(["validate", str(tmp_path / "serve.yaml")]) == 1
    err = capsys.readouterr().err
    assert "serve.yaml:4: models[0].entrypoint: untyped: predict takes one dict of inputs" in err
    assert "serve.yaml:7: models[1].entrypoint: nowhere: cannot import 'no_such_module_x'" in err
