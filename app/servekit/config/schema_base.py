"""The base of every serve.yaml section (camelCase keys, unknown keys refused, frozen), in a
module of its own so that sections declared beside the schema (app/servekit/config/sequences.py)
share it without importing the schema they are part of."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from servekit.shown_paths import shown_uri


class Section(BaseModel):
    """Base of every serve.yaml section: camelCase keys, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        frozen=True,
    )


def http_address(value: str | None, error_type: str, expected: str) -> str | None:
    """``value`` if it is an ``http://`` or ``https://`` address with a host (None passes), else
    an error saying ``expected``; the value is shown without its user info (a password)."""
    if value is None:
        return None
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in ("http", "https") or not rest.split("/", 1)[0]:
        raise PydanticCustomError(
            error_type, f"expected {expected}, got '{{value}}'", {"value": shown_uri(value)}
        )
    return value
