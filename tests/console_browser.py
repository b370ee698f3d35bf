"""Driving the web console (sparkcluster/gateway/console) in a real browser: Playwright for Python with
Debian's `chromium` package (its `executable_path`: no browser download is reachable from the machines
the tests run on, so `playwright install` is never run), and axe-core (bundled by axe-playwright-python,
MPL-2.0) for accessibility. Shared by the unit-level browser test (tests/unit/test_console_browser.py,
the gateway on loopback with fixture data), the testbed's (tests/integration/console_case.py, run by test_gateway on its pair) and
`make docs-shots`, which writes the documentation's screenshots from the same code (CONSOLE_SHOTS names
the folder; unset, no screenshot is taken)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

CHROMIUM = os.environ.get("CONSOLE_CHROMIUM", "/usr/bin/chromium")  # Debian's package (apt-get install chromium)
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SERIOUS = ("serious", "critical")  # axe-core's impact levels a page must have none of
PHONE = {"width": 390, "height": 844}  # a phone's CSS viewport (an iPhone 12-15's)


def missing() -> str | None:
    """Why the browser tests cannot run here (None: they can). Under CI (`CI` set, as CI services set it)
    never a reason to skip: `make deps` installs Chromium and the dev extra Playwright, so a browser
    missing there is a failure to see, not a case to leave out."""
    if os.environ.get("CI"):
        return None
    try:
        import axe_playwright_python  # noqa: F401
        import playwright  # noqa: F401
    except ImportError as e:
        return f"{e.name} is not installed: pip install -e '.[dev]'"
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        return f"no {CHROMIUM}: apt-get install -y chromium"
    return None


@contextlib.contextmanager
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def sign_in(page, base: str, key: str) -> None:
    page.goto(f"{base}/console")
    page.fill("#key", key)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/console")


def serious(page) -> list[str]:
    """axe-core's serious and critical violations on the page as it is now: 'id: help (n nodes)'."""
    from axe_playwright_python.sync_playwright import Axe

    found = Axe().run(page).response["violations"]
    return [f"{v['id']}: {v['help']} ({len(v['nodes'])} nodes)" for v in found if v.get("impact") in SERIOUS]


def refreshes(page) -> int:
    """How many live updates the page has taken (console.js counts them on <body>)."""
    return int(page.get_attribute("body", "data-refreshes") or 0)


def overflows(page) -> bool:
    """The page is wider than its viewport (a phone would scroll it sideways)."""
    return page.evaluate("document.documentElement.scrollWidth > window.innerWidth + 1")


def shot(page, name: str) -> None:
    """A screenshot for the docs, where CONSOLE_SHOTS names their folder."""
    folder = os.environ.get("CONSOLE_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"console-{name}.png"), full_page=True)
