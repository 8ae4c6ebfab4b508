"""Read serve.yaml into a ServeConfig, reporting every error with its YAML path and line.

PyYAML's composed node tree gives each key and value a line; pydantic's error locations are
mapped back onto it, so ``models[1].modelFormat.nmae`` comes back as
``serve.yaml:9: models[1].modelFormat.nmae: unknown key``.
"""

from __future__ import annotations

import difflib
import os
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from servekit.config.schema import ServeConfig


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a config file, located."""

    path: str  # YAML path, e.g. models[0].modelFormat
    line: int | None
    message: str

    def render(self, filename: str) -> str:
        where = f"{filename}:{self.line}" if self.line else filename
        return f"{where}: {self.path or '(top level)'}: {self.message}"


class ConfigError(Exception):
    """A config that cannot be served; ``issues`` holds every problem found."""

    def __init__(self, filename: str, issues: list[ConfigIssue]) -> None:
        self.filename = filename
        self.issues = issues
        super().__init__("\n".join(issue.render(filename) for issue in issues))


class ConfigMissing(ConfigError):
    """The config file does not exist (said as such, not as an invalid config)."""


def load_config(path: str | Path) -> ServeConfig:
    """Load and validate a serve.yaml file (environment overrides applied), or an MLServer
    project folder (app/servekit/config/mlserver_project.py)."""
    file = Path(path)
    if file.is_dir():
        from servekit.config import mlserver_project

        if mlserver_project.is_project(file):
            return mlserver_project.load(file)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        issue = ConfigIssue("", None, f"cannot read: {exc.strerror}")
        raise ConfigMissing(str(file), [issue]) from None
    except OSError as exc:
        issue = ConfigIssue("", None, f"cannot read: {exc.strerror}")
        raise ConfigError(str(file), [issue]) from None
    return parse_config(text, str(file))


def parse_config(text: str, filename: str = "serve.yaml") -> ServeConfig:
    """Validate serve.yaml text; raise ConfigError naming each key and line."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(filename, [ConfigIssue("", line, f"invalid YAML: {problem}")]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(filename, [ConfigIssue("", 1, "serve.yaml must be a mapping")])
    duplicates = list(_duplicate_keys(root, []))
    try:
        config = ServeConfig(**data)
    except ValidationError as exc:
        issues = duplicates + [_issue(root, error) for error in exc.errors()]
        raise ConfigError(filename, issues) from None
    if duplicates:
        raise ConfigError(filename, duplicates)
    return config


def _duplicate_keys(node: yaml.Node | None, loc: list[Any]) -> Iterator[ConfigIssue]:
    """Keys given twice in one mapping: YAML loaders silently keep the last, hiding an edit."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[object, int] = {}
        for key, value in node.value:
            line = key.start_mark.line + 1
            if not isinstance(key, yaml.ScalarNode):  # `? [a, b]`: left to the schema
                continue
            if key.value in seen:
                where = _render_path([*loc, key.value])
                yield ConfigIssue(where, line, f"key given twice (first on line {seen[key.value]})")
            seen.setdefault(key.value, line)
            yield from _duplicate_keys(value, [*loc, key.value])
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _duplicate_keys(item, [*loc, index])


def line_in_file(path: str | Path | None, loc: list[Any]) -> int | None:
    """Line of ``loc`` (e.g. ``["models", 2, "runtime"]``) in a YAML file, for errors found
    after validation (runtime choice); None when there is no readable file."""
    if path is None:
        return None
    try:
        root = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        return None
    return _line_of(root, loc)


def validator_message(message: str) -> str:
    """A pydantic error message without the ``Value error, `` it puts before the text of a
    validator's ValueError (our validators' messages are written to be shown as they are)."""
    return message.removeprefix("Value error, ")


def _issue(root: yaml.Node | None, error: Any) -> ConfigIssue:
    loc = [part for part in error["loc"] if not _is_union_tag(part)]
    if error["type"] == "duplicate_name":  # point at the second use, not the whole list
        loc += [error["ctx"]["index"], "name"]
    extra = error["type"] == "extra_forbidden"
    message = "unknown key" if extra else validator_message(error["msg"])
    if extra and loc and isinstance(loc[-1], str):
        close = difflib.get_close_matches(loc[-1], sorted(section_keys(loc[:-1])), n=1)
        if close:
            message += f"; did you mean {close[0]!r}?"
    variable = _env_source(loc)
    if variable is not None:  # the environment beat the file: do not blame a file line
        return ConfigIssue(_render_path(loc), None, f"{message} (set by ${variable})")
    return ConfigIssue(_render_path(loc), _line_of(root, loc), message)


def section_keys(loc: list[Any]) -> set[str]:
    """The keys serve.yaml accepts in the section at ``loc`` (camelCase, as written), read
    from the schema; empty when ``loc`` leads nowhere the schema describes."""
    kinds: list[Any] = [ServeConfig]
    for part in loc:
        found: list[Any] = []
        for kind in kinds:
            for inner in _members(kind):
                if isinstance(part, int):
                    origin = typing.get_origin(inner)
                    if origin in (list, tuple) and typing.get_args(inner):
                        found.append(typing.get_args(inner)[0])
                elif isinstance(inner, type) and issubclass(inner, BaseModel):
                    for name, info in inner.model_fields.items():
                        if part in (name, info.alias):
                            found.append(info.annotation)
        kinds = found
    keys: set[str] = set()
    for kind in kinds:
        for inner in _members(kind):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                keys.update(info.alias or name for name, info in inner.model_fields.items())
    return keys


def _members(kind: Any) -> list[Any]:
    """The types an annotation may hold (``A | B | None`` -> A, B; ``Annotated`` unwrapped)."""
    if typing.get_origin(kind) is typing.Annotated:
        return _members(typing.get_args(kind)[0])
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(kind) for m in _members(arg)]
    return [kind]


def _env_source(loc: list[Any]) -> str | None:
    """The ``SERVEKIT_*`` variable that set the value at ``loc`` (or a section holding it)."""

    def norm(part: object) -> str:
        return str(part).lower().replace("_", "")

    wanted = [norm(part) for part in loc]
    for variable in os.environ:
        if not variable.upper().startswith("SERVEKIT_"):
            continue
        parts = [norm(part) for part in variable[len("SERVEKIT_") :].split("__")]
        if parts and parts == wanted[: len(parts)]:
            return variable
    return None


def _is_union_tag(part: object) -> bool:
    """pydantic puts union member names (e.g. 'list[str]') into locations; drop them."""
    return isinstance(part, str) and ("[" in part or part in ("str", "int", "literal"))


def _render_path(loc: list[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _line_of(node: yaml.Node | None, loc: list[Any]) -> int | None:
    """Line (1-based) of the deepest node on ``loc`` that exists in the YAML."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        child = None
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            for key, value in node.value:
                if key.value == part:
                    line = key.start_mark.line + 1
                    child = value
                    break
        elif (
            isinstance(node, yaml.SequenceNode)
            and isinstance(part, int)
            and 0 <= part < len(node.value)
        ):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line
