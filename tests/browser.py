"""Debian's headless Chromium driven by Playwright, shared by the dashboard's browser tests.

``playwright install`` is never used: the browser is the distribution's ``/usr/bin/chromium``
with flags that keep it off the network (no QUIC, no component updates, no sync).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """A Chromium for one test module.

    Playwright's sync API keeps an event loop running in the main thread while it is started;
    stopping it when the module ends keeps later tests free to use ``asyncio.run``.
    """
    driver = sync_playwright().start()
    try:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()
    finally:
        driver.stop()


def collect_errors(page: Page) -> list[str]:
    """Uncaught script errors and Content-Security-Policy refusals of ``page``, as they come."""
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on(
        "console",
        lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None,
    )
    return errors
