"""``app``: the name servekit had before issue 16, kept for a while (it warns; see
servekit/_old_name.py). pyproject.toml ships this folder as the ``app`` package."""

from servekit._old_name import install

install(__name__)
