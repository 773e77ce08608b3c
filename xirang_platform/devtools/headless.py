"""Debian's headless chromium on the platform's Dagster UI: the rendered page as text (the UI tests) or as
a PNG (the README's screenshots, `scripts/ui_screenshots.py`).

The UI is a single-page app: chromium runs its JavaScript for `wait_ms` of virtual time (the app's
GraphQL requests to the live webserver included) before it dumps the DOM or paints the screenshot.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

INSTALL_HINT = "install Debian's chromium (`apt-get install -y chromium`; `make test` does it when run as root)"
_HIDDEN = re.compile(r"<(script|style)\b.*?</\1>", re.S | re.I)
_TAG = re.compile(r"<[^>]+>")
_SPACE = re.compile(r"\s+")


def chromium() -> str:
    """The chromium executable; a `RuntimeError` saying how to install it when there is none."""
    found = shutil.which("chromium")
    if found is None:
        raise RuntimeError(f"no `chromium` on PATH: {INSTALL_HINT}")
    return found


def _render(url: str, output: list[str], wait_ms: int) -> str:
    with tempfile.TemporaryDirectory(prefix="xirang-chromium-") as profile:
        done = subprocess.run(
            [
                chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--virtual-time-budget={wait_ms}",
                "--hide-scrollbars",
                "--window-size=1600,1000",
                *output,
                url,
            ],
            timeout=300,
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise RuntimeError(f"chromium failed on {url} (exit {done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def rendered_text(url: str, wait_ms: int = 25000) -> str:
    """The visible text of `url` once the app has rendered: the DOM without scripts, styles and markup,
    entities decoded, whitespace collapsed to single spaces."""
    dom = _render(url, ["--dump-dom"], wait_ms)
    return _SPACE.sub(" ", html.unescape(_TAG.sub(" ", _HIDDEN.sub(" ", dom)))).strip()


def screenshot(url: str, path: Path, wait_ms: int = 25000) -> None:
    """A 1600x1000 PNG of `url` at `path` once the app has rendered."""
    _render(url, [f"--screenshot={path}"], wait_ms)
