"""Read serve.yaml into a ServeConfig, reporting every error with its YAML path and line.

PyYAML's composed node tree gives each key and value a line; pydantic's error locations are
mapped back onto it, so ``models[1].modelFormat.nmae`` comes back as
``serve.yaml:9: models[1].modelFormat.nmae: unknown key``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from app.config import ServeConfig


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


def load_config(path: str | Path) -> ServeConfig:
    """Load and validate a serve.yaml file (environment overrides applied)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
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
    try:
        return ServeConfig(**data)
    except ValidationError as exc:
        issues = [_issue(root, error) for error in exc.errors()]
        raise ConfigError(filename, issues) from None


def _issue(root: yaml.Node | None, error: Any) -> ConfigIssue:
    loc = [part for part in error["loc"] if not _is_union_tag(part)]
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "unknown key"
    elif message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    return ConfigIssue(_render_path(loc), _line_of(root, loc), message)


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
