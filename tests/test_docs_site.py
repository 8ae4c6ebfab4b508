"""docs/ builds as a site (mkdocs.yml, the Material theme) with no warning, and the built pages
load nothing from another host: no stylesheet, script, font or image from a CDN, so the site
works offline and tells no third party who reads it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Attributes through which a page makes the browser fetch something by itself.
_FETCHING = {
    "link": ("href",),
    "script": ("src",),
    "img": ("src", "srcset"),
    "iframe": ("src",),
    "source": ("src", "srcset"),
    "video": ("src", "poster"),
    "audio": ("src",),
    "embed": ("src",),
    "object": ("data",),
}
_REMOTE = re.compile(r"^\s*(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)  # http://, https://, //
_CSS_REMOTE = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"])\s*((?:https?:)?//[^'")\s]+)""")


class _Fetches(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.remote: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a" or (tag == "link" and dict(attrs).get("rel") in ("canonical",)):
            return  # a link the reader may follow is not a fetch
        for name, value in attrs:
            if name in _FETCHING.get(tag, ()) and value and _REMOTE.match(value):
                self.remote.append(f"<{tag} {name}={value!r}>")
            if name == "style" and value:
                self.remote += _CSS_REMOTE.findall(value)


def remote_assets(html: str) -> list[str]:
    """What ``html`` makes a browser fetch from another host (tags, inline styles, <style>)."""
    parser = _Fetches()
    parser.feed(html)
    styles = re.findall(r"<style[^>]*>(.*?)</style>", html, re.DOTALL | re.IGNORECASE)
    return parser.remote + [url for style in styles for url in _CSS_REMOTE.findall(style)]


PAGE_LIMIT = 25 * 1024
"""The most a page may hold: past it a page is several topics, and a reader finds none of them."""
PERFORMANCE_LIMIT = 20 * 1024
"""docs/performance.md holds the current results, the method and the commands; the history of
how the figures got there is in git and CHANGELOG.md, not on the page."""


def test_no_page_is_too_long_to_read() -> None:
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(pages) > 10, "the pages were not found"
    sizes = {str(page.relative_to(ROOT)): page.stat().st_size for page in pages}
    too_long = {name: size for name, size in sizes.items() if size > PAGE_LIMIT}
    assert not too_long, (
        f"pages over {PAGE_LIMIT} bytes (split them by topic, add the new pages to mkdocs.yml's "
        f"nav): {too_long}"
    )
    assert sizes["docs/performance.md"] <= PERFORMANCE_LIMIT, (
        f"docs/performance.md is {sizes['docs/performance.md']} bytes, over {PERFORMANCE_LIMIT}: "
        "keep the current figures, the method and the commands; history goes to git and "
        "CHANGELOG.md"
    )


def test_remote_assets_are_found() -> None:
    # What the Material theme writes with its default fonts, and what it must not.
    google = (
        '<link rel="preconnect" href="https://fonts.gstatic.com" crossorigin>'
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
        '<script src="//cdn.example/x.js"></script><style>@import "https://cdn.example/a.css";'
        'body{background:url(https://cdn.example/b.png)}</style><img src="HTTPS://cdn.example/c">'
    )
    assert len(remote_assets(google)) == 6
    local = (
        '<link rel="stylesheet" href="assets/stylesheets/main.css"><script src="/assets/x.js">'
        '</script><a href="https://example.org/">a link</a><link rel="canonical" '
        'href="https://example.org/"><img src="screenshots/home.png" style="x: url(data:,)">'
    )
    assert remote_assets(local) == []


@pytest.mark.slow  # runs mkdocs in a process (tests/tiers.py)
def test_docs_build_strict_with_no_remote_assets(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # the theme's banner, not a warning
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    pages = {path.name for path in site.glob("*.html")}
    assert {
        "index.html",
        "protocols.html",
        "models.html",
        "notebook.html",
        "security.html",
        "ops.html",
        "server.html",
        "development.html",
        "ARCHITECTURE.html",
        "architecture-requests.html",
        "architecture-processes.html",
        "performance.html",
        "openai.html",
        "shared-memory.html",
        "formats.html",
        "python-models.html",
        "pipelines.html",
        "observability.html",
    } <= pages
    found = {}
    for path in site.rglob("*.html"):
        html = path.read_text(encoding="utf-8")
        remote = remote_assets(html)
        if 'class="mermaid"' in html:  # the theme would fetch its diagram library from a CDN
            remote.append("a mermaid diagram")
        if remote:
            found[str(path.relative_to(site))] = remote
    for path in site.rglob("*.css"):
        remote = _CSS_REMOTE.findall(path.read_text(encoding="utf-8"))
        if remote:
            found[str(path.relative_to(site))] = remote
    assert not found, found
    assert list(site.glob("assets/stylesheets/main.*.css")), "the theme's own CSS is bundled"
    assert list(site.glob("assets/javascripts/bundle.*.js")), "the theme's own script is bundled"
