"""Remote models' downloads, shown while ``servekit.serve()`` waits for its models.

A notebook leaves logging alone (app/servekit/observability/logs.py), so the server's progress log
lines do not reach a cell; the launcher polls the server instead (``ModelControl.downloads``) and
shows the lines here: in Jupyter one output updated in place (IPython's ``display`` with a display
id), elsewhere (a script, a terminal REPL) a line on stderr when the text changed, at most every
:data:`PRINT_EVERY_S` seconds. The lines are the server's own wording (shown URIs: no user info or
query), so no secret or signed URL is printed.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from servekit.results import DownloadStatus

PRINT_EVERY_S = 5.0


def _jupyter_display() -> Any:
    """IPython's ``display`` when this runs in a Jupyter kernel, else None."""
    ipython_module = sys.modules.get("IPython")
    if ipython_module is None:
        return None
    shell = ipython_module.get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return None
    from IPython.display import display

    return display


class DownloadDisplay:
    """One place the downloads are shown while the server starts."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._display = _jupyter_display() if out is None else None
        self._out = out
        self._handle: Any = None
        self._text = ""
        self._printed_at = float("-inf")

    def show(self, downloads: list[DownloadStatus]) -> None:
        if not downloads:
            return
        text = "\n".join(f"servekit: model {d.model}: {d.text()}" for d in downloads)
        if text == self._text:
            return
        self._text = text
        if self._display is not None:
            bundle = {"text/plain": text}
            if self._handle is None:
                self._handle = self._display(bundle, raw=True, display_id=True)
            else:
                self._handle.update(bundle, raw=True)
            return
        now = time.monotonic()
        if now - self._printed_at >= PRINT_EVERY_S:
            self._printed_at = now
            print(text, file=self._out or sys.stderr, flush=True)

    def close(self) -> None:
        """The wait is over: a Jupyter output that showed downloads says they are done."""
        if self._handle is not None:
            self._handle.update({"text/plain": "servekit: remote models fetched"}, raw=True)
