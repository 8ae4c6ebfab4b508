"""The base of every serve.yaml section (camelCase keys, unknown keys refused, frozen), in a
module of its own so that sections declared beside the schema (app/servekit/config/sequences.py)
share it without importing the schema they are part of."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Section(BaseModel):
    """Base of every serve.yaml section: camelCase keys, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        frozen=True,
    )
