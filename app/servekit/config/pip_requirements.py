"""``server.requirements``: the packages a project image installs, one requirement per entry.

An entry is a PEP 508 requirement as ``packaging`` parses it: a distribution name, optional
extras, a version specifier and an environment marker (``numpy>=1.26``, ``scipy==1.14.1``,
``pandas[parquet]``, ``uvloop; sys_platform != 'win32'``). Everything else pip would accept in
a requirements file is refused:

- options (``-e``, ``-r``, ``-c``, ``--index-url``, ``--extra-index-url``, ``--find-links``,
  ``--trusted-host``, ...): one line of a requirements file can redirect where pip fetches
  *every* package of the build, or pull in more files;
- URLs and paths (``name @ https://...``, ``git+https://...``, ``./wheels/x.whl``): code from
  wherever the line points, outside the index the builder chose.

serve.yaml is configuration: it is edited beside the models, set from ``SERVEKIT_*`` variables,
shipped in ConfigMaps and reviewed as settings, not as build scripts. So a serve.yaml can name
packages, and the build fetches them from the package index the build machine's pip is set up
with, never from anywhere the file says. A project that needs more (a private index, a local
wheel) says so in its ``requirements.txt``, pip's own format, which the build also installs.
"""

from __future__ import annotations

from packaging.requirements import InvalidRequirement, Requirement

from servekit.shown_paths import hide_uri_secrets

NAME_START = r"^[A-Za-z0-9]"
"""What an entry starts with (a distribution name), for editors through the JSON Schema; the
validator below checks the rest."""


def check_requirement(text: str) -> str:
    """``text`` as packaging renders it (one canonical line), or ValueError saying what is
    refused and why."""
    entry = text.strip()
    if not entry:
        raise ValueError("an empty requirement; give a package name, e.g. numpy>=1.26")
    if not (entry.isascii() and entry.isprintable()):
        # pip splits a requirements file with str.splitlines(), which also breaks at form
        # feeds, vertical tabs, U+2028 and others: one entry must stay one line.
        raise ValueError("one requirement per entry, in printable ASCII (no line breaks)")
    shown = hide_uri_secrets(entry)  # messages quote it: a URL in it without its secrets
    if entry.startswith("-"):
        raise ValueError(
            f"{shown!r} is a pip option: serve.yaml names packages only (options such as "
            "--index-url or -e would change where the build fetches code; put them in "
            "requirements.txt if the project needs them)"
        )
    try:
        requirement = Requirement(entry)
    except InvalidRequirement as exc:
        raise ValueError(
            f"{shown!r} is not a package requirement (name, extras, version, marker; URLs and "
            f"paths are refused): {hide_uri_secrets(str(exc).splitlines()[0])}"
        ) from None
    if requirement.url is not None:
        raise ValueError(
            f"{shown!r} points at a URL: serve.yaml names packages from the build's package "
            "index only (put direct references in requirements.txt if the project needs them)"
        )
    return _one_pip_line(entry, str(requirement))


def _one_pip_line(entry: str, line: str) -> str:
    """``line`` if pip reads it as one requirement and nothing else. packaging writes a marker
    value holding a quote between quotes of the other kind without escaping it, so a crafted
    marker could end its string early and leave pip options (``--hash``, ``--config-settings``)
    or a comment on the line; pip would apply them."""
    if (
        len(line.splitlines()) != 1
        or "#" in line
        or any(token.startswith("-") for token in line.split())
    ):
        raise ValueError(
            f"{hide_uri_secrets(entry)!r} reads as more than one requirement (quotes inside a "
            "marker value, a comment or an option); write the marker without them"
        )
    return line
